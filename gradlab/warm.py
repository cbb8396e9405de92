"""Warm start for a lecture: train and compile everything the lecture's steps need, before class.

    python -m gradlab.warm            # run every step once (cold), then again as a new visitor (warm); print times
    python -m gradlab.warm --serve    # the same, then serve the app from this warmed process (port 8501)

Each step runs the real page code under Streamlit's `AppTest` in this process, so the trained models
(`st.cache_resource`), page results (`st.cache_data`) and XLA executables it leaves behind are the
ones a server started by `--serve` in the same process uses: the first click in class is a cache hit.
(Without `--serve` the numbers say how long a cold and a warm step take; a separate `streamlit run`
process starts cold.) Times are server time: one script run of the step, no browser.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest
from streamlit.web import cli

from gradlab.presets import LECTURE

ROOT = Path(__file__).resolve().parents[1]


def run_step(step: int, *, presenter: bool = False, timeout: float = 600):
    """Run lecture step `step` (1-based) in a fresh `AppTest` session; return `(seconds, AppTest)`.

    **Raises** `RuntimeError` if the page shows an exception.
    """
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
    at.query_params["step"] = str(step)
    if presenter:
        at.query_params["presenter"] = "true"
    at.switch_page("views/lecture.py")
    start = time.perf_counter()
    at.run()
    seconds = time.perf_counter() - start
    if at.exception:
        raise RuntimeError(f"lecture step {step}: {at.exception[0].value}")
    return seconds, at


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
    parser.add_argument("--port", type=int, default=8501)
    parser.add_argument("--steps", default="", help="comma-separated step numbers (default: all)")
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",") if s.strip()] or None
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
