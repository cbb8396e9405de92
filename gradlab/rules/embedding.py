"""The embedding lookup (`gather` of whole rows, `table[ids]`, `eqx.nn.Embedding`): per example the looked-up
rows' δ scattered into the table, ‖G‖² = Σₜ,ₛ [idₜ = idₛ] δₜ·δ̄ₛ over the lookups; any other gather forms its
per-example gradient (a scatter) instead.
"""

from __future__ import annotations


import jax.numpy as jnp
from jax import lax

from gradlab.rules.base import RuleKind, Site, a_bh, aval_of, bind, gram_product, shape_of, size


def gather_simple(e, table_shape) -> bool:
    """A gather that picks whole rows (an embedding lookup), as `table[ids]` or `eqx.nn.Embedding` do."""
    dn = e.params["dimension_numbers"]
    sizes = e.params["slice_sizes"]
    return (not dn.operand_batching_dims
            and all(s == 1 or s == n for s, n in zip(sizes, table_shape))
            and all(sizes[d] == 1 or sizes[d] == table_shape[d] for d in dn.start_index_map))


def ids_gram(ids, d):
    """Σₜ,ₛ [idₜ = idₛ] δₜ·δ̄ₛ: the squared norm of the rows δ scattered at `ids` `(T, M)`."""
    same = jnp.all(ids[:, None, :] == ids[None, :, :], axis=-1)
    return gram_product(same, a_bh(d, d))


class Embedding(RuleKind):
    name = "embedding"
    prims = frozenset({"gather"})
    layer = True
    ids = True

    def match(self, graph, e, pos, chain, where, steps):
        if pos != 0:
            return None
        other_shape, w_shape = shape_of(graph, e.ins[1]), tuple(shape_of(graph, e.ins[0]))
        t = size(other_shape[:-1])
        d = size(e.out_avals[0].shape) // max(t, 1)
        t *= steps
        gram = gather_simple(e, w_shape) and t * t * d < size(w_shape)
        how = f"rows with equal ids over {t} lookups" if gram else "row gradients scattered per example"
        return Site(e, self, pos, chain, where, "gram" if gram else "outer", f"embedding lookup: {how}",
                    aval_of(graph, e.ins[1]), w_shape, tuple(other_shape), tokens=t)

    def save(self, site, ins):
        return ins[1], bind(site.op, ins)[0]

    def apply(self, site, w, w0, a, dtype):
        return bind(site.op, [w, a])[0]

    def factors(self, site, saved, delta):
        """(T, M) clipped ids and (T, D) row gradients (zero where a FILL_OR_DROP lookup was out of range)."""
        e = site.op
        dn = e.params["dimension_numbers"]
        sizes = e.params["slice_sizes"]
        m = saved.shape[-1]
        ids = saved.reshape(size(saved.shape) // max(m, 1), m)
        hi = jnp.asarray([site.weight_shape[d] - sizes[d] for d in dn.start_index_map])
        valid = jnp.all((ids >= 0) & (ids <= hi), axis=1)
        ids = jnp.clip(ids, 0, hi)
        batch = [d for d in range(delta.ndim) if d not in dn.offset_dims]
        rows = size([delta.shape[k] for k in dn.offset_dims])
        d = jnp.transpose(delta, batch + list(dn.offset_dims)).reshape(ids.shape[0], rows)
        if e.params["mode"] == lax.GatherScatterMode.FILL_OR_DROP:
            d = d * valid[:, None]
        return ids, d

    def gram(self, site, a, d):
        return ids_gram(a, d)

    def orientation(self, site):
        if len(site.weight_shape) != 2 or site.chain:
            return None
        dn = site.op.params["dimension_numbers"]
        ok = (tuple(dn.start_index_map) == (0,) and tuple(dn.collapsed_slice_dims) == (0,)
              and tuple(site.op.params["slice_sizes"]) == (1, site.weight_shape[1]))
        return "ad" if ok else None


EMBEDDING = Embedding()
