"""Shared test helpers: an AppTest factory that opens one page with sidebar settings."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# One XLA compilation cache on disk for the whole run: page scripts rebuild their closures on every
# rerun and every browser test starts a fresh server, so the same programs would compile again and
# again. Set before JAX is imported; the streamlit servers inherit it through the environment.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(tempfile.gettempdir()) / "gradlab-test-xla-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")

# A test worker holds many tests' programs (well over the server's 400 MB default): dropping JAX's compiled
# functions after every shared computation would make every later test trace and load its programs again.
os.environ.setdefault("GRADLAB_MEMORY_BUDGET_MB", "0")
# For the same reason the gate must not relieve memory before each computation (it would: a test worker is over the
# server's 600 MB budget plus a computation's estimate), which drops compiled programs and collects everything too.
# tests/test_figures.py and tests/test_store.py test the relief and the collection themselves; the browser test that
# holds a server to 690 MB sets the deployed budget. Page tests with the relief: 35% more CPU
# (tests/test_pages_norms.py and test_pages_dp.py: 21.3 against 13.7 CPU-s).
os.environ.setdefault("GRADLAB_SERVER_BUDGET_MB", "1000000")

# The engine's one-off timing of the rules against vmap on small computations (engine.AUTO_TIMING) would compile
# vmap as well in every test at N >= 64: it changes only the time, never a number. Off in tests (and in the
# servers they start); tests/test_engine.py turns it on to test it.
os.environ.setdefault("GRADLAB_AUTO_TIMING", "0")

# A fresh results store per test process: a test must compute, never read a result a previous run stored.
os.environ["GRADLAB_STORE_DIR"] = tempfile.mkdtemp(prefix="gradlab-test-store-")

ROOT = Path(__file__).resolve().parents[1]
os.chdir(ROOT)

# Small, fast experiments for page tests: the sidebar keys are the Experiment's field names.
FAST = dict(steps=50, checkpoint_every=25)


def open_page(page: str, timeout: float = 300, **sidebar):
    """Run app.py, switch to `views/<page>.py`, apply sidebar values (by widget key), run again.

    Sidebar controls are set through `session_state` (their widget keys are the Experiment's field
    names), which is what a user's change does.
    """
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
    at.run()
    at.switch_page(f"views/{page}.py")
    for key, value in sidebar.items():
        at.session_state[key] = value
    at.run()
    return at


def assert_clean(at):
    """No exception element and no raw traceback on the page."""
    assert not at.exception, [e.value for e in at.exception]


@pytest.fixture
def page():
    return open_page


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for all browser tests: Playwright's sync API allows one per thread."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    from benchmarks.browser import launch

    with sync_api.sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()
