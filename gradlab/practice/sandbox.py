"""Run a student's code on a shared server: a language wall, an OS wall, and channels the server owns.

1. **The language wall** (`refusals`, then the child): RestrictedPython compiles the code with guarded attribute
   access, item access, iteration and writes; the child's `_getattr_` refuses `_` names, the attributes that read
   files or reach C (`DENIED_ATTRIBUTES`), any module outside `ALLOWED_IMPORTS` as a value however it was reached,
   frames, code objects and tracebacks. Imports only from `ALLOWED_IMPORTS`; a few builtins. `refusals` gives the
   friendly message for the common mistakes before anything runs. It is a lint with teeth, never the only wall.
2. **The OS wall** (`os_wall`): each run in a fresh bubblewrap sandbox (new PID, network, IPC, UTS and mount
   namespaces, and a user namespace or, under root, the uid `nobody`: `_bwrap_args`; the interpreter and its
   packages read-only and nothing else of the machine: no home, no store, no `.streamlit`, no other process's
   `/proc`; the root, `/dev` and a private `/tmp` read-only), ended as a whole: the sandbox's PID 1 dies with the
   server's handle on it, and the kernel ends every process in its namespace. Inside, the child sets its limits
   (CPU time, file size, open files, address space after JAX's import, the idle CPU class) and a seccomp filter
   (no process, executable, socket, ptrace, signal outside itself, namespace or mount).
3. **Channels the server owns**: the payload in on stdin, the reply out on a pipe (never a path in a folder the
   child can write), printed text and errors on a third, each read with a cap; the reply is schema-checked and a
   malformed or oversized one is a failed run with a clear message. `execute` never raises for the student's code.

Where the OS wall cannot be set up (no bubblewrap, no user namespaces, no libseccomp), `os_wall()` says why and
`mode()` decides: a shared server runs no free-form code; a server bound to localhost runs it with the language
wall and the limits, and says so. Nothing here imports Streamlit; the page runs `execute` through Practice's own
gate slot.
"""

from __future__ import annotations

import ast
import atexit
import concurrent.futures
import dataclasses
import functools
import json
import math
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from RestrictedPython import compile_restricted_exec

#: Modules a student may import, and the only modules student code may hold as a value.
ALLOWED_IMPORTS = ("jax", "jax.numpy", "jax.random", "jax.nn", "jax.lax", "jax.tree_util", "jax.numpy.linalg",
                   "numpy", "numpy.linalg", "numpy.random", "math", "functools", "time")
#: Modules whose attributes are an allowlist (the rest of their names: `update_wrapper` writes attributes,
#: `time.thread_time` and friends are harmless but no problem needs them).
MODULE_ATTRIBUTES = {"functools": ("partial", "reduce", "lru_cache", "cache"),
                     "time": ("perf_counter", "perf_counter_ns", "time", "monotonic", "sleep"),
                     # register_dataclass(cls, data_fields=[...]) reads any attribute of any class: never offered
                     "jax.tree_util": ("tree_map", "tree_leaves", "tree_flatten", "tree_unflatten", "tree_structure",
                                       "tree_reduce", "tree_all", "Partial")}

#: Names no student code may use: they read files, run code built from strings, or reach frames and globals.
DENIED_NAMES = frozenset({
    "open", "eval", "exec", "compile", "getattr", "setattr", "delattr", "globals", "locals", "vars", "dir",
    "breakpoint", "input", "help", "memoryview", "exit", "quit", "type", "object", "super", "classmethod",
    "staticmethod", "property", "__import__", "__builtins__", "__loader__", "__spec__",
})

