"""Kronecker-factored curvature from the rules' factors: K-FAC and EK-FAC, optionally in a LoGra projection, for an
influence function at a trained checkpoint (no re-converged θ̂: what Grosse et al. 2023 and Kronfluence use for
large networks).

**Sites.** Every parameter leaf used once, linearly, by a dense layer or a convolution (a *site*: the rules'
`RuleKind.factors` give each example's activations aₜ and output gradients δₜ over its T tokens, a convolution's
aₜ being its patches, and `RuleKind.factor_layout` the weight in the same `(I, O)` layout) gets a Kronecker block.
Every other differentiable leaf (biases, norm scales, embeddings, leaves used twice, weights inside a nonlinear
function, leaves the rules do not cover) gets a *diagonal* block: the per-parameter mean squared gradient.

**Factors** (K-FAC, Martens & Grosse 2015; for a convolution and any layer over T tokens the KFC convention of
Grosse & Martens 2016, eq. 10 and §3.1, "spatially uncorrelated derivatives"):

    A = (1/N) Σᵢ Σₜ aᵢₜ aᵢₜᵀ   (I × I),        S = (1/N) Σᵢ (1/T) Σₜ δᵢₜ δᵢₜᵀ   (O × O),

so that F ≈ A ⊗ S for the site's block of the Fisher F = (1/N) Σᵢ vec(Gᵢ) vec(Gᵢ)ᵀ, Gᵢ = Σₜ aᵢₜ δᵢₜᵀ (exact for
T = 1 when aᵢ and δᵢ are independent). A grouped convolution gets one pair per group. δ is the gradient of the
per-example loss at the labels the caller passes: the dataset's (the *empirical* Fisher) or labels sampled from the
model's own predictive distribution (`fisher_labels`: an unbiased estimate of the true Fisher, which for softmax
cross-entropy and squared error is the Gauss–Newton matrix; Kronfluence's default, and the better choice for
classification: the empirical Fisher vanishes on examples the model already fits, Kunstner et al. 2019).

**EK-FAC** (George et al. 2018, eq. 9): with A = Q_A Λ_A Q_Aᵀ and S = Q_S Λ_S Q_Sᵀ, keep the Kronecker eigenbasis
Q_A ⊗ Q_S but replace its eigenvalues λ_A,i λ_S,j by the Fisher's own second moments there,

    Λ*ᵢⱼ = (1/N) Σₙ ((Q_Aᵀ Gₙ Q_S)ᵢⱼ)²,

one more streamed pass (the projections the rules' `project` hook forms, without Gₙ). (F + δI)⁻¹ is then
Q (Λ* + δ)⁻¹ Qᵀ per block; K-FAC's is the same with Λᵢⱼ = λ_A,i λ_S,j.

**Projection** (LoGra, Choe et al. 2024, §3): a site wider than k on a side first projects that side by a fixed
Gaussian matrix P_in `(I, k_in)` (or P_out `(O, k_out)`), entries N(0, 1/k), so aₜ → P_inᵀ aₜ, δₜ → P_outᵀ δₜ and
the gradient Gₙ → P_inᵀ Gₙ P_out; the factors, the eigenbasis, the correction and the influence are all in that
space. A side of at most k floats is kept exact. Then a 9,216-input layer needs k² floats for A, not 9,216².

Everything streams over chunks of examples; nothing holds N × P. No Streamlit here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float

from gradlab import engine, rules, xla
from gradlab.influence.scores import streamed_dots
from gradlab.rules.base import bind, over_steps, size

#: Bytes the per-example (a, δ) of one chunk may take in a curvature pass (activations, their projections, the
#: eigenbasis projections); chunks are 1 to `MAX_CHUNK` examples.
CHUNK_BYTES = 32 * 2**20
MAX_CHUNK = 64


@dataclasses.dataclass(frozen=True, eq=False)
class KronSite:
    """One Kronecker-factored leaf: the differentiable leaf number `leaf` (its position in `split(params)[0]`'s
    leaves), its rules `site`, `groups` G, `tokens` T per example, feature sizes `inputs` I and `outputs` O, and
    the sizes after projection, `k_in` ≤ I and `k_out` ≤ O (equal: that side is not projected)."""

    leaf: int
    site: Any
    groups: int
    tokens: int
    inputs: int
    outputs: int
    k_in: int
    k_out: int

    @property
    def factor_floats(self) -> int:
        """Floats the block keeps: A and S, Q_A and Q_S, Λ, and the maps into the eigenbasis (P Q, where projected)."""
        proj = (self.inputs * self.k_in if self.k_in < self.inputs else 0) + (
            self.outputs * self.k_out if self.k_out < self.outputs else 0)
        return self.groups * (2 * self.k_in ** 2 + 2 * self.k_out ** 2 + self.k_in * self.k_out) + proj


class Layout:
    """A loss's Kronecker sites and diagonal leaves (`layout`): `sites` (`KronSite`s, in the plan's leaf order),
    `diagonal` (differentiable leaf numbers with a diagonal block), `why` ((leaf number, why it is diagonal) pairs),
    `leaf_shapes` (each differentiable leaf's shape), and the traced `graph` and rules `plan` the passes evaluate.

    Hashable by identity (the compiled passes are keyed on it). It pickles as what built it (the loss, the
    parameters' shapes and one example's) and is traced again when unpickled, so a prepared `Curvature` can be
    stored on disk; the results store sizes it as a small object (`__slots__`: the jaxpr is not walked)."""

    __slots__ = ("loss_fn", "skeleton", "example", "proj_dim", "graph", "plan", "diff_index", "leaf_shapes", "sites",
                 "diagonal", "why")

    def __init__(self, **fields):
        for name in self.__slots__:
            object.__setattr__(self, name, fields[name])

    def __setattr__(self, name, value):
        raise AttributeError("a Layout is immutable")

    def __reduce__(self):
        return _cached, (self.loss_fn, self.skeleton, self.example, self.proj_dim)

    def held_bytes(self, itemsize: int = 4) -> int:
        """Bytes the prepared curvature holds: each block's factors, eigenbasis, eigenvalues and projections, and
        the diagonal blocks; plus the float64 copy numpy's eigendecomposition works on (the largest factor)."""
        diag = sum(size(self.leaf_shapes[i]) for i in self.diagonal)
        largest = max([s.groups * max(s.k_in, s.k_out) ** 2 for s in self.sites], default=0)
        return itemsize * (sum(s.factor_floats for s in self.sites) + diag) + 8 * 3 * largest


def _sds(a):
    return jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a))


