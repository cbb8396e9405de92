"""The program the sandbox's child process runs (`python -I -c <this file's text>`); never imported by the server.

Order matters; each step comes before the student's code can do anything:

1. Limits it sets on itself from argv[1] (JSON): CPU time, file size, open files, no core files (soft = hard, so
   they cannot be raised again), and a low CPU priority (`Limits.priority`: by default the idle class, so a
   student's run never slows the server's own computations).
2. JAX and every module a student may import, the backend started (a spare child is warm when its code arrives);
   then an address-space limit (RLIMIT_AS) of what the import mapped plus the run's share, and, when it started
   as root (inside bubblewrap as outside), the drop to `nobody` for good.
3. A seccomp filter (libseccomp through `pyseccomp`) on every thread at once (TSYNC; the threads JAX starts later
   inherit it): no new process (only threads), no new executable, no socket, no `ptrace`, no signal to another
   process, no namespace, mount, key ring, BPF or io_uring, no limit or priority raised.
4. One JSON payload on stdin (`code`, `fn`, `cases`, the language policy...): the student's code compiled by
   RestrictedPython and run with guarded attribute access (`_getattr_`: no `_` names, no module outside the
   allowlist reachable as a value, no frames or code objects), guarded writes, an import allowlist and a few
   builtins. `fn` is called on every case.
5. One JSON reply on `reply_fd`, a pipe the server owns: `{"output", "truncated", "exec_error", "results": [{"leaves":
   [{"shape", "data"}], "error"}]}`. Printed text is collected here (capped); fd 1 and 2 go to a capped log.

Standard library, JAX, NumPy, RestrictedPython and pyseccomp only: the child cannot import gradlab.
"""

import errno
import json
import operator
import os
import resource
import sys
import traceback
import types

limits = json.loads(sys.argv[1])


for name, value in (("RLIMIT_FSIZE", limits["file_bytes"]), ("RLIMIT_NOFILE", limits["open_files"]),
                    ("RLIMIT_CORE", 0)):
    resource.setrlimit(getattr(resource, name), (value, value))
resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))  # SIGXCPU, then SIGKILL
if limits["priority"] == "idle":  # runs only on a core nothing else wants
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
os.setpriority(os.PRIO_PROCESS, 0, 19 if limits["priority"] == "idle" else int(limits["priority"]))


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


def _seccomp() -> None:
    """Refuse what no problem needs and every escape route uses (EPERM; clone3 ENOSYS so glibc falls back to
    clone, whose flags a filter can read). Loaded with no_new_privs, on every thread of this process."""
    refuse = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)  # another ABI's calls (int 0x80): the whole process goes
    for call in ("socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "ptrace",
                 "process_vm_readv", "process_vm_writev", "execve", "execveat", "fork", "vfork", "unshare", "setns",
                 "mount", "umount2", "pivot_root", "chroot", "keyctl", "add_key", "request_key", "bpf",
                 "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
                 "personality", "setpriority", "sched_setscheduler", "sched_setattr", "sched_setparam", "kcmp",
                 "open_by_handle_at", "name_to_handle_at", "mknod", "mknodat", "memfd_create", "pidfd_open",
                 "pidfd_getfd", "pidfd_send_signal", "move_mount", "open_tree", "fsopen", "fsmount", "fspick",
                 "mount_setattr", "quotactl", "acct", "swapon", "swapoff", "reboot", "kexec_load", "init_module",
                 "finit_module", "delete_module", "setrlimit", "setsid", "setpgid", "ioprio_set",
                 "kexec_file_load", "uselib", "migrate_pages", "move_pages", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
                 "process_madvise", "fanotify_init", "memfd_secret"):
        try:
            f.add_rule(refuse, call)
        except (ValueError, OSError, RuntimeError):  # a call this kernel or architecture does not have
            pass
    f.add_rule(refuse, "clone", sc.Arg(0, sc.MASKED_EQ, 0x00010000, 0))  # a clone without CLONE_THREAD: a process
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    me = os.getpid()
    f.add_rule(refuse, "kill", sc.Arg(0, sc.NE, me))  # signals only to itself (its threads: tgkill below)
    f.add_rule(refuse, "tgkill", sc.Arg(0, sc.NE, me))
    f.add_rule(refuse, "tkill")
    f.add_rule(refuse, "prlimit64", sc.Arg(2, sc.NE, 0))  # reading a limit is fine, setting one is not
    f.add_rule(refuse, "ioctl", sc.Arg(1, sc.EQ, 0x5412))  # TIOCSTI: no keystrokes pushed into a terminal
    f.set_attr(sc.Attr.CTL_TSYNC, 1)
    f.load()


import builtins  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from RestrictedPython import compile_restricted  # noqa: E402

if limits["seccomp"]:
    import pyseccomp as sc  # noqa: E402 - before the drop to `nobody`, like every import
from RestrictedPython.Guards import (full_write_guard, guarded_iter_unpack_sequence,  # noqa: E402
                                     guarded_unpack_sequence, safer_getattr)

for _name in limits["imports"]:  # all a student may import, loaded now: after a drop its files may be unreadable
    __import__(_name)
np.ones(2).sum(), np.ones(2).mean(), np.ones(2).std()  # what NumPy's methods import lazily, loaded now too
jnp.zeros(1).block_until_ready()  # start the backend while waiting (a spare child is warm when its code arrives)


