"""A parameter added to the activations (a bias, a position embedding: kind "added") or scaling them (LayerNorm,
BatchNorm, GroupNorm affine: kind "scale"), possibly broadcast or sliced first: its per-example gradient is δ, or
δ ⊙ a, summed over the axes it was broadcast along. These save no work on their own (their gradients are as
small as their rules), so a loss whose only rules are these takes `vmap(grad)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gradlab.rules.base import RuleKind, Site, acc, aval_of, bind, shape_of, size


def _spread(graph, e, pos) -> int:
    return size(e.out_avals[0].shape) // max(size(graph.avals[e.ins[pos]].shape), 1)


class Added(RuleKind):
    name = "added"
    prims = frozenset({"add", "sub"})
    spread_ok = True

    def match(self, graph, e, pos, chain, where, steps):
        t = _spread(graph, e, pos)
        why = f"added to the activations: δ summed over {'the broadcast axes' if t > 1 else 'nothing (same shape)'}"
        return Site(e, self, pos, chain, where, "outer", why, jax.ShapeDtypeStruct((0,), jnp.float32),
                    tuple(shape_of(graph, e.ins[pos])))

    def save(self, site, ins):  # δ alone gives the gradient: nothing to keep
        return jnp.zeros((0,), jnp.float32), bind(site.op, ins)[0]

    def apply(self, site, w, w0, a, dtype):
        neg = site.op.prim.name == "sub" and site.pos == 1
        return jnp.broadcast_to(-w if neg else w, site.op.out_avals[0].shape)


class Scale(RuleKind):
    name = "scale"
    prims = frozenset({"mul"})
    spread_ok = True

    def match(self, graph, e, pos, chain, where, steps):
        t = _spread(graph, e, pos)
        why = f"scales the activations: δ·a summed over {'the broadcast axes' if t > 1 else 'nothing (same shape)'}"
        return Site(e, self, pos, chain, where, "outer", why, aval_of(graph, e.ins[1 - pos]),
                    tuple(shape_of(graph, e.ins[pos])))

    def save(self, site, ins):
        return ins[1 - site.pos], bind(site.op, ins)[0]

    def apply(self, site, w, w0, a, dtype):
        return jnp.broadcast_to(w * acc(a, dtype), site.op.out_avals[0].shape)


ADDED = Added()
SCALE = Scale()
