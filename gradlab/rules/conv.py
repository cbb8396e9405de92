"""The convolution (`conv_general_dilated`, the weight as its kernel): the dense rule on the input's patches
("im2col": the patches also compute the convolution, as a matmul, which XLA runs several times faster than its
CPU convolution), per feature group. A transposed convolution (`lhs_dilation`) is the same rule on the patches
of the dilated input; a convolution with batch groups has no rule.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gradlab.rules.base import NoRule, RuleKind, Site, aval_of, shape_of, size, sq_gram


def conv_geometry(e, lhs_shape, rhs_shape):
    dn = e.params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    out_shape = e.out_avals[0].shape
    kernel = tuple(rhs_shape[d] for d in rhs_spec[2:])
    out_sp = tuple(out_shape[d] for d in out_spec[2:])
    groups = e.params["feature_group_count"]
    b, c = lhs_shape[lhs_spec[0]], lhs_shape[lhs_spec[1]]
    o = rhs_shape[rhs_spec[0]]
    return dict(lhs_spec=lhs_spec, rhs_spec=rhs_spec, out_spec=out_spec, kernel=kernel, out_sp=out_sp,
                groups=groups, b=b, cg=c // groups, og=o // groups, k=size(kernel), pos=size(out_sp))


def patches(e, x, rhs_shape):
    """Input patches of a convolution: `(B, G, C_g·K, positions)`, in the weight's (C_g, K) order."""
    g = conv_geometry(e, x.shape, rhs_shape)
    x = jnp.transpose(x, g["lhs_spec"])  # (B, C, *S)
    # a transposed convolution (lhs_dilation d) convolves the input with d - 1 zeros between its elements
    pads = [(0, 0, 0), (0, 0, 0)] + [(lo, hi, d - 1)
                                     for (lo, hi), d in zip(e.params["padding"], e.params["lhs_dilation"])]
    x = lax.pad(x, jnp.zeros((), x.dtype), pads)
    strides, dil = e.params["window_strides"], e.params["rhs_dilation"]
    cols = []
    for offs in itertools.product(*(range(k) for k in g["kernel"])):
        start = [0, 0] + [o * d for o, d in zip(offs, dil)]
        limit = list(x.shape[:2]) + [s + (m - 1) * st + 1 for s, m, st in zip(start[2:], g["out_sp"], strides)]
        cols.append(lax.slice(x, start, limit, (1, 1) + tuple(strides)))
    p = jnp.stack(cols, axis=2)  # (B, C, K, *out)
    return p.reshape(g["b"], g["groups"], g["cg"] * g["k"], g["pos"])


def conv_from_patches(e, w, p, lhs_shape, dtype=None):
    """The convolution `e` as a grouped matmul of its weight with the patches `p`: in `e`'s own dtype,
    or wholly in `dtype` (the accumulation dtype, see `acc_dtype`) when given."""
    g = conv_geometry(e, lhs_shape, w.shape)
    if dtype is not None:
        p = p.astype(dtype)
    wt = jnp.transpose(w, g["rhs_spec"]).reshape(g["groups"], g["og"], g["cg"] * g["k"])
    out = jnp.einsum("bgjp,goj->bgop", p, wt.astype(p.dtype), preferred_element_type=p.dtype)
    out = out.reshape((g["b"], g["groups"] * g["og"]) + g["out_sp"])
    return jnp.transpose(out, np.argsort(g["out_spec"])).astype(dtype or e.out_avals[0].dtype)


class Conv(RuleKind):
    name = "conv"
    prims = frozenset({"conv_general_dilated"})
    layer = True
    token_axis = 1  # factors are (groups, tokens, features)

    def match(self, graph, e, pos, chain, where, steps):
        if pos != 1:
            return None
        if e.params["batch_group_count"] != 1:
            raise NoRule("convolution with batch groups: no rule")
        other_shape, w_shape = shape_of(graph, e.ins[0]), tuple(shape_of(graph, e.ins[1]))
        g = conv_geometry(e, other_shape, w_shape)
        t, j, o = g["b"] * g["pos"] * steps, g["cg"] * g["k"], g["og"]
        gram = t * t * (j + o) < t * j * o
        how = f"ghost norm over {t} positions" if gram else f"patches ⊗ δ over {t} positions"
        if any(d != 1 for d in e.params["lhs_dilation"]):
            how = f"transposed (input dilated by {tuple(e.params['lhs_dilation'])}), {how}"
        saved = jax.ShapeDtypeStruct((g["b"], g["groups"], j, g["pos"]), aval_of(graph, e.ins[0]).dtype)
        return Site(e, self, pos, chain, where, "gram" if gram else "outer", f"convolution (im2col): {how}", saved,
                    w_shape, tuple(other_shape), tokens=g["b"] * g["pos"] * steps)

    def save(self, site, ins):
        a = patches(site.op, ins[0], ins[1].shape)
        return a, conv_from_patches(site.op, ins[1], a, ins[0].shape)

    def apply(self, site, w, w0, a, dtype):
        return conv_from_patches(site.op, w, a, site.other_shape, dtype)

    def factors(self, site, saved, delta):
        """(G, T, J) patches and (G, T, O) output gradients, T = batch × positions."""
        g = conv_geometry(site.op, site.other_shape, site.weight_shape)
        t, j = g["b"] * g["pos"], g["cg"] * g["k"]
        a = jnp.moveaxis(saved, 1, 0)  # (G, B, J, P)
        a = jnp.swapaxes(a, 2, 3).reshape(g["groups"], t, j)
        d = jnp.transpose(delta, g["out_spec"]).reshape(g["b"], g["groups"], g["og"], g["pos"])
        d = jnp.swapaxes(jnp.moveaxis(d, 1, 0), 2, 3).reshape(g["groups"], t, g["og"])
        return a, d

    def gram(self, site, a, d):
        return jax.vmap(sq_gram)(a, d).sum()

    def factor_layout(self, site, w):
        """`w` as `(G, J, O_g)`: per group, the patch features (C_g, K) by the group's outputs, as
        `conv_from_patches` contracts it."""
        g = conv_geometry(site.op, site.other_shape, site.weight_shape)
        wt = jnp.transpose(w, g["rhs_spec"]).reshape(g["groups"], g["og"], g["cg"] * g["k"])
        return jnp.swapaxes(wt, 1, 2)

    def extra_bytes(self, site):
        return 4 * size(site.stack) * size(site.saved.shape) * 2


CONV = Conv()
