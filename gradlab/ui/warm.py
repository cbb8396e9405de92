"""Warm start: compute what every page's default view and every lecture step shows, before visitors come.

    python -m gradlab.ui.warm            # every page and step once (cold), then again as a new visitor (warm); times
    python -m gradlab.ui.warm --fill     # every page and step once: fill the results store
    python -m gradlab.ui.warm --fill --lecture   # the lecture's steps only (a room walks them in its server instead:
                                                 # gradlab.ui.walk)
    python -m gradlab.ui.warm --serve    # warm, then serve the app from this process (port 8501)

Each view runs the real page code under Streamlit's `AppTest`. Its results go to the shared results store
(`gradlab.store`, on disk in `GRADLAB_STORE_DIR`) through the same machine-wide gate slots a server uses,
and compiled programs to JAX's persistent cache, so a server started later (or restarted) on the same
directories answers its first visitor from disk. Times are server time: one script run, no browser.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest
from streamlit.web import cli

from gradlab import memory, practice
from gradlab.ui import pages
from gradlab.ui.presets import LECTURE

ROOT = Path(__file__).resolve().parents[2]


def press_heavy_sections(at) -> None:
    """Press every heavy section's button on the page (`ui.on_request`): the results are then stored for all."""
    for key in [b.key for b in at.button if (b.key or "").startswith("run_")]:
        at.button(key=key).click()
        at.run()


def _visit(at, what: str, *, press: bool):
    """Run `at` once (and its heavy sections when `press`); **returns** `(seconds, at)`. **Raises** RuntimeError
    naming `what` if the page shows an exception."""
    start = time.perf_counter()
    at.run()
    if press:
        press_heavy_sections(at)
    seconds = time.perf_counter() - start
    if at.exception:
        raise RuntimeError(f"{what}: {at.exception[0].value}")
    return seconds, at


def run_step(step: int, *, presenter: bool = False, press: bool = False, timeout: float = 600):
    """Run lecture step `step` (1-based) in a fresh `AppTest` session, pressing its heavy sections' buttons when
    `press`; return `(seconds, AppTest)`.

    **Raises** `RuntimeError` if the page shows an exception.
    """
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
    at.query_params["step"] = str(step)
    if presenter:
        at.query_params["presenter"] = "true"
    at.switch_page("views/lecture.py")
    return _visit(at, f"lecture step {step}", press=press)


PAGES = tuple(p.path for p in pages.PAGES if p.url_path != "lecture")


def run_page(page: str, *, press: bool = False, timeout: float = 600):
    """Run page `page`'s default view (its script path, or its name: `"norms"` for `views/norms.py`) in a fresh
    `AppTest` session, pressing its heavy sections' buttons when `press`; return `(seconds, AppTest)`.

    **Raises** `RuntimeError` if the page shows an exception.
    """
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
    at.run()
    at.switch_page(page if page.endswith(".py") else f"views/{page}.py")
    return _visit(at, f"page {page}", press=press)


def fill(*, pages: bool = True, log=print) -> float:
    """Compute every page's default view with its heavy sections (unless `pages=False`) and every lecture step once
    into the results store, and (with the pages) compile every Practice reference solution into the sandbox
    children's compilation cache; prints one line per view (`page …`, `practice …`, `step …`). **Returns** the
    seconds it took."""
    start = time.perf_counter()
    for page in PAGES if pages else ():
        seconds, _ = run_page(page, press=True)
        log(f"page {page:24s} {seconds:6.2f} s")
    for problem in practice.PROBLEMS if pages and practice.enabled() else ():
        began = time.perf_counter()
        practice.fill_cache(problem)
        log(f"practice {problem.slug:20s} {time.perf_counter() - began:6.2f} s")
    for i in range(1, len(LECTURE) + 1):
        seconds, _ = run_step(i, press=True)
        log(f"step {i:2d}          {seconds:6.2f} s  {LECTURE[i - 1].title}")
    return time.perf_counter() - start


def warm(steps=None, *, log=print) -> list[dict]:
    """Run every lecture step twice in this process: cold (trains, compiles) and as a second visitor.

    **Returns** one dict per step: `step`, `title`, `cold_s`, `warm_s` (server seconds for one run).
    """
    steps = steps or range(1, len(LECTURE) + 1)
    rows = []
    for i in steps:
        cold, _ = run_step(i)
        again, _ = run_step(i)
        rows.append({"step": i, "title": LECTURE[i - 1].title, "cold_s": cold, "warm_s": again})
        log(f"step {i:2d}  cold {cold:6.2f} s  warm {again:5.2f} s  {LECTURE[i - 1].title}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", action="store_true", help="then serve the app from this warmed process")
    parser.add_argument("--fill", action="store_true", help="compute every page and step once into the store")
    parser.add_argument("--lecture", action="store_true", help="with --fill: the lecture's steps only")
    parser.add_argument("--port", type=int, default=8501)
    parser.add_argument("--steps", default="", help="comma-separated step numbers (default: all)")
    args = parser.parse_args(argv)
    memory.lean_compiles()  # as the server compiles (app.py), before this process's first computation
    memory.trim_after_compiles()
    steps = [int(s) for s in args.steps.split(",") if s.strip()] or None
    if args.fill:
        print(f"filled the results store in {fill(pages=not args.lecture):.0f} s")
        return 0
    t0 = time.perf_counter()
    rows = warm(steps)
    total = time.perf_counter() - t0
    print(f"warmed {len(rows)} steps in {total:.0f} s; slowest warm step {max(r['warm_s'] for r in rows):.2f} s, "
          f"median cold {sorted(r['cold_s'] for r in rows)[len(rows) // 2]:.2f} s")
    if args.serve:
        sys.argv = ["streamlit", "run", str(ROOT / "app.py"), "--server.port", str(args.port),
                    "--server.headless", "true", "--browser.gatherUsageStats", "false"]
        return cli.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
