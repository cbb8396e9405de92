"""Streamlit glue for teaching: presenter mode (bound to `?presenter=true`) and the lecture's steps.

Presenter mode hides the sidebar, the intro paragraph under each page title and the captions,
and enlarges type, metrics and figure text (through `gradlab.ui.figures.set_presenter`) for a projector.
A lecture step sets every control of its view before the sidebar is drawn (`follow_lecture`), so
`/lecture?step=4` reproduces step 4 in a fresh session.
"""

from __future__ import annotations

import builtins
import functools
import os
import time

import streamlit as st

from gradlab.ui import figures
from gradlab.ui.presets import LECTURE
from gradlab.ui.state import reset_controls
from gradlab.ui.widgets import inert  # `?step=` is whatever a link says: shown as text

PRESENTER = "presenter"
TRY_IT_KEY = "lecture_try_it"  # the step's link to its Practice problem: hidden on the projector (`_PRESENTER_CSS`)
STEP = "step"
_APPLIED = "_lecture_applied"

# The element right after a page's h1 is its "what you are looking at" paragraph: hidden in presenter mode.
_PRESENTER_CSS = """
<style>
html { font-size: 21px; }
[data-testid="stSidebar"], [data-testid="stExpandSidebarButton"] { display: none; }
.stElementContainer:has(h1) + .stElementContainer:has([data-testid="stMarkdown"]) { display: none; }
[data-testid="stCaptionContainer"] { display: none; }
.st-key-page_intro_more { display: none; }
[data-testid="stMetricValue"] { font-size: min(1.55rem, 22cqi); }
[data-testid="stMetricLabel"] p { font-size: min(0.85rem, 11cqi); }
[data-testid="stMainBlockContainer"] { padding-left: 1.5rem; padding-right: 1.5rem; max-width: 100%; padding-top: 3.7rem; padding-bottom: 2rem; }
/* figure first on a 768 px projector: a compact title, no second page title, the toggle in the top bar */
h1 { font-size: 1.65rem !important; padding: 0.1rem 0 0.2rem 0 !important; }
.stElementContainer:has(h1) ~ .stElementContainer:has(h1), .st-key-lecture_page .stElementContainer:has(h1) { display: none; }
h4 { font-size: 1.0rem !important; font-weight: 500 !important; padding: 0 !important; }
/* Streamlit pulls the block under a heading up by the heading's padding (a negative margin); with the padding gone here
   the next row covered a two-line narration's second line (issue 41) */
[data-testid="stMarkdownContainer"]:has(h4) { margin-bottom: 0 !important; }
/* the step's "Try it yourself" link is for students' own screens: on the projector it overlapped a long narration
   (only that link: Home's list of pages stays) */
.st-key-lecture_try_it { display: none; }
h2 { font-size: 1.3rem !important; padding: 0.3rem 0 0.1rem 0 !important; }
h3 { font-size: 1.15rem !important; padding: 0.2rem 0 0 0 !important; }
[data-testid="stMarkdownContainer"]:has(h2), [data-testid="stMarkdownContainer"]:has(h3) { margin-bottom: 0 !important; }
[data-testid="stPopover"] { display: none; }
/* the presenter toggle sits at the top bar's right end, beside the page links (which leave it room): in the bottom
   corner it covered a figure's tick labels, legend or help icon on whatever page scrolled under it */
[data-testid="stTopNav"] { max-width: calc(100% - 3.6rem); margin-right: auto; }
.st-key-presenter { position: fixed; top: 1.05rem; right: 0.6rem; z-index: 999991; width: auto !important;
                    background: rgba(255, 255, 255, 0.85); padding: 0 0.4rem; border-radius: 0.4rem; opacity: 0.45; }
/* only the switch until the pointer is on it: its words would cover the page links */
.st-key-presenter label p, .st-key-presenter [data-testid="stTooltipIcon"] { display: none; }
.st-key-presenter:hover { opacity: 1; }
.st-key-presenter:hover label p { display: inline; font-size: 0.7rem; }
[data-testid="stMainBlockContainer"] [data-testid="stVerticalBlock"] { gap: 0.55rem; }
/* no scroll anchoring: with it, a control changed under a step's figure threw the page to its top (or elsewhere) in
   about half the reruns, away from the figure the control is for (issue 41; tests/test_browser_figures_links.py) */
[data-testid="stMain"] { overflow-anchor: none; }
</style>
"""

