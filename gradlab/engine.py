"""The per-example gradient engine: one jitted `vmap(grad)` and its streamed reductions.

`loss_fn(params, x, y) -> scalar` is the loss of ONE example. `params` is any pytree: Python
floats, jnp arrays, dicts/tuples, or an Equinox module (non-array fields are static). `xs, ys`
carry the example axis first. Everything that needs only a reduction of the per-example
gradients (norms, dot products, clipped sums) streams over chunks of `chunk_size` examples with
`jax.lax.map(..., batch_size=chunk_size)`, so peak extra memory is about chunk_size x P x 4 bytes,
never the N x P matrix.

Every public function is compiled once per (loss_fn, parameter structure, shapes): pass the same
`loss_fn` object again (not a fresh lambda) and nothing is re-traced. `TRACES` counts traces.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from gradlab import ghost, losses, sharding

LossFn = Callable[[Any, Any, Any], Any]
PyTree = Any

DEFAULT_CHUNK = 256

Method = Literal["auto", "ghost", "vmap"]
METHODS = ("auto", "ghost", "vmap")

# The library's losses reach the model's weights only by calling the model: the per-layer
# rules (gradlab.ghost) are exact for them, so method="auto" uses them.
ghost.register_model_loss(losses.mse)
ghost.register_model_loss(losses.cross_entropy)

#: How often each jitted body was traced (a trace precedes each compile). Tests and the
#: benchmark read it to show that a second call with the same shapes does not recompile.
TRACES: collections.Counter = collections.Counter()


def as_params(params: PyTree) -> PyTree:
    """Turn Python floats in `params` into float arrays so they are differentiable and traced.

    The seeds write `w, b = 1.0, 0.0`; `jax.grad` accepts floats, but `eqx.filter_jit` would
    treat them as static (recompiling for each value). Equinox modules are left as they are: by
    Equinox's convention a float field (a pooling layer's `-inf` init, say) is not a parameter.
    """
    return jax.tree.map(
        lambda v: jnp.asarray(v, dtype=jnp.result_type(float))
        if isinstance(v, float) and not isinstance(v, bool)
        else v,
        params,
        is_leaf=lambda v: isinstance(v, eqx.Module),
    )


def _split(params: PyTree) -> tuple[PyTree, PyTree]:
    """(differentiable part, static part) of the parameters: floating arrays vs everything else."""
    return eqx.partition(params, eqx.is_inexact_array)


def _grad_one(loss_fn: LossFn, static: PyTree) -> Callable:
    """grad of the single-example loss with respect to the differentiable part only."""

    def loss(diff, x, y):
        return loss_fn(eqx.combine(diff, static), x, y)

    return jax.grad(loss)


def _sq_norms_by_leaf(grads: PyTree) -> PyTree:
    """Squared L2 norm of each leaf of ONE example's gradient: same tree, scalar leaves."""
    return jax.tree.map(lambda g: jnp.sum(jnp.square(g)), grads)


def _chunk(n: int, chunk_size: int | None) -> int | None:
    """Batch size for `lax.map`: None means one vmap over all n examples."""
    if chunk_size is None:
        return None
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    return None if chunk_size >= n else int(chunk_size)


def _map(f: Callable, xs: Any, chunk: int | None) -> Any:
    """`f` over the leading axis: one `vmap` if chunk is None, else `lax.map` in chunks.

    (`jax.lax.map(batch_size=None)` would be a sequential scan, one example per step.)
    """
    return jax.vmap(f)(xs) if chunk is None else jax.lax.map(f, xs, batch_size=chunk)


def scan_chunks(step: Callable, init: Any, arrays: Any, chunk: int) -> Any:
    """A streamed reduction: fold `acc = step(acc, (arrays_chunk, mask))` over chunks of `chunk` examples.

    The arrays (example axis first) are zero-padded to a multiple of `chunk`; `mask (chunk,)`
    float32 is 0 on the padding, so `step` can drop it. Only one chunk's intermediates are alive
    at a time. **Returns** the final accumulator.
    """
    n = jax.tree.leaves(arrays)[0].shape[0]
    pad = (-n) % chunk
    mask = (jnp.arange(n + pad) < n).astype(jnp.float32)
    padded = jax.tree.map(lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)), arrays)
    split = lambda a: a.reshape((-1, chunk) + a.shape[1:])  # noqa: E731
    acc, _ = jax.lax.scan(lambda acc, b: (step(acc, b), None), init, (jax.tree.map(split, padded), split(mask)))
    return acc


