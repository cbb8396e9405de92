"""The per-example gradient engine: per-layer rules found in the traced loss, exact fallbacks per leaf.

`loss_fn(params, x, y) -> scalar` is the loss of ONE example. `params` is any pytree: Python
floats, jnp arrays, dicts/tuples, or an Equinox module (non-array fields are static). `xs, ys`
carry the example axis first.

Two paths compute the same numbers (up to float32 rounding):
- `"ghost"` (what `method="auto"` takes whenever the traced loss has a layer with a rule): the
  loss's jaxpr is read (`gradlab.rules`), every weight used by dense layers, convolutions or
  embeddings, and every bias or scale on the activations, gets its per-layer rule (also inside
  `lax.scan` and `lax.cond`, and for a leaf used several times); every other leaf is differentiated
  per example; one backward pass per chunk of examples. Norms need no
  per-example weight gradient of a dense layer, convolution or embedding at all.
- `"vmap"`: the reference `vmap(grad)`.
Norms, dot products and clipped sums accumulate in float32 (or wider) whatever the parameters' or the
loss's dtype: formed in bfloat16 a norm is off by ~2⁻⁸, and a clipped contribution could exceed C.
Everything that needs only a reduction of the per-example gradients (norms, dot products, clipped
sums) streams over chunks of examples (`jax.lax.map(..., batch_size=chunk)`), never the N x P
matrix; without `chunk_size`, chunks are sized so one chunk's intermediates take about
`CHUNK_BYTES`. The clipped sum is book-keeping ghost clipping (Bu et al. 2023): per chunk, the rules'
(aᵢ, δᵢ) give the norms, hence cᵢ = min(1, C/‖gᵢ‖), and then Σᵢ cᵢ·aᵢᵀδᵢ, one matmul per ruled op,
with no second backward pass.

`per_example_projections` gives each example's gradient under a fixed random projection (`projections`): a dense,
convolution or embedding weight's part is (aPa)ᵀ(δPd) from the same (a, δ), a Kronecker-factored projection that
never forms the gradient (LoGra; the influence features of `gradlab.influence.methods.logra`).

On a small computation `per_example_norms`, `per_example_layer_norms` and `clipped_grad_sum` with
`method="auto"` time both paths once per (loss_fn, shapes, N) and keep the faster (`AUTO_TIMING`): where a
batch gradient takes under a millisecond, XLA's per-op cost, not the flops, decides.

Every public function is compiled once per (loss_fn, parameter structure, shapes): pass the same
`loss_fn` object again (not a fresh lambda) and nothing is re-traced. `TRACES` counts traces.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import time
from collections.abc import Callable, Collection
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from gradlab import jaxprs, rules, sharding, xla
from gradlab.params import as_params, leaf_names, num_params, split_params
from gradlab.rules.base import sq_abs

__all__ = [
    # the engine contract (DESIGN.md)
    "per_example_grads", "per_example_norms", "per_example_layer_norms", "per_example_dots", "clipped_grad_sum",
    "batch_grad", "explain",
    # influence features: per-example gradients under a (Kronecker-factored) random projection
    "projections", "first_layer", "per_example_projections", "LeafProjection", "PROJECT_WHOLE_MAX",
    "PROJECT_DENSE_MAX", "PROJECT_CHUNK_BYTES",
    # pieces the rest of gradlab composes: checks, parameters, weighted and clipped sums inside a trace
    "check_batch", "as_params", "num_params", "leaf_names", "flatten_per_example", "loop_per_example_grads",
    "resolve_method", "clip_factors", "clipped_sum_core", "layer_norms_and_grad_sum", "weighted_grad", "weighted_grads", "scan_chunks", "pad_examples",
    "xla_memory", "TRACES", "METHODS", "CHUNK_BYTES", "MAX_CHUNK", "LOOP_WEIGHT", "DEFAULT_CHUNK",
    "AUTO_TIMING", "AUTO_TIMING_S", "AUTO_MIN_N", "AUTO_ROUNDS", "AUTO_MARGIN", "AUTO_CHOICES",
]

LossFn = Callable[[Any, Any, Any], Any]
PyTree = Any

#: A fixed chunk some callers pass explicitly; the engine's own default (None) sizes chunks by bytes.
DEFAULT_CHUNK = 256
#: Without a chunk_size, chunks are sized so that one chunk's intermediates (activations, saved
#: layer inputs, fallback leaves' per-example gradients) take about this many bytes: small enough
#: to stay in cache and in the allocator's reused memory (fresh pages cost a fault each).
CHUNK_BYTES = 8 * 2**20
#: ... and at most this many examples: bigger chunks of small examples measured slower (cache).
MAX_CHUNK = 256
#: The projected pass (`per_example_projections`) runs once per model and keeps only k floats per example: its
#: chunks take twice `CHUNK_BYTES`. Seed 003's SimpleCNN over 7,000 images: chunks of 13 images, not 6 (the pass
#: ~1.5 CPU-s faster, the Influence page's preparation 11.0 → 9.6 s wall, its peak unchanged; benchmarks/RESULTS.md,
#: session 44).
PROJECT_CHUNK_BYTES = 2 * CHUNK_BYTES
#: A loop's per-step bytes count this many times per example when chunks are sized (see `_Traced.example_bytes`).
LOOP_WEIGHT = 8

Method = Literal["auto", "ghost", "vmap"]
METHODS = ("auto", "ghost", "vmap")

#: `method="auto"` on a small computation (see `_auto`): per (function, loss_fn, shapes, N, chunk) the rules path
#: and `vmap(grad)` are each timed once when the rules path's one run takes at most `AUTO_TIMING_S` seconds and
#: N ≥ `AUTO_MIN_N`, and the faster is kept (`AUTO_CHOICES`). Where a batch gradient takes under a millisecond
#: (an RNN of a few steps, a 5×5 transposed convolution) XLA's per-op cost, not the flops, sets the time, and the
#: rules' extra ops (probes, Gram matrices, a chunked scan) can cost more than `vmap`'s per-example gradients.
#: False (or GRADLAB_AUTO_TIMING=0): "auto" always takes the rules where it finds one.
AUTO_TIMING = os.environ.get("GRADLAB_AUTO_TIMING", "1") != "0"
AUTO_TIMING_S = 0.02
AUTO_MIN_N = 64
#: Timed runs of each path (interleaved, best kept), and how much faster vmap must be to be kept: the rules are
#: the designed path, and a near tie on a loaded machine is noise.
AUTO_ROUNDS = 5
AUTO_MARGIN = 0.9
#: The kept choices: key -> "auto" (the rules) or "vmap" (at most `AUTO_CACHE` keys, oldest dropped first).
AUTO_CHOICES: collections.OrderedDict = collections.OrderedDict()
AUTO_CACHE = 512

#: How often each jitted body was traced (a trace precedes each compile). Tests and the
#: benchmark read it to show that a second call with the same shapes does not recompile.
TRACES: collections.Counter = collections.Counter()


def _grad_one(loss_fn: LossFn, static: PyTree) -> Callable:
    """grad of the single-example loss with respect to the differentiable part only."""

    def loss(diff, x, y):
        return loss_fn(eqx.combine(diff, static), x, y)

    return jax.grad(loss)


def _chunk(n: int, chunk_size: int | None) -> int | None:
    """Batch size for `lax.map`: None means one vmap over all n examples."""
    if chunk_size is None:
        return None
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    return None if chunk_size >= n else int(chunk_size)


def _map(f: Callable, xs: Any, chunk: int | None) -> Any:
    """`f` over the leading axis: one `vmap` if chunk is None, else `lax.map` in chunks.

    (`jax.lax.map(batch_size=None)` would be a sequential scan, one example per step.)
    """
    if chunk is None:
        return jax.vmap(f)(xs)
    try:
        return xla.map_chunks(f, xs, chunk)
    except ZeroDivisionError:  # `lax.map` reshapes each output to (-1, chunk, ...): it cannot when one is empty
        return _map_nonempty(f, xs, chunk)


def _map_nonempty(f: Callable, xs: Any, chunk: int) -> Any:
    """`_map` in chunks when some output of `f` has size 0 (a zero-size leaf's gradient): the other outputs
    mapped, the empty ones zeros of their shape."""
    leaves, tree = jax.tree.flatten(jax.eval_shape(jax.vmap(f), xs))
    empty = [a.size == 0 for a in leaves]
    kept = xla.map_chunks(lambda x: [o for o, e in zip(jax.tree.leaves(f(x)), empty) if not e], xs, chunk)
    kept = iter(kept)
    return jax.tree.unflatten(tree, [jnp.zeros(a.shape, a.dtype) if e else next(kept) for a, e in zip(leaves, empty)])


def _reduce_chunk(n: int, chunk: int | None) -> int:
    """The chunk of a pass that only reduces per-example values (norms, dot products): all n examples in one step
    of a `lax.map` rather than one bare `vmap`. Same numbers; the program XLA:CPU compiles for a vmapped
    convolution's per-example weight gradient runs 2 to 13 times faster inside the loop (N = 256, norms by
    `vmap(grad)`: the zoo's conv 1-D 2.77x -> 0.72x a batch gradient, its transposed conv 4.08x -> 0.70x), and the
    rules' norms at most 0.07 slower (as a ratio to a batch gradient) on any zoo model (benchmarks/RESULTS.md)."""
    return n if chunk is None else chunk


def pad_examples(arrays: Any, pad: int) -> Any:
    """`arrays` (example axis first) with `pad` more examples: real ones repeated from the start, never zeros.

    A zero input can make a loss undefined (x/‖x‖, a mean over an empty bag): its NaN would survive a weight
    of 0 (0·NaN = NaN), and typed PRNG keys cannot be zero-padded at all. Callers weight the copies by 0.
    """
    if not pad:
        return arrays
    n = jax.tree.leaves(arrays)[0].shape[0]
    index = jnp.arange(n + pad) % n
    return jax.tree.map(lambda a: a[index], arrays)


def _pad_zeros(a, pad: int):
    return jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)) if pad else a


