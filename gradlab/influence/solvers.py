"""The one optimum θ̂ and inverse Hessian-vector products at it.

Two numbers with two names: **λ (`l2`)** is part of the objective F(θ) = mean_j ℓ(θ, z_j) + λ/2 ‖θ‖²
(`gradlab.train.objective`), so it changes θ̂ and what retraining converges to; **damping δ** is added
to the Hessian only, (H_F + δI) x = v, where H_F = ∇²F(θ̂) already contains λI. A non-convex model
needs δ > 0 where H_F has negative eigenvalues; a converged convex model needs none.

- `minimize`: converge F (or F without one example, or on a subset) with full-batch L-BFGS (SciPy's
  L-BFGS-B driving one small jitted value-and-gradient program), warm-started, to a stated gradient norm.
- `hessian`, `hvp`: the exact P × P Hessian (small models) and Hessian-vector products (`jvp` of
  `grad`; Pearlmutter 1994).
- `inverse_hvp`: exact solve, conjugate gradient (`conjugate_gradient`, JAX's, also TRAK's solver),
  truncated conjugate gradient (k steps, a regularizer: `cg_steps`) or LiSSA (Agarwal et al. 2017);
  `inverse_hvp_batch` solves for many right-hand sides in one compiled loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float
from scipy import optimize
from threadpoolctl import threadpool_limits

from gradlab import engine, memory
from gradlab.train import objective

LossFn = Callable[[Any, Any, Any], Any]
PyTree = Any
Method = Literal["auto", "exact", "cg", "lissa"]

#: Largest P for which the exact P × P Hessian is built (≈ 4 MB in float32); above it "auto"
#: switches to conjugate gradient.
EXACT_MAX_PARAMS = 1000

#: Conjugate gradient's solution is refused above this relative residual ‖(H + δI)x − v‖/‖v‖: JAX's solver
#: does not stop on non-positive curvature, so an indefinite H + δI shows as a solve that does not converge.
CG_MAX_RESIDUAL = 1e-2

#: Inverse-HVP solvers the page offers, name -> description.
SOLVERS = {
    "auto": f"exact Hessian up to {EXACT_MAX_PARAMS:,} parameters, conjugate gradient above",
    "exact": "build the P × P Hessian and solve",
    "cg": "conjugate gradient on Hessian-vector products (jvp of grad)",
    "lissa": "LiSSA: a stochastic Neumann series on minibatch Hessian-vector products",
}


class InfluenceError(ValueError):
    """An inverse Hessian-vector product could not be computed; the message says what to change."""


def split(params: PyTree) -> tuple[PyTree, PyTree]:
    """(differentiable leaves, the rest) of `params`, as `eqx.partition(…, eqx.is_inexact_array)`."""
    return eqx.partition(engine.as_params(params), eqx.is_inexact_array)


def without(n: int, i) -> Array:
    """Indices 0..N−1 without `i`, shape (N − 1,): one compiled shape for every left-out example."""
    k = jnp.arange(n - 1)
    return k + (k >= i)


# ------------------------------------------------------------------ the optimum


#: L-BFGS-B keeps this many (s, y) pairs (SciPy's `maxcor`, as optax's `memory_size`).
LBFGS_MEMORY = memory.LBFGS_MEMORY

#: Below this many ulps of F, a difference of two float objective values is rounding more than signal: `_lbfgs`
#: then gives the line search the trapezoid of the gradients instead.
RESOLVED_ULPS = 1000


@eqx.filter_jit
def _value_and_grad(loss_fn, params, flat, xs, ys, l2):
    """(F, ∇F) at the raveled differentiable leaves `flat (P,)` (the rest of `params` as given): a program of one
    forward and one backward pass, so its compile is small (an L-BFGS loop with its line search inside one XLA
    program took 150–230 MB to compile, whatever the model)."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    unravel = ravel_pytree(diff)[1]
    return jax.value_and_grad(lambda z: objective(loss_fn, eqx.combine(unravel(z), static), xs, ys, l2))(flat)


