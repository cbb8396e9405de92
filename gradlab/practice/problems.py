"""The Practice problems, in course order, from the seeds (`../shared/seeds/`): each with its statement, starter code,
reference solution, hints, the seed's inputs, hidden random inputs, an oracle computed another way (closed-form
gradients in NumPy float64, never `vmap`), and the seeds' pitfalls, each with the wrong code that shows it.

The loss everywhere is a squared error, so every gradient has a closed form the oracle writes out:

- seed 000: ℓ(w; x, y) = (w·x − y)², so ∂ℓ/∂w = 2(w·x − y)·x per example (expected [2., 8.]);
- seed 002: ℓ(w; x) = (w·x)², so Σᵢ ∂ℓᵢ/∂w = Σᵢ 2w·xᵢ² both ways (expected [10., 10.]);
- seed 001: ℓ(θ; x, y) = (x·θ − y)², so gᵢ = 2(xᵢ·θ − yᵢ)·xᵢ, a row of the (N, D) matrix G; DP-SGD (Abadi et al.
  2016, Algorithm 1) clips each row to norm C before the mean; the influence score is −G·∇ℓ(test) (a first-order
  influence with the identity for the Hessian, Koh & Liang 2017, or TracIn's one-checkpoint form, Pruthi et al. 2020).
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Callable

import jax
import numpy as np
import plotly.graph_objects as go

from gradlab import plots


@dataclasses.dataclass(frozen=True)
class Key:
    """An argument that is `jax.random.PRNGKey(seed)` (built in the child)."""

    seed: int


@dataclasses.dataclass(frozen=True)
class Pitfall:
    """A known wrong answer and what it teaches.

    - `answers(args)`: the outputs (each a list of leaves) this mistake returns on `args`; or
    - `error`: text the error message of this mistake contains (a regular expression); or
    - `test(args, leaves)`: whether the output shows this mistake (what no single wrong answer pins, e.g. a timing).
    - `example`: code that makes the mistake (the tests run it and expect this diagnosis).
    - `code`: a regular expression the student's code must also match: it tells apart two mistakes with the same
      answer (a sum before differentiating, or after); `replaces`: the name of the pitfall it then stands for.
    """

    name: str
    title: str
    explain: str
    example: str
    answers: Callable[[tuple], list[list[np.ndarray]]] | None = None
    error: str | None = None
    test: Callable[[tuple, list], bool] | None = None
    code: str | None = None
    replaces: str | None = None


@dataclasses.dataclass(frozen=True)
class Cause:
    """One answer to a "fix it" problem's question (why is the starter wrong?): its `text`, whether it is `right`,
    and `why`: what the student reads after choosing it (a wrong cause says why it is not the reason)."""

    text: str
    why: str
    right: bool = False


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem: `fn` is the function the student writes; `oracle(args)` its answer as a list of leaves (float64;
    None for a leaf that is not compared, such as a measured time); `hidden(rng)` a few random argument tuples;
    `extra(args, leaves)` returns (passed, notes) for what an oracle cannot say (a timing); `figure(args, leaves)`
    a Plotly figure of the student's own output. A "fix it" problem also asks `question` (why is the starter
    wrong?), answered by choosing among `causes` (one right): explaining the mistake solves it as fixing it does."""

    slug: str
    title: str
    seed: str
    statement: str
    starter: str
    solution: str
    hints: tuple[str, ...]
    fn: str
    args: tuple
    oracle: Callable[[tuple], list]
    hidden: Callable[[np.random.Generator], list[tuple]]
    pitfalls: tuple[Pitfall, ...] = ()
    expected: str = ""
    extra: Callable[[tuple, list], tuple[bool, list[str]]] | None = None
    figure: Callable[[tuple, list], go.Figure | None] | None = None
    question: str = ""
    causes: tuple[Cause, ...] = ()