def _check_batch(xs, ys) -> int:
    nx = jax.tree.leaves(xs)[0].shape[0]
    ny = jax.tree.leaves(ys)[0].shape[0]
    if nx != ny:
        raise ValueError(f"xs has {nx} examples but ys has {ny}: both need the example axis first")
    if nx == 0:
        raise ValueError("no examples: xs and ys are empty")
    return nx


@eqx.filter_jit
def _per_example_grads(loss_fn, params, xs, ys, chunk):
    TRACES["per_example_grads"] += 1
    diff, static = _split(params)
    g = _grad_one(loss_fn, static)
    return _map(lambda xy: g(diff, *xy), (xs, ys), chunk)


@sharding.over_examples("per_example")  # all devices when several are visible
def per_example_grads(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    *,
    chunk_size: int | None = None,
    method: Method = "auto",
) -> PyTree:
    """Per-example gradients `vmap(grad(loss_fn), in_axes=(None, 0, 0))(params, xs, ys)`.

    **Arguments**
    - `loss_fn`: `(params, x, y) -> scalar`, the loss of one example.
    - `params`: pytree of parameters (floats, arrays, dicts/tuples, Equinox module).
    - `xs`, `ys`: inputs and targets with the example axis first, N examples.
    - `chunk_size`: vmap over chunks of this many examples (scan between chunks) to bound the
      intermediate activations; the result is still N x P. None: one vmap for `"vmap"`; for the
      per-layer rules, chunks whose saved activations take about `GHOST_CHUNK_BYTES`.
    - `method`: `"vmap"` is `vmap(grad)`; `"ghost"` builds the weight gradients of
      `eqx.nn.Linear` / `eqx.nn.Conv` layers from per-layer rules (outer product δ ⊗ a; input
      patches @ δ), one backward pass per chunk (`gradlab.ghost`); `"auto"` (default) uses
      `"ghost"` for an Equinox model with such layers and a loss registered with
      `ghost.register_model_loss` (the library's losses are), else `"vmap"`. Same numbers either way,
      up to float32 rounding (which can also decide which input of a max-pool near-tie gets the
      gradient).

    **Returns** the differentiable part of `params` with every leaf of shape `(N, *leaf.shape)`
    (a Python float becomes shape `(N,)`); non-differentiable leaves are `None`. Units: loss per
    parameter unit.

    **Raises** `ValueError` if xs and ys disagree on N, N is 0, or chunk_size < 1, or an
    unknown method; `ghost.GhostUnsupported` (a ValueError) for `method="ghost"` on a model
    without rules.

    Source: the JAX per-example gradient idiom (JAX docs, "Automatic vectorization"); seeds 000-002;
    Goodfellow (2015), arXiv:1510.01799, for the per-layer rules.
    """
    n = _check_batch(xs, ys)
    params = as_params(params)
    chunk = _chunk(n, chunk_size)
    return _dispatch(
        method, loss_fn, params,
        lambda: _ghost_grads(loss_fn, params, xs, ys, chunk),
        lambda: _per_example_grads(loss_fn, params, xs, ys, chunk),
    )


@eqx.filter_jit
def _sq_norms(loss_fn, params, xs, ys, chunk):
    TRACES["per_example_sq_norms"] += 1
    diff, static = _split(params)
    g = _grad_one(loss_fn, static)
    return _map(lambda xy: _sq_norms_by_leaf(g(diff, *xy)), (xs, ys), chunk)