def _lbfgs(value_and_grad: Callable, x0: np.ndarray, *, tol: float, max_iter: int,
           eps: float) -> tuple[np.ndarray, int]:
    """L-BFGS-B (`scipy.optimize.minimize`, no bounds, `LBFGS_MEMORY` pairs) from `x0 (P,)` until ‖∇F‖₂ < `tol` or
    `max_iter` iterations. Returns `(x (P,), iterations)`.

    `value_and_grad(x) -> (float, (P,) float64)` evaluates F in a precision of machine epsilon `eps`. SciPy's line
    search (Moré & Thuente 1994) compares F at trial points x with F at the iterate x_k; in float32 a decrease
    under ~1e-7·|F| is lost in rounding, which would stall ‖∇F‖ near 1e-5 on a convex model. So where
    |F(x) − F(x_k)| < `RESOLVED_ULPS`·eps·|F| the difference passed is the trapezoid ½(∇F(x_k) + ∇F(x))·(x − x_k),
    exact for a quadratic (F near its minimum): Hager & Zhang's approximate Wolfe condition (SIAM J. Optim.
    16(1), 2005, §4), the one optax's zoom line search also uses.
    """
    seen: dict = {}     # the last point evaluated: x, F there, the value passed to SciPy, ∇F
    anchor: dict = {}   # the same at the current iterate x_k

    def fun(x):
        v, g = value_and_grad(x)
        if not anchor:
            anchor.update(x=x.copy(), v=v, passed=v, g=g)
        dv = v - anchor["v"]
        if abs(dv) < RESOLVED_ULPS * eps * abs(v):
            dv = 0.5 * float((anchor["g"] + g) @ (x - anchor["x"]))
        seen.update(x=x.copy(), v=v, passed=anchor["passed"] + dv, g=g)
        return seen["passed"], g

    def callback(intermediate_result):  # SciPy's name: after each iteration, at the new iterate
        if not np.array_equal(seen["x"], intermediate_result.x):
            fun(intermediate_result.x)
        anchor.update(seen)
        if np.linalg.norm(seen["g"]) < tol:
            raise StopIteration

    # the two-loop recursion's vectors are small: BLAS threads only contend with XLA's (10× slower on 2 cores)
    with threadpool_limits(1, user_api="blas"):
        res = optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", callback=callback,
                                options=dict(maxiter=max_iter, maxcor=LBFGS_MEMORY, gtol=0.0, ftol=0.0))
    return res.x, int(res.nit)


@dataclasses.dataclass(frozen=True, eq=False)
class Minimum:
    """A converged model: `params`, L-BFGS `iterations`, the objective's `grad_norm` ‖∇F(θ̂)‖ there,
    the `tol` asked for and the `l2` λ of the objective. `converged` is `grad_norm < tol`."""

    params: PyTree
    iterations: int
    grad_norm: float
    tol: float
    l2: float

    @property
    def converged(self) -> bool:
        return self.grad_norm < self.tol


def default_tol(params: PyTree) -> float:
    """The gradient-norm target of `minimize`: 1e-6 in float32, 1e-10 in float64."""
    return 1e-10 if ravel_pytree(split(params)[0])[0].dtype == jnp.float64 else 1e-6


def minimize(
    loss_fn: LossFn, params: PyTree, xs, ys, *, l2: float = 0.0, exclude: int | None = None,
    tol: float | None = None, max_iter: int = 2000,
) -> Minimum:
    """Minimize F(θ) = mean_j ℓ(θ, z_j) + l2/2 ‖θ‖² over all examples (or all but `exclude`) from `params`.

    Full-batch L-BFGS warm-started at `params` (`_lbfgs`: SciPy's L-BFGS-B on the host, each F and ∇F one call of
    a small jitted program), until ‖∇F‖₂ < `tol` (default `default_tol`) or `max_iter` iterations. Compiled once
    per shape: leaving out example i gathers the other N − 1 (one shape for every i). A ReLU network's F has
    kinks, where ‖∇F‖ stalls (≈ 1e-3 on the digits MLP): read `Minimum.converged`.

    **Arguments** `loss_fn(params, x, y) -> scalar`; `params` any pytree; `xs (N, ...)`, `ys (N,)`;
    `l2` λ ≥ 0; `exclude` an example index or None.

    **Returns** a `Minimum`. **Raises** `ValueError` if `exclude` is out of range or the batch is empty.
    """
    n = engine.check_batch(xs, ys)
    params = engine.as_params(params)
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    if exclude is not None:
        if not 0 <= int(exclude) < n:
            raise ValueError(f"example {exclude} does not exist (N = {n})")
        idx = without(n, int(exclude))
        xs, ys = xs[idx], ys[idx]
    diff, static = split(params)
    flat0, unravel = ravel_pytree(diff)
    dtype = flat0.dtype
    tol = default_tol(params) if tol is None else float(tol)
    lam = jnp.asarray(l2, dtype)

    def value_and_grad(x):
        v, g = _value_and_grad(loss_fn, params, jnp.asarray(x, dtype), xs, ys, lam)
        return float(v), np.asarray(g, np.float64)

    x, iterations = _lbfgs(value_and_grad, np.asarray(flat0, np.float64), tol=tol, max_iter=int(max_iter),
                           eps=float(jnp.finfo(dtype).eps))
    flat = jnp.asarray(x, dtype)
    g = _value_and_grad(loss_fn, params, flat, xs, ys, lam)[1]   # at the point returned, in its own precision
    return Minimum(eqx.combine(unravel(flat), static), iterations, float(jnp.linalg.norm(g)), tol, float(l2))


