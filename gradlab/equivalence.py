"""`vmap(grad(f)).sum()` equals `grad(sum(vmap(f)))`: checked per parameter leaf, in float32 and float64.

Seed 002: the gradient of the summed loss can be computed two ways,

- way (a): per-example gradients `vmap(grad(f), in_axes=(None, 0, 0))(θ, xs, ys)`, then `.sum(0)`;
- way (b): one gradient of the summed loss `grad(lambda θ: vmap(f, in_axes=(None, 0, 0))(θ, xs, ys).sum())(θ)`.

By linearity of differentiation they are the same number; in float32 they differ by rounding
(the sums run in another order). The float64 reference is computed inside `jax.enable_x64(True)`,
a **thread-local** context in JAX 0.10 (checked in the tests): other threads, e.g. the other
sessions of a hosted Streamlit app, keep float32, and jit caches are keyed on the setting.

The module also runs the seeds' pitfalls live (`PITFALLS`): the code shown is the code executed.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from gradlab import costs, engine, memory
from gradlab.params import split_params

#: Largest N × P handled by way (a) in one `vmap`; above it, per-example gradients are summed chunk by
#: chunk. Set so that one chunk with XLA's working copies stays within the memory budget in float64.
MAX_MATERIALIZED = memory.BUDGET_BYTES // (8 * memory.XLA_COPIES)

#: Most examples per float64 `vmap` in way (a). XLA's CPU backend has no float64 kernel for the
#: grouped convolution that `vmap` makes of a conv layer's per-example weight gradient and expands
#: it into a dense one, so time and memory grow with the square of the batch: on the digits CNN
#: 256 examples took 16 s, 512 examples passed 2.5 GB, and all 1437 grew the server to 24 GB
#: (a `?model=cnn` link on Equivalence). Chunks of 4 keep it bounded (chunks of 16 peak ~180 MB over the baseline).
FLOAT64_CHUNK = 4
#: ... and at most `MAX_MATERIALIZED // (FLOAT64_COPIES · P)` examples: on seed 003's SimpleCNN (P = 1.2 M) way (a) in
#: float64 peaked 177 MB over its start at chunks of 3 and 110 MB at chunks of 1, in the same CPU time
#: (benchmarks/RESULTS.md, "Equivalence on SimpleCNN"). Smaller models keep `FLOAT64_CHUNK`.
FLOAT64_COPIES = 4

#: Memory way (b)'s float64 intermediates may take in the Equivalence page's comparison (`plan_subset`): a quarter of
#: the budget per computation, the rest for way (a)'s chunk of per-example gradients, the eight P-vectors of results
#: and the compiling (seed 003's SimpleCNN at half the budget, 17 examples, peaked at 714 MB on a cold server: 8).
SUBSET_BUDGET_BYTES = memory.BUDGET_BYTES // 4

#: The seed of the fixed random draw of examples a reduced comparison takes (`subset_indices`): the same rows for
#: every visitor and checkpoint.
SUBSET_SEED = 0


@dataclasses.dataclass(frozen=True)
class SubsetPlan:
    """How many of a training set's examples the Equivalence page compares both ways on, and why.

    `n` of `total` examples (all when `n == total`); `why`: `"all"`, `"memory"` (way (b)'s one gradient of the summed
    float64 loss keeps every example's intermediates at once: `bytes_per_example` each, within `budget_bytes`) or
    `"time"` (the estimate for more, `costs.equivalence_seconds`, passes `seconds_left`); `seconds`: the estimate for
    `n`, `seconds_all` for every example."""

    n: int
    total: int
    why: str
    seconds: float
    seconds_all: float
    bytes_per_example: int
    budget_bytes: int
    seconds_left: float

    @property
    def reduced(self) -> bool:
        return self.n < self.total


def plan_subset(total: int, num_params: int, bytes_per_example: int, *, macs: int = 0,
                seconds_left: float = float("inf"), budget_bytes: int = SUBSET_BUDGET_BYTES) -> SubsetPlan:
    """The most examples (of `total`) the comparison can take within `seconds_left` CPU-seconds and `budget_bytes`.

    **Arguments** `total`: N; `num_params`: P; `bytes_per_example`: what one more example adds to way (b)'s float64
    pass (`memory.example_bytes(..., itemsize=8)`); `macs`: the forward's multiply-adds (0: count P).

    Way (a) streams its per-example gradients in chunks (`way_a`: at most `MAX_MATERIALIZED` floats), but way (b),
    one gradient of the summed loss, keeps every example's intermediates for its backward pass: that bounds N by
    memory; `costs.equivalence_seconds` bounds it by time. **Returns** a `SubsetPlan` with `n ≥ 1` (the identity
    holds on any set of examples: one is a fair demonstration when nothing more fits)."""
    total = int(total)
    by_memory = total if bytes_per_example <= 0 else max(1, int(budget_bytes // bytes_per_example))
    cost = lambda n: costs.equivalence_seconds(num_params, n, macs)  # noqa: E731
    if cost(min(total, by_memory)) <= seconds_left:
        by_time = total
    else:
        lo, hi = 1, min(total, by_memory)  # the largest n with cost(n) within the budget (cost grows with n)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if cost(mid) <= seconds_left else (lo, mid - 1)
        by_time = lo
    n = max(1, min(total, by_memory, by_time))
    why = "all" if n == total else ("memory" if by_memory <= by_time else "time")
    return SubsetPlan(n, total, why, cost(n), cost(total), int(bytes_per_example), int(budget_bytes),
                      float(seconds_left))


def subset_indices(total: int, n: int) -> np.ndarray:
    """`n` of `range(total)`, ascending, drawn at random with `SUBSET_SEED`; all of them, in order, when `n ≥ total`."""
    if n >= total:
        return np.arange(total)
    return np.sort(np.random.default_rng(SUBSET_SEED).choice(total, int(n), replace=False))


def take(xs: Any, ys: Any, n: int) -> tuple[Any, Any]:
    """`(xs, ys)` restricted to `subset_indices(N, n)`; the arrays themselves when `n ≥ N` (all examples)."""
    total = engine.check_batch(xs, ys)
    if n >= total:
        return xs, ys
    idx = subset_indices(total, n)
    return jax.tree.map(lambda v: v[idx], (xs, ys))


def scalar_loss(w, x, y):
    """The seeds' scalar example `(w·x)²` (seed 002; seed 000 uses `(w·x − y)²` with y = 0)."""
    return (w * x - y) ** 2


def scalar_example() -> tuple[Callable, float, Any, Any]:
    """The seeds' worked example: `(loss, w=1.0, xs=[1., 2.], ys=[0., 0.])`; grads `[2., 8.]`, sum 10."""
    return scalar_loss, 1.0, jnp.array([1.0, 2.0]), jnp.array([0.0, 0.0])


def scalar_gradients() -> tuple[np.ndarray, float]:
    """The seeds' example through the engine. **Returns** `(per-example gradients in w (2,), gradient of the
    summed loss)`: `[2., 8.]` and `10.` (seed 000: `per_example_grads` gives `Array([2., 8.])`)."""
    loss, w, xs, ys = scalar_example()
    return (np.asarray(engine.per_example_grads(loss, w, xs, ys)),
            float(engine.batch_grad(loss, w, xs, ys, reduction="sum")))


@dataclasses.dataclass(frozen=True)
class LeafDiff:
    """Way (a) vs way (b) for one parameter leaf.

    `abs32`/`abs64`: max |a − b| in float32 / float64; `rel32`/`rel64`: divided by max |b|;
    `err_a32`, `err_b32`: max |way − float64 reference| of each float32 way; `scale`: max |b64|.
    """

    name: str
    shape: tuple
    abs32: float
    rel32: float
    abs64: float
    rel64: float
    err_a32: float
    err_b32: float
    scale: float


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Result of `compare`: one `LeafDiff` per leaf, N, P, the reduction, and both ways' values (float64 arrays)."""

    leaves: list[LeafDiff]
    n: int
    num_params: int
    reduction: str
    way_a: dict[str, np.ndarray]
    way_b: dict[str, np.ndarray]

    @property
    def max_abs32(self) -> float:
        return max(l.abs32 for l in self.leaves)

    @property
    def max_rel32(self) -> float:
        return max(l.rel32 for l in self.leaves)

    @property
    def max_rel64(self) -> float:
        return max(l.rel64 for l in self.leaves)


def _to(dtype, tree):
    """Cast floating leaves (and Python floats) of a pytree to `dtype`; leave ints and statics."""

    def cast(v):
        if isinstance(v, float) and not isinstance(v, bool):
            return jnp.asarray(v, dtype)
        if eqx.is_inexact_array(v) or (isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating)):
            return jnp.asarray(v, dtype)
        return v

    return jax.tree.map(cast, tree)


