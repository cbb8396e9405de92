"""No test asserts how fast something ran (issue 42): a timing compared against a bound passes or fails with the
machine's load (a loop/vmap ratio floor of 3 read 2.9 at load 15). Speed claims are benchmark lines
(benchmarks/RESULTS.md); tests assert what load cannot move.

The check reads every test file's syntax tree. A *timing* is a clock read (`time.perf_counter()`, `monotonic()`,
`time()`, `process_time()`, `timeit`, their `_ns` forms), a measured duration of gradlab's benchmarks (`.run_s`,
`.first_s`, `.compile_s`, `.seconds`, `.wall_s`, `.elapsed`), or a name assigned from an expression holding one
(followed through assignments, loops and comprehensions). A *timed assertion* is an `assert` that orders a timing
(`<`, `<=`, `>`, `>=`), or one that asserts a wait with a deadline under `DEADLINE_S` (`assert done.wait(5)`: a
liveness check whose deadline a loaded machine can miss). Equality with a scripted clock (tests/test_bench.py) is
allowed: it is not measured.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time",
          "process_time_ns", "thread_time", "timeit", "default_timer"}
DURATIONS = {"run_s", "first_s", "compile_s", "seconds", "wall_s", "elapsed", "elapsed_s"}
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
#: A wait asserted with a deadline this long or longer is a liveness check a loaded machine still meets.
DEADLINE_S = 30
#: Files with timed assertions someone else must remove first, and how many (none: the Practice sandbox's endless-loop
#: test asserted its wall time until issue 38's rewrite). Nothing may be added here.
NOT_OURS: dict[str, int] = {}


def _is_clock(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):  # time.perf_counter(), timeit.default_timer()
        return f.attr in CLOCKS and isinstance(f.value, ast.Name) and f.value.id in {"time", "timeit", "_time"}
    return isinstance(f, ast.Name) and f.id in CLOCKS - {"time"}  # from time import perf_counter


def _timed(node: ast.AST, names: set) -> bool:
    for n in ast.walk(node):
        if _is_clock(n) or (isinstance(n, ast.Attribute) and n.attr in DURATIONS):
            return True
        if isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load):
            return True
    return False


def _targets(node: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]


def _timed_names(fn: ast.AST) -> set:
    """Names assigned, in this scope, from an expression holding a timing (to a fixpoint)."""
    names: set = set()
    while True:
        before = len(names)
        for n in ast.walk(fn):
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None:
                if _timed(n.value, names):
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                        names.update(_targets(t))
            elif isinstance(n, (ast.For, ast.comprehension)) and _timed(n.iter, names):
                names.update(_targets(n.target))
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in {"append", "extend",
                                                                                                    "add"}:
                if any(_timed(a, names) for a in n.args) and isinstance(n.func.value, ast.Name):
                    names.add(n.func.value.id)  # seconds.append(perf_counter() - start)
        if len(names) == before:
            return names


def _short_wait(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in {"wait", "join"}
                and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, (int, float))
                and n.args[0].value < DEADLINE_S):
            return True
    return False


def timed_assertions(source: str) -> list[tuple[int, str]]:
    """`(line, what)` for every timed assertion in a module's source."""
    tree = ast.parse(source)
    found = []
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    # each outermost function (with the functions nested in it) is one scope of names; module-level code another
    scopes = [n for n in tree.body if isinstance(n, funcs)]
    scopes += [n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body if isinstance(n, funcs)]
    scopes.append(ast.Module(body=[n for n in tree.body if not isinstance(n, (*funcs, ast.ClassDef))], type_ignores=[]))
    seen = set()
    for scope in scopes:
        names = _timed_names(scope)
        for n in ast.walk(scope):
            if not isinstance(n, ast.Assert) or n.lineno in seen:
                continue
            ordered = [c for c in ast.walk(n.test) if isinstance(c, ast.Compare)
                       and any(isinstance(op, ORDER) for op in c.ops)
                       and any(_timed(side, names) for side in [c.left, *c.comparators])]
            if ordered:
                seen.add(n.lineno)
                found.append((n.lineno, "orders a timing"))
            elif _short_wait(n.test):
                seen.add(n.lineno)
                found.append((n.lineno, f"asserts a wait with a deadline under {DEADLINE_S} s"))
    return sorted(found)


def test_the_detector_finds_timed_assertions_and_passes_the_rest():
    bad = """
import time
def test_a():
    start = time.perf_counter()
    run()
    elapsed = time.perf_counter() - start
    assert elapsed < 60
def test_b(rows):
    t = {r.approach: r.run_s for r in rows}
    assert t["loop"] / t["vmap"] > 3
def test_c(done):
    assert done.wait(5)
def test_d():
    seconds = []
    for _ in range(3):
        s = time.monotonic()
        seconds.append(time.monotonic() - s)
    assert max(seconds) <= 1.0
"""
    good = """
import time
def test_e(t):
    assert (t.first_s, t.run_s) == (5.0, 2.0)   # a scripted clock: equality, not a bound
def test_f(done, costs):
    assert done.wait(60) and costs.dp_sgd_seconds(1, 2, 3) <= costs.WORK_BUDGET_SECONDS
def test_g():
    deadline = time.time() + 30
    while busy() and time.time() < deadline:
        time.sleep(0.2)
    assert not busy()
"""
    assert [line for line, _ in timed_assertions(bad)] == [7, 10, 12, 18]
    assert timed_assertions(good) == []


def test_no_test_asserts_a_timing():
    found = {}
    for path in sorted(TESTS.glob("test_*.py")):
        hits = timed_assertions(path.read_text())
        if hits and NOT_OURS.get(path.name) != len(hits):
            found[path.name] = hits
    assert found == {}, f"timed assertions (make them benchmark lines, or assert what load cannot move): {found}"
