"""Training-data attribution: which training examples helped or hurt one prediction.

Scores between each training example `z_i = (x_i, y_i)` and a test point `z = (x, y)`; by the
convention used throughout, **high = proponent** (the example lowers the test loss, removing it
would raise it) and **low = opponent**.

- `grad_dot`: ⟨∇θℓ(z_i), ∇θℓ(z)⟩ at one checkpoint (one SGD step on z_i with learning rate η
  changes the test loss by ≈ −η·grad_dot).
- `grad_cosine`: the same, divided by both gradient norms (unit-free, in [−1, 1]).
- `tracin`: TracInCP, Σ_c η_c ⟨∇θℓ(θ_c, z_i), ∇θℓ(θ_c, z)⟩ over saved checkpoints θ_c
  (Pruthi et al. 2020, eq. 3).
- `predicted_loo_change`: influence functions (Koh & Liang 2017, eq. 2), the predicted change of the
  test loss when z_i is removed and the model retrained, with the inverse Hessian-vector product
  computed exactly (small models), by conjugate gradient or by LiSSA (Agarwal et al. 2017) on
  Hessian-vector products (`jvp` of `grad`).
- `self_influence`: how much each example supports its own prediction; high = suspicious
  (mislabeled, atypical).
- `loo_retrain` / `check_against_retraining`: the ground truth, actual leave-one-out retraining
  warm-started from the trained model (full-batch L-BFGS to convergence), as in Koh & Liang's Fig. 2.

Everything that needs one number per training example (dot products with a fixed vector, norms)
streams over chunks of examples through `gradlab.engine` and never holds the N × P matrix of
per-example gradients. The Hessian is built (P × P) only when P ≤ `EXACT_MAX_PARAMS`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float
from scipy import stats

from gradlab import engine

LossFn = Callable[[Any, Any, Any], Any]
PyTree = Any
Method = Literal["auto", "exact", "cg", "lissa"]

#: Largest P for which the exact P × P Hessian is built (≈ 4 MB in float32); above it "auto"
#: switches to conjugate gradient.
EXACT_MAX_PARAMS = 1000

#: The scoring methods the page offers, name -> label.
METHODS = {
    "grad_dot": "Gradient dot product",
    "grad_cosine": "Gradient cosine",
    "tracin": "TracIn (sum over checkpoints)",
    "influence": "Influence function (predicted leave-one-out change)",
}


class InfluenceError(ValueError):
    """An inverse Hessian-vector product could not be computed; the message says what to change."""


# ------------------------------------------------------------------ helpers


def _split(params: PyTree) -> tuple[PyTree, PyTree]:
    return eqx.partition(engine.as_params(params), eqx.is_inexact_array)


def _one(a):
    """Add a leading example axis of size 1 to every leaf."""
    return jax.tree.map(lambda v: jnp.asarray(v)[None], a)


def _tree_vdot(a: PyTree, b: PyTree):
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _weighted_objective(loss_fn, diff, static, xs, ys, w, l2):
    """Σ_j w_j ℓ_j / Σ_j w_j + l2/2 ‖θ‖²: w = 1 is the training objective, w_i = 0 leaves z_i out."""
    model = eqx.combine(diff, static)
    losses = jax.vmap(loss_fn, in_axes=(None, 0, 0))(model, xs, ys)
    sq = sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(diff))
    return jnp.sum(w * losses) / jnp.sum(w) + 0.5 * l2 * sq


def point_gradient(loss_fn: LossFn, params: PyTree, x: Any, y: Any) -> PyTree:
    """∇θ ℓ(θ, x, y) of one (test) example: a pytree like the differentiable part of `params`."""
    g = engine.per_example_grads(loss_fn, params, _one(x), _one(y))
    return jax.tree.map(lambda a: a[0], g)


def _sq_norm(tree: PyTree) -> float:
    return float(sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(tree)))


# ------------------------------------------------------------------ gradient similarity, TracIn


def grad_dot(
    loss_fn: LossFn, params: PyTree, train_xs, train_ys, test_x, test_y, *, chunk_size: int | None = None
) -> Float[Array, "N"]:
    """Gradient dot product ⟨∇θℓ(θ, x_i, y_i), ∇θℓ(θ, x, y)⟩ of every training example with a test point.

    Positive: a gradient step on z_i lowers the test loss (proponent); negative: raises it (opponent).
    Streamed (`engine.per_example_dots`): never holds N × P.

    **Arguments** `loss_fn(params, x, y) -> scalar`; `params` a pytree; `train_xs (N, ...)`,
    `train_ys (N,)`; `test_x`, `test_y` ONE example (no example axis).

    **Returns** `(N,)` float array (loss² per parameter² units).

    **Raises** `ValueError` as `engine.per_example_dots`.
    """
    g = point_gradient(loss_fn, params, test_x, test_y)
    return engine.per_example_dots(loss_fn, params, train_xs, train_ys, g, chunk_size=chunk_size)


def grad_cosine(
    loss_fn: LossFn, params: PyTree, train_xs, train_ys, test_x, test_y, *, chunk_size: int | None = None
) -> Float[Array, "N"]:
    """Gradient cosine ⟨g_i, g⟩ / (‖g_i‖ ‖g‖): `grad_dot` without the norms (in [−1, 1]).

    Removes the dominance of large-gradient (often mislabeled) examples over every test point.
    Streamed: one pass for the dots, one for the norms (`engine.per_example_norms`).

    **Arguments** as `grad_dot`. **Returns** `(N,)` in [−1, 1] (0 where a gradient is zero).
    """
    g = point_gradient(loss_fn, params, test_x, test_y)
    dots = engine.per_example_dots(loss_fn, params, train_xs, train_ys, g, chunk_size=chunk_size)
    norms = engine.per_example_norms(loss_fn, params, train_xs, train_ys, chunk_size=chunk_size)
    denom = norms * jnp.sqrt(_sq_norm(g))
    return jnp.where(denom > 0, dots / jnp.maximum(denom, 1e-30), 0.0)


def _check_checkpoints(checkpoints: Sequence, lrs: Sequence[float]) -> None:
    if len(checkpoints) == 0:
        raise ValueError("TracIn needs at least one checkpoint")
    if len(checkpoints) != len(lrs):
        raise ValueError(f"got {len(checkpoints)} checkpoints but {len(lrs)} learning rates")


def tracin(
    loss_fn: LossFn,
    checkpoints: Sequence[PyTree],
    lrs: Sequence[float],
    train_xs,
    train_ys,
    test_x,
    test_y,
    *,
    chunk_size: int | None = None,
) -> Float[Array, "N"]:
    """TracInCP: Σ_c η_c ⟨∇θℓ(θ_c, z_i), ∇θℓ(θ_c, z)⟩ over saved checkpoints (Pruthi et al. 2020, eq. 3).

    The first-order estimate of how much the training steps on z_i lowered the test loss along the
    run, with the checkpoints standing in for the individual steps.

    **Arguments** `checkpoints`: the saved models θ_c (e.g. `Fitted.run.checkpoints`); `lrs`: the
    learning rate η_c in force at each (`Fitted.run.lrs`); the rest as `grad_dot`.

    **Returns** `(N,)` float array; high = proponent.

    **Raises** `ValueError` if there are no checkpoints or the lengths differ.
    """
    _check_checkpoints(checkpoints, lrs)
    total = 0.0
    for params, lr in zip(checkpoints, lrs):
        total = total + lr * grad_dot(loss_fn, params, train_xs, train_ys, test_x, test_y, chunk_size=chunk_size)
    return total


# ------------------------------------------------------------------ Hessian and inverse HVPs


@eqx.filter_jit
def _hessian(loss_fn, params, xs, ys, w, l2, chunk):
    """Exact Hessian (P × P) of the (weighted) objective, summed over chunks of examples."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    flat, unravel = ravel_pytree(diff)
    n = xs.shape[0]
    pad = (-n) % chunk
    padded = lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
    split = lambda a: padded(a).reshape((-1, chunk) + a.shape[1:])
    wsum = jnp.sum(w)

    def part(z, x, y, wc):
        losses = jax.vmap(loss_fn, in_axes=(None, 0, 0))(eqx.combine(unravel(z), static), x, y)
        return jnp.sum(wc * losses) / wsum

    def step(h, batch):
        return h + jax.hessian(part)(flat, *batch), None

    h0 = jnp.eye(flat.size, dtype=flat.dtype) * l2
    h, _ = jax.lax.scan(step, h0, (split(xs), split(ys), split(w)))
    return h