#: Attributes no student code may use, on any object: files (`np.load`, `np.fromfile`, `x.tofile`), C access
#: (`np.ctypeslib`, a generator's `ctypes`/`cffi`), modules that reach the system, string formatting that walks
#: attributes (`"{0.__class__}".format`) and frames. Checked in the code (a friendly message) and at run time.
DENIED_ATTRIBUTES = frozenset({
    "load", "loads", "loadtxt", "genfromtxt", "fromfile", "fromregex", "memmap", "save", "savez", "savez_compressed",
    "savetxt", "tofile", "dump", "dumps", "DataSource", "ctypeslib", "ctypes", "cffi", "lib", "testing", "f2py",
    "distutils", "os", "sys", "subprocess", "socket", "shutil", "pathlib", "io", "builtins", "importlib", "profiler",
    "config", "experimental", "extend", "tools", "distributed", "monitoring", "export", "interpreters", "dlpack",
    "format", "format_map", "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "ag_frame", "ag_code",
    "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "tb_next", "mro", "co_code", "co_consts",
    "func_globals", "func_code", "show_config", "get_include", "show_runtime",
    # more readers of files and foreign code: np.rec.fromfile, np.core.records, np.ma.mrecords.fromtextfile, jax.ffi
    "core", "rec", "records", "ma", "mrecords", "fromtextfile", "npyio", "open_memmap", "ffi", "lib_loader",
    # the XLA client behind a device, and callbacks into Python from compiled code
    "client", "pure_callback", "io_callback", "debug", "callback",
    # a jaxpr's source information holds real tracebacks, frames and code objects; NumPy's type list holds memoryview
    "source_info", "traceback", "raw_frames", "as_python_traceback", "get_traceback", "frames", "ScalarType",
    "register_dataclass", "register_pytree_node", "register_pytree_with_keys", "register_static",
})

#: Builtins the child's namespace offers (everything else, `open` included, does not exist there).
SAFE_BUILTINS = (
    "abs", "all", "any", "bool", "callable", "chr", "dict", "divmod", "enumerate", "filter", "float", "frozenset",
    "hash", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next", "ord", "pow",
    "range", "repr", "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "zip", "complex",
    "ArithmeticError", "AssertionError", "Exception", "IndexError", "KeyError", "LookupError",
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
    set after the import: its private memory grows by at most this much; with no process of its own, the run's
    whole tree); `cpu_seconds`: CPU time (RLIMIT_CPU, JAX's import included); `wall_seconds`: wall-clock timeout;
    `output_chars`: printed characters kept; `file_bytes`: largest file the child may write (RLIMIT_FSIZE);
    `tmp_mb`: the sandbox's private `/tmp` (all its files together); `open_files`: RLIMIT_NOFILE; `tasks`: processes
    beyond the user's, only where no seccomp filter refuses every new process (RLIMIT_NPROC); `priority`: "idle"
    (Linux's idle scheduling class: the run gets only CPU nothing else wants, so it never slows a page's
    computation; a run starved past its wall clock is told so) or a nice value ("10": a share of the CPU when
    contended; the test suite's setting, where two workers keep both cores busy).
    """

    memory_mb: int = int(os.environ.get("GRADLAB_PRACTICE_MEMORY_MB", "150"))
    cpu_seconds: int = int(os.environ.get("GRADLAB_PRACTICE_CPU_SECONDS", "20"))
    wall_seconds: float = float(os.environ.get("GRADLAB_PRACTICE_WALL_SECONDS", "30"))
    output_chars: int = 20_000
    file_bytes: int = 4 * 2**20
    tmp_mb: int = 64
    open_files: int = 64
    tasks: int = 64
    priority: str = os.environ.get("GRADLAB_PRACTICE_PRIORITY", "idle")


LIMITS = Limits()
#: The reply's size cap before it is parsed (a run's own is smaller: `_reply_bytes`), the log's, and how long the
#: server waits for the channels after the child ended.
REPLY_BYTES = 16 * 2**20
LOG_BYTES = 64 * 2**10
DRAIN_SECONDS = 2.0


@dataclasses.dataclass
class Outcome:
    """One run of student code.

    - `refused`: the language wall's reasons (nothing ran) · `stopped`: why the child was stopped (a limit, a
      malformed reply), or None.
    - `output`: what the code printed (capped; `truncated` more characters not kept).
    - `exec_error`: `{"type", "message", "line"}` when running the code's top level failed.
    - `results`: per case, `{"leaves": [np.ndarray float64], "error": None | {...}}`.
    - `seconds`: the run's wall time measured by the server; `peak_rss_mb`: the child's peak resident memory (MB).
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


# ---------------------------------------------------------------- the language wall, server side

def refusals(code: str) -> list[str]:
    """Why `code` may not run: an empty list when it passes the language wall's static part.

    Refuses imports outside `ALLOWED_IMPORTS` (and relative or `*` imports), any name in `DENIED_NAMES`, any
    attribute in `DENIED_ATTRIBUTES`, strings holding dunder names, class definitions, `match` statements and
    whatever RestrictedPython refuses (names and attributes starting with `_`, frame attributes...), and code longer
    than `MAX_CODE_CHARS`. A syntax error is one reason, with its line. Each reason starts with "line N:".
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
                elif alias.name.startswith("_") or alias.name in DENIED_ATTRIBUTES or alias.name not in (
                        MODULE_ATTRIBUTES.get(node.module or "", (alias.name,))):
                    refuse(node, f"importing `{alias.name}` is not allowed")
        elif isinstance(node, ast.Name) and (node.id in DENIED_NAMES or node.id.startswith("__")):
            refuse(node, f"`{node.id}` is not available here")
        elif isinstance(node, ast.Attribute) and (node.attr.startswith("_") or node.attr in DENIED_ATTRIBUTES):
            refuse(node, f"the attribute `.{node.attr}` is not available here")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("__"):
            refuse(node, f"the name `{node.name}` is not allowed")
        elif isinstance(node, ast.arg) and node.arg.startswith("__"):
            refuse(node, f"the name `{node.arg}` is not allowed")
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and _DUNDER_TEXT.search(
                node.value if isinstance(node.value, str) else node.value.decode("latin-1")):
            refuse(node, "strings holding dunder names (`__…__`) are not allowed")
        elif isinstance(node, ast.ClassDef):
            refuse(node, "classes are not needed here and not allowed: write functions")
        elif isinstance(node, ast.Match):
            refuse(node, "`match` statements are not needed here and not allowed: use `if`")
        elif isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncWith, ast.AsyncFor, ast.Global, ast.Nonlocal)):
            refuse(node, f"`{type(node).__name__}` is not needed here and not allowed")
    if not reasons:  # RestrictedPython's own refusals, for what the checks above do not name
        result = compile_restricted_exec(code, filename="<your code>")
        reasons += [re.sub(r"^Line (\d+): ", r"line \1: ", e) for e in result.errors]
    return reasons


# ---------------------------------------------------------------- the OS wall

def _nobody() -> tuple[int, int] | None:
    """(uid, gid) of `nobody` when this process runs as root (the child then runs as it), else None."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def _read_only_roots() -> list[str]:
    """What the sandbox sees of the machine, read-only: the system's libraries and this interpreter with its
    packages (its prefix, its base prefix, their real paths), never the project, the home or the store."""
    paths = {"/usr", "/etc/ld.so.cache", "/etc/alternatives"}
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
              *sysconfig.get_paths().values()):
        for q in (p, os.path.realpath(p)):
            if os.path.exists(q):
                paths.add(q)
    roots = []
    for p in sorted(paths, key=len):  # a folder inside one already bound comes with it
        if not any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots):
            roots.append(p)
    return roots