def _code(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


def _f32(a) -> np.ndarray:
    return np.asarray(a, np.float32)


def _f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


# ---------------------------------------------------------------- seed 000: per-example gradients of a scalar model

def _scalar_grads(args) -> np.ndarray:
    w, _, x, y = args
    return 2 * (w * _f64(x) - _f64(y)) * _f64(x)


def _scalar_hidden(rng):
    return [(float(rng.normal()), float(rng.normal()), _f32(rng.normal(size=n)), _f32(rng.normal(size=n)))
            for n in (2, 5)]  # the seed's N again (no new compilation) and another N


SUMMED = Pitfall(
    "summed", "A summed gradient instead of per-example ones",
    "Your answer is **one number, the sum of the per-example gradients**: `grad` of the batch's summed loss. "
    "The sum collapses the batch before differentiating, so each example's gradient is lost (seed 000's second "
    "pitfall). Write the loss of **one** example, take `jax.grad` of it, and `jax.vmap` that over the batch.",
    _code("""
        import jax, jax.numpy as jnp

        def per_example_grads(w, b, x_batch, y_batch):
            return jax.grad(lambda w: jnp.sum((w * x_batch - y_batch) ** 2))(w)
    """),
    answers=lambda a: [[_scalar_grads(a).sum()]])
MEAN = Pitfall(
    "mean", "The mean gradient instead of per-example ones",
    "Your answer is **one number, the mean of the per-example gradients** (`grad` of the mean loss): the batch was "
    "averaged before differentiating. Return one gradient per example, shape (N,).",
    _code("""
        import jax, jax.numpy as jnp

        def per_example_grads(w, b, x_batch, y_batch):
            return jax.grad(lambda w: jnp.mean((w * x_batch - y_batch) ** 2))(w)
    """),
    answers=lambda a: [[_scalar_grads(a).mean()]])
SUMMED_AFTER = Pitfall(
    "summed_after", "Per-example gradients, then summed",
    "Your answer is **one number, the sum of the per-example gradients**. You did compute them, with "
    "`vmap(grad(…))`, and then summed them (`.sum()`): the batch collapsed *after* differentiating. Drop the sum and "
    "return the (N,) array `vmap` gives: one gradient per example.",
    _code("""
        import jax

        def per_example_loss(w, b, x, y):
            return (w * x - y) ** 2

        def per_example_grads(w, b, x_batch, y_batch):
            return jax.vmap(jax.grad(per_example_loss), in_axes=(None, None, 0, 0))(w, b, x_batch, y_batch).sum()
    """),
    answers=lambda a: [[_scalar_grads(a).sum()]], code=r"vmap\(\s*(jax\.)?grad\b[\s\S]*(\.sum\(|\bsum\()",
    replaces="summed")
UNMAPPED = Pitfall(
    "unmapped_batch", "An `in_axes` that leaves a batch argument unmapped",
    "JAX said *Gradient only defined for scalar-output functions*: inside `vmap`, the loss of one example came out "
    "with shape (N,). An argument that carries the batch was not mapped: its `in_axes` entry is `None`, so the whole "
    "batch reached every call. Map every batch argument with `0`, the scalars with `None`: "
    "`in_axes=(None, None, 0, 0)` for `(w, b, x_batch, y_batch)`.",
    _code("""
        import jax

        def per_example_loss(w, b, x, y):
            return (w * x - y) ** 2

        def per_example_grads(w, b, x_batch, y_batch):
            return jax.vmap(jax.grad(per_example_loss), in_axes=(None, None, 0, None))(w, b, x_batch, y_batch)
    """),
    error=r"Gradient only defined for scalar-output functions")
IN_AXES = Pitfall(
    "in_axes", "`vmap` without `in_axes`: JAX's rank error explained",
    "JAX said *vmap was requested to map its argument along axis 0, which implies that its rank should be at least "
    "1, but is only 0*. By default `vmap` maps axis 0 of **every** argument, and `w` and `b` are scalars: they have "
    "no axis 0. Tell `vmap` which arguments carry the batch: `in_axes=(None, None, 0, 0)` (`None` broadcasts "
    "`w` and `b` to every example, `0` maps over the examples of `x_batch` and `y_batch`). Seed 000's first pitfall.",
    _code("""
        import jax

        def per_example_loss(w, b, x, y):
            return (w * x - y) ** 2

        def per_example_grads(w, b, x_batch, y_batch):
            return jax.vmap(jax.grad(per_example_loss))(w, b, x_batch, y_batch)
    """),
    error=r"vmap was requested to map its argument along axis 0")

_SCALAR_SOLUTION = _code("""
    import jax

    def per_example_loss(w, b, x, y):
        return (w * x - y) ** 2          # the loss of ONE example: a scalar

    def per_example_grads(w, b, x_batch, y_batch):
        grad_fn = jax.grad(per_example_loss, argnums=0)                   # d loss / d w for one example
        return jax.vmap(grad_fn, in_axes=(None, None, 0, 0))(w, b, x_batch, y_batch)   # shape (N,)
""")
_SCALAR_ARGS = (1.0, 0.0, _f32([1.0, 2.0]), _f32([0.0, 0.0]))
_SCALAR_STATEMENT = (
    "Implement `per_example_grads(w, b, x_batch, y_batch)`: a 1-D array of shape (N,), the gradient of "
    "(w·x − y)² with respect to `w` for **each** example. Do not sum or average. `w`, `b`: scalars (`b` is unused, "
    "kept for the signature); `x_batch`, `y_batch`: shape (N,). With `w, b = 1.0, 0.0`, `x_batch = [1., 2.]`, "
    "`y_batch = [0., 0.]` the answer is `[2., 8.]` (2·(w·x − y)·x per example).")

PER_EXAMPLE = Problem(
    "per_example_grads", "Per-example gradients with vmap(grad)", "000",
    _SCALAR_STATEMENT,
    _code("""
        import jax
        import jax.numpy as jnp

        def per_example_loss(w, b, x, y):
            return (w * x - y) ** 2          # the loss of ONE example

        def per_example_grads(w, b, x_batch, y_batch):
            # TODO: one gradient per example, shape (N,)
            ...

        print(per_example_grads(1.0, 0.0, jnp.array([1.0, 2.0]), jnp.array([0.0, 0.0])))
    """),
    _SCALAR_SOLUTION,
    ("Start from the loss of one example: `jax.grad(per_example_loss, argnums=0)` gives d loss / d w for one "
     "(x, y).",
     "`jax.vmap` turns that one-example function into a batch function: it maps axis 0 of the arguments you name.",
     "`w` and `b` are the same for every example: `in_axes=(None, None, 0, 0)`."),
    "per_example_grads", _SCALAR_ARGS, lambda a: [_scalar_grads(a)], _scalar_hidden,
    (SUMMED, SUMMED_AFTER, MEAN, IN_AXES, UNMAPPED),
    expected="[2., 8.]")

FIX_IN_AXES = dataclasses.replace(
    PER_EXAMPLE, slug="fix_in_axes", title="Fix it: the missing in_axes",
    statement="This code should return the per-example gradients of seed 000 (`[2., 8.]`), but it fails. **Run** "
              "it and read JAX's error. Explain it (choose its cause below) or fix it. " + _SCALAR_STATEMENT.split(". ", 1)[1],
    starter=_code("""
        import jax
        import jax.numpy as jnp

        def per_example_loss(w, b, x, y):
            return (w * x - y) ** 2

        def per_example_grads(w, b, x_batch, y_batch):
            grad_fn = jax.grad(per_example_loss, argnums=0)
            # Why does JAX complain about "rank ... at least 1, but is only 0"?
            return jax.vmap(grad_fn)(w, b, x_batch, y_batch)

        print(per_example_grads(1.0, 0.0, jnp.array([1.0, 2.0]), jnp.array([0.0, 0.0])))
    """),
    hints=("Which arguments have an axis 0? `w` and `b` are Python floats: rank 0.",
           "By default `vmap` maps axis 0 of every argument. `in_axes` says, per argument, which axis to map, or "
           "`None` for 'the same for every example'.",
           "`jax.vmap(grad_fn, in_axes=(None, None, 0, 0))`."),
    pitfalls=(IN_AXES, UNMAPPED, SUMMED, SUMMED_AFTER, MEAN),
    question="Why does JAX say the rank \"should be at least 1, but is only 0\"?",
    causes=(
        Cause("`x_batch` and `y_batch` must be 2-D, shape (N, 1), for `vmap` to map them.",
              "No: `vmap` maps axis 0 of a 1-D array; each example is then a scalar, what `per_example_loss` expects. "
              "The arguments of rank 0 are `w` and `b`."),
        Cause("`per_example_loss` returns a vector, and `grad` needs a scalar.",
              "No: for one example, (w·x − y)² is a scalar. That mistake reads \"Gradient only defined for "
              "scalar-output functions\"; this error is about `vmap`'s axis 0."),
        Cause("`vmap` maps axis 0 of every argument by default, and `w` and `b` are scalars: they have no axis 0.",
              "Right. `w` and `b` are the same for every example: `in_axes=(None, None, 0, 0)` broadcasts them and "
              "maps the examples of `x_batch` and `y_batch`.", right=True),
        Cause("`jax.grad` cannot differentiate with respect to a Python float: `w` must be a `jnp.array`.",
              "No: `grad` differentiates with respect to a Python float (seed 000 passes `w = 1.0`). The error comes "
              "from `vmap`, about an argument of rank 0."),
    ))

FIX_SUMMED = dataclasses.replace(
    PER_EXAMPLE, slug="fix_summed_loss", title="Fix it: grad of the summed loss",
    statement="This code runs, but returns one number where seed 000 asks for one gradient per example "
              "(`[2., 8.]`). **Check** it and read the diagnosis; explain why the sum loses the examples (choose "
              "the cause below) or fix it. " + _SCALAR_STATEMENT.split(". ", 1)[1],
    starter=_code("""
        import jax
        import jax.numpy as jnp

        def sum_loss(w, x_batch, y_batch):
            return jnp.sum((w * x_batch - y_batch) ** 2)

        def per_example_grads(w, b, x_batch, y_batch):
            # One number comes back. Where did the examples go?
            return jax.grad(sum_loss)(w, x_batch, y_batch)

        print(per_example_grads(1.0, 0.0, jnp.array([1.0, 2.0]), jnp.array([0.0, 0.0])))
    """),
    hints=("`jax.grad` of the summed loss is the gradient of ONE number: the sum of every example's gradient "
           "(10 here = 2 + 8).",
           "Write the loss of one example, differentiate it, and map it over the batch.",
           "`jax.vmap(jax.grad(per_example_loss), in_axes=(None, None, 0, 0))`."),
    pitfalls=(SUMMED, SUMMED_AFTER, MEAN, IN_AXES, UNMAPPED),
    question="Why does one number (10) come back instead of one gradient per example?",
    causes=(
        Cause("`jax.grad` needs `argnums=0` to return one gradient per example.",
              "No: `argnums` picks which argument to differentiate (`w`, argument 0, is the default); it never "
              "splits the batch."),
        Cause("`grad` of the summed loss differentiates one number, the total: its gradient is the sum of the "
              "per-example gradients (2 + 8 = 10).",
              "Right. The sum collapses the batch before differentiating. Differentiate the loss of ONE example and "
              "map that over the batch: `vmap(grad(per_example_loss), in_axes=(None, None, 0, 0))`.", right=True),
        Cause("`jnp.sum` is not differentiable, so JAX returns the gradient of the last example only.",
              "No: a sum is linear and differentiable, and 10 is neither example's gradient (2 or 8): it is their "
              "sum."),
        Cause("The batch should be averaged with `jnp.mean`, not summed.",
              "No: the mean gives one number too (5 = 10 / 2). Any reduction of the batch before `grad` loses the "
              "examples."),
    ))


# ---------------------------------------------------------------- seed 002: two ways to the batch gradient

def _two_ways(args) -> np.ndarray:
    w, x = args
    total = np.sum(2 * w * _f64(x) ** 2)
    return np.array([total, total])


def _two_ways_hidden(rng):
    return [(float(rng.normal()), _f32(rng.normal(size=n))) for n in (2, 5)]


_TWO_WAYS_STATEMENT = (
    "Implement `equivalent_two_ways(w, x_batch)` for `per_example_loss(w, x) = (w * x) ** 2`: way (a) is "
    "`vmap(grad(per_example_loss))(w, x_batch).sum()` (per-example gradients, then their sum); way (b) is "
    "`grad(lambda w: vmap(per_example_loss)(w, x_batch).sum())(w)` (the summed loss, differentiated once). Return "
    "`jnp.array([way_a, way_b])`, shape (2,). With `w = 1.0`, `x_batch = [1., 2.]` both are 10 (linearity of the "
    "derivative): `[10., 10.]`.")

SHAPE = Pitfall(
    "shape", "A shape (N,) next to a scalar",
    "JAX could not put way (a) and way (b) in one array because they have **different shapes**: "
    "`vmap(grad(f))(w, x_batch)` is shape (N,), one gradient per example, while way (b) is a scalar, shape (). "
    "Call `.sum()` on the per-example gradients before comparing them with way (b) (seed 002's first pitfall).",
    _code("""
        import jax, jax.numpy as jnp

        def per_example_loss(w, x):
            return (w * x) ** 2

        def equivalent_two_ways(w, x_batch):
            way_a = jax.vmap(jax.grad(per_example_loss), in_axes=(None, 0))(w, x_batch)
            way_b = jax.grad(lambda w: jax.vmap(per_example_loss, in_axes=(None, 0))(w, x_batch).sum())(w)
            return jnp.array([way_a, way_b])
    """),
    error=r"(Cannot (concatenate|stack) arrays with different numbers of dimensions|setting an array element with a "
          r"sequence|inhomogeneous)")
NOT_SCALAR = Pitfall(
    "not_scalar", "grad of a function that returns shape (N,)",
    "JAX said *Gradient only defined for scalar-output functions*: inside way (b), `vmap(per_example_loss)(w, "
    "x_batch)` is shape (N,), one loss per example. `grad` needs one number: `.sum()` the losses inside the lambda, "
    "then `grad` returns a scalar (and needs no second `.sum()`).",
    _code("""
        import jax, jax.numpy as jnp

        def per_example_loss(w, x):
            return (w * x) ** 2

        def equivalent_two_ways(w, x_batch):
            way_a = jax.vmap(jax.grad(per_example_loss), in_axes=(None, 0))(w, x_batch).sum()
            way_b = jax.grad(lambda w: jax.vmap(per_example_loss, in_axes=(None, 0))(w, x_batch))(w)
            return jnp.array([way_a, way_b])
    """),
    error=r"Gradient only defined for scalar-output functions")


def _mean_answers(args):
    (total, _), n = _two_ways(args), len(args[1])
    return [[np.array([total, total / n])], [np.array([total / n, total])], [np.array([total / n, total / n])]]


MEAN_FOR_SUM = Pitfall(
    "mean_for_sum", "A mean where a sum was asked",
    "One of your ways (or both) is **N times too small**: it averages where the problem sums. The two ways agree "
    "only when both reduce the batch the same way, and this problem asks for sums: `.sum()`, not `.mean()`.",
    _code("""
        import jax, jax.numpy as jnp

        def per_example_loss(w, x):
            return (w * x) ** 2

        def equivalent_two_ways(w, x_batch):
            way_a = jax.vmap(jax.grad(per_example_loss), in_axes=(None, 0))(w, x_batch).sum()
            way_b = jax.grad(lambda w: jax.vmap(per_example_loss, in_axes=(None, 0))(w, x_batch).mean())(w)
            return jnp.array([way_a, way_b])
    """),
    answers=_mean_answers)

TWO_WAYS = Problem(
    "equivalent_two_ways", "vmap(grad) summed equals grad of the sum", "002",
    _TWO_WAYS_STATEMENT,
    _code("""
        import jax
        import jax.numpy as jnp

        def per_example_loss(w, x):
            return (w * x) ** 2

        def equivalent_two_ways(w, x_batch):
            way_a = ...   # TODO: per-example gradients with vmap(grad), then .sum()
            way_b = ...   # TODO: grad of the summed vmapped loss
            return jnp.array([way_a, way_b])

        print(equivalent_two_ways(1.0, jnp.array([1.0, 2.0])))
    """),
    _code("""
        import jax
        import jax.numpy as jnp

        def per_example_loss(w, x):
            return (w * x) ** 2

        def equivalent_two_ways(w, x_batch):
            per_grads = jax.vmap(jax.grad(per_example_loss), in_axes=(None, 0))(w, x_batch)   # shape (N,)
            way_a = per_grads.sum()                                                            # scalar
            way_b = jax.grad(lambda w: jax.vmap(per_example_loss, in_axes=(None, 0))(w, x_batch).sum())(w)
            return jnp.array([way_a, way_b])
    """),
    ("Way (a): `jax.vmap(jax.grad(per_example_loss), in_axes=(None, 0))(w, x_batch)` is shape (N,). Sum it.",
     "Way (b): inside a `lambda w: ...`, vmap the loss over the batch and `.sum()` it, then `jax.grad` the lambda.",
     "Way (b) is already a scalar: no second `.sum()` is needed. Both ways must sum (not average)."),
    "equivalent_two_ways", (1.0, _f32([1.0, 2.0])), lambda a: [_two_ways(a)], _two_ways_hidden,
    (SHAPE, NOT_SCALAR, MEAN_FOR_SUM), expected="[10., 10.]")

FIX_SHAPE = dataclasses.replace(
    TWO_WAYS, slug="fix_shape", title="Fix it: a shape (N,) next to a scalar",
    statement="This code should return `[10., 10.]` (seed 002) but JAX refuses to build the array. **Run** it, "
              "read the error, print the shapes of `way_a` and `way_b`; explain the mismatch (choose its cause "
              "below) or fix it. " + _TWO_WAYS_STATEMENT,
    starter=_code("""
        import jax
        import jax.numpy as jnp

        def per_example_loss(w, x):
            return (w * x) ** 2

        def equivalent_two_ways(w, x_batch):
            way_a = jax.vmap(jax.grad(per_example_loss), in_axes=(None, 0))(w, x_batch)
            way_b = jax.grad(lambda w: jax.vmap(per_example_loss, in_axes=(None, 0))(w, x_batch).sum())(w)
            return jnp.array([way_a, way_b])     # why does this fail?

        print(equivalent_two_ways(1.0, jnp.array([1.0, 2.0])))
    """),
    hints=("`print(way_a.shape, way_b.shape)` before the return.",
           "`vmap(grad(f))` returns one gradient per example: shape (N,). Way (b) is one number: shape ().",
           "`way_a = ... .sum()`."),
    pitfalls=(SHAPE, NOT_SCALAR, MEAN_FOR_SUM),
    question="Why can't JAX build `jnp.array([way_a, way_b])`?",
    causes=(
        Cause("`way_a` and `way_b` hold different values, so they cannot go in one array.",
              "No: arrays of different values stack fine. It is their shapes that differ: print `way_a.shape` and "
              "`way_b.shape`."),
        Cause("`jax.grad` returns a tuple, and a tuple cannot go in an array.",
              "No: with one differentiated argument, `grad` returns an array of that argument's shape: a scalar "
              "here, like `w`."),
        Cause("`vmap` may not be used inside `grad`: way (b) fails.",
              "No: JAX's transformations compose in any order; way (b) alone runs and returns 10. The trouble is "
              "way (a)'s shape."),
        Cause("`way_a` holds the per-example gradients, shape (N,), while `way_b` is one number, shape (): the "
              "two have different shapes.",
              "Right. Sum the per-example gradients first (`way_a = ... .sum()`): then both are scalars, and "
              "`jnp.array([way_a, way_b])` is shape (2,).", right=True),
    ))

FIX_MEAN = dataclasses.replace(
    TWO_WAYS, slug="fix_mean", title="Fix it: the two ways disagree",
    statement="This code returns `[10., 5.]`: the two ways disagree, yet seed 002 proves they are equal for any "
              "loss. **Check** it; explain why they differ here (choose the cause below) or fix it. " + _TWO_WAYS_STATEMENT,
    starter=_code("""
        import jax
        import jax.numpy as jnp

        def per_example_loss(w, x):
            return (w * x) ** 2

        def equivalent_two_ways(w, x_batch):
            way_a = jax.vmap(jax.grad(per_example_loss), in_axes=(None, 0))(w, x_batch).sum()
            way_b = jax.grad(lambda w: jax.vmap(per_example_loss, in_axes=(None, 0))(w, x_batch).mean())(w)
            return jnp.array([way_a, way_b])     # [10., 5.]: why?

        print(equivalent_two_ways(1.0, jnp.array([1.0, 2.0])))
    """),
    hints=("10 / 5 = 2 = N. What is N times smaller than a sum?",
           "The linearity argument needs the same reduction on both sides.",
           "The problem asks for sums: `.sum()` in way (b)."),
    pitfalls=(MEAN_FOR_SUM, SHAPE, NOT_SCALAR),
    question="Why do the two ways give 10 and 5?",
    causes=(
        Cause("Way (a) counts each example twice.",
              "No: way (a) is 2 + 8 = 10, each example once: the sum asked for. Way (b) is off: `.mean()` divides by "
              "N."),
        Cause("Way (b) averages the losses (`.mean()`) while way (a) sums the gradients: the mean is N = 2 times "
              "smaller.",
              "Right. Both ways must reduce the batch the same way; the problem asks for sums, so `.sum()` in way "
              "(b). With `.mean()` in both they would agree too, at 5.", right=True),
        Cause("The two ways agree only approximately: float32 rounding.",
              "No: rounding moves the 7th significant digit, not a factor of 2. And 10 / 5 = 2 = N."),
        Cause("`vmap` and `grad` do not commute: differentiating first and summing first give different answers.",
              "No: they agree for any loss, by the linearity of the derivative (seed 002). Here the two ways reduce "
              "differently, a sum and a mean."),
    ))


# ---------------------------------------------------------------- seed 001: a linear model, (N, D) gradients

def _linear_grads(params, X, Y) -> np.ndarray:
    """G, shape (N, D): row i is ∇θ (xᵢ·θ − yᵢ)² = 2(xᵢ·θ − yᵢ)·xᵢ, in float64."""
    X = _f64(X)
    return 2 * (X @ _f64(params) - _f64(Y))[:, None] * X


def _linear_data(rng, n: int, d: int = 3):
    return _f32(rng.normal(size=d)), _f32(rng.normal(size=(n, d))), _f32(rng.normal(size=n))


_LINEAR_LOSS = """
        def loss_one(params, x, y):
            '''The loss of ONE example: x shape (D,), y a scalar, params shape (D,).'''
            pred = jnp.dot(x, params)
            return (pred - y) ** 2
"""
#: Seed 001's exercise at N = 256, with its `params = [1., 2., 3.]` and standard normal X and y.
_SEED_001 = (_f32([1.0, 2.0, 3.0]), *_linear_data(np.random.default_rng(1), 256)[1:])


def _exercise(args):
    G = _linear_grads(*args)
    return [G, G.mean(0)]


def _norm_histogram(args, leaves):
    if not leaves or np.ndim(leaves[0]) != 2:
        return None
    fig = plots.norm_histogram(np.linalg.norm(leaves[0], axis=1), bins=40)
    fig.update_layout(title=f"Your per-example gradient norms (N = {len(leaves[0])})")
    return fig


def _mean_check(args, leaves):
    if len(leaves) != 2 or np.ndim(leaves[0]) != 2 or np.shape(leaves[1]) != np.shape(leaves[0])[1:]:
        return True, []
    gap = float(np.max(np.abs(leaves[0].mean(0) - leaves[1])))
    ok = gap <= 1e-4 * max(1.0, float(np.max(np.abs(leaves[1]))))
    return True, [f"Mean check: the mean of your {len(leaves[0])} per-example gradients and your batch gradient "
                  f"differ by at most {gap:.2g} ({'equal up to float32 rounding' if ok else 'NOT equal'})."]


PER_EXAMPLE_SUMMED = Pitfall(
    "summed_rows", "A batch gradient where the (N, D) per-example gradients were asked",
    "Your first output is **one gradient of shape (D,)**, not a matrix of shape (N, D): the batch was reduced (summed "
    "or averaged) before differentiating, so the examples are gone. `jax.vmap(jax.grad(loss_one), in_axes=(None, 0, "
    "0))` gives one row per example.",
    _code("""
        import jax, jax.numpy as jnp

        def loss_one(params, x, y):
            return (jnp.dot(x, params) - y) ** 2

        def exercise(params, X, Y):
            batch = jax.grad(lambda p: jnp.mean((X @ p - Y) ** 2))(params)
            return batch, batch
    """),
    answers=lambda a: [[_exercise(a)[1], _exercise(a)[1]], [_exercise(a)[0].sum(0), _exercise(a)[1]]])
SUM_FOR_MEAN = Pitfall(
    "sum_for_mean", "A sum where the mean was asked",
    "Your batch gradient is **N times too large**: it is the gradient of the summed loss, while seed 001's "
    "`batch_loss` takes the **mean** (`jnp.mean`). Then `per_grads.mean(0)` equals it; with a sum, `per_grads.sum(0)` "
    "would.",
    _code("""
        import jax, jax.numpy as jnp

        def loss_one(params, x, y):
            return (jnp.dot(x, params) - y) ** 2

        def exercise(params, X, Y):
            per_grads = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, X, Y)
            batch_grad = jax.grad(lambda p: jnp.sum((X @ p - Y) ** 2))(params)
            return per_grads, batch_grad
    """),
    answers=lambda a: [[_exercise(a)[0], _exercise(a)[0].sum(0)]])

EXERCISE = Problem(
    "exercise_256", "Seed 001's exercise: 256 per-example gradients", "001",
    "Seed 001's exercise: for a batch of **256** examples of the linear model `loss_one(params, x, y) = (x·params − "
    "y)²`, implement `exercise(params, X, Y)` returning `(per_grads, batch_grad)`: the per-example gradients, shape "
    "(N, D), and the gradient of the **mean** loss over the batch, shape (D,). **Check** verifies both and that "
    "`per_grads.mean(0)` equals `batch_grad`; the histogram of your per-example gradient norms is drawn from your "
    "own output: the diagnostic research uses to find outliers. `X`: (N, D) float32, `Y`: (N,), `params`: (D,).",
    _code("""
        import jax
        import jax.numpy as jnp
    """ + _LINEAR_LOSS + """
        def exercise(params, X, Y):
            per_grads = ...    # TODO: shape (N, D)
            batch_grad = ...   # TODO: gradient of the MEAN loss, shape (D,)
            return per_grads, batch_grad
    """),
    _code("""
        import jax
        import jax.numpy as jnp
    """ + _LINEAR_LOSS + """
        def batch_loss(params, X, Y):
            return jnp.mean(jax.vmap(loss_one, in_axes=(None, 0, 0))(params, X, Y))

        def exercise(params, X, Y):
            per_grads = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, X, Y)   # (N, D)
            batch_grad = jax.grad(batch_loss)(params, X, Y)                                 # (D,)
            print("mean check:", jnp.allclose(per_grads.mean(0), batch_grad, atol=1e-5))
            print("largest norm:", jnp.linalg.norm(per_grads, axis=1).max())
            return per_grads, batch_grad
    """),
    ("`jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))`: params shared, x and y mapped.",
     "The batch gradient: `jax.grad` of a function of params that returns `jnp.mean` of the per-example losses.",
     "`jnp.linalg.norm(per_grads, axis=1)` gives the (N,) norms the histogram shows; print its max to spot outliers."),
    "exercise", _SEED_001, _exercise, lambda rng: [_linear_data(rng, n) for n in (256, 40)],
    (PER_EXAMPLE_SUMMED, SUM_FOR_MEAN), expected="per_grads (256, 3), batch_grad (3,), per_grads.mean(0) == batch_grad",
    extra=_mean_check, figure=_norm_histogram)


# ---------------------------------------------------------------- seed 001: a DP-SGD step

def _noise(key: Key, shape) -> np.ndarray:
    """`jax.random.normal(PRNGKey(seed), shape)`: the same draws the student's code makes from the same key."""
    return _f64(jax.random.normal(jax.random.PRNGKey(key.seed), shape))


def _dp_step(args, *, clip_first: bool = True, clip: bool = True, reduce=np.mean, norm_axis: int = -1) -> np.ndarray:
    params, X, Y, lr, C, sigma, key = args
    G = _linear_grads(params, X, Y)
    factor = lambda g, axis=-1: np.minimum(1.0, C / np.maximum(np.linalg.norm(g, axis=axis, keepdims=True), 1e-30))  # noqa: E731
    if clip and clip_first:
        G = G * factor(G, norm_axis)
    g = reduce(G, axis=0)
    if clip and not clip_first:
        g = g * factor(g)
    return _f64(params) - lr * (g + sigma * _noise(key, np.shape(params)))


def _dp_hidden(rng):
    return [(*_linear_data(rng, n, d), float(lr), float(c), float(s), Key(int(rng.integers(2**31))))
            for n, d, lr, c, s in ((64, 3, 0.1, 0.5, 0.0), (50, 4, 0.05, 2.0, 0.3))]


CLIP_AFTER = Pitfall(
    "clip_after_mean", "Clipping after averaging",
    "You clipped the **mean** gradient, not each example's. DP-SGD's guarantee needs every example's influence "
    "bounded: clip each per-example gradient to norm C **first**, then average (Abadi et al. 2016, Algorithm 1). "
    "Clipping the mean bounds the batch, not any one example: one outlier can still move the mean as far as it likes.",
    _code("""
        import jax, jax.numpy as jnp

        def loss_one(params, x, y):
            return (jnp.dot(x, params) - y) ** 2

        def dp_sgd_step(params, X, Y, lr, clip_norm, noise_scale, key):
            g = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, X, Y).mean(0)
            g = g * jnp.minimum(1.0, clip_norm / jnp.linalg.norm(g))
            noise = jax.random.normal(key, g.shape) * noise_scale
            return params - lr * (g + noise)
    """),
    answers=lambda a: [[_dp_step(a, clip_first=False)]])
NO_CLIP = Pitfall(
    "no_clipping", "No clipping at all",
    "Your step equals the step **without clipping**: each per-example gradient must be scaled by "
    "min(1, C / ‖gᵢ‖) before the mean. Without it, the noise of scale σ says nothing about any one example.",
    _code("""
        import jax, jax.numpy as jnp

        def loss_one(params, x, y):
            return (jnp.dot(x, params) - y) ** 2

        def dp_sgd_step(params, X, Y, lr, clip_norm, noise_scale, key):
            g = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, X, Y).mean(0)
            return params - lr * (g + jax.random.normal(key, g.shape) * noise_scale)
    """),
    answers=lambda a: [[_dp_step(a, clip=False)]])
DP_SUM = Pitfall(
    "sum_for_mean", "A sum where the mean was asked",
    "Your step moves **N times too far**: it sums the clipped gradients; seed 001's `dp_sgd_step` averages them "
    "(`g_each.mean(0)`) before adding the noise.",
    _code("""
        import jax, jax.numpy as jnp

        def loss_one(params, x, y):
            return (jnp.dot(x, params) - y) ** 2

        def dp_sgd_step(params, X, Y, lr, clip_norm, noise_scale, key):
            g = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, X, Y)
            g = g * jnp.minimum(1.0, clip_norm / jnp.linalg.norm(g, axis=1, keepdims=True))
            return params - lr * (g.sum(0) + jax.random.normal(key, params.shape) * noise_scale)
    """),
    answers=lambda a: [[_dp_step(a, reduce=np.sum)]])

NORM_OVER_BATCH = Pitfall(
    "norm_over_batch", "Norms over the batch axis",
    "You took the norms over the **batch** axis (`axis=0`): one number per parameter, the norm of that coordinate "
    "across all examples, not one per example. Clipping must bound each example's whole gradient: "
    "`jnp.linalg.norm(g_each, axis=1, keepdims=True)` is (N, 1), one norm per example (a row of `g_each`).",
    _code("""
        import jax, jax.numpy as jnp

        def loss_one(params, x, y):
            return (jnp.dot(x, params) - y) ** 2

        def dp_sgd_step(params, X, Y, lr, clip_norm, noise_scale, key):
            g = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, X, Y)
            g = g * jnp.minimum(1.0, clip_norm / jnp.linalg.norm(g, axis=0, keepdims=True))
            return params - lr * (g.mean(0) + jax.random.normal(key, params.shape) * noise_scale)
    """),
    answers=lambda a: [[_dp_step(a, norm_axis=0)]])

DP_SGD = Problem(
    "dp_sgd_step", "A DP-SGD step with per-example clipping", "001",
    "Seed 001's `dp_sgd_step(params, X, Y, lr, clip_norm, noise_scale, key)` for the linear model: compute the "
    "per-example gradients, clip **each** to norm at most `clip_norm` (multiply gᵢ by min(1, C / ‖gᵢ‖)), take their "
    "mean, add `jax.random.normal(key, params.shape) * noise_scale` and return `params - lr * (mean + noise)`, shape "
    "(D,). Use the key exactly once, as written, so the checker can draw the same noise.",
    _code("""
        import jax
        import jax.numpy as jnp
    """ + _LINEAR_LOSS + """
        def dp_sgd_step(params, X, Y, lr, clip_norm, noise_scale, key):
            g_each = ...   # TODO: per-example gradients, (N, D)
            # TODO: clip each row to norm <= clip_norm, average, add noise, step
            ...
    """),
    _code("""
        import jax
        import jax.numpy as jnp
    """ + _LINEAR_LOSS + """
        def dp_sgd_step(params, X, Y, lr, clip_norm, noise_scale, key):
            g_each = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, X, Y)       # (N, D)
            norms = jnp.linalg.norm(g_each, axis=1, keepdims=True)                            # (N, 1)
            g_each = g_each * jnp.minimum(1.0, clip_norm / norms)                             # each ||g_i|| <= C
            g_clipped_mean = g_each.mean(0)
            noise = jax.random.normal(key, params.shape) * noise_scale
            return params - lr * (g_clipped_mean + noise)
    """),
    ("Per-example gradients first: `jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))`.",
     "`jnp.linalg.norm(g_each, axis=1, keepdims=True)` is (N, 1): one norm per example, ready to broadcast.",
     "Clip before you average: `g_each * jnp.minimum(1.0, clip_norm / norms)`, then `.mean(0)`."),
    "dp_sgd_step", (_f32([1.0, 2.0, 3.0]), *_linear_data(np.random.default_rng(2), 64)[1:], 0.1, 1.0, 0.1, Key(42)),
    lambda a: [_dp_step(a)], _dp_hidden, (CLIP_AFTER, NO_CLIP, DP_SUM, NORM_OVER_BATCH))


# ---------------------------------------------------------------- seed 001: an influence score

def _influence(args, sign: float = -1.0) -> np.ndarray:
    params, X, Y, x_test, y_test = args
    g_test = _linear_grads(params, _f64(x_test)[None], _f64([y_test]))[0]
    return sign * _linear_grads(params, X, Y) @ g_test


def _influence_hidden(rng):
    out = []
    for n, d in ((32, 3), (20, 5)):
        p, X, Y = _linear_data(rng, n, d)
        out.append((p, X, Y, _f32(rng.normal(size=d)), float(rng.normal())))
    return out


SIGN = Pitfall(
    "sign", "The sign is flipped",
    "Your scores are the **negatives** of the expected ones: seed 001's `influence_score` returns "
    "`-jnp.dot(g_each, g_test)`. A gradient step on example i changes the test loss by about −lr·⟨gᵢ, g_test⟩, so "
    "examples that help the test point (a positive dot product) get a negative score: they lower its loss.",
    _code("""
        import jax, jax.numpy as jnp

        def loss_one(params, x, y):
            return (jnp.dot(x, params) - y) ** 2

        def influence_score(params, X, Y, x_test, y_test):
            g_each = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, X, Y)
            return jnp.dot(g_each, jax.grad(loss_one)(params, x_test, y_test))
    """),
    answers=lambda a: [[_influence(a, +1.0)]])
INFLUENCE_SUMMED = Pitfall(
    "summed_influence", "One score for the whole batch instead of one per example",
    "Your answer is **one number**: the batch gradient's dot product with the test gradient. The point of influence "
    "is one score per training example, shape (N,): use the per-example gradients `vmap(grad(loss_one))`, not the "
    "gradient of the summed or mean loss.",
    _code("""
        import jax, jax.numpy as jnp

        def loss_one(params, x, y):
            return (jnp.dot(x, params) - y) ** 2

        def influence_score(params, X, Y, x_test, y_test):
            g_batch = jax.grad(lambda p: jnp.sum((X @ p - Y) ** 2))(params)
            return -jnp.dot(g_batch, jax.grad(loss_one)(params, x_test, y_test))
    """),
    answers=lambda a: [[np.sum(_influence(a))], [np.mean(_influence(a))]])

INFLUENCE = Problem(
    "influence_score", "An influence score per training example", "001",
    "Seed 001's simplified influence: implement `influence_score(params, X, Y, x_test, y_test)` returning, for each "
    "training example i, −⟨gᵢ, g_test⟩ where gᵢ is the per-example gradient of `loss_one` and g_test the gradient at "
    "the test point. Shape (N,). The most negative scores are the examples whose gradient step lowers the test loss "
    "the most (the proponents).",
    _code("""
        import jax
        import jax.numpy as jnp
    """ + _LINEAR_LOSS + """
        def influence_score(params, X, Y, x_test, y_test):
            # TODO: one score per training example, shape (N,)
            ...
    """),
    _code("""
        import jax
        import jax.numpy as jnp
    """ + _LINEAR_LOSS + """
        def influence_score(params, X, Y, x_test, y_test):
            g_each = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, X, Y)   # (N, D)
            g_test = jax.grad(loss_one)(params, x_test, y_test)                          # (D,)
            return -jnp.dot(g_each, g_test)                                              # (N,)
    """),
    ("Two gradients: the per-example ones (N, D) with `vmap(grad)`, and one at the test point (D,) with `grad`.",
     "`jnp.dot` of an (N, D) matrix with a (D,) vector is (N,).",
     "Mind the minus sign: `-jnp.dot(g_each, g_test)`."),
    "influence_score", (_f32([1.0, 2.0, 3.0]), *_linear_data(np.random.default_rng(3), 32)[1:], _f32([0.5, -1.0, 2.0]),
                        1.5),
    lambda a: [_influence(a)], _influence_hidden, (SIGN, INFLUENCE_SUMMED))


# ---------------------------------------------------------------- seed 003: a loop against vmap, timed

def _loop_vmap(args):
    G = _linear_grads(*args)
    return [G, G, None, None]


def _timing(args, leaves):
    """The student's own times, shown and explained but never graded: a program can report any number it likes, so
    the pass condition is the gradients alone (the server times nothing inside the sandbox)."""
    if len(leaves) != 4 or any(np.size(t) != 1 for t in leaves[2:]):
        return False, ["Return four things: `loop_grads, vmap_grads, loop_seconds, vmap_seconds` (two numbers last)."]
    loop_s, vmap_s = float(np.ravel(leaves[2])[0]), float(np.ravel(leaves[3])[0])
    n = len(args[1])
    note = (f"Your own timing, N = {n} (shown, not graded): the loop took {loop_s * 1e3:.1f} ms, "
            f"vmap {vmap_s * 1e3:.2f} ms")
    if 0 < vmap_s < loop_s:
        return True, [note + f": vmap is **{loop_s / vmap_s:.0f}× faster**."]
    return True, [note + ". " + (SLOW_VMAP.explain if vmap_s >= loop_s > 0 else "Times are positive seconds.")]


def _timing_bars(args, leaves):
    if len(leaves) != 4 or any(np.size(t) != 1 for t in leaves[2:]):
        return None
    ms = [float(np.ravel(t)[0]) * 1e3 for t in leaves[2:]]
    fig = go.Figure(go.Bar(x=["Python loop of jax.grad", "jax.vmap(jax.grad)"], y=ms,
                           text=[f"{m:.2f} ms" for m in ms], textposition="outside"))
    return plots.style_figure(fig, f"Your timing: per-example gradients of {len(args[1])} examples", "", "milliseconds")


SLOW_VMAP = Pitfall(
    "timed_compile", "vmap looks slower than the loop: what did you time?",
    "Your vmap time is **longer** than the loop's. vmap does not loop (seed 000's third pitfall): it is one "
    "vectorized computation. Time it like the seed times it: call once first (JAX traces and compiles on the first "
    "call), then time a fresh call and wait for the result with `.block_until_ready()`. Time exactly one call of "
    "each, on the same N.",
    _code("""
        import time
        import jax, jax.numpy as jnp

        def loss_one(params, x, y):
            return (jnp.dot(x, params) - y) ** 2

        def loop_vs_vmap(params, X, Y):
            g = jax.grad(loss_one)
            t = time.perf_counter()
            loop_grads = jnp.stack([g(params, X[i], Y[i]) for i in range(X.shape[0])]).block_until_ready()
            loop_seconds = time.perf_counter() - t
            t = time.perf_counter()
            for _ in range(2 * X.shape[0]):       # times many calls, not one
                vmap_grads = jax.vmap(g, in_axes=(None, 0, 0))(params, X, Y).block_until_ready()
            vmap_seconds = time.perf_counter() - t
            return loop_grads, vmap_grads, loop_seconds, vmap_seconds
    """),
    test=lambda args, leaves: len(leaves) == 4 and np.size(leaves[2]) == np.size(leaves[3]) == 1
    and float(np.ravel(leaves[3])[0]) >= float(np.ravel(leaves[2])[0]))
TRANSPOSED = Pitfall(
    "transposed", "The loop's gradients are stacked the wrong way",
    "Your loop's gradients are shape (D, N): stacked along the wrong axis. `jnp.stack(list_of_N_rows)` (axis 0) "
    "gives (N, D), one row per example, like `vmap`.",
    _code("""
        import time
        import jax, jax.numpy as jnp

        def loss_one(params, x, y):
            return (jnp.dot(x, params) - y) ** 2

        def loop_vs_vmap(params, X, Y):
            g = jax.grad(loss_one)
            t = time.perf_counter()
            loop_grads = jnp.stack([g(params, X[i], Y[i]) for i in range(X.shape[0])], axis=1).block_until_ready()
            loop_seconds = time.perf_counter() - t
            vmap_grads = jax.vmap(g, in_axes=(None, 0, 0))(params, X, Y)
            t = time.perf_counter()
            vmap_grads = jax.vmap(g, in_axes=(None, 0, 0))(params, X, Y).block_until_ready()
            return loop_grads, vmap_grads, loop_seconds, time.perf_counter() - t
    """),
    answers=lambda a: [[_linear_grads(*a).T, _linear_grads(*a), None, None]])

TIMING = Problem(
    "loop_vs_vmap", "Time it: a Python loop against vmap", "003",
    "Seed 003 times per-sample gradients with a Python loop and with `vmap(grad)` (vmap was several times faster). "
    "Do it in JAX for the linear model: implement `loop_vs_vmap(params, X, Y)` returning `(loop_grads, vmap_grads, "
    "loop_seconds, vmap_seconds)`: both (N, D), computed with a Python loop of `jax.grad` over the examples and with "
    "`jax.vmap(jax.grad(...))`, and the seconds one call of each took (`time.perf_counter()`). Both must equal "
    "the oracle; the times are yours to read (shown beside the answer, not graded: a program can report any number). "
    "N = 64.",
    _code("""
        import time
        import jax
        import jax.numpy as jnp
    """ + _LINEAR_LOSS + """
        def loop_vs_vmap(params, X, Y):
            g = jax.grad(loss_one)
            # TODO: loop_grads with a Python loop over the N examples, timed
            # TODO: vmap_grads with jax.vmap, called once first (compilation), then timed
            ...
    """),
    _code("""
        import time
        import jax
        import jax.numpy as jnp
    """ + _LINEAR_LOSS + """
        def loop_vs_vmap(params, X, Y):
            g = jax.grad(loss_one)
            per_example = jax.vmap(g, in_axes=(None, 0, 0))
            g(params, X[0], Y[0]).block_until_ready()           # warm up both: the first call traces
            per_example(params, X, Y).block_until_ready()

            t = time.perf_counter()
            loop_grads = jnp.stack([g(params, X[i], Y[i]) for i in range(X.shape[0])]).block_until_ready()
            loop_seconds = time.perf_counter() - t

            t = time.perf_counter()
            vmap_grads = per_example(params, X, Y).block_until_ready()
            vmap_seconds = time.perf_counter() - t
            print(f"loop {loop_seconds * 1e3:.1f} ms, vmap {vmap_seconds * 1e3:.2f} ms")
            return loop_grads, vmap_grads, loop_seconds, vmap_seconds
    """),
    ("The loop: `jnp.stack([g(params, X[i], Y[i]) for i in range(X.shape[0])])`.",
     "JAX computes asynchronously: end each timed section with `.block_until_ready()`.",
     "Call `per_example(params, X, Y)` once before timing it: the first call traces the function."),
    "loop_vs_vmap", (_f32([1.0, 2.0, 3.0]), *_linear_data(np.random.default_rng(4), 64)[1:]),
    _loop_vmap, lambda rng: [_linear_data(rng, 32)], (TRANSPOSED,), extra=_timing, figure=_timing_bars)

#: Every problem, in course order.
PROBLEMS: tuple[Problem, ...] = (PER_EXAMPLE, FIX_IN_AXES, FIX_SUMMED, TWO_WAYS, FIX_SHAPE, FIX_MEAN, EXERCISE, DP_SGD,
                                 INFLUENCE, TIMING)
BY_SLUG: dict[str, Problem] = {p.slug: p for p in PROBLEMS}
