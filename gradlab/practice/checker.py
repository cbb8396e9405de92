"""Run and Check a student's answer to a `Problem`: the code runs in the sandbox; its outputs are compared with
the problem's oracle (computed in this process another way, in float64) on the seed's inputs and hidden random
ones; a wrong answer is matched against the problem's pitfalls to say what went wrong, not only that it did."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import secrets
import textwrap
import threading

import jax
import numpy as np

from gradlab.practice import sandbox
from gradlab.practice.problems import Key, Pitfall, Problem

#: float32 against float64: relative and absolute tolerance (the absolute one scaled by the answer's size).
RTOL, ATOL = 1e-4, 1e-4
#: Hidden inputs come from a seed the server draws: a student cannot read them from the source. This one is the cache
#: fill's (shapes do not depend on it); `check` draws a fresh seed for every Check, so answers read back from one
#: Check's messages build no table for the next (found by a red team: 15 Checks recovered them).
HIDDEN_SEED = secrets.randbits(32)


@dataclasses.dataclass
class Case:
    """One input the code was called on: `name` ("seed 000's input", "hidden input 2"), `passed`, `message`
    (why not), the student's output `got` and the oracle's `expected` (lists of leaves; None when absent)."""

    name: str
    passed: bool
    message: str
    got: list | None = None
    expected: list | None = None


@dataclasses.dataclass
class Verdict:
    """What Run or Check found.

    - `passed`: every case equals the oracle and the problem's `extra` condition holds (Check only means it);
    - `outcome`: the sandbox's `Outcome` (refusals, a stop, the printed output, a top-level error, seconds);
    - `cases`: one `Case` per input; `diagnoses`: the pitfalls recognised (each at most once);
    - `notes`: what the problem adds (a mean check, a timing); `figure_leaves`: the outputs a figure is drawn from.
    """

    passed: bool
    outcome: sandbox.Outcome = dataclasses.field(default_factory=sandbox.Outcome)
    cases: list[Case] = dataclasses.field(default_factory=list)
    diagnoses: list[Pitfall] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    figure_leaves: list | None = None


def encode(arg) -> dict:
    """One argument as the sandbox's JSON: a float, an int, a `Key`, or an array (with its dtype)."""
    if isinstance(arg, Key):
        return {"kind": "key", "value": int(arg.seed)}
    if isinstance(arg, (bool, np.bool_)) or not isinstance(arg, (int, float, np.ndarray, np.generic)):
        raise TypeError(f"cannot pass {type(arg).__name__} to student code")
    if isinstance(arg, (int, np.integer)):
        return {"kind": "int", "value": int(arg)}
    if isinstance(arg, (float, np.floating)):
        return {"kind": "float", "value": float(arg)}
    return {"kind": "array", "value": arg.tolist(), "dtype": str(arg.dtype)}


def hidden_inputs(problem: Problem, seed: int) -> list[tuple]:
    """The hidden random argument tuples of `problem` for `seed` (the same seed gives the same inputs)."""
    return problem.hidden(np.random.default_rng([seed, sum(map(ord, problem.slug))]))


def close(got, expected) -> bool:
    """Whether output leaves `got` equal oracle leaves `expected` (a None oracle leaf is not compared)."""
    if got is None or len(got) != len(expected):
        return False
    for g, e in zip(got, expected):
        if e is None:
            continue
        e = np.asarray(e, np.float64)
        if np.shape(g) != e.shape or not np.all(np.isfinite(g)):
            return False
        if not np.allclose(g, e, rtol=RTOL, atol=ATOL * max(1.0, float(np.max(np.abs(e), initial=0.0)))):
            return False
    return True


def _shape_text(shape) -> str:
    return "a scalar, shape ()" if len(shape) == 0 else f"shape {tuple(shape)}"