#: Where the children's compilation cache appears inside a sandbox.
CACHE_INSIDE = "/xla-cache"


def _bwrap_args(limits: Limits, cache: str | None, write_cache: bool) -> list[str]:
    """bubblewrap's command line for one run (before the interpreter's).

    As an ordinary user (Community Cloud), a new user namespace maps the sandbox's uid to the server's. As root,
    a user namespace would map it to root outside, whose uid still opens root's files and global sysctls; so there
    bubblewrap keeps the server's user namespace, drops every capability but the two the child needs to become
    `nobody` (after JAX's import, before it reads any student code; `harness.py`), and the child runs as `nobody`
    outside too. Either way: new PID, network, IPC, UTS and mount namespaces, no new user namespace inside (seccomp
    refuses `unshare` and process-creating `clone`s), and `/proc/sys` read-only. The child is the sandbox's PID 1
    (`--as-pid-1`: no init of bubblewrap's inside, unfiltered and of the same user, whose memory a child could write
    through `/proc/1/mem`: found by a red team), and nothing inside is writable: `/dev`, `/tmp` and the root are
    read-only (a tmpfs caps bytes but not files, and 250,000 empty files took 290 MB of the machine's memory)."""
    args = [shutil.which("bwrap") or "bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--as-pid-1"]
    if os.geteuid() == 0:
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534"]
    # /tmp first: the interpreter may live under it (a clone in /tmp with its venv), and a bind goes on top of it
    args += ["--size", str(limits.tmp_mb * 2**20), "--tmpfs", "/tmp"]
    for root in _read_only_roots():
        args += ["--ro-bind", root, root]
    for name in ("lib", "lib64", "bin", "sbin"):
        if os.path.islink(f"/{name}"):
            args += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
        elif os.path.isdir(f"/{name}"):
            args += ["--ro-bind", f"/{name}", f"/{name}"]
    args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev", "--remount-ro", "/dev",
             "--remount-ro", "/tmp"]
    if cache:
        args += ["--bind" if write_cache else "--ro-bind", cache, CACHE_INSIDE]
    return args + ["--remount-ro", "/", "--chdir", "/tmp"]


