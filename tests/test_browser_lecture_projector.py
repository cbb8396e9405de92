"""Browser: the lecture on a projector (presenter mode, 1024×768). Every step opens on its own point: the narration
fully visible, then the figure the step declares (`Step.figure`, found by its title, not the first chart on the page)
with at least 300 px of it on the first screen. A Next pressed into a step that computes slowly never shows another
step's figure: the screen says "Computing step k…" under the new narration until the step's own figure comes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from benchmarks.browser import page_errors, streamlit_server, wait_until_idle

from gradlab.ui import points
from gradlab.ui.lecture import SLOW_STEPS_ENV
from gradlab.ui.presets import LECTURE

pytestmark = pytest.mark.slow

SHOTS = Path(__file__).resolve().parents[1] / "screenshots" / "projector"  # ignored by git (.gitignore)

# Every Plotly chart on the page: its title (spaces dropped: a long title wraps into several lines) and its box.
_MOMENT_JS = """(status) => ({
  title: (document.querySelector('[data-testid="stMainBlockContainer"] h1') || {innerText: ''}).innerText,
  computing: document.body.innerText.includes(status),
  charts: [...document.querySelectorAll('.js-plotly-plot')].map((el) => {
    const t = el.querySelector('.gtitle'); return t ? t.textContent : ''; }),
})"""

_CHARTS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map((el) => {
  const r = el.getBoundingClientRect();
  const t = el.querySelector('.gtitle');
  return {title: t ? t.textContent : '', top: r.top, bottom: r.bottom, height: r.height};
})"""

# Whether every point of a grid over the narration's box shows the narration itself (nothing drawn over it), and
# whether the box is inside the window.
_NARRATION_JS = """(text) => {
  const el = [...document.querySelectorAll('[data-testid="stMainBlockContainer"] h4')]
    .find((h) => h.innerText.trim().startsWith(text));
  if (!el) return {found: false};
  const r = el.getBoundingClientRect();
  const covered = [];
  for (let i = 1; i < 8; i++) for (let j = 1; j < 4; j++) {
    const x = r.left + (r.width * i) / 8, y = r.top + (r.height * j) / 4;
    const hit = document.elementFromPoint(x, y);
    if (!hit || !(el === hit || el.contains(hit) || hit.contains(el))) covered.push([Math.round(x), Math.round(y), hit ? hit.tagName + '.' + hit.className : null]);
  }
  return {found: true, top: r.top, bottom: r.bottom, covered};
}"""


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def declared_figure(page, step: int) -> dict | None:
    """The chart whose title holds step `step`'s declared figure (`Step.figure`), or None."""
    want = _squeeze(LECTURE[step - 1].figure)
    return next((c for c in page.evaluate(_CHARTS_JS) if want in _squeeze(c["title"])), None)


def _train_if_asked(page) -> None:
    """Step 11's point is a heavy section (DP-SGD training): a link never starts it, the room's warm-up presses it (here:
    we do). Only a button in the step's point: step 9's page has one too, far below."""
    button = page.locator(f".st-key-{points.KEY}").get_by_role("button", name=re.compile("Train private and non-private"))
    if button.count():
        button.first.click()
        wait_until_idle(page, timeout=900)


@pytest.mark.timeout(3000)  # 13 steps cold on a shared 2-core machine: trains five experiments, times a sweep
def test_every_step_opens_on_its_declared_figure_under_its_whole_narration_at_1024x768(tmp_path, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    misses, rows = [], []
    with streamlit_server(log_path=tmp_path / "server.log") as (base, _):
        page = browser.new_page(viewport={"width": 1024, "height": 768})
        for step, s in enumerate(LECTURE, start=1):
            page.goto(f"{base}/lecture?step={step}&presenter=true")
            wait_until_idle(page, timeout=900)
            _train_if_asked(page)
            assert not page_errors(page), (step, page_errors(page))
            page.wait_for_selector(".js-plotly-plot", timeout=120_000)
            page.wait_for_timeout(800)  # the layout settles after the charts' first draw
            page.screenshot(path=str(SHOTS / f"step{step:02d}.png"))
            narration = page.evaluate(_NARRATION_JS, s.narration[:40])
            figure = declared_figure(page, step)
            seen = 0.0 if figure is None else max(0.0, min(figure["bottom"], 768) - max(figure["top"], 0.0))
            rows.append((step, narration.get("bottom"), figure and round(figure["top"]), round(seen)))
            if not narration["found"] or narration["bottom"] > 768 or narration["top"] < 0 or narration["covered"]:
                misses.append((step, "narration", narration))
            if seen < 300:
                misses.append((step, "figure", s.figure, figure))
        page.close()
    print("step, narration bottom px, declared figure top px, visible px:", rows)
    assert not misses, misses


@pytest.mark.timeout(900)
def test_next_into_a_slow_step_shows_computing_and_never_another_steps_figure(tmp_path, browser):
    slow = 2  # the Geometry step after the Equivalence one: their figures have different titles
    before, after = _squeeze(LECTURE[slow - 2].figure), _squeeze(LECTURE[slow - 1].figure)
    with streamlit_server(log_path=tmp_path / "server.log", env={SLOW_STEPS_ENV: f"{slow}:8"}) as (base, _):
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{base}/lecture?step={slow - 1}")
        wait_until_idle(page, timeout=600)
        page.wait_for_function(f"() => [...document.querySelectorAll('.js-plotly-plot .gtitle')].some("
                               f"(t) => t.textContent.replace(/\\s+/g, '').includes({before!r}))", timeout=60_000)
        page.get_by_role("button", name="Next", exact=True).click()
        samples, deadline = [], time.time() + 60
        while time.time() < deadline:  # title, status and figures read in one evaluation: one moment of the screen
            now = page.evaluate(_MOMENT_JS, f"Computing step {slow}…")
            title, computing, charts = now["title"], now["computing"], [_squeeze(c) for c in now["charts"]]
            samples.append((title.split(":")[0], computing, charts, round(time.time() - deadline + 60, 2)))
            if title.startswith(f"Lecture {slow}/") and any(after in c for c in charts) and not computing:
                break
            time.sleep(0.1)
        page.screenshot(path=str(tmp_path / "after.png"))
        page.close()
    print("samples (title, computing, figures, s after Next):", *samples, sep="\n")  # whole, where a failure shows them
    on_new = [(computing, charts) for title, computing, charts, _ in samples if title == f"Lecture {slow}/{len(LECTURE)}"]
    assert on_new, samples[-3:]
    # under step 2's narration: never step 1's figure, nor any figure but step 2's own
    assert not [c for _, charts in on_new for c in charts if before in c], samples
    assert all(after in c for _, charts in on_new for c in charts if charts), samples
    assert any(computing and not charts for computing, charts in on_new), "never saw 'Computing step 2…' alone"
    assert any(after in c for c in on_new[-1][1]), "step 2's figure never came"
    print(f"{len(on_new)} samples under step {slow}'s narration, {sum(c for c, _ in on_new)} of them 'Computing'")
