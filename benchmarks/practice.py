"""Practice on a real server: Check's server time cold and warm, and the attack corpus through the page.

    python -m benchmarks.practice              # one server, headless Chromium; prints a summary
    python -m benchmarks.practice --warm 3     # fewer warm Checks
    python -m benchmarks.practice --every-problem   # Check on every problem, in-process, first and warm
    python -m benchmarks.practice --fairness        # a page's computation while a student holds a run (no browser)

Starts `streamlit run app.py` with GRADLAB_LOG_RUNS=1 (each script run logs its server time), opens /practice,
types the reference solution and presses Check: the first Check comes right after the page opened (its spare
child, started by the visit, may still be importing JAX), the next ones warm (a spare child imported JAX after the
previous run). Then `--concurrent` visitors press Check at once, and every attack of `REFUSED` and `STOPPED` is
typed and Run. In each phase the server's RSS (the streamlit process) and the whole tree's (server plus sandbox
children, private pages) are sampled; each attack must end in a refusal or a stop message, never a traceback, and
the server must still answer /_stcore/health.
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request

from benchmarks.browser import Sampler, launch, page_errors, run_times, streamlit_server, wait_until_idle, ROOT

#: Refused by the AST check before anything runs (tests/test_practice_sandbox.py runs each).
REFUSED = {
    "read a file": "print(open('/etc/passwd').read())",
    "import os": "import os\nprint(os.environ)",
    "import subprocess": "import subprocess\nsubprocess.run(['ls', '/'])",
    "from os import": "from os import system\nsystem('id')",
    "__import__": "__import__('os').system('id')",
    "subclasses walk": "print(().__class__.__bases__[0].__subclasses__())",
    "globals walk": "def f():\n    pass\nprint(f.__globals__)",
    "builtins": "print(__builtins__)",
    "getattr with a dunder string": "print(getattr((), '__cl' + 'ass__'))",
    "getattr": "import jax\nprint(getattr(jax, 'numpy'))",
    "eval": "eval('1 + 1')",
    "exec": "exec('x = 1')",
    "compile": "compile('1', 'x', 'eval')",
    "network socket": "import socket\nsocket.create_connection(('example.com', 80))",
    "urllib": "import urllib.request\nurllib.request.urlopen('http://example.com')",
    "np.load reads files": "import numpy as np\nprint(np.loadtxt('/etc/passwd', dtype=str))",
    "np.fromfile": "import numpy as np\nprint(np.fromfile('/etc/passwd', dtype='uint8'))",
    "np.lib": "import numpy as np\nnp.lib.npyio.DataSource()",
    "ctypes through numpy": "import numpy as np\nnp.ctypeslib.ctypes.CDLL(None)",
    "tofile writes": "import numpy as np\nnp.ones(3).tofile('/tmp/x')",
    "jax.profiler writes files": "from jax import profiler\nprofiler.start_trace('/tmp/t')",
    "format walks attributes": "print('{0.__class__}'.format(1))",
    "format via a variable": "s = '{0.real}'\nprint(s.format(1))",
    "frame walk": "g = (x for x in [1])\nprint(g.gi_frame.f_back.f_globals)",
    "traceback frames": "try:\n    1 / 0\nexcept Exception as e:\n    print(e.__traceback__.tb_frame)",
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "multiprocessing": "import multiprocessing\nmultiprocessing.Process(target=print).start()",
    "relative import": "from . import x",
    "star import": "from numpy import *",
    "private attribute": "import jax\nprint(jax._src)",
    "type() to reach object": "print(type(1).mro())",
    "breakpoint": "breakpoint()",
    "np.rec reads files": "import numpy as np\nprint(np.rec.fromfile('/etc/passwd', formats='u1'))",
    "jax.ffi": "import jax\njax.ffi.register_ffi_target('x', None)",
    "huge code": "x = [" + "1, " * 8_000 + "]\n",  # 24,000 characters on one line (a browser renders it quickly)
}

#: Allowed by the AST check, stopped by the child's limits.
STOPPED = {
    "memory bomb (numpy)": "import numpy as np\nx = np.ones((20000, 20000))\nprint(x.sum())",
    "memory bomb (growing)": "import jax.numpy as jnp\nblocks = []\nwhile True:\n    blocks.append(jnp.ones(10**7) + len(blocks))",
    "endless loop": "while True:\n    pass\n",
    "huge output": "print('x' * 10**7)\nfor i in range(10**5):\n    print(i)\n",
}

#: What the page shows for a contained attack.
CONTAINED = ("was not run", "Stopped:", "more characters not shown")


def _main_text(page) -> str:
    return page.locator('[data-testid="stMainBlockContainer"]').inner_text()


def _submit(page, code: str, button: str) -> None:
    editor = page.get_by_role("textbox", name="Your code")
    editor.fill(code)
    editor.press("Control+Enter")
    wait_until_idle(page)
    page.get_by_role("button", name=button).click()
    page.wait_for_timeout(300)
    wait_until_idle(page, timeout=180)


def _last_run(log) -> float:
    times = [s for title, s in run_times(log) if title == "Practice"]
    return times[-1]


def every_problem(rounds: int = 3, pause: float = 8.0) -> list[tuple[str, float, float, float]]:
    """Check on every problem's reference solution as the page runs it, in this process (no browser): the problem
    opens (`practice.prepare`: a spare child imports JAX, the reference is compiled into the children's cache),
    then Check once cold and `rounds` times warm, `pause` s apart (the spare imports JAX after each run).
    Returns `(slug, first s, warm median s, warm max s)` per problem; the times are the calls' wall time, which is
    the page's server time for a Check."""
    from gradlab import practice

    rows = []
    for problem in practice.PROBLEMS:
        practice.prepare(problem)
        time.sleep(pause)
        times = []
        for i in range(rounds + 1):
            started = time.perf_counter()
            verdict = practice.check(problem, problem.solution + f"\n# attempt {i}\n")
            times.append(time.perf_counter() - started)
            assert verdict.passed, (problem.slug, verdict.outcome)
            time.sleep(pause)
        rows.append((problem.slug, times[0], statistics.median(times[1:]), max(times[1:])))
        print(f"{problem.slug:28s} first {times[0]:5.2f} s   warm median {rows[-1][2]:5.2f} s   max {rows[-1][3]:5.2f} s",
              flush=True)
    return rows


def fairness(rounds: int = 5, hold: float = 30.0) -> dict[str, float]:
    """A page's computation alone, then while a student's run holds Practice's slot for its whole wall clock
    (`hold` s): an endless Python loop, and an endless loop of 600 x 600 matrix products (XLA's threads on every
    core). The page's computation is the Gradient norms page's core (per-example norms of a 64-256-10 MLP over the
    1,797 digits, through the pages' gate); the student's run goes through `ui.sandboxed`'s gate and the sandbox.
    Returns the median seconds of each phase; prints them with the delay (during - alone)."""
    import threading

    import equinox as eqx
    import jax
    import jax.numpy as jnp
    from sklearn.datasets import load_digits

    from gradlab import engine
    from gradlab.practice import Limits, sandbox
    from gradlab.ui.cache import GATE, PRACTICE_GATE

    x, y = load_digits(return_X_y=True)
    xs, ys = jnp.asarray(x / 16.0, jnp.float32), jnp.asarray(y)
    model = eqx.nn.MLP(64, 10, 256, 1, key=jax.random.PRNGKey(0))

    def loss(m, xi, yi):
        return -jax.nn.log_softmax(m(xi))[yi]

    def page_once() -> float:
        started = time.perf_counter()
        GATE.run(f"fairness-{time.monotonic_ns()}", "norms",
                 lambda report: [engine.per_example_norms(loss, model, xs, ys).block_until_ready() for _ in range(3)])
        return time.perf_counter() - started

    page_once()  # compile
    medians = {"alone": statistics.median(page_once() for _ in range(rounds))}
    hostile = {"endless Python loop": "while True:\n    pass\n",
               "endless matrix products": "import jax.numpy as jnp\nx = jnp.ones((600, 600))\nwhile True:\n"
                                          "    x = (x @ x) / 600.0\n    x.block_until_ready()\n"}
    limits = Limits(cpu_seconds=int(hold * 3), wall_seconds=hold)
    for name, code in hostile.items():
        run = threading.Thread(target=PRACTICE_GATE.run, args=(f"student-{name}", "student",
                               lambda report, c=code: sandbox.execute(c, limits=limits)))
        run.start()
        time.sleep(4)  # the child imported JAX and runs the student's code
        medians[name] = statistics.median(page_once() for _ in range(rounds))
        run.join()
    for name, seconds in medians.items():
        delay = "" if name == "alone" else f"   delay {seconds - medians['alone']:+.2f} s"
        print(f"page computation, {name:26s} median {seconds:.2f} s over {rounds}{delay}", flush=True)
    return medians


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warm", type=int, default=5, help="warm Checks to time")
    ap.add_argument("--concurrent", type=int, default=3, help="visitors pressing Check at once")
    ap.add_argument("--every-problem", action="store_true",
                    help="instead: Check every problem's reference solution in this process (no browser)")
    ap.add_argument("--fairness", action="store_true",
                    help="instead: a page's computation alone and while a student's run holds its whole wall clock")
    args = ap.parse_args(argv)
    if args.every_problem:
        every_problem()
        return 0
    if args.fairness:
        fairness()
        return 0
    from playwright.sync_api import sync_playwright

    from gradlab.practice import BY_SLUG

    solution = BY_SLUG["per_example_grads"].solution
    log = ROOT / "screenshots" / "practice_server.log"
    log.parent.mkdir(exist_ok=True)
    with sync_playwright() as p, streamlit_server(log_path=log, env={"GRADLAB_LOG_RUNS": "1"}) as (base, proc):
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        server, tree = _samplers(proc.pid)
        page.goto(f"{base}/practice")
        wait_until_idle(page)
        _submit(page, solution, "Check")
        assert "Correct" in _main_text(page), _main_text(page)[:800]
        cold = _last_run(log)
        warm = []
        for i in range(args.warm):
            time.sleep(8)  # the spare child imports JAX after each run
            _submit(page, solution + f"# attempt {i}\n", "Check")
            assert "Correct" in _main_text(page)
            warm.append(_last_run(log))
        print(f"Check, server time: cold {cold:.2f} s; warm median {statistics.median(warm):.2f} s, "
              f"max {max(warm):.2f} s over {len(warm)}")
        print(f"  peak RSS so far: server {server.peak:.0f} MB, server + sandbox children {tree.peak:.0f} MB")

        _stop(server, tree)
        server, tree = _samplers(proc.pid)
        pages = [page] + [browser.new_page(viewport={"width": 1280, "height": 1400})
                          for _ in range(args.concurrent - 1)]
        for i, other in enumerate(pages):
            if other is not page:
                other.goto(f"{base}/practice")
                wait_until_idle(other)
            editor = other.get_by_role("textbox", name="Your code")
            editor.fill(solution + f"# visitor {i}\n")
            editor.press("Control+Enter")
            wait_until_idle(other)
        time.sleep(8)
        started = time.perf_counter()
        for other in pages:
            other.get_by_role("button", name="Check").click()
        for other in pages:
            other.wait_for_timeout(300)
            wait_until_idle(other, timeout=180)
            assert "Correct" in _main_text(other), _main_text(other)[:800]
        last = [s for title, s in run_times(log) if title == "Practice"][-len(pages):]
        print(f"{len(pages)} visitors press Check at once: all answered in {time.perf_counter() - started:.2f} s "
              f"(server times {', '.join(f'{s:.2f}' for s in sorted(last))} s); peak RSS: server {server.peak:.0f} MB, "
              f"server + sandbox children {tree.peak:.0f} MB")
        for other in pages[1:]:
            other.close()

        _stop(server, tree)
        server, tree = _samplers(proc.pid)
        contained = 0
        corpus = {**REFUSED, **STOPPED}
        for name, code in corpus.items():
            _submit(page, code, "Run")
            text = _main_text(page)
            ok = not page_errors(page) and any(c in text for c in CONTAINED)
            contained += ok
            print(f"  {'contained' if ok else 'NOT CONTAINED'}: {name} ({_last_run(log):.2f} s)")
        with urllib.request.urlopen(base + "/_stcore/health", timeout=10) as r:
            alive = r.status == 200
        _stop(server, tree)
        print(f"attack corpus: {contained}/{len(corpus)} contained; server alive: {alive}; peak RSS: server "
              f"{server.peak:.0f} MB, server + sandbox children {tree.peak:.0f} MB")
        browser.close()
    return 0


def _samplers(pid: int) -> tuple[Sampler, Sampler]:
    """Two running samplers: the server process alone, and the server plus its sandbox children (private pages)."""
    server, tree = Sampler(pid), Sampler(pid)
    server_only = lambda: int(open(f"/proc/{pid}/status").read().split("VmRSS:")[1].split()[0]) / 1024  # noqa: E731
    server.run = lambda: _sample(server, server_only)
    server.start(), tree.start()
    return server, tree


def _stop(*samplers: Sampler) -> None:
    for sampler in samplers:
        sampler.stop.set()
        sampler.join()


def _sample(sampler: Sampler, read) -> None:
    while not sampler.stop.is_set():
        try:
            sampler.peak = max(sampler.peak, read())
        except (OSError, IndexError):
            pass
        time.sleep(sampler.interval)


if __name__ == "__main__":
    raise SystemExit(main())
