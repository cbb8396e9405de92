"""Structured forms of weights computed from parameters (`core.Composite`): each example's squared norm in the
parameters from the computed weight's factors, no per-example gradient formed.

A computed weight W = f(θ) (θ: parameters, no example) used by one dense layer has, per example, the gradient
G = Σₜ xₜ yₜᵀ in W's (rows, columns) layout (x: the layer's inputs, y: its output gradients, `(T, I)` and
`(T, O)`), and the gradient in θ is f's VJP of G. Forming G per example costs N·I·O; the structures below give
‖VJP(G)‖² per parameter leaf from (x, y) and a few example-free arrays instead:

- `Product` (merged LoRA W = W₀ + A·B, A `(I, R)`, B `(R, O)`): ∂A = G Bᵀ = Σₜ xₜ (B yₜ)ᵀ and ∂B = Aᵀ G =
  Σₜ (Aᵀxₜ) yₜᵀ: dense factor pairs (x, y Bᵀ) and (x A, y), so their ghost norms (`base.sq_gram`).
- `Scaled` (W = V ⊙ s(θ), V a leaf of W's shape, s a scalar (spectral normalization W/σ, with σ = uᵀWv
  differentiated through the power iteration or not), one value per column (weight normalization g·v/‖v‖
  over axis 0) or per row): with cⱼ = Σᵢ Gᵢⱼ Vᵢⱼ (∂ℓ/∂s), the gradient in θ is s ⊙ G (in V) plus J_sᵀ c.
  For a scalar s, J_sᵀ c = C·∇s (C = Σⱼ cⱼ; ∇s computed once per call), so
  ‖∂V‖² = s²‖G‖² + 2sC⟨G, ∇ᵥs⟩ + C²‖∇ᵥs‖² and ‖∂θₖ‖² = C²‖∇ₖs‖² for the other leaves. For a per-column s
  whose column j depends only on column j of each parameter (checked on the jaxpr: `_separable`), J_sᵀ c is
  K ⊙ c column-wise, K = VJP of s at ones, so ‖∂V‖² = Σⱼ sⱼ²‖Gⱼ‖² + 2 sⱼcⱼ⟨Gⱼ, Kⱼ⟩ + cⱼ²‖Kⱼ‖², and
  ‖∂θₖ‖² = Σⱼ cⱼ² ‖Kₖ,ⱼ‖². Σⱼ sⱼ²‖Gⱼ‖² is the ghost norm of (x, y ⊙ s); c and ⟨Gⱼ, Kⱼ⟩ are Σₜ yₜ ⊙ (xₜ V) and
  Σₜ yₜ ⊙ (xₜ K): one matmul of the layer's size. A per-row s is the same on Gᵀ.

A hypernetwork's weight (an MLP's output) has neither form: its J_s has as many rows as W has entries, so its
norms stay on the general path (the formed gradient and the construction's VJP, `core.composite_grads`).
Dot products and clipped sums need no structure: ⟨J_fᵀG, v⟩ = ⟨G, J_f v⟩ and Σᵢ cᵢ J_fᵀGᵢ = J_fᵀ(Σᵢ cᵢ Gᵢ).

Add a structure: one file (or class here) with `match` and the bound object's `sq_norms`, one line in
`registry.STRUCTURES`. Real weights only (a complex computed weight keeps the general path).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from gradlab.jaxprs import Const
from gradlab.rules.base import sq_gram

#: elementwise ops that keep a column (row) of their operands in the same column (row) of their output
ELEMENTWISE = frozenset({"mul", "div", "add", "sub", "neg", "sqrt", "rsqrt", "integer_pow", "pow", "abs", "exp",
                         "log", "max", "min", "square", "convert_element_type", "copy", "copy_p", "sign", "tanh",
                         "logistic", "log1p", "expm1", "add_any"})
#: ops a computed weight may pass through unchanged on its way from its construction (W₀ + A·B cast to bf16)
PASS = frozenset({"convert_element_type", "copy", "copy_p"})


class Structure:
    """A construction whose per-example norms have a closed form (see the module doc). `match` reads the
    construction's equations and returns a bound form (with `sq_norms`) or None."""

    name: str = "?"

    def __str__(self) -> str:
        return self.name

    def match(self, graph, eqns: tuple, leaf_of: dict, ref, inside: dict):
        """The bound form for the computed weight `ref` built by `eqns` (top-level equations, in order) from the
        leaves `leaf_of` ({input ref: leaf index}: the construction's parameters), or None. `inside`: leaves
        that have a rule of their own but are used only by `eqns`; the form may take them in (its `leaves`)."""
        raise NotImplementedError


