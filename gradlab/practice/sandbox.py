"""Run a student's code safely on a shared server: checked before it runs, then run in a separate, limited process.

Two walls, each enough for the attacks the tests try (`tests/test_practice_sandbox.py`):

1. `refusals(code)`: an AST check. Imports only from `ALLOWED_IMPORTS`; no dunder or private names or attributes
   (the attribute walks to `__subclasses__`, `__globals__`, `__builtins__`); none of the names that reach files,
   code or frames (`open`, `eval`, `exec`, `compile`, `getattr`, `np.load`, `np.ctypeslib`, `gi_frame`...).
2. `execute`: a fresh `python -I` child (no inherited environment: `env` holds only what JAX needs), in an empty
   temporary folder, under resource limits it sets on itself (`harness.py`): CPU time, file size, open files, then
   after JAX's import address space (the code's share beyond it) and processes; when the server runs as root the
   child drops to the unprivileged user `nobody` after importing JAX, before it reads student code. A wall-clock
   timeout kills its whole process group; its output is capped. The child sees restricted builtins and an import
   hook with the same allowlist.

Nothing here imports Streamlit; the page runs `execute` through the server's gate (at most a few at once).
"""

from __future__ import annotations

import ast
import atexit
import dataclasses
import json
import os
import pwd
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import subprocess
from pathlib import Path

import numpy as np

#: Modules a student may import: what the problems need (`time` for the timing problem's `perf_counter`).
ALLOWED_IMPORTS = ("jax", "jax.numpy", "jax.random", "jax.nn", "jax.lax", "jax.tree_util", "numpy", "math",
                   "functools", "time")

#: Names no student code may use: they read files, run code built from strings, or reach frames and globals.
DENIED_NAMES = frozenset({
    "open", "eval", "exec", "compile", "getattr", "setattr", "delattr", "globals", "locals", "vars", "dir",
    "breakpoint", "input", "help", "memoryview", "exit", "quit", "type", "object", "super", "classmethod",
    "staticmethod", "property", "__import__", "__builtins__", "__loader__", "__spec__",
})

#: Attributes no student code may use, on any object: files (`np.load`, `np.fromfile`, `x.tofile`), C access
#: (`np.ctypeslib`), modules that reach the system (`os`, `sys`, `np.lib`, `np.testing`, `jax.profiler`,
#: `jax.config`), string formatting that walks attributes (`"{0.__class__}".format`) and frames.
DENIED_ATTRIBUTES = frozenset({
    "load", "loads", "loadtxt", "genfromtxt", "fromfile", "fromregex", "memmap", "save", "savez", "savez_compressed",
    "savetxt", "tofile", "dump", "dumps", "DataSource", "ctypeslib", "ctypes", "lib", "testing", "f2py", "distutils",
    "os", "sys", "subprocess", "socket", "shutil", "pathlib", "io", "builtins", "importlib", "profiler", "config",
    "experimental", "extend", "tools", "distributed", "monitoring", "export", "interpreters", "dlpack",
    "format", "format_map", "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "ag_frame", "ag_code",
    "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "tb_next", "mro", "co_code", "co_consts",
    "func_globals", "func_code", "show_config", "get_include", "show_runtime",
    # more readers of files and foreign code: np.rec.fromfile, np.core.records, np.ma.mrecords.fromtextfile, jax.ffi
    "core", "rec", "records", "ma", "mrecords", "fromtextfile", "npyio", "open_memmap", "ffi", "lib_loader",
})

#: Builtins the child's namespace offers (everything else, `open` included, does not exist there).
SAFE_BUILTINS = (
    "abs", "all", "any", "bool", "callable", "chr", "dict", "divmod", "enumerate", "filter", "float", "frozenset",
    "hash", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next", "ord", "pow",
    "range", "repr", "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "zip", "complex",
    "__build_class__", "ArithmeticError", "AssertionError", "Exception", "IndexError", "KeyError", "LookupError",
    "NotImplementedError", "RuntimeError", "StopIteration", "TypeError", "ValueError", "ZeroDivisionError",
    "NameError", "ImportError", "AttributeError", "OverflowError", "FloatingPointError",
    "True", "False", "None",
)

