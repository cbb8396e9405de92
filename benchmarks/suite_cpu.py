"""Where a test run's CPU goes, by kind of process: the test workers, the Streamlit servers the browser tests start,
Chromium, Practice's sandbox children, the rest (issue 39: the whole suite's floor on two cores).

    python -m benchmarks.suite_cpu -- python -m pytest -q              # the whole suite
    python -m benchmarks.suite_cpu -- python -m pytest -q -m "not slow"

Runs the command and samples every process on the machine every 0.5 s (`/proc/<pid>/stat`: user + system CPU, less
what a process had used when the run began), so run it on a quiet machine. A process is counted by the last command
line it showed; one that lived under 0.5 s is missed, and a process keeps at most its last 0.5 s unseen. Prints the
wall time, the CPU-s of each kind and the floor they set on two cores (all CPU / 2: the wall time with both cores busy
throughout). No pytest here.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import threading
import time

HZ = os.sysconf("SC_CLK_TCK")  # /proc counts CPU in clock ticks


def kind(cmdline: str) -> str:
    """The kind of process a command line belongs to."""
    if "chrom" in cmdline.split(" ")[0]:
        return "chromium"
    if "streamlit" in cmdline and " run " in cmdline:
        return "streamlit server"
    if "exec(eval(sys.stdin" in cmdline:  # pytest-xdist's worker (execnet)
        return "test worker"
    if "pytest" in cmdline:
        return "pytest controller"
    if "bwrap" in cmdline or "gradlab.practice" in cmdline:
        return "practice sandbox"
    if "playwright" in cmdline:
        return "playwright driver"
    if "python" in cmdline:
        return "other python"
    return "other"


def _processes() -> dict[tuple[str, str], tuple[str, float]]:
    """{(pid, start time): (command line, CPU-s)} of every process readable now; a zombie's command line is ""."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state is field 3 of proc(5)
        out[(pid, fields[19])] = (cmdline, (int(fields[11]) + int(fields[12])) / HZ)  # utime, stime; starttime
    return out


def measure(command: list[str], every: float = 0.5) -> tuple[float, int, dict[str, float]]:
    """Run `command`; **returns** (wall s, its exit status, {kind: CPU-s}) over every process of the machine."""
    before = {key: cpu for key, (_, cpu) in _processes().items()}
    seen: dict[tuple[str, str], tuple[str, float]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for key, (cmdline, cpu) in _processes().items():
                name = kind(cmdline) if cmdline else seen.get(key, ("other", 0.0))[0]  # a zombie keeps its kind
                seen[key] = (name, cpu - before.get(key, 0.0))
            done.wait(every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.monotonic()
    status = subprocess.call(command)
    wall = time.monotonic() - start
    done.set()
    sampler.join()
    me = str(os.getpid())
    totals: dict[str, float] = collections.Counter()
    for (pid, _), (name, cpu) in seen.items():
        if pid != me:
            totals[name] += cpu
    return wall, status, dict(totals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to measure after --")
    wall, status, totals = measure(command)
    total = sum(totals.values())
    print(f"\n{' '.join(command)}: exit {status}, {wall:.0f} s wall, {total:.0f} CPU-s in all "
          f"({total / wall:.2f} cores busy on average; floor on two cores {total / 2:.0f} s)")
    for name, cpu in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {cpu:8.1f} CPU-s  {100 * cpu / total:4.1f}%  {name}")
    sys.exit(status)


if __name__ == "__main__":
    main()