def _producers(eqns) -> dict:
    return {o: e for e in eqns for o in e.outs}


def _peel(prod: dict, ref):
    """(the value under `ref`'s transposes and casts, whether an odd number of 2-D transposes were peeled): a
    weight used as `x @ W.T` is W's structure on Gᵀ = Σₜ yₜ xₜᵀ."""
    swap = False
    while ref in prod and prod[ref].prim.name in PASS | {"transpose"}:
        e = prod[ref]
        if e.prim.name == "transpose":
            if tuple(e.params["permutation"]) != (1, 0):
                break
            swap = not swap
        ref = e.ins[0]
    return ref, swap


def _depends(eqns, refs) -> set:
    """The refs computed (by `eqns`) from any of `refs`, those included."""
    dep = set(refs)
    for e in eqns:
        if any(isinstance(a, int) and a in dep for a in e.ins):
            dep.update(e.outs)
    return dep


# ------------------------------------------------------------------ W₀ + A·B


@dataclasses.dataclass(frozen=True)
class BoundProduct:
    a: int  # leaf indices of A (I, R) and B (R, O) (each possibly contracted transposed: `ta`, `tb`)
    b: int
    added: tuple = ()  # leaves added to A·B (W₀): their gradient is G itself
    swap: bool = False  # the layer uses the transpose of W₀ + A·B
    ta: bool = False  # the product is Aᵀ·B (A stored (R, I))
    tb: bool = False  # A·Bᵀ (B stored (O, R))
    scale: float = 1.0  # W = W₀ + scale·A·B (LoRA's α/r, a literal)
    why: str = "merged product W₀ + A·B: ∂A, ∂B from the factors (x, y Bᵀ), (x A, y); ∂W₀ = G"

    @property
    def leaves(self) -> tuple:
        return (self.a, self.b) + self.added

    def sq_norms(self, env: Callable, leaf_vals: dict, x, y) -> dict:
        """{leaf: ‖∂leaf‖²} for one example, from W's factors `x` `(T, I)`, `y` `(T, O)`."""
        x, y = (y, x) if self.swap else (x, y)
        a, b = leaf_vals[self.a].astype(x.dtype), leaf_vals[self.b].astype(x.dtype)
        a, b = (a.T if self.ta else a), (b.T if self.tb else b)  # ‖·‖ is the same for ∂A and its transpose
        k = self.scale * self.scale
        out = {self.a: k * sq_gram(x, y @ b.T), self.b: k * sq_gram(x @ a, y)}
        if self.added:
            g = sq_gram(x, y)
            out.update({leaf: g for leaf in self.added})
        return out


class Product(Structure):
    """W = A·B (plus terms without A, B: a frozen W₀), A and B parameter matrices used nowhere else."""

    name = "product"

    def match(self, graph, eqns, leaf_of, ref, inside):
        prod, ours = _producers(eqns), _depends(eqns, leaf_of)
        (cur, swap), added, scale = _peel(prod, ref), [], 1.0
        while cur in prod:
            e = prod[cur]
            name = e.prim.name
            if name in ("mul", "div", "neg"):  # a literal scale (LoRA's α/r)
                const = [a for a in e.ins if isinstance(a, Const)]
                mine = [a for a in e.ins if isinstance(a, int) and a in ours]
                if name == "neg" and mine:
                    scale, cur = -scale, mine[0]
                    continue
                if len(const) != 1 or len(mine) != 1 or np.size(const[0].val) != 1 or (name == "div" and
                                                                                      e.ins[0] is not mine[0]):
                    return None
                c = float(np.asarray(const[0].val).reshape(()))
                scale, cur = (scale * c if name == "mul" else scale / c), mine[0]
                continue
            if name in ("add", "add_any"):
                mine = [a for a in e.ins if isinstance(a, int) and a in ours]
                rest = [a for a in e.ins if not (isinstance(a, int) and a in ours)]
                if len(mine) != 1 or graph.avals[mine[0]].shape != graph.avals[cur].shape:
                    return None
                w0 = rest[0] if len(rest) == 1 and isinstance(rest[0], int) else None
                if w0 in inside and graph.avals[w0].shape == graph.avals[cur].shape:
                    added.append(inside[w0])  # W₀ itself (not broadcast): its gradient is G
                cur = mine[0]
            elif name in PASS:
                cur = e.ins[0]
            elif name == "dot_general":
                (lc, rc), (lb, rb) = e.params["dimension_numbers"]
                if not all(isinstance(r, int) for r in e.ins):
                    return None
                (a, ta), (b, tb) = _peel(prod, e.ins[0]), _peel(prod, e.ins[1])  # Aᵀ written `a.T`
                if a not in leaf_of or b not in leaf_of or a == b or set(leaf_of) != {a, b}:
                    return None
                if lb or rb or len(lc) != 1 or len(rc) != 1 or len(graph.avals[a].shape) != 2 \
                        or len(graph.avals[b].shape) != 2:
                    return None
                return BoundProduct(leaf_of[a], leaf_of[b], tuple(added), swap, ta=(lc[0] == 0) != ta,
                                    tb=(rc[0] == 1) != tb, scale=scale)
            else:
                return None
        return None