MAX_CODE_CHARS = 20_000
_DUNDER_TEXT = re.compile(r"__\w+__")


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one run may use. Defaults fit a 2-core server shared by a room on 690 MB: the child's own memory after
    JAX's import is about 75 MB (private; the ~130 MB of JAX's libraries it maps are the server's pages too), and
    every reference solution runs with 100 MB beyond it.

    **Arguments** `memory_mb`: address space the student's code may map beyond what JAX's import mapped (RLIMIT_AS,
    set after the import: its private memory grows by at most this much); `cpu_seconds`: CPU time (RLIMIT_CPU, JAX's
    import included); `wall_seconds`: wall-clock timeout; `output_chars`: printed characters kept; `file_bytes`:
    largest file the child may write (RLIMIT_FSIZE: its reply on stdout is such a file); `open_files`:
    RLIMIT_NOFILE; `tasks`: threads and processes beyond those the user already runs (RLIMIT_NPROC).
    """

    memory_mb: int = int(os.environ.get("GRADLAB_PRACTICE_MEMORY_MB", "150"))
    cpu_seconds: int = int(os.environ.get("GRADLAB_PRACTICE_CPU_SECONDS", "20"))
    wall_seconds: float = float(os.environ.get("GRADLAB_PRACTICE_WALL_SECONDS", "30"))
    output_chars: int = 20_000
    file_bytes: int = 4 * 2**20
    open_files: int = 64
    tasks: int = 64


LIMITS = Limits()


@dataclasses.dataclass
class Outcome:
    """One run of student code.

    - `refused`: the AST check's reasons (nothing ran) · `stopped`: why the child was stopped (a limit), or None.
    - `output`: what the code printed (capped; `truncated` more characters not kept).
    - `exec_error`: `{"type", "message", "line"}` when running the code's top level failed.
    - `results`: per case, `{"leaves": [np.ndarray float64], "error": None | {...}}`.
    - `seconds`: the child's wall time; `peak_rss_mb`: its peak resident memory (MB).
    """

    refused: list[str] = dataclasses.field(default_factory=list)
    stopped: str | None = None
    output: str = ""
    truncated: int = 0
    exec_error: dict | None = None
    results: list[dict] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    peak_rss_mb: float = 0.0

    @property
    def ran(self) -> bool:
        """Whether the code ran to its end (not refused, not stopped, no error at its top level)."""
        return not self.refused and self.stopped is None and self.exec_error is None


def refusals(code: str) -> list[str]:
    """Why `code` may not run: an empty list when it passes the check.

    Refuses imports outside `ALLOWED_IMPORTS` (and relative or `*` imports), any name in `DENIED_NAMES` or dunder
    name, any attribute in `DENIED_ATTRIBUTES` or starting with `_`, any string holding a dunder name, and code
    longer than `MAX_CODE_CHARS`. A syntax error is one reason, with its line.
    """
    if len(code) > MAX_CODE_CHARS:
        return [f"the code is {len(code):,} characters long; at most {MAX_CODE_CHARS:,} are accepted"]
    try:
        tree = ast.parse(code, filename="<your code>")
    except SyntaxError as err:
        return [f"line {err.lineno}: syntax error: {err.msg}"]
    reasons = []

    def refuse(node, why):
        reasons.append(f"line {getattr(node, 'lineno', '?')}: {why}")

    allowed = ", ".join(ALLOWED_IMPORTS)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in ALLOWED_IMPORTS:
                    refuse(node, f"`import {alias.name}` is not allowed (allowed: {allowed})")
        elif isinstance(node, ast.ImportFrom):
            if node.level or node.module not in ALLOWED_IMPORTS:
                refuse(node, f"`from {'.' * node.level}{node.module or ''} import …` is not allowed (allowed: {allowed})")
            for alias in node.names:
                if alias.name == "*":
                    refuse(node, "`import *` is not allowed: import the names you use")
                elif alias.name.startswith("_") or alias.name in DENIED_ATTRIBUTES:
                    refuse(node, f"importing `{alias.name}` is not allowed")
        elif isinstance(node, ast.Name) and (node.id in DENIED_NAMES or node.id.startswith("__")):
            refuse(node, f"`{node.id}` is not available here")
        elif isinstance(node, ast.Attribute) and (node.attr.startswith("_") or node.attr in DENIED_ATTRIBUTES):
            refuse(node, f"the attribute `.{node.attr}` is not available here")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name.startswith("__"):
            refuse(node, f"the name `{node.name}` is not allowed")
        elif isinstance(node, ast.arg) and node.arg.startswith("__"):
            refuse(node, f"the name `{node.arg}` is not allowed")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DUNDER_TEXT.search(node.value):
            refuse(node, "strings holding dunder names (`__…__`) are not allowed")
        elif isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncWith, ast.AsyncFor, ast.Global, ast.Nonlocal)):
            refuse(node, f"`{type(node).__name__}` is not needed here and not allowed")
    return reasons


HARNESS = (Path(__file__).with_name("harness.py")).read_text()


def _nobody() -> tuple[int, int] | None:
    """(uid, gid) of `nobody` when this process runs as root (the child then drops to it), else None."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