@functools.cache
def os_wall() -> str | None:
    """Why the OS wall cannot be set up here (None: it can). Tries it once: a sandbox with every namespace that
    imports the seccomp bindings and loads a filter. Cached for the process."""
    if os.environ.get("GRADLAB_PRACTICE_OS_WALL", "auto").strip().lower() in ("off", "0", "no", "false"):
        return "the OS sandbox is turned off (GRADLAB_PRACTICE_OS_WALL=off)"
    if not sys.platform.startswith("linux"):
        return f"the OS sandbox needs Linux (this is {sys.platform})"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian: `apt-get install bubblewrap`; Community Cloud: packages.txt)"
    probe = ("import pyseccomp as s\nf = s.SyscallFilter(s.ALLOW)\nf.add_rule(s.ERRNO(1), 'socket')\nf.load()\n"
             "import socket\ntry:\n    socket.socket()\nexcept PermissionError:\n    print('ok')\n")
    try:
        done = subprocess.run([*_bwrap_args(LIMITS, None, False), sys.executable, "-I", "-c", probe],
                              capture_output=True, text=True, timeout=60, env=_env(None))
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bubblewrap could not start ({err})"
    if done.stdout.strip() != "ok":
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"bubblewrap could not set up the sandbox here ({why[:300]})"
    return None


@dataclasses.dataclass(frozen=True)
class Mode:
    """What Practice may do on this server: `runs_code` (free-form code at all), `os_wall` (each run in the OS
    sandbox) and `message` (what the page says; empty when the OS wall holds)."""

    runs_code: bool
    os_wall: bool
    message: str


def mode(local: bool) -> Mode:
    """Practice's mode for a server bound to localhost only (`local`, a single user) or not (a shared server).

    With the OS wall: free-form code runs, each run in its sandbox. Without it, a shared server runs none (the
    page keeps the "choose the cause" questions and offers each problem as a file to run locally), and a local one
    runs code behind the language wall and the limits, saying so. `GRADLAB_PRACTICE_LOCAL=1` declares a server
    local whatever its address (a laptop reached through a tunnel, say)."""
    why = os_wall()
    if why is None:
        return Mode(True, True, "")
    if local or os.environ.get("GRADLAB_PRACTICE_LOCAL", "").strip().lower() in ("1", "yes", "true", "on"):
        return Mode(True, False, f"Your code runs on this machine behind Practice's language wall and limits, not in "
                                 f"an OS sandbox: {why}. Fine for your own laptop; never share this server's link.")
    return Mode(False, False, f"This shared server runs no free-form code: {why}. Download the problem as a file and "
                              "run it on your own machine, or answer the questions below.")


# ---------------------------------------------------------------- the children's compilation cache

#: XLA's persistent compilation cache of the sandbox children, never the server's own (the server never loads what a
#: child may have written). `fill_cache` writes it from the reference solutions, in a sandbox where it is bound
#: writable; a student's run sees it read-only, so their programs never persist. "" turns it off.
#: A warm Check then compiles little: 2.1 -> 1.1 s (problem 1), 9.6 -> 2.3 s (the DP-SGD step) at load 15-20.
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