def _mapped_bytes():
    """Address space this process maps now (VmSize): JAX's import maps 500-600 MB, more on machines with more cores."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


# The student's code gets `memory_bytes` of address space beyond what JAX's own import mapped (its private memory
# can grow by at most that much), whatever the machine's core count makes JAX map. With no process of its own
# (seccomp), this bounds the whole run.
resource.setrlimit(resource.RLIMIT_AS, (_mapped_bytes() + limits["memory_bytes"],) * 2)

if limits["user"]:  # started as root: become `nobody` for good before any student code arrives
    uid, gid = limits["user"]
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        os._exit(3)
    import ctypes  # noqa: E402 - a change of user clears the parent-death signal bubblewrap set: set it again, so
    if ctypes.CDLL(None).prctl(1, 9, 0, 0, 0) != 0:  # this process (the sandbox's PID 1) dies with bubblewrap
        os._exit(3)
if limits["seccomp"]:
    _seccomp()
else:  # without the filter, at least a bound on processes (it binds users that are not root, and counts them all)
    resource.setrlimit(resource.RLIMIT_NPROC, (_tasks_of(os.getuid()) + limits["tasks"],) * 2)
payload = json.loads(sys.stdin.read())


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
ALLOWED = set(payload["allowed_imports"])
ONLY = {module: set(names) for module, names in payload["module_attributes"].items()}
DENIED = set(payload["denied_attributes"])
HIDDEN_TYPES = (types.ModuleType, types.FrameType, types.CodeType, types.TracebackType)


def guarded_getattr(obj, name, *default):
    """`obj.name` for student code: no `_` names, none of the attributes that read files or reach C, only the
    listed attributes of a module that lists them, and never a module outside the allowlist, a frame, a code object
    or a traceback as the result, however it was reached."""
    if not isinstance(name, str) or name.startswith("_") or name in DENIED:
        raise AttributeError(f"the attribute `.{name}` is not available here")
    if isinstance(obj, types.ModuleType) and obj.__name__ in ONLY and name not in ONLY[obj.__name__]:
        raise AttributeError(f"`{obj.__name__}.{name}` is not available here (only "
                             f"{', '.join(sorted(ONLY[obj.__name__]))})")
    value = safer_getattr(obj, name, *default)
    if isinstance(value, HIDDEN_TYPES) and not (isinstance(value, types.ModuleType) and value.__name__ in ALLOWED):
        raise AttributeError(f"`.{name}` leads outside what Practice offers")
    return value


def student_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and type(fromlist) is list and not fromlist and name in sys.modules:
        return sys.modules[name]  # C code's own import (PyImport_Import's empty list; Python's import statement
        #                           passes None or a tuple) of a module loaded already: `x.sum()` imports numpy's
    if level or name not in ALLOWED:
        raise ImportError(f"import {name!r} is not allowed here (allowed: {', '.join(sorted(ALLOWED))})")
    module = builtins.__import__(name, globals, locals, fromlist, level)
    for item in fromlist or ():
        try:
            guarded_getattr(sys.modules[name], item)
        except AttributeError as err:
            raise ImportError(f"cannot import {item!r} from {name!r}: {err}") from None
    return module


class StudentPrint:
    """RestrictedPython's print: `print(...)` becomes `_print_(_getattr_)._call_print(...)`."""

    def __init__(self, _getattr=None):
        pass

    def _call_print(self, *args, sep=" ", end="\n", **_):
        out.write(str(sep).join(str(a) for a in args) + str(end))

    def __call__(self):
        return ""


_INPLACE = {"+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
            "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "@=": operator.imatmul,
            "<<=": operator.ilshift, ">>=": operator.irshift, "&=": operator.iand, "|=": operator.ior,
            "^=": operator.ixor}


def namespace_for(wall: bool) -> dict:
    """The globals student code runs in: guarded (`wall`), or the plain interpreter's (tests of the OS wall)."""
    if not wall:
        return {"__builtins__": builtins, "__name__": "__practice__", "print": StudentPrint()._call_print}
    safe = {k: getattr(builtins, k) for k in payload["builtins"] if hasattr(builtins, k)}
    safe["__import__"] = student_import
    return {"__builtins__": safe, "__name__": "__practice__", "_getattr_": guarded_getattr,
            "_getitem_": lambda obj, key: obj[key], "_getiter_": iter, "_write_": full_write_guard,
            "_print_": StudentPrint, "_apply_": lambda f, *a, **kw: f(*a, **kw),
            "_inplacevar_": lambda op, x, y: _INPLACE[op](x, y),
            "_unpack_sequence_": guarded_unpack_sequence, "_iter_unpack_sequence_": guarded_iter_unpack_sequence}


def error_of(err):
    """`{"type", "message", "line"}` of an exception: the line is the innermost one in the student's code. Never
    raises (a message that cannot be made into text, such as a list nested 100,000 deep, is replaced)."""
    try:
        lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if f.filename == "<your code>"]
        if isinstance(err, SyntaxError) and err.filename == "<your code>":
            lines.append(err.lineno)
        message = str(err)[:3000]
    except BaseException:  # noqa: BLE001
        lines, message = [], "(its message could not be shown)"
    return {"type": type(err).__name__, "message": message, "line": lines[-1] if lines else None}


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


reply = {"output": "", "truncated": 0, "exec_error": None, "results": []}
try:
    wall = payload["language_wall"]
    namespace = namespace_for(wall)
    try:
        program = (compile_restricted if wall else compile)(payload["code"], "<your code>", "exec")
        exec(program, namespace)
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
finally:
    reply["output"], reply["truncated"] = "".join(out.parts), out.dropped
    data = json.dumps(reply).encode()
    while data:
        data = data[os.write(limits["reply_fd"], data):]
    os._exit(0)  # the reply is written: skip the interpreter's teardown (JAX's threads and atexit take ~0.5 s)