#: XLA's persistent compilation cache of the sandbox children, never the server's own (the server never loads what a
#: child may have written). `fill_cache` writes it from the reference solutions, in children that keep the server's
#: user; when the server runs as root the children are `nobody` and only read it (it is the server's, mode 0755).
#: A warm Check then compiles little: 2.1 -> 1.1 s (problem 1), 9.6 -> 2.3 s (the DP-SGD step) at load 15-20.
#: As a normal user the children add what they compile (no eviction: small files). "" turns it off.
XLA_CACHE = os.environ.get("GRADLAB_PRACTICE_XLA_CACHE",
                           os.path.join(tempfile.gettempdir(), f"gradlab-practice-xla-{os.geteuid()}"))


def cache_dir() -> str | None:
    """`XLA_CACHE`, created private to this user and writable by no one else; None when off or not safely ours."""
    if not XLA_CACHE:
        return None
    os.makedirs(XLA_CACHE, mode=0o755, exist_ok=True)
    info = os.lstat(XLA_CACHE)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022 or not os.path.isdir(XLA_CACHE):
        return None  # someone else's (or writable by others): its entries could be anyone's compiled code
    return XLA_CACHE


def child_env(home: str) -> dict[str, str]:
    """The child's whole environment: only what JAX needs on a CPU (nothing inherited from the server), and the
    children's own compilation cache (every compiled program cached, however quick to compile)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "JAX_PLATFORMS": "cpu", "LANG": "C.UTF-8",
           "MALLOC_ARENA_MAX": "2",  # glibc's per-thread arenas would map ~1 GB of address space for JAX's threads
           "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    cache = cache_dir()
    if cache:
        env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return env


def _stopped(status: int, limits: Limits, timed_out: bool) -> str | None:
    """A clear sentence for a child that did not end on its own, from its wait status."""
    if timed_out:
        return (f"Stopped: your code ran longer than {limits.wall_seconds:.0f} s (wall clock). "
                "An endless loop, or far more work than this problem needs?")
    if not os.WIFSIGNALED(status):
        return None
    sig = os.WTERMSIG(status)
    if sig in (signal.SIGXCPU, signal.SIGKILL):  # the CPU limit's soft, then hard signal (memory is RLIMIT_AS's)
        return f"Stopped: your code used more than {limits.cpu_seconds} s of CPU time. An endless loop?"
    if sig == signal.SIGXFSZ:
        return "Stopped: your code tried to write more output than the limit."
    return (f"Stopped: your code went past its memory limit ({limits.memory_mb:,} MB, "
            f"signal {signal.Signals(sig).name}). Is an array far larger than the problem needs?")


@dataclasses.dataclass
class _Child:
    """A started harness process waiting for its payload on stdin, in its own empty folder."""

    proc: subprocess.Popen
    folder: str
    limits: Limits

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def discard(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(5)
        except (subprocess.TimeoutExpired, ChildProcessError):
            pass
        shutil.rmtree(self.folder, ignore_errors=True)


#: One spare child kept warm (JAX imported, waiting for code) while Practice has visitors: Check then skips JAX's
#: import (about 1 s idle, 2-3 s on a loaded machine). It holds about 75 MB of its own while it waits (JAX's
#: libraries it maps are the server's pages too), and exists only from a visitor's `prepare()` until
#: `SPARE_IDLE_SECONDS` pass without one. `GRADLAB_PRACTICE_WARM=0` turns it off.
WARM = os.environ.get("GRADLAB_PRACTICE_WARM", "1") != "0"
SPARE_IDLE_SECONDS = float(os.environ.get("GRADLAB_PRACTICE_IDLE_SECONDS", "300"))
_SPARE: list[_Child] = []
_SPARE_LOCK = threading.Lock()
_wanted_until = 0.0  # monotonic time until which a spare is kept (the last visitor's `prepare` + the idle time)
#: Held while a child runs: one at a time in this process (the gate has one slot; `fill_cache` waits its turn too),
#: and no spare starts beside a running child (their memory would add up).
_ONE_RUN = threading.Lock()
_RUNNING: list[_Child] = []  # the child running now (at most one)
_reaper: threading.Thread | None = None


def _start(limits: Limits, drop: bool = True) -> _Child:
    """Start a harness child under `limits` in a fresh empty folder (owned by `nobody` when we are root: the child
    starts as root, so it can read this Python wherever it lives, imports JAX, then drops to `nobody` for good
    before it reads any student code; `drop=False` keeps the server's user, for the server's own code only)."""
    folder = tempfile.mkdtemp(prefix="gradlab-practice-")
    user = _nobody() if drop else None
    if user:
        os.chown(folder, *user)
    config = json.dumps({"memory_bytes": limits.memory_mb * 2**20, "cpu_seconds": limits.cpu_seconds,
                         "file_bytes": limits.file_bytes, "open_files": limits.open_files, "tasks": limits.tasks,
                         "user": user, "imports": ALLOWED_IMPORTS})
    with open(os.path.join(folder, ".out"), "wb") as out, open(os.path.join(folder, ".err"), "wb") as err:
        proc = subprocess.Popen([sys.executable, "-I", "-c", HARNESS, config], cwd=folder, env=child_env(folder),
                                start_new_session=True, close_fds=True, stdin=subprocess.PIPE, stdout=out, stderr=err)
    return _Child(proc, folder, limits)


def _take(limits: Limits, drop: bool = True) -> _Child:
    """The warm spare child when it has these limits and still waits, else a freshly started one. `drop=False`:
    a fresh child that keeps the server's user (a waiting spare goes: it would hold memory beside it)."""
    with _SPARE_LOCK:
        spare = _SPARE.pop() if _SPARE else None
    if spare is not None and drop and spare.limits == limits and spare.alive:
        return spare
    if spare is not None:
        spare.discard()
    return _start(limits, drop)