def _env(cache: str | None) -> dict[str, str]:
    """The child's whole environment: only what JAX needs on a CPU (nothing inherited from the server), and the
    children's compilation cache at `cache` (every compiled program cached, however quick to compile)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "JAX_PLATFORMS": "cpu", "LANG": "C.UTF-8",
           "MALLOC_ARENA_MAX": "2",  # glibc's per-thread arenas would map ~1 GB of address space for JAX's threads
           "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    if cache:
        env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return env


def child_env(home: str) -> dict[str, str]:
    """The child's whole environment (`home`: its folder where no OS sandbox gives it a private `/tmp`), with the
    children's compilation cache where the child finds it."""
    cache = cache_dir()
    env = _env(CACHE_INSIDE if cache and os_wall() is None else cache)
    if os_wall() is not None:
        env.update(HOME=home, TMPDIR=home)
    return env


# ---------------------------------------------------------------- the child: started, fed, drained, ended

class _Drain(threading.Thread):
    """Reads a pipe (a raw file descriptor) to its end or to `cap` bytes, whichever comes first, then closes it: a
    child writing past the cap gets EPIPE, not a server thread reading and discarding for it. `overflow` is true
    when the cap was reached."""

    def __init__(self, fd: int, cap: int):
        super().__init__(daemon=True, name="practice-drain")
        self.fd, self.cap, self.data, self.overflow = fd, cap, bytearray(), False
        self.start()

    def run(self) -> None:
        try:
            while chunk := os.read(self.fd, min(65536, self.cap + 1 - len(self.data))):
                self.data += chunk
                if len(self.data) > self.cap:
                    del self.data[self.cap:]
                    self.overflow = True
                    break
        except OSError:
            pass
        finally:
            os.close(self.fd)


@dataclasses.dataclass
class _Child:
    """A started harness process waiting for its payload on stdin; its reply and log pipes drained as they come."""

    proc: subprocess.Popen
    folder: str | None  # its working folder where no OS sandbox gives it a private /tmp
    limits: Limits
    reply: _Drain
    log: _Drain

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def discard(self) -> None:
        """End it and everything in its sandbox (its namespace ends with bubblewrap), and its folder."""
        _kill(self.proc)
        try:
            self.proc.wait(5)
        except (subprocess.TimeoutExpired, ChildProcessError):
            pass
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL to `proc`'s whole tree (the sandbox's PID 1 among it: its namespace ends with it) and its group.
    Nothing once `proc` is reaped: its pid may already be another process's (pid_max is 32,768 here), and with no
    process of its own (seccomp) nothing of the run outlives its sandbox's PID 1."""
    if proc.returncode is not None:
        return
    for pid in [*_descendants(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _processes() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, CPU clock ticks)} of every process /proc shows."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            found[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _descendants(root: int, table: dict[int, tuple[int, int]] | None = None) -> list[int]:
    table = _processes() if table is None else table
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        children = [child for child, (parent, _) in table.items() if parent == pid]
        found += children
        todo += children
    return found


#: One spare child kept warm (JAX imported, waiting for code) while Practice has visitors: Check then skips JAX's
#: import (about 1 s idle, 2-3 s on a loaded machine). It holds about 75 MB of its own while it waits (JAX's
#: libraries it maps are the server's pages too), and exists only from a visitor's `prepare()` until
#: `SPARE_IDLE_SECONDS` pass without one. `GRADLAB_PRACTICE_WARM=0` turns it off.
WARM = os.environ.get("GRADLAB_PRACTICE_WARM", "1") != "0"
SPARE_IDLE_SECONDS = float(os.environ.get("GRADLAB_PRACTICE_IDLE_SECONDS", "300"))
_SPARE: list[_Child] = []
_SPARE_LOCK = threading.Lock()
_wanted_until = 0.0  # monotonic time until which a spare is kept (the last visitor's `prepare` + the idle time)
#: Held while a child runs: one at a time in this process (Practice's gate has one slot; `fill_cache` waits its turn
#: too), and no spare starts beside a running child (their memory would add up).
_ONE_RUN = threading.Lock()
_RUNNING: list[_Child] = []  # the child running now (at most one)
_reaper: threading.Thread | None = None


#: The one thread that starts children. bubblewrap's `--die-with-parent` ends the sandbox when the *thread* that
#: started it ends (the kernel's parent-death signal follows the thread), and Streamlit runs each script run in a
#: thread of its own: a spare started by a visit would die when that run's thread did.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="practice-spawner")


