"""Browser, issue 41, on one server and one Chromium per worker (the module's `server`), for three checks:

- **labels**: every Plotly figure of every page at 1024×768 and 1400×900, on a screen and on a projector (presenter
  mode): no title, axis title, tick label, legend entry, annotation or colour-bar label cut off the figure or over
  another, and none smaller than 12 px (16 px on a projector) (`benchmarks.figure_audit`);
- **links**: on every page (a test each), each of its controls changed once (`benchmarks.controls.change`), one after
  another in one session: each change reaches the address bar, and the copy-link box equals the address bar after
  every change and after the page's run;
- **moved figures' controls**: where a lecture step moves a page's block to the top (`Step.point`), the controls its
  figure reads (`points.READS`) are drawn beside it in the step's slot, and changing one keeps the figure where it was.

Screenshots: screenshots/figures/ (ignored by git).
"""

from __future__ import annotations

import time

import pytest
from conftest import BROWSER_MARKS
from benchmarks.browser import ROOT, copy_link, page_errors, streamlit_server, wait_until_idle
from benchmarks.controls import change, present
from benchmarks.figure_audit import MIN_PX, SIZES, figures, problems, settle, shoot

from gradlab.ui import pages, points
from gradlab.ui.presets import LECTURE

pytestmark = BROWSER_MARKS

SHOTS = ROOT / "screenshots" / "figures"
#: Small settings every page renders fast with (the default digits and MLP, trained briefly, two checkpoints).
SMALL = "steps=50&checkpoint_every=25"
#: A page's own small settings: Performance times one size and one approach; Influence's methods on an MLP of width 8
#: (P = 610, not 4,810: its exact solvers and TRAK's models retrain in a fraction of the time; the controls are the same).
PAGE_SMALL = {"performance": "perf_sizes=16&perf_approaches=vmap&perf_repeats=1&perf_loop_max=16",
              "record": "audit_trials=4096", "influence": "width=8"}