def _is_sds(a) -> bool:
    return isinstance(a, jax.ShapeDtypeStruct)


def _chain(site, w):
    """The site's shape ops applied to the leaf `w` (dtype casts skipped, as the rules' `apply` does)."""
    for c in site.chain:
        if c.prim.name != "convert_element_type":
            w = bind(c, [w if isinstance(a, int) else a.val for a in c.ins])[0]
    return w


def _to_factor(site, w):
    """The leaf `w` in the site's factor layout `(G, I, O)`."""
    m = site.kind.factor_layout(site, _chain(site, w))
    return m[None] if site.kind.token_axis == 0 else m


def _why_diagonal(pl, leaf, shape) -> str | None:
    """None when leaf `leaf` can take a Kronecker block, else why not."""
    rule = pl.rules.get(leaf)
    if leaf in pl.composite_leaves:
        return "a leaf of a computed weight"
    if rule is None:
        return "no layer rule"
    if len(rule.sites) != 1:
        return f"used {len(rule.sites)} times"
    if rule.fixed:
        return "a data-free term uses it too"
    if not rule.linear:
        return "used through a nonlinear function of itself"
    site = rule.sites[0]
    if site.kind.ids or not site.kind.layer:
        return f"its use is of kind '{site.kind.name}', without activation ⊗ output-gradient factors"
    try:
        m = jax.eval_shape(lambda w: _to_factor(site, w), jax.ShapeDtypeStruct(shape, jnp.float32))
        jax.eval_shape(lambda a, d: site.kind.factors(site, a, d), site.saved,
                       jax.ShapeDtypeStruct(site.op.out_avals[0].shape, jnp.float32))
    except NotImplementedError as err:
        return str(err)
    if size(m.shape) != size(shape):
        return "its layout is not a permutation of the weight"
    return None


