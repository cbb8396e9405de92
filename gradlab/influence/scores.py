"""Attribution scores: which training examples helped or hurt a test prediction.

Convention throughout: **high = proponent** (the example lowers the test loss / raises the test
output; removing it would hurt), **low = opponent**.

- `grad_dot`, `grad_cosine`: ⟨∇ℓ(z_i), ∇ℓ(z)⟩ at one model, raw or divided by both norms.
- `tracin`: TracInCP (Pruthi et al. 2020, eq. 3): Σ_c η_c ⟨∇ℓ(θ_c, z_i), ∇ℓ(θ_c, z)⟩ over the
  checkpoints saved *after* training steps, each weighted by the learning rate used there.
- `predicted_loo_change`: influence functions (Koh & Liang 2017, eq. 2) at a converged θ̂.
- `trak`: TRAK (Park et al. 2023): projected per-example gradients, the after-kernel solve (the softmax
  Gauss–Newton by default, or Algorithm 1's margin kernel), averaged over an ensemble of trained models.
- `self_influence`: each example's support for itself; high = suspicious (mislabeled, atypical).

The methods the page, the LDS and the exports loop over are `gradlab.influence.methods.METHODS` (one file each).

Everything streams over chunks of training examples through `gradlab.engine`; nothing holds N × P.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float

from gradlab import engine
from gradlab.influence.solvers import (
    EXACT_MAX_PARAMS, InfluenceError, InverseHVP, LossFn, Method, PyTree, conjugate_gradient, hessian, inverse_hvp_batch,
    split,
)
from gradlab.memory import TRAK_CG_BLOCK

#: Self-influence variants of `self_influence`, name -> formula (the page lists each registered method's own:
#: `gradlab.influence.methods.METHODS`).
SELF_INFLUENCE = {
    "grad_norm": "‖∇ℓᵢ‖² at the model",
    "tracin": "TracIn self-influence Σ_c η_c ‖∇ℓᵢ(θ_c)‖²",
    "influence": "influence function ∇ℓᵢᵀ(H + δI)⁻¹∇ℓᵢ / N",
}


def _one(a):
    return jax.tree.map(lambda v: jnp.asarray(v)[None], a)


def point_gradient(loss_fn: LossFn, params: PyTree, x, y) -> PyTree:
    """∇θ ℓ(θ, x, y) of ONE example: a pytree like the differentiable part of `params`."""
    return jax.tree.map(lambda a: a[0], engine.per_example_grads(loss_fn, params, _one(x), _one(y)))


def flat_gradients(loss_fn: LossFn, params: PyTree, xs, ys) -> Float[Array, "T P"]:
    """Per-example gradients of a FEW examples (test points) as a `(T, P)` matrix (`ravel_pytree` order)."""
    return engine.flatten_per_example(engine.per_example_grads(loss_fn, params, xs, ys))


def project(loss_fn: LossFn, params: PyTree, xs, ys, matrix: Float[Array, "P K"], *,
            chunk_size: int | None = None) -> Float[Array, "N K"]:
    """Projected per-example gradients: row i is ravel(∇θℓ(θ, z_i)) @ `matrix`, streamed over chunks of examples.

    Peak memory ≈ chunk_size × P + P × K; the N × P matrix G is never built. The last chunk is padded
    (by repeating example 0) so one compiled shape serves every chunk.

    **Arguments** `matrix (P, K)`: K test gradients as columns (then this is K gradient dot products per
    example) or a random projection (TRAK). **Returns** `(N, K)`.
    """
    return _per_chunk(loss_fn, params, xs, ys, chunk_size, lambda g: g @ matrix)


def streamed_dots(loss_fn: LossFn, params: PyTree, xs, ys, rows: Float[Array, "T P"], *,
                  chunk_size: int | None = None) -> Float[Array, "T N"]:
    """⟨∇θℓ(θ, z_i), r_t⟩ for every training example and every row r_t of `rows (T, P)` (`ravel_pytree` order of
    `params`' differentiable leaves), never N × P. One row: one streamed pass of `engine.per_example_dots` (1.8 against
    78 ms for a pass of flat gradients); several: one pass of flat gradients in chunks of at most `engine.CHUNK_BYTES`
    (`project`), each chunk times all rows. **Returns** `(T, N)`."""
    rows = jnp.asarray(rows)
    if rows.shape[0] == 1:
        unravel = ravel_pytree(split(engine.as_params(params))[0])[1]
        return engine.per_example_dots(loss_fn, params, xs, ys, unravel(rows[0]), chunk_size=chunk_size)[None]
    chunk = chunk_size or max(1, min(engine.DEFAULT_CHUNK, engine.CHUNK_BYTES // (4 * max(rows.shape[1], 1))))
    return project(loss_fn, params, xs, ys, rows.T, chunk_size=chunk).T


def grad_dot(loss_fn: LossFn, params: PyTree, train_xs, train_ys, test_x, test_y, *,
             chunk_size: int | None = None) -> Float[Array, "N"]:
    """⟨∇θℓ(θ, z_i), ∇θℓ(θ, z)⟩ for every training example z_i and ONE test point z (no example axis).

    One SGD step of size η on z_i changes the test loss by ≈ −η·grad_dot. Streamed
    (`engine.per_example_dots`). **Returns** `(N,)` (loss² per parameter²). **Raises** as the engine.
    """
    g = point_gradient(loss_fn, params, test_x, test_y)
    return engine.per_example_dots(loss_fn, params, train_xs, train_ys, g, chunk_size=chunk_size)


def grad_cosine(loss_fn: LossFn, params: PyTree, train_xs, train_ys, test_x, test_y, *,
                chunk_size: int | None = None) -> Float[Array, "N"]:
    """⟨g_i, g⟩ / (‖g_i‖‖g‖): `grad_dot` without the norms, in [−1, 1] (0 where a gradient is 0).

    Keeps large-gradient (often mislabeled) examples from dominating every test point.
    """
    g = point_gradient(loss_fn, params, test_x, test_y)
    dots = engine.per_example_dots(loss_fn, params, train_xs, train_ys, g, chunk_size=chunk_size)
    norms = engine.per_example_norms(loss_fn, params, train_xs, train_ys, chunk_size=chunk_size)
    denom = norms * jnp.sqrt(sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(g)))
    return jnp.where(denom > 0, dots / jnp.maximum(denom, 1e-30), 0.0)


def _check_checkpoints(checkpoints: Sequence, lrs: Sequence[float]) -> None:
    if len(checkpoints) == 0:
        raise ValueError("TracIn needs at least one checkpoint taken after training steps")
    if len(checkpoints) != len(lrs):
        raise ValueError(f"got {len(checkpoints)} checkpoints but {len(lrs)} learning rates")


def tracin_checkpoints(run) -> tuple[tuple, tuple[float, ...]]:
    """The checkpoints TracIn sums over and their learning rates, from a `gradlab.train.TrainResult`.

    The initialization (step 0) is not a checkpoint of training: no step was taken there. Each later
    checkpoint carries the learning rate the optimizer actually used at it (`run.lrs`).

    **Returns** `(checkpoints, lrs)`. **Raises** `ValueError` for a run with no training steps.
    """
    pairs = [(c, lr) for c, s, lr in zip(run.checkpoints, run.steps, run.lrs) if s > 0]
    if not pairs:
        raise ValueError("the run has no training steps, so TracIn has no checkpoint: train for at least one step")
    return tuple(c for c, _ in pairs), tuple(float(lr) for _, lr in pairs)


def tracin(loss_fn: LossFn, checkpoints: Sequence[PyTree], lrs: Sequence[float], train_xs, train_ys, test_x, test_y,
           *, chunk_size: int | None = None) -> Float[Array, "N"]:
    """TracInCP: Σ_c η_c ⟨∇θℓ(θ_c, z_i), ∇θℓ(θ_c, z)⟩ (Pruthi et al. 2020, eq. 3).

    Derived for SGD: a step of size η_c on z_i changes the test loss by −η_c⟨∇ℓ_i, ∇ℓ(z)⟩. Under Adam
    the step is preconditioned and this is not the first-order effect of the run (use an SGD-trained run).

    **Arguments** `checkpoints` after training steps (see `tracin_checkpoints`), `lrs` the learning rate
    used at each; the rest as `grad_dot`. **Returns** `(N,)`. **Raises** `ValueError` if there are no
    checkpoints or the lengths differ.
    """
    _check_checkpoints(checkpoints, lrs)
    total = 0.0
    for params, lr in zip(checkpoints, lrs):
        total = total + lr * grad_dot(loss_fn, params, train_xs, train_ys, test_x, test_y, chunk_size=chunk_size)
    return total


# ------------------------------------------------------------------ influence functions


def influence_scores(
    loss_fn: LossFn, params: PyTree, train_xs, train_ys, test_xs, test_ys, *, l2: float = 0.0, damping: float = 0.0,
    method: Method = "auto", chunk_size: int | None = None, **solver,
) -> tuple[Float[Array, "T N"], InverseHVP]:
    """Influence functions for T test points at once: predicted L_test(θ̂₋ᵢ) − L_test(θ̂).

    θ̂ minimizes F(θ) = (1/N) Σ_j ℓ(θ, z_j) + λ/2‖θ‖² (λ = `l2`; see `solvers.minimize`). Removing z_i
    (ε = −1/N, Koh & Liang 2017, eq. 1) moves θ by ≈ (1/N)(H_F + δI)⁻¹(∇ℓᵢ + λθ̂), so

        ΔL_test,i ≈ (1/N) ∇L_testᵀ (H_F + δI)⁻¹ (∇ℓᵢ + λθ̂)

    (the λθ̂ term: the retrained mean is over N − 1 examples; it shifts every i by one constant).
    δ = `damping` is added to the Hessian only. Positive = proponent. One batched inverse HVP
    (`solvers.inverse_hvp_batch`) and one streamed pass of `engine.per_example_dots` per test point.

    **Arguments** `test_xs (T, ...)`, `test_ys (T,)`; `l2` λ ≥ 0, `damping` δ ≥ 0; `method` and
    `**solver` as `inverse_hvp_batch`. **Returns** `((T, N) loss units, InverseHVP)`.
    **Raises** `InfluenceError` as `inverse_hvp_batch`.
    """
    n = engine.check_batch(train_xs, train_ys)
    params = engine.as_params(params)
    g_test = flat_gradients(loss_fn, params, test_xs, test_ys)
    s, info = inverse_hvp_batch(loss_fn, params, train_xs, train_ys, g_test, l2=l2, damping=damping, method=method,
                                **solver)
    theta, unravel = ravel_pytree(split(params)[0])
    # ⟨∇ℓᵢ, s_t⟩ one test point at a time by the engine's streamed dots: the program grad_dot and TracIn run (no
    # program of its own to compile); 1 test point: 1.8 against 78 ms for a pass of flat gradients, 32: about as fast
    dots = jnp.stack([engine.per_example_dots(loss_fn, params, train_xs, train_ys, unravel(row), chunk_size=chunk_size)
                      for row in s])  # (T, N)
    return (dots + l2 * (s @ theta)[:, None]) / n, info


def predicted_loo_change(
    loss_fn: LossFn, params: PyTree, train_xs, train_ys, test_x, test_y, *, l2: float = 0.0, damping: float = 0.0,
    method: Method = "auto", chunk_size: int | None = None, **solver,
) -> Float[Array, "N"]:
    """Influence function for ONE test point: predicted L_test(θ̂₋ᵢ) − L_test(θ̂) (Koh & Liang 2017).

    `influence_scores` with T = 1; `params` should be the minimum θ̂ of mean ℓ + λ/2‖θ‖² (λ = `l2`),
    `damping` δ is added to the Hessian only. **Returns** `(N,)`, positive = proponent, loss units,
    typically O(1/N). **Raises** `InfluenceError` when the inverse HVP fails (raise the damping).
    """
    scores, _ = influence_scores(loss_fn, params, train_xs, train_ys, _one(test_x), _one(test_y), l2=l2,
                                 damping=damping, method=method, chunk_size=chunk_size, **solver)
    return scores[0]


# ------------------------------------------------------------------ TRAK


def margin(loss_fn: LossFn, task: str = "classification") -> LossFn:
    """TRAK's model output f(θ, z): for classification the margin log p_y − log(1 − p_y) with
    p_y = exp(−ℓ) (ℓ a cross-entropy); for regression −ℓ. Higher = better fit."""
    if task == "classification":
        def f(params, x, y):
            ell = loss_fn(params, x, y)
            return -ell - jnp.log(-jnp.expm1(-jnp.maximum(ell, 1e-12)))
    else:
        def f(params, x, y):
            return -loss_fn(params, x, y)
    return f


def random_projection(key: Array, p: int, k: int, dtype) -> Float[Array, "P K"] | None:
    """TRAK's projector: a P × K Gaussian (Johnson–Lindenstrauss) matrix R, entries N(0, 1/K).

    **Arguments** `key`: a JAX PRNG key; `p`: P, the number of parameters; `k`: K, the projected
    dimension; `dtype`: R's float dtype.

    **Returns** `(P, K)` R, or None (no projection) when K ≥ P: an invertible R leaves TRAK's
    scores unchanged, so the gradients are used as they are (Park et al. 2023, §3).
    """
    return None if k >= p else jax.random.normal(key, (p, k), dtype) / jnp.sqrt(k)


def _projected(loss_fn, params, xs, ys, r, chunk_size):
    """Per-example loss gradients times R (streamed, `project`), or unprojected when R is None."""
    return _per_chunk(loss_fn, params, xs, ys, chunk_size, (lambda g: g) if r is None else (lambda g: g @ r))


def _ridge(k, c: float, r):
    """K + c RᵀR: c‖θ‖²/2's curvature in the projected coordinates (c I without a projection)."""
    if c == 0:
        return k
    return k + c * jnp.eye(k.shape[0], dtype=k.dtype) if r is None else k + c * (r.T @ r)


