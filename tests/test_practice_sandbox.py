"""The attack corpus: what a visitor of a shared server might paste into Practice. Each attack is refused before it
runs (the AST check) or stopped by the child's limits, with a clear message; the server process stays up and its
memory does not grow.

Two walls are tested: `refusals` (no process starts), and the child itself with the AST check off (`check=False`),
which must still contain what gets past: restricted builtins, an import hook, rlimits, a wall-clock timeout.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from benchmarks.browser import ROOT
from benchmarks.practice import REFUSED, STOPPED

from gradlab.memory import rss_mb
from gradlab.practice import Limits, execute, refusals, sandbox

#: Small limits for the runtime attacks: quick to hit (memory beyond JAX's import).
SMALL = Limits(memory_mb=150, cpu_seconds=5, wall_seconds=8, output_chars=2_000)

@pytest.mark.parametrize("code", list(REFUSED.values()), ids=list(REFUSED))
def test_attack_is_refused_before_it_runs(code):
    reasons = refusals(code)
    assert reasons and all(isinstance(r, str) and r for r in reasons)
    out = execute(code)
    assert out.refused == reasons and not out.ran and out.results == [] and out.seconds == 0.0


def test_refusal_messages_name_the_line_and_what_is_allowed():
    (reason,) = refusals("x = 1\nimport os\n")
    assert reason.startswith("line 2:") and "import os" in reason and "jax, jax.numpy" in reason
    assert refusals("def f(:\n") == ["line 1: syntax error: invalid syntax"] or refusals("def f(:\n")[0].startswith("line 1: syntax error")


def test_what_the_problems_need_is_allowed():
    code = ("import jax, math, functools, time\nimport jax.numpy as jnp\nimport numpy as np\nfrom jax import vmap, grad\n"
            "f = functools.partial(lambda a, b: a * b, 2)\nprint(f(3), math.pi, np.linalg.norm(np.ones(3)),"
            " jnp.ones(2).sum(), time.perf_counter() > 0, f'{1:.2f}')\n")
    assert refusals(code) == []


# ---------------------------------------------------------------- the second wall: the child, the AST check off

def test_child_has_no_open_no_dunder_import_and_no_os():
    out = execute("try:\n    open('/etc/passwd')\nexcept NameError as e:\n    print('open:', e)\n"
                  "try:\n    import os\nexcept ImportError as e:\n    print('os:', e)\n"
                  "try:\n    import jax\n    jax.version.os\nexcept AttributeError as e:\n    print('walk:', e)\n",
                  limits=SMALL, check=False)
    assert out.ran, (out.stopped, out.exec_error)
    assert "open: name 'open' is not defined" in out.output
    assert "os: import 'os' is not allowed" in out.output and "walk: `.version` leads outside" in out.output


needs_os_wall = pytest.mark.skipif(sandbox.os_wall() is not None, reason=f"no OS sandbox here: {sandbox.os_wall()}")


@needs_os_wall
def test_child_environment_view_and_limits():
    """As the code sees it with the language wall down: only JAX's environment (none of the server's variables),
    the interpreter read-only and nothing of the project, a private /tmp, its own PID namespace, and the limits."""
    code = ("import os, json, resource\nprint(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(), "
            "'root': sorted(os.listdir('/')), 'procs': [p for p in os.listdir('/proc') if p.isdigit()], "
            "'uid': os.getuid(), 'project': os.path.exists(" + repr(str(ROOT / "app.py")) + "), 'limits': {n: resource.getrlimit(getattr(resource, n)) for n in "
            "('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NOFILE', 'RLIMIT_FSIZE', 'RLIMIT_CORE')}}))\n")
    out = execute(code, limits=SMALL, check=False, language_wall=False)
    seen = json.loads(out.output)
    seen["env"].pop("TPU_SKIP_MDS_QUERY", None)  # set by JAX's own import in the child
    assert seen["env"].pop("PWD") == "/tmp"  # set by bubblewrap's --chdir
    assert os.environ.get("GRADLAB_STORE_DIR") and "GRADLAB_STORE_DIR" not in seen["env"]
    assert set(seen["env"]) == set(sandbox.child_env("/x")) and seen["env"]["JAX_PLATFORMS"] == "cpu"
    assert seen["cwd"] == "/tmp" and not seen["project"] and "home" not in seen["root"]
    assert len(seen["procs"]) <= 3  # bubblewrap's init, the child (and nothing of the server's)
    lim = seen["limits"]
    assert lim["RLIMIT_CPU"] == [SMALL.cpu_seconds, SMALL.cpu_seconds + 1]
    assert lim["RLIMIT_NOFILE"] == [SMALL.open_files] * 2 and lim["RLIMIT_FSIZE"] == [SMALL.file_bytes] * 2
    assert lim["RLIMIT_CORE"] == [0, 0] and SMALL.memory_mb * 2**20 < lim["RLIMIT_AS"][0] == lim["RLIMIT_AS"][1]
    if os.geteuid() == 0:
        assert seen["uid"] == sandbox._nobody()[0]


def test_memory_bomb_is_stopped_and_the_server_does_not_grow():
    before = rss_mb()
    out = execute(STOPPED["memory bomb (numpy)"], limits=SMALL)
    assert out.stopped and "memory limit" in out.stopped
    out = execute(STOPPED["memory bomb (growing)"], limits=SMALL)
    assert out.stopped and ("memory limit" in out.stopped or "CPU" in out.stopped or "longer" in out.stopped), out.stopped
    # its peak RSS (wait4's ru_maxrss) counts JAX's libraries and arenas (250-450 MB); without the limit the bomb
    # grows by GBs a second
    assert out.peak_rss_mb < max(before, 600) + SMALL.memory_mb + 100, (out.peak_rss_mb, before)
    assert rss_mb() - before < 50  # the server only reads a small JSON reply


def test_endless_loop_is_stopped_by_the_cpu_or_wall_clock_limit():
    out = execute(STOPPED["endless loop"], limits=SMALL)
    assert out.stopped and ("CPU time" in out.stopped or "longer than" in out.stopped), out.stopped


def test_huge_output_is_capped():
    out = execute(STOPPED["huge output"], limits=SMALL)
    assert out.ran and len(out.output) == SMALL.output_chars and out.truncated > 10**7 - SMALL.output_chars


def test_fork_past_the_language_wall_is_refused_by_seccomp():
    """The second wall: the language wall down, a fork bomb. The seccomp filter refuses every new process (threads
    only), so not one fork succeeds."""
    code = ("import os\nprint('uid', os.getuid())\nn = 0\ntry:\n    for _ in range(500):\n"
            "        if os.fork() == 0:\n            import time\n            time.sleep(30)\n            os._exit(0)\n"
            "        n += 1\nexcept Exception as e:\n    print('refused after', n, type(e).__name__)\n")
    out = execute(code, limits=SMALL, check=False, language_wall=False)
    assert "refused after 0 PermissionError" in out.output, (out.output, out.stopped, out.exec_error)
    if os.geteuid() == 0:
        assert f"uid {sandbox._nobody()[0]}" in out.output


@pytest.mark.skipif(os.geteuid() != 0, reason="the child drops to `nobody` only when the server runs as root")
def test_as_root_the_child_runs_as_nobody_for_good():
    """Started as root (so it can read a Python under /root), the child drops to `nobody` before student code runs:
    root's files are unreadable and there is no way back."""
    code = ("import os\nprint('ids', os.getuid(), os.geteuid(), os.getgid(), os.getgroups())\n"
            "for attempt in (lambda: os.listdir('/root'), lambda: os.setuid(0), lambda: os.seteuid(0)):\n"
            "    try:\n        attempt()\n        print('ALLOWED')\n    except Exception as e:\n        print('refused:', e)\n")
    out = execute(code, limits=SMALL, check=False, language_wall=False)
    uid, gid = sandbox._nobody()
    assert f"ids {uid} {uid} {gid} []" in out.output, (out.output, out.stopped, out.exec_error)
    assert out.output.count("refused:") == 3 and "ALLOWED" not in out.output