def layout(loss_fn, params, x, y, *, proj_dim: int | None = None) -> Layout:
    """Which leaves of `loss_fn(params, x, y)` (ONE example) take a Kronecker block, and their sizes.

    **Arguments** `params`: any pytree or Equinox module; `x`, `y`: one example (no example axis); `proj_dim` k: a
    side wider than k is projected to k (LoGra); None: nothing is projected.

    **Returns** a `Layout`. **Raises** `ValueError` when nothing can be traced."""
    skeleton = jax.tree.map(lambda a: _sds(a) if eqx.is_array(a) else a, engine.as_params(params))
    return _cached(loss_fn, skeleton, (jax.tree.map(_sds, x), jax.tree.map(_sds, y)), proj_dim)


#: The last `LAYOUTS` layouts built, by what built them: the same model, example shapes and k give the same
#: `Layout` object, so the passes compiled for it are reused (a page preparing again, a state read from disk).
LAYOUTS = 16
_LAYOUTS: dict = {}


def _cached(loss_fn, skeleton, example, proj_dim) -> Layout:
    key = (loss_fn, *jax.tree.flatten(skeleton, is_leaf=_is_sds), *jax.tree.flatten(example), proj_dim)
    key = tuple(tuple(k) if isinstance(k, list) else k for k in key)
    try:
        hash(key)
    except TypeError:  # a leaf that is not hashable: build it every time
        return _build(loss_fn, skeleton, example, proj_dim)
    if key not in _LAYOUTS:
        while len(_LAYOUTS) >= LAYOUTS:
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        _LAYOUTS[key] = _build(loss_fn, skeleton, example, proj_dim)
    return _LAYOUTS[key]


def _build(loss_fn, skeleton, example, proj_dim) -> Layout:
    """`layout` from the parameters' `skeleton` (their arrays as `jax.ShapeDtypeStruct`s) and one example's shapes."""
    arrays, rest = eqx.partition(skeleton, _is_sds, is_leaf=_is_sds)
    leaves, treedef = jax.tree.flatten(arrays, is_leaf=_is_sds)

    def flat(ls, x, y):
        return loss_fn(eqx.combine(jax.tree.unflatten(treedef, ls), rest), x, y)

    diff_index = tuple(i for i, a in enumerate(leaves) if jnp.issubdtype(a.dtype, jnp.inexact))
    shapes = tuple(tuple(leaves[i].shape) for i in diff_index)
    graph = rules.trace(flat, list(leaves), *example)
    data = graph.inputs[len(leaves):]
    refs = [graph.inputs[i] for i in diff_index]
    chosen = list(range(len(diff_index)))
    why = {}
    for _ in range(3):  # the plan of the chosen leaves alone: a leaf may lose its rule without the others
        pl = rules.plan(graph, [refs[j] for j in chosen], data)
        keep = []
        for pos, j in enumerate(chosen):
            reason = _why_diagonal(pl, pos, shapes[j])
            if reason is None:
                keep.append(j)
            else:
                why[j] = reason
        if keep == chosen:
            break
        chosen = keep
    else:
        chosen = []
    if not chosen:
        pl = rules.plan(graph, [], data)
    sites = []
    for pos, j in enumerate(chosen):
        site = pl.rules[pos].sites[0]
        g_shape = jax.eval_shape(lambda w, s=site: _to_factor(s, w), jax.ShapeDtypeStruct(shapes[j], jnp.float32))
        a_shape = jax.eval_shape(lambda a, d, s=site: _merged(s, a, d), _stacked(site, site.saved),
                                 _stacked(site, jax.ShapeDtypeStruct(site.op.out_avals[0].shape, jnp.float32)))[0]
        groups, i, o = g_shape.shape
        k_in = i if proj_dim is None else min(i, int(proj_dim))
        k_out = o if proj_dim is None else min(o, int(proj_dim))
        sites.append(KronSite(j, site, groups, a_shape.shape[1], i, o, k_in, k_out))
    diagonal = tuple(j for j in range(len(diff_index)) if j not in chosen)
    return Layout(loss_fn=loss_fn, skeleton=skeleton, example=example, proj_dim=proj_dim, graph=graph, plan=pl,
                  diff_index=diff_index, leaf_shapes=shapes, sites=tuple(sites), diagonal=diagonal,
                  why=tuple(sorted(why.items())))