def class_probabilities(loss_fn: LossFn, params: PyTree, xs, n_classes: int) -> Float[Array, "N C"]:
    """p(c | x_i) = exp(−ℓ(θ, x_i, c)) for every class c: `(N, C)`. Assumes ℓ is a cross-entropy −log p_y."""
    xs = jnp.asarray(xs)
    at = jax.vmap(loss_fn, in_axes=(None, 0, 0))
    return jnp.exp(-jnp.stack([at(params, xs, jnp.full((xs.shape[0],), c, jnp.int32)) for c in range(n_classes)], 1))


def gauss_newton_kernel(loss_fn: LossFn, params: PyTree, xs, n_classes: int, r: Array | None, *,
                        chunk_size: int | None = None) -> Float[Array, "K K"]:
    """Rᵀ G R: the Gauss–Newton matrix G of the mean softmax cross-entropy, (1/N) Σ_i J_iᵀ(diag p_i − p_i p_iᵀ)J_i,
    in the projected coordinates (R = None: P × P).

    Built from loss gradients alone, through the identity diag p − ppᵀ = Σ_c p_c (e_c − p)(e_c − p)ᵀ and
    ∇θℓ(θ, x, c) = J(p − e_c): G = (1/N) Σ_i Σ_c p_ic g_ic g_icᵀ with g_ic the gradient at label c. For a
    softmax output this is also the Fisher information (Martens 2020, §9.2). C streamed gradient passes over N.
    """
    xs = jnp.asarray(xs)
    n = xs.shape[0]
    p = class_probabilities(loss_fn, params, xs, n_classes)
    k = 0.0
    for c in range(n_classes):
        phi = _projected(loss_fn, params, xs, jnp.full((n,), c, jnp.int32), r, chunk_size)      # (N, k)
        k = k + (phi * p[:, c:c + 1]).T @ phi
    return k / n


