"""What every layer kind shares: the `Site` a kind matches, the `RuleKind` base it subclasses, and the small
helpers the kinds and `core` both use (sizes, dtypes, small contractions). The kinds themselves
live one per file (`dense.py`, `conv.py`, …) and are listed in `registry.KINDS`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gradlab import jaxprs, xla
from gradlab.jaxprs import Eqn, Graph

#: Unary ops a weight may pass through on its way to its layer op (reshapes, casts, transposes).
SHAPE_OPS = frozenset({"transpose", "reshape", "convert_element_type", "squeeze", "expand_dims", "copy", "copy_p"})
#: More linear unary ops a bias, scale or position embedding may pass through before it meets the activations
#: (jnp broadcasting, `wpe[:T]`); a layer weight may not (its rule reads the weight's shape at the op).
SPREAD_OPS = frozenset({"broadcast_in_dim", "slice"})
#: A per-example contraction of at most this many multiply-adds (a norm's Σₜ aₜ ⊗ δₜ, a Gram matrix) is written as
#: a broadcast product and a sum, one loop fusion, rather than a dot: under vmap a dot of two per-example operands
#: is a batched dot, which XLA:CPU runs as one small matmul call per example (256 examples of (4×6)ᵀ(4×6): 0.16 ms
#: as a dot, 0.04 ms fused); the dot wins from about 64k multiply-adds (benchmarks/RESULTS.md, issue 25). Only in
#: programs compiled with `xla.options()` (`xla.fused_reductions()`): under XLA:CPU's default YNNPACK fusions this form
#: is wrong at 128 examples and more when an operand is a broadcast (a race in YNNPACK's partial reductions).
SMALL_DOT = 4096
#: Call primitives whose body is inlined (they only group equations); `remat3` is a `checkpoint` traced under JAX's
#: `jax_remat3` flag (a `call_hi_primitive`, named by `jaxprs.call_name`).
INLINE = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "remat2", "remat3", "checkpoint"})


class NoRule(Exception):
    """Why a leaf has no rule (raised by a kind's `match` or the walker; the message is shown by `explain`)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Site:
    """One use of a leaf as a layer's weight, bias or scale, matched by the `RuleKind` `kind`.

    `op`: the layer equation; `pos`: the weight's operand position; `chain`: the shape-only equations from
    the leaf to it; `where`: the loops around it, outermost first, each `(equation index, branch, bodies,
    steps)` (branch -1 and `steps` = T for a `scan`, the branch and None for a `cond`/`switch`); `stack`: the
    lengths of the enclosing scans (the op runs once per step: (a, δ) carry these leading axes); `norm`: how
    its norm is formed ("gram": the ghost norm over all tokens of all steps, "outer": the gradient itself);
    `saved`: the aval of what one step keeps (the other operand, patches for a convolution).
    """

    op: Eqn
    kind: "RuleKind"
    pos: int
    chain: tuple
    where: tuple
    norm: str
    why: str
    saved: jax.ShapeDtypeStruct
    weight_shape: tuple
    other_shape: tuple = ()
    tokens: int = 1  # positions the op runs on, over all steps

    @property
    def stack(self) -> tuple:
        return tuple(w[3] for w in self.where if w[3] is not None)


class RuleKind:
    """One kind of layer use a leaf can have (a dense layer, a convolution, …): how it is found in the traced
    loss and how its per-example gradient, squared norm and projection are formed from the saved operand `a`
    and the output gradient `δ` of one example.

    A subclass sets `name` (shown by `engine.explain`), `prims` (the primitives it matches) and overrides
    `match`, `save` and `apply`; a kind whose gradient is a sum of outer products Σₜ aₜ ⊗ δₜ (`layer = True`:
    one that saves work over `vmap(grad)`) also overrides `factors` and, for its ghost norm, `gram`.
    Register an instance in `gradlab.rules.registry.KINDS` (or with `registry.register`).

    Per-example shapes below are one step's; `core` maps them over enclosing scans' steps.
    """

    #: the name `explain` reports ("dense", "conv", …)
    name: str = "?"
    #: the primitives whose equations this kind may match (e.g. {"dot_general"})
    prims: frozenset = frozenset()
    #: whether the kind saves work (dense, conv, embedding): a loss with none of these takes `vmap(grad)`
    layer: bool = False
    #: whether the chain may hold broadcasts and slices (a bias spread over positions): `SPREAD_OPS`
    spread_ok: bool = False
    #: axis of the token dimension in `factors`' outputs (a convolution has its groups first)
    token_axis: int = 0
    #: whether `factors`' first output holds row ids (an embedding's lookups: A is one-hot) not vectors
    ids: bool = False

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__

    def match(self, graph: Graph, e: Eqn, pos: int, chain: tuple, where: tuple, steps: int) -> Site | None:
        """The site for operand `pos` of the equation `e` (one of `prims`), reached from the leaf through the
        shape ops `chain`, inside the loops `where` (`steps`: their total steps); None if this kind does not
        apply (another may); raise `NoRule` (with a reason) if the use has no rule at all."""
        raise NotImplementedError

    def save(self, site: Site, ins: list):
        """`(a, out)` at evaluation: what one step keeps of the op's operands `ins` (an aval like `site.saved`)
        and the op's output (computed from `a` where that is cheaper, as a convolution's patches are)."""
        raise NotImplementedError

    def apply(self, site: Site, w, w0, a, dtype):
        """The op as a function of its (chained) weight `w`, on one step's saved operand `a`, in `dtype`: linear
        in `w`; its VJP given δ is this use's per-example gradient. `w0` is the leaf itself (before the chain):
        a kind may contract it directly to skip a transpose."""
        raise NotImplementedError

    def factors(self, site: Site, a, d) -> tuple:
        """One step's `(A, D)`, tokens on `token_axis`, with the per-example gradient (in the kind's factor
        layout) G = Σₜ Aₜ ⊗ Dₜ, so ‖G‖² = Σ (AAᴴ)⊙(DDᴴ). Kinds without factors (a bias) raise."""
        raise NotImplementedError(f"{self.name}: no (a, δ) factors")

    def gram(self, site: Site, a, d):
        """‖G‖² from every step's factors merged into one token axis (`core._merged_factors`), without G."""
        return sq_gram(a, d)

    def orientation(self, site: Site) -> str | None:
        """For a matrix leaf: "ad" when `factors`' (A, D) run along the leaf's (rows, columns), "da" when along
        (columns, rows), else None (then a leaf used several times forms its uses' gradients instead of their
        pairwise ghost products)."""
        return None

    def small_outer(self, site: Site) -> bool:
        """Whether this site's squared norm is ‖Σₜ aₜ ⊗ δₜ‖² by one fused contraction (`core.small_outer`)."""
        return False

    def extra_bytes(self, site: Site) -> int:
        """Bytes per example one step of this site computes beyond the loss's own values (`core.saved_bytes`)."""
        return 0

    def factor_layout(self, site: Site, w):
        """The site's (chained) weight `w` (shaped like the op's weight operand) rearranged into the layout of
        `factors`' gradient: `(I, O)` (or a convolution's `(G, J, O)`) such that Σₜ aₜᵀ W δₜ = ⟨δ, apply(w, a)⟩.
        A permutation of `w`'s entries, so its transpose (`jax.linear_transpose`) takes a matrix in the factors'
        layout (a Kronecker-preconditioned gradient, `gradlab.influence.curvature`) back to the weight's. Kinds
        without factors, or a layout that is not one matrix (a dense layer with batch dimensions), raise
        `NotImplementedError`."""
        raise NotImplementedError(f"{self.name}: no (I, O) layout of the weight")

    def project(self, site: Site, a, d, pa, pd):
        """One step's projected gradient (Paᵀ G Pd): (A Pa)ᵀ(D Pd) summed over tokens, `(k_a, k_d)`, for
        `pa` `(I, k_a)` and `pd` `(O, k_d)` over `factors`' feature axes (an embedding's A is one-hot: rows of
        Pa are picked). Never forms G. Kinds without factors raise `NotImplementedError`."""
        a, d = self.factors(site, a, d)
        pa_rows = pa[a[:, 0]] if self.ids else a @ pa.astype(a.dtype)
        return project_tokens(pa_rows, d @ pd.astype(d.dtype), self.token_axis)


def project_tokens(pa_rows, pd_rows, token_axis: int):
    """Σₜ (A Pa)ₜ ⊗ (D Pd)ₜ over the token axis (summed over a convolution's groups too)."""
    out = jnp.einsum("...ti,...to->...io", pa_rows, pd_rows)
    return out.sum(0) if token_axis == 1 else out


# ------------------------------------------------------------------ helpers shared by the kinds and core


def size(shape) -> int:
    return int(math.prod(shape))


def bind(e: Eqn, vals: list) -> list:
    return jaxprs.bind(e.prim, e.params, vals)


def shape_of(graph: Graph, atom) -> tuple:
    if atom is None:  # nothing saved (an added weight): an empty placeholder
        return (0,)
    return tuple(graph.avals[atom].shape) if isinstance(atom, int) else tuple(np.shape(atom.val))


def aval_of(graph: Graph, atom) -> jax.ShapeDtypeStruct:
    if isinstance(atom, int):
        return jax.ShapeDtypeStruct(graph.avals[atom].shape, graph.avals[atom].dtype)
    v = np.asarray(atom.val)
    return jax.ShapeDtypeStruct(v.shape, v.dtype)


def acc_dtype(dtype) -> np.dtype:
    """The dtype per-example gradients, norms and sums accumulate in: float32, or wider if `dtype` is
    (complex64 for a complex64 leaf).

    bfloat16 or float16 parameters (or compute) keep their own forward pass, but a norm or sum formed in
    bfloat16 is off by ~2⁻⁸ per step: a clipped contribution would exceed C, breaking DP-SGD's bound."""
    return np.dtype(jnp.promote_types(dtype, jnp.float32))


def acc(x, dtype):
    """`x` cast to `dtype` if it is a float (ids stay integers)."""
    return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.inexact) else x