def _refill(limits: Limits) -> None:
    """Start the next spare while a visitor is recent and no run is under way: its JAX import never competes with a
    run for the CPU, and a spare never waits beside a running child (their memory would add up)."""
    with _SPARE_LOCK:
        if WARM and not _SPARE and not _ONE_RUN.locked() and time.monotonic() < _wanted_until:
            _SPARE.append(_start(limits))


def _done(child: _Child, limits: Limits) -> None:
    """A run ended: discard its child, then start the next spare."""
    child.discard()
    _RUNNING.clear()
    _ONE_RUN.release()
    _refill(limits)


def prepare(limits: Limits = LIMITS) -> None:
    """A visitor is on Practice: keep a warm spare child (JAX imported) for their next run, until
    `SPARE_IDLE_SECONDS` pass without a visitor calling this again. Returns at once; nothing when `WARM` is off."""
    global _wanted_until, _reaper
    if not WARM:
        return
    with _SPARE_LOCK:
        _wanted_until = time.monotonic() + SPARE_IDLE_SECONDS
        if _reaper is None:
            _reaper = threading.Thread(target=_reap, name="practice-spare-reaper", daemon=True)
            _reaper.start()
    _refill(limits)


def _reap() -> None:
    """Discard the spare once no visitor wanted one for `SPARE_IDLE_SECONDS`; then end (`prepare` starts anew)."""
    global _reaper
    while True:
        time.sleep(max(0.05, min(30.0, _wanted_until - time.monotonic())))
        if time.monotonic() >= _wanted_until:
            _discard_spares()
            with _SPARE_LOCK:
                if time.monotonic() >= _wanted_until:  # no visitor came while the spare went
                    _reaper = None
                    return


def _discard_spares() -> None:
    with _SPARE_LOCK:
        spares = list(_SPARE)
        _SPARE.clear()
    for spare in spares:
        spare.discard()


