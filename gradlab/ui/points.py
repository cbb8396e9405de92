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

The controls a block's figure reads go with it (`READS`): the page draws them inside `controls(name)`, which puts
them right under the block in its slot when a step moved the block, and where they stand otherwise. A lecturer who
changes C under step 9's per-class chart sees the chart change, instead of scrolling to a control screens below and
back (issue 41).
"""

from __future__ import annotations

import contextlib
import threading

import streamlit as st

_RUN = threading.local()  # this script thread's slots: {name: st.empty}, and the names drawn into them

#: The key of the block that holds a lecture step's slots (its CSS class is `st-key-lecture_point`).
KEY = "lecture_point"


#: The page controls (`gradlab.ui.pages`) that each block's figure and metrics read, drawn inside `controls(name)`.
READS: dict[str, tuple[str, ...]] = {
    "equivalence": ("eq_example", "eq_reduction"),
    "norms_top": ("checkpoint", "topk"),
    "dp_per_class": ("dp_clip_checkpoint", "dp_clip_c", "dp_clip_sigma", "dp_clip_batch", "dp_clip_log"),
    "dp_sgd": ("dp_sgd_q", "dp_sgd_steps", "dp_sgd_c", "dp_sgd_opt", "dp_sgd_mode", "dp_sgd_eps", "dp_sgd_sigma",
               "dp_sgd_lr", "dp_sgd_delta", "dp_sgd_accountant", "dp_sgd_seed"),
    "influence_proponents": ("infl_test", "infl_k"),
    "influence_self": ("infl_self", "infl_top_pct"),
    "geo_removal": ("geo_remove",),
}


def _slots() -> dict:
    return getattr(_RUN, "slots", {})


@contextlib.contextmanager
def slots(names):
    """Open one slot per block name in `names` here (in order, in a block keyed `KEY`), and draw the blocks a page
    marks with those names into them for the duration. **Yields** the set of names drawn so far (filled as the
    page draws them)."""
    drawn: set = set()
    holders = {}
    with st.container(key=KEY):
        for name in names:  # the block, then the controls its figure reads (`controls`)
            holders[name] = (st.empty(), st.container(key=f"{KEY}_{name}_controls"))
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
    with holder[0].container():
        yield
    _RUN.drawn.add(name)


@contextlib.contextmanager
def controls(name: str):
    """The controls block `name`'s figure reads (`READS[name]`): drawn right under the block in the lecture's slot when
    a step moved it there, else in place. Use it where the page draws them (before the block: a slot is filled in
    any order)."""
    holder = _slots().get(name)
    if holder is None:
        yield
        return
    with holder[1]:
        yield