@pytest.mark.slow  # child processes, an idle timeout, compiling: 5-10 s
def test_a_warm_spare_waits_only_while_practice_has_visitors(monkeypatch):
    """`prepare` (a visitor) starts a spare child; a run takes it and a new one waits for the next run; once no
    visitor came for the idle time, the spare is gone (its memory back) until the next `prepare`."""
    monkeypatch.setattr(sandbox, "WARM", True)
    monkeypatch.setattr(sandbox, "SPARE_IDLE_SECONDS", 5.0)
    sandbox._discard_spares()
    sandbox.prepare(SMALL)
    (first,) = sandbox._SPARE
    out = execute("print(1 + 1)", limits=SMALL)
    assert out.ran and out.output == "2\n"
    assert first.proc.poll() is not None  # it ran the code, then went
    sandbox.prepare(SMALL)  # the page draws the result: the visitor is still here (a new spare is already waiting)
    (second,) = sandbox._SPARE
    assert second.alive and second.proc.pid != first.proc.pid
    deadline = time.time() + 30
    while (sandbox._SPARE or second.alive) and time.time() < deadline:
        time.sleep(0.2)
    assert not sandbox._SPARE and second.proc.poll() is not None
    execute("print(3)", limits=SMALL)
    assert not sandbox._SPARE  # no visitor since: no new spare