def _stacked(site, aval):
    return jax.ShapeDtypeStruct(site.stack + tuple(aval.shape), aval.dtype)


def _merged(site, a, d):
    """`RuleKind.factors` of every step of the site's scans, the steps merged into the token axis, as `(G, T, F)`."""
    axis, k = site.kind.token_axis, len(site.stack)
    out = []
    for x in over_steps(site, lambda a, d: site.kind.factors(site, a, d))(a, d):
        x = jnp.moveaxis(x, tuple(range(k)), tuple(range(axis, axis + k)))
        tokens = size(x.shape[axis:axis + k + 1])
        x = x.reshape(x.shape[:axis] + (tokens,) + x.shape[axis + k + 1:])
        out.append(x[None] if axis == 0 else x)
    return out


def _example(lay: Layout, leaves, x, y):
    """One example: `([a (G, T, I)], [δ (G, T, O)], [diagonal leaves' gradients])`, in the accumulation dtype."""
    xy = jax.tree.leaves(x) + jax.tree.leaves(y)
    diag_at = [lay.diff_index[j] for j in lay.diagonal]

    def f(diag_vals, probes):
        vals = list(leaves)
        for i, v in zip(diag_at, diag_vals):
            vals[i] = v
        outs, saved = rules.run(lay.graph, lay.plan, vals + xy, probes)
        return outs[0], saved

    (g_diag, deltas), saved = jax.grad(f, argnums=(0, 1), has_aux=True)([leaves[i] for i in diag_at],
                                                                      rules.zero_probes(lay.plan))
    a_s, d_s = [], []
    for s, sv, dl in zip(lay.sites, saved, deltas):
        dtype = rules.acc_dtype(leaves[lay.diff_index[s.leaf]].dtype)
        a, d = _merged(s.site, sv[0].astype(dtype), dl[0].astype(dtype))
        a_s.append(a)
        d_s.append(d)
    return a_s, d_s, [g.astype(rules.acc_dtype(g.dtype)) for g in g_diag]