# ------------------------------------------------------------------ Hessian and HVPs


@eqx.filter_jit
def _hessian(loss_fn, params, xs, ys, shift, chunk):
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    flat, unravel = ravel_pytree(diff)
    n = xs.shape[0]
    pad = (-n) % chunk
    # the last chunk is filled with copies of real examples of weight 0 (a zero input can make a loss NaN)
    xs, ys = engine.pad_examples((xs, ys), pad)
    w = jnp.pad(jnp.ones(n, flat.dtype), (0, pad))
    split_ = lambda a: a.reshape((-1, chunk) + a.shape[1:])  # noqa: E731

    def part(z, x, y, wc):
        return jnp.sum(wc * jax.vmap(loss_fn, in_axes=(None, 0, 0))(eqx.combine(unravel(z), static), x, y)) / n

    def step(h, batch):
        return h + jax.hessian(part)(flat, *batch), None

    h, _ = jax.lax.scan(step, jnp.eye(flat.size, dtype=flat.dtype) * shift, (split_(xs), split_(ys), split_(w)))
    return h


def hessian(loss_fn: LossFn, params: PyTree, xs, ys, *, l2: float = 0.0, damping: float = 0.0,
            chunk_size: int = 128) -> Float[Array, "P P"]:
    """Exact H_F + δI = (1/N) Σ_i ∇²ℓ(θ, z_i) + (λ + δ) I, flattened as `ravel_pytree` of the
    differentiable leaves, accumulated over chunks of examples (`jax.hessian`).

    **Returns** `(P, P)` symmetric. **Raises** `ValueError` for an empty batch.
    """
    n = engine.check_batch(xs, ys)
    params = engine.as_params(params)
    dtype = ravel_pytree(split(params)[0])[0].dtype
    return _hessian(loss_fn, params, jnp.asarray(xs), jnp.asarray(ys), jnp.asarray(l2 + damping, dtype), int(min(chunk_size, n)))


def _hvp_fn(loss_fn, diff, static, xs, ys, shift):
    """v -> (H_F + δI) v on raveled vectors (forward-over-reverse), shift = λ + δ."""
    flat, unravel = ravel_pytree(diff)
    g = jax.grad(lambda z: objective(loss_fn, eqx.combine(unravel(z), static), xs, ys, 0.0))
    return lambda v: jax.jvp(g, (flat,), (v,))[1] + shift * v


@eqx.filter_jit
def _hvp(loss_fn, params, xs, ys, vector, shift):
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    flat_v, unravel = ravel_pytree(vector)
    return unravel(_hvp_fn(loss_fn, diff, static, xs, ys, shift)(flat_v))


def hvp(loss_fn: LossFn, params: PyTree, xs, ys, vector: PyTree, *, l2: float = 0.0, damping: float = 0.0) -> PyTree:
    """(H_F + δI) v for F = mean ℓ + λ/2‖θ‖²: `jax.jvp` of `jax.grad` (Pearlmutter 1994), about two
    gradient evaluations, never builds H. **Returns** a pytree like `vector`."""
    return _hvp(loss_fn, engine.as_params(params), jnp.asarray(xs), jnp.asarray(ys), vector, jnp.asarray(l2 + damping))


