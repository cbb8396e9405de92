"""Per-layer rules found in the traced loss: per-example gradients at the cost of one backward pass.

A weight W that enters the loss of one example only through one linear operation
`z = op(W, a)` (a dense layer `dot_general`, a convolution, an embedding `gather`) has the
per-example gradient `∂ℓ/∂W = op*(a, δ)`, the VJP of `op` in W given the operation's other
operand `a` and its output gradient `δ = ∂ℓ/∂z`. So one backward pass to the layer *outputs*
gives every such leaf's per-example gradient, and its norm needs no gradient at all:

- dense, one input vector: ‖δ ⊗ a‖² = ‖δ‖²·‖a‖² (Goodfellow 2015, arXiv:1510.01799);
- dense over T tokens or positions: ‖Σₜ δₜ aₜᵀ‖² = Σₜ,ₛ (aₜ·aₛ)(δₜ·δₛ), the "ghost norm" (Li et al.
  2022, arXiv:2110.05679), or the T·I·O outer product, whichever costs fewer flops;
- convolution: the same on its input patches ("im2col": the patches also compute the
  convolution, as a matmul, which XLA runs several times faster than its CPU convolution);
- embedding: Σₜ,ₛ [idₜ = idₛ] δₜ·δₛ over the looked-up rows;
- a parameter added to the activations (a bias, a position embedding) or scaling them (LayerNorm,
  BatchNorm, GroupNorm affine): δ, or δ ⊙ a, summed over the axes it was broadcast along.

Nothing is registered or wrapped: `trace` reads the loss's jaxpr (`gradlab.jaxprs.flatten`, nested
`jit`/`closed_call`/`checkpoint` inlined) and `plan` follows each differentiable leaf through
shape-only ops (transpose, reshape, dtype casts, squeeze, expand_dims; and broadcasts or slices
before an elementwise add or multiply) to its uses. A leaf with exactly one use as a weight, bias or
scale gets a rule; every other leaf (tied weights, a penalty term inside the loss, a leaf entering a
custom_jvp, a scan or a cond) *falls back*: it is differentiated the ordinary way inside the
per-example backward pass, which is exact and costs chunk × that leaf's size. `run` evaluates the
jaxpr with the ruled weights held constant, a zero probe added to each ruled output (its gradient
is δ) and the other operand `a` saved. The idea of matching layers in a jaxpr follows kfac-jax's graph matcher; the code is ours.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gradlab import jaxprs
from gradlab.jaxprs import Const, Eqn, Graph


class RulesUnsupported(ValueError):
    """No parameter leaf of this loss has a per-layer rule (use `method="vmap"`)."""


#: Unary ops a weight may pass through on its way to its layer op (reshapes, casts, transposes).
SHAPE_OPS = frozenset({"transpose", "reshape", "convert_element_type", "squeeze", "expand_dims", "copy", "copy_p"})
#: More linear unary ops a bias, scale or position embedding may pass through before it meets the activations
#: (jnp broadcasting, `wpe[:T]`); a layer weight may not (its rule reads the weight's shape at the op).
SPREAD_OPS = frozenset({"broadcast_in_dim", "slice"})
#: Elementwise ops with the activations whose per-example weight gradient is δ (added) or δ·a (scaled),
#: summed over the axes the weight was broadcast along.
ELEMENTWISE = {"add": "added", "sub": "added", "mul": "scale"}
#: The rules that save work (no per-example weight gradient for a norm); a loss with none of them takes vmap(grad).
LAYER_KINDS = frozenset({"dense", "conv", "embedding"})
#: Call primitives whose body is inlined (they only group equations).
INLINE = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint"})


def trace(fn: Callable, *args) -> Graph:
    """Trace `fn(*args)` (arrays or `jax.ShapeDtypeStruct`s, flattened in order) into a flat `Graph`, the
    bodies of `jit`, `closed_call` and `checkpoint` inlined (`gradlab.jaxprs.flatten`)."""
    return jaxprs.flatten(fn, *args, inline=INLINE)


def _bind(e: Eqn, vals: list) -> list:
    return jaxprs.bind(e.prim, e.params, vals)


def _size(shape) -> int:
    return int(math.prod(shape))


# ------------------------------------------------------------------ the layer ops and their rules


@dataclasses.dataclass(frozen=True)
class Rule:
    """A leaf's per-layer rule: `kind` in dense | conv | embedding | added | scale, at equation `eqn`.

    `pos`: the weight's operand position; `chain`: the shape-only equations from the leaf to it;
    `norm`: how its per-example norm is computed ("gram": the ghost norm, "outer": the weight
    gradient formed per example); `tokens`: T, the positions the weight is applied to.
    """

    leaf: int
    eqn: int
    kind: str
    pos: int
    chain: tuple
    norm: str
    tokens: int
    why: str
    other_shape: tuple = ()
    weight_shape: tuple = ()


def _conv_geometry(e: Eqn, lhs_shape, rhs_shape):
    dn = e.params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    out_shape = e.out_avals[0].shape
    kernel = tuple(rhs_shape[d] for d in rhs_spec[2:])
    out_sp = tuple(out_shape[d] for d in out_spec[2:])
    groups = e.params["feature_group_count"]
    b, c = lhs_shape[lhs_spec[0]], lhs_shape[lhs_spec[1]]
    o = rhs_shape[rhs_spec[0]]
    return dict(lhs_spec=lhs_spec, rhs_spec=rhs_spec, out_spec=out_spec, kernel=kernel, out_sp=out_sp,
                groups=groups, b=b, cg=c // groups, og=o // groups, k=_size(kernel), pos=_size(out_sp))


def _patches(e: Eqn, x, rhs_shape):
    """Input patches of a convolution: `(B, G, C_g·K, positions)`, in the weight's (C_g, K) order."""
    g = _conv_geometry(e, x.shape, rhs_shape)
    x = jnp.transpose(x, g["lhs_spec"])  # (B, C, *S)
    pads = [(0, 0, 0), (0, 0, 0)] + [(lo, hi, 0) for lo, hi in e.params["padding"]]
    x = lax.pad(x, jnp.zeros((), x.dtype), pads)
    strides, dil = e.params["window_strides"], e.params["rhs_dilation"]
    cols = []
    for offs in itertools.product(*(range(k) for k in g["kernel"])):
        start = [0, 0] + [o * d for o, d in zip(offs, dil)]
        limit = list(x.shape[:2]) + [s + (m - 1) * st + 1 for s, m, st in zip(start[2:], g["out_sp"], strides)]
        cols.append(lax.slice(x, start, limit, (1, 1) + tuple(strides)))
    p = jnp.stack(cols, axis=2)  # (B, C, K, *out)
    return p.reshape(g["b"], g["groups"], g["cg"] * g["k"], g["pos"])