def sq_abs(x):
    """|x|² elementwise, real: x·conj(x) for a complex `x` (JAX's gradient convention: ‖g‖² = Σ |gⱼ|²)."""
    if jnp.iscomplexobj(x):
        return jnp.square(x.real) + jnp.square(x.imag)
    return jnp.square(x)


def real_dtype(dtype) -> np.dtype:
    """The real dtype of `dtype` (float32 for complex64)."""
    return np.dtype(jnp.finfo(dtype).dtype) if jnp.issubdtype(dtype, jnp.complexfloating) else np.dtype(dtype)


def is_small(macs: int) -> bool:
    """Whether a per-example contraction of `macs` multiply-adds is written as a broadcast product and a sum."""
    return macs <= SMALL_DOT and xla.fused_reductions()


def at_b(a, b):
    """aᵀb, `(T, I)ᵀ(T, O) -> (I, O)`: Σₜ aₜ ⊗ bₜ, as a broadcast product and a sum when small (`is_small`)."""
    if is_small(a.shape[0] * a.shape[1] * b.shape[1]):
        a, b = lax.optimization_barrier((a, b))  # XLA would recompute their producers per product element
        return jnp.sum(a[:, :, None] * b[:, None, :], axis=0)
    return a.T @ b


def a_bt(a, b):
    """abᵀ, `(T, I)(S, I)ᵀ -> (T, S)`, as a broadcast product and a sum when small (`is_small`) and not a
    matrix-vector product (T or S = 1: the dot measured faster)."""
    if min(a.shape[0], b.shape[0]) > 1 and is_small(a.shape[0] * b.shape[0] * a.shape[1]):
        a, b = lax.optimization_barrier((a, b))  # XLA would recompute their producers per product element
        return jnp.sum(a[:, None, :] * b[None, :, :], axis=-1)
    return a @ b.T