def _start(limits: Limits, as_server: bool = False) -> _Child:
    """`_spawn` in the spawner thread (see `_SPAWNER`)."""
    return _SPAWNER.submit(_spawn, limits, as_server).result()


def _spawn(limits: Limits, as_server: bool = False) -> _Child:
    """Start a harness child under `limits`, waiting for its payload: in a fresh bubblewrap sandbox where the OS
    wall holds, else as a plain process in a fresh empty folder; either way dropping to `nobody` after JAX's import
    when we are root. `as_server`: the server's own code (the reference solutions), which may write the children's
    cache and keeps the server's user."""
    cache, wall = cache_dir(), os_wall() is None
    reply_r, reply_w = os.pipe()
    config = {"memory_bytes": limits.memory_mb * 2**20, "cpu_seconds": limits.cpu_seconds,
              "file_bytes": limits.file_bytes, "open_files": limits.open_files, "tasks": limits.tasks,
              "priority": limits.priority,
              "imports": ALLOWED_IMPORTS, "reply_fd": reply_w, "seccomp": _seccomp_available(),
              "user": None if as_server else _nobody(), "server": os.getpid()}  # whose child it is, in its argv
    folder = None
    if wall:
        prefix, cwd = _bwrap_args(limits, cache, write_cache=as_server), "/"
    else:
        folder = cwd = tempfile.mkdtemp(prefix="gradlab-practice-")
        if config["user"]:
            os.chown(folder, *config["user"])
        prefix = []
    log_r, log_w = os.pipe()
    try:
        proc = subprocess.Popen([*prefix, sys.executable, "-I", "-c", HARNESS, json.dumps(config)], cwd=cwd,
                                env=child_env(folder or "/tmp"), start_new_session=True, pass_fds=(reply_w,),
                                stdin=subprocess.PIPE, stdout=log_w, stderr=log_w)
    finally:
        os.close(reply_w)  # the child holds the only write ends: the pipes end when its sandbox does
        os.close(log_w)
    return _Child(proc, folder, limits, _Drain(reply_r, REPLY_BYTES), _Drain(log_r, LOG_BYTES))


@functools.cache
def _seccomp_available() -> bool:
    """Whether the child can load a seccomp filter (pyseccomp and libseccomp, on Linux)."""
    try:
        import pyseccomp  # noqa: F401 - only the child uses it; here, whether it loads

        return sys.platform.startswith("linux")
    except (ImportError, OSError, RuntimeError):
        return False


HARNESS = (Path(__file__).with_name("harness.py")).read_text()


