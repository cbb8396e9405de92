"""Peak memory of the server on the Example record page (issue 43), its ensembles pressed.

Starts `streamlit run app.py` headless (the deployed budgets: no test overrides), then in Debian's chromium visits the
Gradient norms page (a visitor arrives from a page), opens `/record?example=5` with the default experiment, presses
"Memorization and LiRA" (the two ensembles, 32 + 32 DP-SGD models), waits for the card and the whole picture, and
samples the RSS of the server and its children every 0.1 s. Prints the RSS after each step and the peak against the
smallest Community Cloud instance (690 MB).

    python -m benchmarks.record_memory [--query "steps=50"] [--room 20]

`--room N`: after the press, N more visitors (each its own browser context) open N different cards at once, as a
class following a lecturer's link does; the ensembles are the room's (stored once), each visitor's card its own.

Measured on the 2-core machine (load ~20 from other work, 27 Nov 2026): the two ensembles in one gated run peaked at
831 MB; as two gated runs (compiled programs dropped between them, `views/record.py`) 566 MB (the norms page 458,
the record page's cheap card 458). With `--room 20` (28 Nov 2026, load ≤ 10): the same 567 MB peak; 20 cards at once
left it at 468 MB.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from benchmarks.browser import Sampler, launch, page_errors, streamlit_server, tree_rss_mb, wait_until_idle
from benchmarks.memory_tour import verdict



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--query", default="", help="sidebar settings for every visit, e.g. 'steps=50'")
    ap.add_argument("--log", default="/tmp/gradlab_record_memory.log")
    ap.add_argument("--room", type=int, default=0, help="visitors who then open a card each, at once")
    args = ap.parse_args()
    q = f"&{args.query}" if args.query else ""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with streamlit_server(log_path=Path(args.log)) as (base, proc):
        sampler = Sampler(proc.pid)
        sampler.start()
        print(f"server pid {proc.pid}: RSS at start {tree_rss_mb(proc.pid):.0f} MB", flush=True)
        t0 = time.time()
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1280, "height": 1600})

            def step(name: str) -> None:
                errors.extend(f"{name}: {e[:300]}" for e in page_errors(page))
                print(f"{name:<28} {time.time() - t0:6.1f} s   RSS now {tree_rss_mb(proc.pid):6.0f} MB   "
                      f"peak so far {sampler.peak:6.0f} MB", flush=True)

            page.goto(f"{base}/norms?{q.lstrip('&')}")
            wait_until_idle(page, timeout=900)
            step("Gradient norms")
            page.goto(f"{base}/record?example=5{q}")
            wait_until_idle(page, timeout=900)
            step("record, cheap card")
            page.get_by_role("button", name=re.compile("Memorization and LiRA")).click()
            page.get_by_text("LiRA score as a member").first.wait_for(timeout=1_200_000)
            wait_until_idle(page, timeout=900)
            step("record, ensembles pressed")
            page.goto(f"{base}/record?example=6{q}")
            wait_until_idle(page, timeout=900)
            step("record, another card")
            if args.room:
                room = [browser.new_context(viewport={"width": 1024, "height": 768}).new_page() for _ in range(args.room)]
                for k, visitor in enumerate(room):  # goto returns at the page's load; the runs overlap
                    visitor.goto(f"{base}/record?example={10 + k}{q}")
                for visitor in room:
                    wait_until_idle(visitor, timeout=900)
                    errors.extend(f"room: {e[:300]}" for e in page_errors(visitor))
                step(f"record, a room of {args.room}")
            browser.close()
        time.sleep(1.0)
        sampler.stop.set()
        sampler.join()
    return verdict(sampler.peak, errors)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