@pytest.mark.slow  # child processes, an idle timeout, compiling: 5-10 s
def test_no_spare_waits_beside_a_running_child(monkeypatch):
    """A visitor arriving during a run starts no spare (the two children's memory would add up); the run's end does."""
    monkeypatch.setattr(sandbox, "WARM", True)
    monkeypatch.setattr(sandbox, "SPARE_IDLE_SECONDS", 60.0)
    sandbox._discard_spares()
    run = threading.Thread(target=execute, args=("import time\ntime.sleep(3)\n",), kwargs={"limits": SMALL})
    run.start()
    deadline = time.time() + 10
    while not sandbox._ONE_RUN.locked() and time.time() < deadline:
        time.sleep(0.01)
    sandbox.prepare(SMALL)
    assert sandbox._ONE_RUN.locked() and not sandbox._SPARE
    run.join()
    assert not sandbox._ONE_RUN.locked() and len(sandbox._SPARE) == 1
    sandbox._discard_spares()


@pytest.mark.slow  # child processes, an idle timeout, compiling: 5-10 s
def test_the_childrens_compilation_cache_is_written_by_the_server_and_read_by_students(tmp_path, monkeypatch):
    """`fill_cache` compiles a reference solution into the children's own cache (never the server's); a student's
    Check of the same code on other hidden values then compiles nothing new: every program is loaded. A student's
    child cannot write there at all (read-only in its sandbox; without one, as root, it runs as `nobody`)."""
    from gradlab import practice

    cache = tmp_path / "practice-xla"
    monkeypatch.setattr(sandbox, "XLA_CACHE", str(cache))
    inside = sandbox.CACHE_INSIDE if sandbox.os_wall() is None else str(cache)  # where the child finds it
    assert sandbox.child_env("/x")["JAX_COMPILATION_CACHE_DIR"] == inside
    assert sandbox.child_env("/x")["JAX_COMPILATION_CACHE_DIR"] != os.environ.get("JAX_COMPILATION_CACHE_DIR")
    p = practice.BY_SLUG["per_example_grads"]
    assert practice.fill_cache(p, 1)
    entries = set(os.listdir(cache))
    assert sum(e.startswith("gradlab-filled-per_example_grads-") for e in entries) == 1 and len(entries) > 5
    assert cache.stat().st_uid == os.geteuid() and cache.stat().st_mode & 0o777 == 0o755
    v = practice.check(p, p.solution + "# a student's copy\n", 2)
    assert v.passed and set(os.listdir(cache)) == entries  # all hits (as a user that could write, a miss would show)
    where = sandbox.CACHE_INSIDE if sandbox.os_wall() is None else str(cache)
    code = (f"import os\ntry:\n    os.open({where + '/x'!r}, os.O_CREAT | os.O_WRONLY)\n"
            "    print('WROTE')\nexcept Exception as e:\n    print('refused:', e)\n")
    out = execute(code, limits=SMALL, check=False, language_wall=False)
    assert "refused: [Errno 30] Read-only file system" in out.output or (
        os.geteuid() == 0 and "refused: [Errno 13] Permission denied" in out.output), out
    assert set(os.listdir(cache)) == entries


