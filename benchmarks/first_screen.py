"""What the first screen shows: for every lecture step in presenter mode at a projector's 1024×768, how many
pixels of its first chart are visible without scrolling; for every page at 1400×900 (or `--page-size`), where its
first chart starts. Headless Chromium against a local server (the results store the run leaves is reused by a second run).

    python -m benchmarks.first_screen                  # all 13 steps and every page
    python -m benchmarks.first_screen --steps 11,12,13 --pages none
    python -m benchmarks.first_screen --steps none --page-size 1024x768   # a laptop

Prints one row per view: top of the first chart (px from the window's top), its visible height, the goal and
whether it is met (lecture ≥ 300 px visible at 1024×768; pages: the chart starts within 900 px).
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.browser import PAGES, launch, page_errors, streamlit_server, wait_until_idle
from gradlab.ui.presets import LECTURE


def first_chart(page) -> tuple[float, float] | None:
    """(top, visible height) in px of the first Plotly chart in the window, or None if the view has none."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector(".js-plotly-plot", timeout=120_000)
    except PlaywrightTimeout:
        return None
    page.wait_for_timeout(800)  # let the layout settle after the chart's first draw
    box = page.locator(".js-plotly-plot").first.bounding_box()
    if box is None:
        return None
    height = page.viewport_size["height"]
    return box["y"], max(0.0, min(box["y"] + box["height"], height) - max(box["y"], 0.0))


def measure(page, url: str) -> tuple[float, float] | None:
    page.goto(url)
    wait_until_idle(page, timeout=600)
    if page_errors(page):
        raise RuntimeError(f"{url}: {page_errors(page)[0]}")
    return first_chart(page)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default="all", help="lecture steps, e.g. 11,12,13 ('all', 'none')")
    parser.add_argument("--pages", default="all", help="url paths, e.g. norms,influence ('all', 'none')")
    parser.add_argument("--page-size", default="1400x900", help="the pages' window, WxH (a laptop: 1024x768)")
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.page_size.split("x"))
    steps = range(1, len(LECTURE) + 1) if args.steps == "all" else [] if args.steps == "none" else [
        int(s) for s in args.steps.split(",")]
    paths = [p for p, *_ in PAGES if p != "lecture"] if args.pages == "all" else [] if args.pages == "none" else \
        args.pages.split(",")
    from playwright.sync_api import sync_playwright

    failed = 0
    with streamlit_server() as (base, _), sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": 1024, "height": 768})
        for step in steps:
            top, seen = measure(page, f"{base}/lecture?step={step}&presenter=true") or (float("nan"), 0.0)
            ok = seen >= 300
            failed += not ok
            print(f"lecture step {step:2d}, presenter, 1024x768: chart top {top:6.0f} px, visible {seen:4.0f} px "
                  f"(goal >= 300): {'met' if ok else 'NOT met'}", flush=True)
        page.set_viewport_size({"width": width, "height": height})
        for path in paths:
            top, seen = measure(page, f"{base}/{path}") or (float("nan"), 0.0)
            ok = top < height
            failed += not ok
            print(f"page /{path or 'home'}, {args.page_size}: chart top {top:6.0f} px, visible {seen:4.0f} px "
                  f"(goal: starts within {height}): {'met' if ok else 'NOT met'}", flush=True)
        browser.close()
    print(f"{failed} view(s) miss the goal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