@eqx.filter_jit
def _gauss_newton_solve(loss_fn, params, xs, labels, rhs, shift, tol):
    """(G + shift·I)⁻¹ b for every row b of `rhs (T, P)` (T ≤ `TRAK_CG_BLOCK`: the vmapped products hold
    T × N × C activations), matrix-free: conjugate gradient on Gauss–Newton-vector products
    Gv = (1/N) Σ_ic p_ic g_ic (g_icᵀv), one `jvp` and one `vjp` of the (N, C) losses at every label."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    flat, unravel = ravel_pytree(diff)
    every = lambda z: jax.vmap(lambda x: jax.vmap(lambda c: loss_fn(eqx.combine(unravel(z), static), x, c))(labels))(xs)
    ell, pullback = jax.vjp(every, flat)
    weight = jnp.exp(-ell) / xs.shape[0]                                                      # p_ic / N

    def gv(v):
        return pullback(weight * jax.jvp(every, (flat,), (v,))[1])[0] + shift * v

    return jax.vmap(lambda b: conjugate_gradient(gv, b, tol, 10 * flat.size))(rhs)


#: TRAK's kernels: the softmax Gauss–Newton of the trained objective (multiclass Newton step), or Algorithm 1's.
TRAK_KERNELS = {
    "gauss_newton": "Gauss–Newton of mean ℓ + λ/2‖θ‖² (the multiclass Newton step)",
    "algorithm1": "Park et al. Algorithm 1: margin gradients, ΦᵀΦ, Q = 1 − p",
}


def trak(
    loss_fn: LossFn, models: Sequence[PyTree], train_xs, train_ys, test_xs, test_ys, *, proj_dim: int = 512,
    task: str = "classification", kernel: str = "gauss_newton", l2: float = 0.0, damping: float = 0.0,
    n_classes: int | None = None, seed: int = 0, chunk_size: int | None = None,
) -> Float[Array, "T N"]:
    """TRAK scores (Park et al. 2023) for T test points, averaged over an ensemble of models.

    Each model θ_m is linearized and its gradients projected by a P × k Gaussian R_m (streamed through the
    engine, never N × P; k ≥ P uses them unprojected, and the Gauss–Newton kernel is then solved matrix-free by
    conjugate gradient, never P × P: `_gauss_newton_solve`). Two after-kernels:

    - `"gauss_newton"` (classification; the default): the one-step Newton estimate of leave-one-out for the
      linearized model under the softmax loss it was trained with, i.e. the influence function with the
      Gauss–Newton matrix (`gauss_newton_kernel`) in the projected coordinates:
          τ_m(z)_i = φ(z)ᵀ (RᵀGR + (λ + δ) RᵀR)⁻¹ Rᵀ(∇θℓᵢ + λθ_m) / N,   φ = Rᵀ∇θℓ,
      in the influence function's units (predicted change of the test loss when z_i is removed; the λθ_m
      term as there). λ is the objective's L2 (θ_m should be its optimum); δ optional damping. Park et al.
      reduce a multiclass output to the binary margin (Algorithm 1); this keeps all C classes. With one
      model, k ≥ P and G replaced by the Hessian it is `influence_scores`.
    - `"algorithm1"`: Algorithm 1 without sparsification: φ = ∇ of the margin (`margin`), τ = φ(z)ᵀ(ΦᵀΦ + δRᵀR)⁻¹ΦᵀQ
      with Q = diag(1 − p_i) averaged over models (regression: output −ℓ, Q = I).

    **Arguments** `models`: independently trained models of one architecture; `train_xs (N, ...)`,
    `test_xs (T, ...)`; `proj_dim` k; `l2` λ ≥ 0, `damping` δ ≥ 0; `n_classes` C (default: max label + 1);
    `seed` for the projections.

    **Returns** `(T, N)`; high = proponent (raises the test output).

    **Raises** `ValueError` for no models, k < 1, an unknown kernel, or the Gauss–Newton kernel on regression;
    `InfluenceError` if the kernel is singular (raise λ or δ; for Algorithm 1 lower k below N).
    """
    if len(models) == 0 or proj_dim < 1:
        raise ValueError(f"TRAK needs at least one model and a projection dimension ≥ 1, got {len(models)} and {proj_dim}")
    if kernel not in TRAK_KERNELS or (kernel == "gauss_newton" and task != "classification"):
        raise ValueError(f"unknown TRAK kernel {kernel!r} for {task}: use one of {list(TRAK_KERNELS)} "
                         "(the Gauss–Newton kernel is for classification)")
    train_xs, train_ys = jnp.asarray(train_xs), jnp.asarray(train_ys)
    n = train_ys.shape[0]
    if kernel == "gauss_newton" and n_classes is None:
        n_classes = int(jnp.maximum(jnp.max(train_ys), jnp.max(jnp.asarray(test_ys)))) + 1
    out = 0.0
    q_sum = 0.0
    for m, params in enumerate(models):
        params = engine.as_params(params)
        p = engine.num_params(params)
        theta = ravel_pytree(split(params)[0])[0]
        r = random_projection(jax.random.fold_in(jax.random.key(seed), m), p, int(proj_dim), theta.dtype)
        if kernel == "gauss_newton" and r is None:   # k ≥ P: the exact kernel, matrix-free (never P × P)
            g_test = flat_gradients(loss_fn, params, test_xs, test_ys)
            tol = 1e-10 if g_test.dtype == jnp.float64 else 1e-5
            shift = jnp.asarray(l2 + damping, g_test.dtype)
            x = jnp.concatenate([_gauss_newton_solve(loss_fn, params, train_xs, jnp.arange(n_classes),
                                                     g_test[i:i + TRAK_CG_BLOCK], shift, tol)
                                 for i in range(0, len(g_test), TRAK_CG_BLOCK)])                 # (T, P)
            if not bool(jnp.all(jnp.isfinite(x))):
                raise InfluenceError("TRAK's Gauss–Newton solve failed: raise the regularization λ or the damping δ")
            out = out + (project(loss_fn, params, train_xs, train_ys, x.T, chunk_size=chunk_size).T
                         + l2 * (x @ theta)[:, None]) / n
            continue
        f = loss_fn if kernel == "gauss_newton" else margin(loss_fn, task)
        phi = _projected(f, params, train_xs, train_ys, r, chunk_size)                         # (N, k)
        phi_test = flat_gradients(f, params, test_xs, test_ys)
        phi_test = phi_test if r is None else phi_test @ r                                    # (T, k)
        if kernel == "gauss_newton":   # projected here: k < P
            k = _ridge(gauss_newton_kernel(loss_fn, params, train_xs, n_classes, r, chunk_size=chunk_size), l2 + damping, r)
        else:
            k = _ridge(phi.T @ phi, damping, r)
        sol = jnp.linalg.solve(k, phi_test.T)                                                  # (k, T)
        if not bool(jnp.all(jnp.isfinite(sol))):
            raise InfluenceError("TRAK's kernel is singular: raise the regularization λ or the damping δ"
                                 + (", or lower the projection dimension below N" if kernel == "algorithm1" else ""))
        if kernel == "gauss_newton":   # in loss units, with the λθ term of `influence_scores` (a constant per test point)
            out = out + (sol.T @ phi.T + l2 * (sol.T @ (theta @ r))[:, None]) / n             # (T, N)
        else:
            out = out + sol.T @ phi.T
        if kernel == "algorithm1":
            q_sum = q_sum + (-jnp.expm1(-jax.vmap(loss_fn, in_axes=(None, 0, 0))(params, train_xs, train_ys))
                             if task == "classification" else jnp.ones(n, phi.dtype))          # 1 − p_i
    out = out / len(models)
    return out * (q_sum / len(models)) if kernel == "algorithm1" else out


# ------------------------------------------------------------------ self-influence


def _quad_forms(loss_fn, params, xs, ys, a, chunk_size):
    """gᵢᵀ A gᵢ for every example, streamed over chunks (A is P × P)."""
    return _per_chunk(loss_fn, params, xs, ys, chunk_size, lambda g: jnp.sum((g @ a) * g, axis=1))


def _per_chunk(loss_fn, params, xs, ys, chunk_size, rows):
    """`rows(G)` of each chunk's flat per-example gradients G (chunk × P), stacked over all N examples.
    The last chunk repeats the final example, so one compiled shape serves every chunk."""
    n = engine.check_batch(xs, ys)
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    chunk = int(min(chunk_size or engine.DEFAULT_CHUNK, n))
    out = []
    for s in range(0, n, chunk):
        idx = jnp.minimum(jnp.arange(s, s + chunk), n - 1)
        g = flat_gradients(loss_fn, params, xs[idx], ys[idx])
        out.append(rows(g)[: min(chunk, n - s)])
    return jnp.concatenate(out)


def grad_norm_self_influence(loss_fn: LossFn, params: PyTree, xs, ys, *,
                             chunk_size: int | None = None) -> Float[Array, "N"]:
    """‖∇θℓ(θ, z_i)‖² at `params` for every training example: `(N,)` ≥ 0 (grad-dot's self-influence)."""
    return jnp.square(engine.per_example_norms(loss_fn, params, xs, ys, chunk_size=chunk_size))


def tracin_self_influence(loss_fn: LossFn, checkpoints: Sequence[PyTree], lrs: Sequence[float], xs, ys, *,
                          chunk_size: int | None = None) -> Float[Array, "N"]:
    """Σ_c η_c ‖∇θℓ(θ_c, z_i)‖² over `checkpoints` / `lrs` (Pruthi et al. 2020, §4.1): `(N,)` ≥ 0.
    **Raises** `ValueError` for no checkpoints or lengths that differ."""
    _check_checkpoints(checkpoints, lrs)
    return sum(lr * grad_norm_self_influence(loss_fn, c, xs, ys, chunk_size=chunk_size) for c, lr in zip(checkpoints, lrs))


def influence_self_influence(loss_fn: LossFn, params: PyTree, xs, ys, *, l2: float = 0.0, damping: float = 0.0,
                             exact_max_params: int = EXACT_MAX_PARAMS, chunk_size: int | None = None) -> Float[Array, "N"]:
    """(1/N) ∇ℓᵢᵀ(H_F + δI)⁻¹∇ℓᵢ at θ̂ = `params`: the predicted rise of example i's own loss if removed (Koh & Liang
    2017, §5.4), exact Hessian of mean ℓ + λ/2‖θ‖² (λ = `l2`) only. **Returns** `(N,)` ≥ 0.
    **Raises** `InfluenceError` when P > `exact_max_params` or H_F + δI is singular."""
    n = engine.check_batch(xs, ys)
    p = engine.num_params(params)
    if p > exact_max_params:
        raise InfluenceError(f"influence-function self-influence needs the exact Hessian; P = {p:,} > "
                             f"{exact_max_params:,}. Use TracIn or gradient-norm self-influence for this model.")
    h = hessian(loss_fn, params, xs, ys, l2=l2, damping=damping)
    hinv = jnp.linalg.inv(h)
    if not bool(jnp.all(jnp.isfinite(hinv))):
        raise InfluenceError(f"H + δI is singular at damping δ = {damping:g}: raise the damping")
    hinv = 0.5 * (hinv + hinv.T)
    return _quad_forms(loss_fn, params, xs, ys, hinv, chunk_size) / n


def _self_grad_norm(loss_fn, params, xs, ys, *, chunk_size, **_):
    return grad_norm_self_influence(loss_fn, params, xs, ys, chunk_size=chunk_size)


def _self_tracin(loss_fn, params, xs, ys, *, checkpoints, lrs, chunk_size, **_):
    if checkpoints is None or lrs is None:
        raise ValueError("TracIn self-influence needs checkpoints= and lrs=")
    return tracin_self_influence(loss_fn, checkpoints, lrs, xs, ys, chunk_size=chunk_size)


def _self_influence_fn(loss_fn, params, xs, ys, *, l2, damping, exact_max_params, chunk_size, **_):
    return influence_self_influence(loss_fn, params, xs, ys, l2=l2, damping=damping, exact_max_params=exact_max_params,
                                    chunk_size=chunk_size)


_SELF = {"grad_norm": _self_grad_norm, "tracin": _self_tracin, "influence": _self_influence_fn}


def self_influence(
    loss_fn: LossFn, params: PyTree, xs, ys, *, method: Literal["grad_norm", "tracin", "influence"] = "grad_norm",
    checkpoints: Sequence[PyTree] | None = None, lrs: Sequence[float] | None = None, l2: float = 0.0,
    damping: float = 0.0, exact_max_params: int = EXACT_MAX_PARAMS, chunk_size: int | None = None,
) -> Float[Array, "N"]:
    """Self-influence of every training example: high = suspicious (mislabeled, atypical, memorized).

    - `"grad_norm"`: ‖∇θℓ(θ, z_i)‖² at `params` (`grad_norm_self_influence`).
    - `"tracin"`: Σ_c η_c ‖∇θℓ(θ_c, z_i)‖² over `checkpoints` / `lrs` (Pruthi et al. 2020, §4.1);
      `params` unused (`tracin_self_influence`).
    - `"influence"`: (1/N) ∇ℓᵢᵀ(H_F + δI)⁻¹∇ℓᵢ, the predicted rise of example i's own loss if removed
      (Koh & Liang 2017, §5.4); exact Hessian only, `params` should be θ̂ (`influence_self_influence`).

    **Returns** `(N,)` ≥ 0. **Raises** `ValueError` for an unknown method or missing checkpoints;
    `InfluenceError` when P > `exact_max_params` or H_F + δI is singular.
    """
    if method not in _SELF:
        raise ValueError(f"unknown self-influence method {method!r}; choose {', '.join(SELF_INFLUENCE)}")
    return _SELF[method](loss_fn, params, xs, ys, checkpoints=checkpoints, lrs=lrs, l2=l2, damping=damping,
                         exact_max_params=exact_max_params, chunk_size=chunk_size)