PRODUCT = Product()


# ------------------------------------------------------------------ W = V ⊙ s(θ)


@dataclasses.dataclass(frozen=True)
class BoundScaled:
    v: int  # the leaf V (W's shape)
    factors: tuple  # (ref or a literal's value, +1 | -1): s = Π value^power, each reshaped to s's shape
    mode: str  # "scalar", "col" (s is (1, O)) or "row" ((I, 1))
    axes: tuple  # (leaf, its column/row axis or None): the other leaves
    swap: bool = False  # the layer uses Wᵀ
    why: str = ""

    @property
    def leaves(self) -> tuple:
        return (self.v,) + tuple(leaf for leaf, _ in self.axes)

    def _s(self, env: Callable, leaf_vals: dict, shape):
        """s(θ): `()`, `(1, O)` or `(I, 1)` by `mode`."""
        vals = env(leaf_vals)
        target = {"scalar": (), "col": (1, shape[1]), "row": (shape[0], 1)}[self.mode]
        s = jnp.ones(target, leaf_vals[self.v].dtype)
        for r, p in self.factors:
            f = jnp.asarray(r, s.dtype) if isinstance(r, float) else vals[r]  # a literal, or a computed value
            f = f.reshape(()) if f.size == 1 else f.reshape(target)
            s = s * f if p > 0 else s / f
        return s

    def sq_norms(self, env: Callable, leaf_vals: dict, x, y) -> dict:
        """{leaf: ‖∂leaf‖²} for one example from W's factors `x` `(T, I)`, `y` `(T, O)` (module doc): s and
        K = VJP of s at ones from `env` (the construction's values from the leaves' `leaf_vals`), example-free,
        so computed once per chunk under vmap; per example two products with the layer's size (x V, x K) and a
        ghost norm."""
        x, y = (y, x) if self.swap else (x, y)
        dtype = x.dtype
        vals = {k: v.astype(dtype) for k, v in leaf_vals.items()}
        shape = vals[self.v].shape
        s, vjp = jax.vjp(lambda lv: self._s(env, lv, shape), vals)
        k = vjp(jnp.ones_like(s))[0]  # example-free: computed once per chunk, not per example
        v, kv = vals[self.v], k[self.v]
        if self.mode == "row":  # rows of W are the columns of Wᵀ = Σₜ yₜ xₜᵀ
            x, y, v, kv, s = y, x, v.T, kv.T, s.T
        c = jnp.sum(y * (x @ v), axis=0)  # (O,): ∂ℓ/∂s per column, Σᵢ Gᵢⱼ Vᵢⱼ
        e = jnp.sum(y * (x @ kv), axis=0)  # (O,): ⟨Gⱼ, Kⱼ⟩
        out = {}
        if self.mode == "scalar":
            cc, ee = jnp.sum(c), jnp.sum(e)
            out[self.v] = s * s * sq_gram(x, y) + 2 * s * cc * ee + cc * cc * jnp.sum(kv * kv)
            for leaf, _ in self.axes:
                out[leaf] = cc * cc * jnp.sum(k[leaf] * k[leaf])
            return out
        s = s.reshape(-1)
        out[self.v] = sq_gram(x, y * s) + 2 * jnp.sum(s * c * e) + jnp.sum(c * c * jnp.sum(kv * kv, axis=0))
        for leaf, axis in self.axes:
            kl = k[leaf]
            q = jnp.sum(jnp.moveaxis(kl * kl, axis, -1).reshape(-1, kl.shape[axis]), axis=0)
            out[leaf] = jnp.sum(c * c * q)
        return out