def scan_chunks(step: Callable, init: Any, arrays: Any, chunk: int) -> Any:
    """A streamed reduction: fold `acc = step(acc, (arrays_chunk, mask))` over chunks of `chunk` examples.

    The arrays (example axis first) are padded to a multiple of `chunk` with repeated real examples
    (`pad_examples`); `mask (chunk,)` float32 is 0 on the padding, so `step` must weight by it (it is
    finite there). Only one chunk's intermediates are alive at a time. **Returns** the final accumulator.
    """
    n = jax.tree.leaves(arrays)[0].shape[0]
    pad = (-n) % chunk
    mask = (jnp.arange(n + pad) < n).astype(jnp.float32)
    padded = pad_examples(arrays, pad)
    split = lambda a: a.reshape((-1, chunk) + a.shape[1:])  # noqa: E731
    acc, _ = jax.lax.scan(lambda acc, b: (step(acc, b), None), init, (jax.tree.map(split, padded), split(mask)))
    return acc


def check_batch(xs: Any, ys: Any) -> int:
    """N, the number of examples in `xs` and `ys` (pytrees, example axis first).

    Every public function of the engine and of the libraries built on it starts with this check.

    **Raises** `ValueError` if xs and ys disagree on N, or N is 0.
    """
    nx = jax.tree.leaves(xs)[0].shape[0]
    ny = jax.tree.leaves(ys)[0].shape[0]
    if nx != ny:
        raise ValueError(f"xs has {nx} examples but ys has {ny}: both need the example axis first")
    if nx == 0:
        raise ValueError("no examples: xs and ys are empty")
    return nx


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    return method


# ---------------------------------------------------------------- the traced loss and its plan


class _Traced:
    """The single-example loss traced over (all array leaves of params, x, y), and its rule plan. With
    `has_aux`, `loss_fn` returns `(loss, aux)` and `one`'s loss is that pair (the aux is not differentiated)."""

    def __init__(self, loss_fn, params, xs, ys, has_aux=False):
        arrays, rest = eqx.partition(params, eqx.is_array)
        self.leaves, self.treedef = jax.tree.flatten(arrays)
        self.diff_index = [i for i, a in enumerate(self.leaves) if eqx.is_inexact_array(a)]
        self.x_def = jax.tree.structure(xs)
        self.y_def = jax.tree.structure(ys)

        def flat_loss(leaves, x, y):
            return loss_fn(eqx.combine(jax.tree.unflatten(self.treedef, leaves), rest), x, y)

        one = lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype)  # noqa: E731
        sds = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self.leaves]
        self.graph = rules.trace(flat_loss, sds, jax.tree.map(one, xs), jax.tree.map(one, ys))
        example = (jax.tree.map(one, xs), jax.tree.map(one, ys))
        self.aux_def = jax.tree.structure(jax.eval_shape(flat_loss, sds, *example)[1]) if has_aux else None
        self.diff_refs = [self.graph.inputs[i] for i in self.diff_index]
        self.plan = rules.plan(self.graph, self.diff_refs, self.graph.inputs[len(self.leaves):])
        self.ruled = sorted(self.plan.rules)  # diff-leaf indices with a rule, in probe order
        self.composite = sorted(self.plan.composite_leaves)  # leaves through a computed weight (`rules.Composite`)
        self.fallback = [i for i in range(len(self.diff_index))
                         if i not in self.plan.rules and i not in self.plan.composite_leaves]

    def example_bytes(self) -> int:
        """Bytes the rules keep per example in a chunk: each ruled op's input (or patches) and output
        gradient, the fallback leaves' gradients and those a rule's norm forms (the backward pass needs about as
        much again), and LOOP_WEIGHT times what the loss's loops compute on every step (a scan's backward pass
        keeps every step's values, forms as much in cotangents, and the rules stack each step's (a, δ)). Chunks of 16
        to 20 sequences (weight 8) run an LSTM's and a GRU's clipped sum 1.2 to 1.6 times faster than the
        52 to 64 that weight 2 gave (benchmarks/RESULTS.md)."""
        kept = sum(rules.factor_bytes(self.plan, i) for i in self.ruled) + rules.composite_bytes(self.plan)
        formed = [i for i in self.ruled if self.rule(i).forms_grad]  # a clipped sum keeps these gᵢ
        fb = sum(self.leaves[self.diff_index[i]].size for i in self.fallback + formed)
        return 4 * (kept + fb) + LOOP_WEIGHT * rules.loop_bytes(self.graph)

    def one(self, leaves, x, y, sq=None, dots=False, skip=frozenset()):
        """One example: `(loss, fallback grads {leaf: g}, saved operands, output gradients δ)`; the fallback
        grads include the leaves of computed weights (`rules.composite_grads`), formed from their (a, δ).
        `saved` and `δ` hold the ruled leaves' groups (`self.ruled` order), then the computed weights'. With a
        dict `sq`, the leaves of computed weights with a closed-form norm (`Composite.structure`) get their
        squared norm in `sq` instead of a gradient (`rules.composite_sq_norms`); with `dots`, the leaves of
        real computed weights get none (`rules.composite_dots` takes their (a, δ)). Leaves in `skip` (diff-leaf
        indices, ruled or fallback) are not differentiated: no δ (None) and no gradient, so the backward pass
        stops where only they needed it (a network's first layer: the second layer's input gradient)."""
        probes = rules.zero_probes(self.plan)
        xy = jax.tree.leaves(x) + jax.tree.leaves(y)
        fallback = [i for i in self.fallback if i not in skip]
        live = [j for j in range(len(probes)) if j >= len(self.ruled) or self.ruled[j] not in skip]

        def f(fb_vals, live_probes):  # the loss, and (saved operands, the graph's other outputs: an aux)
            vals, all_probes = list(leaves), list(probes)
            for i, v in zip(fallback, fb_vals):
                vals[self.diff_index[i]] = v
            for j, p in zip(live, live_probes):
                all_probes[j] = p
            outs, saved = rules.run(self.graph, self.plan, vals + xy, all_probes)
            return outs[0], (saved, outs[1:])

        fb_vals = [leaves[self.diff_index[i]] for i in fallback]
        (loss, (saved, aux)), (g_fb, live_deltas) = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(
            fb_vals, [probes[j] for j in live])
        deltas = [None] * len(probes)
        for j, d in zip(live, live_deltas):
            deltas[j] = d
        if self.aux_def is not None:
            loss = (loss, jax.tree.unflatten(self.aux_def, aux))
        g_fb = dict(zip(fallback, g_fb))
        n = len(self.ruled)
        if self.composite:
            values = list(leaves) + xy
            if dots:
                skip = lambda c: rules.by_vjp(self.plan, c)  # noqa: E731
            else:
                skip = lambda c: sq is not None and c.structure is not None  # noqa: E731
            g_fb.update(rules.composite_grads(self.plan, values, saved[n:], deltas[n:], skip))
            if sq is not None:
                sq.update(rules.composite_sq_norms(self.plan, values, saved[n:], deltas[n:]))
        return loss, g_fb, saved, deltas

    def fixed(self, leaves, xs, ys) -> dict:
        """{diff leaf: p}: the gradient of each ruled leaf's data-free uses (an L2 penalty), the same for every
        example: one backward pass at the first example (`rules.fixed_grads`)."""
        first = jax.tree.leaves(jax.tree.map(lambda a: a[0], (xs, ys)))
        return rules.fixed_grads(self.graph, self.plan, list(leaves) + first)

    def rule(self, i):
        return self.plan.rules[i]

    def diff_leaf(self, leaves, i):
        return leaves[self.diff_index[i]]


def _traced(loss_fn, params, xs, ys, method, has_aux=False) -> _Traced | None:
    """The plan for the rules path, or None for the vmap path ("auto" with no rule, or untraceable)."""
    if method == "vmap":
        return None
    try:
        t = _Traced(loss_fn, params, xs, ys, has_aux)
    except Exception:  # a loss our tracer cannot follow: the reference path is always exact
        if method == "ghost":
            raise
        return None
    if not t.plan.rules and not t.plan.composites:
        if method == "ghost":
            raise rules.RulesUnsupported(
                "method='ghost': no parameter leaf is used once as the weight of a dense layer, "
                "convolution or embedding; use method='vmap'"
            )
        return None
    return t


