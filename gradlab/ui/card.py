"""The per-example record card's Streamlit glue: the page it lives on, and the ways every other page opens it.

The card is the page "Example record" (`views/record.py`), its example the URL parameter `example` (a control the
page registry declares), so `/record?example=123` reproduces it for anyone who opens it. Other pages open it with a
link (`card_link`: a real link a visitor can copy) or on a click (`open_card`: from a chart's or a table's selection).
"""

from __future__ import annotations

import streamlit as st

#: The card's page and the URL parameter (its control's key) that names the example.
PAGE = "views/record.py"
KEY = "example"


def open_card(index: int) -> None:
    """Go to example `index`'s card now (stops this run): its control set through Session State, as a preset sets
    its page's, and the URL parameter given so the address bar names it at once."""
    st.session_state[KEY] = int(index)
    st.switch_page(PAGE, query_params={KEY: str(int(index))})


def card_link(index: int, label: str | None = None, **params: str) -> None:
    """A link to example `index`'s card (`label` default "Open the record of example i"); `params`: more of the
    card page's controls (`rec_set="logistic"`: a Geometry problem's example)."""
    st.page_link(PAGE, label=label or f"Open the record of example {int(index)}", icon=":material/badge:",
                 query_params={KEY: str(int(index)), **params})


def selected_row(event) -> int | None:
    """The row position a `st.dataframe(on_select="rerun", selection_mode="single-row")` event selected (None: none or
    anything malformed)."""
    try:
        rows = event["selection"]["rows"]
        return int(rows[0]) if rows else None
    except (KeyError, IndexError, TypeError, ValueError):
        return None