def _conv_from_patches(e: Eqn, w, p, lhs_shape, dtype=None):
    """The convolution `e` as a grouped matmul of its weight with the patches `p`: in `e`'s own dtype,
    or wholly in `dtype` (the accumulation dtype, see `acc_dtype`) when given."""
    g = _conv_geometry(e, lhs_shape, w.shape)
    if dtype is not None:
        p = p.astype(dtype)
    wt = jnp.transpose(w, g["rhs_spec"]).reshape(g["groups"], g["og"], g["cg"] * g["k"])
    out = jnp.einsum("bgjp,goj->bgop", p, wt.astype(p.dtype), preferred_element_type=p.dtype)
    out = out.reshape((g["b"], g["groups"] * g["og"]) + g["out_sp"])
    return jnp.transpose(out, np.argsort(g["out_spec"])).astype(dtype or e.out_avals[0].dtype)


def _dense_dims(e: Eqn, pos: int, a_shape):
    """(free, contracting, batch) dims of the non-weight operand `a`, and T, I, O."""
    (lc, rc), (lb, rb) = e.params["dimension_numbers"]
    ca, ba = (lc, lb) if pos == 1 else (rc, rb)
    free = [d for d in range(len(a_shape)) if d not in ca and d not in ba]
    t = _size([a_shape[d] for d in free])
    i = _size([a_shape[d] for d in ca])
    o = _size(e.out_avals[0].shape) // max(t * _size([a_shape[d] for d in ba]), 1)
    return free, list(ca), list(ba), t, i, o