@sharding.over_examples("per_example")  # all devices when several are visible
def per_example_layer_norms(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    *,
    chunk_size: int | None = DEFAULT_CHUNK,
    method: Method = "auto",
) -> dict[str, Float[Array, "N"]]:
    """L2 norm of each parameter leaf's per-example gradient ("which layers carry the norm").

    Streams over chunks: never holds the N x P matrix (peak extra memory ~ chunk_size x P x 4 B).

    **Arguments** as `per_example_grads`. With `method="ghost"` (or `"auto"` on the library's
    models and losses) a Linear layer's weight norm is ‖δᵢ‖·‖aᵢ‖ and its bias norm ‖δᵢ‖, from one
    backward pass: no per-example weight gradient is built at all (Goodfellow 2015; Opacus'
    ghost clipping).

    **Returns** `{leaf name: (N,) float32 norms}`, names from the pytree path (e.g.
    `".layers[0].weight"`, or `"[0]"` for a tuple of floats), in tree order. The global norm is
    `sqrt(sum of squares)` over leaves.

    **Raises** `ValueError` as `per_example_grads`.
    """
    sq = _streamed_sq_norms(loss_fn, params, xs, ys, chunk_size, method)
    leaves = jax.tree_util.tree_flatten_with_path(sq)[0]
    return {(jax.tree_util.keystr(path) or "params"): jnp.sqrt(v) for path, v in leaves}


@sharding.over_examples("per_example")  # all devices when several are visible
def per_example_norms(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    *,
    chunk_size: int | None = DEFAULT_CHUNK,
    method: Method = "auto",
) -> Float[Array, "N"]:
    """Global L2 norm ||∇θ loss(θ, x_i, y_i)||₂ of each example's gradient, streamed.

    Peak extra memory ~ chunk_size x P x 4 bytes: the N x P matrix is never built. With
    `method="ghost"` (the default `"auto"` picks it for the library's models and losses) Linear
    layers contribute ‖δᵢ‖²·‖aᵢ‖² + ‖δᵢ‖² and no per-example weight gradient is built: about the
    cost of one batch gradient (Goodfellow 2015, arXiv:1510.01799).

    **Arguments** as `per_example_grads`.

    **Returns** `(N,)` float array of norms (loss units per parameter unit).

    **Raises** `ValueError` as `per_example_grads`.
    """
    sq = _streamed_sq_norms(loss_fn, params, xs, ys, chunk_size, method)
    return jnp.sqrt(sum(jax.tree.leaves(sq)))


# ---------------------------------------------------------------- the per-layer-rule path

_GHOST_FAILED: set = set()


#: Without a chunk_size, the per-layer-rule path sizes its chunks so that what the rules keep per
#: chunk (layer inputs or patches, output gradients) stays near this many bytes: small enough to
#: stay in cache and in the allocator's reused memory (fresh pages cost a fault each).
GHOST_CHUNK_BYTES = 8 * 2**20