def _compare(got, expected) -> str:
    """Why `got` is not `expected`, in one sentence."""
    if not got:
        return "returned None (no numbers): is the `return` missing, or is the body still `...`?"
    if len(got) != len(expected):
        return f"returned {len(got)} array(s); {len(expected)} expected"
    for i, (g, e) in enumerate(zip(got, expected)):
        if e is None:
            continue
        which = f"output {i + 1}: " if len(expected) > 1 else ""
        e = np.asarray(e)
        if np.shape(g) != e.shape:
            return f"{which}{_shape_text(np.shape(g))} where {_shape_text(e.shape)} is expected"
        if not np.all(np.isfinite(g)):
            return f"{which}holds NaN or inf"
        if not close([g], [e]):
            err = float(np.max(np.abs(g - e)))
            return f"{which}the values differ from the oracle's by up to {err:.3g}"
    return "does not match"


def _diagnose(problem: Problem, args: tuple, got, error: dict | None, code: str) -> list[Pitfall]:
    found = []
    for pitfall in problem.pitfalls:
        if pitfall.code is not None and not re.search(pitfall.code, code):
            continue
        if pitfall.error is not None:
            hit = error is not None and re.search(pitfall.error, error["message"]) is not None
        elif pitfall.answers is not None:
            hit = error is None and any(close(got, wrong) for wrong in pitfall.answers(args))
        else:
            hit = error is None and got is not None and pitfall.test(args, got)
        if hit:
            found.append(pitfall)
    replaced = {p.replaces for p in found}
    return [p for p in found if p.name not in replaced]


def run(problem: Problem, code: str, *, limits: sandbox.Limits = sandbox.LIMITS, execute=sandbox.execute) -> Verdict:
    """**Run**: execute `code` and call the problem's function on the seed's input. Returns a `Verdict` whose one
    case compares the output with the oracle (the seed's expected answer), with diagnoses when it differs.
    `execute`: what runs the code (`sandbox.execute`; tests of the diagnoses pass an in-process one)."""
    return _judge(problem, code, [("the seed's input", problem.args)], limits, execute)


def check(problem: Problem, code: str, seed: int | None = None, *, limits: sandbox.Limits = sandbox.LIMITS,
          execute=sandbox.execute) -> Verdict:
    """**Check**: `code`'s function on the seed's input and the hidden random inputs drawn from `seed` (None: a fresh
    one, as the page does for every Check), each compared
    with the problem's oracle (float64, computed another way), and the problem's `extra` condition (a timing).

    **Returns** a `Verdict`: `passed` only when every case passes; `diagnoses` lists the pitfalls the first wrong
    case shows (a summed gradient, a missing `in_axes`, a mean for a sum, a shape (N,) against a scalar, clipping
    after averaging...). Never raises for what the student's code does.
    """
    seed = secrets.randbits(32) if seed is None else seed
    inputs = [("the seed's input", problem.args)]
    inputs += [(f"hidden input {i}", a) for i, a in enumerate(hidden_inputs(problem, seed), start=1)]
    return _judge(problem, code, inputs, limits, execute)


def _judge(problem: Problem, code: str, inputs: list[tuple[str, tuple]], limits: sandbox.Limits, execute) -> Verdict:
    out = execute(code, problem.fn, [[encode(a) for a in args] for _, args in inputs], limits=limits)
    verdict = Verdict(passed=False, outcome=out)
    if out.exec_error is not None:
        verdict.diagnoses = _diagnose(problem, problem.args, None, out.exec_error, code)
    if not out.ran:
        return verdict
    for (name, args), result in zip(inputs, out.results):
        expected = problem.oracle(args)
        got, error = result["leaves"], result["error"]
        if error is not None:
            line = f" (line {error['line']})" if error.get("line") else ""
            case = Case(name, False, f"{error['type']}{line}: {error['message']}", None, expected)
        elif close(got, expected):
            case = Case(name, True, "", got, expected)
        else:
            case = Case(name, False, _compare(got, expected), got, expected)
        if problem.extra is not None and got is not None and case.passed:
            ok, notes = problem.extra(args, got)
            if not ok:
                case.passed, case.message = False, " ".join(notes)
            if not verdict.notes:
                verdict.notes = notes
        if not case.passed and not verdict.diagnoses:
            verdict.diagnoses = _diagnose(problem, args, got, error, code)
        if verdict.figure_leaves is None and got is not None:
            verdict.figure_leaves = got
        verdict.cases.append(case)
    verdict.passed = len(verdict.cases) == len(inputs) and all(c.passed for c in verdict.cases)
    return verdict