def _gather_simple(e: Eqn, table_shape) -> bool:
    """A gather that picks whole rows (an embedding lookup), as `table[ids]` or `eqx.nn.Embedding` do."""
    dn = e.params["dimension_numbers"]
    sizes = e.params["slice_sizes"]
    return (not dn.operand_batching_dims
            and all(s == 1 or s == n for s, n in zip(sizes, table_shape))
            and all(sizes[d] == 1 or sizes[d] == table_shape[d] for d in dn.start_index_map))


def _gather_rows(e: Eqn, table_shape, ids_shape):
    """(T lookups, D elements per looked-up slice) of a gather."""
    t = _size(ids_shape[:-1])
    d = _size(e.out_avals[0].shape) // max(t, 1)
    return t, d


def _shape(graph: Graph, atom) -> tuple:
    if atom is None:  # nothing saved (an added weight): an empty placeholder
        return (0,)
    return tuple(graph.avals[atom].shape) if isinstance(atom, int) else tuple(np.shape(atom.val))


def _other(e: Eqn, rule) -> Any:
    """The operand that is not the weight: the layer input (or the ids of an embedding); None for an add."""
    if rule.kind == "added":
        return None
    return e.ins[1] if rule.kind in ("embedding",) else e.ins[1 - rule.pos]


def _make_rule(graph: Graph, leaf: int, k: int, pos: int, chain: tuple):
    """The rule for a leaf whose only use is operand `pos` of equation `k`, or (None, why)."""
    e = graph.eqns[k]
    name = e.prim.name
    if name in ELEMENTWISE:
        kind = ELEMENTWISE[name]
        t = _size(e.out_avals[0].shape) // max(_size(graph.avals[e.ins[pos]].shape), 1)
        how = "δ" if kind == "added" else "δ·a"
        why = (f"{'added to' if kind == 'added' else 'scales'} the activations: {how} summed over "
               f"{'the broadcast axes' if t > 1 else 'nothing (same shape)'}")
        return Rule(leaf, k, kind, pos, chain, "outer", t, why), None
    if any(graph.eqns[c].prim.name in SPREAD_OPS for c in chain):
        return None, f"broadcast or sliced before `{name}`: no per-layer rule"
    other = e.ins[1 - pos] if name != "gather" else e.ins[1]
    other_shape = graph.avals[other].shape if isinstance(other, int) else np.shape(other.val)
    w_shape = graph.avals[e.ins[pos]].shape
    if name == "dot_general":
        free, ca, ba, t, i, o = _dense_dims(e, pos, other_shape)
        if ba:
            return Rule(leaf, k, "dense", pos, chain, "outer", t, "dense layer with batch dims: weight gradient per example"), None
        gram = t > 1 and t * t * (i + o) < t * i * o
        how = f"ghost norm over {t} tokens" if gram else ("‖δ‖·‖a‖" if t == 1 else f"outer product over {t} tokens")
        return Rule(leaf, k, "dense", pos, chain, "gram" if gram or t == 1 else "outer", t, f"dense layer: {how}"), None
    if name == "conv_general_dilated" and pos == 1:
        if any(d != 1 for d in e.params["lhs_dilation"]) or e.params["batch_group_count"] != 1:
            return None, "transposed convolution (lhs_dilation) or batch groups: no rule"
        g = _conv_geometry(e, other_shape, w_shape)
        t, j, o = g["b"] * g["pos"], g["cg"] * g["k"], g["og"]
        gram = t * t * (j + o) < t * j * o
        how = f"ghost norm over {t} positions" if gram else f"patches ⊗ δ over {t} positions"
        return Rule(leaf, k, "conv", pos, chain, "gram" if gram else "outer", t, f"convolution (im2col): {how}"), None
    if name == "gather" and pos == 0:
        t, d = _gather_rows(e, w_shape, other_shape)
        gram = _gather_simple(e, w_shape) and t * t * d < _size(w_shape)
        how = f"rows with equal ids over {t} lookups" if gram else "row gradients scattered per example"
        return Rule(leaf, k, "embedding", pos, chain, "gram" if gram else "outer", t, f"embedding lookup: {how}"), None
    return None, f"enters `{name}`" + (" as its input" if name == "conv_general_dilated" else "") + ": no per-layer rule"