def _take(limits: Limits, as_server: bool = False) -> _Child:
    """The warm spare child when it has these limits and still waits, else a freshly started one. `as_server`: a
    fresh child for the server's own code (a waiting spare goes: it would hold memory beside it)."""
    with _SPARE_LOCK:
        spare = _SPARE.pop() if _SPARE else None
    if spare is not None and not as_server and spare.limits == limits and spare.alive:
        return spare
    if spare is not None:
        spare.discard()
    return _start(limits, as_server)


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
            max_elements: int = 100_000, as_server: bool = False, language_wall: bool = True) -> Outcome:
    """Run student `code` in a sandboxed child process and call its function `fn` on each case.

    **Arguments**
    - `code`: Python source; refused without running when `refusals(code)` finds anything (`check=False` skips
      that static check; the child's guards still hold).
    - `fn`: the name of the function to call after the code ran (None: only run the code).
    - `cases`: a list of argument lists, each argument `{"kind": "float"|"int"|"key"|"array", "value", "dtype"}`
      (JSON; a "key" is `jax.random.PRNGKey(value)` built in the child).
    - `limits`: `Limits`; `max_elements`: the most numbers one returned leaf may hold.
    - `as_server`: the server's own code (`fill_cache` runs the reference solutions so): the children's
      compilation cache is writable in its sandbox.
    - `language_wall=False`: run the code with the plain interpreter's builtins, as if the language wall had fallen
      (tests of the OS wall only).

    **Returns** an `Outcome`; never raises for anything the student's code does (a malformed or oversized reply is
    a stopped run). Runs one child at a time.
    """
    reasons = refusals(code) if check else []
    if reasons:
        return Outcome(refused=reasons)
    payload = json.dumps({"code": code, "fn": fn, "cases": list(cases), "output_chars": limits.output_chars,
                          "allowed_imports": ALLOWED_IMPORTS, "builtins": SAFE_BUILTINS,
                          "module_attributes": MODULE_ATTRIBUTES, "denied_attributes": sorted(DENIED_ATTRIBUTES),
                          "max_elements": max_elements, "language_wall": language_wall}).encode()
    _ONE_RUN.acquire()
    try:
        child = _take(limits, as_server)
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
        status, usage, timed_out, cpu = _wait(child.proc, limits.wall_seconds)
        for drain in (child.reply, child.log):  # the server's deadline: a channel still open is cut off
            drain.join(DRAIN_SECONDS)
        outcome = Outcome(seconds=time.perf_counter() - started, peak_rss_mb=usage.ru_maxrss / 1024 if usage else 0.0,
                          stopped=_stopped(status, limits, timed_out, cpu))
        reply, problem = _parse(bytes(child.reply.data), child.reply.overflow, len(cases), max_elements)
        if reply is None:
            if outcome.stopped is None:
                tail = bytes(child.log.data)[-600:].decode(errors="replace").strip()
                exit_text = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
                outcome.stopped = (f"Stopped: the process running your code {problem or 'ended without an answer'} "
                                   f"(exit status {exit_text}). {tail}").strip()
            return outcome
        # the child's caps are not trusted: the server cuts what it keeps again
        outcome.output = reply["output"][:limits.output_chars]
        outcome.truncated = max(0, reply["truncated"]) + len(reply["output"]) - len(outcome.output)
        outcome.exec_error = _error(reply["exec_error"])
        outcome.results = [{"leaves": None if r["leaves"] is None else [_array(leaf) for leaf in r["leaves"]],
                            "error": _error(r["error"])} for r in reply["results"]]
        if outcome.exec_error and _out_of_memory(outcome.exec_error):
            outcome.stopped = (f"Stopped: your code went past its memory limit ({limits.memory_mb:,} MB). Is an "
                               "array far larger than the problem needs?")
        return outcome
    finally:
        _done(child, limits)


def _stopped(status: int, limits: Limits, timed_out: bool, cpu_seconds: float = 0.0) -> str | None:
    """A clear sentence for a child that did not end on its own, from its wait status (and, for a run stopped by
    the wall clock, the CPU seconds it got: a run that got little was starved by a busy server, not endless)."""
    busy = os.getloadavg()[0] >= (os.cpu_count() or 1)
    if timed_out and cpu_seconds < limits.wall_seconds / 4 and limits.priority == "idle" and busy:
        return (f"Stopped: the server was busy with other computations, and your code got only {cpu_seconds:.1f} s "
                f"of CPU in its {limits.wall_seconds:.0f} s. Press again in a moment.")
    if timed_out:
        return (f"Stopped: your code ran longer than {limits.wall_seconds:.0f} s (wall clock). "
                "An endless loop, or far more work than this problem needs?")
    code = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if code is None and os.WIFEXITED(status) and os.WEXITSTATUS(status) > 128:  # bubblewrap reports its child's
        code = os.WEXITSTATUS(status) - 128                                      # signal as 128 + the signal
    if code is None:
        return None
    if code in (signal.SIGXCPU, signal.SIGKILL):  # the CPU limit's soft, then hard signal (memory is RLIMIT_AS's)
        return f"Stopped: your code used more than {limits.cpu_seconds} s of CPU time. An endless loop?"
    if code == signal.SIGXFSZ:
        return "Stopped: your code tried to write more output than the limit."
    name = signal.Signals(code).name if code in signal.Signals._value2member_map_ else str(code)
    return (f"Stopped: your code went past its memory limit ({limits.memory_mb:,} MB, "
            f"signal {name}). Is an array far larger than the problem needs?")


def _wait(proc: subprocess.Popen, wall_seconds: float):
    """Wait for `proc` up to `wall_seconds`, then kill it (its sandbox ends with it). Returns (status, rusage,
    timed_out, CPU seconds of its tree when it was killed: a killed child's own time never reaches bubblewrap's
    rusage)."""
    deadline = time.monotonic() + wall_seconds
    timed_out, cpu = False, 0.0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            timed_out, cpu = True, _tree_cpu_seconds(proc.pid)
            _kill(proc)
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.02)
    proc.returncode = status  # reaped here: Popen must not wait for it again (nor `_kill` signal its old pid)
    return status, usage, timed_out, cpu