def as_file(problem: Problem) -> str:
    """`problem` as a Python file to solve on one's own machine (where a server runs no free-form code): the
    statement, the starter code, and a check on the seed's input against the oracle's answer (computed here in
    float64 and written into the file). Hidden inputs stay on the server. **Returns** the file's text."""
    args = "\n".join(f"    np.asarray({np.asarray(a).tolist()!r}, dtype={str(np.asarray(a).dtype)!r})," if not
                     isinstance(a, Key) else f"    jax.random.PRNGKey({a.seed})," for a in problem.args)
    expected = "\n".join("    None," if e is None else f"    np.asarray({np.asarray(e).tolist()!r})," for e in
                         problem.oracle(problem.args))
    statement = "\n".join("# " + line for line in textwrap.wrap(problem.statement, 110))
    return (f"# gradlab Practice: {problem.title} (seed {problem.seed})\n#\n{statement}\n#\n# Write your answer "
            f"below, then run `python {problem.slug}.py`: it checks your `{problem.fn}` on the seed's input.\n\n"
            f"{problem.starter.rstrip()}\n\n\n# ---- the check (gradlab's oracle, float64) ----\n"
            "import jax\nimport numpy as np\n\nARGS = (\n" + args + "\n)\nEXPECTED = [\n" + expected + "\n]\n\n"
            f"if __name__ == \"__main__\":\n    got = jax.tree_util.tree_leaves({problem.fn}(*ARGS))\n"
            "    ok = len(got) == len(EXPECTED) and all(e is None or (np.shape(g) == np.shape(e) and np.allclose(\n"
            f"        g, e, rtol={RTOL}, atol={ATOL} * max(1.0, float(np.max(np.abs(e), initial=0.0)))))\n"
            "        for g, e in zip(got, EXPECTED))\n"
            "    print(\"Correct on the seed's input.\" if ok else f\"Not yet: got {got}, expected {EXPECTED}\")\n")


def figure(problem: Problem, verdict: Verdict):
    """The problem's figure drawn from the student's own output on the seed's input (a Plotly figure), or None."""
    if problem.figure is None or verdict.figure_leaves is None:
        return None
    return problem.figure(problem.args, verdict.figure_leaves)


_filling: set[str] = set()
_filling_lock = threading.Lock()


def prepare(problem: Problem, seed: int = HIDDEN_SEED) -> None:
    """A visitor opened `problem`: keep a warm child ready for their run (`sandbox.prepare`) and, once per
    compilation cache, compile the problem's reference solution into the children's cache in the background
    (`fill_cache`), while the visitor reads the statement. Returns at once."""
    sandbox.prepare()
    marker = _marker(problem)
    if marker is None or os.path.exists(marker):
        return
    with _filling_lock:
        if problem.slug in _filling:
            return
        _filling.add(problem.slug)
    threading.Thread(target=fill_cache, args=(problem, seed), name=f"practice-cache-{problem.slug}",
                     daemon=True).start()


def fill_cache(problem: Problem, seed: int = HIDDEN_SEED) -> bool:
    """Check `problem`'s reference solution (the seed's input and the hidden ones, whose shapes do not depend on
    `seed`) in a child that keeps the server's user, so what it compiles lands in the children's compilation cache
    (`sandbox.XLA_CACHE`): a student's Check then loads most of what it would compile. The server's own code only;
    it waits its turn between students' runs. **Returns** whether the reference passed (then the cache is marked
    filled for it)."""
    try:
        as_server = functools.partial(sandbox.execute, as_server=True)
        passed = check(problem, problem.solution, seed, execute=as_server).passed
        marker = _marker(problem)
        if passed and marker:
            open(marker, "w").close()
        return passed
    finally:
        with _filling_lock:
            _filling.discard(problem.slug)


def _marker(problem: Problem) -> str | None:
    """The file saying the cache holds `problem`'s reference for this JAX (None: no cache)."""
    cache = sandbox.cache_dir()
    if cache is None:
        return None
    digest = hashlib.sha256(problem.solution.encode()).hexdigest()[:12]
    return os.path.join(cache, f"gradlab-filled-{problem.slug}-{digest}-jax{jax.__version__}")
