"""gradlab: the router. Page config, the shared experiment sidebar, navigation over views/."""

import ctypes
import gc
import os
import sys
import time

import streamlit as st

# glibc's malloc arenas capped at 2 before this script thread imports JAX (as `gradlab.memory.limit_malloc_arenas`
# does, which runs only after `gradlab`'s imports): each session's script thread would otherwise keep an arena of
# its own frees. The tour after a crowd peaked 663–669 MB this way against 682–690 (benchmarks/RESULTS.md).
# Once per process: later reruns find `gradlab` imported and the cap set.
if "gradlab" not in sys.modules:
    try:
        ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc
        pass

# XLA compiles are most of a first visit (Influence: about 300 programs, 25 s on 2 cores). JAX's persistent cache
# keeps every compiled program on disk, so a restarted server (a redeploy, a woken Community Cloud app) loads them
# instead of compiling again. Set before JAX is imported; an environment variable of the same name wins.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "gradlab", "xla"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(512 * 2**20))  # bytes; least recently used go first
# A shared server keeps the engine's rules (`engine.AUTO_TIMING`): timing vmap beside them would compile a second
# program for every cold computation, and a crowd's load makes such timings noise. Both paths are exact.
os.environ.setdefault("GRADLAB_AUTO_TIMING", "0")

# No garbage collection while gradlab, JAX, SciPy and Plotly first import: a full pass walks every object imported so
# far, again and again as they come (an eighth of the imports' time); the end of the run collects once and
# freezes them (`memory.freeze_imported_heap`).
gc.disable()
try:
    from gradlab import memory, ui  # noqa: E402
    from gradlab.ui import lecture as ui_lecture  # noqa: E402
    from gradlab.ui import pages as ui_pages  # noqa: E402
    from gradlab.ui import room as ui_room  # noqa: E402
    from gradlab.ui import state as ui_state  # noqa: E402
finally:
    gc.enable()

# Lean XLA:CPU compiles where this jaxlib has the switch (`memory.LEAN_XLA_FLAGS`: ~100 MB less at SimpleCNN's
# training peak), set before this process's first computation; once per process.
memory.lean_compiles()
memory.trim_after_compiles()  # a compile's scratch memory returned before its program first runs

st.set_page_config(page_title="gradlab: per-example gradients", page_icon="∇", layout="wide")

PAGES = [st.Page(p.path, title=p.title, icon=p.icon, url_path=p.url_path or None, default=not p.url_path)
         for p in ui_pages.PAGES]

ui.fill_store_in_background()  # with GRADLAB_WARM_ON_START=1: compute every default view into the store, once
# presenter mode hides the sidebar: its page links move to the top bar
page = st.navigation(PAGES, position="top" if ui_lecture.presenter_mode() else "sidebar")
started = time.perf_counter()
with ui_room.in_turn(page.url_path):  # a room's followers one at a time
    try:
        ui_state.arrive(page.url_path)  # a page switch the browser's own rerun swallowed is made again
        ui.remember_url()  # the link as opened: url_warnings names what in it could not be used
        st.session_state[ui.STEP_SETS_CONTROLS] = page.url_path == "lecture"  # its link is its step: no control written
        ui_lecture.frame(page)  # presenter-mode toggle; a lecture step sets its controls before the sidebar draws
        ui.experiment_sidebar()
        warnings = st.container()
        page.run()
        ui.url_warnings(warnings, page.url_path)
        ui.write_bound_values()  # before the link: what the address bar lost is written back
        ui.share_link()
    finally:
        memory.freeze_imported_heap()  # Streamlit's collection after each run then skips the imported modules' objects
        if os.environ.get("GRADLAB_LOG_RUNS"):  # server time per script run, for benchmarks/latency.py
            print(f"gradlab-run {page.title!r} {time.perf_counter() - started:.3f}", file=sys.stderr, flush=True)
