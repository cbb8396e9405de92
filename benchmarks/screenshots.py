"""Screenshots of the Geometry page and lecture steps, normal and presenter mode, at a projector's
1024×768 and at 1400×900 (headless Chromium). Writes PNGs to screenshots/ (gitignored, never committed).

    python -m benchmarks.screenshots                 # Geometry + lecture step 8, both modes, both sizes
    python -m benchmarks.screenshots --steps 1,7,9   # other lecture steps
    python -m benchmarks.screenshots --steps 1,2,3,4,5,6,7,8,9,10,11,12,13 --pages --first-screen
                                                     # every step and every page, the first screen only
    python -m benchmarks.screenshots --dp-fashion    # the DP clipping page on SimpleCNN / Fashion-MNIST, presenter
                                                     # mode at 1024×768, after "Train the model" and the DP-SGD button
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.browser import launch, page_errors, streamlit_server, wait_until_idle

ROOT = Path(__file__).resolve().parents[1]

SIZES = {"1024x768": (1024, 768), "1400x900": (1400, 900)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default="8")
    parser.add_argument("--out", default=str(ROOT / "screenshots"))
    parser.add_argument("--pages", action="store_true", help="also every page of the app by its plain link")
    parser.add_argument("--first-screen", action="store_true", help="only the first screen (no tall window)")
    parser.add_argument("--dp-fashion", action="store_true", help="only the DP clipping page on SimpleCNN, after its "
                                                                   "two buttons (several minutes of training)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    if args.dp_fashion:
        return dp_fashion(out)
    views = [("geometry", "geometry?geo_clip=true&geo_noise=true&geo_paths=true&geo_c=2&geo_t=20")]
    views += [(f"lecture_step{s}", f"lecture?step={s}") for s in args.steps.split(",") if s.strip()]
    if args.pages:
        from gradlab.ui.pages import PAGES

        views += [(f"page_{p.url_path or 'home'}", f"{p.url_path}?") for p in PAGES if p.url_path != "geometry"]
    from playwright.sync_api import sync_playwright

    with streamlit_server() as (base, _), sync_playwright() as pw:
        browser = launch(pw)
        for size, (w, h) in SIZES.items():
            page = browser.new_page(viewport={"width": w, "height": h})
            for name, path in views:
                for mode, extra in (("normal", ""), ("presenter", "&presenter=true")):
                    page.goto(f"{base}/{path}{extra}")
                    wait_until_idle(page, timeout=600)
                    page.wait_for_timeout(1500)
                    file = out / f"{name}_{mode}_{size}.png"
                    page.screenshot(path=str(file))
                    if not args.first_screen:
                        # the app scrolls inside its own container: a tall window of the same width shows it all
                        page.set_viewport_size({"width": w, "height": 3200})
                        page.wait_for_timeout(1500)
                        page.screenshot(path=str(out / f"{name}_{mode}_{size}_full.png"))
                        page.set_viewport_size({"width": w, "height": h})
                    print(file, "errors:", page_errors(page)[:1] or "none")
            page.close()
        browser.close()
    return 0


def shoot(page, file: Path, width: int, height: int) -> None:
    """The window, then the whole page (`…_full.png`: the app scrolls inside its own container, so a window 3,200 px
    tall of the same width shows it all)."""
    page.screenshot(path=str(file))
    page.set_viewport_size({"width": width, "height": 3200})
    page.wait_for_timeout(1500)
    page.screenshot(path=str(file.with_name(file.stem + "_full.png")))
    page.set_viewport_size({"width": width, "height": height})
    page.wait_for_timeout(500)


def dp_fashion(out: Path, size=(1024, 768)) -> int:
    """The DP clipping page on `?dataset=fashion&model=simple_cnn` in presenter mode: the link, "Train the model",
    then "Train private and non-private models"; a screenshot after each, the page's metrics and errors printed."""
    import time

    from playwright.sync_api import sync_playwright

    from benchmarks.browser import metrics

    w, h = size
    with streamlit_server() as (base, _), sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": w, "height": h})
        page.goto(f"{base}/dp_clipping?dataset=fashion&model=simple_cnn&presenter=true")
        wait_until_idle(page, timeout=600)
        for step, label in (("link", None), ("trained", "Train the model"),
                            ("dp_sgd", "Train private and non-private models")):
            if label:
                start = time.perf_counter()
                page.get_by_role("button", name=label).first.click()
                page.wait_for_timeout(2000)
                wait_until_idle(page, timeout=900)
                print(f"{label!r}: {time.perf_counter() - start:.1f} s wall")
            page.wait_for_timeout(1500)
            file = out / f"dp_fashion_{step}_presenter_{w}x{h}.png"
            shoot(page, file, w, h)
            errors = page_errors(page)
            print(file, "metrics:", metrics(page), "errors:", errors[:1] if errors else "none", flush=True)
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