def test_a_cache_folder_others_can_write_is_not_used(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setattr(sandbox, "XLA_CACHE", str(shared))
    assert sandbox.cache_dir() is None and "JAX_COMPILATION_CACHE_DIR" not in sandbox.child_env("/x")
    monkeypatch.setattr(sandbox, "XLA_CACHE", "")
    assert sandbox.cache_dir() is None


def test_without_the_os_wall_a_shared_server_runs_no_code_and_localhost_runs_it_behind_seccomp(monkeypatch):
    monkeypatch.setattr(sandbox, "os_wall", lambda: "bubblewrap is not installed")
    shared, local = sandbox.mode(local=False), sandbox.mode(local=True)
    assert not shared.runs_code and not shared.os_wall and "bubblewrap is not installed" in shared.message
    assert local.runs_code and not local.os_wall and "not in an OS sandbox" in local.message
    out = execute("import os\ntry:\n    os.fork()\nexcept OSError as e:\n    print('refused', e.errno)\n",
                  limits=SMALL, check=False, language_wall=False)
    assert "refused 1" in out.output, (out.output, out.stopped, out.exec_error)  # EPERM from seccomp
    monkeypatch.setenv("GRADLAB_PRACTICE_LOCAL", "1")
    assert sandbox.mode(local=False).runs_code


BAD_LEAVES = ['{"shape": [3], "data": [1.0]}', '{"shape": [18446744073709551616, 0], "data": []}',
              '{"shape": [1], "data": [' + "9" * 400 + ']}', '{"shape": [1000000], "data": []}']


@pytest.mark.parametrize("reply", [b"", b"{", b"[" * 100_000 + b"]" * 100_000, b'{"output": 1}'] + [
    b'{"output": "", "truncated": 0, "exec_error": null, "results": [{"leaves": [' + leaf.encode() + b'], "error": '
    b'null}]}' for leaf in BAD_LEAVES])
def test_a_malformed_reply_is_a_failed_run_never_an_exception(reply):
    parsed, problem = sandbox._parse(reply, 0, cases=1)
    assert parsed is None
    assert problem is None if reply == b"" else "answer" in problem
    assert sandbox._parse(b"x", True, cases=1) == (None, "sent back an answer over 2.7 MB")


def test_a_run_takes_only_the_cpu_nothing_else_wants():
    """The server's default priority (`Limits.priority="idle"`): Linux's idle scheduling class at nice 19, which the
    code cannot leave (seccomp refuses it). The suite itself runs its children at nice 10 (conftest)."""
    code = ("import os\nprint(os.sched_getscheduler(0) == os.SCHED_IDLE, os.getpriority(os.PRIO_PROCESS, 0))\n"
            "try:\n    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))\nexcept OSError as e:\n"
            "    print('refused', e.errno)\n")
    out = execute(code, limits=Limits(memory_mb=150, cpu_seconds=5, wall_seconds=30, priority="idle"), check=False,
                  language_wall=False)
    assert out.output.split("\n")[:2] == ["True 19", "refused 1"], (out.output, out.stopped, out.exec_error)
    assert sandbox.Limits.__dataclass_fields__["priority"].default == os.environ.get("GRADLAB_PRACTICE_PRIORITY", "idle")


@needs_os_wall
def test_a_spare_started_by_a_script_runs_thread_outlives_that_thread(monkeypatch):
    """Streamlit runs each script run in its own thread, and bubblewrap's `--die-with-parent` follows the thread that
    started it: every child is started by one long-lived thread, so a visit's spare waits for the visitor's run."""
    monkeypatch.setattr(sandbox, "WARM", True)
    monkeypatch.setattr(sandbox, "SPARE_IDLE_SECONDS", 60.0)
    sandbox._discard_spares()
    def visit():  # a visit, then a run (Practice's cache fill runs one in a thread of its own): its end starts a spare
        sandbox.prepare(SMALL)
        assert execute("print(1)", limits=SMALL).output == "1\n"

    thread = threading.Thread(target=visit)
    thread.start()
    thread.join()
    time.sleep(2.0)
    (spare,) = sandbox._SPARE
    assert spare.alive
    out = execute("print(2)", limits=SMALL)
    assert out.ran and out.output == "2\n" and spare.proc.poll() is not None  # the spare ran it, then went
    sandbox._discard_spares()