def hessian(loss_fn: LossFn, params: PyTree, xs, ys, *, damping: float = 0.0, chunk_size: int = 128) -> Float[Array, "P P"]:
    """Exact Hessian H = (1/N) Σ_i ∇²θ ℓ(θ, z_i) + damping·I of the training objective, flattened.

    `jax.hessian` on the parameters raveled with `jax.flatten_util.ravel_pytree` (same order as
    `ravel_pytree` of the differentiable part of `params`), accumulated over chunks of examples.

    **Arguments** `loss_fn`, `params`, `xs (N, ...)`, `ys (N,)`; `damping` λ ≥ 0 (the L2 penalty
    of `mean loss + λ/2 ‖θ‖²`).

    **Returns** `(P, P)` symmetric array. **Raises** `ValueError` for an empty batch.
    """
    n = engine._check_batch(xs, ys)
    params = engine.as_params(params)
    flat = ravel_pytree(_split(params)[0])[0]
    w = jnp.ones(n, flat.dtype)
    return _hessian(loss_fn, params, xs, ys, w, jnp.asarray(damping, flat.dtype), int(min(chunk_size, n)))


def _hvp_fn(loss_fn, diff, static, xs, ys, l2):
    """v -> (H + l2 I) v on raveled vectors, by forward-over-reverse (`jvp` of `grad`)."""
    flat, unravel = ravel_pytree(diff)
    w = jnp.ones(xs.shape[0], flat.dtype)
    f = lambda z: _weighted_objective(loss_fn, unravel(z), static, xs, ys, w, l2)
    g = jax.grad(f)
    return lambda v: jax.jvp(g, (flat,), (v,))[1]