def _ghost_chunk(loss_fn, diff, static, xs, ys, n: int) -> int | None:
    one = lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype)  # noqa: E731
    per_example = ghost.example_bytes(loss_fn, diff, static, jax.tree.map(one, xs), jax.tree.map(one, ys))
    return _chunk(n, max(1, GHOST_CHUNK_BYTES // max(per_example, 1)))


@eqx.filter_jit
def _ghost_grads(loss_fn, params, xs, ys, chunk):
    TRACES["ghost_grads"] += 1
    diff, static = _split(params)
    if chunk is None:
        chunk = _ghost_chunk(loss_fn, diff, static, xs, ys, jax.tree.leaves(xs)[0].shape[0])
    one = lambda xy: ghost.one_example(loss_fn, diff, static, *xy, norms=False)
    return ghost.expand(_map(one, (xs, ys), chunk))


@eqx.filter_jit
def _ghost_sq_norms(loss_fn, params, xs, ys, chunk):
    TRACES["ghost_sq_norms"] += 1
    diff, static = _split(params)
    one = lambda xy: ghost.one_example(loss_fn, diff, static, *xy, norms=True)
    return _map(one, (xs, ys), chunk)


def _ghost_key(loss_fn, params):
    try:
        key = (loss_fn, jax.tree.structure(params))
        hash(key)
        return key
    except TypeError:
        return None


def resolve_method(method: str, loss_fn: LossFn, params: PyTree) -> str:
    """Which path `method` takes for this loss and model: `"ghost"` or `"vmap"`.

    **Raises** `ValueError` for a method other than "auto", "ghost", "vmap".
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if method != "auto":
        return method
    if ghost.is_model_loss(loss_fn) and ghost.supports(params):
        return "vmap" if _ghost_key(loss_fn, params) in _GHOST_FAILED else "ghost"
    return "vmap"


def _dispatch(method, loss_fn, params, fast, plain):
    """Run `fast` (per-layer rules) or `plain` (vmap); "auto" falls back when tracing says no."""
    path = resolve_method(method, loss_fn, params)
    if path == "vmap":
        return plain()
    if method == "ghost" and not ghost.supports(params):
        raise ghost.GhostUnsupported(
            "method='ghost' needs an Equinox model with eqx.nn.Linear or eqx.nn.Conv layers"
        )
    try:
        return fast()
    except ghost.GhostUnsupported:
        if method == "ghost":
            raise
        key = _ghost_key(loss_fn, params)
        if key is not None:
            _GHOST_FAILED.add(key)
        return plain()


def _streamed_sq_norms(loss_fn, params, xs, ys, chunk_size, method):
    """Per-leaf squared per-example norms, streamed over chunks, by the chosen method."""
    n = _check_batch(xs, ys)
    params = as_params(params)
    chunk = _chunk(n, chunk_size)
    return _dispatch(
        method, loss_fn, params,
        lambda: _ghost_sq_norms(loss_fn, params, xs, ys, chunk),
        lambda: _sq_norms(loss_fn, params, xs, ys, chunk),
    )


@eqx.filter_jit
def _dots(loss_fn, params, xs, ys, v, chunk):
    TRACES["per_example_dots"] += 1
    diff, static = _split(params)
    g = _grad_one(loss_fn, static)

    def dot(xy):
        gi = g(diff, *xy)
        return sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(gi), jax.tree.leaves(v)))

    return _map(dot, (xs, ys), chunk)


@sharding.over_examples("per_example")  # all devices when several are visible
def per_example_dots(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    vector: PyTree,
    *,
    chunk_size: int | None = DEFAULT_CHUNK,
) -> Float[Array, "N"]:
    """Dot product ⟨∇θ loss(θ, x_i, y_i), v⟩ of each example's gradient with a fixed vector v.

    The building block of gradient similarity, TracIn and influence functions; streamed, so it
    never holds N x P.

    **Arguments** as `per_example_grads`, plus `vector`: a pytree shaped like the differentiable
    part of `params` (e.g. a test gradient from `grad`).

    **Returns** `(N,)` float array.

    **Raises** `ValueError` as `per_example_grads`, or if `vector` has another structure.
    """
    n = _check_batch(xs, ys)
    params = as_params(params)
    diff, _ = _split(params)
    vector = as_params(vector)
    if jax.tree.structure(diff) != jax.tree.structure(vector):
        raise ValueError("vector must have the structure of the differentiable parameters")
    return _dots(loss_fn, params, xs, ys, vector, _chunk(n, chunk_size))


@eqx.filter_jit
def _clipped_sum(loss_fn, params, xs, ys, clip_norm, chunk):
    TRACES["clipped_grad_sum"] += 1
    diff, static = _split(params)
    g = _grad_one(loss_fn, static)

    def clipped(xy):
        gi = g(diff, *xy)
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(gi)))
        scale = jnp.minimum(1.0, clip_norm / jnp.maximum(norm, 1e-12))
        return jax.tree.map(lambda a: a * scale, gi)

    if chunk is None:
        return jax.tree.map(lambda a: a.sum(0), jax.vmap(clipped)((xs, ys)))

    def step(total, batch):
        (x, y), m = batch
        gc = jax.vmap(clipped)((x, y))
        return jax.tree.map(lambda t, a: t + jnp.tensordot(m, a, axes=1), total, gc)

    return scan_chunks(step, jax.tree.map(jnp.zeros_like, diff), (xs, ys), chunk)


@sharding.over_examples("sum")  # all devices when several are visible
def clipped_grad_sum(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    clip_norm: float,
    *,
    chunk_size: int | None = DEFAULT_CHUNK,
) -> PyTree:
    """Sum of per-example gradients, each clipped to global L2 norm at most C: Σ_i g_i·min(1, C/‖g_i‖).

    The DP-SGD aggregate before noise (Abadi et al. 2016, Algorithm 1). Streamed: accumulates
    chunk by chunk, never holding N x P. `clip_norm=inf` gives the plain gradient sum.

    **Arguments** as `per_example_grads`, plus `clip_norm` C > 0 (same units as the gradient norm).

    **Returns** a pytree like the differentiable part of `params` (no example axis).

    **Raises** `ValueError` if C <= 0 or as `per_example_grads`.
    """
    if not clip_norm > 0:
        raise ValueError(f"clipping norm C must be > 0, got {clip_norm}")
    n = _check_batch(xs, ys)
    return _clipped_sum(
        loss_fn, as_params(params), xs, ys, jnp.float32(clip_norm), _chunk(n, chunk_size)
    )


@eqx.filter_jit
def _batch_grad(loss_fn, params, xs, ys, mean):
    TRACES["batch_grad"] += 1
    diff, static = _split(params)

    def total(d):
        losses = jax.vmap(lambda x, y: loss_fn(eqx.combine(d, static), x, y))(xs, ys)
        return losses.mean() if mean else losses.sum()

    return jax.grad(total)(diff)


@sharding.over_examples("sum")  # all devices when several are visible
def batch_grad(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    *,
    reduction: Literal["sum", "mean"] = "sum",
) -> PyTree:
    """One gradient of the summed (or mean) loss: `grad(lambda p: vmap(loss_fn)(p, xs, ys).sum())`.

    By linearity it equals `per_example_grads(...).sum(0)` (or `.mean(0)`); seed 002.

    **Arguments** as `per_example_grads`, plus `reduction`: `"sum"` or `"mean"`.

    **Returns** a pytree like the differentiable part of `params`.

    **Raises** `ValueError` for another reduction or as `per_example_grads`.
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    _check_batch(xs, ys)
    return _batch_grad(loss_fn, as_params(params), xs, ys, reduction == "mean")


_loop_grad_cache: dict = {}


def loop_per_example_grads(loss_fn: LossFn, params: PyTree, xs: Any, ys: Any) -> PyTree:
    """Baseline: a Python loop of `jax.grad` (jitted), one example at a time, then stacked.

    The slow reference the engine is compared against (seed 003's `compute_sample_grads`).

    **Returns** the same pytree as `per_example_grads`.
    """
    n = _check_batch(xs, ys)
    params = as_params(params)
    diff, static = _split(params)
    key = (loss_fn, jax.tree.structure(static), tuple(jax.tree.leaves(static)))
    try:
        g = _loop_grad_cache[key]
    except (KeyError, TypeError):
        g = jax.jit(_grad_one(loss_fn, static))
        try:
            _loop_grad_cache[key] = g
        except TypeError:  # unhashable static leaves: just don't cache
            pass
    rows = [g(diff, jax.tree.map(lambda a: a[i], xs), jax.tree.map(lambda a: a[i], ys)) for i in range(n)]
    # stack on the host: jnp.stack of N operands would compile a new N-way concatenate per N
    return jax.tree.map(lambda *r: jnp.asarray(np.stack(r)), *rows)


def flatten_per_example(grads: PyTree) -> Float[Array, "N P"]:
    """Concatenate the leaves of per-example gradients into one `(N, P)` matrix."""
    leaves = jax.tree.leaves(grads)
    return jnp.concatenate([a.reshape(a.shape[0], -1) for a in leaves], axis=1)


def num_params(params: PyTree) -> int:
    """P: the number of differentiable scalars in `params`."""
    diff, _ = _split(as_params(params))
    return int(sum(np.size(a) for a in jax.tree.leaves(diff)))


def leaf_names(params: PyTree) -> list[str]:
    """Names of the differentiable leaves, in tree order (as in `per_example_layer_norms`)."""
    diff, _ = _split(as_params(params))
    return [jax.tree_util.keystr(p) or "params" for p, _ in jax.tree_util.tree_flatten_with_path(diff)[0]]
