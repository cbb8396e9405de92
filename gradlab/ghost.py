"""Per-layer rules for per-example gradients: outer products instead of `vmap(grad)`.

For a layer `z = W a + b` the gradient of one example's loss with respect to W is the outer
product `δ ⊗ a` of the layer's output gradient `δ = ∂ℓ/∂z` and its input `a`. So

    ‖∂ℓ/∂W‖²_F = ‖δ‖² · ‖a‖²,      ‖∂ℓ/∂b‖² = ‖δ‖²

(Goodfellow 2015, "Efficient per-example gradient computations", arXiv:1510.01799; the
"ghost norm" of Opacus' ghost clipping, Li et al. 2022, arXiv:2110.05679). The per-example
norms then cost one forward and one backward pass to the layer outputs: no P-sized object per
example is ever built. For a convolution the per-example weight gradient is the correlation of
the input patches with δ, `δ (C_out × positions) @ patchesᵀ (positions × C_in·k)`, one batched
matmul instead of `vmap` over a grouped convolution. The tapped convolution itself runs as
`W (C_out × C_in·k) @ patches` ("im2col"), so the patches are built once and serve the forward
pass, its backward pass and the rule; on a CPU, XLA's matmuls are several times faster than its
convolutions. For per-example gradients (not norms) a Linear layer's outer products are formed
after the per-chunk pass, straight into the N × P result (`expand`).

How δ and a are obtained in JAX: every `eqx.nn.Linear` / `eqx.nn.Conv` with a rule is replaced
by a `_Tap` that records its input `a` (a convolution: its input patches) and adds a zero
**probe** to its output; the gradient of the loss with respect to the probe is δ. Everything
else (other leaves, Python-float params, layers without a rule) is differentiated the ordinary
way, per example.

The rule is only valid when the loss reaches a tapped layer's weights by calling the layer
once (no weight sharing, no L2 penalty inside `loss_fn`). A layer called twice or from inside
another transform is detected while tracing and raises `GhostUnsupported`; the engine then
falls back to `vmap(grad)`. The engine chooses this path on its own only for losses known to
touch the model through its call (`register_model_loss`).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp

PyTree = Any


class GhostUnsupported(ValueError):
    """The model or loss cannot use the per-layer rules (use `method="vmap"`)."""


_MODEL_LOSSES: set = set()


def register_model_loss(loss_fn: Callable) -> Callable:
    """Declare that `loss_fn(model, x, y)` uses the model's weights only by calling the model.

    The engine's `method="auto"` then uses the per-layer rules for it. Usable as a decorator.
    """
    _MODEL_LOSSES.add(loss_fn)
    return loss_fn


def is_model_loss(loss_fn: Callable) -> bool:
    """Whether `loss_fn` was registered with `register_model_loss`."""
    try:
        return loss_fn in _MODEL_LOSSES
    except TypeError:
        return False


# ------------------------------------------------------------------ which layers have a rule


def _has_rule(layer) -> bool:
    if isinstance(layer, eqx.nn.Linear):
        return eqx.is_inexact_array(layer.weight)
    if isinstance(layer, eqx.nn.Conv):
        return (
            eqx.is_inexact_array(layer.weight)
            and layer.groups == 1
            and layer.padding_mode == "ZEROS"
            and isinstance(layer.padding, tuple)
            and all(isinstance(p, tuple) and len(p) == 2 for p in layer.padding)
        )
    return False


def _is_layer(node) -> bool:
    return isinstance(node, (eqx.nn.Linear, eqx.nn.Conv))


def ruled_layers(params: PyTree) -> list:
    """The layers of `params` that have a per-layer rule (Linear; Conv with groups=1, zero padding)."""
    leaves = jax.tree_util.tree_leaves(params, is_leaf=_is_layer)
    return [leaf for leaf in leaves if _is_layer(leaf) and _has_rule(leaf)]


def supports(params: PyTree) -> bool:
    """True if `params` is a module holding at least one layer with a rule."""
    return isinstance(params, eqx.Module) and bool(ruled_layers(params))


# ------------------------------------------------------------------ the tap: record a, probe δ

_RECORDING = threading.local()


class _Slot:
    """Placeholder for a tapped layer inside the parameter tree (a non-array leaf)."""

    def __init__(self, k: int):
        self.k = k


def _is_slot(node) -> bool:
    return isinstance(node, _Slot)


class _Tap(eqx.Module):
    """`layer(a) + probe`, recording `a` for the rule. Calls outside a recording fail loudly."""

    layer: eqx.Module
    probe: jax.Array | None
    slot: int = eqx.field(static=True)

    def __call__(self, x, *, key=None):
        record = getattr(_RECORDING, "stack", None)
        if not record:
            raise GhostUnsupported("a tapped layer was called outside the per-example loss")
        record = record[-1]
        if self.slot in record:
            raise GhostUnsupported("a layer is called more than once per example (weight sharing)")
        x = jnp.asarray(x)
        if isinstance(self.layer, eqx.nn.Conv):
            saved = _patches(self.layer, x)
            out = _conv_from_patches(self.layer, saved, x.shape)
        else:
            saved, out = x, self.layer(x)
        if self.probe is None:  # the abstract pass: record the output's shape
            record[self.slot] = (out, saved)
            return out
        if out.shape != self.probe.shape:
            raise GhostUnsupported(
                f"a layer got input of shape {x.shape}: the rule needs one example at a time"
            )
        record[self.slot] = saved
        return out + self.probe


# ------------------------------------------------------------------ the rules


class Outer(eqx.Module):
    """A Linear layer's per-example weight gradients kept as factors: `δ (N, out)`, `a (N, in)`.

    `expand` turns it into the `(N, *shape)` gradient `δᵢ ⊗ aᵢ`. Forming the outer products after
    the chunked pass writes them once, straight into the result.
    """

    d: jax.Array
    a: jax.Array
    shape: tuple = eqx.field(static=True)

    def full(self) -> jax.Array:
        return (self.d[:, :, None] * self.a[:, None, :]).reshape((self.d.shape[0], *self.shape))


def expand(grads: PyTree) -> PyTree:
    """Replace every `Outer` in mapped `one_example(..., norms=False)` output by its `(N, *shape)` gradient."""
    return jax.tree.map(lambda n: n.full() if isinstance(n, Outer) else n, grads,
                        is_leaf=lambda n: isinstance(n, Outer))


def _linear_grads(layer: eqx.nn.Linear, a, d) -> tuple:
    """(dW, db) of one example: the factors of δ ⊗ a (see `Outer`), and δ."""
    gw = Outer(d.reshape(-1), a.reshape(-1), layer.weight.shape)
    gb = None if layer.bias is None else d.reshape(layer.bias.shape)
    return gw, gb


def _linear_sq(layer: eqx.nn.Linear, a, d) -> tuple:
    """(‖dW‖², ‖db‖²) of one example without building dW: ‖δ‖²·‖a‖² and ‖δ‖²."""
    dd = jnp.sum(jnp.square(d))
    return dd * jnp.sum(jnp.square(a)), (None if layer.bias is None else dd)


def _patches(layer: eqx.nn.Conv, a):
    """Input patches of one example: (C_in · prod(kernel), positions), in the weight's order."""
    x = jnp.pad(a, [(0, 0)] + [tuple(p) for p in layer.padding])
    kernel = layer.weight.shape[2:]
    c = x.shape[0]
    out = [
        (n - d * (k - 1) - 1) // s + 1
        for n, k, s, d in zip(x.shape[1:], kernel, layer.stride, layer.dilation)
    ]
    cols = []
    for offs in itertools.product(*(range(k) for k in kernel)):
        start = [0] + [o * d for o, d in zip(offs, layer.dilation)]
        limit = [c] + [st + (m - 1) * s + 1 for st, m, s in zip(start[1:], out, layer.stride)]
        cols.append(jax.lax.slice(x, start, limit, (1,) + tuple(layer.stride)))
    return jnp.stack(cols, axis=1).reshape(c * len(cols), -1)