def conjugate_gradient(
    matvec: Callable[[Float[Array, "P"]], Float[Array, "P"]], b: Float[Array, "P"], tol: float | Array, max_steps: int,
) -> Float[Array, "P"]:
    """Solve A x = b for a symmetric positive definite A given as `matvec`: `jax.scipy.sparse.linalg.cg`.

    Stops when ‖b − Ax‖₂ ≤ tol·‖b‖₂ or after `max_steps` steps (Hestenes & Stiefel 1952). Traceable
    and vmappable (one solve per right-hand side). JAX's solver does not count its steps, and it does
    not stop on non-positive curvature: an A that is not positive definite shows as bᵀx ≤ 0 or a
    large residual ‖b − Ax‖, which the callers check.

    **Arguments** `matvec`: v ↦ Av on `(P,)` vectors; `b (P,)`; `tol` > 0 (relative); `max_steps` ≥ 1.

    **Returns** `x (P,)`.
    """
    return jax.scipy.sparse.linalg.cg(matvec, b, tol=tol, maxiter=max_steps)[0]


def _rows(f: Callable[[Array], Array], rows, block: int) -> Array:
    """f on each row of `rows`, `block` rows vmapped together (1: one after another, `jax.lax.map`)."""
    return jax.lax.map(f, rows, batch_size=block if block > 1 else None)


@eqx.filter_jit
def _cg(loss_fn, params, xs, ys, bs, shift, tol, maxiter, block):
    """Conjugate gradient for every row of bs (T, P), each its own solve (`_rows`): X (T, P)."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    A = _hvp_fn(loss_fn, diff, static, xs, ys, shift)
    return _rows(lambda b: conjugate_gradient(A, b, tol, maxiter), bs, block)


@eqx.filter_jit
def _lissa(loss_fn, params, xs, ys, b, shift, scale, depth, batch_size, key):
    """LiSSA recursion v_j = b + v_{j-1} − (H_B + δI) v_{j-1} / scale, H_B on a random minibatch."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    n = xs.shape[0]

    def step(v, k):
        idx = jax.random.choice(k, n, (batch_size,), replace=False)
        v = b + v - _hvp_fn(loss_fn, diff, static, xs[idx], ys[idx], shift)(v) / scale
        return v, jnp.linalg.norm(v)

    v, norms = jax.lax.scan(step, b, jax.random.split(key, depth))
    return v / scale, norms