#: A control shown only once a page's button ran: the button the copy-box test presses when it shows (the canary's
#: trial needs the audit).
PRESS = {"record": "Run the audit"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with streamlit_server(log_path=tmp_path_factory.mktemp("server") / "server.log") as (base, _):
        yield base


def _url(base: str, path: str, *extra: str) -> str:
    return f"{base}/{path}?" + "&".join(q for q in (SMALL, PAGE_SMALL.get(path, ""), *extra) if q)


def _figures_drawn(page) -> int:
    """Wait until the page's number of figures stops changing for a second (a figure's block can come after the run
    went idle); **returns** it."""
    count, since = -1, time.monotonic()
    deadline = since + 60
    while time.monotonic() < deadline:
        now = page.locator(".js-plotly-plot").count()
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= 1.0:
            break
        time.sleep(0.2)
    return settle(page) if count else 0


# On a screen and on a projector as two tests (and the copy box page by page below), so that the suite's two workers
# share the module's longest work instead of one worker running it alone at the end (each worker starts its own
# `server` for the tests it takes).
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("presenter", [False, True], ids=["screen", "projector"])
def test_no_label_of_any_figure_is_cut_or_overlapping_at_1024_and_1400(server, browser, presenter):
    page = browser.new_page(viewport={"width": SIZES[0][0], "height": SIZES[0][1]})
    found, counts = [], {}
    for p in pages.PAGES:
        page.set_viewport_size({"width": SIZES[0][0], "height": SIZES[0][1]})
        page.goto(_url(server, p.url_path, "presenter=true" if presenter else ""))
        wait_until_idle(page, timeout=600, settle=0.5)
        assert not page_errors(page), (p.url_path, page_errors(page)[:1])
        for width, height in SIZES:  # the same run at both sizes: the charts lay themselves out again
            page.set_viewport_size({"width": width, "height": height})
            n = _figures_drawn(page)
            if not p.url_path:  # Home's list of pages, in presenter mode too (only a lecture step's link hides)
                page.wait_for_function(  # a busy server may still be drawing them
                    "n => [...document.querySelectorAll('[data-testid=\"stMainBlockContainer\"] "
                    "[data-testid=\"stPageLink\"]')].filter(e => e.offsetParent !== null).length >= n",
                    arg=len(pages.PAGES) - 2, timeout=120_000)
            name = f"{p.url_path or 'home'}_{width}{'_presenter' if presenter else ''}"
            counts[name] = n
            lines = problems(figures(page), min_px=MIN_PX[presenter])
            page.screenshot(path=str(SHOTS / f"{name}.png"))
            for i in sorted({int(line.split()[1]) for line in lines}):
                shoot(page, i, SHOTS / f"{name}_figure{i}.png")
            found += [f"{name}: {line}" for line in lines]
    page.close()
    print("figures per page and size:", counts)
    assert sum(counts.values()) >= 2 * 20, counts  # the audit read figures (an empty page list would pass)
    assert not found, "\n".join(found)


def _box_is_address_bar(page, wait: float = 5.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if copy_link(page) == page.url:
            return True
        time.sleep(0.2)
    return False


def _reached_address_bar(page, before: str) -> bool:
    """Whether the address bar moved from `before` within 5 s, or else within 5 s of the page's run ending (a
    fragment's rerun, Gradient norms' log scale, writes it; a loaded server takes seconds). The page is idle after."""
    changed = "(u) => location.href !== u"
    for _ in range(2):
        try:
            page.wait_for_function(changed, arg=before, timeout=5_000)
            wait_until_idle(page, timeout=600, settle=0.3)
            return True
        except Exception:  # noqa: BLE001 - not yet: once the run has ended, once more
            wait_until_idle(page, timeout=600, settle=0.3)
    return page.url != before


def _open_expanders(page) -> None:
    """Open every closed expander (a click on its summary, as a visitor would): the controls in it become visible."""
    for summary in page.locator('[data-testid="stExpander"] details:not([open]) > summary').all():
        if summary.is_visible():
            summary.click()
            page.wait_for_timeout(100)


# Found by the test below (issue 41): after Geometry's problem changed, its learning rate kept the old problem's value
# while its default (`value=p.lr`) became the new one's, so the link lost it and a change onto the new default left
# the address bar as it was, in every run. A new problem now sets its own η and B (`views/geometry._problem_changed`).
# On a loaded machine one to three other changes (Gradient norms' checkpoint or log scale, Influence's test point) did
# not reach the address bar, and since this test opens expanders (session 36) most of Influence's per-method settings
# after the method had been switched. Reproduced on a cold store (session 37): Influence's test point changed after
# its method, and neither the address bar nor the server's copy of the URL held it, while the session did; the
# browser writes a bound control's change only while it holds the control's binding, and the control mounted again
# while the page computed. Now the server writes every drawn control's value into the URL after each run and each
# fragment's rerun (`gradlab.ui.widgets.write_bound_values`): no change may miss the address bar.


def test_the_pages_declare_at_least_80_controls():
    assert sum(len(p.controls) for p in pages.PAGES) >= 80  # what the copy-box test below changes, page by page


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("p", [p for p in pages.PAGES if p.controls], ids=lambda p: p.url_path)
def test_the_copy_box_is_the_address_bar_after_every_control_of_every_page(server, browser, p):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    bad, missed = [], []
    page.goto(_url(server, p.url_path))
    wait_until_idle(page, timeout=600, settle=0.3)
    todo, kinds = list(p.controls), {}
    # a control another one shows (σ by hand, a method's own settings, the canary's trial): changing the choices
    # again shows it (each change picks the next option, so every option comes in turn)
    for _ in range(12):
        _open_expanders(page)  # a method's own settings sit in a closed expander
        for key in [k for k in todo if present(page, k)]:
            before = page.url
            try:
                kinds[key] = change(page, key)
            except LookupError:  # the change before hid it (DP-SGD's target ε once σ is set by hand)
                continue
            except RuntimeError as err:  # disabled (Geometry's "remove" on the scalar problem)
                kinds[key] = f"unchanged: {err}"
                todo.remove(key)
                continue
            todo.remove(key)
            if not _reached_address_bar(page, before):
                missed.append(f"{p.url_path} {key}")
            if not _box_is_address_bar(page):
                bad.append(f"{p.url_path} {key}: box {copy_link(page)!r} != address bar {page.url!r}")
            if page_errors(page):
                bad.append(f"{p.url_path} {key}: {page_errors(page)[0][:200]}")
        if not todo:
            break
        choosers = [k for k, kind in kinds.items() if kind in ("radio", "selectbox")]
        for key in choosers:
            if any(present(page, k) for k in todo):
                break
            try:
                change(page, key)
            except (LookupError, RuntimeError):
                continue
            wait_until_idle(page, timeout=600, settle=0.3)
            if p.url_path in PRESS:
                button = page.get_by_role("button", name=PRESS[p.url_path])
                if button.count() and button.first.is_visible():
                    button.first.click()
                    wait_until_idle(page, timeout=600, settle=0.3)
    page.close()
    # `missed`: changes the address bar did not show within 5 s of the page's run (see the note above the test)
    print("changed:", kinds, "never shown:", todo, "address bar missed:", missed)
    assert not missed, missed
    assert not todo and len(kinds) == len(p.controls), (todo, kinds)  # every control of the page was changed
    assert not bad, "\n".join(bad)


#: The lecture steps that move a block to the top, one per block (steps 1 and 3 share theirs); step 11's figures need
#: its training, which a link never starts: its controls are checked without it.
MOVED = sorted({s.point: i for i, s in reversed(list(enumerate(LECTURE, start=1))) if s.point}.values())

#: The control changed under each moved block: one that keeps its figure (Equivalence's "Example" swaps the seeds'
#: chart for another view, so its "Reduction" is changed).
CHANGE = {"equivalence": "eq_reduction", "norms_top": "topk", "dp_per_class": "dp_clip_sigma", "dp_sgd": "dp_sgd_c",
          "influence_proponents": "infl_k", "geo_removal": "geo_remove"}

_BOX_JS = """(sel) => { const el = document.querySelector(sel); if (!el) return null;
  const r = el.getBoundingClientRect(); return {top: r.top, bottom: r.bottom}; }"""


def _settled_box(page, selector: str, *, still: float = 1.0, timeout: float = 30.0) -> dict | None:
    """The on-screen box of `selector` once it has not moved for `still` s (Plotly lays a figure out after
    Streamlit's run has ended: a box read before that moved by hundreds of px when the figures grew, and Playwright's
    click then scrolled the control back into view, which read as the change moving the block)."""
    box, since, deadline = None, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = page.evaluate(_BOX_JS, selector)
        if now != box:
            box, since = now, time.monotonic()
        elif time.monotonic() - since >= still:
            break
        page.wait_for_timeout(200)
    return box


@pytest.mark.timeout(1800)
def test_a_moved_figures_controls_are_beside_it_and_a_change_keeps_it_in_view(server, browser):
    page = browser.new_page(viewport={"width": 1024, "height": 768})
    bad = []
    for step in MOVED:
        s = LECTURE[step - 1]
        page.goto(f"{server}/lecture?step={step}&presenter=true")
        wait_until_idle(page, timeout=900, settle=0.5)
        assert not page_errors(page), (step, page_errors(page)[:1])
        slot = f".st-key-{points.KEY}"
        reads = [k for name in s.point for k in points.READS[name]]
        shown = [k for k in reads if present(page, k)]
        outside = [k for k in shown if not page.locator(f"{slot} .st-key-{k}").count()]
        if outside or not shown:
            bad.append(f"step {step}: controls {outside or reads} not in the step's slot")
        page.screenshot(path=str(SHOTS / f"moved_step{step:02d}.png"))
        # change the first control the block reads, at the scroll position it is at: the block stays where it was
        key = CHANGE[s.point[0]]
        if key not in shown or key in outside:
            continue
        _settled_box(page, slot)  # the block's figures lay out after the run ends: their growth moved the control
        page.locator(f".st-key-{key}").first.scroll_into_view_if_needed()
        before = _settled_box(page, slot)
        try:
            change(page, key)
        except RuntimeError as err:
            bad.append(f"step {step}: {err}")
            continue
        wait_until_idle(page, timeout=900, settle=0.5)
        after = _settled_box(page, slot)
        moved = abs(after["top"] - before["top"]) if after and before else None
        if moved is None or moved > 40 or after["bottom"] < 100 or after["top"] > 768 - 100:
            bad.append(f"step {step}: after {key} the block went from {before} to {after}")
        page.screenshot(path=str(SHOTS / f"moved_step{step:02d}_after_{key}.png"))
    page.close()
    assert MOVED and not bad, "\n".join(bad)


def test_every_control_a_block_reads_is_declared_on_the_page_of_a_step_that_moves_it():
    for s in LECTURE:
        for name in s.point:
            assert set(points.READS[name]) <= set(pages.page(s.preset.page).controls), (name, s.preset.page)