def _conv_from_patches(layer: eqx.nn.Conv, cols, in_shape):
    """`layer(a)` as `W (C_out × C_in·k) @ patches`, plus the bias: the same numbers up to rounding."""
    spatial = [
        (n + sum(p) - d * (k - 1) - 1) // s + 1
        for n, p, k, s, d in zip(
            in_shape[1:], layer.padding, layer.weight.shape[2:], layer.stride, layer.dilation
        )
    ]
    out = (layer.weight.reshape(layer.weight.shape[0], -1) @ cols).reshape((-1, *spatial))
    return out if layer.bias is None else out + layer.bias


def _conv_grads(layer: eqx.nn.Conv, cols, d) -> tuple:
    """(dW, db) of one example: δ (C_out × positions) @ patchesᵀ, and δ summed over positions."""
    d2 = d.reshape(d.shape[0], -1)
    gw = (d2 @ cols.T).reshape(layer.weight.shape)
    gb = None if layer.bias is None else d2.sum(1).reshape(layer.bias.shape)
    return gw, gb


def _conv_sq(layer, cols, d) -> tuple:
    gw, gb = _conv_grads(layer, cols, d)
    return jnp.sum(jnp.square(gw)), (None if gb is None else jnp.sum(jnp.square(gb)))


def _layer_result(layer, saved, d, norms: bool):
    """The layer's gradients (or squared norms) from its saved input (patches for a conv) and δ."""
    if isinstance(layer, eqx.nn.Linear):
        gw, gb = (_linear_sq if norms else _linear_grads)(layer, saved, d)
    else:
        gw, gb = (_conv_sq if norms else _conv_grads)(layer, saved, d)
    out = eqx.tree_at(lambda l: l.weight, layer, gw)
    if gb is not None:
        out = eqx.tree_at(lambda l: l.bias, out, gb)
    return out