def _separable(graph, eqns, leaf_of: dict, n: int, axis_of_v: int, v_ref) -> dict | None:
    """{ref: its column axis (of size `n`)} for every value the construction computes from the leaves, when each
    column depends only on the same column of every leaf (elementwise ops, reductions over other axes,
    broadcasts, reshapes keeping the axis); None if some value mixes columns (a matmul). A leaf other than V
    must have exactly one axis of size `n`, the others of size 1."""
    axis = {}
    for r in leaf_of:
        shape = graph.avals[r].shape
        if r == v_ref:
            axis[r] = axis_of_v
        elif list(shape).count(n) == 1 and all(d in (1, n) for d in shape):
            axis[r] = list(shape).index(n)
        else:
            return None
    for e in eqns:
        ins = [(a, axis[a]) for a in e.ins if isinstance(a, int) and a in axis]
        if not ins:
            continue
        ks = {k for _, k in ins}
        out_shape = e.out_avals[0].shape
        name = e.prim.name
        if len(ks) != 1:
            return None
        (k,) = ks
        in_shape = graph.avals[ins[0][0]].shape
        if name in ELEMENTWISE:
            new = k if len(out_shape) == len(in_shape) and out_shape[k] == n else None
        elif name in ("reduce_sum", "reduce_max", "reduce_min"):
            red = e.params["axes"]
            new = None if k in red else k - sum(1 for a in red if a < k)
        elif name == "broadcast_in_dim":
            new = e.params["broadcast_dimensions"][k]
        elif name == "transpose":
            new = list(e.params["permutation"]).index(k)
        elif name in ("reshape", "squeeze", "expand_dims"):
            before = math.prod(in_shape[:k])
            new = next((m for m in range(len(out_shape)) if out_shape[m] == n
                        and math.prod(out_shape[:m]) == before), None)
        else:
            new = None
        if new is None or out_shape[new] != n:
            return None
        for o in e.outs:
            axis[o] = new
    return axis


def _mode(shape, w_shape) -> str | None:
    if len(shape) == 0 or math.prod(shape) == 1:
        return "scalar"
    if len(shape) == 2 and shape[0] == 1 and shape[1] == w_shape[1]:
        return "col"
    if len(shape) == 2 and shape[1] == 1 and shape[0] == w_shape[0]:
        return "row"
    return None


class Scaled(Structure):
    """W = V ⊙ s(θ): a parameter V of W's shape multiplied or divided by example-free factors each of one value
    (spectral normalization), one per column (weight normalization) or one per row."""

    name = "scaled"

    def match(self, graph, eqns, leaf_of, ref, inside):
        prod, ours = _producers(eqns), _depends(eqns, leaf_of)
        ref, swap = _peel(prod, ref)
        w_shape = tuple(graph.avals[ref].shape)
        if len(w_shape) != 2 or not np.issubdtype(graph.avals[ref].dtype, np.floating):
            return None
        factors, modes, cur = [], set(), ref
        while cur not in leaf_of:
            e = prod.get(cur)
            if e is None:
                return None
            name = e.prim.name
            if name in PASS:
                cur = e.ins[0]
                continue
            if name not in ("mul", "div"):
                return None
            full = [p for p, a in enumerate(e.ins) if isinstance(a, int) and a in ours
                    and tuple(graph.avals[a].shape) == w_shape]
            main = 0 if name == "div" else (full[0] if len(full) == 1 else None)
            if main is None or main not in full:
                return None
            other = e.ins[1 - main]
            if isinstance(other, Const):  # a literal scale: kept as its value
                if np.size(other.val) != 1:
                    return None
                factors.append((float(np.asarray(other.val).reshape(())), -1 if name == "div" else 1))
                cur = e.ins[main]
                continue
            mode = _mode(tuple(graph.avals[other].shape), w_shape)
            if mode is None:
                return None
            modes.add(mode)
            factors.append((other, -1 if name == "div" else 1))
            cur = e.ins[main]
        if tuple(graph.avals[cur].shape) != w_shape:
            return None
        modes.discard("scalar")
        if len(modes) > 1:
            return None
        mode = modes.pop() if modes else "scalar"
        others = [r for r in leaf_of if r != cur]
        if mode == "scalar":
            axes = tuple((leaf_of[r], None) for r in others)
        else:
            n, ax = (w_shape[1], 1) if mode == "col" else (w_shape[0], 0)
            axis = _separable(graph, eqns, leaf_of, n, ax, cur)
            if axis is None or any(not isinstance(f, float) and f not in axis for f, _ in factors):
                return None
            axes = tuple((leaf_of[r], axis[r]) for r in others)
        what = {"scalar": "one scale", "col": "a scale per column", "row": "a scale per row"}[mode]
        return BoundScaled(leaf_of[cur], tuple(factors), mode, axes, swap,
                           why=f"W = V ⊙ s(θ), {what}: norms from W's factors and ∇s, no gradient formed")


SCALED = Scaled()