def hvp(loss_fn: LossFn, params: PyTree, xs, ys, vector: PyTree, *, damping: float = 0.0) -> PyTree:
    """Hessian-vector product (H + damping·I) v of the objective `mean loss + damping/2 ‖θ‖²`.

    `jax.jvp` of `jax.grad` (forward-over-reverse; Pearlmutter 1994): costs about two gradient
    evaluations, never builds H. **Returns** a pytree like `vector`.
    """
    params = engine.as_params(params)
    return _hvp_jit(loss_fn, params, xs, ys, vector, jnp.asarray(damping))


@eqx.filter_jit
def _hvp_jit(loss_fn, params, xs, ys, vector, l2):
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    flat_v, unravel = ravel_pytree(vector)
    return unravel(_hvp_fn(loss_fn, diff, static, xs, ys, l2)(flat_v))


@eqx.filter_jit
def _cg(loss_fn, params, xs, ys, b, l2, tol, maxiter):
    """Conjugate gradient for (H + l2 I) x = b on raveled vectors; stops on pᵀHp ≤ 0."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    A = _hvp_fn(loss_fn, diff, static, xs, ys, l2)
    bnorm = jnp.linalg.norm(b)

    def cond(c):
        x, r, p, rr, k, neg = c
        return (k < maxiter) & (jnp.sqrt(rr) > tol * bnorm) & (~neg)

    def body(c):
        x, r, p, rr, k, neg = c
        ap = A(p)
        pap = jnp.vdot(p, ap)
        neg = pap <= 0
        alpha = jnp.where(neg, 0.0, rr / jnp.where(neg, 1.0, pap))
        x = x + alpha * p
        r = r - alpha * ap
        rr_new = jnp.vdot(r, r)
        p = r + (rr_new / jnp.maximum(rr, 1e-300)) * p
        return x, r, p, rr_new, k + 1, neg

    x0 = jnp.zeros_like(b)
    init = (x0, b, b, jnp.vdot(b, b), jnp.asarray(0), jnp.asarray(False))
    x, r, _, rr, k, neg = jax.lax.while_loop(cond, body, init)
    return x, k, jnp.sqrt(rr) / jnp.maximum(bnorm, 1e-300), neg


@eqx.filter_jit
def _lissa(loss_fn, params, xs, ys, b, l2, scale, depth, batch_size, key):
    """LiSSA recursion v_j = b + v_{j-1} − (H_B + l2 I) v_{j-1} / scale, H_B on a random minibatch."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    n = xs.shape[0]

    def step(v, k):
        idx = jax.random.choice(k, n, (batch_size,), replace=False)
        hv = _hvp_fn(loss_fn, diff, static, xs[idx], ys[idx], l2)(v)
        v = b + v - hv / scale
        return v, jnp.linalg.norm(v)

    v, norms = jax.lax.scan(step, b, jax.random.split(key, depth))
    return v / scale, norms