# ------------------------------------------------------------------ one example


def _tapped(loss_fn, diff: PyTree, static: PyTree):
    """The model with its ruled layers replaced by slots, and `run(rdiff, probes, x, y)`.

    `run` calls `loss_fn` on the tapped model and returns `(loss, records)`: with `probes=None`
    (the abstract pass) each record is `(layer output, saved input)`, else the saved input
    (patches for a convolution) that the layer's rule needs.
    """
    model = eqx.combine(diff, static)
    leaves, treedef = jax.tree_util.tree_flatten(model, is_leaf=_is_layer)
    layers, slots = [], list(leaves)
    for i, leaf in enumerate(leaves):
        if _is_layer(leaf) and _has_rule(leaf):
            slots[i] = _Slot(len(layers))
            layers.append(leaf)
    if not layers:
        raise GhostUnsupported("the model has no layer with a per-layer rule")
    rdiff, rstatic = eqx.partition(jax.tree_util.tree_unflatten(treedef, slots), eqx.is_inexact_array)

    def run(rdiff, probes, x, y):
        taps = lambda n: _Tap(layers[n.k], None if probes is None else probes[n.k], n.k) if _is_slot(n) else n
        m = jax.tree.map(taps, eqx.combine(rdiff, rstatic), is_leaf=_is_slot)
        stack = _RECORDING.__dict__.setdefault("stack", [])
        stack.append({})
        try:
            value = loss_fn(m, x, y)
        finally:
            record = stack.pop()
        if len(record) != len(layers):
            raise GhostUnsupported("a layer of the model was not called by the loss")
        return value, [record[k] for k in range(len(layers))]

    return layers, rdiff, rstatic, run


def example_bytes(loss_fn, diff: PyTree, static: PyTree, x, y) -> int:
    """Bytes the rules keep per example: every ruled layer's output gradient and saved input.

    A guide for chunk sizes (the backward pass needs about as much again). `x`, `y`: one
    example (arrays or `jax.ShapeDtypeStruct`). **Raises** `GhostUnsupported` as `one_example`.
    """
    _, rdiff, _, run = _tapped(loss_fn, diff, static)
    _, records = jax.eval_shape(lambda r, x, y: run(r, None, x, y), rdiff, x, y)
    return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(records))


def one_example(loss_fn, diff: PyTree, static: PyTree, x, y, *, norms: bool) -> PyTree:
    """Per-example gradient (or per-leaf squared norms) of ONE example via the layer rules.

    Meant to be mapped over examples (`jax.lax.map` / `vmap`): batched, the probes' gradient is
    one backward pass for the whole chunk.

    **Arguments**
    - `loss_fn`: `(model, x, y) -> scalar`.
    - `diff`, `static`: `eqx.partition(params, eqx.is_inexact_array)`.
    - `x`, `y`: one example.
    - `norms`: return squared norms per leaf instead of gradients.

    **Returns** a tree shaped like `diff`: scalar squared L2 norms per leaf (`norms=True`,
    exactly `sum(g**2)` of `jax.grad(loss_fn)`'s leaves), or the gradient leaves, where a Linear
    layer's weight is an `Outer` (its factors): after mapping, `expand` gives `(N, *shape)` arrays
    equal to `vmap(jax.grad(loss_fn))` up to float rounding.

    **Raises** `GhostUnsupported` (at trace time) when a tapped layer is called more than once,
    from inside another transform, or with batched input.
    """
    layers, rdiff, rstatic, run = _tapped(loss_fn, diff, static)
    # First an abstract pass for the layers' output shapes (the probes' shapes), then the real one.
    _, records = jax.eval_shape(lambda r, x, y: run(r, None, x, y), rdiff, x, y)
    probes = [jnp.zeros(out.shape, out.dtype) for out, _ in records]
    loss = lambda r, p: run(r, p, x, y)

    (g_rest, deltas), saved = jax.grad(loss, argnums=(0, 1), has_aux=True)(rdiff, probes)
    results = [_layer_result(l, a, d, norms) for l, a, d in zip(layers, saved, deltas)]
    if norms:
        g_rest = jax.tree.map(lambda g: jnp.sum(jnp.square(g)), g_rest)
    full = jax.tree.map(
        lambda n: results[n.k] if _is_slot(n) else n, eqx.combine(g_rest, rstatic), is_leaf=_is_slot
    )
    return eqx.filter(full, lambda n: eqx.is_inexact_array(n) or isinstance(n, Outer),
                      is_leaf=lambda n: isinstance(n, Outer))
