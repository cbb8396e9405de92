"""The dense layer: a weight contracted with the activations by `dot_general` (`x @ W`, `einsum`, `W.T`).

Per example G = Σₜ aₜ ⊗ δₜ over its T tokens (positions, steps): ‖G‖² = ‖δ‖²·‖a‖² for one token (Goodfellow
2015, arXiv:1510.01799), else the ghost norm Σₜ,ₛ (aₜ·āₛ)(δₜ·δ̄ₛ) (Li et al. 2022, arXiv:2110.05679) or the
T·I·O outer product, whichever costs fewer flops. A `dot_general` with batch dimensions on the weight's side
forms the per-example gradient (a VJP) instead.
"""

from __future__ import annotations

import functools

from jax import lax
import jax.numpy as jnp

from gradlab.rules.base import RuleKind, Site, acc, aval_of, bind, is_small, nonlinear, shape_of, size


def dense_dims(e, pos: int, a_shape):
    """(free, contracting, batch) dims of the non-weight operand `a`, and T, I, O."""
    (lc, rc), (lb, rb) = e.params["dimension_numbers"]
    ca, ba = (lc, lb) if pos == 1 else (rc, rb)
    free = [d for d in range(len(a_shape)) if d not in ca and d not in ba]
    t = size([a_shape[d] for d in free])
    i = size([a_shape[d] for d in ca])
    o = size(e.out_avals[0].shape) // max(t * size([a_shape[d] for d in ba]), 1)
    return free, list(ca), list(ba), t, i, o


def fold_transposes(site: Site):
    """dot_general dimension numbers on the leaf itself when its chain is only transposes that
    keep the weight's free dims in order (`x @ W.T`); else None. Saves a transpose of the N x P
    per-example gradients."""
    if not site.chain or any(c.prim.name != "transpose" for c in site.chain):
        return None
    perm = list(range(len(site.weight_shape)))
    for c in site.chain:  # W' = transpose(leaf, perm): W' dim i is leaf dim perm[i]
        perm = [perm[p] for p in c.params["permutation"]]
    (lc, rc), (lb, rb) = site.op.params["dimension_numbers"]
    wc, wb = (rc, rb) if site.pos == 1 else (lc, lb)
    if wb:
        return None
    free = [d for d in range(len(perm)) if d not in wc]
    if [perm[d] for d in free] != sorted(perm[d] for d in free):
        return None
    wc = tuple(perm[d] for d in wc)
    return ((lc, wc), (lb, rb)) if site.pos == 1 else ((wc, rc), (lb, rb))


class Dense(RuleKind):
    name = "dense"
    prims = frozenset({"dot_general"})
    layer = True

    def match(self, graph, e, pos, chain, where, steps):
        other = e.ins[1 - pos]
        other_shape = shape_of(graph, other)
        site = functools.partial(Site, e, self, pos=pos, chain=chain, where=where, saved=aval_of(graph, other),
                                 weight_shape=tuple(shape_of(graph, e.ins[pos])), other_shape=tuple(other_shape))
        free, ca, ba, t, i, o = dense_dims(e, pos, other_shape)
        if ba:
            return site(norm="outer", why="dense layer with batch dims: weight gradient per example")
        t *= steps
        gram = t > 1 and t * t * (i + o) < t * i * o
        how = f"ghost norm over {t} tokens" if gram else ("‖δ‖·‖a‖" if t == 1 else f"outer product over {t} tokens")
        return site(norm="gram" if gram or t == 1 else "outer", why=f"dense layer: {how}", tokens=t)

    def save(self, site, ins):
        return ins[1 - site.pos], bind(site.op, ins)[0]

    def apply(self, site, w, w0, a, dtype):
        e = site.op
        a = acc(a, dtype)
        dims, wt = e.params["dimension_numbers"], w
        folded = fold_transposes(site)
        if folded is not None:  # `x @ W.T`: contract the leaf itself, so its gradient has its own layout
            wt, dims = w0, folded
        ins = [a, wt] if site.pos == 1 else [wt, a]
        return lax.dot_general(*ins, dims, precision=e.params.get("precision"), preferred_element_type=dtype)

    def factors(self, site, saved, delta):
        """(T, I) activations and (T, O) output gradients."""
        free, ca, _, t, i, o = dense_dims(site.op, site.pos, saved.shape)
        a = jnp.transpose(saved, free + ca).reshape(t, i)
        d = delta.reshape(t, o) if site.pos == 1 else delta.reshape(o, t).T
        return a, d

    def factor_layout(self, site, w):
        """`w` as `(I, O)`: its contracting dims (in the order paired with a's, as `factors` flattens them), then
        its free dims (the order of δ's)."""
        (lc, rc), (lb, rb) = site.op.params["dimension_numbers"]
        wc, wb = (rc, rb) if site.pos == 1 else (lc, lb)
        if wb:
            raise NotImplementedError("a dense layer with batch dimensions: its gradient is not one (I, O) matrix")
        free = [d for d in range(w.ndim) if d not in wc]
        return jnp.transpose(w, list(wc) + free).reshape(size([w.shape[d] for d in wc]), -1)

    def orientation(self, site):
        if len(site.weight_shape) != 2 or any(c.prim.name != "transpose" for c in site.chain):
            return None
        (lc, rc), (lb, rb) = site.op.params["dimension_numbers"]
        wc, wb = (rc, rb) if site.pos == 1 else (lc, lb)
        if wb or len(wc) != 1:
            return None
        perm = [0, 1]
        for c in site.chain:
            perm = [perm[p] for p in c.params["permutation"]]
        return "ad" if perm[wc[0]] == 0 else "da"

    def small_outer(self, site):
        """A dense layer without batch dimensions reached through shape ops only, `is_small` in multiply-adds
        per example: its squared norm is ‖Σₜ aₜ ⊗ δₜ‖² by one loop fusion, not the batched dot a per-example
        VJP compiles to."""
        if nonlinear(site.chain) or dense_dims(site.op, site.pos, site.other_shape)[2]:
            return False
        return is_small(site.tokens * size(site.weight_shape))


DENSE = Dense()