@dataclasses.dataclass
class Plan:
    """Which leaves have rules (`rules`: leaf index → Rule) and why the others fall back."""

    graph: Graph
    n_leaves: int
    rules: dict
    fallback: dict  # leaf index -> reason

    @property
    def by_eqn(self) -> dict:
        return {r.eqn: r for r in self.rules.values()}


def plan(graph: Graph, diff_refs: list) -> Plan:
    """Match each differentiable leaf (input ref in `diff_refs`) to a rule, or say why it falls back."""
    uses = defaultdict(list)
    for k, e in enumerate(graph.eqns):
        for p, a in enumerate(e.ins):
            if isinstance(a, int):
                uses[a].append((k, p))
    for o in graph.outputs:
        if isinstance(o, int):
            uses[o].append((None, None))
    rules, fallback = {}, {}
    for leaf, ref in enumerate(diff_refs):
        chain = []
        while True:
            us = uses[ref]
            if not us:
                fallback[leaf] = "not used by the loss (gradient zero)"
                break
            if len(us) > 1:
                fallback[leaf] = f"used {len(us)} times (tied weights, a penalty term, a bias or scale …)"
                break
            k, p = us[0]
            if k is None:
                fallback[leaf] = "returned by the loss itself"
                break
            e = graph.eqns[k]
            if e.prim.name in SHAPE_OPS | SPREAD_OPS:
                chain.append(k)
                ref = e.outs[0]
                continue
            if e.prim.name in ("dot_general", "conv_general_dilated", "gather", *ELEMENTWISE):
                rule, why = _make_rule(graph, leaf, k, p, tuple(chain))
            else:
                rule, why = None, f"enters `{e.prim.name}`: no per-layer rule (a bias, scale or elementwise use)"
            if rule is None:
                fallback[leaf] = why
            else:
                rules[leaf] = dataclasses.replace(rule, other_shape=tuple(_shape(graph, _other(e, rule))),
                                                  weight_shape=tuple(_shape(graph, e.ins[p])))
            break
    # two weights of one op (W1 @ W2): neither is a layer weight with a fixed input
    count = defaultdict(list)
    for r in rules.values():
        count[r.eqn].append(r.leaf)
    for leaves in count.values():
        if len(leaves) > 1:
            for leaf in leaves:
                del rules[leaf]
                fallback[leaf] = "both operands of one product are parameters"
    # biases and scales alone gain nothing over vmap(grad) (their gradients are as small as their rules)
    if not any(r.kind in LAYER_KINDS for r in rules.values()):
        for leaf, r in rules.items():
            fallback[leaf] = f"{r.kind}, but no dense, conv or embedding layer in the loss has a rule"
        rules = {}
    return Plan(graph, len(diff_refs), rules, fallback)


# ------------------------------------------------------------------ evaluation with probes


def _fold_transposes(graph: Graph, rule: Rule):
    """dot_general dimension numbers on the leaf itself when its chain is only transposes that
    keep the weight's free dims in order (`x @ W.T`); else None. Saves a transpose of the N x P
    per-example gradients."""
    if not rule.chain or any(graph.eqns[k].prim.name != "transpose" for k in rule.chain):
        return None
    perm = list(range(len(rule.weight_shape)))
    for k in rule.chain:  # W' = transpose(leaf, perm): W' dim i is leaf dim perm[i]
        perm = [perm[p] for p in graph.eqns[k].params["permutation"]]
    (lc, rc), (lb, rb) = graph.eqns[rule.eqn].params["dimension_numbers"]
    wc, wb = (rc, rb) if rule.pos == 1 else (lc, lb)
    if wb:
        return None
    free = [d for d in range(len(perm)) if d not in wc]
    if [perm[d] for d in free] != sorted(perm[d] for d in free):
        return None
    wc = tuple(perm[d] for d in wc)
    return ((lc, wc), (lb, rb)) if rule.pos == 1 else ((wc, rc), (lb, rb))


def acc_dtype(dtype) -> np.dtype:
    """The dtype per-example gradients, norms and sums accumulate in: float32, or wider if `dtype` is.

    bfloat16 or float16 parameters (or compute) keep their own forward pass, but a norm or sum formed in
    bfloat16 is off by ~2⁻⁸ per step: a clipped contribution would exceed C, breaking DP-SGD's bound."""
    return np.dtype(jnp.promote_types(dtype, jnp.float32))