def _bytes_chunk(n: int, chunk: int | None, per_example: int, budget: int = CHUNK_BYTES) -> int | None:
    """An explicit chunk, or one sized so a chunk takes about `budget` bytes (at most), as even as it can be."""
    if chunk is not None:
        return chunk
    chunk = _chunk(n, max(1, min(MAX_CHUNK, budget // max(per_example, 1))))
    # as many chunks, evened out: the last one is padded with the fewest copies (57 of 256 padded 29 examples)
    return None if chunk is None else -(-n // -(-n // chunk))


def _vmap_example_bytes(loss_fn, params, xs, ys) -> int:
    """Per-example bytes of the plain path: the loss's intermediates (x2 for the backward) + P floats."""
    try:
        t = _Traced(loss_fn, params, xs, ys)
        act = rules.saved_bytes(dataclasses.replace(t.plan, rules={}, composites=[]))
    except Exception:
        act = 0
    p = sum(a.size for a in jax.tree.leaves(split_params(params)[0]))
    return 2 * act + 4 * p


def _auto_key(kind: str, loss_fn, params, xs, ys, *extra):
    """What a cost choice depends on: the function, the loss, the pytree structure (static fields included),
    every leaf's shape and dtype (N included), and `extra` (chunk, weights given); None if unhashable."""
    leaves, treedef = jax.tree.flatten((params, xs, ys))
    shapes = tuple((getattr(a, "shape", None), getattr(a, "dtype", None)) for a in leaves)
    key = (kind, loss_fn, treedef, shapes, *extra)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _auto(make_key: Callable, n: int, run: Callable[[str], Any]) -> Any:
    """`run("auto")` (the rules where the loss has one), or `run("vmap")` where that measured faster on this
    computation (both exact).

    Called by the public functions for `method="auto"` outside a trace. The first call per key runs the rules
    path (compiling it) and times one more run (two when the first took longer than `AUTO_TIMING_S`: on a loaded
    machine one run can be descheduled for milliseconds). If the best took at most `AUTO_TIMING_S` seconds and
    N ≥ `AUTO_MIN_N`, it compiles `vmap` too, times `AUTO_ROUNDS` runs of each, interleaved, and keeps vmap if
    its best run took under `AUTO_MARGIN` times the rules' best, else the rules, for this key. Cost, once per
    key: the loser's compile and up to eight runs of each path. A bigger
    computation keeps the rules: there, their saved backward work outweighs their per-op cost."""
    if not AUTO_TIMING or n < AUTO_MIN_N:
        return run("auto")
    key = make_key()
    if key is None:
        return run("auto")
    if key in AUTO_CHOICES:
        return run(AUTO_CHOICES[key])
    out = jax.block_until_ready(run("auto"))  # compiles
    best = {"auto": _time(lambda: run("auto"))}
    if best["auto"] > AUTO_TIMING_S:  # once more: on a loaded machine one run can be descheduled for ms
        best["auto"] = min(best["auto"], _time(lambda: run("auto")))
    choice = "auto"
    if best["auto"] <= AUTO_TIMING_S:
        try:
            jax.block_until_ready(run("vmap"))  # compiles
            best["vmap"] = float("inf")
            for _ in range(AUTO_ROUNDS):  # interleaved: a shared machine's load falls on both alike
                best["vmap"] = min(best["vmap"], _time(lambda: run("vmap")))
                best["auto"] = min(best["auto"], _time(lambda: run("auto")))
            choice = "vmap" if best["vmap"] < AUTO_MARGIN * best["auto"] else "auto"
        except Exception:  # noqa: BLE001 - e.g. out of memory on vmap's per-example gradients: keep the rules
            choice = "auto"
    AUTO_CHOICES[key] = choice
    while len(AUTO_CHOICES) > AUTO_CACHE:
        AUTO_CHOICES.popitem(last=False)
    return out if choice == "auto" else run("vmap")


def _time(f: Callable) -> float:
    start = time.perf_counter()
    jax.block_until_ready(f())
    return time.perf_counter() - start


def _traced_call(*trees) -> bool:
    """Whether any array in `trees` is a tracer (the engine called inside the caller's own jit)."""
    return any(jaxprs.is_tracer(a) for a in jax.tree.leaves(trees))


# ---------------------------------------------------------------- one pass over the examples


def _sq(g):
    """‖g‖² accumulated in float32 (or wider): a bfloat16 sum of squares is off by ~2⁻⁸. Real for a complex g
    (Σ |gⱼ|² = Σ gⱼ·ḡⱼ, not Σ gⱼ²)."""
    return jnp.sum(sq_abs(g.astype(rules.acc_dtype(g.dtype))))


def _rules_pass(t: _Traced, leaves, xs, ys, chunk, per_example: Callable):
    """Map `per_example(loss, fallback grads, saved, deltas)` over examples in chunks."""
    def one(xy):
        return per_example(*t.one(leaves, *xy))

    return _map(one, (xs, ys), chunk)


def _rules_sq_norms(t: _Traced, leaves, xs, ys, chunk):
    """(losses (N,), [per-leaf squared norms (N,)] in diff-leaf order) by the rules."""
    fixed = t.fixed(leaves, xs, ys)

    def one(xy):
        structured = {}
        loss, g_fb, saved, deltas = t.one(leaves, *xy, sq=structured)
        sq = [None] * len(t.diff_index)
        for i, g in g_fb.items():
            sq[i] = _sq(g)
        for i, v in structured.items():
            sq[i] = v
        for j, i in enumerate(t.ruled):
            sq[i] = rules.weight_sq_norm(t.rule(i), t.diff_leaf(leaves, i), saved[j], deltas[j], fixed.get(i))
        return loss, sq

    return _map(one, (xs, ys), chunk)


def _diff_tree(params, values: list) -> PyTree:
    diff, _ = split_params(params)
    return jax.tree.unflatten(jax.tree.structure(diff), values)


def _leaf_grad(t: _Traced, leaves, i, a, d, fixed=None):
    """A ruled leaf's per-example gradient (formed in float32) in the leaf's own dtype, as `jax.grad` gives it."""
    w = t.diff_leaf(leaves, i)
    return rules.weight_grad(t.rule(i), w, a, d, fixed).astype(w.dtype)


@xla.jit
def _per_example_grads(loss_fn, params, xs, ys, chunk, method):
    TRACES["per_example_grads"] += 1
    n = xs.shape[0] if hasattr(xs, "shape") else jax.tree.leaves(xs)[0].shape[0]
    t = _traced(loss_fn, params, xs, ys, method)
    diff, static = split_params(params)
    if t is None:
        g = _grad_one(loss_fn, static)
        chunk = _bytes_chunk(n, chunk, _vmap_example_bytes(loss_fn, params, xs, ys))
        return _map(lambda xy: g(diff, *xy), (xs, ys), chunk)
    leaves = t.leaves
    fixed = t.fixed(leaves, xs, ys)
    # a ruled leaf whose (a, δ) are smaller than its gradient keeps them and expands after the
    # pass: the N x shape gradient is then written once, straight into the result
    later = {i for i in t.ruled if t.rule(i).layer
             and rules.factor_bytes(t.plan, i) < t.leaves[t.diff_index[i]].size}

    def per_example(loss, g_fb, saved, deltas):
        out = {}
        for j, i in enumerate(t.ruled):
            if i in later:
                out[i] = (saved[j], deltas[j])
            else:
                out[i] = _leaf_grad(t, leaves, i, saved[j], deltas[j], fixed.get(i))
        return g_fb, out

    chunk = _bytes_chunk(n, chunk, t.example_bytes() + 4 * sum(t.leaves[t.diff_index[i]].size
                                                                for i in t.ruled if i not in later))
    g_fb, out = _rules_pass(t, leaves, xs, ys, chunk, per_example)
    values = [None] * len(t.diff_index)
    for i, g in g_fb.items():
        values[i] = g
    for i, g in out.items():
        if i in later:
            values[i] = jax.vmap(lambda a, d: _leaf_grad(t, leaves, i, a, d, fixed.get(i)))(*g)
        else:
            values[i] = g
    return _diff_tree(params, values)


@sharding.over_examples("per_example")  # all devices when several are visible
def per_example_grads(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    *,
    chunk_size: int | None = None,
    method: Method = "auto",
) -> PyTree:
    """Per-example gradients `vmap(grad(loss_fn), in_axes=(None, 0, 0))(params, xs, ys)`.

    **Arguments**
    - `loss_fn`: `(params, x, y) -> scalar`, the loss of one example. Any JAX code: a hand-written
      forward on dict params, an Equinox model, a penalty term, tied weights.
    - `params`: pytree of parameters (floats, arrays, dicts/tuples, Equinox module).
    - `xs`, `ys`: inputs and targets with the example axis first, N examples.
    - `chunk_size`: examples per vmapped chunk (a scan runs over chunks) to bound the intermediate
      activations; the result is still N x P. None: chunks of about `CHUNK_BYTES`.
    - `method`: `"auto"` (default) reads the traced loss (`gradlab.rules`): each weight used once
      by a dense layer, convolution or embedding gets its per-layer rule (input ⊗ output gradient;
      patches for convolutions; rows for embeddings), every other leaf is differentiated per
      example; one backward pass per chunk. If no leaf has a rule it is `"vmap"`, `vmap(grad)`.
      `"ghost"` insists on the rules (raises if none applies). Same numbers either way, up to
      float32 rounding (which can also decide which input of a max-pool near-tie gets the gradient).

    **Returns** the differentiable part of `params` with every leaf of shape `(N, *leaf.shape)`
    (a Python float becomes shape `(N,)`); non-differentiable leaves are `None`. Units: loss per
    parameter unit.

    **Raises** `ValueError` if xs and ys disagree on N, N is 0, chunk_size < 1, or an unknown
    method; `rules.RulesUnsupported` (a ValueError) for `method="ghost"` when no leaf has a rule.

    Source: the JAX per-example gradient idiom (JAX docs, "Automatic vectorization"); seeds 000-002;
    Goodfellow (2015), arXiv:1510.01799, for the per-layer rules.
    """
    n = check_batch(xs, ys)
    _check_method(method)
    return _per_example_grads(loss_fn, as_params(params), xs, ys, _chunk(n, chunk_size), method)


@xla.jit
def _sq_norms(loss_fn, params, xs, ys, chunk, method="vmap"):
    """(per-leaf norms: a tree like diff with (N,) leaves, global norms (N,)), both formed inside the jit: an
    eager sqrt per leaf would cost a dispatch each, a tenth of a millisecond on a small model."""
    TRACES["per_example_sq_norms"] += 1
    _, sq = _sq_norms_core(loss_fn, params, xs, ys, chunk, method)
    return jax.tree.map(jnp.sqrt, sq), jnp.sqrt(sum(jax.tree.leaves(sq)))


def _sq_norms_core(loss_fn, params, xs, ys, chunk, method):
    n = jax.tree.leaves(xs)[0].shape[0]
    t = _traced(loss_fn, params, xs, ys, method)
    diff, static = split_params(params)
    if t is None:
        def one(d, x, y):
            return loss_fn(eqx.combine(d, static), x, y)

        vg = jax.value_and_grad(one)
        chunk = _reduce_chunk(n, _bytes_chunk(n, chunk, _vmap_example_bytes(loss_fn, params, xs, ys)))
        losses, sq = _map(lambda xy: (lambda lg: (lg[0], jax.tree.map(_sq, lg[1])))(vg(diff, *xy)), (xs, ys), chunk)
        return losses, sq
    chunk = _reduce_chunk(n, _bytes_chunk(n, chunk, t.example_bytes()))
    losses, sq = _rules_sq_norms(t, t.leaves, xs, ys, chunk)
    return losses, _diff_tree(params, sq)


def _streamed_norms(loss_fn, params, xs, ys, chunk_size, method):
    """(per-leaf norms tree, global norms (N,)), by `method` ("auto": see `_auto`)."""
    n = check_batch(xs, ys)
    _check_method(method)
    params, chunk = as_params(params), _chunk(n, chunk_size)
    if method != "auto" or _traced_call(params, xs, ys):
        return _sq_norms(loss_fn, params, xs, ys, chunk, method)
    key = lambda: _auto_key("norms", loss_fn, params, xs, ys, chunk)  # noqa: E731
    return _auto(key, n, lambda m: _sq_norms(loss_fn, params, xs, ys, chunk, m))


@sharding.over_examples("per_example")  # all devices when several are visible
def per_example_layer_norms(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    *,
    chunk_size: int | None = None,
    method: Method = "auto",
) -> dict[str, Float[Array, "N"]]:
    """L2 norm of each parameter leaf's per-example gradient ("which layers carry the norm").

    Streams over chunks: never holds the N x P matrix. On the rules path a dense layer's weight
    norm is ‖δᵢ‖·‖aᵢ‖ (one input) or the ghost norm over tokens, from one backward pass: no
    per-example weight gradient is built at all (Goodfellow 2015; Li et al. 2022).

    **Arguments** as `per_example_grads`.

    **Returns** `{leaf name: (N,) float32 norms}`, names from the pytree path (e.g.
    `".layers[0].weight"`, `"['w1']"`, or `"[0]"` for a tuple of floats), in tree order. The
    global norm is `sqrt(sum of squares)` over leaves.

    **Raises** `ValueError` as `per_example_grads`.
    """
    layers, _ = _streamed_norms(loss_fn, params, xs, ys, chunk_size, method)
    leaves = jax.tree_util.tree_flatten_with_path(layers)[0]
    return {(jax.tree_util.keystr(path) or "params"): v for path, v in leaves}


@sharding.over_examples("per_example")  # all devices when several are visible
def per_example_norms(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    *,
    chunk_size: int | None = None,
    method: Method = "auto",
) -> Float[Array, "N"]:
    """Global L2 norm ‖∇θ loss(θ, x_i, y_i)‖₂ of each example's gradient, streamed.

    The N x P matrix is never built. On the rules path (`method="auto"` whenever the traced loss
    has a dense layer, convolution or embedding) ruled weights contribute their rule's norm
    (‖δᵢ‖²·‖aᵢ‖², the ghost norm over tokens, patches for convolutions) and only the other leaves
    are differentiated per example: about the cost of one batch gradient (Goodfellow 2015,
    arXiv:1510.01799; Li et al. 2022, arXiv:2110.05679). On a small computation "auto" takes whichever of
    the rules and `vmap` measured faster, timed once per loss and shapes (`AUTO_TIMING`).

    **Arguments** as `per_example_grads`.

    **Returns** `(N,)` float array of norms (loss units per parameter unit).

    **Raises** `ValueError` as `per_example_grads`.
    """
    return _streamed_norms(loss_fn, params, xs, ys, chunk_size, method)[1]


def resolve_method(method: str, loss_fn: LossFn, params: PyTree, xs: Any = None, ys: Any = None) -> str:
    """Which path `method` takes for this loss and model: `"ghost"` (per-layer rules) or `"vmap"`.

    With `xs, ys` (example axis first) the loss is traced and `"auto"` gives `"ghost"` only when
    some leaf has a rule; without them `"auto"` gives `"ghost"` (the engine decides per call).

    **Raises** `ValueError` for a method other than "auto", "ghost", "vmap".
    """
    _check_method(method)
    if method != "auto" or xs is None:
        return method if method != "auto" else "ghost"
    return "vmap" if _traced(loss_fn, as_params(params), xs, ys, "auto") is None else "ghost"


def explain(loss_fn: LossFn, params: PyTree, xs: Any, ys: Any) -> list[dict]:
    """Which path each differentiable leaf takes on the rules path, and why.

    **Arguments** as `per_example_grads` (only the shapes of `xs, ys` matter).

    **Returns** one dict per leaf, in tree order: `leaf` (name as in `per_example_layer_norms`),
    `shape`, `path` (`"rule"` or `"fallback"`), `kind` (`"dense"`, `"conv"`, `"embedding"`,
    `"added"` (a bias or position embedding), `"scale"` (an elementwise scale), several joined by "+"
    for a leaf used in several ways (a tied embedding: `"embedding+dense"`), `"computed weight: dense"` for a
    parameter of a weight computed from parameters (weight normalization's g and v, LoRA's A and B), or `"—"`;
    the name of each registered `rules.RuleKind`), `why` (how
    its per-example gradient or norm is computed, where: inside a scan or a cond branch, how the
    norms of a leaf used several times combine; or why it has no rule).
    Every row says `"fallback"` with the reason if the loss cannot be traced.
    """
    params = as_params(params)
    names = leaf_names(params)
    shapes = [tuple(np.shape(a)) for a in jax.tree.leaves(split_params(params)[0])]
    try:
        t = _Traced(loss_fn, params, xs, ys)
    except Exception as err:  # noqa: BLE001 - shown to the user, the engine then uses vmap
        return [dict(leaf=n, shape=s, path="fallback", kind="—", why=f"the loss could not be traced: {err}")
                for n, s in zip(names, shapes)]
    rows = []
    for i, (n, s) in enumerate(zip(names, shapes)):
        r = t.plan.rules.get(i) or t.plan.composite_leaves.get(i)
        if r is None:
            rows.append(dict(leaf=n, shape=s, path="fallback", kind="—",
                             why=t.plan.fallback.get(i, "") + ": differentiated per example (exact)"))
        else:
            rows.append(dict(leaf=n, shape=s, path="rule", kind=r.kind, why=r.why))
    return rows


def first_layer(loss_fn: LossFn, params: PyTree, xs: Any, ys: Any) -> tuple[str, ...]:
    """The names (`leaf_names`) of the network's first layer: the ruled leaves used only before the loss's second
    weight layer (a dense layer, convolution or embedding: a `RuleKind` with `layer`) in the order the traced loss
    computes them, e.g. the first convolution's weight and the bias added to its output. Every gradient of these
    leaves needs the backward pass through the second layer's input (for SimpleCNN's conv2, as costly as its
    forward pass); `projections(..., skip=first_layer(...))` leaves that pass out.

    **Arguments** as `per_example_grads` (only the shapes of `xs, ys` matter).

    **Returns** a tuple of names; () when the loss has fewer than two weight layers or the rules cannot trace it.
    """
    params = as_params(params)
    try:
        t = _Traced(loss_fn, params, xs, ys)
    except Exception:  # noqa: BLE001 - no rules: nothing to leave out
        return ()
    order = {id(e): k for k, e in enumerate(t.graph.eqns)}

    def position(site):  # a site inside a loop is where its outermost loop is
        return site.where[0][0] if site.where else order[id(site.op)]

    layers = sorted({position(s) for r in t.plan.rules.values() for s in r.sites if s.kind.layer})
    if len(layers) < 2:
        return ()
    names = leaf_names(params)
    return tuple(names[i] for i, r in sorted(t.plan.rules.items())
                 if all(position(s) < layers[1] for s in r.sites))


def _vdot(a, b):
    """⟨a, b⟩ in float32 or wider, real: Re Σ āⱼ bⱼ for complex leaves (their inner product as pairs of reals)."""
    dtype = rules.acc_dtype(jnp.result_type(a, b))
    return rules.real_vdot(a.astype(dtype), b.astype(dtype))


@xla.jit
def _dots(loss_fn, params, xs, ys, v, chunk, method="auto"):
    TRACES["per_example_dots"] += 1
    n = jax.tree.leaves(xs)[0].shape[0]
    diff, static = split_params(params)
    vs = jax.tree.leaves(v)
    t = _traced(loss_fn, params, xs, ys, method)
    if t is None:
        g = _grad_one(loss_fn, static)

        def dot(xy):
            gi = g(diff, *xy)
            return sum(_vdot(a, b) for a, b in zip(jax.tree.leaves(gi), vs))

        chunk = _reduce_chunk(n, _bytes_chunk(n, chunk, _vmap_example_bytes(loss_fn, params, xs, ys)))
        return _map(dot, (xs, ys), chunk)

    fixed = t.fixed(t.leaves, xs, ys)

    def one(xy):
        loss, g_fb, saved, deltas = t.one(t.leaves, *xy, dots=True)
        total = sum((_vdot(g, vs[i]) for i, g in g_fb.items()), jnp.zeros((), jnp.float32))
        for j, i in enumerate(t.ruled):
            total = total + rules.weight_dot(t.rule(i), vs[i], saved[j], deltas[j], t.diff_leaf(t.leaves, i),
                                             fixed.get(i))
        if t.composite:  # ⟨G, J_f v⟩: the construction's JVP, no per-example gradient (`rules.composite_dots`)
            m = len(t.ruled)
            values = list(t.leaves) + jax.tree.leaves(xy)
            total = total + rules.composite_dots(t.plan, values, saved[m:], deltas[m:], dict(enumerate(vs)))
        return total

    return _map(one, (xs, ys), _reduce_chunk(n, _bytes_chunk(n, chunk, t.example_bytes())))


@sharding.over_examples("per_example")  # all devices when several are visible
def per_example_dots(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    vector: PyTree,
    *,
    chunk_size: int | None = None,
    method: Method = "auto",
) -> Float[Array, "N"]:
    """Dot product ⟨∇θ loss(θ, x_i, y_i), v⟩ of each example's gradient with a fixed vector v.

    The building block of gradient similarity, TracIn and influence functions; streamed, so it
    never holds N x P. On the rules path a ruled weight contributes ⟨δᵢ, op(v, aᵢ)⟩ (its layer
    applied with v as weight: the op is linear in the weight), no per-example gradient built.

    **Arguments** as `per_example_grads`, plus `vector`: a pytree shaped like the differentiable
    part of `params` (e.g. a test gradient from `grad`).

    **Returns** `(N,)` float array.

    **Raises** `ValueError` as `per_example_grads`, or if `vector` has another structure.
    """
    n = check_batch(xs, ys)
    _check_method(method)
    params = as_params(params)
    diff, _ = split_params(params)
    vector = as_params(vector)
    if jax.tree.structure(diff) != jax.tree.structure(vector):
        raise ValueError("vector must have the structure of the differentiable parameters")
    return _dots(loss_fn, params, xs, ys, vector, _chunk(n, chunk_size), method)


# ---------------------------------------------------------------- projected gradients (influence features)


class LeafProjection(eqx.Module):
    """How one differentiable leaf enters `per_example_projections`' features.

    `how`: "kronecker" (a dense, convolution or embedding weight: its gradient in the rule's factor layout
    G `(I, O)` becomes Paᵀ G Pd, `(k_in·k_out,)` row-major, i.e. (Pa ⊗ Pd)ᵀ vec(G), never forming G); "whole" (a
    small leaf: its flat gradient, unprojected); "gaussian" (its flat gradient times a Gaussian `dense (size, k)`);
    "skip" (left out: no features, its gradient never formed). `pa (I, k_in)`, `pd (O, k_out)`: a Gaussian matrix
    with N(0, 1/k) entries, or the identity where the side is no larger than k (exact). `name`: the leaf's name
    (`engine.leaf_names`); `features`: how many it contributes."""

    name: str = eqx.field(static=True)
    how: str = eqx.field(static=True)
    features: int = eqx.field(static=True)
    pa: Any = None
    pd: Any = None
    dense: Any = None


#: A leaf of at most this many parameters without a Kronecker projection (a bias) is kept whole.
PROJECT_WHOLE_MAX = 1024
#: Largest dense Gaussian projection (parameters × k floats) for a leaf without factors.
PROJECT_DENSE_MAX = 2**24


#: Compile options of `_draws`' program: XLA:CPU's fusion emitters where this jaxlib has the switch (the server turns
#: them off, `memory.LEAN_XLA_FLAGS`). Seed 003's SimpleCNN at k = 16, cold: `projections` 1.2 CPU-s with the draws as
#: one such program, 1.7–1.9 with each matrix drawn on its own (a compile per shape); the same values bit for bit.
DRAW_OPTIONS = {"xla_cpu_use_fusion_emitters": True}


def _draws(key, draws: tuple) -> list:
    """The matrices of `draws`, `((path, rows, k), …)`, NumPy float32: for each, `(rows, k)` N(0, 1/k) entries from
    `key` folded in along `path` (a tuple of ints), or the identity `(rows, rows)` when rows ≤ k (nothing to
    compress). The Gaussians are one compiled program; the identities are NumPy's."""
    gauss = tuple(d for d in draws if d[1] > d[2])
    fusion_emitters = jax.default_backend() == "cpu" and xla.accepted(DRAW_OPTIONS)
    drawn = iter(_normals(fusion_emitters)(key, gauss) if gauss else [])
    # scaled in NumPy as XLA scales x / √k on its own (x times float32 1/√k): inside the draws' program XLA folds the
    # scale into the normal's own constants, which rounds differently (k = 8: 1 ulp)
    return [np.asarray(next(drawn)) * (np.float32(1) / np.float32(np.sqrt(k))) if rows > k
            else np.eye(rows, dtype=np.float32) for _, rows, k in draws]


@functools.cache
def _normals(fusion_emitters: bool):
    """`(key, draws) -> [N(0, 1) (rows, k)]` jitted (with `DRAW_OPTIONS` when `fusion_emitters`), `draws` static."""
    def draw(key, draws):
        out = []
        for path, rows, k in draws:
            sub = key
            for i in path:
                sub = jax.random.fold_in(sub, i)
            out.append(jax.random.normal(sub, (rows, k), jnp.float32))
        return out

    return jax.jit(draw, static_argnums=1, compiler_options=DRAW_OPTIONS if fusion_emitters else None)


def _kron_dims(t: _Traced, x, y) -> dict:
    """{diff leaf: (I, O)} for each ruled leaf with one linear use whose kind has (a, δ) factors and no
    data-free use: the factor layout's feature sizes (an embedding's I: its table's rows)."""
    def dims(x, y):
        _, _, saved, deltas = t.one(t.leaves, x, y)
        out = {}
        for j, i in enumerate(t.ruled):
            r = t.rule(i)
            if len(r.sites) != 1 or r.fixed or not r.linear:
                continue
            site = r.sites[0]
            lead = (0,) * len(site.stack)
            try:
                a, d = site.kind.factors(site, saved[j][0][lead], deltas[j][0][lead])
            except NotImplementedError:
                continue
            out[i] = (jnp.zeros(site.weight_shape[0] if site.kind.ids else a.shape[-1]), jnp.zeros(d.shape[-1]))
        return out

    shapes = jax.eval_shape(dims, x, y)
    return {i: (int(a.shape[0]), int(d.shape[0])) for i, (a, d) in shapes.items()}


def projections(loss_fn: LossFn, params: PyTree, xs: Any, ys: Any, *, k_in: int = 32, k_out: int = 32,
                key: int = 0, dense_dim: int = 1024, method: Method = "auto",
                skip: Collection[str] = ()) -> tuple[LeafProjection, ...]:
    """The random projection `per_example_projections` applies, one `LeafProjection` per differentiable leaf (in
    `leaf_names` order), drawn from `jax.random.key(key)` (each leaf and side its own `fold_in`).

    A weight that a dense layer, convolution or embedding uses once (linearly, as the rules find it) is projected
    Kronecker-wise: LoGra's Paᵀ(δᵀa)Pd (Choe et al. 2024, §3.2, eq. 5), `(min(I, k_in)·min(O, k_out))` features
    from its factors aᵢ `(T, I)` and δᵢ `(T, O)`, with Pa `(I, k_in)` and Pd `(O, k_out)`: at most
    (I + O)·k floats for an (I, O) weight where a dense projection (TRAK, Park et al. 2023) holds I·O·k. Any other
    leaf of at most `PROJECT_WHOLE_MAX` parameters is kept whole; a larger one is projected by a dense Gaussian
    `(size, dense_dim)`. A leaf named in `skip` is left out (`how` "skip", no features): on the rules path its
    gradient is never formed, nor what only it needs (for a network's first layer, the backward pass through the
    second layer's input; `_Traced.one`).

    **Arguments** as `per_example_dots` (`xs`, `ys` only for their shapes); `k_in`, `k_out` ≥ 1; `key` an int
    seed; `method` "vmap" projects every leaf's formed gradient (no rules); `skip` leaf names (`leaf_names`).

    **Returns** a tuple of `LeafProjection`.

    **Raises** `ValueError` for k < 1, a name in `skip` that is no differentiable leaf, or a leaf without factors
    too large for a dense projection (size × `dense_dim` > `PROJECT_DENSE_MAX`).
    """
    if min(k_in, k_out, dense_dim) < 1:
        raise ValueError(f"projection dimensions must be ≥ 1, got k_in={k_in}, k_out={k_out}, dense_dim={dense_dim}")
    check_batch(xs, ys)
    _check_method(method)
    params = as_params(params)
    unknown = set(skip) - set(leaf_names(params))
    if unknown:
        raise ValueError(f"no differentiable leaf named {', '.join(sorted(unknown))} to skip; the leaves are "
                         f"{', '.join(leaf_names(params))}")
    t = _traced(loss_fn, params, xs, ys, method)
    one = lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype)  # noqa: E731
    dims = {} if t is None else _kron_dims(t, jax.tree.map(one, xs), jax.tree.map(one, ys))
    plan, draws = [], []  # each leaf's kind and the indices of its matrices in `draws`
    for i, (name, leaf) in enumerate(zip(leaf_names(params), jax.tree.leaves(split_params(params)[0]))):
        if name in skip:
            plan.append((name, "skip", 0))
        elif i in dims:
            (rows, cols) = dims[i]
            plan.append((name, "kronecker", len(draws)))
            draws += [((i, 0), rows, k_in), ((i, 1), cols, k_out)]
        elif leaf.size <= PROJECT_WHOLE_MAX:
            plan.append((name, "whole", int(leaf.size)))
        elif leaf.size * dense_dim <= PROJECT_DENSE_MAX:
            plan.append((name, "gaussian", len(draws)))
            draws.append(((i,), int(leaf.size), dense_dim))
        else:
            raise ValueError(f"parameter {name} ({leaf.size:,} values) has no (a, δ) factors to project, and a dense "
                             f"projection to {dense_dim} would hold {leaf.size * dense_dim:,} floats")
    mats = [jnp.asarray(m) for m in _draws(jax.random.key(int(key)), tuple(draws))]
    out = []
    for name, how, at in plan:
        if how == "kronecker":
            pa, pd = mats[at], mats[at + 1]
            out.append(LeafProjection(name, how, pa.shape[1] * pd.shape[1], pa=pa, pd=pd))
        elif how in ("whole", "skip"):
            out.append(LeafProjection(name, how, at))
        else:
            out.append(LeafProjection(name, how, dense_dim, dense=mats[at]))
    return tuple(out)


def _project_flat(p: LeafProjection, g):
    g = g.reshape(-1).astype(rules.acc_dtype(g.dtype))
    return g if p.how == "whole" else g @ p.dense.astype(g.dtype)


@xla.jit
def _projections(loss_fn, params, xs, ys, mats, chunk, method):
    TRACES["per_example_projections"] += 1
    n = jax.tree.leaves(xs)[0].shape[0]
    diff, static = split_params(params)
    t = _traced(loss_fn, params, xs, ys, method)
    if t is None:
        g = _grad_one(loss_fn, static)

        def flat(xy):
            return jnp.concatenate([_project_flat(p, gi) for p, gi in zip(mats, jax.tree.leaves(g(diff, *xy)))
                                    if p.how != "skip"])

        chunk = _bytes_chunk(n, chunk, _vmap_example_bytes(loss_fn, params, xs, ys), PROJECT_CHUNK_BYTES)
        return _map(flat, (xs, ys), chunk)
    fixed = t.fixed(t.leaves, xs, ys)
    where = {i: j for j, i in enumerate(t.ruled)}
    skip = frozenset(i for i, p in enumerate(mats) if p.how == "skip")

    def one(xy):
        _, g_fb, saved, deltas = t.one(t.leaves, *xy, skip=skip)
        feats = []
        for i, p in enumerate(mats):
            if p.how == "skip":
                continue
            if p.how == "kronecker":
                j = where[i]
                (got,) = rules.project(t.rule(i), saved[j], deltas[j], [p.pa], [p.pd])
                feats.append(got.reshape(-1).astype(rules.acc_dtype(got.dtype)))
            else:
                g = g_fb[i] if i in g_fb else _leaf_grad(t, t.leaves, i, saved[where[i]], deltas[where[i]], fixed.get(i))
                feats.append(_project_flat(p, g))
        return jnp.concatenate(feats)

    k = sum(p.features for p in mats)
    return _map(one, (xs, ys), _bytes_chunk(n, chunk, t.example_bytes() + 4 * k, PROJECT_CHUNK_BYTES))


def per_example_projections(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    projection: tuple[LeafProjection, ...],
    *,
    chunk_size: int | None = None,
    method: Method = "auto",
) -> Float[Array, "N k"]:
    """Each example's gradient under a random projection (`projections`), without forming it where a rule
    has its factors: per weight of a dense layer, convolution or embedding Paᵀ Gᵢ Pd = (aᵢPa)ᵀ(δᵢPd)
    (`rules.project`; LoGra, Choe et al. 2024, eq. 5), the other leaves' gradients whole or densely projected,
    concatenated in leaf order. E[⟨φᵢ, φⱼ⟩] = ⟨gᵢ, gⱼ⟩ over the Gaussian draws (Johnson–Lindenstrauss). The
    features TRAK (Park et al. 2023) and LoGra score with; streamed in chunks, never N × P.

    **Arguments** as `per_example_dots`, plus `projection` (from `projections` on the same loss and params).

    **Returns** `(N, k)` float32 (float64 for a float64 model), k = Σ `LeafProjection.features` (units of the loss
    per parameter).

    **Raises** `ValueError` as `per_example_grads`, or if `projection` has another number of leaves.
    """
    n = check_batch(xs, ys)
    _check_method(method)
    params = as_params(params)
    if len(projection) != len(jax.tree.leaves(split_params(params)[0])):
        raise ValueError("projection was made for another model: build it with engine.projections")
    return _projections(loss_fn, params, xs, ys, tuple(projection), _chunk(n, chunk_size), method)


# ---------------------------------------------------------------- clipped sums (ghost clipping)


def weighted_grad(loss_fn: LossFn, params: PyTree, xs, ys, weights) -> PyTree:
    """Σᵢ wᵢ·∇θ loss(θ, xᵢ, yᵢ) as ONE gradient of Σᵢ wᵢ·ℓᵢ (weights held constant). Traceable."""
    diff, static = split_params(params)
    w = jax.lax.stop_gradient(weights)

    def total(d):
        return jnp.sum(w * jax.vmap(lambda x, y: loss_fn(eqx.combine(d, static), x, y))(xs, ys))

    return jax.grad(total)(diff)


def clip_factors(norms, clip_norm, weights=None):
    """cᵢ = wᵢ·min(1, C/‖gᵢ‖): the weight of example i in the clipped sum (C = inf gives wᵢ)."""
    c = jnp.minimum(1.0, clip_norm / jnp.maximum(norms, 1e-30))
    return c if weights is None else c * weights


def weighted_grads(loss_fn: LossFn, params: PyTree, xs, ys, weights, *, chunk_size: int | None = None) -> PyTree:
    """Many weighted gradients at once: Σᵢ W[i, k]·gᵢ for every column k of a weight matrix (= JᵀW).

    Per chunk of examples: ONE `jax.vjp` of the per-example-loss vector, then its VJP vmapped over
    the K weight columns (each a batch-gradient-sized backward pass); no per-example gradient is
    built. A clipped sum is the column cᵢ = `clip_factors(norms, C)`; a grid of C values, or
    per-class sums (weights masked by class), are more columns.

    **Arguments**
    - `loss_fn`, `params`, `xs (N, …)`, `ys (N, …)`: as `per_example_grads`.
    - `weights`: `(N, K)` float columns shared by every leaf, or a list with one `(N, K_l)` array
      per differentiable leaf (tree order, as `leaf_names`): leaf l gets its own columns
      (per-layer clipping).
    - `chunk_size`: examples per chunk (None: sized by bytes, K backward passes per chunk).

    **Returns** a pytree like the differentiable params whose leaves have a leading axis of K
    (or K_l): Σᵢ W[i, k]·∇θ loss(θ, xᵢ, yᵢ).

    **Raises** `ValueError` if the weights do not have N rows or one array per leaf.
    """
    params = as_params(params)
    n = check_batch(xs, ys)
    per_leaf = isinstance(weights, (list, tuple))
    w = [jnp.asarray(a, jnp.float32) for a in weights] if per_leaf else jnp.asarray(weights, jnp.float32)
    n_leaves = len(jax.tree.leaves(split_params(params)[0]))
    if per_leaf and len(w) != n_leaves:
        raise ValueError(f"weights: one (N, K) array per differentiable leaf ({n_leaves}), got {len(w)}")
    for a in w if per_leaf else [w]:
        if a.ndim != 2 or a.shape[0] != n:
            raise ValueError(f"weights must be (N, K) with N = {n} examples, got shape {a.shape}")
    k = max(a.shape[1] for a in w) if per_leaf else w.shape[1]
    if chunk_size is None:
        act = _vmap_example_bytes(loss_fn, params, xs, ys) // 2  # activations of one example
        chunk = _bytes_chunk(n, None, (k + 2) * max(act, 1)) or n
    else:
        chunk = _chunk(n, chunk_size) or n
    return _weighted_grads(loss_fn, params, xs, ys, w, chunk)


@eqx.filter_jit
def _weighted_grads(loss_fn, params, xs, ys, w, chunk):
    TRACES["weighted_grads"] += 1
    diff, static = split_params(params)
    per_leaf = isinstance(w, list)

    def step(acc, batch):
        (x, y, wc), m = batch
        losses = lambda d: jax.vmap(lambda xi, yi: loss_fn(eqx.combine(d, static), xi, yi))(x, y)  # noqa: E731
        _, vjp = jax.vjp(losses, diff)
        if not per_leaf:
            return jax.tree.map(jnp.add, acc, jax.vmap(lambda col: vjp(col * m)[0], in_axes=1)(wc))
        # leaf l takes only its own columns; XLA drops the other leaves' weight gradients
        return [a + jax.vmap(lambda col, l=l: jax.tree.leaves(vjp(col * m)[0])[l], in_axes=1)(wl)
                for l, (a, wl) in enumerate(zip(acc, wc))]

    leaves = jax.tree.leaves(diff)
    if per_leaf:
        init = [jnp.zeros((wl.shape[1],) + a.shape, a.dtype) for a, wl in zip(leaves, w)]
        out = scan_chunks(step, init, (xs, ys, w), chunk)
        return jax.tree.unflatten(jax.tree.structure(diff), out)
    init = jax.tree.map(lambda a: jnp.zeros((w.shape[1],) + a.shape, a.dtype), diff)
    return scan_chunks(step, init, (xs, ys, w), chunk)


def clipped_sum_core(loss_fn, params, xs, ys, clip_norm, weights=None, chunk=None, method="auto"):
    """The clipped sum inside a trace: `(Σᵢ wᵢ·min(1, C/‖gᵢ‖)·gᵢ, losses (N,), norms (N,))`.

    Ghost clipping (`method` "auto"/"ghost"): norms by the per-layer rules, then one weighted
    backward pass. `method="vmap"`: per-example gradients chunk by chunk, clipped and summed (the
    reference). Used by `clipped_grad_sum`, DP-SGD training (`gradlab.train`) and the clipping
    analysis (`gradlab.clipping`).
    """
    if method == "vmap":
        return _clipped_sum_vmap(loss_fn, params, xs, ys, clip_norm, weights, chunk)[:3]
    n = jax.tree.leaves(xs)[0].shape[0]
    t = _traced(loss_fn, params, xs, ys, method)
    if t is None and _low_precision(loss_fn, params, xs, ys):
        # a weighted backward pass would round cᵢ (and the sum) to bfloat16: clip per-example gradients
        return _clipped_sum_vmap(loss_fn, params, xs, ys, clip_norm, weights, chunk)[:3]
    if t is None:  # no rule anywhere: the per-example norms, then one weighted backward pass
        losses, sq = _sq_norms_core(loss_fn, params, xs, ys, chunk, "vmap")
        norms = jnp.sqrt(sum(jax.tree.leaves(sq)))
        return weighted_grad(loss_fn, params, xs, ys, clip_factors(norms, clip_norm, weights)), losses, norms
    return _rules_clipped_sum(t, params, xs, ys, clip_norm, weights, _bytes_chunk(n, chunk, t.example_bytes()))[:3]


def layer_norms_and_grad_sum(loss_fn: LossFn, params: PyTree, xs: Any, ys: Any, *, chunk_size: int | None = None,
                             has_aux: bool = False
                             ) -> (tuple[dict[str, Float[Array, "N"]], Float[Array, "N"], PyTree]
                                   | tuple[dict[str, Float[Array, "N"]], Float[Array, "N"], PyTree, PyTree]):
    """Per-example layer norms, losses and the summed gradient Σᵢ gᵢ from ONE pass over the examples.

    What `per_example_layer_norms`, the per-example losses and `batch_grad(reduction="sum")` give apart, for
    about the cost of the first: per chunk the rules' (aᵢ, δᵢ) give each leaf's per-example norm and then the
    chunk's sum gradient (one matmul per ruled op: ghost clipping's pass with C = ∞, Bu et al. 2022,
    arXiv:2210.00038); a loss with no rule takes `vmap(grad)` chunk by chunk. Streams: never holds N x P.

    **Arguments** as `per_example_layer_norms` (`chunk_size` None: chunks of about `CHUNK_BYTES`). `has_aux`:
    `loss_fn` returns `(loss, aux)`, as for `jax.grad(has_aux=True)` (a prediction from the same forward pass).

    **Returns** `({leaf name: (N,) norms}, losses (N,), Σᵢ gᵢ as a pytree like the differentiable params,
    accumulated in float32 or wider)`, and with `has_aux` a fourth element: each example's aux, stacked `(N, ...)`.

    **Raises** `ValueError` as `per_example_grads`.
    """
    params = as_params(params)
    n = check_batch(xs, ys)
    total, losses, norms = _layer_sq_and_sum(loss_fn, params, xs, ys, _chunk(n, chunk_size), has_aux)
    names = [jax.tree_util.keystr(path) or "params" for path, _ in
             jax.tree_util.tree_flatten_with_path(split_params(params)[0])[0]]
    layer = dict(zip(names, norms))
    return (layer, losses[0], total, losses[1]) if has_aux else (layer, losses, total)


@xla.jit
def _layer_sq_and_sum(loss_fn, params, xs, ys, chunk, has_aux):
    TRACES["layer_norms_and_grad_sum"] += 1
    n = jax.tree.leaves(xs)[0].shape[0]
    t = _traced(loss_fn, params, xs, ys, "auto", has_aux)
    if t is None:
        total, losses, _, sq = _clipped_sum_vmap(loss_fn, params, xs, ys, jnp.inf, None, chunk, has_aux)
    else:
        total, losses, _, sq = _rules_clipped_sum(t, params, xs, ys, jnp.inf, None, _bytes_chunk(n, chunk, t.example_bytes()))
    return total, losses, list(jnp.sqrt(sq))  # one (N,) array per leaf, formed here: no eager op to compile


def _low_precision(loss_fn, params, xs, ys) -> bool:
    """Whether the loss computes anything in a float narrower than float32 (bfloat16 params or compute)."""
    one = lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype)  # noqa: E731
    diff, static = split_params(params)
    try:
        dtypes = jaxprs.dtypes(lambda d, x, y: loss_fn(eqx.combine(d, static), x, y),
                               diff, jax.tree.map(one, xs), jax.tree.map(one, ys))
    except Exception:  # noqa: BLE001 - untraceable here: take the exact path
        return True
    return any(jnp.issubdtype(d, jnp.floating) and np.dtype(d).itemsize < 4 for d in dtypes)


def _rules_clipped_sum(t: _Traced, params, xs, ys, clip_norm, weights, chunk):
    """Ghost clipping in ONE pass: per chunk, the rules' (a, δ) give each example's norm, hence its
    factor cᵢ, and then the chunk's Σᵢ cᵢ·gᵢ: for a ruled weight the VJP of its op over the chunk
    with cᵢ·δᵢ (one matmul, as a batch gradient does), for a fallback leaf, or a ruled one whose norm
    formed gᵢ anyway (`Rule.forms_grad`: a convolution over many positions), Σᵢ cᵢ·gᵢ of those per-example
    gradients. (The "book-keeping" form of ghost clipping: Bu et al. 2022, arXiv:2210.00038.) No second
    backward pass."""
    leaves = t.leaves
    n = jax.tree.leaves(xs)[0].shape[0]
    w_all = jnp.ones(n, jnp.float32) if weights is None else weights
    fixed = t.fixed(leaves, xs, ys)  # a data-free use's gradient p: ‖gᵢ‖ includes it, the sum gains (Σᵢ cᵢ)·p

    def one(x, y):
        structured = {}  # computed weights' closed-form norms (`Composite.structure`): no gradient formed
        return *t.one(leaves, x, y, sq=structured), structured

    def block(x, y, w):
        loss, g_fb, saved, deltas, structured = jax.vmap(one)(x, y)
        sq = [None] * len(t.diff_index)  # per leaf, (chunk,)
        for i, v in structured.items():
            sq[i] = v
        grads = dict(g_fb)  # per-example gradients: the fallback leaves', and those a rule's norm forms anyway
        for j, i in enumerate(t.ruled):
            rule, leaf = t.rule(i), t.diff_leaf(leaves, i)
            if rule.forms_grad:  # includes p: the sum below is Σᵢ cᵢ·gᵢ of these, no second matmul over (a, δ)
                grads[i] = jax.vmap(lambda a, d: rules.weight_grad(rule, leaf, a, d, fixed.get(i)))(saved[j], deltas[j])
            else:
                sq[i] = jax.vmap(lambda a, d: rules.weight_sq_norm(rule, leaf, a, d, fixed.get(i)),
                                 axis_size=w.shape[0])(saved[j], deltas[j])
        for i, g in grads.items():
            sq[i] = jax.vmap(_sq)(g)
        sq = jnp.stack(sq)
        norms = jnp.sqrt(jnp.sum(sq, axis=0))
        c = clip_factors(norms, clip_norm, w)
        out = [None] * len(t.diff_index)
        for i, g in grads.items():  # c is never rounded to a bfloat16 gradient's dtype: sums in float32
            out[i] = jnp.tensordot(c.astype(_acc(g)), g.astype(_acc(g)), axes=1)
        for j, i in enumerate(t.ruled):
            if i in grads:
                continue
            leaf, a, d = t.diff_leaf(leaves, i), saved[j], deltas[j]
            out[i] = _acc_zeros(leaf)
            if t.rule(i).sites:
                _, vjp = jax.vjp(lambda wt: jax.vmap(lambda ai: rules.apply_rule(t.rule(i), wt, ai))(a),
                                 leaf.astype(_acc(leaf)))
                out[i] = vjp(tuple((c.reshape((-1,) + (1,) * (di.ndim - 1)) * di).astype(_acc(leaf)) for di in d))[0]
            if i in fixed:
                out[i] = out[i] + jnp.sum(c).astype(_acc(leaf)) * fixed[i].astype(_acc(leaf))
        if structured:  # J_fᵀ(Σᵢ cᵢ Gᵢ): one matmul and the construction's VJP (`rules.composite_sums`)
            m = len(t.ruled)
            values = list(leaves) + [a[0] for a in jax.tree.leaves((x, y))]  # the construction reads no example
            sums = rules.composite_sums(t.plan, values, saved[m:], deltas[m:], c,
                                        skip=lambda comp: comp.structure is None)
            for i, g in sums.items():
                out[i] = g
        return out, loss, norms, sq

    if chunk is None:
        out, losses, norms, sq = block(xs, ys, w_all)
        return _diff_tree(params, out), losses, norms, sq
    pad = (-n) % chunk
    padded = (*pad_examples((xs, ys), pad), _pad_zeros(w_all, pad))  # copies of real examples, weight 0
    split = jax.tree.map(lambda a: a.reshape((-1, chunk) + a.shape[1:]), padded)

    def step(acc, batch):
        out, loss, norms, sq = block(*batch)
        return [a + o for a, o in zip(acc, out)], (loss, norms, sq)

    zeros = [_acc_zeros(t.diff_leaf(leaves, i)) for i in range(len(t.diff_index))]
    total, (losses, norms, sq) = jax.lax.scan(step, zeros, split)
    sq = jnp.moveaxis(sq, 1, 0).reshape(len(t.diff_index), -1)[:, :n]
    return _diff_tree(params, total), _unchunk(losses, n), norms.reshape(-1)[:n], sq


def _unchunk(a, n: int):
    """(chunks, chunk, ...) arrays of a pytree back to (n, ...): the padding dropped."""
    return jax.tree.map(lambda v: v.reshape((-1,) + v.shape[2:])[:n], a)


def _acc(a):
    return rules.acc_dtype(a.dtype)


def _acc_zeros(a):
    return jnp.zeros(a.shape, _acc(a))


def _clipped_sum_vmap(loss_fn, params, xs, ys, clip_norm, weights, chunk, has_aux=False):
    n = jax.tree.leaves(xs)[0].shape[0]
    diff, static = split_params(params)
    w = jnp.ones(n) if weights is None else weights
    vg = jax.value_and_grad(lambda d, x, y: loss_fn(eqx.combine(d, static), x, y), has_aux=has_aux)

    def clipped(x, y, wi):
        loss, gi = vg(diff, x, y)
        sq = jnp.stack([_sq(a) for a in jax.tree.leaves(gi)])
        norm = jnp.sqrt(jnp.sum(sq))
        scale = clip_factors(norm, clip_norm, wi)
        return jax.tree.map(lambda a: a.astype(_acc(a)) * scale.astype(_acc(a)), gi), loss, norm, sq

    chunk = _bytes_chunk(n, chunk, _vmap_example_bytes(loss_fn, params, xs, ys)) or n
    pad = (-n) % chunk
    padded = (*pad_examples((xs, ys), pad), _pad_zeros(w, pad))  # copies of real examples, weight 0
    split = jax.tree.map(lambda a: a.reshape((-1, chunk) + a.shape[1:]), padded)
    mask = (jnp.arange(n + pad) < n).reshape(-1, chunk)

    def step(total, batch):
        (x, y, wi), m = batch
        g, losses, norms, sq = jax.vmap(clipped)(x, y, wi * m)
        return jax.tree.map(lambda t, a: t + a.sum(0), total, g), (losses, norms, sq)

    total, (losses, norms, sq) = jax.lax.scan(step, jax.tree.map(_acc_zeros, diff), (split, mask))
    return total, _unchunk(losses, n), norms.reshape(-1)[:n], sq.reshape(-1, sq.shape[-1])[:n].T


@xla.jit
def _clipped_sum(loss_fn, params, xs, ys, clip_norm, weights, chunk, method):
    TRACES["clipped_grad_sum"] += 1
    total, _, norms = clipped_sum_core(loss_fn, params, xs, ys, clip_norm, weights, chunk, method)
    return total, norms


@sharding.over_examples("sum")  # all devices when several are visible
def clipped_grad_sum(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    clip_norm: float,
    *,
    chunk_size: int | None = None,
    weights: Any = None,
    method: Method = "auto",
    return_norms: bool = False,
) -> PyTree:
    """Sum of per-example gradients, each clipped to global L2 norm at most C: Σᵢ wᵢ·min(1, C/‖gᵢ‖)·gᵢ.

    The DP-SGD aggregate before noise (Abadi et al. 2016, Algorithm 1). Book-keeping ghost clipping
    (Li et al. 2022; Bu et al. 2023): per chunk of examples, one backward pass to the layer outputs
    gives each ruled op's (aᵢ, δᵢ), hence the norms ‖gᵢ‖ and cᵢ = wᵢ·min(1, C/‖gᵢ‖), and the sum is
    the op's VJP with cᵢ·δᵢ (one matmul): no second backward pass, no per-example gradient built
    (fallback leaves excepted). A loss with no rule takes the norms, then one backward pass of Σᵢ cᵢ·ℓᵢ.
    `method="vmap"` clips materialized per-example gradients chunk by chunk (the reference). On a small
    computation "auto" takes whichever of the two measured faster, timed once per loss and shapes (`AUTO_TIMING`).

    **Arguments** as `per_example_grads`, plus
    - `clip_norm`: C > 0 (same units as the gradient norm); `inf` gives the plain gradient sum.
    - `weights`: optional `(N,)` per-example weights wᵢ, e.g. a 0/1 mask of a Poisson-sampled
      batch held in a fixed-size buffer.
    - `return_norms`: also return the `(N,)` unclipped norms ‖gᵢ‖.

    **Returns** a pytree like the differentiable part of `params` (no example axis), its leaves in
    float32 when the parameters are bfloat16 or float16 (the sum is accumulated in float32: rounded
    back, an example's contribution could exceed C); with `return_norms`, `(sum, norms)`, norms float32.

    **Raises** `ValueError` if C <= 0, `weights` is not `(N,)`, or as `per_example_grads`.
    """
    if not clip_norm > 0:
        raise ValueError(f"clipping norm C must be > 0, got {clip_norm}")
    n = check_batch(xs, ys)
    _check_method(method)
    if weights is not None:
        weights = jnp.asarray(weights, jnp.float32)
        if weights.shape != (n,):
            raise ValueError(f"weights must have shape ({n},), got {weights.shape}")
    # np.float32, not jnp.float32: a NumPy scalar is traced all the same, without a 70 µs device put per call
    c = clip_norm if jaxprs.is_tracer(clip_norm) else np.float32(clip_norm)
    params, chunk = as_params(params), _chunk(n, chunk_size)
    if method != "auto" or _traced_call(params, xs, ys, weights, clip_norm):
        total, norms = _clipped_sum(loss_fn, params, xs, ys, c, weights, chunk, method)
    else:
        key = lambda: _auto_key("clipped_grad_sum", loss_fn, params, xs, ys, chunk, weights is None)  # noqa: E731
        total, norms = _auto(key, n, lambda m: _clipped_sum(loss_fn, params, xs, ys, c, weights, chunk, m))
    return (total, norms) if return_norms else total


@eqx.filter_jit
def _batch_grad(loss_fn, params, xs, ys, mean):
    TRACES["batch_grad"] += 1
    diff, static = split_params(params)

    def total(d):
        losses = jax.vmap(lambda x, y: loss_fn(eqx.combine(d, static), x, y))(xs, ys)
        return losses.mean() if mean else losses.sum()

    return jax.grad(total)(diff)


@sharding.over_examples("sum")  # all devices when several are visible
def batch_grad(
    loss_fn: LossFn,
    params: PyTree,
    xs: Any,
    ys: Any,
    *,
    reduction: Literal["sum", "mean"] = "sum",
) -> PyTree:
    """One gradient of the summed (or mean) loss: `grad(lambda p: vmap(loss_fn)(p, xs, ys).sum())`.

    By linearity it equals `per_example_grads(...).sum(0)` (or `.mean(0)`); seed 002.

    **Arguments** as `per_example_grads`, plus `reduction`: `"sum"` or `"mean"`.

    **Returns** a pytree like the differentiable part of `params`.

    **Raises** `ValueError` for another reduction or as `per_example_grads`.
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    check_batch(xs, ys)
    return _batch_grad(loss_fn, as_params(params), xs, ys, reduction == "mean")


_loop_grad_cache: dict = {}


def loop_per_example_grads(loss_fn: LossFn, params: PyTree, xs: Any, ys: Any) -> PyTree:
    """Baseline: a Python loop of `jax.grad` (jitted), one example at a time, then stacked.

    The slow reference the engine is compared against (seed 003's `compute_sample_grads`).

    **Returns** the same pytree as `per_example_grads`.
    """
    n = check_batch(xs, ys)
    params = as_params(params)
    diff, static = split_params(params)
    key = (loss_fn, jax.tree.structure(static), tuple(jax.tree.leaves(static)))
    try:
        g = _loop_grad_cache[key]
    except (KeyError, TypeError):
        g = jax.jit(_grad_one(loss_fn, static))
        try:
            _loop_grad_cache[key] = g
        except TypeError:  # unhashable static leaves: just don't cache
            pass
    rows = [g(diff, jax.tree.map(lambda a: a[i], xs), jax.tree.map(lambda a: a[i], ys)) for i in range(n)]
    # stack on the host: jnp.stack of N operands would compile a new N-way concatenate per N
    return jax.tree.map(lambda *r: jnp.asarray(np.stack(r)), *rows)


def flatten_per_example(grads: PyTree) -> Float[Array, "N P"]:
    """Concatenate the leaves of per-example gradients into one `(N, P)` matrix."""
    leaves = jax.tree.leaves(grads)
    return jnp.concatenate([a.reshape(a.shape[0], -1) for a in leaves], axis=1)


def xla_memory(approach: str, loss_fn: Callable, params: Any, xs: Any, ys: Any, *,
               chunk_size: int | None = None) -> dict[str, int] | None:
    """Bytes XLA's buffer assignment allocates for one approach's compiled program (nothing runs).

    The peak extra memory of one call is about `temp + output` (arguments already exist).

    **Arguments**
    - `approach`: `"vmap"` or `"rules"` (per-example gradients by `vmap(grad)` or by the per-layer
      rules), `"batch"` (one batch gradient), `"norms_vmap"` or `"norms"` (streamed norms); any
      other name (the Python loop, which is not one program) gives None.
    - the rest as `per_example_grads`.

    **Returns** `{"temp": bytes, "output": bytes}`, or None.
    """
    params = as_params(params)
    n = int(jax.tree.leaves(xs)[0].shape[0])
    chunk = _chunk(n, chunk_size)
    fns = {
        "vmap": (_per_example_grads, (None, "vmap")),
        "rules": (_per_example_grads, (None, "ghost")),
        "batch": (_batch_grad, (False,)),
        "norms_vmap": (_sq_norms, (chunk, "vmap")),
        "norms": (_sq_norms, (chunk, "auto")),
    }
    if approach not in fns:
        return None
    fn, extra = fns[approach]
    analysis = fn.lower(loss_fn, params, xs, ys, *extra).compile().compiled.memory_analysis()
    return {"temp": int(analysis.temp_size_in_bytes), "output": int(analysis.output_size_in_bytes)}
