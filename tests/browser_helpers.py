"""Start `streamlit run app.py` headless and drive it with Playwright + Debian's chromium.

Shared by tests/test_browser.py and benchmarks/memory_tour.py. No pytest in here.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage",
]

#: (url path, nav label, text the page's title contains); the url path is the page file's stem.
PAGES = [
    ("", "Home", "gradlab"),
    ("norms", "Gradient norms", "gradient norms"),
    ("equivalence", "Equivalence", "equivalence"),
    ("performance", "Performance", "performance"),
    ("dp_clipping", "DP clipping", "dp clipping"),
    ("influence", "Influence", "influence"),
    ("geometry", "Geometry", "geometry"),
    ("lecture", "Lecture", "lecture"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def streamlit_server(port: int | None = None, *, timeout: float = 120, log_path: Path | None = None):
    """Run the app headless on `port` (a free one by default); yield (base url, Popen)."""
    port = port or free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with code {proc.returncode} before it was healthy")
            try:
                with urllib.request.urlopen(base + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"streamlit did not answer /_stcore/health within {timeout} s")
            time.sleep(0.5)
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log_path:
            log.close()


def launch(playwright):
    """Debian's chromium with the flags that work in a container."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def script_state(page) -> str:
    """Streamlit's run state as the frontend shows it: initial, running, notRunning, rerunRequested, …"""
    return page.locator('[data-testid="stApp"]').get_attribute("data-test-script-state") or ""


def wait_until_idle(page, *, timeout: float = 240, settle: float = 1.0) -> None:
    """Wait until the app has run and stopped (script state "notRunning" and no status widget for `settle` s)."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout * 1000)
    deadline = time.time() + timeout
    quiet_since = None
    while time.time() < deadline:
        idle = (script_state(page) == "notRunning"
                and page.locator('[data-testid="stStatusWidget"]').count() == 0
                and page.locator('[data-testid="stMainBlockContainer"] h1, [data-testid="stException"]').count() > 0)
        if not idle:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.time()
        elif time.time() - quiet_since >= settle:
            return
        time.sleep(0.2)
    raise TimeoutError(f"the app was still running after {timeout} s: {page.url} ({script_state(page)})")


def page_errors(page) -> list[str]:
    """Texts of Streamlit exception boxes on the page (a traceback shown to the user)."""
    return [e.inner_text()[:2000] for e in page.locator('[data-testid="stException"]').all()]


def title(page) -> str:
    heads = page.locator('[data-testid="stMainBlockContainer"] h1').all_inner_texts()
    return heads[0] if heads else ""


def metrics(page) -> dict[str, str]:
    """{label: value} of the st.metric elements on the page."""
    out = {}
    for m in page.locator('[data-testid="stMetric"]').all():
        label = m.locator('[data-testid="stMetricLabel"]').inner_text().strip()
        value = m.locator('[data-testid="stMetricValue"]').inner_text().strip()
        out[label] = value
    return out


def normalized(text: str) -> str:
    return text.lower().replace("_", " ")


def wait_for_metrics(page, labels, *, timeout: float = 120) -> dict[str, str]:
    """Poll until every st.metric label in `labels` is shown; return all metrics."""
    deadline = time.time() + timeout
    while True:
        shown = metrics(page)
        if all(label in shown for label in labels):
            return shown
        if time.time() > deadline:
            raise TimeoutError(f"metrics {sorted(set(labels) - set(shown))} not shown after {timeout} s: {shown}")
        time.sleep(0.3)
