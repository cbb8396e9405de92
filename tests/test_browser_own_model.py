"""Issue 26's goal, in Debian's chromium: a user-written Flax model and an Equinox model from the example files,
opened with `python -m gradlab serve`, render the applicable pages with no error (screenshots in screenshots/); and
`gradlab.explore(...)` called as a notebook calls it shows the user's own numbers.

Each model file is served by the command itself (`python -m gradlab serve FILE --headless --port P`), which starts
Streamlit as its child; the test ends the command with SIGTERM, which ends its server too. Marked slow.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import BROWSER_MARKS
from sklearn.model_selection import train_test_split
from benchmarks.browser import (ROOT, free_port, metrics, normalized, page_errors, title, wait_healthy,
                                wait_until_idle)

pytestmark = BROWSER_MARKS
pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytest.importorskip("flax", reason="the Flax example needs flax (requirements-dev.txt)")

SHOTS = ROOT / "screenshots"
VIEWPORT = {"width": 1400, "height": 2400}
#: The pages that apply to any model (url path, words of its title); the privacy audit says what it needs.
PAGES = [("norms", "gradient norms"), ("equivalence", "equivalence"), ("performance", "performance"),
         ("dp_clipping", "dp clipping"), ("influence", "influence"), ("privacy_audit", "privacy audit")]


def serve(model_file: Path, port: int, log, timeout: float = 240) -> subprocess.Popen:
    """`python -m gradlab serve model_file`, waited for until its server answers."""
    proc = subprocess.Popen([sys.executable, "-m", "gradlab", "serve", str(model_file), "--headless", "--port", str(port)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    return answering(proc, port, timeout)


def answering(proc: subprocess.Popen, port: int, timeout: float = 240) -> subprocess.Popen:
    """`proc` once the explorer it started answers on `port`. **Raises** when it exits or does not answer in time."""
    wait_healthy(proc, f"http://127.0.0.1:{port}", timeout, " ".join(proc.args[1:4]))
    return proc


#: The Flax example visits every page; the Equinox example (the same pages' code, another library's params) the
#: pages whose numbers depend on how params are stored: norms per leaf, influence with its checkpoints, the audit.
VISITS = {"flax": PAGES, "equinox": [p for p in PAGES if p[0] in ("norms", "influence", "privacy_audit")]}


@pytest.mark.parametrize("name", ["flax", "equinox"])
def test_a_served_model_renders_the_applicable_pages(browser, name):
    SHOTS.mkdir(exist_ok=True)
    model_file = ROOT / "examples" / f"own_model_{name}.py"
    port = free_port()
    with open(SHOTS / f"own_{name}_serve.log", "w") as log:
        proc = serve(model_file, port, log)
        context = browser.new_context(viewport=VIEWPORT)
        try:
            page = context.new_page()
            for path, heading in VISITS[name]:
                page.goto(f"http://127.0.0.1:{port}/{path}")
                wait_until_idle(page, timeout=300)
                page.screenshot(path=str(SHOTS / f"own_{name}_{path}.png"))
                assert page_errors(page) == [], path
                assert heading in normalized(title(page)), (path, title(page))
                alerts = page.locator('[data-testid="stAlertContentError"]').all_inner_texts()
                assert alerts == [], (path, alerts)
                main = page.locator('[data-testid="stMainBlockContainer"]').inner_text()
                if path in ("dp_clipping", "privacy_audit"):  # they train from an initialization: they say what
                    # to add unless the module gives one (the Equinox example's init_fn), and then offer the run
                    assert ("needs gradlab's training loop" in main) == (name == "flax"), path
                    assert ("init_fn" in main) == (name == "flax"), path
                if path == "privacy_audit":  # with init_fn the attack on the user's model is offered
                    assert ("Run the membership attack" in main) == (name == "equinox"), path
                if path != "privacy_audit":
                    assert metrics(page), path
                # the served model is the sidebar's dataset, named by its file: not a value of the URL
                sidebar = page.locator('[data-testid="stSidebar"]').inner_text()
                assert model_file.name in sidebar and "dataset=" not in page.url, (path, page.url)
        finally:
            context.close()
            proc.terminate()  # SIGTERM: the command ends its Streamlit child
            proc.wait(30)
    time.sleep(1)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)


#: A notebook's cells as one script: a loss closing over a notebook variable, explore(), then the kernel lives on
#: (here: until the test closes stdin; a normal exit stops the server through `atexit`).
NOTEBOOK = textwrap.dedent("""
    import sys
    import jax.numpy as jnp
    import numpy as np
    import gradlab

    rng = np.random.default_rng(7)
    x = rng.normal(size=(200, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.normal(size=200)).astype(np.float32)
    scale = 0.5  # a notebook variable: the loss closes over it and travels by value

    def loss_fn(params, x, y):
        return scale * (x @ params["w"] + params["b"] - y) ** 2

    params = {"w": jnp.array([0.8, -1.5, 0.2]), "b": jnp.array(0.1)}
    server = gradlab.explore(loss_fn, params, (x, y), port=int(sys.argv[1]), headless=True)
    print(server.url, flush=True)
    sys.stdin.read()
""")


def notebook_norms() -> np.ndarray:
    """The oracle: NOTEBOOK's data split as `gradlab.own` documents (scikit-learn, 20 %, random_state 0) and one
    `jax.grad` per training example in a Python loop, norms in float64."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(200, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.normal(size=200)).astype(np.float32)
    x_train, _, y_train, _ = train_test_split(x, y, test_size=0.2, random_state=0)
    params = {"w": np.array([0.8, -1.5, 0.2], np.float32), "b": np.float32(0.1)}
    grad = jax.jit(jax.grad(lambda p, x, y: 0.5 * (x @ p["w"] + p["b"] - y) ** 2))
    return np.array([np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(grad(params, xi, yi))))
                     for xi, yi in zip(x_train, y_train)])


def test_explore_from_a_notebook_shows_the_users_numbers(browser):
    SHOTS.mkdir(exist_ok=True)
    port = free_port()
    with open(SHOTS / "own_explore.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", NOTEBOOK, str(port)], cwd=ROOT, stdin=subprocess.PIPE,
                                stdout=log, stderr=subprocess.STDOUT)
        context = browser.new_context(viewport=VIEWPORT)
        try:
            answering(proc, port)
            page = context.new_page()
            page.goto(f"http://127.0.0.1:{port}/norms")
            wait_until_idle(page, timeout=300)
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)  # the charts drew, not only the numbers
            page.screenshot(path=str(SHOTS / "own_explore_norms.png"))
            assert page_errors(page) == []
            shown = metrics(page)
            norms = notebook_norms()
            assert shown["Training examples N"] == f"{len(norms):,}"
            assert shown["Median norm"] == f"{np.median(norms):.3g}", shown
            assert "explore()" in page.locator('[data-testid="stSidebar"]').inner_text()
        finally:
            context.close()
            proc.stdin.close()  # the notebook ends: atexit stops its server
            proc.wait(60)
    assert proc.returncode == 0
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
