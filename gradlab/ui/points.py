"""A page's point: a block (a figure and its metrics) that a lecture step can open on.

A page marks a block once, by a stable name:

    with ui.point("dp_per_class"):
        st.subheader("Per class: …")
        ui.chart(plots.per_class_clipping(…))

Anywhere else the block is drawn where it stands. A lecture step that declares `point=("dp_per_class",)`
(`gradlab.ui.presets.Step`) runs its page inside `slots(names)`, which opens one slot per name right under the
narration: the block is drawn into its slot, so the projector opens on the figure the narration is about and the
rest of the page follows below. A slot is an `st.empty`: a block drawn twice in one run (Geometry's Play) replaces
itself. Mark no block inside an `st.fragment`: the fragment's own reruns do not pass through the lecture, so they
would draw it in place beside the copy in the slot.
"""

from __future__ import annotations

import contextlib
import threading

import streamlit as st

_RUN = threading.local()  # this script thread's slots: {name: st.empty}, and the names drawn into them

#: The key of the block that holds a lecture step's slots (its CSS class is `st-key-lecture_point`).
KEY = "lecture_point"


def _slots() -> dict:
    return getattr(_RUN, "slots", {})


@contextlib.contextmanager
def slots(names):
    """Open one slot per block name in `names` here (in order, in a block keyed `KEY`), and draw the blocks a page
    marks with those names into them for the duration. **Yields** the set of names drawn so far (filled as the
    page draws them)."""
    drawn: set = set()
    with st.container(key=KEY):
        holders = {name: st.empty() for name in names}
    before = _slots(), getattr(_RUN, "drawn", set())
    _RUN.slots, _RUN.drawn = holders, drawn
    try:
        yield drawn
    finally:
        _RUN.slots, _RUN.drawn = before


@contextlib.contextmanager
def point(name: str):
    """The page's block `name`: drawn into the lecture's slot for it when a step asked for it, else in place."""
    holder = _slots().get(name)
    if holder is None:
        yield
        return
    with holder.container():
        yield
    _RUN.drawn.add(name)