@eqx.filter_jit
def _summed_per_example_grads(loss_fn, params, xs, ys, chunk):
    """Σᵢ `grad(loss_fn)(θ, xᵢ, yᵢ)`, `vmap` over `chunk` examples at a time, summed in a scan:
    only one chunk's per-example gradients (chunk × P) are ever alive, never N × P."""
    diff, static = split_params(params)
    grad_one = jax.grad(lambda d, x, y: loss_fn(eqx.combine(d, static), x, y))

    def step(acc, batch):
        (x, y), mask = batch
        per = jax.vmap(grad_one, in_axes=(None, 0, 0))(diff, x, y)
        keep = mask > 0  # drop the zero padding of the last chunk (where, not *: a padded loss may be inf)
        drop_pad = lambda g: jnp.where(keep.reshape((-1,) + (1,) * (g.ndim - 1)), g, 0).sum(0)  # noqa: E731
        return jax.tree.map(lambda a, g: a + drop_pad(g), acc, per)

    init = jax.tree.map(jnp.zeros_like, diff)
    return engine.scan_chunks(step, init, (xs, ys), chunk)


def way_a(loss_fn: Callable, params: Any, xs: Any, ys: Any, *, reduction: str = "sum") -> Any:
    """Way (a): `vmap(grad(loss_fn))` per example, then summed (or averaged) over the example axis.

    The per-example gradients are streamed: `vmap` over a chunk of examples, summed into an
    accumulator in a `lax.scan`, so memory is chunk × P (at most `MAX_MATERIALIZED` floats; a float64
    conv model `FLOAT64_CHUNK` examples), never N × P. **Returns** a pytree like the differentiable
    params (non-differentiable leaves `None`).

    **Raises** `ValueError` if xs and ys disagree on N or are empty.
    """
    n = engine.check_batch(xs, ys)
    params = engine.as_params(params)
    p = max(engine.num_params(params), 1)
    chunk = max(1, min(n, MAX_MATERIALIZED // p))
    # see FLOAT64_CHUNK: float64 grouped convolutions (conv kernels are the leaves with ndim > 2); a large model's
    # expanded convolutions hold a few copies of the chunk's gradients besides: one example at a time (SimpleCNN)
    if any(getattr(v, "dtype", None) == jnp.float64 and v.ndim > 2 for v in jax.tree.leaves(params)):
        chunk = min(chunk, FLOAT64_CHUNK, max(1, MAX_MATERIALIZED // (FLOAT64_COPIES * p)))
    total = _summed_per_example_grads(loss_fn, params, xs, ys, chunk)
    return jax.tree.map(lambda a: a / n, total) if reduction == "mean" else total


def way_b(loss_fn: Callable, params: Any, xs: Any, ys: Any, *, reduction: str = "sum") -> Any:
    """Way (b): `grad(lambda θ: vmap(loss_fn)(θ, xs, ys).sum())(θ)` (or `.mean()`)."""
    return engine.batch_grad(loss_fn, params, xs, ys, reduction=reduction)


def _leaf_dict(params, tree) -> dict[str, np.ndarray]:
    """The leaves of `tree` by name, in their own dtype (a float32 pass stays float32 until the comparison: eight P-sized
    results held in float64 were 77 MB on seed 003's SimpleCNN while the last pass compiled)."""
    names = engine.leaf_names(params)
    return {k: np.asarray(v) for k, v in zip(names, jax.tree.leaves(tree))}


def _f64(d: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, np.float64) for k, v in d.items()}


def _ways(loss_fn, params, xs, ys, dtype, between=None) -> tuple[dict, dict, dict, dict]:
    """In `dtype`: way (a) summed and averaged, way (b) summed and averaged, as float64 leaf dicts.
    Way (a) averaged is way (a) summed divided by N in `dtype`, as `way_a(reduction="mean")` does.
    `between()` is called after way (a) (`compare_all`)."""
    p, x, y = _to(dtype, (params, xs, ys))
    a_sum = way_a(loss_fn, p, x, y, reduction="sum")
    n = engine.check_batch(xs, ys)
    a = (_leaf_dict(params, a_sum), _leaf_dict(params, jax.tree.map(lambda a: a / n, a_sum)))
    del a_sum
    if between is not None:
        between()
    return (*a, _leaf_dict(params, way_b(loss_fn, p, x, y, reduction="sum")),
            _leaf_dict(params, way_b(loss_fn, p, x, y, reduction="mean")))


def _comparison(params, n, reduction, w32, w64) -> Comparison:
    """Way (a) vs way (b) per leaf for `reduction`, from `_ways` in float32 (`w32`) and float64 (`w64`)."""
    def pick(w):
        a_sum, a_mean, b_sum, b_mean = w
        return (a_mean, b_mean) if reduction == "mean" else (a_sum, b_sum)

    (a32, b32), (a64, b64) = (_f64(d) for d in pick(w32)), pick(w64)
    leaves = []
    for name in a32:
        scale = float(np.max(np.abs(b64[name]))) if b64[name].size else 0.0
        denom = scale if scale > 0 else 1.0
        abs32 = float(np.max(np.abs(a32[name] - b32[name])))
        abs64 = float(np.max(np.abs(a64[name] - b64[name])))
        leaves.append(LeafDiff(
            name=name, shape=tuple(np.shape(a32[name])), abs32=abs32, rel32=abs32 / denom,
            abs64=abs64, rel64=abs64 / denom,
            err_a32=float(np.max(np.abs(a32[name] - b64[name]))),
            err_b32=float(np.max(np.abs(b32[name] - b64[name]))), scale=scale,
        ))
    return Comparison(leaves, n, engine.num_params(params), reduction, a32, b32)


def compare_all(loss_fn: Callable, params: Any, xs: Any, ys: Any, *,
                between: Callable[[], None] | None = None) -> tuple[dict[str, Comparison], "Scaling"]:
    """`compare` for both reductions and `mean_vs_sum`, from one pass of each way per precision.

    The expensive part, way (a)'s per-example gradients, runs once in float32 and once in float64;
    the mean is the sum divided by N, as in `way_a`. **Arguments** as `compare`, and `between()`, called between
    the passes (after each way (a) and after the float32 pass: the Equivalence page returns memory there,
    `memory.release_memory`, so a large model's eight programs do not pile up). **Returns**
    `({"sum": Comparison, "mean": Comparison}, Scaling)`, equal to `compare(..., reduction=r)` and
    `mean_vs_sum(...)`. **Raises** as `compare`.
    """
    n = engine.check_batch(xs, ys)
    w32 = _ways(loss_fn, params, xs, ys, jnp.float32, between)
    if between is not None:
        between()
    with jax.enable_x64(True):  # thread-local: other sessions keep float32
        w64 = _ways(loss_fn, params, xs, ys, jnp.float64, between)
    return {r: _comparison(params, n, r, w32, w64) for r in ("sum", "mean")}, _scaling(n, *w32)


def compare(loss_fn: Callable, params: Any, xs: Any, ys: Any, *, reduction: str = "sum") -> Comparison:
    """Way (a) vs way (b) per parameter leaf, in float32 and in float64 (the reference).

    **Arguments**
    - `loss_fn(params, x, y) -> scalar`, the loss of one example (engine contract).
    - `params`: any pytree (Python floats, arrays, Equinox module).
    - `xs`, `ys`: the batch, example axis first (N examples).
    - `reduction`: `"sum"` (seed 002) or `"mean"`.

    **Returns** a `Comparison`: per leaf the max absolute and relative difference between the two
    ways in float32 and in float64, and each float32 way's error against the float64 reference.
    Relative = divided by the leaf's largest |gradient| (float64).

    **Raises** `ValueError` for a bad reduction or batch (engine messages).
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    return compare_all(loss_fn, params, xs, ys)[0][reduction]


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Mean vs sum: max |difference| (over all parameters) between pairs of ways.

    `mean_vs_mean`: mean of per-example grads vs grad of the mean loss (equal up to rounding);
    `sum_vs_mean`: sum of per-example grads vs grad of the mean loss (the trap: off by N);
    `ratio`: ‖Σ gᵢ‖ / ‖∇ mean loss‖, which is N.
    """

    n: int
    mean_vs_mean: float
    sum_vs_sum: float
    sum_vs_mean: float
    ratio: float
    scale: float


def _scaling(n: int, a_sum: dict, a_mean: dict, b_sum: dict, b_mean: dict) -> Scaling:
    flat = lambda d: np.concatenate([np.ravel(v).astype(np.float64) for v in d.values()])  # noqa: E731
    a_sum, a_mean, b_sum, b_mean = flat(a_sum), flat(a_mean), flat(b_sum), flat(b_mean)
    norm_b_mean = float(np.linalg.norm(b_mean))
    return Scaling(
        n=n,
        mean_vs_mean=float(np.max(np.abs(a_mean - b_mean))),
        sum_vs_sum=float(np.max(np.abs(a_sum - b_sum))),
        sum_vs_mean=float(np.max(np.abs(a_sum - b_mean))),
        ratio=float(np.linalg.norm(a_sum)) / norm_b_mean if norm_b_mean > 0 else float("nan"),
        scale=float(np.max(np.abs(b_mean))),
    )


def mean_vs_sum(loss_fn: Callable, params: Any, xs: Any, ys: Any) -> Scaling:
    """The mean of per-example gradients equals the gradient of the mean loss; mixing sum and mean is off by N.

    **Arguments** as `compare`. **Returns** a `Scaling` (float32 computations).
    """
    n = engine.check_batch(xs, ys)
    return _scaling(n, *_ways(loss_fn, params, xs, ys, jnp.float32))


# ---------------------------------------------------------------- the seeds' pitfalls, live


@dataclasses.dataclass(frozen=True)
class Pitfall:
    """A pitfall of the seeds: its title, the code, what running it printed, and whether it raised."""

    title: str
    explanation: str
    code: str
    output: str
    raised: bool


PITFALLS = [
    (
        "vmap without in_axes",
        "`vmap` maps over axis 0 of EVERY argument by default. The scalar weight `w` has no axis 0, "
        "so JAX refuses. `in_axes=(None, 0)` says: broadcast `w`, map over the examples.",
        """
per_example_loss = lambda w, x: (w * x) ** 2
w, x_batch = 1.0, jnp.array([1.0, 2.0])
result = jax.vmap(jax.grad(per_example_loss))(w, x_batch)   # no in_axes
""",
    ),
    (
        "vmap with in_axes=(None, 0): one gradient per example",
        "The fix: per-example gradients, shape `(N,)`: `[2., 8.]` as in the seeds.",
        """
per_example_loss = lambda w, x: (w * x) ** 2
w, x_batch = 1.0, jnp.array([1.0, 2.0])
result = jax.vmap(jax.grad(per_example_loss), in_axes=(None, 0))(w, x_batch)
""",
    ),
    (
        "grad of the summed loss: one number, not N",
        "Differentiating the summed (vectorized) loss gives the batch gradient, a scalar here: the "
        "per-example information is gone. Calling `.sum()` on it again changes nothing.",
        """
per_example_loss = lambda w, x: (w * x) ** 2
w, x_batch = 1.0, jnp.array([1.0, 2.0])
result = jax.grad(lambda w: jax.vmap(per_example_loss, in_axes=(None, 0))(w, x_batch).sum())(w)
""",
    ),
    (
        "grad of a non-scalar: the per-example losses are not a loss",
        "`jax.grad` needs a scalar output. Handing it the vector of per-example losses fails: "
        "sum them (way b) or vmap the gradient (way a).",
        """
per_example_loss = lambda w, x: (w * x) ** 2
w, x_batch = 1.0, jnp.array([1.0, 2.0])
result = jax.grad(lambda w: jax.vmap(per_example_loss, in_axes=(None, 0))(w, x_batch))(w)
""",
    ),
]


def _short_error(err: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    # JAX appends a long note about filtered frames; keep the message itself
    return text.split("\n--------------------")[0].strip()


def run_pitfall(title: str, explanation: str, code: str) -> Pitfall:
    """Execute one pitfall's code (namespace: jax, jnp) and capture `result` or the exception's message."""
    ns: dict[str, Any] = {"jax": jax, "jnp": jnp}
    try:
        exec(code, ns)  # noqa: S102 - fixed, module-level snippets
        result = ns["result"]
        out = f"{result!r}   # shape {tuple(np.shape(result))}"
        return Pitfall(title, explanation, code.strip(), out, False)
    except Exception as err:  # noqa: BLE001 - showing the real error is the point
        return Pitfall(title, explanation, code.strip(), _short_error(err), True)


def run_pitfalls() -> list[Pitfall]:
    """Run the seeds' pitfalls (`PITFALLS`) live. **Returns** one `Pitfall` each, with real output."""
    return [run_pitfall(*p) for p in PITFALLS]


def shapes(loss_fn: Callable, params: Any, xs: Any, ys: Any, n_show: int = 4) -> list[dict]:
    """Per leaf: the per-example gradient shape `(N, ...)` vs the summed gradient's `(...)`.

    Computed on the first `n_show` examples (shapes only; cheap). **Returns** rows
    `{"leaf", "per-example (N, ...)", "summed (...)"}` with N the full batch size.
    """
    n = int(jax.tree.leaves(xs)[0].shape[0])
    sub = jax.tree.map(lambda v: v[:n_show], (xs, ys))
    per = jax.eval_shape(lambda: engine.per_example_grads(loss_fn, params, *sub, method="vmap"))
    names = engine.leaf_names(params)
    return [
        {"leaf": name, "per-example (N, ...)": str((n,) + tuple(s.shape[1:])), "summed (...)": str(tuple(s.shape[1:]))}
        for name, s in zip(names, jax.tree.leaves(per))
    ]
