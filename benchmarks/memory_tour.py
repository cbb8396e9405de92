"""Peak memory of the server across a tour of every page at default settings.

Starts `streamlit run app.py` headless, visits every page in Debian's chromium (Playwright) one
after the other with the default experiment, and samples the resident set size (RSS) of the
server process and all its children every 0.1 s from /proc (psutil when installed). Prints the
RSS after each page and the peak. The target is the smallest Streamlit Community Cloud instance:
690 MB.

    python -m benchmarks.memory_tour [--rounds 2] [--query "dataset=moons"] [--sessions 1] [--extreme]

`--rounds 2` tours twice (the second round shows what stays cached); `--sessions N` tours with N
browser sessions at once; `--extreme` visits the shared links with extreme and invalid parameters
(`benchmarks.browser.EXTREME_LINKS`: widest MLP, the largest sweep, lr 100, label noise 1.0, nonsense).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from benchmarks.browser import (
    EXTREME_LINKS, PAGES, Sampler, launch, page_errors, streamlit_server, tree_rss_mb, wait_until_idle)

TARGET_MB = 690


def tour(base: str, query: str, rounds: int, label: str, sampler: Sampler, errors: list[str]):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 1600})
        links = ([(path, q, f"{path or 'home'}?{q}"[:70]) for path, q in EXTREME_LINKS] if query == "extreme"
                 else [(path, query, name) for path, name, _ in PAGES])
        for r in range(rounds):
            for path, q, name in links:
                t0 = time.time()
                page.goto(f"{base}/{path}" + (f"?{q}" if q else ""))
                wait_until_idle(page, timeout=600)
                errs = page_errors(page)
                if errs:
                    errors.append(f"{label} {name}: {errs[0][:300]}")
                print(f"{label} round {r + 1} {name:<15} {time.time() - t0:6.1f} s   server RSS now "
                      f"{tree_rss_mb(sampler.pid):6.0f} MB   peak so far {sampler.peak:6.0f} MB", flush=True)
        browser.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--sessions", type=int, default=1)
    ap.add_argument("--query", default="", help="query string for every page, e.g. 'dataset=moons'")
    ap.add_argument("--extreme", action="store_true", help="visit benchmarks.browser.EXTREME_LINKS instead")
    ap.add_argument("--log", default="/tmp/gradlab_memory_tour.log")
    args = ap.parse_args()
    if args.extreme:
        args.query = "extreme"

    with streamlit_server(log_path=Path(args.log)) as (base, proc):
        sampler = Sampler(proc.pid)
        sampler.start()
        idle = tree_rss_mb(proc.pid)
        print(f"server pid {proc.pid}: RSS at start {idle:.0f} MB", flush=True)
        errors: list[str] = []
        t0 = time.time()
        threads = [threading.Thread(target=tour, args=(base, args.query, args.rounds, f"[session {i}]", sampler, errors))
                   for i in range(args.sessions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(1.0)
        sampler.stop.set()
        sampler.join()
        final = tree_rss_mb(proc.pid)
    print(f"\npages: {'the extreme links' if args.extreme else ', '.join(n for _, n, _ in PAGES)}; rounds {args.rounds}; sessions {args.sessions}; "
          f"query {args.query or '(defaults)'}; {time.time() - t0:.0f} s")
    print(f"RSS at start {idle:.0f} MB, at end {final:.0f} MB")
    return verdict(sampler.peak, errors)


def verdict(peak_mb: float, errors) -> int:
    """Print the peak against `TARGET_MB` and every page error; the exit status (0: under the target, no error)."""
    print(f"PEAK RSS (server + children): {peak_mb:.0f} MB  (target < {TARGET_MB} MB: "
          f"{'OK' if peak_mb < TARGET_MB else 'OVER'})")
    for e in errors:
        print("ERROR", e)
    return 0 if peak_mb < TARGET_MB and not errors else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
