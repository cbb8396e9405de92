"""The per-example record card's Streamlit glue: the page it lives on, and the ways every other page opens it.

The card is the page "Example record" (`views/record.py`), its example the URL parameter `example` (a control the
page registry declares), so `/record?example=123` reproduces it for anyone who opens it. Other pages open it with a
link (`card_link`: a real link a visitor can copy) or on a click (`open_card`: from a chart's or a table's selection).
The Privacy audit's canary has a card too (`rec_set=canary`, with the audit's settings in the link): `canary_link`,
and `open_canary` at one trial.
"""

from __future__ import annotations

import streamlit as st

from gradlab.ui.state import switch_page

#: The card's page and the URL parameter (its control's key) that names the example.
PAGE = "views/record.py"
KEY = "example"


def open_card(index: int) -> None:
    """Go to example `index`'s card now (stops this run): its control set through Session State, as a preset sets
    its page's, and the URL parameter given so the address bar names it at once."""
    switch_page(PAGE, {KEY: str(int(index))}, {KEY: int(index)})


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


#: The card page's choice of examples that shows the Privacy audit's canary, and its control naming one trial.
SET, CANARY, TRIAL = "rec_set", "canary", "rec_trial"


def canary_link(audit_params: dict[str, str], label: str = "Open the canary's record") -> None:
    """A link to the card of the audit's canary: `audit_params` are the Privacy audit page's settings as URL
    parameters (`gradlab.ui.audit.link`), so the link reproduces that audit's card for anyone who opens it."""
    st.page_link(PAGE, label=label, icon=":material/badge:", query_params={SET: CANARY, **audit_params})


def open_canary(trial: int) -> None:
    """Go to the card of this session's last audit's canary at trial `trial` now (stops this run), as `open_card` goes
    to an example's. Call it from the Privacy audit page: its settings, bound to its controls, cannot go in the switch's
    parameters; the card takes this session's last audit and writes them into its own URL."""
    switch_page(PAGE, {SET: CANARY, TRIAL: str(int(trial))}, {SET: CANARY, TRIAL: int(trial)})
