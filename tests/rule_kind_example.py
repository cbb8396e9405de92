"""An example layer kind, added the registry way (docs/extending.md): a window of rows sliced from a parameter
table at a start read from the example, `table[i]` or `lax.dynamic_slice_in_dim(table, i, L)` (a
`dynamic_slice`; JAX writes `table[i]` with a traced scalar `i` so). The window's L rows are distinct rows of
the table, so the per-example gradient is δ placed at those rows and ‖G‖² = ‖δ‖²; as factors, A is one-hot
(the row ids start, …, start + L - 1) and D the window's δ rows, so a tied use with a dense layer takes the
pairwise ghost products too. `tests/test_rule_kinds.py` registers it (`rules.register(ROW_WINDOW)`) and checks
it against a Python loop of `jax.grad`.
"""

import jax
import jax.numpy as jnp
from jax import lax

from gradlab.rules.base import RuleKind, Site, bind, shape_of, size, sq_abs


class RowWindow(RuleKind):
    name = "row-window"
    prims = frozenset({"dynamic_slice"})
    layer = True
    ids = True

    def match(self, graph, e, pos, chain, where, steps):
        w_shape = tuple(shape_of(graph, e.ins[0]))
        sizes = tuple(e.params["slice_sizes"])
        if pos != 0 or len(w_shape) != 2 or sizes[1] != w_shape[1]:
            return None  # a start index, or a window that cuts the columns: no rule here
        saved = jax.ShapeDtypeStruct((len(e.ins) - 1,), jnp.int32)  # the start indices
        return Site(e, self, pos, chain, where, "gram", f"row window of {sizes[0]} rows: ‖δ‖²", saved, w_shape,
                    tokens=sizes[0] * steps)

    def save(self, site, ins):
        return jnp.stack([jnp.asarray(i, jnp.int32) for i in ins[1:]]), bind(site.op, ins)[0]

    def apply(self, site, w, w0, a, dtype):
        return lax.dynamic_slice(w, [a[k] for k in range(a.shape[0])], site.op.params["slice_sizes"])

    def factors(self, site, a, d):
        rows = site.op.params["slice_sizes"][0]
        start = jnp.clip(a[0], 0, site.weight_shape[0] - rows)  # as dynamic_slice clamps it
        return (start + jnp.arange(rows))[:, None], d.reshape(rows, size(d.shape) // rows)

    def gram(self, site, a, d):
        """The rows of one step are distinct; over several steps (a scan) they may repeat: Σ [idₜ = idₛ] δₜ·δ̄ₛ."""
        if a.shape[0] == site.op.params["slice_sizes"][0]:
            return jnp.sum(sq_abs(d))
        same = (a[:, None, 0] == a[None, :, 0]).astype(d.dtype)
        return jnp.real(jnp.sum(same * (d @ jnp.conj(d).T)))

    def orientation(self, site):
        return None if site.chain else "ad"


ROW_WINDOW = RowWindow()
