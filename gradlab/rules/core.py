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

The same rules hold wherever the op sits, and for every use of a leaf (a *site*):

- inside `lax.scan` (an RNN's weights, `fori_loop`): the op runs once per step, so (a, δ) gain a leading
  step axis and the rule is the dense layer's over T steps × tokens (the ghost norm or the outer product);
- inside `lax.cond` / `lax.switch` branches: each example's gradient is the taken branch's rule (the other
  branches' (a, δ) are zero), so the squared norms of the branches' sites add up;
- a leaf used K ≥ 2 times (a tied embedding and head, a layer applied twice): gᵢ = Σₖ gᵢₖ, and
  ‖gᵢ‖² = Σₖ,ₗ ⟨gᵢₖ, gᵢₗ⟩ from the uses' pairwise ghost inner products (a matrix used by dense layers and row
  lookups, when cheaper), else from the summed gradients.

The user's code is not wrapped: `trace` reads the loss's jaxpr (`gradlab.jaxprs.flatten`, nested
`jit`/`closed_call`/`checkpoint` inlined) and `plan` follows each differentiable leaf through
shape-only ops (transpose, reshape, dtype casts, squeeze, expand_dims; and broadcasts or slices
before an elementwise add or multiply), into scan bodies (as a loop constant) and cond branches, to its
uses, where the layer kinds of `registry.KINDS` (one `base.RuleKind` per file: dense, conv, embedding, added,
scale) match it; this module never branches on a kind's name. Four more kinds of use keep a rule:

- a transposed convolution (`lhs_dilation`) is the convolution rule on the patches of the dilated input;
- a weight through a function of itself alone (`relu(W)` as a `custom_jvp_call`, `exp(log_scale)`): the
  layer's rule gives the gradient in W' = f(W), and the per-example gradient in W is f's VJP at W of it (its
  norm formed from that gradient: the ghost norm holds for W' only);
- a term computed from no example data (an L2 penalty `λ‖W‖²` added to the loss: `_fixed_refs`): its gradient
  p is the same for every example, computed once per call from one example's backward pass, so
  gᵢ = dᵢ + p, ‖gᵢ‖² = ‖dᵢ‖² + 2⟨dᵢ, p⟩ + ‖p‖² (⟨dᵢ, p⟩ is the layer applied with p as its weight, contracted
  with δ: no dᵢ formed), and a clipped sum gains (Σᵢ cᵢ)·p;
- a weight computed from several parameters and no example (weight normalization g·v/‖v‖, spectral
  normalization, LoRA merged W0 + A·B, a hypernetwork's output: `Composite`): the computed weight takes its
  layer's rule, and the construction's VJP at the parameters carries each example's gradient back to them.

Complex leaves take the same rules with |g|² = g·ḡ (`base.sq_abs`; Gram matrices AAᴴ, DDᴴ): real norms, and
dot products Re Σ ḡⱼvⱼ (`weight_dot`). A leaf all of whose uses are weights, biases, scales or data-free terms gets a rule; every other leaf (a
leaf entering a while_loop or multiplying the activations through a nonlinearity, batch-grouped convolutions)
*falls back*: it is differentiated the ordinary way inside the per-example backward pass, which is exact and
costs chunk × that leaf's size. `run` evaluates the jaxpr with the ruled weights held constant, a zero probe
added to each site's output (its gradient is δ) and the other operand `a` saved; a scan or cond holding
sites is rebuilt with the probes as extra inputs and the saved operands as extra outputs. The idea of
matching layers in a jaxpr follows kfac-jax's graph matcher; the code is ours.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gradlab import jaxprs
from gradlab.jaxprs import Const, Eqn, Graph
from gradlab.rules import registry
from gradlab.rules.base import (INLINE, SHAPE_OPS, SPREAD_OPS, NoRule, Site,  # noqa: F401
                                acc as _acc, acc_dtype, at_b as _at_b, a_bh as _a_bh, bind as _bind,
                                gram_product, nonlinear as _nonlinear, op_name as _op_name,
                                over_steps as _over_steps, real_dtype, size as _size, sq_abs)

_NoRule = NoRule


class RulesUnsupported(ValueError):
    """No parameter leaf of this loss has a per-layer rule (use `method="vmap"`)."""


def trace(fn: Callable, *args) -> Graph:
    """Trace `fn(*args)` (arrays or `jax.ShapeDtypeStruct`s, flattened in order) into a flat `Graph`, the
    bodies of `jit`, `closed_call` and `checkpoint` inlined (`gradlab.jaxprs.flatten`)."""
    return jaxprs.flatten(fn, *args, inline=INLINE)


# ------------------------------------------------------------------ sites and rules


@dataclasses.dataclass(frozen=True, eq=False)
class FixedUse:
    """A use of a leaf whose gradient is the same for every example (an L2 penalty `λ‖W‖²` added to the loss):
    operand `pos` of the top-level equation `op`, reached through the ops of `chain`, computes nothing from the
    example, and the loss's cotangent reaches it unchanged by the example (see `_fixed_refs`)."""

    op: Eqn
    pos: int
    chain: tuple


@dataclasses.dataclass(frozen=True, eq=False)
class Rule:
    """A leaf's rule: its uses (`sites`, one or more) and how its per-example norm is formed: "sites" (the
    sum of the sites' squared norms: one site, or one per branch of a cond, of which one runs), "pairs" (a
    matrix used twice or more, as a tied embedding: ‖Σₖ gₖ‖² from the uses' pairwise ghost inner products) or
    "outer" (the uses' gradients summed per example, then the norm)."""

    leaf: int
    sites: tuple
    norm: str
    why: str
    fixed: tuple = ()  # FixedUses: their gradient p is added to every example's (see `fixed_grads`)

    @property
    def kind(self) -> str:
        names = [s.kind.name for s in self.sites]
        kinds = sorted(set(names), key=names.index)
        return "+".join(kinds + (["data-free"] if self.fixed else []))

    @property
    def linear(self) -> bool:
        """Whether every use is linear in the leaf (no relu or exp of the weight on the way to its op)."""
        return not any(_nonlinear(s.chain) for s in self.sites)

    @property
    def forms_grad(self) -> bool:
        """Whether `weight_sq_norm` forms each example's gradient (an "outer" norm, or one site's), so a clipped
        sum can reuse it (Σᵢ cᵢ·gᵢ) instead of a second matmul over (a, δ)."""
        one = len(self.sites) == 1 and self.sites[0].norm == "outer" and not small_outer(self.sites[0])
        return bool(self.sites) and (self.norm == "outer" or one)

    @property
    def layer(self) -> bool:
        """Whether a use is of a kind that saves work (`RuleKind.layer`: dense layer, convolution, embedding)."""
        return any(s.kind.layer for s in self.sites)


def _make_site(graph: Graph, e: Eqn, pos: int, chain: tuple, where: tuple) -> Site:
    """The site for operand `pos` of the layer op `e`, or raise `_NoRule`. A chain through a function of the
    weight alone (W' = relu(W)) keeps the layer's rule for W': the gradient in W is the chain's VJP at W of
    W's gradient, so the norm is formed from that gradient (the ghost norm holds for W' only)."""
    site = _layer_site(graph, e, pos, chain, where)
    fs = _nonlinear(chain)
    if not fs:
        return site
    return dataclasses.replace(site, norm="outer", why=f"{site.why}, of W' = {' ∘ '.join(reversed(fs))}(W): "
                                                       "the chain's VJP at W of the gradient in W'")


def _layer_site(graph: Graph, e: Eqn, pos: int, chain: tuple, where: tuple) -> Site:
    """The first registered kind (`registry.KINDS`) that matches operand `pos` of `e`, or raise `NoRule`."""
    name = e.prim.name
    steps = _size([w[3] for w in where if w[3] is not None])
    for kind in registry.for_prim(name):
        if not kind.spread_ok and any(c.prim.name in SPREAD_OPS for c in chain):
            raise NoRule(f"broadcast or sliced before `{name}`: no per-layer rule")
        site = kind.match(graph, e, pos, chain, where, steps)
        if site is not None:
            return site
    raise NoRule(f"enters `{name}`" + (" as its input" if name == "conv_general_dilated" else "") + ": no per-layer rule")


class _Walker:
    """Follows a leaf through a graph and the bodies of its scans and conds to every use (memoized per graph)."""

    def __init__(self, fixed_refs: frozenset = frozenset()):
        self._uses, self._bodies = {}, {}
        self.fixed_refs = fixed_refs  # top-level refs computed from no example whose cotangent is fixed

    def uses(self, graph: Graph) -> dict:
        if id(graph) not in self._uses:
            uses = defaultdict(list)
            for k, e in enumerate(graph.eqns):
                for p, a in enumerate(e.ins):
                    if isinstance(a, int):
                        uses[a].append((k, p))
            for o in graph.outputs:
                if isinstance(o, int):
                    uses[o].append((None, None))
            self._uses[id(graph)] = (graph, uses)
        return self._uses[id(graph)][1]

    def bodies(self, graph: Graph, k: int) -> list:
        key = (id(graph), k)
        if key not in self._bodies:
            self._bodies[key] = (graph, jaxprs.loop_bodies(graph.eqns[k], INLINE))
        return self._bodies[key][1]

    def sites(self, graph: Graph, ref, chain=(), where=()) -> list:
        """Every use of `ref` as a layer's weight (through shape ops, into scans and cond branches), or raise."""
        out = []
        for k, p in self.uses(graph)[ref]:
            if k is None:
                raise _NoRule("returned by the loss itself" if not where else "passed through a loop body")
            e = graph.eqns[k]
            name = jaxprs.call_name(e)
            if not where and e.outs and all(o in self.fixed_refs for o in e.outs):
                out.append(FixedUse(e, p, chain))
            elif name in SHAPE_OPS | SPREAD_OPS:
                out += self.sites(graph, e.outs[0], chain + (e,), where)
            elif name in registry.ops():
                out.append(_make_site(graph, e, p, chain, where))
            elif name == "scan" and p < jaxprs.scan_counts(e.params)[0]:
                bodies = self.bodies(graph, k)
                out += self.sites(bodies[0], bodies[0].inputs[p], chain, where + ((k, -1, bodies, e.params["length"]),))
            elif name == "cond" and p > 0:
                bodies = self.bodies(graph, k)
                for b, body in enumerate(bodies):
                    out += self.sites(body, body.inputs[p - 1], chain, where + ((k, b, bodies, None),))
            elif name == "scan":
                raise _NoRule("carried through `scan` (not a constant of the loop): no per-layer rule")
            elif _weight_function(graph, e, p):
                out += self.sites(graph, e.outs[0], chain + (e,), where)
            else:
                raise _NoRule(f"enters `{name}`: no per-layer rule")
        return out


def _weight_function(graph: Graph, e: Eqn, pos: int) -> bool:
    """Whether `e` is a function of its operand `pos` alone (relu, exp, a custom_jvp activation: every other
    operand a constant, one output, no loop), in float32 or wider (its VJP is then taken at the weight in the
    dtype the rules accumulate in)."""
    refs = [a for a in e.ins if isinstance(a, int)]
    aval = graph.avals[e.ins[pos]]
    return (len(refs) == 1 and len(e.outs) == 1 and e.prim.name not in ("scan", "cond", "while")
            and jnp.issubdtype(aval.dtype, jnp.floating) and np.dtype(aval.dtype).itemsize >= 4)


def _exclusive(s: Site, r: Site) -> bool:
    """Whether two sites sit in different branches of one cond (one of them is zero for every example)."""
    for a, b in zip(s.where, r.where):
        if a[0] != b[0]:
            return False
        if a[1] != b[1]:
            return True
    return False


def _rule(leaf: int, sites: list, fixed: tuple = ()) -> Rule:
    """The leaf's rule from its sites, plus its data-free uses (their gradient is added to every example's)."""
    if not fixed:
        return _sites_rule(leaf, sites)
    ops = ", ".join(sorted({_op_name(f.op) for f in fixed}))
    extra = (f"a term computed from no example data ({ops}, e.g. an L2 penalty): its gradient p is the same for "
             "every example (one example's backward pass), gᵢ = dᵢ + p")
    if not sites:
        return Rule(leaf, (), "sites", extra, fixed)
    r = _sites_rule(leaf, sites)
    how = "" if r.norm == "outer" else ", ‖gᵢ‖² = ‖dᵢ‖² + 2⟨dᵢ, p⟩ + ‖p‖² (⟨dᵢ, p⟩: the layer applied with p)"
    return dataclasses.replace(r, why=f"{r.why}; plus {extra}{how}", fixed=fixed)


def _sites_rule(leaf: int, sites: list) -> Rule:
    loops = sites[0].where
    where = ""
    if any(w[3] is not None for w in loops):
        where = f", inside a scan of {'×'.join(str(n) for n in sites[0].stack)} steps"
    if len(sites) == 1:
        if any(w[3] is None for w in loops):
            where += ", inside a cond branch (zero when another branch runs)"
        return Rule(leaf, tuple(sites), "sites", sites[0].why + where)
    if all(_exclusive(s, r) for s, r in itertools.combinations(sites, 2)):
        return Rule(leaf, tuple(sites), "sites",
                    f"one use per branch of a cond ({', '.join(s.kind.name for s in sites)}): the taken branch's rule{where}")
    uses = f"used {len(sites)} times ({' + '.join(s.kind.name for s in sites)})"
    if all(_orientation(s) for s in sites):
        m, n = sites[0].weight_shape if _orientation(sites[0]) != "da" else sites[0].weight_shape[::-1]
        t = sum(s.tokens for s in sites)
        if t * t * (m + n) < t * m * n + m * n:
            return Rule(leaf, tuple(sites), "pairs", f"{uses}: ghost inner products of every pair of uses over {t} tokens")
    return Rule(leaf, tuple(sites), "outer", f"{uses}: the uses' gradients from (a, δ), summed per example")


def _orientation(site: Site) -> str | None:
    """For a matrix leaf used by a plain dense layer (through transposes only) or a row lookup: "ad" when the
    site's factors (A, D) run along the leaf's (rows, columns), "da" when along (columns, rows), else None (no
    pairwise ghost product: its gradient is formed instead). The kind decides (`RuleKind.orientation`)."""
    return site.kind.orientation(site)


@dataclasses.dataclass
class Plan:
    """Which leaves have rules (`rules`: leaf index → Rule) and why the others fall back; `refs`: each leaf's
    input ref in the graph."""

    graph: Graph
    n_leaves: int
    rules: dict
    fallback: dict  # leaf index -> reason
    refs: list = dataclasses.field(default_factory=list)
    composites: list = dataclasses.field(default_factory=list)  # Composites: weights computed from several leaves

    @property
    def composite_leaves(self) -> dict:
        """{leaf index: its Composite} for every leaf whose gradient comes through a computed weight."""
        return {leaf: c for c in self.composites for leaf in c.leaves}


@dataclasses.dataclass(frozen=True, eq=False)
class Composite:
    """Leaves that reach the loss only through weights computed from them and no example data (weight
    normalization w = g·v/‖v‖, spectral normalization, merged LoRA W0 + A·B, a hypernetwork's output): `leaves`
    (leaf indices), `refs` (the computed weights, where they meet the data), `eqns` (the top-level equations
    computing `refs` from the leaves, in order) and `rules` (one Rule per computed weight, over its sites).

    Each example's gradient in a computed weight W is its rule's (from (a, δ)); the map from W's gradient to
    the leaves' is linear (the VJP of the construction at the leaves' values), so the leaves' per-example
    gradients are that VJP applied to each example's gradient in W (`composite_grads`); the construction runs
    once per chunk, its VJP batched over the examples."""

    leaves: tuple
    refs: tuple
    eqns: tuple
    rules: tuple
    structure: object = None  # a bound `structured.Structure` form: norms without forming gradients, or None

    @property
    def kind(self) -> str:
        return "computed weight: " + " + ".join(r.kind for r in self.rules)

    @property
    def why(self) -> str:
        ops = sorted({_op_name(e) for e in self.eqns} - SHAPE_OPS)
        how = (f"norms by its structure ({self.structure.why})" if self.structure is not None else
               "the gradient in the parameters is the construction's VJP of each example's gradient in the weight")
        return (f"a weight computed from {len(self.leaves)} parameter(s) and no example ({', '.join(ops)}): "
                f"{'; '.join(r.why for r in self.rules)}; {how}")


#: Ops whose VJP in each operand is fixed (a sum, a broadcast, a cast, a reshape): a cotangent the same for every
#: example stays so through them. A product or a quotient is one too when its other operand is example-free.
FIXED_VJP = frozenset({"add", "sub", "neg", "add_any", "reduce_sum", "broadcast_in_dim", "reshape", "squeeze",
                       "expand_dims", "transpose", "convert_element_type", "copy", "copy_p", "slice", "concatenate"})


def _fixed_refs(graph: Graph, data_refs) -> frozenset:
    """The top-level values computed from no example input whose cotangent (∂loss/∂value) is the same for every
    example: the gradient of a leaf through them (an L2 penalty) is one array p for all examples.

    A value's cotangent is fixed when every use passes the loss's cotangent (1) on by a VJP that does not read the
    example: a use by an op whose outputs are example-free (its VJP reads only example-free values) or by a
    `FIXED_VJP` op (a product: its other operand example-free), whose outputs' cotangents are fixed in turn."""
    dep = _data_dependent(graph, data_refs)
    uses = defaultdict(list)
    for e in graph.eqns:
        for p, a in enumerate(e.ins):
            if isinstance(a, int):
                uses[a].append((e, p))
    outputs = {o for o in graph.outputs if isinstance(o, int)}
    fixed_ct = {}

    def fixed(ref) -> bool:
        if ref in outputs and len(graph.outputs) > 1:
            return False
        for e, p in uses[ref]:
            if not all(fixed_ct[o] for o in e.outs):
                return False
            other_free = all(not (isinstance(a, int) and a in dep) for j, a in enumerate(e.ins) if j != p)
            name = e.prim.name
            if all(o not in dep for o in e.outs) or name in FIXED_VJP:
                continue
            if other_free and (name in ("mul", "dot_general") or (name == "div" and p == 0)):
                continue
            return False
        return True

    for e in reversed(graph.eqns):
        for o in e.outs:
            fixed_ct[o] = fixed(o)
    return frozenset(r for r, ok in fixed_ct.items() if ok and r not in dep)


def plan(graph: Graph, diff_refs: list, data_refs: list | None = None) -> Plan:
    """Match each differentiable leaf (input ref in `diff_refs`) to a rule, or say why it falls back.
    `data_refs`: the inputs that carry the example (default: every input that is not a differentiable leaf)."""
    if data_refs is None:
        data_refs = [r for r in graph.inputs if r not in set(diff_refs)]
    walker = _Walker(_fixed_refs(graph, data_refs))
    rules, fallback = {}, {}
    for leaf, ref in enumerate(diff_refs):
        n_uses = len(walker.uses(graph)[ref])
        try:
            found = walker.sites(graph, ref)
        except _NoRule as err:
            fallback[leaf] = (f"used {n_uses} times; one use " if n_uses > 1 else "") + str(err)
            continue
        sites = [s for s in found if isinstance(s, Site)]
        fixed = tuple(s for s in found if isinstance(s, FixedUse))
        if not found:
            fallback[leaf] = "not used by the loss (gradient zero)"
            continue
        rules[leaf] = _rule(leaf, sites, fixed)
    # two weights of one op (W1 @ W2, or W @ W): neither is a layer weight with a fixed input
    at = defaultdict(list)
    for r in rules.values():
        for s in r.sites:
            at[id(s.op)].append(r.leaf)
    for leaves in at.values():
        if len(leaves) > 1:
            for leaf in set(leaves) & set(rules):
                del rules[leaf]
                fallback[leaf] = "both operands of one product are parameters"
    composites = _composites(graph, walker, list(diff_refs), data_refs, rules, fallback)
    # biases and scales alone gain nothing over vmap(grad) (their gradients are as small as their rules)
    if not any(r.layer for r in rules.values()) and not any(r.layer for c in composites for r in c.rules):
        for leaf, r in rules.items():
            fallback[leaf] = f"{r.kind}, but no dense, conv or embedding layer in the loss has a rule"
        rules = {}
        for c in composites:
            for leaf in c.leaves:
                fallback[leaf] = f"{c.kind}, but no dense, conv or embedding layer in the loss has a rule"
        composites = []
    return Plan(graph, len(diff_refs), rules, fallback, list(diff_refs), composites)


def _data_dependent(graph: Graph, data_refs) -> set:
    """The top-level refs computed from some example input (`data_refs`)."""
    dep = set(data_refs)
    for e in graph.eqns:
        if any(isinstance(a, int) and a in dep for a in e.ins):
            dep.update(e.outs)
    return dep


def _composites(graph: Graph, walker, diff_refs: list, data_refs, rules: dict, fallback: dict) -> list:
    """Group the leaves that fell back and reach the loss only through weights computed from parameters alone
    (`Composite`); they leave `fallback`. A leaf of the construction that has a rule keeps it (LoRA's W0 in
    W0 + A·B is added to A·B; a hypernetwork's last matrix is a dense layer on its hidden units): its per-example
    gradient costs less that way than through the construction's VJP, which is taken in the fallen-back leaves
    only. A group whose computed weights have no rule is left as it was."""
    if not fallback:
        return []
    dep = _data_dependent(graph, data_refs)
    leaf_of = {ref: leaf for leaf, ref in enumerate(diff_refs)}
    lset, producer = {}, {}  # data-free ref -> the leaves it is computed from; ref -> its equation's index
    for k, e in enumerate(graph.eqns):
        if any(o in dep for o in e.outs):
            continue
        found = set()
        for a in e.ins:
            if isinstance(a, int):
                found |= {leaf_of[a]} if a in leaf_of else lset.get(a, set())
        for o in e.outs:
            lset[o], producer[o] = found, k
    uses = walker.uses(graph)
    boundary = [r for r, ls in lset.items() if ls & set(fallback) and ls and any(
        k is None or any(o in dep for o in graph.eqns[k].outs) for k, _ in uses[r])]
    groups = []  # (leaves, refs), merged where they share a leaf
    for r in boundary:
        leaves, refs = lset[r] & set(fallback), [r]
        while overlap := [g for g in groups if g[0] & leaves]:
            for g in overlap:
                groups.remove(g)
                leaves |= g[0]
                refs = g[1] + refs
        groups.append((leaves, refs))
    out = []
    for leaves, refs in groups:
        comp = _composite(graph, walker, diff_refs, leaves, refs, producer, uses, rules)
        if comp is None:
            continue
        for leaf in comp.leaves:
            fallback.pop(leaf, None)
            rules.pop(leaf, None)  # a ruled leaf its structure takes in (LoRA's W₀: its δ would be W's gradient)
        out.append(comp)
    return out


def _composite(graph, walker, diff_refs, leaves, refs, producer, uses, rules=None):
    """The Composite of `leaves` through the computed weights `refs`, or None: every use of a leaf must be an
    equation of the construction, and every computed weight must reach only layer sites (no penalty on it).
    A structure (`registry.STRUCTURES`) may take in ruled leaves of `rules` used only by the construction
    (W₀ in W₀ + A·B): they join the Composite's leaves."""
    need, todo = set(), list(refs)
    while todo:  # the equations computing `refs`, back to the leaves
        r = todo.pop()
        if r not in producer or producer[r] in need:
            continue
        need.add(producer[r])
        todo += [a for a in graph.eqns[producer[r]].ins if isinstance(a, int)]
    for leaf in leaves:
        if any(k is None or k not in need for k, _ in uses[diff_refs[leaf]]):
            return None
    ref_rules = []
    for r in refs:
        try:
            found = walker.sites(graph, r)
        except NoRule:
            return None
        if not found or not all(isinstance(f, Site) for f in found):
            return None
        ref_rules.append(_rule(-1, found))
    eqns = tuple(graph.eqns[k] for k in sorted(need))
    structure = None
    if len(refs) == 1 and _factored(ref_rules[0]):
        leaf_of = {diff_refs[leaf]: leaf for leaf in leaves}
        inside = {diff_refs[leaf]: leaf for leaf in (rules or {})
                  if all(k is not None and k in need for k, _ in uses[diff_refs[leaf]])}
        structure = next((b for st in registry.STRUCTURES if (b := st.match(graph, eqns, leaf_of, refs[0], inside))),
                         None)
        if structure is not None:
            leaves = set(leaves) | set(structure.leaves)
    return Composite(tuple(sorted(leaves)), tuple(refs), eqns, tuple(ref_rules), structure)


def _factored(rule: Rule) -> bool:
    """Whether a computed weight's gradient is one matrix Σₜ xₜ yₜᵀ in its own (rows, columns) layout: one
    site with (a, δ) factors along them (`_layout_factors`), reached through transposes only."""
    if len(rule.sites) != 1:
        return False
    site = rule.sites[0]
    return bool(_orientation(site)) and not site.kind.ids and site.kind.token_axis == 0 and not _nonlinear(site.chain)


def _layout_factors(site: Site, saved, delta, dtype):
    """(x, y), `(T, I)` and `(T, O)`, with the site's per-example gradient Σₜ xₜ yₜᵀ in the weight's layout."""
    a, d = _merged_factors(site, _acc(saved, dtype), delta.astype(dtype))
    return (a, d) if _orientation(site) == "ad" else (d, a)


def _construct(graph: Graph, comp: Composite, values: list, leaf_vals: list, refs: list) -> list:
    """The computed weights `comp.refs` from the leaves' values `leaf_vals` (the other inputs from `values`)."""
    env = _construct_env(graph, comp, values, leaf_vals, refs)
    return [env[r] for r in comp.refs]


def _construct_env(graph: Graph, comp: Composite, values: list, leaf_vals: list, refs: list) -> dict:
    """{ref: value} of every value of the construction (and the graph's inputs), from the leaves' `leaf_vals`."""
    env = dict(zip(graph.inputs, values))
    env.update(zip(refs, leaf_vals))
    for e in comp.eqns:
        env.update(zip(e.outs, _bind(e, [a.val if isinstance(a, Const) else env[a] for a in e.ins])))
    return env


def _formed_grad(rule: Rule, w, saved, delta):
    """`weight_grad`, but a matrix used once by one token (a ⊗ δ, `orientation` "ad" or "da") as a broadcast
    product: under vmap a VJP of the dot is a batched dot, one small matmul per example on XLA:CPU."""
    if len(rule.sites) == 1:
        site = rule.sites[0]
        how = _orientation(site)
        if how and not site.kind.ids and site.tokens == 1 and not _nonlinear(site.chain):
            dtype = acc_dtype(w.dtype)
            a, d = _merged_factors(site, _acc(saved[0], dtype), delta[0].astype(dtype))
            g = a[0][:, None] * d[0][None, :]
            return g if how == "ad" else g.T
    return weight_grad(rule, w, saved, delta)


def by_vjp(pl: Plan, comp: Composite) -> bool:
    """Whether a composite's dots and clipped sums go through the construction's JVP and VJP without forming
    per-example gradients (`composite_dots`, `composite_sums`): real parameters and weights (a complex
    construction forms them, `composite_grads`)."""
    refs = list(comp.refs) + [pl.refs[leaf] for leaf in comp.leaves]
    return not any(jnp.issubdtype(pl.graph.avals[r].dtype, jnp.complexfloating) for r in refs)


def _leaf_values(pl: Plan, comp: Composite, values: list) -> tuple:
    refs = [pl.refs[leaf] for leaf in comp.leaves]
    return refs, [values[pl.graph.inputs.index(r)] for r in refs]


def composite_dots(pl: Plan, values: list, saved: list, delta: list, vs: dict):
    """Σ over the leaves of the composites with `by_vjp` of ⟨one example's gradient, vs[leaf]⟩, real, float32 or
    wider: ⟨J_fᵀ G, v⟩ = ⟨G, J_f v⟩, the construction's JVP at the leaves in the direction v (once per call, no
    example in it) contracted with each computed weight's (a, δ) by `weight_dot`. Arguments as `composite_grads`."""
    total, j = jnp.zeros((), jnp.float32), 0
    for comp in pl.composites:
        if not by_vjp(pl, comp):
            j += len(comp.rules)
            continue
        refs, leaf_vals = _leaf_values(pl, comp, values)
        tangents = [vs[leaf].astype(v.dtype) for leaf, v in zip(comp.leaves, leaf_vals)]
        ws, ms = jax.jvp(lambda lv: _construct(pl.graph, comp, values, lv, refs), (leaf_vals,), (tangents,))
        for rule, w, m in zip(comp.rules, ws, ms):
            total = total + weight_dot(rule, m, saved[j], delta[j], w)
            j += 1
    return total


def composite_sums(pl: Plan, values: list, saved: list, delta: list, c, skip=lambda comp: False) -> dict:
    """{leaf: Σᵢ cᵢ·gᵢ} over a chunk for the leaves of the composites with `by_vjp` (and not `skip`), in float32 or
    wider: Σᵢ cᵢ J_fᵀGᵢ = J_fᵀ(Σᵢ cᵢ Gᵢ), Σᵢ cᵢ Gᵢ being the VJP of each computed weight's op over the chunk with
    cᵢ·δᵢ (one matmul, as for a ruled weight) and J_fᵀ the construction's VJP, once. `saved`, `delta`: as
    `composite_grads`'s with the chunk's examples first; `c` `(chunk,)`."""
    out, j = {}, 0
    for comp in pl.composites:
        if not by_vjp(pl, comp) or skip(comp):
            j += len(comp.rules)
            continue
        refs, leaf_vals = _leaf_values(pl, comp, values)
        ws, vjp = jax.vjp(lambda lv: _construct(pl.graph, comp, values, lv, refs), leaf_vals)
        sums = []
        for rule, w in zip(comp.rules, ws):
            dtype = acc_dtype(w.dtype)
            a, d = saved[j], delta[j]
            _, op_vjp = jax.vjp(lambda wt: jax.vmap(lambda ai: apply_rule(rule, wt, ai))(a), w.astype(dtype))
            sums.append(op_vjp(tuple((c.reshape((-1,) + (1,) * (di.ndim - 1)) * di).astype(dtype) for di in d))[0]
                        .astype(w.dtype))
            j += 1
        for leaf, g in zip(comp.leaves, vjp(sums)[0]):
            out[leaf] = g.astype(acc_dtype(g.dtype))
    return out


def composite_grads(pl: Plan, values: list, saved: list, delta: list, skip=lambda comp: False) -> dict:
    """{leaf: one example's gradient} for every leaf of `pl.composites`, in the leaf's dtype: each computed
    weight's per-example gradient by its rule (`weight_grad`), carried back to the leaves by the construction's
    VJP at their values. `values`: the graph's inputs; `saved`, `delta`: one group per computed weight, in the
    order of `pl.composites` and their `refs` (as `run` returns them after the ruled leaves'). The composites
    `skip(comp)` says are left out (a structure's norms: `composite_sq_norms`; dots: `composite_dots`)."""
    out, j = {}, 0
    for comp in pl.composites:
        if skip(comp):
            j += len(comp.rules)
            continue
        refs = [pl.refs[leaf] for leaf in comp.leaves]
        leaf_vals = [values[pl.graph.inputs.index(r)] for r in refs]
        ws, vjp = jax.vjp(lambda lv: _construct(pl.graph, comp, values, lv, refs), leaf_vals)
        gs = []
        for rule, w in zip(comp.rules, ws):
            gs.append(_formed_grad(rule, w, saved[j], delta[j]).astype(w.dtype))
            j += 1
        for leaf, g in zip(comp.leaves, vjp(gs)[0]):
            out[leaf] = g
    return out


def composite_sq_norms(pl: Plan, values: list, saved: list, delta: list) -> dict:
    """{leaf: one example's squared gradient norm} for the leaves of the composites with a `structure`
    (`structured.py`), from the computed weight's factors: no per-example gradient formed. Arguments as
    `composite_grads`. Float32 (or wider), real."""
    out, j = {}, 0
    for comp in pl.composites:
        if comp.structure is None:
            j += len(comp.rules)
            continue
        refs = [pl.refs[leaf] for leaf in comp.leaves]
        leaf_vals = {leaf: values[pl.graph.inputs.index(r)] for leaf, r in zip(comp.leaves, refs)}
        dtype = acc_dtype(pl.graph.avals[comp.refs[0]].dtype)
        x, y = _layout_factors(comp.rules[0].sites[0], saved[j][0], delta[j][0], dtype)

        def env(lv, comp=comp, refs=refs):
            return _construct_env(pl.graph, comp, values, [lv[leaf] for leaf in comp.leaves], refs)

        out.update(comp.structure.sq_norms(env, leaf_vals, x, y))
        j += 1
    return out


# ------------------------------------------------------------------ evaluation with probes


def _apply_site(site: Site, w, saved):
    """One use as a function of the leaf `w` (in `w`'s dtype): the chain of shape ops, then the layer op on
    every step's saved operand (`RuleKind.apply`). Linear in `w`; its VJP given δ is this use's per-example
    gradient (the chain's dtype casts are skipped: a cast changes a linear op's VJP only by rounding it)."""
    w0 = w
    w = _chain(tuple(c for c in site.chain if c.prim.name != "convert_element_type"), w)
    return _over_steps(site, lambda a: site.kind.apply(site, w, w0, a, w0.dtype))(saved)


def _chain(chain: tuple, w):
    """The chain's ops applied to `w` (each op's one non-constant operand)."""
    for c in chain:
        w = _bind(c, [w if isinstance(a, int) else a.val for a in c.ins])[0]
    return w


def apply_rule(rule: Rule, w, saved) -> tuple:
    """Every use of the leaf as a function of it: one output per site (see `_apply_site`)."""
    return tuple(_apply_site(s, w, a) for s, a in zip(rule.sites, saved))


def _all_rules(pl: Plan) -> list:
    """The ruled leaves' rules (leaves sorted), then the computed weights' (composites in order)."""
    return [pl.rules[leaf] for leaf in sorted(pl.rules)] + [r for c in pl.composites for r in c.rules]


def _sites(pl: Plan) -> list:
    """Every site of every rule, in probe order (`_all_rules`, then their sites)."""
    return [s for r in _all_rules(pl) for s in r.sites]


def _group(pl: Plan, flat: list) -> list:
    """A flat per-site list regrouped as one tuple per rule (`_all_rules`)."""
    out, it = [], iter(flat)
    for r in _all_rules(pl):
        out.append(tuple(next(it) for _ in r.sites))
    return out


def zero_probes(pl: Plan) -> list:
    """One tuple per ruled leaf (sorted) of zeros shaped like each site's output, with its scans' steps first."""
    return _group(pl, [jnp.zeros(s.stack + tuple(s.op.out_avals[0].shape), s.op.out_avals[0].dtype)
                       for s in _sites(pl)])


def run(graph: Graph, pl: Plan, values: list, probes: list):
    """Evaluate the loss: `values` for the graph's inputs (ruled leaves as held constants).

    **Returns** `(outputs, saved)`: the graph's outputs (the loss first, then any auxiliary ones);
    `saved[j]` holds, per site of the j-th ruled leaf (`sorted(pl.rules)`), the op's other operand (patches
    for a convolution) with its scans' steps first, then one group per computed weight (`pl.composites`); `probes[j]` (as `zero_probes`) was added to each site's
    output, so their gradients are the sites' δ.
    """
    sites = list(enumerate(_sites(pl)))
    flat = [p for group in probes for p in group]
    outs, saved = _eval(graph, values, sites, 0, dict(enumerate(flat)))
    return outs, _group(pl, [saved[s] for s, _ in sites])


def fixed_grads(graph: Graph, pl: Plan, values: list) -> dict:
    """{leaf: p} for each ruled leaf with data-free uses (`Rule.fixed`): the gradient through those uses alone,
    the same for every example, from one backward pass of the loss at `values` (the graph's inputs: the leaves
    and any one example), in the leaf's dtype."""
    fixed = {leaf: r.fixed for leaf, r in pl.rules.items() if r.fixed}
    if not fixed:
        return {}
    ws = {leaf: values[pl.graph.inputs.index(pl.refs[leaf])] for leaf in fixed}

    def loss(ws):
        over = {(id(f.op), f.pos): _chain(f.chain, ws[leaf]) for leaf, uses in fixed.items() for f in uses}
        return _eval(graph, values, [], 0, {}, over)[0][0]

    return jax.grad(loss)(ws)


def _eval(graph: Graph, values: list, sites: list, depth: int, probes: dict, over: dict | None = None):
    """Evaluate `graph`; the ops of `sites` ((id, Site) pairs at or below this depth) get their probe added and
    their other operand saved; `over` {(id(op), operand): value} replaces operands of top-level ops.
    **Returns** (outputs, {site id: saved})."""
    env = dict(zip(graph.inputs, values))
    here = {id(site.op): (s, site) for s, site in sites if len(site.where) == depth}
    nested = defaultdict(list)
    for s, site in sites:
        if len(site.where) > depth:
            nested[site.where[depth][0]].append((s, site))
    saved = {}
    read = lambda a: a.val if isinstance(a, Const) else env[a]  # noqa: E731
    for k, e in enumerate(graph.eqns):
        ins = [read(a) for a in e.ins]
        if over:
            ins = [over.get((id(e), p), v) for p, v in enumerate(ins)]
        if id(e) in here:
            s, site = here[id(e)]
            a, out = site.kind.save(site, ins)
            saved[s] = jnp.asarray(a, site.saved.dtype)
            outs = [out + probes[s].astype(out.dtype)]
        elif k in nested:
            outs = _eval_loop(e, ins, nested[k], depth, probes, saved)
        else:
            outs = _bind(e, ins)
        env.update(zip(e.outs, outs))
    return [read(o) for o in graph.outputs], saved


def _saved_zeros(site: Site, depth: int):
    steps = tuple(w[3] for w in site.where[depth:] if w[3] is not None)
    return jnp.zeros(steps + tuple(site.saved.shape), site.saved.dtype)


def _eval_loop(e: Eqn, ins: list, sites: list, depth: int, probes: dict, saved: dict) -> list:
    """A scan or cond holding sites, rebuilt so that its body adds their probes and returns what they save
    (stacked over a scan's steps; zeros from a cond branch that does not hold the site)."""
    ids = [s for s, _ in sites]
    bodies = sites[0][1].where[depth][2]
    if e.prim.name == "scan":
        p = e.params
        nc, ncarry = jaxprs.scan_counts(p)
        consts, carry, xs = ins[:nc], ins[nc:nc + ncarry], ins[nc + ncarry:]

        def step(c, x):
            xt, pt = x
            outs, sv = _eval(bodies[0], list(consts) + list(c) + list(xt), sites, depth + 1, dict(zip(ids, pt)))
            return outs[:ncarry], (outs[ncarry:], [sv[s] for s in ids])

        c, (ys, sv) = lax.scan(step, list(carry), (list(xs), [probes[s] for s in ids]), length=p["length"],
                               reverse=p["reverse"], unroll=p["unroll"])
        saved.update(zip(ids, sv))
        return list(c) + list(ys)

    def branch(b):
        mine = [(s, site) for s, site in sites if site.where[depth][1] == b]

        def f(ops, pr):
            outs, sv = _eval(bodies[b], list(ops), mine, depth + 1, pr)
            return outs, [sv[s] if s in sv else _saved_zeros(site, depth + 1) for s, site in sites]

        return f

    outs, sv = lax.switch(ins[0], [branch(b) for b in range(len(bodies))], list(ins[1:]),
                          {s: probes[s] for s in ids})
    saved.update(zip(ids, sv))
    return list(outs)


# ------------------------------------------------------------------ per-example gradients, dots and norms


def weight_grad(rule: Rule, leaf_val, saved, delta, fixed=None):
    """One example's gradient for the ruled leaf, in `acc_dtype` (float32 for a bfloat16 leaf): the VJP of its
    uses in the weight, given each use's (a, δ) (`saved`, `delta`: one per site), plus `fixed`, the gradient p
    of its data-free uses (`fixed_grads`), if any."""
    dtype = acc_dtype(leaf_val.dtype)
    if rule.sites:
        _, vjp = jax.vjp(lambda w: apply_rule(rule, w, saved), leaf_val.astype(dtype))
        g = vjp(tuple(d.astype(dtype) for d in delta))[0]
    else:
        g = jnp.zeros(leaf_val.shape, dtype)
    return g if fixed is None else g + fixed.astype(dtype)


def weight_dot(rule: Rule, v, saved, delta, leaf_val=None, fixed=None):
    """⟨per-example weight gradient, v⟩ = Σ over uses ⟨δ, op(v, a)⟩ (each op is linear in the weight; through a
    function of the weight, its JVP at `leaf_val` in v) + ⟨p, v⟩ for `fixed` = p, in float32 or wider, real.

    For a complex leaf the real inner product of the leaf as pairs of reals, Re Σⱼ ḡⱼ vⱼ (= Re `jnp.vdot(g, v)`,
    so that ⟨g, g⟩ = ‖g‖²): Re Σ δ ⊙ op(v̄, a), the bilinear pairing of δ with the op applied to v̄."""
    dtype = acc_dtype(v.dtype)
    v = v.astype(dtype)
    u = jnp.conj(v) if jnp.iscomplexobj(v) else v
    if rule.linear:
        outs = apply_rule(rule, u, saved)
    else:
        _, outs = jax.jvp(lambda w: apply_rule(rule, w, saved), (leaf_val.astype(dtype),), (u,))
    total = sum((_pairing(d.astype(dtype), o) for d, o in zip(delta, outs)), jnp.zeros((), real_dtype(dtype)))
    return total if fixed is None else total + real_vdot(fixed.astype(dtype), v)


def _pairing(d, o):
    """Σ d ⊙ o, real part (`jnp.vdot` for real arrays)."""
    if jnp.iscomplexobj(d) or jnp.iscomplexobj(o):
        return jnp.sum(d * o).real
    return jnp.vdot(d, o)


def real_vdot(a, b):
    """Re Σ āⱼ bⱼ: the inner product of `a` and `b` as vectors of reals (`jnp.vdot` for real arrays)."""
    out = jnp.vdot(a, b)
    return out.real if jnp.iscomplexobj(out) else out


def weight_sq_norm(rule: Rule, leaf_val, saved, delta, fixed=None):
    """‖per-example weight gradient‖² from (a, δ), in `acc_dtype`: the sum of the sites' squared norms (one
    site, or cond branches of which one runs), each by its cheaper form (see module doc), or the norm of
    the summed gradients of a leaf used twice or more. With `fixed` = p (data-free uses): ‖d‖² + 2⟨d, p⟩ + ‖p‖²,
    ⟨d, p⟩ by `weight_dot` (no per-example gradient formed; float32 rounding of order ‖p‖²·2⁻²⁴, which matters
    only where ‖d + p‖ ≪ ‖p‖)."""
    if rule.norm == "outer" or not rule.sites:
        return jnp.sum(sq_abs(weight_grad(rule, leaf_val, saved, delta, fixed)))
    if fixed is not None:
        p = fixed.astype(acc_dtype(leaf_val.dtype))
        return (weight_sq_norm(rule, leaf_val, saved, delta) + 2 * weight_dot(rule, p, saved, delta, leaf_val)
                + jnp.sum(sq_abs(p)))
    dtype = acc_dtype(leaf_val.dtype)
    if rule.norm == "pairs":
        return _pairs_sq_norm(rule, [_acc(a, dtype) for a in saved], [d.astype(dtype) for d in delta])
    total = jnp.zeros((), real_dtype(dtype))
    for site, a, d in zip(rule.sites, saved, delta):
        if small_outer(site):
            total = total + _outer_sq_norm(site, _acc(a, dtype), d.astype(dtype))
        elif site.norm == "outer":
            one = Rule(rule.leaf, (site,), "sites", "")
            total = total + jnp.sum(sq_abs(weight_grad(one, leaf_val, (a,), (d,))))
        else:
            total = total + _site_gram(site, _acc(a, dtype), d.astype(dtype))
    return total


def _pairs_sq_norm(rule: Rule, saved, delta):
    """‖Σₖ gₖ‖² = Σₖ,ₗ ⟨gₖ, gₗ⟩ for a matrix used several times, each use gₖ = Σₜ xₜ yₜᵀ along the leaf's
    (rows, columns): ⟨gₖ, gₗ⟩ = Re Σ (XₖXₗᴴ)⊙(YₖYₗᴴ), a lookup's X being one-hot rows (its ids: `RuleKind.ids`)."""
    xy = []
    for site, a, d in zip(rule.sites, saved, delta):
        x, y = _merged_factors(site, a, d)
        if site.kind.ids:
            x = x[:, 0]  # the looked-up row: X is one-hot
        xy.append((x, y) if _orientation(site) == "ad" else (y, x))
    total = 0.0
    for k, (site_k, (xk, yk)) in enumerate(zip(rule.sites, xy)):
        for m, (site_m, (xm, ym)) in enumerate(zip(rule.sites, xy)):
            if m < k:
                continue
            ids_k, ids_m = site_k.kind.ids, site_m.kind.ids
            if ids_k and ids_m:
                kx = (xk[:, None] == xm[None, :]).astype(yk.dtype)
            elif ids_k:
                kx = jnp.conj(xm.T[xk])
            elif ids_m:
                kx = xk[:, xm]
            else:
                kx = _a_bh(xk, xm)
            total = total + (1 if m == k else 2) * gram_product(kx, _a_bh(yk, ym))
    return total


def _merged_factors(site: Site, saved, delta):
    """`RuleKind.factors` of every step, the steps stacked into the one token axis (`RuleKind.token_axis`)."""
    axis = site.kind.token_axis
    k = len(site.stack)
    merged = []
    for x in _over_steps(site, lambda a, d: site.kind.factors(site, a, d))(saved, delta):
        x = jnp.moveaxis(x, tuple(range(k)), tuple(range(axis, axis + k)))
        tokens = _size(x.shape[axis:axis + k + 1])  # explicit: a reshape to -1 divides by zero on a zero-size x
        merged.append(x.reshape(x.shape[:axis] + (tokens,) + x.shape[axis + k + 1:]))
    return merged


def _site_gram(site: Site, saved, delta):
    """A site's ghost norm over every token of every step (`RuleKind.gram` of the merged factors)."""
    return site.kind.gram(site, *_merged_factors(site, saved, delta))


def small_outer(site: Site) -> bool:
    """Whether a site's per-example gradient is a small sum of outer products formed by one fused contraction
    (an "outer" norm reached through shape ops only, and the kind says so: `RuleKind.small_outer`): its squared
    norm is then ‖Σₜ aₜ ⊗ δₜ‖² from the factors by `_at_b`, not the batched dot a per-example VJP compiles to."""
    return site.norm == "outer" and not _nonlinear(site.chain) and site.kind.small_outer(site)


def _outer_sq_norm(site: Site, saved, delta):
    """‖Σₜ aₜ ⊗ δₜ‖² of a `small_outer` site over every token of every step."""
    a, d = _merged_factors(site, saved, delta)
    return jnp.sum(sq_abs(_at_b(a, d)))


def project(rule: Rule, saved, delta, pa: list, pd: list) -> list:
    """One example's gradient projected per site without forming it: for site k with factors (A, D) (its
    `RuleKind.factors`, every step's tokens merged), the `(k_a, k_d)` matrix Paₖᵀ Gₖ Pdₖ = (A Paₖ)ᵀ(D Pdₖ), where
    Gₖ = Σₜ aₜ ⊗ δₜ is the site's gradient in its factor layout (`(I, O)`; a grouped convolution's `(G, J, O)`
    projected group by group with the same matrices, the groups' projections summed). Row-major, its flattening is
    (Paₖ ⊗ Pdₖ)ᵀ vec(Gₖ): a Kronecker-structured random projection (issue 40's influence features).

    **Arguments** `saved`, `delta`: one per site, as from `run` for one example; `pa[k]` `(I, k_a)`, `pd[k]`
    `(O, k_d)` the site's projection matrices (I, O: the factors' feature sizes; an embedding's I is its rows).
    **Returns** one `(k_a, k_d)` array per site. **Raises** `NotImplementedError` for a kind without factors
    (a bias or scale) and a site through a nonlinear function of the weight (W' = relu(W))."""
    out = []
    for site, a, d, ra, rd in zip(rule.sites, saved, delta, pa, pd):
        if _nonlinear(site.chain):
            raise NotImplementedError("a weight through a nonlinear function: project its formed gradient")
        out.append(_project_site(site, a, d, ra, rd))
    return out


def _project_site(site: Site, a, d, pa, pd):
    """Σ over steps of `RuleKind.project`."""
    f = _over_steps(site, lambda x, y: site.kind.project(site, x, y, pa, pd))
    p = f(a, d)
    return p.reshape((-1,) + p.shape[len(site.stack):]).sum(0) if site.stack else p


def _out_bytes(graph: Graph) -> int:
    return sum(_size(a.shape) * np.dtype(a.dtype).itemsize
               for e in graph.eqns for a in e.out_avals if hasattr(a, "shape"))


def loop_bytes(graph: Graph) -> int:
    """Bytes per example the loss's loops compute inside their bodies: every step of a scan (its backward pass
    keeps them), the largest branch of a cond. Unseen in the top-level equations, they size chunks too."""
    total = 0
    for e in graph.eqns:
        bodies = jaxprs.loop_bodies(e, INLINE) if e.prim.name in ("scan", "cond") else []
        sizes = [_out_bytes(b) + loop_bytes(b) for b in bodies]
        if sizes:
            total += max(sizes) * (e.params["length"] if e.prim.name == "scan" else 1)
    return total


def saved_bytes(pl: Plan) -> int:
    """Bytes per example of everything the loss computes, loops' steps included (a guide for chunk sizes)."""
    total = _out_bytes(pl.graph) + loop_bytes(pl.graph)
    for s in _sites(pl):
        total += s.kind.extra_bytes(s)
    return int(total)


def factor_bytes(pl: Plan, leaf: int) -> int:
    """Elements of (a, δ) kept for a ruled leaf: expanding after the chunked pass pays when small."""
    return sum(_size(s.stack) * (_size(s.saved.shape) + _size(s.op.out_avals[0].shape)) for s in pl.rules[leaf].sites)


def composite_bytes(pl: Plan) -> int:
    """Elements per example the computed weights keep: their (a, δ), and their gradient and the leaves' (formed)."""
    total = 0
    for c in pl.composites:
        total += sum(_size(s.stack) * (_size(s.saved.shape) + _size(s.op.out_avals[0].shape))
                     for r in c.rules for s in r.sites)
        total += sum(_size(pl.graph.avals[r].shape) for r in c.refs)
        total += sum(_size(pl.graph.avals[pl.refs[leaf]].shape) for leaf in c.leaves)
    return total