@eqx.filter_jit
def _top_eigenvalue(loss_fn, params, xs, ys, shift, iters, key):
    """Power iteration for the largest eigenvalue of H_F + δI (LiSSA's scale must exceed it)."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    flat, _ = ravel_pytree(diff)
    A = _hvp_fn(loss_fn, diff, static, xs, ys, shift)
    v = jax.lax.fori_loop(0, iters, lambda _, v: A(v / jnp.linalg.norm(v)), jax.random.normal(key, flat.shape, flat.dtype))
    u = v / jnp.linalg.norm(v)
    return jnp.vdot(u, A(u))


@dataclasses.dataclass(frozen=True)
class InverseHVP:
    """How x = (H_F + δI)⁻¹ v was obtained: `method` that ran (`"exact"`, `"cg"`, `"lissa"`), `note`
    when `"auto"` switched (else None), `iterations` (0 for exact, the depth for LiSSA, the steps of a
    truncated conjugate gradient, None for one run to convergence: JAX's solver does not count them),
    `residual` ‖(H_F + δI) x − v‖ / ‖v‖ (max over right-hand sides), checked with extra HVPs, and
    `truncated`: conjugate gradient stopped after `iterations` steps, not solved (`label` says so)."""

    method: str
    note: str | None
    iterations: int | None
    residual: float
    truncated: bool = False

    @property
    def label(self) -> str:
        """What ran, in words: e.g. "truncated, 10 steps, residual 0.84" or "cg, residual 3.1e-06"."""
        if self.truncated:
            return f"truncated, {self.iterations} steps, residual {self.residual:.2g}"
        steps = f", {self.iterations} steps" if self.iterations else ""
        return f"{self.method}{steps}, residual {self.residual:.1e}"


def resolve_method(num_params: int, method: Method = "auto", *, exact_max_params: int = EXACT_MAX_PARAMS) -> tuple[str, str | None]:
    """Which solver runs for P parameters, and a note when `"auto"` switched. **Raises** `ValueError`
    for an unknown method."""
    if method not in SOLVERS:
        raise ValueError(f"unknown inverse-HVP method {method!r}; choose {', '.join(SOLVERS)}")
    if method != "auto":
        return method, None
    if num_params <= exact_max_params:
        return "exact", None
    return "cg", (f"The model has P = {num_params:,} parameters: the exact P × P Hessian (more than "
                  f"{exact_max_params:,}) is not built; conjugate gradient on Hessian-vector products solves instead.")


def inverse_hvp_batch(
    loss_fn: LossFn, params: PyTree, xs, ys, vectors: Float[Array, "T P"], *, l2: float = 0.0, damping: float = 0.0,
    method: Method = "auto", exact_max_params: int = EXACT_MAX_PARAMS, cg_tol: float | None = None,
    cg_maxiter: int = 1000, cg_steps: int | None = None, lissa_depth: int = 2000, lissa_scale: float | None = None,
    lissa_batch_size: int | None = None, seed: int = 0,
) -> tuple[Float[Array, "T P"], InverseHVP]:
    """Solve (H_F + δI) X = V for T raveled right-hand sides at once (H_F the Hessian of
    mean ℓ + λ/2‖θ‖², δ = `damping`).

    Conjugate gradient either runs to relative residual `cg_tol` (within `cg_maxiter` steps) and
    refuses a solve that did not get there, or, with `cg_steps` = k, is **truncated**: exactly k steps
    from x₀ = 0, returned whatever the residual. The k-step iterate is the Galerkin solution on the
    Krylov space K_k = span{v, Av, …, A^(k−1)v}: x_k = Q_k (Q_kᵀ A Q_k)⁻¹ Q_kᵀ v for an orthonormal basis
    Q_k (Saad 2003, *Iterative Methods for Sparse Linear Systems*, §6.7). Stopping early is a known
    regularizer (Hanke 1995, *Conjugate Gradient Type Methods for Ill-Posed Problems*; Hansen 1998,
    *Rank-Deficient and Discrete Ill-Posed Problems*, §6.3): the first steps fit the large-curvature
    directions of v and leave the small (or negative) ones, which an exact inverse blows up, nearly
    untouched, and needs no positive definite H_F + δI (a network not at a minimum). dattri's
    `IFAttributorCG` also stops after a fixed number of steps (10 by default; it starts from x₀ = v). The
    result is not (H_F + δI)⁻¹v, and `InverseHVP.label` says so.

    Conjugate gradient solves each right-hand side on its own, one after another in one compiled loop
    (`memory.IHVP_BLOCK` = 1): on CPU that is faster per solve than vmapping them (see `memory.IHVP_BLOCK`),
    and the result is the per-point solve's.

    **Arguments** `vectors (T, P)` in `ravel_pytree` order of the differentiable leaves; `l2` λ ≥ 0,
    `damping` δ ≥ 0; `method` as `resolve_method`; `cg_steps` ≥ 1 or None; other solver settings as named.

    **Returns** `(X (T, P), InverseHVP)`.

    **Raises** `InfluenceError` when H_F + δI is singular (exact), conjugate gradient (untruncated)
    meets non-positive curvature or NaN, or LiSSA diverges: each message says to raise the damping δ
    (or, for conjugate gradient, to truncate it). `ValueError` when `cg_steps` < 1 or is given for a
    solver other than conjugate gradient.
    """
    n = engine.check_batch(xs, ys)
    if damping < 0 or l2 < 0:
        raise InfluenceError(f"λ and the damping must be ≥ 0, got λ = {l2:g}, damping = {damping:g}")
    params = engine.as_params(params)
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    flat = ravel_pytree(split(params)[0])[0]
    bs = jnp.asarray(vectors, flat.dtype).reshape(-1, flat.size)
    shift = jnp.asarray(l2 + damping, flat.dtype)
    kind, note = resolve_method(flat.size, method, exact_max_params=exact_max_params)
    if cg_steps is not None and (kind != "cg" or int(cg_steps) < 1):
        raise ValueError(f"cg_steps = {cg_steps} truncates conjugate gradient: it needs method 'cg' (here "
                         f"{kind!r}) and at least 1 step")
    iterations = 0
    if kind == "exact":
        x = jnp.linalg.solve(hessian(loss_fn, params, xs, ys, l2=l2, damping=damping), bs.T).T
        if not bool(jnp.all(jnp.isfinite(x))):
            raise InfluenceError(f"H + δI is singular at λ = {l2:g}, damping δ = {damping:g}: raise the damping")
    elif kind == "cg":
        if cg_steps is not None:
            x = _cg(loss_fn, params, xs, ys, bs, shift, jnp.asarray(0.0, flat.dtype), int(cg_steps), memory.IHVP_BLOCK)
            residual = float(_residual(loss_fn, params, xs, ys, x, bs, shift, memory.IHVP_BLOCK))
            if not bool(jnp.all(jnp.isfinite(x))):
                raise InfluenceError(f"truncated conjugate gradient broke down (NaN) at damping δ = {damping:g}: "
                                     "change the damping δ or the number of steps")
            return x, InverseHVP(kind, note, int(cg_steps), residual, truncated=True)
        tol = cg_tol if cg_tol is not None else (1e-10 if flat.dtype == jnp.float64 else 1e-5)
        x = _cg(loss_fn, params, xs, ys, bs, shift, jnp.asarray(tol, flat.dtype), int(cg_maxiter), memory.IHVP_BLOCK)
        residual = float(_residual(loss_fn, params, xs, ys, x, bs, shift, memory.IHVP_BLOCK))
        # on a positive definite H + δI, CG converges and vᵀx = vᵀ(H + δI)⁻¹v > 0 for every v ≠ 0
        if not (residual <= CG_MAX_RESIDUAL and bool(jnp.all(jnp.sum(x * bs, axis=1) > 0))):
            raise InfluenceError(
                f"conjugate gradient did not solve (H + δI)x = v (relative residual {residual:.1e}): H + δI is "
                f"not positive definite at λ = {l2:g}, damping δ = {damping:g} (a non-convex model, or θ not at a "
                "minimum). Raise the damping δ, or truncate conjugate gradient (cg_steps, a regularizer).")
        return x, InverseHVP(kind, note, None, residual)
    else:
        key = jax.random.key(seed)
        if lissa_scale is None:
            lissa_scale = 2.0 * max(float(_top_eigenvalue(loss_fn, params, xs, ys, shift, 30, key)), 1e-8)
        if not lissa_scale > 0:
            raise InfluenceError(f"the LiSSA scale must be > 0, got {lissa_scale:g}")
        size = int(min(n, lissa_batch_size or 256))
        rows = []
        for b in bs:
            v, norms = _lissa(loss_fn, params, xs, ys, b, shift, jnp.asarray(lissa_scale, flat.dtype), lissa_depth, size,
                              jax.random.fold_in(key, 1))
            norms = np.asarray(norms, np.float64)
            half = norms[len(norms) // 2 - 1] if len(norms) > 1 else norms[0]
            if not np.all(np.isfinite(norms)) or not bool(jnp.all(jnp.isfinite(v))) or norms[-1] > 4.0 * half:
                raise InfluenceError(
                    f"LiSSA diverged (scale {lissa_scale:g}, damping δ = {damping:g}): raise the damping (H + δI must be "
                    "positive definite) or the scale (it must exceed the largest Hessian eigenvalue)")
            rows.append(v)
        x, iterations = jnp.stack(rows), lissa_depth
    residual = float(_residual(loss_fn, params, xs, ys, x, bs, shift, memory.IHVP_BLOCK))
    return x, InverseHVP(kind, note, iterations, residual)


@eqx.filter_jit
def _residual(loss_fn, params, xs, ys, x, bs, shift, block=1):
    """max over rows of ‖(H_F + δI)x − b‖ / ‖b‖, one row after another (`_rows`; jitted: run op by op, its HVP
    compiled dozens of small programs)."""
    diff, static = split(params)
    a = _hvp_fn(loss_fn, diff, static, xs, ys, shift)
    rel = lambda r: jnp.linalg.norm(a(r[0]) - r[1]) / jnp.maximum(jnp.linalg.norm(r[1]), 1e-30)
    return jnp.max(_rows(rel, (x, bs), block))


def inverse_hvp(loss_fn: LossFn, params: PyTree, xs, ys, vector: PyTree, **kwargs) -> tuple[PyTree, InverseHVP]:
    """(H_F + δI)⁻¹ v for one pytree `vector` (like the differentiable leaves of `params`);
    keyword arguments and errors as `inverse_hvp_batch`. **Returns** `(x pytree, InverseHVP)`."""
    flat, unravel = ravel_pytree(vector)
    x, info = inverse_hvp_batch(loss_fn, params, xs, ys, flat[None], **kwargs)
    return unravel(x[0]), info
