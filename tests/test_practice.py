"""Practice problems: the oracles against a Python loop of jax.grad and the seeds' published answers; every
reference solution passes Check; every pitfall's wrong code gets its own diagnosis.

The diagnosis tests run the (trusted) example code in this process, which keeps them fast; the reference solutions
and a few pitfalls also go through the real sandbox (`tests/test_practice_sandbox.py` attacks it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradlab import plots, practice
from gradlab.practice import checker, problems
from gradlab.practice.sandbox import Outcome

SEED = 1234


def _decode(arg):
    if arg["kind"] == "key":
        return jax.random.PRNGKey(arg["value"])
    if arg["kind"] in ("float", "int"):
        return arg["value"]
    return jnp.asarray(np.asarray(arg["value"], dtype=arg["dtype"]))


def in_process(code, fn, cases, **_):
    """The sandbox's contract, executed here (for our own trusted example code only)."""
    namespace: dict = {}
    try:
        exec(compile(code, "<your code>", "exec"), namespace)
    except Exception as err:  # noqa: BLE001
        return Outcome(exec_error={"type": type(err).__name__, "message": str(err), "line": None})
    results = []
    for case in cases:
        try:
            out = namespace[fn](*[_decode(a) for a in case])
            results.append({"leaves": [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(out)], "error": None})
        except Exception as err:  # noqa: BLE001
            results.append({"leaves": None, "error": {"type": type(err).__name__, "message": str(err), "line": None}})
    return Outcome(results=results)


def test_ten_problems_in_course_order_each_complete():
    assert len(practice.PROBLEMS) >= 8
    assert [p.seed for p in practice.PROBLEMS] == sorted(p.seed for p in practice.PROBLEMS[:6]) + ["001"] * 3 + ["003"]
    for p in practice.PROBLEMS:
        assert p.statement and p.starter and p.solution and len(p.hints) >= 2 and p.pitfalls, p.slug
        assert not practice.refusals(p.starter) and not practice.refusals(p.solution), p.slug
        for pitfall in p.pitfalls:
            assert not practice.refusals(pitfall.example), (p.slug, pitfall.name)
    assert len(practice.BY_SLUG) == len(practice.PROBLEMS)


def test_the_seeds_published_answers():
    """Seed 000: `Array([2., 8.])`; seed 002: "Way (a) = 10, way (b) = 10"."""
    np.testing.assert_allclose(practice.BY_SLUG["per_example_grads"].oracle(problems._SCALAR_ARGS)[0], [2.0, 8.0])
    two = practice.BY_SLUG["equivalent_two_ways"]
    np.testing.assert_allclose(two.oracle(two.args)[0], [10.0, 10.0])
    assert practice.BY_SLUG["exercise_256"].args[1].shape == (256, 3)


def _loop_grads(params, X, Y):
    """A Python loop of jax.grad, one example at a time: the oracle's independent witness."""
    loss = lambda p, x, y: (jnp.dot(x, p) - y) ** 2  # noqa: E731
    return np.stack([np.asarray(jax.grad(loss)(jnp.asarray(params), X[i], Y[i])) for i in range(len(X))])


@pytest.mark.parametrize("slug", ["per_example_grads", "exercise_256", "influence_score", "dp_sgd_step"])
def test_oracles_match_a_python_loop_of_jax_grad(slug):
    p = practice.BY_SLUG[slug]
    args = checker.hidden_inputs(p, SEED)[-1]
    if slug == "per_example_grads":
        w, b, x, y = args
        loop = [float(jax.grad(lambda w: (w * xi - yi) ** 2)(w)) for xi, yi in zip(x, y)]
        np.testing.assert_allclose(p.oracle(args)[0], loop, rtol=1e-5)
    elif slug == "exercise_256":
        G = _loop_grads(*args)
        got = p.oracle(args)
        np.testing.assert_allclose(got[0], G, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[1], G.mean(0), rtol=1e-5, atol=1e-5)
    elif slug == "influence_score":
        params, X, Y, xt, yt = args
        G = _loop_grads(params, X, Y)
        gt = _loop_grads(params, xt[None], np.asarray([yt], np.float32))[0]
        np.testing.assert_allclose(p.oracle(args)[0], -(G @ gt), rtol=1e-4, atol=1e-4)
    else:
        params, X, Y, lr, C, sigma, key = args
        G = _loop_grads(params, X, Y)
        clipped = np.stack([g * min(1.0, C / np.linalg.norm(g)) for g in G])
        noise = np.asarray(jax.random.normal(jax.random.PRNGKey(key.seed), params.shape))
        np.testing.assert_allclose(p.oracle(args)[0], params - lr * (clipped.mean(0) + sigma * noise), rtol=1e-5)


def test_hidden_inputs_are_random_per_seed_and_reproducible():
    p = practice.BY_SLUG["per_example_grads"]
    a, b = checker.hidden_inputs(p, 1), checker.hidden_inputs(p, 2)
    assert not np.allclose(a[0][2], b[0][2])
    np.testing.assert_array_equal(a[0][2], checker.hidden_inputs(p, 1)[0][2])


@pytest.mark.parametrize("slug", [p.slug for p in practice.PROBLEMS])
def test_reference_solution_passes_and_starter_does_not(slug):
    p = practice.BY_SLUG[slug]
    v = practice.check(p, p.solution, SEED, execute=in_process)
    assert v.passed, [(c.name, c.message) for c in v.cases]
    assert len(v.cases) >= 2 and not v.diagnoses  # the seed's input and hidden ones
    assert not practice.check(p, p.starter, SEED, execute=in_process).passed