def _tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of `root` and its descendants now (from /proc; 0 where it cannot be read)."""
    table = _processes()
    ticks = sum(table.get(pid, (0, 0))[1] for pid in [root, *_descendants(root, table)])
    return ticks / os.sysconf("SC_CLK_TCK")


def _out_of_memory(error: dict) -> bool:
    return error["type"] == "MemoryError" or "RESOURCE_EXHAUSTED" in error["message"]


def _parse(raw: bytes, overflow: bool, cases: int, max_elements: int = 100_000) -> tuple[dict | None, str | None]:
    """The child's reply, schema-checked: (reply, None), or (None, what is wrong with it)."""
    if overflow or len(raw) > _reply_bytes(cases, max_elements):
        return None, f"sent back an answer over {_reply_bytes(cases, max_elements) / 2**20:.1f} MB"
    if not raw:
        return None, None
    try:
        reply = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, "sent back an answer that is not valid JSON"
    return (reply, None) if _valid(reply, cases, max_elements) else (None, "sent back an answer of the wrong form")


def _reply_bytes(cases: int, max_elements: int) -> int:
    """The largest reply a run may send: every case's numbers (up to 26 characters each in JSON), the printed text
    (up to 6 bytes a character, escaped) and 64 KB for the rest; never over `REPLY_BYTES`."""
    return min(REPLY_BYTES, 26 * max_elements * max(1, cases) + 6 * LIMITS.output_chars + 2**16)


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,99}")


def _error(e: dict | None) -> dict | None:
    """An error the child reported, as the server keeps it: a type that is a name (else "Error"), the message cut
    at 3,000 characters."""
    if e is None:
        return None
    kind = e["type"] if _IDENTIFIER.fullmatch(e["type"]) else "Error"
    return {"type": kind, "message": e["message"][:3000], "line": e["line"]}


def _valid_error(e) -> bool:
    return e is None or (isinstance(e, dict) and set(e) == {"type", "message", "line"} and isinstance(e["type"], str)
                         and isinstance(e["message"], str) and (e["line"] is None or type(e["line"]) is int))


def _valid_leaf(leaf, max_elements: int) -> bool:
    if not (isinstance(leaf, dict) and set(leaf) == {"shape", "data"} and isinstance(leaf["shape"], list)
            and isinstance(leaf["data"], list) and len(leaf["shape"]) <= 8):
        return False
    if not all(type(n) is int and 0 <= n <= max_elements for n in leaf["shape"]):
        return False
    if math.prod(leaf["shape"]) > max_elements or len(leaf["data"]) != math.prod(leaf["shape"]):
        return False
    return all(type(x) is float or (type(x) is int and abs(x) < 2**63) for x in leaf["data"])


def _valid(reply, cases: int, max_elements: int) -> bool:
    """`{"output": str, "truncated": int, "exec_error": error|None, "results": [{"leaves": [leaf]|None, "error":
    error|None}]}` with at most one result per case, at most 64 leaves each, each leaf's data as long as its
    shape's product (at most `max_elements`), every number a float or an int of at most 64 bits."""
    if not (isinstance(reply, dict) and set(reply) == {"output", "truncated", "exec_error", "results"}):
        return False
    if not (isinstance(reply["output"], str) and type(reply["truncated"]) is int and _valid_error(reply["exec_error"])
            and isinstance(reply["results"], list) and len(reply["results"]) <= cases):
        return False
    for r in reply["results"]:
        if not (isinstance(r, dict) and set(r) == {"leaves", "error"} and _valid_error(r["error"])):
            return False
        if r["leaves"] is not None and not (isinstance(r["leaves"], list) and len(r["leaves"]) <= 64 and all(
                _valid_leaf(leaf, max_elements) for leaf in r["leaves"])):
            return False
    return True


def _array(leaf: dict) -> np.ndarray:
    return np.asarray(leaf["data"], dtype=np.float64).reshape(leaf["shape"])