@eqx.filter_jit
def _top_eigenvalue(loss_fn, params, xs, ys, l2, iters, key):
    """Power iteration for the largest eigenvalue of H + l2 I (LiSSA's scale must exceed it)."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    flat, _ = ravel_pytree(diff)
    A = _hvp_fn(loss_fn, diff, static, xs, ys, l2)
    v0 = jax.random.normal(key, flat.shape, flat.dtype)

    def body(_, v):
        w = A(v / jnp.linalg.norm(v))
        return w

    v = jax.lax.fori_loop(0, iters, body, v0)
    u = v / jnp.linalg.norm(v)
    return jnp.vdot(u, A(u))


@dataclasses.dataclass(frozen=True)
class InverseHVP:
    """The solution x of (H + λI) x = v and how it was obtained.

    - `vector`: x, a pytree like the differentiable parameters.
    - `method`: `"exact"`, `"cg"` or `"lissa"` (what actually ran).
    - `note`: a sentence for the user when `"auto"` switched method (None otherwise).
    - `iterations`: CG iterations or LiSSA depth (0 for exact).
    - `residual`: ‖(H + λI) x − v‖ / ‖v‖, checked with one extra Hessian-vector product.
    """

    vector: PyTree
    method: str
    note: str | None
    iterations: int
    residual: float


def resolve_method(num_params: int, method: Method = "auto", *, exact_max_params: int = EXACT_MAX_PARAMS) -> tuple[str, str | None]:
    """Which inverse-HVP solver runs for a model of P parameters, and a note when auto switched.

    **Returns** `(method, note)`: `"auto"` picks `"exact"` for P ≤ `exact_max_params`, else `"cg"`
    with a note. **Raises** `ValueError` for an unknown method.
    """
    if method not in ("auto", "exact", "cg", "lissa"):
        raise ValueError(f"unknown inverse-HVP method {method!r}; choose auto, exact, cg or lissa")
    if method != "auto":
        return method, None
    if num_params <= exact_max_params:
        return "exact", None
    return "cg", (
        f"The model has P = {num_params:,} parameters: the exact P × P Hessian (more than {exact_max_params:,}) is "
        "not built; conjugate gradient on Hessian-vector products (jvp of grad) solves H x = v instead."
    )


def inverse_hvp(
    loss_fn: LossFn,
    params: PyTree,
    xs,
    ys,
    vector: PyTree,
    *,
    damping: float = 0.0,
    method: Method = "auto",
    exact_max_params: int = EXACT_MAX_PARAMS,
    cg_tol: float | None = None,
    cg_maxiter: int = 1000,
    lissa_depth: int = 2000,
    lissa_scale: float | None = None,
    lissa_batch_size: int | None = None,
    seed: int = 0,
) -> InverseHVP:
    """Solve (H + λI) x = v for the Hessian H = (1/N) Σ ∇²ℓ_i of the training loss at `params`.

    The core of influence functions (Koh & Liang 2017, §3): `x = H⁻¹ ∇ℓ(z_test)` ("s_test").

    - `"exact"`: build H with `jax.hessian` on the raveled parameters, solve with
      `jnp.linalg.solve` (P ≤ a few thousand).
    - `"cg"`: conjugate gradient on Hessian-vector products (`jvp` of `grad`), never builds H;
      needs H + λI positive definite.
    - `"lissa"`: the stochastic Neumann series of Agarwal et al. (2017) as used by Koh & Liang:
      v_j = v + (I − (H_B + λI)/s) v_{j−1}, x ≈ v_J / s, with H_B on random minibatches. Converges
      when the scale s exceeds the largest eigenvalue of H + λI and H + λI is positive definite.
    - `"auto"`: exact up to `exact_max_params` parameters, else CG (see `resolve_method`).

    **Arguments** `loss_fn`, `params`, `xs (N, ...)`, `ys (N,)`; `vector` a pytree like the
    differentiable parameters; `damping` λ ≥ 0; `cg_tol` relative residual (default 1e-5 in
    float32, 1e-10 in float64); `lissa_scale` s (default 2 × the largest eigenvalue from power
    iteration); `lissa_batch_size` (default min(N, 256)); `seed` for LiSSA's minibatches.

    **Returns** an `InverseHVP`.

    **Raises** `InfluenceError` when CG meets a non-positive curvature direction or LiSSA
    diverges (NaN or a growing norm): both say to raise the damping (and for LiSSA the scale).
    """
    n = engine._check_batch(xs, ys)
    if damping < 0:
        raise InfluenceError(f"damping must be ≥ 0, got {damping:g}")
    params = engine.as_params(params)
    diff, _ = _split(params)
    flat, unravel = ravel_pytree(diff)
    b, _ = ravel_pytree(engine.as_params(vector))
    b = b.astype(flat.dtype)
    l2 = jnp.asarray(damping, flat.dtype)
    kind, note = resolve_method(flat.size, method, exact_max_params=exact_max_params)
    iterations = 0
    if kind == "exact":
        h = hessian(loss_fn, params, xs, ys, damping=damping)
        x = jnp.linalg.solve(h, b)
        if not bool(jnp.all(jnp.isfinite(x))):
            raise InfluenceError(
                f"the Hessian is singular at damping {damping:g}: raise the damping (L2 penalty) so H + λI is invertible"
            )
    elif kind == "cg":
        tol = cg_tol if cg_tol is not None else (1e-10 if flat.dtype == jnp.float64 else 1e-5)
        x, k, rel, neg = _cg(loss_fn, params, xs, ys, b, l2, jnp.asarray(tol, flat.dtype), jnp.asarray(cg_maxiter))
        iterations = int(k)
        if bool(neg):
            raise InfluenceError(
                f"conjugate gradient met a direction of non-positive curvature after {iterations} iterations: the "
                f"Hessian is not positive definite at damping {damping:g} (a non-convex model). Raise the damping."
            )
        if not bool(jnp.all(jnp.isfinite(x))):
            raise InfluenceError(f"conjugate gradient produced NaN at damping {damping:g}: raise the damping")
    else:
        key = jax.random.key(seed)
        if lissa_scale is None:
            top = float(_top_eigenvalue(loss_fn, params, xs, ys, l2, 30, key))
            lissa_scale = 2.0 * max(top, 1e-8)
        if not lissa_scale > 0:
            raise InfluenceError(f"the LiSSA scale must be > 0, got {lissa_scale:g}")
        bs = int(min(n, lissa_batch_size or 256))
        x, norms = _lissa(loss_fn, params, xs, ys, b, l2, jnp.asarray(lissa_scale, flat.dtype), lissa_depth, bs,
                          jax.random.fold_in(key, 1))
        norms = np.asarray(norms, np.float64)
        iterations = lissa_depth
        half = norms[len(norms) // 2 - 1] if len(norms) > 1 else norms[0]
        if not np.all(np.isfinite(norms)) or not bool(jnp.all(jnp.isfinite(x))) or norms[-1] > 4.0 * half:
            where = int(np.argmax(~np.isfinite(norms))) if not np.all(np.isfinite(norms)) else len(norms)
            raise InfluenceError(
                f"LiSSA diverged (the iterate's norm {'became NaN/inf at step ' + str(where) if where < len(norms) else 'kept growing'}"
                f", scale {lissa_scale:g}, damping {damping:g}): raise the damping (H + λI must be positive definite) "
                "or raise the scale (it must exceed the largest Hessian eigenvalue)"
            )
    residual = float(jnp.linalg.norm(ravel_pytree(hvp(loss_fn, params, xs, ys, unravel(x), damping=damping))[0] - b)
                     / jnp.maximum(jnp.linalg.norm(b), 1e-30))
    return InverseHVP(unravel(x), kind, note, iterations, residual)


# ------------------------------------------------------------------ influence functions


def predicted_loo_change(
    loss_fn: LossFn,
    params: PyTree,
    train_xs,
    train_ys,
    test_x,
    test_y,
    *,
    damping: float = 0.0,
    method: Method = "auto",
    chunk_size: int | None = None,
    **solver,
) -> Float[Array, "N"]:
    """Influence functions: predicted L_test(θ̂₋ᵢ) − L_test(θ̂) for removing each training example.

    θ̂ minimizes the objective F(θ) = (1/N) Σ_j ℓ(θ, z_j) + (λ/2)‖θ‖² with λ = `damping`, and θ̂₋ᵢ
    minimizes the same objective over the N − 1 other examples (mean over N − 1, same λ).

    **Sign and scale.** Removing z_i from a mean over N is up-weighting it by ε = −1/N
    (Koh & Liang 2017, eq. 1), so θ moves by Δθᵢ ≈ +(1/N) H⁻¹ ∇ℓᵢ with H = ∇²F(θ̂) (the
    Hessian of the mean loss plus λI), and the test loss changes by

        ΔL_test,i ≈ (1/N) ∇L_testᵀ H⁻¹ (∇ℓᵢ + λθ̂).

    The λθ̂ term appears because the retrained objective is a mean over N − 1 examples (the
    penalty's relative weight grows by N/(N−1)); it is the same for every i (it shifts all
    predictions by one constant and changes no ranking). Without it this is Koh & Liang's
    −(1/N)·I_up,loss(z_i, z_test). At an exact minimum λθ̂ = −(1/N)Σ_j∇ℓ_j, so the predictions sum to ≈ 0.
    **Positive = proponent**: removing z_i would raise the test loss (it helped); **negative =
    opponent**. Units: loss (same as ℓ), typically O(1/N).

    Computed with one inverse HVP s = H⁻¹∇L_test (`inverse_hvp`) and one streamed pass of
    per-example dot products ⟨∇ℓᵢ, s⟩ (never N × P). Accurate when F is strongly convex near θ̂
    (e.g. L2-regularized logistic regression); for non-convex models raise λ.

    **Arguments** `loss_fn(params, x, y) -> scalar` (one example); `params` at (or near) the
    minimum of F; `train_xs (N, ...)`, `train_ys (N,)`; `test_x`, `test_y` one example (no
    example axis); `damping` λ ≥ 0; `method` `"auto"` | `"exact"` | `"cg"` | `"lissa"`;
    `**solver` passed to `inverse_hvp` (e.g. `cg_tol`, `lissa_scale`).

    **Returns** `(N,)` float array of predicted test-loss changes.

    **Raises** `InfluenceError` (a `ValueError`) when the inverse HVP fails (see `inverse_hvp`).
    """
    return loo_influence(loss_fn, params, train_xs, train_ys, test_x, test_y, damping=damping, method=method,
                         chunk_size=chunk_size, **solver).scores


@dataclasses.dataclass(frozen=True, eq=False)
class LOOInfluence:
    """`predicted_loo_change` with its solver report: `scores (N,)` and `ihvp` (an `InverseHVP`)."""

    scores: np.ndarray
    ihvp: InverseHVP


def loo_influence(
    loss_fn: LossFn, params: PyTree, train_xs, train_ys, test_x, test_y, *, damping: float = 0.0,
    method: Method = "auto", chunk_size: int | None = None, **solver,
) -> LOOInfluence:
    """`predicted_loo_change` that also returns how H⁻¹∇L_test was solved (method, note, residual)."""
    n = engine._check_batch(train_xs, train_ys)
    params = engine.as_params(params)
    g_test = point_gradient(loss_fn, params, test_x, test_y)
    ih = inverse_hvp(loss_fn, params, train_xs, train_ys, g_test, damping=damping, method=method, **solver)
    dots = engine.per_example_dots(loss_fn, params, train_xs, train_ys, ih.vector, chunk_size=chunk_size)
    diff, _ = _split(params)
    reg = damping * float(_tree_vdot(diff, ih.vector))
    return LOOInfluence(np.asarray((dots + reg) / n), ih)


@eqx.filter_jit
def _quad_forms(loss_fn, params, xs, ys, hinv, chunk):
    diff, static = eqx.partition(params, eqx.is_inexact_array)

    def one(xy):
        g = jax.grad(lambda d: loss_fn(eqx.combine(d, static), *xy))(diff)
        v = ravel_pytree(g)[0]
        return v @ (hinv @ v)

    return engine._map(one, (xs, ys), chunk)  # None: one vmap (lax.map(batch_size=None) would be sequential)


def influence_self(
    loss_fn: LossFn, params: PyTree, xs, ys, *, damping: float = 0.0, exact_max_params: int = EXACT_MAX_PARAMS,
    chunk_size: int | None = None,
) -> Float[Array, "N"]:
    """Influence-function self-influence (1/N) ∇ℓᵢᵀ (H + λI)⁻¹ ∇ℓᵢ: the predicted rise of example i's
    own loss if it were removed (Koh & Liang 2017, §5.4). Exact Hessian only.

    **Returns** `(N,)` ≥ 0 for a positive-definite H. **Raises** `InfluenceError` if P exceeds
    `exact_max_params` (use TracIn or gradient-norm self-influence) or H + λI is singular.
    """
    n = engine._check_batch(xs, ys)
    params = engine.as_params(params)
    p = engine.num_params(params)
    if p > exact_max_params:
        raise InfluenceError(
            f"influence-function self-influence needs the exact Hessian; P = {p:,} > {exact_max_params:,}. "
            "Use TracIn or gradient-norm self-influence for this model."
        )
    h = hessian(loss_fn, params, xs, ys, damping=damping)
    hinv = jnp.linalg.inv(h)
    if not bool(jnp.all(jnp.isfinite(hinv))):
        raise InfluenceError(f"the Hessian is singular at damping {damping:g}: raise the damping")
    hinv = 0.5 * (hinv + hinv.T)
    return _quad_forms(loss_fn, params, xs, ys, hinv, engine._chunk(n, chunk_size or engine.DEFAULT_CHUNK)) / n


def tracin_self_influence(
    loss_fn: LossFn, checkpoints: Sequence[PyTree], lrs: Sequence[float], xs, ys, *,
    chunk_size: int | None = None,
) -> Float[Array, "N"]:
    """TracIn self-influence Σ_c η_c ‖∇θℓ(θ_c, z_i)‖² over saved checkpoints (Pruthi et al. 2020, §4.1).

    Unlike the last checkpoint's gradient norm, it remembers that a mislabeled example had a large
    gradient for most of training even after the model memorized it. Streamed.

    **Returns** `(N,)` ≥ 0. **Raises** `ValueError` if there are no checkpoints or lengths differ.
    """
    _check_checkpoints(checkpoints, lrs)
    total = 0.0
    for params, lr in zip(checkpoints, lrs):
        total = total + lr * jnp.square(engine.per_example_norms(loss_fn, params, xs, ys, chunk_size=chunk_size))
    return total


def self_influence(
    loss_fn: LossFn,
    params: PyTree,
    xs,
    ys,
    *,
    method: Literal["grad_norm", "tracin", "influence"] = "grad_norm",
    checkpoints: Sequence[PyTree] | None = None,
    lrs: Sequence[float] | None = None,
    damping: float = 0.0,
    chunk_size: int | None = None,
) -> Float[Array, "N"]:
    """Self-influence of every training example: high = suspicious (mislabeled, atypical, memorized).

    - `"grad_norm"`: ‖∇θℓ(θ, z_i)‖² at `params` (TracIn self-influence with one checkpoint).
    - `"tracin"`: Σ_c η_c ‖∇θℓ(θ_c, z_i)‖² over `checkpoints` with learning rates `lrs`
      (Pruthi et al. 2020); `params` is not used.
    - `"influence"`: (1/N) ∇ℓᵢᵀ (H + λI)⁻¹ ∇ℓᵢ with λ = `damping` (Koh & Liang 2017), exact
      Hessian only (small models).

    **Arguments** `loss_fn`, `params`, `xs (N, ...)`, `ys (N,)` as in `gradlab.engine`.

    **Returns** `(N,)` non-negative float array.

    **Raises** `ValueError` for an unknown method or missing checkpoints; `InfluenceError` as
    `influence_self`.
    """
    if method == "grad_norm":
        return jnp.square(engine.per_example_norms(loss_fn, params, xs, ys, chunk_size=chunk_size))
    if method == "tracin":
        if checkpoints is None or lrs is None:
            raise ValueError("TracIn self-influence needs checkpoints= and lrs=")
        return tracin_self_influence(loss_fn, checkpoints, lrs, xs, ys, chunk_size=chunk_size)
    if method == "influence":
        return influence_self(loss_fn, params, xs, ys, damping=damping, chunk_size=chunk_size)
    raise ValueError(f"unknown self-influence method {method!r}; choose grad_norm, tracin or influence")


# ------------------------------------------------------------------ the ground truth: retraining


@eqx.filter_jit
def _minimize(loss_fn, params, xs, ys, w, l2, tol, max_iter):
    """Full-batch L-BFGS (optax, zoom line search) on Σ w_j ℓ_j / Σ w_j + l2/2 ‖θ‖²."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    f = lambda d: _weighted_objective(loss_fn, d, static, xs, ys, w, l2)
    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(f)

    def step(carry):
        d, s = carry
        value, g = value_and_grad(d, state=s)
        updates, s = opt.update(g, s, d, value=value, grad=g, value_fn=f)
        return optax.apply_updates(d, updates), s

    def cond(carry):
        _, s = carry
        k = otu.tree_get(s, "count")
        g = otu.tree_get(s, "grad")
        return (k == 0) | ((k < max_iter) & (otu.tree_norm(g) >= tol))

    d, s = jax.lax.while_loop(cond, step, (diff, opt.init(diff)))
    gnorm = otu.tree_norm(jax.grad(f)(d))
    return eqx.combine(d, static), otu.tree_get(s, "count"), gnorm


