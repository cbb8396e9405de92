"""A page opened from a link on a cold server: empty results store, empty XLA compile cache, a fresh process.

    python -m benchmarks.cold_page                                             # Gradient norms, SimpleCNN on Fashion-MNIST
    python -m benchmarks.cold_page --page influence --query "dataset=fashion&model=simple_cnn" --repeat 2
    python -m benchmarks.cold_page --page equivalence --store /tmp/cnn-store --press "Train the model"   # fill a store
    python -m benchmarks.cold_page --page equivalence --store /tmp/cnn-store     # a link after someone trained it
    python -m benchmarks.cold_page --page influence --press "Train the model" --memory-limit 690   # as on a hosted instance

Per visit: the server's time for the page's script runs (`GRADLAB_LOG_RUNS`), the browser's wait until the page is
idle, and the server's CPU-seconds during the visit (`/proc/<pid>/stat` utime + stime: all of XLA's threads, the
number a shared server's work budget counts), the server's peak resident memory (process tree, sampled every 0.1 s
from its start: the 690 MB of the smallest hosted instance), with the load average. Debian's Chromium drives the page.
`--store DIR` keeps the results store in DIR (the XLA cache stays cold): a first visit with `--press LABEL` presses that
button (e.g. "Train the model") and fills it, so a later visit measures a link whose model someone trained before.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks.browser import MemoryLimit, Sampler, launch, page_errors, run_times, streamlit_server, wait_until_idle


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (its threads included), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def visit(page_path: str, query: str, store: str | None = None, press: str | None = None,
          memory_limit: float = 0.0, keep_log: str | None = None) -> dict:
    """One cold visit (and `press`), inside a memory cgroup of `memory_limit` MB when given, the server's log copied
    to `keep_log` when given; **returns** its numbers."""
    limit = MemoryLimit(memory_limit) if memory_limit else None
    try:
        return _visit(page_path, query, store, press, limit, keep_log)
    finally:
        if limit:
            limit.close()  # the cgroup's folder, also when the visit failed


def _visit(page_path: str, query: str, store: str | None, press: str | None, limit: MemoryLimit | None,
           keep_log: str | None = None) -> dict:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="gradlab-cold-") as tmp, sync_playwright() as p:
        log = Path(tmp) / "server.log"
        env = {"GRADLAB_LOG_RUNS": "1", "GRADLAB_STORE_DIR": store or f"{tmp}/store", "JAX_COMPILATION_CACHE_DIR": f"{tmp}/xla"}
        browser = launch(p)
        with streamlit_server(log_path=log, env=env, limit=limit) as (base, proc):
            sampler = Sampler(proc.pid)
            sampler.start()
            time.sleep(2)
            before, load, idle = cpu_seconds(proc.pid), os.getloadavg()[0], sampler.peak
            page = browser.new_context(viewport={"width": 1280, "height": 1600}).new_page()
            start = time.perf_counter()
            page.goto(f"{base}/{page_path}?{query}")
            wait_until_idle(page, timeout=600, settle=1.0)
            wall = time.perf_counter() - start - 1.0
            cpu = cpu_seconds(proc.pid) - before
            peak = sampler.peak
            pressed_cpu = None
            if press:
                page.get_by_role("button", name=press).first.click()
                time.sleep(1)
                wait_until_idle(page, timeout=600, settle=1.0)
                pressed_cpu = cpu_seconds(proc.pid) - before - cpu
            errors = page_errors(page)
            text = page.locator('[data-testid="stMainBlockContainer"]').inner_text()
            page.context.close()
            sampler.stop.set()
        browser.close()
        cgroup = limit.report() if limit else None
        computes = [line for line in log.read_text().splitlines() if line.startswith("gradlab-compute ")]
        if keep_log:
            Path(keep_log).write_text(log.read_text())
        return dict(computes=computes, server=sum(s for _, s in run_times(log)), browser=wall, cpu=cpu, errors=errors,
                    load=(load, os.getloadavg()[0]), text=text, peak=peak, idle=idle, after_press=sampler.peak,
                    pressed_cpu=pressed_cpu, cgroup=cgroup)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", default="norms")
    ap.add_argument("--query", default="dataset=fashion&model=simple_cnn")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--show", help="print the page's lines containing this text")
    ap.add_argument("--computes", action="store_true", help="print each computation's time and memory (server log)")
    ap.add_argument("--store", help="keep the results store in this folder (default: a fresh one per visit)")
    ap.add_argument("--press", help="after the link's first screen, press the button with this label (fills --store)")
    ap.add_argument("--memory-limit", type=float, default=0,
                    help="run the server in a memory cgroup of this many MB (root), as a hosting instance does; print "
                         "its peak (file pages included, which the kernel reclaims before it kills) and its OOM kills")
    ap.add_argument("--keep-log", help="copy the server's log (its per-run and per-computation lines) to this file")
    a = ap.parse_args(argv)
    print(f"{a.page}?{a.query}: cold server (empty store and XLA cache); {os.cpu_count()} CPUs")
    for i in range(a.repeat):
        r = visit(a.page, a.query, a.store, a.press, a.memory_limit, a.keep_log)
        print(f"  visit {i + 1}: server {r['server']:.1f} s, browser {r['browser']:.1f} s, server CPU {r['cpu']:.1f} CPU-s; "
              f"server memory {r['idle']:.0f} MB at start, peak {r['peak']:.0f} MB before any button"
              + (f", {r['after_press']:.0f} MB and {r['pressed_cpu']:.1f} CPU-s after pressing {a.press!r}" if a.press else "")
              + f"; load average {r['load'][0]:.1f} → {r['load'][1]:.1f}; {len(r['errors'])} error boxes", flush=True)
        if r["cgroup"]:
            c = r["cgroup"]
            print(f"    memory cgroup: limit {c['limit_mb']:.0f} MB, peak {c['peak_mb']:.0f} MB, {c['oom_kills']} OOM kills")
        for e in r["errors"]:
            print("    ERROR", e[:300])
        if a.computes:
            for line in r["computes"]:
                print("    ", line[len("gradlab-compute "):])
        if a.show:
            for line in r["text"].splitlines():
                if a.show.lower() in line.lower():
                    print("    |", line[:200])


if __name__ == "__main__":
    main()
