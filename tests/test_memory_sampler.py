"""The memory the browser tests hold the server to (`benchmarks.browser.tree_rss_mb`): a process tree read from /proc,
counting what a container would be charged, and nothing twice; and the CPU a test run takes by kind of process
(`benchmarks.suite_cpu`) and by test (`benchmarks.cpu_per_test`)."""

import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks.browser import ROOT, tree_rss_mb

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A parent holding 200 MB that starts `uname -p` again and again (as `platform.processor()` did in the server): Python's
# subprocess starts each child with vfork, and until its exec the child runs in the parent's own memory.
VFORKING_PARENT = """
import subprocess, sys, time
import numpy as np
held = np.ones(200 * 2**18, dtype=np.float32)  # 200 MB, written
print("ready", flush=True)
end = time.time() + 1
while time.time() < end:
    subprocess.run(["uname", "-p"], stdout=subprocess.DEVNULL)
"""

# A parent that starts a Python child holding 100 MB of its own for 1 s.
PARENT_OF_A_LARGE_CHILD = """
import subprocess, sys
print("ready", flush=True)
subprocess.run([sys.executable, "-c", "import numpy as np, time; a = np.ones(100 * 2**18, dtype=np.float32); time.sleep(1)"])
"""


def _peak_while_running(code: str) -> tuple[float, float]:
    """(the tree's peak, the parent's own largest VmRSS) in MB, sampled every 1 ms while `code` runs."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    peak = own = 0.0
    while proc.poll() is None:
        peak = max(peak, tree_rss_mb(proc.pid))
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                own = max(own, next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024)
        except (OSError, StopIteration):
            pass
        time.sleep(0.001)
    assert proc.returncode == 0
    return peak, own


def test_a_child_before_its_exec_is_not_counted_as_a_second_copy_of_its_parent():
    # before `_before_exec` a vfork child read as the parent's 200 MB again: CI read a 577 MB server as 824 MB
    peak, own = _peak_while_running(VFORKING_PARENT)
    assert own > 200
    assert peak < own + 20, (peak, own)


def test_a_child_that_runs_its_own_program_is_counted():
    peak, own = _peak_while_running(PARENT_OF_A_LARGE_CHILD)
    assert peak > own + 90, (peak, own)


# A grandchild that burns 1 CPU-s, then idles long enough for a sample to see its total.
BURNS_ONE_CPU_SECOND = """
import subprocess, sys
code = "# gradlab.practice\\nimport time\\nwhile time.process_time() < 1.0: pass\\ntime.sleep(0.8)"
subprocess.run([sys.executable, "-c", code], check=True)
"""


def test_the_suite_cpu_counts_a_grandchilds_cpu_under_its_kind():
    from benchmarks import suite_cpu

    wall, status, totals = suite_cpu.measure([sys.executable, "-c", BURNS_ONE_CPU_SECOND])
    assert status == 0 and wall >= 1.8
    assert 0.95 <= totals.get("practice sandbox", 0) <= 1.3, totals
    assert suite_cpu.kind("/usr/lib/chromium/chromium --type=renderer") == "chromium"
    assert suite_cpu.kind("/x/python -u -c import sys;exec(eval(sys.stdin.readline()))") == "test worker"


# Two tests for benchmarks.cpu_per_test: one whose child process burns ~0.5 CPU-s (and writes what it burnt), one that
# sleeps.
TWO_TESTS = """
import resource, subprocess, sys, time

def test_child_burns(tmp_path):
    subprocess.run([sys.executable, "-c", "x = 0\\nfor i in range(6_000_000): x += i"], check=True)
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    (tmp_path.parent.parent / "burnt").write_text(str(r.ru_utime + r.ru_stime))

def test_sleeps():
    time.sleep(0.3)
"""


@pytest.mark.slow
def test_cpu_per_test_charges_a_childs_cpu_to_its_test(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the repository's: no -n 2, no conftest
    (tmp_path / "test_two.py").write_text(TWO_TESTS)
    out = tmp_path / "cpu.jsonl"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "benchmarks.cpu_per_test",
                    "--cpu-per-test", str(out), "--basetemp", str(tmp_path / "base"), "test_two.py"],
                   cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                   capture_output=True)
    rows = {r["nodeid"]: r for r in map(json.loads, out.read_text().splitlines())}
    burnt = float((tmp_path / "burnt").read_text())
    assert burnt > 0.2 and rows["test_two.py::test_child_burns"]["cpu_s"] >= 0.9 * burnt, (burnt, rows)
    assert rows["test_two.py::test_sleeps"]["wall_s"] >= 0.3
    assert {r["outcome"] for r in rows.values()} == {"passed"}