@dataclasses.dataclass(frozen=True, eq=False)
class Minimum:
    """A converged model: `params`, L-BFGS `iterations`, final objective `grad_norm`."""

    params: PyTree
    iterations: int
    grad_norm: float


def minimize(
    loss_fn: LossFn, params: PyTree, xs, ys, *, l2: float = 0.0, exclude: int | None = None,
    tol: float | None = None, max_iter: int = 2000,
) -> Minimum:
    """Minimize `mean_j ℓ(θ, z_j) + l2/2 ‖θ‖²` (over all examples, or all but `exclude`) from `params`.

    Full-batch L-BFGS (`optax.lbfgs` with a zoom line search), warm-started at `params`, until the
    objective's gradient norm is below `tol` (default 1e-6 in float32, 1e-12 in float64) or
    `max_iter` iterations. Compiled once per shapes: the excluded example is a weight, not a shape.

    **Returns** a `Minimum`. **Raises** `ValueError` if `exclude` is out of range.
    """
    n = engine._check_batch(xs, ys)
    params = engine.as_params(params)
    dtype = ravel_pytree(_split(params)[0])[0].dtype
    w = jnp.ones(n, dtype)
    if exclude is not None:
        if not 0 <= int(exclude) < n:
            raise ValueError(f"example {exclude} does not exist (N = {n})")
        w = w.at[int(exclude)].set(0.0)
    if tol is None:
        tol = 1e-12 if dtype == jnp.float64 else 1e-6
    p, k, g = _minimize(loss_fn, params, xs, ys, w, jnp.asarray(l2, dtype), jnp.asarray(tol, dtype), jnp.asarray(max_iter))
    return Minimum(p, int(k), float(g))