@atexit.register
def _discard_all() -> None:
    """The server ends: its spare and the child running now (a background cache fill, say) end with it."""
    _discard_spares()
    for child in list(_RUNNING):
        child.discard()


def execute(code: str, fn: str | None = None, cases=(), *, limits: Limits = LIMITS, check: bool = True,
            max_elements: int = 100_000, as_server: bool = False) -> Outcome:
    """Run student `code` in a sandboxed child process and call its function `fn` on each case.

    **Arguments**
    - `code`: Python source; refused without running when `refusals(code)` finds anything (`check=False` skips
      the AST check: only tests of the second wall use it).
    - `fn`: the name of the function to call after the code ran (None: only run the code).
    - `cases`: a list of argument lists, each argument `{"kind": "float"|"int"|"key"|"array", "value", "dtype"}`
      (JSON; a "key" is `jax.random.PRNGKey(value)` built in the child).
    - `limits`: `Limits`; `max_elements`: the most numbers one returned leaf may hold.
    - `as_server`: the child keeps the server's user (no drop to `nobody`), so it may write the children's compilation
      cache: for the server's own code only (`fill_cache` runs the reference solutions so).

    **Returns** an `Outcome` (never raises for anything the student's code does). Runs one child at a time.
    """
    reasons = refusals(code) if check else []
    if reasons:
        return Outcome(refused=reasons)
    payload = json.dumps({"code": code, "fn": fn, "cases": list(cases), "output_chars": limits.output_chars,
                          "allowed_imports": ALLOWED_IMPORTS, "builtins": SAFE_BUILTINS,
                          "max_elements": max_elements}).encode()
    _ONE_RUN.acquire()
    try:
        child = _take(limits, drop=not as_server)
        _RUNNING.append(child)
    except BaseException:
        _ONE_RUN.release()
        raise
    try:
        started = time.perf_counter()
        try:
            child.proc.stdin.write(payload)
            child.proc.stdin.close()
        except OSError:
            pass  # it died waiting: its status says why
        status, usage, timed_out = _wait(child.proc, limits.wall_seconds)
        seconds = time.perf_counter() - started
        peak_mb = usage.ru_maxrss / 1024 if usage is not None else 0.0
        outcome = Outcome(seconds=seconds, peak_rss_mb=peak_mb, stopped=_stopped(status, limits, timed_out))
        with open(os.path.join(child.folder, ".out"), "rb") as f:
            reply = _parse(f.read(limits.file_bytes))
        if reply is None:
            if outcome.stopped is None:
                with open(os.path.join(child.folder, ".err"), "rb") as f:
                    tail = f.read()[-600:].decode(errors="replace").strip()
                outcome.stopped = ("Stopped: the process running your code ended without an answer "
                                   f"(exit status {os.WEXITSTATUS(status) if os.WIFEXITED(status) else status}). {tail}")
            return outcome
        outcome.output, outcome.truncated, outcome.exec_error = reply["output"], reply["truncated"], reply["exec_error"]
        outcome.results = [{"leaves": None if r["leaves"] is None else [_array(leaf) for leaf in r["leaves"]],
                            "error": r["error"]} for r in reply["results"]]
        if outcome.exec_error and _out_of_memory(outcome.exec_error):
            outcome.stopped = (f"Stopped: your code went past its memory limit ({limits.memory_mb:,} MB). Is an "
                               "array far larger than the problem needs?")
        return outcome
    finally:
        _done(child, limits)


def _wait(proc: subprocess.Popen, wall_seconds: float):
    """Wait for `proc` up to `wall_seconds`, then kill its process group. Returns (status, rusage, timed_out)."""
    deadline = time.monotonic() + wall_seconds
    timed_out = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = status  # reaped here: Popen must not wait for it again
            break
        if time.monotonic() > deadline:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = status
            break
        time.sleep(0.02)
    try:  # anything the child left behind in its group (it cannot fork without `os`, but belt and braces)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return status, usage, timed_out


def _out_of_memory(error: dict) -> bool:
    return error["type"] == "MemoryError" or "RESOURCE_EXHAUSTED" in error["message"]


def _parse(raw: bytes) -> dict | None:
    try:
        reply = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    return reply if isinstance(reply, dict) and "results" in reply else None


def _array(leaf: dict) -> np.ndarray:
    return np.asarray(leaf["data"], dtype=np.float64).reshape(leaf["shape"])