def a_bh(a, b):
    """abᴴ (`a_bt` with b conjugated: the Gram matrix of complex rows; abᵀ for real ones)."""
    return a_bt(a, jnp.conj(b) if jnp.iscomplexobj(b) else b)


def gram_product(ka, kd):
    """Σ (AAᴴ)⊙(DDᴴ), real: for complex factors the sum is Hermitian, so its real part (exactly ‖G‖²)."""
    total = jnp.sum(ka * kd)
    return total.real if jnp.iscomplexobj(total) else total


def sq_gram(a, d):
    """‖Σₜ aₜ ⊗ dₜ‖²_F without forming it: Σₜ,ₛ (aₜ·āₛ)(dₜ·d̄ₛ); for one token ‖a‖²·‖d‖². `(T, I), (T, O)`."""
    if a.shape[0] == 1:
        return jnp.sum(sq_abs(a)) * jnp.sum(sq_abs(d))
    return gram_product(a_bh(a, a), a_bh(d, d))


def over_steps(site: Site, f: Callable) -> Callable:
    """`f` of one step's (a, δ, …) mapped over the site's enclosing scans (its leading axes)."""
    for _ in site.stack:
        f = jax.vmap(f)
    return f


def op_name(e: Eqn) -> str:
    if e.prim.name == "custom_jvp_call":  # jax.nn.relu and friends: name the function by its body's ops
        inner = sorted(jaxprs.primitive_names(e.params["call_jaxpr"]) - INLINE)
        return f"custom_jvp_call of {'/'.join(inner) or 'identity'}"
    return jaxprs.call_name(e)


def nonlinear(chain: tuple) -> list:
    """The names of the chain's ops that are functions of the weight but not shape ops (relu, exp, ...)."""
    return [op_name(c) for c in chain if c.prim.name not in SHAPE_OPS | SPREAD_OPS]