def loo_retrain(
    loss_fn: LossFn, params: PyTree, xs, ys, indices: Sequence[int], *, l2: float = 0.0,
    tol: float | None = None, max_iter: int = 2000, progress: Callable[[int, int], None] | None = None,
) -> list[Minimum]:
    """Actual leave-one-out retraining: for each i in `indices`, minimize the objective without z_i.

    Warm-started from `params` (ideally the converged full-data minimum, see `minimize`):
    θ̂₋ᵢ = argmin (1/(N−1)) Σ_{j≠i} ℓ(θ, z_j) + l2/2 ‖θ‖². The ground truth for
    `predicted_loo_change` (Koh & Liang 2017, Fig. 2). `progress(done, total)` after each.

    **Returns** one `Minimum` per index.
    """
    out = []
    for k, i in enumerate(indices):
        out.append(minimize(loss_fn, params, xs, ys, l2=l2, exclude=int(i), tol=tol, max_iter=max_iter))
        if progress is not None:
            progress(k + 1, len(indices))
    return out


def point_loss(loss_fn: LossFn, params: PyTree, x, y) -> float:
    """ℓ(θ, x, y) of one example as a Python float."""
    return float(loss_fn(engine.as_params(params), x, y))


@dataclasses.dataclass(frozen=True, eq=False)
class RetrainingCheck:
    """Predicted vs actual leave-one-out change of one test loss (Koh & Liang 2017, Fig. 2).

    - `indices (k,)`: the training examples removed.
    - `predicted (k,)`: `predicted_loo_change` at the converged minimum.
    - `actual (k,)`: L_test(θ̂₋ᵢ) − L_test(θ̂) after retraining.
    - `pearson`, `spearman`: agreement (scipy.stats); NaN with fewer than 3 examples.
    - `base`: the converged full-data `Minimum`; `retrained`: one `Minimum` per index.
    - `ihvp`: how H⁻¹∇L_test was solved.
    """

    indices: np.ndarray
    predicted: np.ndarray
    actual: np.ndarray
    pearson: float
    spearman: float
    base: Minimum
    retrained: list
    ihvp: InverseHVP
    all_predicted: np.ndarray


