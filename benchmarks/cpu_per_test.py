"""Each test's whole cost in CPU-seconds, the servers, Chromium and sandbox children it starts included.

`--durations` gives wall time, which misleads on two cores: a Practice attack that sleeps past its wall clock takes 10 s
and almost no CPU, while a browser test's Chromium and server burn CPU that no pytest timer sees. Run the tests one at
a time (`-n 0`) on a quiet machine and this plugin reads the machine's busy CPU time (`/proc/stat`) before and after
each test's setup, call and teardown: what moved is that test's, whatever process spent it (a module's server is
charged to the test that starts it, and its teardown to the last).

    python -m pytest -q -n 0 -p benchmarks.cpu_per_test --cpu-per-test /tmp/cpu.jsonl -m slow
    python -m benchmarks.cpu_per_test /tmp/cpu.jsonl [--top 30]

The first writes one JSON line per test (`nodeid`, `cpu_s`, `wall_s`, `outcome`) as it goes; the second prints the
tests by CPU, with totals by file. Nothing here runs in the suite.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import pytest

from benchmarks.suite_cpu import HZ


def busy_seconds() -> float:
    """The machine's CPU time spent busy since boot, in CPU-seconds (all cores: user, nice, system, irq, softirq and
    steal of `/proc/stat`'s first line; idle and iowait left out)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / HZ


def pytest_addoption(parser):
    parser.addoption("--cpu-per-test", metavar="PATH", default=None,
                     help="write each test's machine-wide CPU-seconds to PATH (JSON lines); run with -n 0")


def pytest_configure(config):
    path = config.getoption("--cpu-per-test")
    if path is None:
        return
    if getattr(config.option, "numprocesses", None):
        raise pytest.UsageError("--cpu-per-test reads the whole machine's CPU: run the tests one at a time (-n 0)")
    config.pluginmanager.register(_Recorder(path), "cpu-per-test-recorder")


class _Recorder:
    def __init__(self, path: str):
        self.out = open(path, "w")
        self.outcome: dict[str, str] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        cpu, wall = busy_seconds(), time.monotonic()
        yield
        row = {"nodeid": item.nodeid, "cpu_s": round(busy_seconds() - cpu, 2),
               "wall_s": round(time.monotonic() - wall, 2), "outcome": self.outcome.pop(item.nodeid, "?")}
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()

    def pytest_runtest_logreport(self, report):
        if report.failed or report.when == "call" or (report.when == "setup" and report.skipped):
            self.outcome[report.nodeid] = report.outcome


def main(argv=None) -> None:
    """Print the tests of a `--cpu-per-test` file by CPU-seconds, and the totals by file."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in open(args.path) if line.strip()]
    total = sum(r["cpu_s"] for r in rows)
    print(f"{len(rows)} tests, {total:,.0f} CPU-s, {sum(r['wall_s'] for r in rows):,.0f} s wall one at a time")
    print(f"{'CPU-s':>8} {'wall s':>7}  test")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:args.top]:
        print(f"{r['cpu_s']:8.1f} {r['wall_s']:7.1f}  {r['nodeid']}{'' if r['outcome'] == 'passed' else ' (' + r['outcome'] + ')'}")
    by_file = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        f = by_file[r["nodeid"].split("::")[0]]
        f[0] += r["cpu_s"]
        f[1] += r["wall_s"]
        f[2] += 1
    print(f"\n{'CPU-s':>8} {'wall s':>7} {'tests':>5}  file")
    for name, (cpu, wall, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0]):
        print(f"{cpu:8.1f} {wall:7.1f} {n:5d}  {name}")


if __name__ == "__main__":
    main()