# Both modes: metric labels and values, and page links, wrap instead of being cut with "…" at 1024 px; a value wraps
# between its words ("0.802, 13%"), never inside a number: it shrinks to fit its column instead.
_READABLE_CSS = """
<style>
[data-testid="stMetricLabel"], [data-testid="stMetricLabel"] * { white-space: normal !important; overflow: visible !important; text-overflow: clip !important; word-break: normal; overflow-wrap: normal; }
[data-testid="stMetricValue"], [data-testid="stMetricValue"] * { white-space: normal !important; overflow: visible !important; text-overflow: clip !important; overflow-wrap: normal; word-break: normal; }
[data-testid="stMetric"] { container-type: inline-size; }
[data-testid="stMetricValue"] { font-size: min(2.25rem, 22cqi); }
[data-testid="stDownloadButton"] button p { white-space: normal; }
[data-testid="stPageLink"], [data-testid="stPageLink"] * { white-space: normal !important; overflow: visible !important; text-overflow: clip !important; }
/* a laptop's screen (1024 px): Streamlit's 6rem above and 5rem beside the page pushed every first figure below the
   first screen; presenter mode sets its own (later in the page, so it wins) */
@media (max-width: 1100px) {
  [data-testid="stMainBlockContainer"] { padding-top: 3rem; padding-left: 1.5rem; padding-right: 1.5rem; }
  h1 { font-size: 2.1rem !important; padding-top: 0.5rem !important; }
  h2 { font-size: 1.5rem !important; padding-top: 0.5rem !important; }
}
</style>
"""


def presenter_mode() -> bool:
    """Whether presenter mode is on in this session (the toggle's state, or `?presenter=true` on first load)."""
    if PRESENTER in st.session_state:
        return bool(st.session_state[PRESENTER])
    return st.query_params.get(PRESENTER, "false").lower() == "true"


def frame(page) -> bool:
    """Draw the presenter-mode toggle and its styles, follow a lecture step when `page` is the lecture.

    Call it in app.py after `st.navigation` and before the sidebar. Returns whether presenter mode is on.
    """
    if getattr(page, "url_path", "") == "lecture":
        follow_lecture()
    on = st.toggle("Presenter mode", key=PRESENTER, bind="query-params",
                   help="For a projector: hides the sidebar and long prose, enlarges text and figures. "
                        "The URL keeps it (?presenter=true).")
    figures.set_presenter(on)
    st.html(_READABLE_CSS + (_PRESENTER_CSS if on else ""))
    return on


def requested_step(n_steps: int) -> int:
    """The 1-based step in the URL (`?step=4`), clamped to 1..n_steps; 1 when absent or not a number."""
    return parse_step(st.query_params.get(STEP, "1"), n_steps)


def parse_step(raw: str, n_steps: int) -> int:
    """`raw` (a URL value) as a step in 1..n_steps: clamped; 1 when it is not a number."""
    try:
        step = int(float(raw))
    except (TypeError, ValueError, OverflowError):
        step = 1
    return min(max(step, 1), n_steps)


_STEP_NOTE = "_lecture_step_note"


def follow_lecture() -> None:
    """Set every control of the step in the URL, once per step change (before any widget is drawn). A link whose step
    is not one of the lecture's (`?step=99`, `?step=abc`) is noted for `step_note`."""
    step = requested_step(len(LECTURE))
    raw = st.query_params.get(STEP)
    if raw is not None and raw != str(step):
        st.session_state[_STEP_NOTE] = (raw, step)
    if st.session_state.get(_APPLIED) != step:
        apply_step(step)


def apply_step(step: int) -> None:
    """Put step `step`'s controls (every sidebar key and its page's widgets) into session state and the URL.

    Every page control the step does not name goes back to its page's default (`state.reset_controls`): a step
    reached with Next shows exactly what its own link shows.
    """
    s = LECTURE[step - 1]
    reset_controls(keep=s.preset.widgets)
    for key, value in s.preset.state().items():
        st.session_state[key] = value
    st.query_params[STEP] = str(step)
    st.session_state[_APPLIED] = step


_DRAWN = "_lecture_drawn"
#: The block that holds a step's point and page (CSS class `st-key-lecture_page`).
PAGE_KEY = "lecture_page"
#: The block that holds the whole step: title, narration, point and page.
STEP_KEY = "lecture_step"


