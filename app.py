"""gradlab: the router. Page config, the shared experiment sidebar, navigation over views/."""

import os
import sys
import time

import streamlit as st

# XLA compiles are most of a first visit (Influence: about 300 programs, 25 s on 2 cores). JAX's persistent cache
# keeps every compiled program on disk, so a restarted server (a redeploy, a woken Community Cloud app) loads them
# instead of compiling again. Set before JAX is imported; an environment variable of the same name wins.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "gradlab", "xla"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(512 * 2**20))  # bytes; least recently used go first

from gradlab import ui  # noqa: E402
from gradlab.ui import lecture as ui_lecture  # noqa: E402

st.set_page_config(page_title="gradlab: per-example gradients", page_icon="∇", layout="wide")

PAGES = [
    st.Page("views/home.py", title="Home", icon=":material/home:", default=True),
    st.Page("views/norms.py", title="Gradient norms", icon=":material/bar_chart:"),
    st.Page("views/equivalence.py", title="Equivalence", icon=":material/drag_handle:"),
    st.Page("views/performance.py", title="Performance", icon=":material/timer:"),
    st.Page("views/dp_clipping.py", title="DP clipping", icon=":material/lock:"),
    st.Page("views/influence.py", title="Influence", icon=":material/explore:"),
    st.Page("views/privacy_audit.py", title="Privacy audit", icon=":material/policy:"),
    st.Page("views/geometry.py", title="Geometry", icon=":material/call_split:"),
    st.Page("views/lecture.py", title="Lecture", icon=":material/school:"),
]

ui.fill_store_in_background()  # with GRADLAB_WARM_ON_START=1: compute every default view into the store, once
page = st.navigation(PAGES)
started = time.perf_counter()
try:
    ui_lecture.frame(page)  # presenter-mode toggle; a lecture step sets its controls before the sidebar draws
    ui.experiment_sidebar()
    page.run()
    ui.share_link()
finally:
    if os.environ.get("GRADLAB_LOG_RUNS"):  # server time per script run, for benchmarks/latency.py
        print(f"gradlab-run {page.title!r} {time.perf_counter() - started:.3f}", file=sys.stderr, flush=True)