def _chunk(lay: Layout, chunk: int | None) -> int:
    if chunk:
        return int(chunk)
    per = sum(s.groups * s.tokens * (s.inputs + s.outputs + s.k_in + s.k_out) for s in lay.sites)
    per += sum(size(lay.leaf_shapes[j]) for j in lay.diagonal)
    return int(max(1, min(MAX_CHUNK, CHUNK_BYTES // max(8 * per, 1))))


def _array_leaves(params):
    return jax.tree.leaves(eqx.partition(engine.as_params(params), eqx.is_array)[0])


def _rows(a, m):
    """`a (n, G, T, I)` times `m (G, I, k)` (None: `a` itself), as `(n, G, T, k)`."""
    return a if m is None else jnp.einsum("ngti,gik->ngtk", a, m.astype(a.dtype))


@xla.jit
def _factor_pass(lay: Layout, leaves, xs, ys, p_in, p_out, chunk: int):
    """(A per site (G, k_in, k_in), S per site (G, k_out, k_out), diagonal second moments), each summed over
    examples (not yet divided by N); S divided by T per example (KFC)."""
    def step(acc, batch):
        (x, y), mask = batch
        a_s, d_s, g_s = jax.vmap(lambda x, y: _example(lay, leaves, x, y))(x, y)
        A, S, D = acc
        A = [A_k + jnp.einsum("ngti,ngtj->gij", _rows(a, p) * mask[:, None, None, None].astype(a.dtype), _rows(a, p))
             for A_k, a, p in zip(A, a_s, p_in)]
        S = [S_k + jnp.einsum("ngti,ngtj->gij", _rows(d, p) * mask[:, None, None, None].astype(d.dtype), _rows(d, p))
             / s.tokens for S_k, d, p, s in zip(S, d_s, p_out, lay.sites)]
        D = [D_k + jnp.einsum("n,n...->...", mask.astype(g.dtype), jnp.square(g)) for D_k, g in zip(D, g_s)]
        return A, S, D

    dt = [rules.acc_dtype(leaves[lay.diff_index[s.leaf]].dtype) for s in lay.sites]
    init = ([jnp.zeros((s.groups, s.k_in, s.k_in), t) for s, t in zip(lay.sites, dt)],
            [jnp.zeros((s.groups, s.k_out, s.k_out), t) for s, t in zip(lay.sites, dt)],
            [jnp.zeros(lay.leaf_shapes[j], rules.acc_dtype(leaves[lay.diff_index[j]].dtype)) for j in lay.diagonal])
    return engine.scan_chunks(step, init, (xs, ys), chunk)


def _eigen_coords(sites, a_s, d_s, m_in, m_out):
    """Each site's (Q_Aᵀ P_inᵀ) Gₙ (P_out Q_S) per example, `(n, G, k_in, k_out)`, from the factors: the tokens
    projected first, Σₜ (M_inᵀaₜ)(M_outᵀδₜ)ᵀ (T·(I·k_in + O·k_out + k_in·k_out) multiply-adds: a wide dense layer),
    or Gₙ = Σₜ aₜδₜᵀ formed first, then M_inᵀ Gₙ M_out (T·I·O + I·O·k_in + k_in·O·k_out: a convolution over many
    positions, 3.5× fewer for SimpleCNN's second), whichever costs fewer."""
    out = []
    for s, a, d, mi, mo in zip(sites, a_s, d_s, m_in, m_out):
        tokens_first = s.tokens * (s.inputs * s.k_in + s.outputs * s.k_out + s.k_in * s.k_out)
        formed_first = s.tokens * s.inputs * s.outputs + s.inputs * s.outputs * s.k_in + s.k_in * s.outputs * s.k_out
        if tokens_first <= formed_first:
            out.append(jnp.einsum("ngtk,ngtl->ngkl", _rows(a, mi), _rows(d, mo)))
        else:
            g = jnp.einsum("ngti,ngto->ngio", a, d)
            out.append(jnp.einsum("gik,ngio,gol->ngkl", mi.astype(g.dtype), g, mo.astype(g.dtype)))
    return out


@xla.jit
def _correction_pass(lay: Layout, leaves, xs, ys, m_in, m_out, chunk: int):
    """EK-FAC's Σₙ ((Q_Aᵀ Gₙ Q_S)ᵢⱼ)² per site `(G, k_in, k_out)` (summed, not yet divided by N)."""
    def step(acc, batch):
        (x, y), mask = batch
        a_s, d_s, _ = jax.vmap(lambda x, y: _example(lay, leaves, x, y))(x, y)
        return [c + jnp.einsum("n,ngkl->gkl", mask.astype(e.dtype), jnp.square(e))
                for c, e in zip(acc, _eigen_coords(lay.sites, a_s, d_s, m_in, m_out))]

    init = [jnp.zeros((s.groups, s.k_in, s.k_out), rules.acc_dtype(leaves[lay.diff_index[s.leaf]].dtype))
            for s in lay.sites]
    return engine.scan_chunks(step, init, (xs, ys), chunk)


@xla.jit
def _self_pass(lay: Layout, leaves, xs, ys, m_in, m_out, inv_eig, inv_diag, chunk: int):
    """gₙᵀ (F + δI)⁻¹ gₙ for every example, `(n,)`, from its eigenbasis coordinates and diagonal gradients."""
    def one(x, y):
        a_s, d_s, g_s = _example(lay, leaves, x, y)
        e_s = _eigen_coords(lay.sites, [a[None] for a in a_s], [d[None] for d in d_s], m_in, m_out)
        total = sum((jnp.sum(jnp.square(e[0]) * w) for e, w in zip(e_s, inv_eig)), jnp.zeros(()))
        return total + sum((jnp.sum(jnp.square(g) * w) for g, w in zip(g_s, inv_diag)), jnp.zeros(()))

    n = jax.tree.leaves(xs)[0].shape[0]
    pad = (-n) % chunk
    xs, ys = engine.pad_examples((xs, ys), pad)
    return jax.lax.map(lambda xy: one(*xy), (xs, ys), batch_size=chunk)[:n]


@dataclasses.dataclass(frozen=True, eq=False)
class Curvature:
    """A prepared Kronecker-factored curvature (`fit`): per site the maps into its eigenbasis `m_in (G, I, k_in)`
    = P_in Q_A and `m_out (G, O, k_out)` = P_out Q_S (Q alone when that side is not projected), the eigenvalues
    `eig (G, k_in, k_out)` (EK-FAC's corrected Λ*, or K-FAC's λ_A,i λ_S,j), and each diagonal leaf's mean squared
    gradient `diag`; `n` examples it was estimated on; `corrected` (EK-FAC) or not (K-FAC); `fisher` which labels; the
    factors
    `a_factors`, `s_factors` (mean, projected) are kept for inspection."""

    layout: Layout
    m_in: tuple
    m_out: tuple
    eig: tuple
    diag: tuple
    n: int
    corrected: bool
    fisher: str
    a_factors: tuple
    s_factors: tuple


def projections(lay: Layout, seed: int = 0) -> tuple[list, list]:
    """LoGra's fixed Gaussian projections per site: `P_in (G, I, k_in)` and `P_out (G, O, k_out)` with entries
    N(0, 1/k) (the same matrix for every group), or None for a side that is not projected."""
    key = jax.random.key(seed)
    p_in, p_out = [], []
    for n, s in enumerate(lay.sites):
        ka, kd = jax.random.split(jax.random.fold_in(key, n))
        p_in.append(None if s.k_in == s.inputs else jnp.broadcast_to(
            jax.random.normal(ka, (s.inputs, s.k_in)) / math.sqrt(s.k_in), (s.groups, s.inputs, s.k_in)))
        p_out.append(None if s.k_out == s.outputs else jnp.broadcast_to(
            jax.random.normal(kd, (s.outputs, s.k_out)) / math.sqrt(s.k_out), (s.groups, s.outputs, s.k_out)))
    return p_in, p_out


def factors(lay: Layout, params, xs, ys, *, seed: int = 0, chunk_size: int | None = None):
    """K-FAC's factors of every site and the diagonal blocks' second moments, one streamed pass.

    **Arguments** `lay` from `layout`; `params`; `xs (N, ...)`, `ys (N,)`: the examples and the labels δ is taken
    at (the dataset's: the empirical Fisher; `fisher_labels`: the true Fisher); `seed`: the projections'.

    **Returns** `(A, S, D)`: per site A `(G, k_in, k_in)` = (1/N) Σₙ Σₜ P_inᵀaₙₜ aₙₜᵀP_in and S `(G, k_out, k_out)` =
    (1/N) Σₙ (1/T) Σₜ P_outᵀδₙₜ δₙₜᵀP_out (no P where a side is not projected); per diagonal leaf D = (1/N) Σₙ gₙ²
    (the leaf's shape). Units: A in activation², S in (loss / output)², D in (loss / parameter)².
    """
    n = engine.check_batch(xs, ys)
    p_in, p_out = projections(lay, seed)
    A, S, D = _factor_pass(lay, _array_leaves(params), xs, ys, p_in, p_out, _chunk(lay, chunk_size))
    return [a / n for a in A], [s / n for s in S], [d / n for d in D]


def _eigh(m):
    """Eigenvalues and eigenvectors of a stack of symmetric matrices, in float64 on the host (numpy)."""
    m = np.asarray(m, np.float64)
    w, q = np.linalg.eigh(0.5 * (m + np.swapaxes(m, -1, -2)))
    return np.maximum(w, 0.0), q


def fit(lay: Layout, params, xs, ys, *, corrected: bool = True, fisher: str = "empirical", seed: int = 0,
        chunk_size: int | None = None) -> Curvature:
    """The Kronecker-factored curvature of `params` on `xs`, `ys`: EK-FAC (`corrected`, George et al. 2018: a second
    pass for Λ*ᵢⱼ = (1/N) Σₙ ((Q_Aᵀ Gₙ Q_S)ᵢⱼ)²) or K-FAC (not `corrected`: one pass, `factors`, then the
    eigendecompositions, Λᵢⱼ = λ_A,i λ_S,j). `fisher` only names which labels `ys` are (kept for captions); `seed`:
    the projections' (`projections`).

    **Arguments** `lay` from `layout` (its `proj_dim` decides the projections); `xs (N, ...)`, `ys (N,)`.
    **Returns** a `Curvature`. **Raises** as the engine for mismatched batches."""
    n = engine.check_batch(xs, ys)
    leaves = _array_leaves(params)
    p_in, p_out = projections(lay, seed)
    chunk = _chunk(lay, chunk_size)
    A, S, D = _factor_pass(lay, leaves, xs, ys, p_in, p_out, chunk)
    m_in, m_out, eig = [], [], []
    for s, a, sm, pi, po in zip(lay.sites, A, S, p_in, p_out):
        dtype = a.dtype
        wa, qa = _eigh(a / n)
        ws, qs = _eigh(sm / n)
        qa, qs = jnp.asarray(qa, dtype), jnp.asarray(qs, dtype)  # P Q in the pass's dtype: P is I × k (fc1: 19 MB)
        m_in.append(qa if pi is None else pi.astype(dtype) @ qa)
        m_out.append(qs if po is None else po.astype(dtype) @ qs)
        eig.append(jnp.asarray(wa[:, :, None] * ws[:, None, :], dtype))
    if corrected and lay.sites:
        corrected = _correction_pass(lay, leaves, xs, ys, m_in, m_out, chunk)
        eig = [c / n for c in corrected]
    return Curvature(lay, tuple(m_in), tuple(m_out), tuple(eig), tuple(d / n for d in D), n, corrected, fisher,
                     tuple(a / n for a in A), tuple(s / n for s in S))


def _inverse(e, damping: float):
    """1 / (e + δ) elementwise; at δ = 0 the pseudo-inverse: 0 where e ≤ 10 ε max(e) (a Fisher is singular along
    directions no gradient takes: softmax outputs sum to one, so S has a zero eigenvalue)."""
    if damping > 0:
        return 1.0 / (e + damping)
    tiny = 10 * jnp.finfo(e.dtype).eps * jnp.max(e, initial=0.0)
    return jnp.where(e > tiny, 1.0 / jnp.where(e > tiny, e, 1.0), 0.0)


def precondition(curv: Curvature, grads: list, damping: float) -> list:
    """(F + δI)⁻¹ g for T gradients given as a list over the differentiable leaves of `(T, *leaf)` arrays (as
    `engine.per_example_grads` gives them, flattened to leaves): per site g → factor layout G, then
    M_in [(M_inᵀ G M_out) / (Λ + δ)] M_outᵀ, back to the leaf's layout; per diagonal leaf g / (D + δ). With a
    projection this is Pᵀ-then-P: the influence is LoGra's, in the projected space. At δ = 0 a zero eigenvalue
    (or a zero diagonal entry) is skipped: the pseudo-inverse.

    **Returns** the list of preconditioned leaves, `(T, *leaf)`. **Raises** `ValueError` for δ < 0."""
    if damping < 0:
        raise ValueError(f"damping must be ≥ 0, got {damping}")
    lay = curv.layout
    out = list(grads)
    for s, mi, mo, e in zip(lay.sites, curv.m_in, curv.m_out, curv.eig):
        g = grads[s.leaf]
        fwd = functools.partial(_to_factor, s.site)
        G = jax.vmap(fwd)(g.astype(e.dtype))  # (T, G, I, O)
        c = jnp.einsum("gik,tgio,gol->tgkl", mi, G, mo) * _inverse(e, damping)
        V = jnp.einsum("gik,tgkl,gol->tgio", mi, c, mo)
        back = jax.linear_transpose(fwd, jax.ShapeDtypeStruct(g.shape[1:], e.dtype))
        out[s.leaf] = jax.vmap(lambda v: back(v)[0])(V).astype(g.dtype)
    for j, d in zip(lay.diagonal, curv.diag):
        out[j] = (grads[j] * _inverse(d, damping)).astype(grads[j].dtype)
    return out


def influence(curv: Curvature, params, train_xs, train_ys, test_xs, test_ys, *, damping: float,
              chunk_size: int | None = None) -> Float[Array, "T N"]:
    """Influence of every training example on T test points at the trained `params` with curvature `curv`:

        τₜₙ = (1/N) ∇ℓ(zₜ)ᵀ (F + δI)⁻¹ ∇ℓ(zₙ)

    (Koh & Liang 2017, eq. 2 with the Hessian replaced by the Kronecker-factored Fisher; Grosse et al. 2023,
    eq. 8), the predicted rise of the test loss if zₙ were removed: positive = proponent, loss units, the
    influence function's scale. Each test gradient is preconditioned once (`precondition`), then one streamed pass
    of per-example dot products (`scores.streamed_dots`) scores the training set.

    **Arguments** `test_xs (T, ...)`, `test_ys (T,)`; `damping` δ ≥ 0. **Returns** `(T, N)`."""
    n = engine.check_batch(train_xs, train_ys)
    params = engine.as_params(params)
    g = engine.per_example_grads(curv.layout.loss_fn, params, test_xs, test_ys)
    leaves, tree = jax.tree.flatten(g)
    pre = jax.tree.unflatten(tree, precondition(curv, leaves, damping))
    rows = jax.vmap(lambda t: ravel_pytree(t)[0])(pre)
    return streamed_dots(curv.layout.loss_fn, params, train_xs, train_ys, rows, chunk_size=chunk_size) / n


def self_influence(curv: Curvature, params, xs, ys, *, damping: float,
                   chunk_size: int | None = None) -> Float[Array, "N"]:
    """(1/N) ∇ℓ(zₙ)ᵀ (F + δI)⁻¹ ∇ℓ(zₙ) for every training example of `xs (N, ...)`, `ys (N,)` (the curvature may
    have been estimated on a subset of them), from its eigenbasis coordinates (the same
    projections as EK-FAC's correction) and its diagonal leaves' gradients: one streamed pass. **Returns** `(N,)`
    ≥ 0; at δ = 0 the pseudo-inverse (`_inverse`). **Raises** `ValueError` for δ < 0."""
    if damping < 0:
        raise ValueError(f"damping must be ≥ 0, got {damping}")
    inv_eig = [_inverse(e, damping) for e in curv.eig]
    inv_diag = [_inverse(d, damping) for d in curv.diag]
    out = _self_pass(curv.layout, _array_leaves(params), xs, ys, curv.m_in, curv.m_out, inv_eig, inv_diag,
                     _chunk(curv.layout, chunk_size))
    return out / engine.check_batch(xs, ys)


def fisher_labels(key, outputs, task: str):
    """Labels drawn from the model's own predictive distribution, for the true Fisher: for classification
    ŷ ~ Categorical(softmax(outputs)) (`outputs (N, K)` logits or log-probabilities, the loss a cross-entropy); for
    regression ŷ = f(x) + ε, ε ~ N(0, 1/2) (`outputs (N,)`, the loss (f(x) − y)²: then E[∇ℓ ∇ℓᵀ] = 2 JᵀJ, its
    Gauss–Newton matrix). **Returns** `(N,)`."""
    outputs = jnp.asarray(outputs)
    if task == "classification":
        return jax.random.categorical(key, outputs, axis=-1).astype(jnp.int32)
    return outputs + jnp.sqrt(0.5).astype(outputs.dtype) * jax.random.normal(key, outputs.shape, outputs.dtype)


__all__ = ["Curvature", "KronSite", "Layout", "factors", "fisher_labels", "fit", "influence", "layout",
           "precondition", "projections", "self_influence"]