def _acc(x, dtype):
    return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x


def apply_rule(graph: Graph, rule: Rule, w, saved):
    """The ruled op as a function of its (leaf) weight, computed in `w`'s dtype: the chain of shape ops,
    then the layer op. Linear in `w`; callers pass `w` in `acc_dtype`, so the VJP (the per-example
    gradient) is exact in float32 even for bfloat16 layers (the chain's dtype casts are skipped: a
    cast does not change a linear op's VJP except by rounding it)."""
    dtype = w.dtype
    w0 = w
    for k in rule.chain:
        if graph.eqns[k].prim.name != "convert_element_type":
            w = _bind(graph.eqns[k], [w])[0]
    e = graph.eqns[rule.eqn]
    if rule.kind == "conv":
        return _conv_from_patches(e, w, saved, rule.other_shape, dtype)
    shape = e.out_avals[0].shape
    if rule.kind == "added":
        return jnp.broadcast_to(-w if e.prim.name == "sub" and rule.pos == 1 else w, shape)
    saved = _acc(saved, dtype)
    if rule.kind == "scale":
        return jnp.broadcast_to(w * saved, shape)
    if rule.kind == "embedding":
        return _bind(e, [w, saved])[0]
    dims = e.params["dimension_numbers"]
    folded = _fold_transposes(graph, rule)
    if folded is not None:  # `x @ W.T`: contract the leaf itself, so its gradient has its own layout
        w, dims = w0, folded
    ins = [saved, w] if rule.pos == 1 else [w, saved]
    return lax.dot_general(*ins, dims, precision=e.params.get("precision"), preferred_element_type=dtype)


def run(graph: Graph, pl: Plan, values: list, diff_refs: list, probes: list):
    """Evaluate the loss: `values` for the graph's inputs (ruled leaves as held constants).

    **Returns** `(loss, saved)`: `saved[j]` is the j-th ruled op's other operand (patches for a
    convolution), in the order of `sorted(pl.rules)`; `probes[j]` was added to its output.
    """
    env = dict(zip(graph.inputs, values))
    order = sorted(pl.rules)
    slot = {pl.rules[leaf].eqn: j for j, leaf in enumerate(order)}
    saved = [None] * len(order)
    read = lambda a: a.val if isinstance(a, Const) else env[a]  # noqa: E731
    for k, e in enumerate(graph.eqns):
        ins = [read(a) for a in e.ins]
        j = slot.get(k)
        if j is None:
            outs = _bind(e, ins)
        else:
            rule = pl.rules[order[j]]
            if rule.kind == "conv":
                a = _patches(e, ins[0], ins[1].shape)
                out = _conv_from_patches(e, ins[1], a, ins[0].shape)
            elif rule.kind == "added":  # δ alone gives the gradient: nothing to keep
                a, out = jnp.zeros((0,), jnp.float32), _bind(e, ins)[0]
            else:
                a = ins[1] if rule.kind == "embedding" else ins[1 - rule.pos]
                out = _bind(e, ins)[0]
            saved[j] = jnp.asarray(a)
            outs = [out + probes[j].astype(out.dtype)]
        env.update(zip(e.outs, outs))
    return read(graph.outputs[0]), saved


def probe_avals(pl: Plan) -> list:
    return [pl.graph.eqns[pl.rules[leaf].eqn].out_avals[0] for leaf in sorted(pl.rules)]


def weight_grad(graph: Graph, rule: Rule, leaf_val, saved, delta):
    """One example's gradient for the ruled leaf, in `acc_dtype` (float32 for a bfloat16 leaf): the VJP
    of its op in the weight, given (a, δ)."""
    dtype = acc_dtype(leaf_val.dtype)
    _, vjp = jax.vjp(lambda w: apply_rule(graph, rule, w, saved), leaf_val.astype(dtype))
    return vjp(delta.astype(dtype))[0]


def weight_dot(graph: Graph, rule: Rule, v, saved, delta):
    """⟨per-example weight gradient, v⟩ = ⟨δ, op(v, a)⟩ (the op is linear in the weight), in float32 or wider."""
    dtype = acc_dtype(v.dtype)
    return jnp.vdot(delta.astype(dtype), apply_rule(graph, rule, v.astype(dtype), saved))