PITFALLS = [(p.slug, pit.name) for p in practice.PROBLEMS for pit in p.pitfalls]


@pytest.mark.parametrize("slug,name", PITFALLS, ids=[f"{s}-{n}" for s, n in PITFALLS])
def test_each_pitfall_gets_its_own_diagnosis(slug, name):
    p = practice.BY_SLUG[slug]
    pitfall = next(x for x in p.pitfalls if x.name == name)
    v = practice.check(p, pitfall.example, SEED, execute=in_process)
    assert not v.passed
    assert [d.name for d in v.diagnoses] == [name], [d.name for d in v.diagnoses]


def test_the_fix_it_starters_show_their_pitfall():
    """A 'fix it' problem's starter code is the seed's mistake: Check names it."""
    for slug, name in [("fix_in_axes", "in_axes"), ("fix_summed_loss", "summed"), ("fix_shape", "shape"),
                       ("fix_mean", "mean_for_sum")]:
        v = practice.check(practice.BY_SLUG[slug], practice.BY_SLUG[slug].starter, SEED, execute=in_process)
        assert [d.name for d in v.diagnoses] == [name], slug


def test_wrong_shape_and_errors_are_explained_in_words():
    p = practice.BY_SLUG["per_example_grads"]
    v = practice.check(p, "import jax.numpy as jnp\ndef per_example_grads(w, b, x, y):\n    return jnp.zeros((3, 3))\n",
                       SEED, execute=in_process)
    assert "shape (3, 3) where shape (2,) is expected" in v.cases[0].message
    v = practice.check(p, "def per_example_grads(w, b, x, y):\n    return 1 / 0\n", SEED, execute=in_process)
    assert v.cases[0].message.startswith("ZeroDivisionError")
    v = practice.check(p, "def other(w):\n    return w\n", SEED, execute=in_process)
    assert not v.passed
    v = practice.check(p, p.starter.replace("print(per_example_grads", "(per_example_grads"), SEED, execute=in_process)
    assert "returned None" in v.cases[0].message  # the starter's body is still `...`


def test_the_exercise_reports_the_mean_check_and_draws_the_students_own_histogram():
    p = practice.BY_SLUG["exercise_256"]
    v = practice.check(p, p.solution, SEED, execute=in_process)
    assert any("Mean check" in n and "equal" in n for n in v.notes)
    fig = practice.figure(p, v)
    # the histogram's bars count the student's own per-example norms (numpy's norms, binned on the figure's edges)
    norms = np.linalg.norm(v.figure_leaves[0], axis=1)
    assert len(norms) == 256
    counts, _ = np.histogram(norms, bins=plots.norm_bins(norms, bins=40))  # the exercise draws 40 bars
    np.testing.assert_array_equal(np.asarray(fig.data[0].y), counts)
    assert sum(fig.data[0].y) == 256


def test_reference_solutions_pass_in_the_real_sandbox():
    """End to end (the child process, the JSON reply, a PRNG key argument, the oracle); every problem: the slow test."""
    for slug in ("dp_sgd_step",):
        p = practice.BY_SLUG[slug]
        v = practice.check(p, p.solution, SEED)
        assert v.passed, (slug, v.outcome.stopped, v.outcome.exec_error, [(c.name, c.message) for c in v.cases])


def test_a_pitfall_is_diagnosed_in_the_real_sandbox():
    p = practice.BY_SLUG["fix_in_axes"]
    v = practice.run(p, p.starter)  # the starter's own print(...) call fails: an error of the code's top level
    assert [d.name for d in v.diagnoses] == ["in_axes"]
    assert "rank should be at least 1" in v.outcome.exec_error["message"] and v.outcome.exec_error["line"] == 10, v.outcome


@pytest.mark.slow
def test_every_reference_passes_in_the_real_sandbox():
    """Every reference solution through the child process (each pitfall's diagnosis is pinned in-process above,
    and one pitfall goes through the sandbox in the quick tests: the diagnosis does not depend on where it ran)."""
    for p in practice.PROBLEMS:
        v = practice.check(p, p.solution, SEED)
        assert v.passed, (p.slug, v.outcome.stopped, v.outcome.exec_error, [(c.name, c.message) for c in v.cases])


def test_each_fix_it_problem_asks_for_its_cause_one_right_each_wrong_one_answered():
    """The problems that ask to explain or fix offer causes: exactly one right, and every choice says why it is (or
    is not) the reason, in its own words. The right cause is the mistake Check diagnoses on the starter."""
    asking = [p for p in practice.PROBLEMS if "explain" in p.statement.lower()]
    assert [p.slug for p in asking] == ["fix_in_axes", "fix_summed_loss", "fix_shape", "fix_mean"]
    assert all(not p.causes for p in practice.PROBLEMS if p not in asking)
    assert len({[c.right for c in p.causes].index(True) for p in asking}) >= 3  # the right one is not always first
    for p in asking:
        assert p.question.endswith("?") and len(p.causes) >= 3, p.slug
        assert sum(c.right for c in p.causes) == 1, p.slug
        assert len({c.why for c in p.causes}) == len({c.text for c in p.causes}) == len(p.causes), p.slug
        assert all(c.why.startswith("Right." if c.right else "No:") for c in p.causes), p.slug
        (diagnosis,) = practice.check(p, p.starter, SEED, execute=in_process).diagnoses
        right = next(c for c in p.causes if c.right)
        shown = {"in_axes": "axis 0", "summed": "sum", "shape": "shape", "mean_for_sum": "mean"}[diagnosis.name]
        assert shown in right.text, (p.slug, diagnosis.name)
