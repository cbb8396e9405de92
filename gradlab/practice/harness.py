"""The program the sandbox's child process runs (`python -I -c <this file's text>`); never imported by the server.

It sets its own resource limits (argv[1], JSON) before anything else (so the student's code runs under them, and
cannot raise them: soft = hard), imports JAX and every module a student may import, drops for good to the
unprivileged user named in argv[1] when started as root (then sets RLIMIT_NPROC, which binds only users that are not
root), then reads one JSON payload on stdin (`code`, `fn`, `cases`, `output_chars`...): a spare child waits there,
warm, until a run needs it. It executes the student's code with restricted builtins and an import allowlist (the
second wall behind the AST check in `sandbox.refusals`), calls `fn` on every case and writes one JSON line to fd 1:
`{"output", "truncated", "exec_error", "results": [{"leaves": [{"shape", "data"}], "error"}], "seconds"}`.
Standard library only, besides JAX and NumPy: the child cannot import gradlab.
"""

import json
import os
import resource
import sys
import time
import traceback

limits = json.loads(sys.argv[1])  # CPU, files and output set before JAX is imported; memory and processes after


def _tasks_of(uid):
    """Threads and processes this user runs now (RLIMIT_NPROC counts them all, server included)."""
    n = 0
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.stat("/proc/" + pid).st_uid == uid:
                n += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
    return n


for name, value in (("RLIMIT_FSIZE", limits["file_bytes"]), ("RLIMIT_NOFILE", limits["open_files"]),
                    ("RLIMIT_CORE", 0)):
    resource.setrlimit(getattr(resource, name), (value, value))
resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))  # SIGXCPU, then SIGKILL

import builtins  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

for _name in limits["imports"]:  # all a student may import, loaded now: after the drop its files may be unreadable
    __import__(_name)
jnp.zeros(1).block_until_ready()  # start the backend while waiting (a spare child is warm when its code arrives)


def _mapped_bytes():
    """Address space this process maps now (VmSize): JAX's import maps 500-600 MB, more on machines with more cores."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


# The student's code gets `memory_bytes` of address space beyond what JAX's own import mapped (its private memory
# can grow by at most that much), whatever the machine's core count makes JAX map.
resource.setrlimit(resource.RLIMIT_AS, (_mapped_bytes() + limits["memory_bytes"],) * 2)

if limits["user"]:  # started as root: become the unprivileged user for good before any student code arrives
    uid, gid = limits["user"]
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)  # real, effective and saved ids, every thread (glibc): no way back, and RLIMIT_NPROC now binds
    if os.getuid() != uid or os.geteuid() != uid:
        os._exit(3)
resource.setrlimit(resource.RLIMIT_NPROC, (_tasks_of(os.getuid()) + limits["tasks"],) * 2)
payload = json.loads(sys.stdin.read())
ALLOWED = set(payload["allowed_imports"])
SAFE_BUILTINS = payload["builtins"]


class CappedOutput:
    """What the student prints: the first `cap` characters kept, the rest counted."""

    def __init__(self, cap):
        self.parts, self.kept, self.cap, self.dropped = [], 0, cap, 0

    def write(self, text):
        room = self.cap - self.kept
        if room > 0:
            self.parts.append(text[:room])
            self.kept += min(len(text), room)
        self.dropped += max(len(text) - max(room, 0), 0)
        return len(text)


out = CappedOutput(payload["output_chars"])


def student_print(*args, sep=" ", end="\n", **_):
    out.write(sep.join(str(a) for a in args) + end)


def student_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level or name not in ALLOWED:
        raise ImportError(f"import {name!r} is not allowed here (allowed: {', '.join(sorted(ALLOWED))})")
    return builtins.__import__(name, globals, locals, fromlist, level)


def error_of(err):
    """`{"type", "message", "line"}` of an exception: the line is the innermost one in the student's code."""
    lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if f.filename == "<your code>"]
    if isinstance(err, SyntaxError) and err.filename == "<your code>":
        lines.append(err.lineno)
    return {"type": type(err).__name__, "message": str(err)[:3000], "line": lines[-1] if lines else None}


def decode(arg):
    kind = arg["kind"]
    if kind == "float":
        return float(arg["value"])
    if kind == "int":
        return int(arg["value"])
    if kind == "key":
        return jax.random.PRNGKey(int(arg["value"]))
    return jnp.asarray(np.asarray(arg["value"], dtype=arg["dtype"]))


def encode(result):
    leaves = []
    for leaf in jax.tree_util.tree_leaves(result):
        a = np.asarray(leaf, dtype=np.float64)
        if a.size > payload["max_elements"]:
            raise ValueError(f"the function returned an array of {a.size:,} numbers; at most "
                             f"{payload['max_elements']:,} are expected here")
        leaves.append({"shape": list(a.shape), "data": a.ravel().tolist()})
    return leaves


reply = {"output": "", "truncated": 0, "exec_error": None, "results": [], "seconds": 0.0}
try:
    namespace = {"__builtins__": {**{k: getattr(builtins, k) for k in SAFE_BUILTINS if hasattr(builtins, k)},
                                  "print": student_print, "__import__": student_import},
                 "__name__": "__practice__"}
    started = time.perf_counter()
    try:
        exec(compile(payload["code"], "<your code>", "exec"), namespace)
    except BaseException as err:  # noqa: BLE001 - reported, never raised: the reply must be written
        reply["exec_error"] = error_of(err)
    else:
        fn = namespace.get(payload["fn"]) if payload["fn"] else None
        for case in payload["cases"]:
            if not callable(fn):
                reply["exec_error"] = {"type": "NameError", "line": None,
                                       "message": f"your code does not define a function named {payload['fn']!r}"}
                break
            try:
                reply["results"].append({"leaves": encode(fn(*[decode(a) for a in case])), "error": None})
            except BaseException as err:  # noqa: BLE001
                reply["results"].append({"leaves": None, "error": error_of(err)})
    reply["seconds"] = time.perf_counter() - started
finally:
    reply["output"], reply["truncated"] = "".join(out.parts), out.dropped
    data = json.dumps(reply).encode()
    while data:
        data = data[os.write(1, data):]
    os._exit(0)  # the reply is written: skip the interpreter's teardown (JAX's threads and atexit take ~0.5 s)