def weight_sq_norm(graph: Graph, rule: Rule, leaf_val, saved, delta):
    """‖per-example weight gradient‖² from (a, δ) by the rule's cheaper form (see module doc), in `acc_dtype`."""
    if rule.norm == "outer":
        return jnp.sum(jnp.square(weight_grad(graph, rule, leaf_val, saved, delta)))
    e = graph.eqns[rule.eqn]
    dtype = acc_dtype(leaf_val.dtype)
    saved, delta = _acc(saved, dtype), delta.astype(dtype)
    if rule.kind == "dense":
        free, ca, _, t, i, o = _dense_dims(e, rule.pos, saved.shape)
        a = jnp.transpose(saved, free + ca).reshape(t, i)
        d = delta.reshape(t, o) if rule.pos == 1 else delta.reshape(o, t).T
        return _gram(a, d)
    if rule.kind == "conv":
        g = _conv_geometry(e, rule.other_shape, rule.weight_shape)
        a = jnp.moveaxis(saved, 1, 0)  # (G, B, J, P)
        a = jnp.swapaxes(a, 2, 3).reshape(g["groups"], -1, g["cg"] * g["k"])
        d = jnp.transpose(delta, g["out_spec"]).reshape(g["b"], g["groups"], g["og"], g["pos"])
        d = jnp.swapaxes(jnp.moveaxis(d, 1, 0), 2, 3).reshape(g["groups"], -1, g["og"])
        return jax.vmap(_gram)(a, d).sum()
    # embedding: Σ over lookups with the same row of δₜ·δₛ
    dn = e.params["dimension_numbers"]
    table_shape = leaf_val.shape
    for k in rule.chain:
        table_shape = graph.eqns[k].out_avals[0].shape
    sizes = e.params["slice_sizes"]
    ids = saved.reshape(-1, saved.shape[-1])
    hi = jnp.asarray([table_shape[d] - sizes[d] for d in dn.start_index_map])
    valid = jnp.all((ids >= 0) & (ids <= hi), axis=1)
    ids = jnp.clip(ids, 0, hi)
    batch = [d for d in range(delta.ndim) if d not in dn.offset_dims]
    d = jnp.transpose(delta, batch + list(dn.offset_dims)).reshape(ids.shape[0], -1)
    if e.params["mode"] == lax.GatherScatterMode.FILL_OR_DROP:
        d = d * valid[:, None]
    same = jnp.all(ids[:, None, :] == ids[None, :, :], axis=-1)
    return jnp.sum(same * (d @ d.T))


def _gram(a, d):
    """‖dᵀa‖²_F without forming dᵀa: Σₜ,ₛ (aₜ·aₛ)(dₜ·dₛ); for one token ‖a‖²·‖d‖²."""
    if a.shape[0] == 1:
        return jnp.sum(jnp.square(a)) * jnp.sum(jnp.square(d))
    return jnp.sum((a @ a.T) * (d @ d.T))


def saved_bytes(pl: Plan) -> int:
    """Bytes per example of everything the loss computes (a guide for chunk sizes)."""
    total = sum(_size(a.shape) * np.dtype(a.dtype).itemsize
                for e in pl.graph.eqns for a in e.out_avals if hasattr(a, "shape"))
    for r in pl.rules.values():
        if r.kind == "conv":
            e = pl.graph.eqns[r.eqn]
            g = _conv_geometry(e, r.other_shape, r.weight_shape)
            total += 4 * g["b"] * g["groups"] * g["cg"] * g["k"] * g["pos"] * 2
    return int(total)


def factor_bytes(pl: Plan, leaf: int) -> int:
    """Elements of (a, δ) kept for a ruled leaf: expanding after the chunked pass pays when small."""
    r = pl.rules[leaf]
    e = pl.graph.eqns[r.eqn]
    a = _size(r.other_shape)
    if r.kind == "conv":
        g = _conv_geometry(e, r.other_shape, r.weight_shape)
        a = g["b"] * g["groups"] * g["cg"] * g["k"] * g["pos"]
    return a + _size(e.out_avals[0].shape)