def run_page(path: str) -> None:
    """Run the page script at `path` (a step's view) here, as `runpy.run_path(path, run_name="__main__")` does, from
    its compiled code: compiling a page of 300 lines again on every run was 7 ms of each of a room's 30 followers'
    reruns (py-spy, `benchmarks/crowd.py` scenario 5). Recompiled when the file changes."""
    exec(_page_code(path, os.stat(path).st_mtime_ns), {"__name__": "__main__", "__file__": path,
                                                         "__builtins__": builtins})


@functools.lru_cache(maxsize=32)
def _page_code(path: str, mtime_ns: int):
    with open(path, encoding="utf-8") as f:
        return compile(f.read(), path, "exec", dont_inherit=True)  # as runpy: not this module's __future__ flags


def entering(step: int) -> bool:
    """Whether this run draws `step` for the first time in this session (the last run drawn in full showed another)."""
    return st.session_state.get(_DRAWN) != step


def drawn(step: int) -> None:
    """Note that this run drew `step` (its page ran to the end, or stopped on purpose)."""
    st.session_state[_DRAWN] = step


def fresh(entering: bool):
    """The block a step goes in, title to page. Entering a step, it is cleared at once (an empty element replaces the
    block of the step before, then a new block replaces it): while the new step computes, no figure or number of
    another step stays on screen. Otherwise it is the same block, kept as it is until this run redraws it (no flicker
    when a control changes)."""
    return (st.empty() if entering else st).container(key=STEP_KEY)


#: A test hook: `GRADLAB_TEST_SLOW_STEPS="3:6,5:2"` makes step 3 take 6 s more, step 5 2 s (tests/test_browser_lecture.py
#: presses Next into a slow step on a busy server and reads the screen while it computes).
SLOW_STEPS_ENV = "GRADLAB_TEST_SLOW_STEPS"


def test_delay(step: int) -> None:
    """Sleep as long as `GRADLAB_TEST_SLOW_STEPS` says for `step` (nothing when it is unset)."""
    for item in os.environ.get(SLOW_STEPS_ENV, "").split(","):
        number, _, seconds = item.partition(":")
        if number.strip() == str(step):
            time.sleep(float(seconds))


def go(step: int) -> None:
    """`on_click` of Next / Back: apply step `step` now (callbacks run before the script)."""
    apply_step(step)


# Arrow keys press the page's Back / Next buttons (a clicker or a keyboard at the lectern). A component's iframe
# (`st.iframe` of an HTML string; `st.components.v1.html` is deprecated) shares the app's origin, so its script can listen on the app's document; the listener is installed once.
_KEYS_JS = """
<script>
const doc = window.parent.document;
if (!doc.gradlabKeys) {
  doc.gradlabKeys = true;
  doc.addEventListener("keydown", (e) => {
    const tag = (e.target.tagName || "").toLowerCase();
    if (["input", "textarea", "select"].includes(tag) || e.target.isContentEditable) return;
    const label = {ArrowRight: "Next", PageDown: "Next", ArrowLeft: "Back", PageUp: "Back"}[e.key];
    if (!label) return;
    const button = [...doc.querySelectorAll("button")].find((b) => b.innerText.trim() === label && !b.disabled);
    if (button) { e.preventDefault(); button.click(); }
  });
}
</script>
"""


def arrow_keys() -> None:
    """→ / PageDown press Next and ← / PageUp press Back on this page (not while typing in a field)."""
    st.iframe(_KEYS_JS, height=1)  # our own constant script, never user text (st.iframe runs what it is given)


_TOP_JS = """
<script>
const doc = window.parent.document;
for (const el of [doc.querySelector('[data-testid="stMain"]'), doc.scrollingElement]) { if (el) el.scrollTo(0, 0); }
</script>
"""
_SCROLL_TOP = "_lecture_scroll_top"


def scroll_to_top_next_run() -> None:
    """Ask the next run to scroll the window to the top (a tab that just became the projector)."""
    st.session_state[_SCROLL_TOP] = True


def scroll_to_top_if_asked() -> None:
    """Scroll the window to the top once, if `scroll_to_top_next_run` asked for it."""
    if st.session_state.pop(_SCROLL_TOP, False):
        st.iframe(_TOP_JS, height=1)  # our own constant script, never user text


def step_note() -> None:
    """Say once that the link asked for a step the lecture does not have, and which one it opened."""
    note = st.session_state.pop(_STEP_NOTE, None)
    if note:
        raw, step = note
        st.warning(f"This link asks for step **{inert(raw)}**; the lecture has steps 1 to {len(LECTURE)}, so it opens "
                   f"step {step}.", icon=":material/link_off:")
