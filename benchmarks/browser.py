"""Start `streamlit run app.py` headless and drive it with Playwright + Debian's chromium.

One copy shared by the browser benchmarks (latency, memory_tour, screenshots) and the browser tests
(`from benchmarks.browser import ...`; run both from the repository root with `python -m`). No pytest here.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage",
]

#: (url path, nav label, text the page's title contains); the url path is the page file's stem.
PAGES = [
    ("", "Home", "gradlab"),
    ("norms", "Gradient norms", "gradient norms"),
    ("equivalence", "Equivalence", "equivalence"),
    ("performance", "Performance", "performance"),
    ("dp_clipping", "DP clipping", "dp clipping"),
    ("influence", "Influence", "influence"),
    ("privacy_audit", "Privacy audit", "privacy audit"),
    ("geometry", "Geometry", "geometry"),
    ("record", "Example record", "example record"),
    ("lecture", "Lecture", "lecture"),
    ("practice", "Practice", "practice"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MemoryLimit:
    """A memory cgroup holding the server (and its children) to `limit_mb`, as a hosting instance does: over it the
    kernel first reclaims file pages (libraries, the store's files), then kills. cgroup v1 or v2, where writable
    (root in a container); `available()` says whether it is. `preexec` puts a child in it before it runs;
    `report()` gives the peak usage (MB) and how many processes the kernel killed for memory."""

    V1, V2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")

    def __init__(self, limit_mb: float):
        self.limit_mb = float(limit_mb)
        v2 = (self.V2 / "cgroup.controllers").exists()
        self.path = (self.V2 if v2 else self.V1) / f"gradlab-bench-{os.getpid()}-{time.monotonic_ns()}"
        self.v2 = v2
        self.path.mkdir()
        limit = str(int(self.limit_mb * 2**20))
        (self.path / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(limit)
        if v2:
            (self.path / "memory.swap.max").write_text("0")

    @classmethod
    def available(cls) -> bool:
        try:
            MemoryLimit(1024).close()
            return True
        except OSError:
            return False

    def preexec(self) -> None:
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def report(self) -> dict:
        if self.v2:
            peak = int((self.path / "memory.peak").read_text()) if (self.path / "memory.peak").exists() else 0
            events = dict(line.split() for line in (self.path / "memory.events").read_text().splitlines())
            kills = int(events.get("oom_kill", 0))
        else:
            peak = int((self.path / "memory.max_usage_in_bytes").read_text())
            control = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
            kills = int(control.get("oom_kill", 0))
        return {"limit_mb": self.limit_mb, "peak_mb": peak / 2**20, "oom_kills": kills}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


def wait_healthy(proc: subprocess.Popen, base: str, timeout: float, name: str, *, poll: float = 0.5,
                 exit_detail=lambda: "") -> None:
    """Return once `base + "/_stcore/health"` answers 200 (a Streamlit server, or a balancer in front of one).
    **Raises** `RuntimeError` when `proc` (`name`) exits first (with `exit_detail()` appended), `TimeoutError` after
    `timeout` s."""
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode} before it was healthy{exit_detail()}")
        try:
            with urllib.request.urlopen(base + "/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.time() > deadline:
            raise TimeoutError(f"{name} did not answer /_stcore/health within {timeout:.0f} s")
        time.sleep(poll)


@contextlib.contextmanager
def streamlit_server(port: int | None = None, *, timeout: float = 120, log_path: Path | None = None,
                     env: dict | None = None, limit: MemoryLimit | None = None):
    """Run the app headless on `port` (a free one by default), with extra `env` (and inside the memory cgroup
    `limit`, if given); yield (base url, Popen)."""
    port = port or free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit.preexec if limit else None,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base, timeout, "streamlit")
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log_path:
            log.close()


def launch(playwright):
    """Debian's chromium with the flags that work in a container."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def script_state(page) -> str:
    """Streamlit's run state as the frontend shows it: initial, running, notRunning, rerunRequested, …

    "" while the app is not mounted or the tab does not answer within 5 s: on a loaded 2-core machine a
    renderer can stall for tens of seconds, and the caller's own deadline decides when that is a failure."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout  # here: the module imports without it

    try:
        return page.locator('[data-testid="stApp"]').get_attribute("data-test-script-state", timeout=5000) or ""
    except PlaywrightTimeout:
        return ""


def wait_until_idle(page, *, timeout: float = 240, settle: float = 1.0) -> None:
    """Wait until the app has run and stopped (script state "notRunning" and no status widget for `settle` s)."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout * 1000)
    deadline = time.time() + timeout
    quiet_since = None
    while time.time() < deadline:
        idle = (script_state(page) == "notRunning"
                and page.locator('[data-testid="stStatusWidget"]').count() == 0
                and page.locator('[data-testid="stMainBlockContainer"] h1, [data-testid="stException"]').count() > 0)
        if not idle:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.time()
        elif time.time() - quiet_since >= settle:
            return
        time.sleep(0.2)
    raise TimeoutError(f"the app was still running after {timeout} s: {page.url} ({script_state(page)})")


def visit(page, url: str, *, timeout: float = 300) -> None:
    """Open `url` in `page` and wait until the app has run and stopped (`wait_until_idle`)."""
    page.goto(url)
    wait_until_idle(page, timeout=timeout)


def page_errors(page) -> list[str]:
    """Texts of Streamlit exception boxes on the page (a traceback shown to the user)."""
    return [e.inner_text()[:2000] for e in page.locator('[data-testid="stException"]').all()]


def title(page) -> str:
    heads = page.locator('[data-testid="stMainBlockContainer"] h1').all_inner_texts()
    return heads[0] if heads else ""


def metrics(page) -> dict[str, str]:
    """{label: value} of the st.metric elements on the page."""
    out = {}
    for m in page.locator('[data-testid="stMetric"]').all():
        label = m.locator('[data-testid="stMetricLabel"]').inner_text().strip()
        value = m.locator('[data-testid="stMetricValue"]').inner_text().strip()
        out[label] = value
    return out


def copy_link(page, *, timeout: float = 30) -> str:
    """The sidebar's "Copy link to this view" box (`ui.state.share_link`: a frame that shows the address bar)."""
    box = page.frame_locator('[data-testid="stSidebar"] iframe').locator("#link")
    deadline = time.monotonic() + timeout
    while not (value := box.input_value(timeout=timeout * 1000)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


def normalized(text: str) -> str:
    return text.lower().replace("_", " ")


def wait_for_metrics(page, labels, *, timeout: float = 120) -> dict[str, str]:
    """Poll until every st.metric label in `labels` is shown; return all metrics."""
    deadline = time.time() + timeout
    while True:
        shown = metrics(page)
        if all(label in shown for label in labels):
            return shown
        if time.time() > deadline:
            raise TimeoutError(f"metrics {sorted(set(labels) - set(shown))} not shown after {timeout} s: {shown}")
        time.sleep(0.3)


# ---------------------------------------------------------------- shared links that must not hurt the server

WIDEST = "model=mlp&width=512&depth=4"
ALL_APPROACHES = "&".join(f"perf_approaches={a}" for a in ("loop", "vmap", "rules", "batch", "norms_vmap", "norms"))
ALL_SIZES = "&".join(f"perf_sizes={n}" for n in (4, 16, 64, 256, 1024))

#: (page path, query): extreme and invalid parameters on every page. Each must open without a
#: traceback, keep the server up, and keep its memory within budget.
EXTREME_LINKS = [
    ("", "dataset=nonsense&model=transformer&width=-3&depth=99&seed=abc&lr=fast&steps=1e9&unknown=1"),
    ("norms", f"{WIDEST}&steps=2000&checkpoint_every=10"),
    ("norms", "label_noise=1.0"),
    ("norms", "lr=100&optimizer=sgd&steps=50"),
    ("equivalence", "model=cnn"),
    ("equivalence", f"{WIDEST}&steps=25"),
    ("performance", f"{WIDEST}&perf_workload=experiment&{ALL_APPROACHES}&{ALL_SIZES}&perf_loop_max=1024&perf_repeats=1"),
    ("dp_clipping", f"{WIDEST}&steps=25&dp_sgd_q=1.0&dp_sgd_steps=5000&dp_clip_c=-1&dp_sgd_eps=0"),
    ("influence", f"{WIDEST}&steps=25&infl_solver=exact&infl_method=nonsense&infl_test=99999"),
    ("influence", "lr=100&label_noise=1.0&dataset=upload"),
]


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(k) for k in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def _kb(path: str, fields: tuple[str, ...]) -> int:
    """Sum of the named `kB` fields of a /proc status-like file (0 if the process is gone)."""
    try:
        return sum(int(line.split()[1]) for line in Path(path).read_text().splitlines()
                   if line.split(":")[0] in fields)
    except (OSError, IndexError, ValueError):
        return 0


def _before_exec(pid: int) -> bool:
    """Whether `pid` was forked and has not called exec yet (the kernel's PF_FORKNOEXEC, 0x40, in the flags field
    of /proc/pid/stat). Python's `subprocess` starts a child with `vfork`: until its exec the child runs in its
    parent's memory, and its smaps_rollup reads the parent's private pages a second time (a 426 MB process whose
    `uname -p` children were read 18,300 times showed 420 MB "private" in them; CI read a 577 MB server as 824)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return bool(int(stat[stat.rindex(")") + 2:].split()[6]) & 0x40)
    except (OSError, ValueError, IndexError):
        return False


def tree_rss_mb(pid: int) -> float:
    """Memory of `pid` and its descendants in MB (1 MB = 2**20 bytes), from /proc: the RSS of `pid`
    plus the *private* pages of each descendant that has called exec. A child's RSS would count the pages it shares
    with its parent after `fork` (copy-on-write) a second time: a short-lived `fork` + `exec` of a 520 MB
    server read as a 1,046 MB peak, memory a container's cgroup never charged; a child before its exec shares them
    all (`_before_exec`)."""
    return _tree_mb(pid, ("VmRSS",), ("Private_Clean", "Private_Dirty"))


def _tree_mb(pid: int, own: tuple[str, ...], descendants: tuple[str, ...]) -> float:
    """MB of `pid`'s status fields `own` plus the smaps_rollup fields `descendants` of every descendant that has
    called exec (`_before_exec`)."""
    total = _kb(f"/proc/{pid}/status", own)
    todo = _children(pid)
    while todo:
        q = todo.pop()
        if not _before_exec(q):
            total += _kb(f"/proc/{q}/smaps_rollup", descendants)
        todo += _children(q)
    return total / 1024


def tree_anon_mb(pid: int) -> float:
    """The part of `tree_rss_mb` a memory limit cannot reclaim: `pid`'s anonymous pages (`RssAnon`: heap, XLA's
    buffers and compiles) plus each descendant's private dirty pages. The rest of RSS is file pages (the shared
    libraries' code, ~200 MB for JAX, SciPy and the rest), which the kernel drops before it kills anything."""
    return _tree_mb(pid, ("RssAnon",), ("Private_Dirty",))


class Sampler(threading.Thread):
    """Samples the memory of a process tree every `interval` s: `.peak` is the largest `tree_rss_mb` seen (MB),
    `.peak_anon` the largest `tree_anon_mb`."""

    def __init__(self, pid: int, interval: float = 0.1):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak = self.peak_anon = 0.0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, tree_rss_mb(self.pid))
            self.peak_anon = max(self.peak_anon, tree_anon_mb(self.pid))
            time.sleep(self.interval)


def run_times(log_path: Path) -> list[tuple[str, float]]:
    """(page title, seconds) of every script run the server logged (GRADLAB_LOG_RUNS=1), in order."""
    out = []
    for line in Path(log_path).read_text().splitlines():
        if line.startswith("gradlab-run "):
            title, seconds = line[len("gradlab-run "):].rsplit(" ", 1)
            out.append((title.strip("'\""), float(seconds)))
    return out