def extreme_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """The k highest then the k lowest entries of `scores` (proponents, then opponents), no repeats."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    k = int(min(k, len(order) // 2))
    return np.concatenate([order[:k], order[::-1][:k]])


def check_against_retraining(
    loss_fn: LossFn, params: PyTree, train_xs, train_ys, test_x, test_y, *, damping: float = 0.0, k: int = 10,
    indices: Sequence[int] | None = None, method: Method = "auto", tol: float | None = None,
    max_iter: int = 2000, progress: Callable[[int, int], None] | None = None, **solver,
) -> RetrainingCheck:
    """Compare influence-function predictions with actual leave-one-out retraining.

    1. Converge the full objective `mean ℓ + damping/2 ‖θ‖²` from `params` (L-BFGS): θ̂.
    2. `predicted_loo_change` at θ̂ for all N examples.
    3. For `indices` (default: the k most positive and k most negative predictions), retrain
       without each example from θ̂ and measure L_test(θ̂₋ᵢ) − L_test(θ̂).

    **Returns** a `RetrainingCheck` with Pearson and Spearman correlations (`scipy.stats`).

    **Raises** `InfluenceError` as `inverse_hvp`.
    """
    base = minimize(loss_fn, params, train_xs, train_ys, l2=damping, tol=tol, max_iter=max_iter)
    inf = loo_influence(loss_fn, base.params, train_xs, train_ys, test_x, test_y, damping=damping, method=method, **solver)
    idx = np.asarray(indices if indices is not None else extreme_indices(inf.scores, k), int)
    l0 = point_loss(loss_fn, base.params, test_x, test_y)
    retrained = loo_retrain(loss_fn, base.params, train_xs, train_ys, idx, l2=damping, tol=tol, max_iter=max_iter,
                            progress=progress)
    actual = np.array([point_loss(loss_fn, m.params, test_x, test_y) - l0 for m in retrained])
    predicted = inf.scores[idx]
    pear, spear = correlations(predicted, actual)
    return RetrainingCheck(idx, predicted, actual, pear, spear, base, retrained, inf.ihvp, inf.scores)


# ------------------------------------------------------------------ summaries


def correlations(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(Pearson r, Spearman ρ) of two score vectors (scipy.stats); NaN if fewer than 3 or constant."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan"), float("nan")
    return float(stats.pearsonr(a, b)[0]), float(stats.spearmanr(a, b)[0])


def method_agreement(scores: dict[str, np.ndarray]) -> np.ndarray:
    """Spearman rank correlation matrix (M × M) between the score vectors of M methods (scipy.stats)."""
    names = list(scores)
    m = np.stack([np.asarray(scores[k], np.float64) for k in names], 1)
    if len(names) == 1:
        return np.ones((1, 1))
    rho = stats.spearmanr(m).statistic
    return np.atleast_2d(np.nan_to_num(np.asarray(rho, np.float64), nan=0.0))


# ------------------------------------------------------------------ one experiment, for the page


def _arrays(fitted):
    d = fitted.data
    return jnp.asarray(d.x_train), jnp.asarray(d.y_train)


def _test_point(fitted, index: int):
    d = fitted.data
    if not 0 <= int(index) < len(d.y_test):
        raise ValueError(f"test point {index} does not exist: there are {len(d.y_test)} test points (0 to {len(d.y_test) - 1})")
    return jnp.asarray(d.x_test[int(index)]), jnp.asarray(d.y_test[int(index)])


@dataclasses.dataclass(frozen=True, eq=False)
class PointScores:
    """Every method's scores between the training set and one test point of a fitted experiment.

    - `scores {method: (N,)}`: keys of `METHODS` (`"influence"` missing when it failed); high = proponent.
    - `ihvp`: how the influence function's H⁻¹∇L_test was solved (None if it failed).
    - `error`: the influence function's failure message (e.g. raise the damping), else None.
    """

    scores: dict
    ihvp: InverseHVP | None
    error: str | None


def score_test_point(fitted, test_index: int, *, damping: float, method: Method = "auto",
                     chunk_size: int | None = None, **solver) -> PointScores:
    """Gradient dot, gradient cosine and TracIn at the last checkpoint / over all checkpoints, and the
    influence function (damping λ) for test point `test_index` of a `gradlab.experiment.Fitted`.

    **Raises** `ValueError` for a test index out of range. An influence-function failure
    (`InfluenceError`) is reported in `error`, the other methods still computed.
    """
    xs, ys = _arrays(fitted)
    x, y = _test_point(fitted, test_index)
    f, model = fitted.loss_fn, fitted.model
    out = {
        "grad_dot": np.asarray(grad_dot(f, model, xs, ys, x, y, chunk_size=chunk_size)),
        "grad_cosine": np.asarray(grad_cosine(f, model, xs, ys, x, y, chunk_size=chunk_size)),
        "tracin": np.asarray(tracin(f, fitted.run.checkpoints, fitted.run.lrs, xs, ys, x, y, chunk_size=chunk_size)),
    }
    try:
        r = loo_influence(f, model, xs, ys, x, y, damping=damping, method=method, chunk_size=chunk_size, **solver)
    except InfluenceError as err:
        return PointScores(out, None, str(err))
    out["influence"] = r.scores
    return PointScores(out, r.ihvp, None)


def self_influence_all(fitted, *, damping: float, chunk_size: int | None = None) -> tuple[dict, str | None]:
    """Self-influence of every training example of a fitted experiment by each available method.

    **Returns** `({"grad_norm": (N,), "tracin": (N,)[, "influence": (N,)]}, note)`: the
    influence-function variant only for models small enough for the exact Hessian; `note` says why
    it is missing (or None).
    """
    xs, ys = _arrays(fitted)
    f = fitted.loss_fn
    out = {
        "grad_norm": np.asarray(self_influence(f, fitted.model, xs, ys, method="grad_norm", chunk_size=chunk_size)),
        "tracin": np.asarray(self_influence(f, fitted.model, xs, ys, method="tracin", checkpoints=fitted.run.checkpoints,
                                            lrs=fitted.run.lrs, chunk_size=chunk_size)),
    }
    try:
        out["influence"] = np.asarray(self_influence(f, fitted.model, xs, ys, method="influence", damping=damping,
                                                     chunk_size=chunk_size))
        note = None
    except InfluenceError as err:
        note = str(err)
    return out, note


def retraining_check(fitted, test_index: int, *, damping: float, k: int = 10, method: Method = "auto",
                     progress: Callable[[int, int], None] | None = None, **solver) -> RetrainingCheck:
    """`check_against_retraining` for test point `test_index` of a fitted experiment, from its last checkpoint."""
    xs, ys = _arrays(fitted)
    x, y = _test_point(fitted, test_index)
    return check_against_retraining(fitted.loss_fn, fitted.model, xs, ys, x, y, damping=damping, k=k, method=method,
                                    progress=progress, **solver)
