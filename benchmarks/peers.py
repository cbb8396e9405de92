"""DP-SGD beside its peers in one run: gradlab, Opacus ghost clipping (and hooks), jax-privacy, a naive vmap.

Two models, the same weights in JAX and PyTorch (copied from torch), the same batch:

- a GPT-like transformer (`gpt_loss`: token + position embeddings, 2 pre-LayerNorm blocks of causal
  attention with a packed QKV weight and a GELU MLP, a final LayerNorm, the head tied to the token
  embedding), d = 128, 4 heads, 64 tokens, vocabulary 256, a batch of 32 sequences; the loss of one
  example is the mean next-token cross-entropy of its sequence;
- seed 003's SimpleCNN (`gradlab.models.SimpleCNN`: conv 32, conv 64, max-pool, fc 128, fc 10, NLL) on
  a batch of 64 random 1×28×28 images, as in the seed.

For each, one DP-SGD step (clip every example's gradient to C = the median norm, sum, add N(0, σ²C²)
with σ = 1, divide by B, SGD) beside a plain step (the batch's mean gradient, SGD), by

- gradlab: `privacy.dp_sgd_gradient` (the engine's ghost/book-keeping clipped sum, `engine.clipped_sum_core`);
- jax-privacy 2.0.0: `jax_privacy.clipped_grad` (`vmap` of `value_and_grad`, clip, sum) and its
  `noise_addition.gaussian_privatizer`;
- a naive `vmap(grad)`: per-example gradients materialized, clipped, summed;
- Opacus: `PrivacyEngine.make_private(grad_sample_mode="ghost")` (two backward passes) and "hooks"
  (per-sample gradients), with torch's plain step beside them.

Before timing, every contender's clipped sum (noise off) is compared with the naive `vmap` sum on the
same tensors. Times: median of interleaved rounds (load from other processes hits every contender
alike). Peak memory: one fresh subprocess per contender (`measure_memory`): the process's peak resident set
after import, build, compile and two warm-up steps ("process"), then the step's own peak above the resident set
before it, steady state ("step peak": freed heap trimmed, the kernel's high-water mark `VmHWM` reset, three
steps); for JAX also XLA's buffer assignment of the compiled step (temp + output bytes, nothing run). A peer
that is not installed is skipped.

    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu; pip install -r requirements-bench.txt
    python -m benchmarks.peers [--rounds 7] [--models gpt gpt-untied cnn]
    python -m benchmarks.peers --check       # the agreement check alone on small batches; exit 1 on disagreement
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gradlab import engine, losses, memory, models, privacy

#: GRADLAB_PEERS_NO_TORCH=1: a JAX contender's memory subprocess imports no torch (random weights, same shapes)
HAS_TORCH = (all(importlib.util.find_spec(m) is not None for m in ("torch", "opacus"))
             and not os.environ.get("GRADLAB_PEERS_NO_TORCH"))
HAS_JAX_PRIVACY = importlib.util.find_spec("jax_privacy") is not None
if HAS_TORCH:
    import torch

    from benchmarks import peers_torch
if HAS_JAX_PRIVACY:
    import jax_privacy
    from jax_privacy import noise_addition

HEADS = 4
GPT = dict(vocab=256, d=128, layers=2, seq=64, batch=32)
CNN_BATCH = 64
SIGMA, LR = 1.0, 0.1
MICRO = 4  # examples per micro-batch of the micro-batched plain JAX step
PLAIN_JAX, PLAIN_MICRO = "plain step (JAX, no clipping)", f"plain step (JAX, micro-batches of {MICRO})"
PLAIN_TORCH, OURS = "plain step (torch, no clipping)", "gradlab dp_sgd_gradient"


# ---------------------------------------------------------------- the JAX models (per-example losses)

def layer_norm(h, g, b, eps=1e-5):
    mu = h.mean(-1, keepdims=True)
    return (h - mu) / jnp.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + eps) * g + b


def gpt_loss(p: dict, x, y):
    """Mean next-token cross-entropy of ONE sequence `x (T,)` with targets `y (T,)`; dict params named and
    laid out as `peers_torch.GPT`'s (`head.weight` present only when the head is untied)."""
    t, d = x.shape[0], p["wte.weight"].shape[1]
    dh = d // HEADS
    h = p["wte.weight"][x] + p["wpe.weight"][:t]
    causal = jnp.tril(jnp.ones((t, t), bool))
    for i in range(sum(k.endswith("qkv.weight") for k in p)):
        w = lambda n: p[f"blocks.{i}.{n}"]  # noqa: E731
        qkv = layer_norm(h, w("ln1.weight"), w("ln1.bias")) @ w("qkv.weight").T + w("qkv.bias")
        q, k, v = (z.reshape(t, HEADS, dh).transpose(1, 0, 2) for z in jnp.split(qkv, 3, axis=-1))
        s = jnp.where(causal, q @ k.transpose(0, 2, 1) / np.sqrt(dh), -jnp.inf)
        a = (jax.nn.softmax(s, axis=-1) @ v).transpose(1, 0, 2).reshape(t, d)
        h = h + a @ w("proj.weight").T + w("proj.bias")
        m = jax.nn.gelu(layer_norm(h, w("ln2.weight"), w("ln2.bias")) @ w("fc.weight").T + w("fc.bias"),
                        approximate=False)
        h = h + m @ w("out.weight").T + w("out.bias")
    logits = layer_norm(h, p["ln_f.weight"], p["ln_f.bias"]) @ p.get("head.weight", p["wte.weight"]).T
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1).mean()


cnn_loss = losses.cross_entropy  # NLL of SimpleCNN's log-probabilities, one flattened image


def _cnn_from_torch(sd: dict) -> models.SimpleCNN:
    """gradlab's SimpleCNN with torch's weights (same layouts: OIHW, (out, in); conv biases (O, 1, 1))."""
    m = models.SimpleCNN((28, 28), 10, key=jax.random.key(0))
    leaves = [sd["conv1.weight"], sd["conv1.bias"].reshape(32, 1, 1), sd["conv2.weight"],
              sd["conv2.bias"].reshape(64, 1, 1), sd["fc1.weight"], sd["fc1.bias"], sd["fc2.weight"], sd["fc2.bias"]]
    return eqx.tree_at(lambda m: (m.conv1.weight, m.conv1.bias, m.conv2.weight, m.conv2.bias,
                                  m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias),
                       m, [jnp.asarray(a) for a in leaves])


def _cnn_by_name(m: models.SimpleCNN) -> dict:
    """A SimpleCNN-shaped pytree (parameters or a gradient) as {torch name: array}."""
    return {f"{layer}.{leaf}": np.asarray(getattr(getattr(m, layer), leaf), np.float64)
            for layer in ("conv1", "conv2", "fc1", "fc2") for leaf in ("weight", "bias")}


# ---------------------------------------------------------------- workloads

@dataclasses.dataclass
class Workload:
    """One model on one batch, in JAX and (when installed) in PyTorch with the same weights."""

    name: str
    loss_fn: Callable
    params: Any
    xs: Any
    ys: Any
    by_name: Callable  # a params-shaped pytree -> {torch name: float64 array}
    torch_model: Any = None
    torch_x: Any = None
    torch_y: Any = None
    kind: str = "gpt"
    clip_norm: float = 1.0

    @property
    def batch(self) -> int:
        return int(self.xs.shape[0])


def gpt_workload(seed: int = 0, tied: bool = True, vocab=GPT["vocab"], d=GPT["d"], layers=GPT["layers"],
                 seq=GPT["seq"], batch=GPT["batch"]) -> Workload:
    ids = np.random.default_rng(seed).integers(0, vocab, (batch, seq + 1))
    x, y = ids[:, :-1], ids[:, 1:]
    if HAS_TORCH:
        model = peers_torch.build("gpt", seed, vocab=vocab, d=d, heads=HEADS, layers=layers, seq=seq, tied=tied)
        params = {n: jnp.asarray(p.detach().numpy()) for n, p in model.named_parameters()}  # tied: wte only
        tx, ty = torch.as_tensor(np.ascontiguousarray(x)), torch.as_tensor(np.ascontiguousarray(y))  # Opacus ghost
        # views its ids: a sliced (non-contiguous) batch fails with "view size is not compatible"
    else:
        model = tx = ty = None
        params = _random_gpt(seed, vocab, d, layers, seq, tied)
    name = f"GPT-like, {layers} layers, d={d}, {seq} tokens, vocab {vocab}, {'tied' if tied else 'untied'} head, B={batch}"
    return Workload(name, gpt_loss, params, jnp.asarray(x), jnp.asarray(y), lambda g: {k: np.asarray(v, np.float64)
                    for k, v in g.items()}, model, tx, ty, "gpt")


def _random_gpt(seed, vocab, d, layers, seq, tied) -> dict:
    """GPT params without torch: N(0, 0.02²) embeddings, N(0, 1/fan_in) weights, unit LayerNorm scales."""
    shapes = {"wte.weight": (vocab, d), "wpe.weight": (seq, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for i in range(layers):
        for n, (o, f) in {"qkv": (3 * d, d), "proj": (d, d), "fc": (4 * d, d), "out": (d, 4 * d)}.items():
            shapes[f"blocks.{i}.{n}.weight"], shapes[f"blocks.{i}.{n}.bias"] = (o, f), (o,)
        for n in ("ln1", "ln2"):
            shapes[f"blocks.{i}.{n}.weight"], shapes[f"blocks.{i}.{n}.bias"] = (d,), (d,)
    if not tied:
        shapes["head.weight"] = (vocab, d)
    keys = dict(zip(shapes, jax.random.split(jax.random.key(seed), len(shapes))))

    def init(n, s):
        if n.startswith(("wte", "wpe")):
            return 0.02 * jax.random.normal(keys[n], s)
        if "ln" in n:
            return jnp.ones(s) if n.endswith("weight") else jnp.zeros(s)
        return jax.random.normal(keys[n], s) / np.sqrt(s[-1] if len(s) > 1 else d)

    return {n: init(n, s) for n, s in shapes.items()}


def cnn_workload(seed: int = 0, batch: int = CNN_BATCH) -> Workload:
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, batch)
    if HAS_TORCH:
        model = peers_torch.build("cnn", seed)
        params = _cnn_from_torch({n: p.detach().numpy() for n, p in model.named_parameters()})
        tx, ty = torch.as_tensor(x), torch.as_tensor(y)
    else:
        model = tx = ty = None
        params = models.SimpleCNN((28, 28), 10, key=jax.random.key(seed))
    return Workload(f"seed 003's SimpleCNN, 1x28x28, B={batch}", cnn_loss, params,
                    jnp.asarray(x.reshape(batch, -1)), jnp.asarray(y), _cnn_by_name, model, tx, ty, "cnn")


def with_median_clip(w: Workload) -> Workload:
    """C = the median per-example gradient norm (half the examples clipped)."""
    norms = engine.per_example_norms(w.loss_fn, w.params, w.xs, w.ys, method="vmap")
    return dataclasses.replace(w, clip_norm=float(np.median(np.asarray(norms))))


# ---------------------------------------------------------------- the JAX contenders

def _split(params):
    return eqx.partition(params, eqx.is_inexact_array)


def naive_clipped_sum(loss_fn, params, xs, ys, clip_norm):
    """Σᵢ min(1, C/‖gᵢ‖)·gᵢ from materialized per-example gradients (`vmap(grad)`): the reference."""
    diff, static = _split(params)
    g = jax.vmap(jax.grad(lambda d, x, y: loss_fn(eqx.combine(d, static), x, y)), in_axes=(None, 0, 0))(diff, xs, ys)
    norms = jnp.sqrt(sum(jnp.sum(a.reshape(a.shape[0], -1) ** 2, axis=1) for a in jax.tree.leaves(g)))
    c = jnp.minimum(1.0, clip_norm / norms)
    return jax.tree.map(lambda a: jnp.tensordot(c, a, axes=1), g)


def jax_privacy_clipped_sum(loss_fn, params, xs, ys, clip_norm):
    """jax-privacy 2.0.0's clipped gradient sum: `clipped_grad` over the example axis of `xs` and `ys`."""
    diff, static = _split(params)
    cg = jax_privacy.clipped_grad(lambda d, x, y: loss_fn(eqx.combine(d, static), x, y), l2_clip_norm=clip_norm,
                                  batch_argnums=(1, 2), keep_batch_dim=False)
    return cg(diff, xs, ys)


def gradlab_clipped_sum(loss_fn, params, xs, ys, clip_norm):
    return engine.clipped_grad_sum(loss_fn, params, xs, ys, clip_norm)


def _sgd(diff, g):
    return jax.tree.map(lambda p, a: p - LR * a, diff, g)


class JaxStep:
    """One jitted training step `params -> params` on a fixed batch; `state` carries a noise key or a
    jax-privacy privatizer state. `fn(loss_fn, params, xs, ys, key, state) -> (gradient, state)`."""

    def __init__(self, w: Workload, fn: Callable, state: Any = None):
        self.w, self.state = w, state
        loss_fn, batch = w.loss_fn, w.batch

        @eqx.filter_jit
        def step(params, xs, ys, key, state):
            diff, static = _split(params)
            g, state = fn(loss_fn, params, xs, ys, key, state)
            return eqx.combine(_sgd(diff, jax.tree.map(lambda a: a / batch, g)), static), state

        self.step = step
        self.key = jax.random.key(1)

    def __call__(self):
        return jax.block_until_ready(self.step(self.w.params, self.w.xs, self.w.ys, self.key, self.state))

    def memory_analysis(self) -> int:
        """XLA's temp + output bytes for the compiled step (nothing runs)."""
        c = self.step.lower(self.w.params, self.w.xs, self.w.ys, self.key, self.state).compile()
        a = c.compiled.memory_analysis()
        return int(a.temp_size_in_bytes + a.output_size_in_bytes)


def jax_steps(w: Workload) -> dict[str, JaxStep]:
    """The JAX contenders: plain step, gradlab, jax-privacy (when installed), naive vmap."""
    c = w.clip_norm

    def plain(loss_fn, params, xs, ys, key, state):
        return engine.weighted_grad(loss_fn, params, xs, ys, jnp.ones(xs.shape[0])), state

    def gradlab(loss_fn, params, xs, ys, key, state):
        g, _, _ = privacy.dp_sgd_gradient(loss_fn, params, xs, ys, key, clip_norm=c, noise_multiplier=SIGMA,
                                          batch_size=1.0)
        return g, state

    def naive(loss_fn, params, xs, ys, key, state):
        s = naive_clipped_sum(loss_fn, params, xs, ys, c)
        return jax.tree.map(jnp.add, s, privacy.gaussian_noise(key, s, c, SIGMA)), state

    def plain_micro(loss_fn, params, xs, ys, key, state):  # XLA:CPU: B/4 gradients of 4 beat one of B (cache)
        split = lambda a: a.reshape((-1, MICRO) + a.shape[1:])  # noqa: E731

        def add(total, batch):
            return jax.tree.map(jnp.add, total, engine.weighted_grad(loss_fn, params, *batch, jnp.ones(MICRO))), None

        zeros = jax.tree.map(jnp.zeros_like, _split(params)[0])
        return jax.lax.scan(add, zeros, (split(xs), split(ys)))[0], state

    steps = {PLAIN_JAX: JaxStep(w, plain), PLAIN_MICRO: JaxStep(w, plain_micro), OURS: JaxStep(w, gradlab)}
    if HAS_JAX_PRIVACY:
        privatizer = noise_addition.gaussian_privatizer(stddev=SIGMA * c, prng_key=2)

        def jp(loss_fn, params, xs, ys, key, state):
            s = jax_privacy_clipped_sum(loss_fn, params, xs, ys, c)
            return privatizer.update(s, state)

        steps["jax-privacy clipped_grad"] = JaxStep(w, jp, privatizer.init(_split(w.params)[0]))
    steps["naive vmap(grad) clip"] = JaxStep(w, naive)
    return steps


def torch_steps(w: Workload) -> dict:
    if not HAS_TORCH:
        return {}
    kw = dict(clip_norm=w.clip_norm, noise_multiplier=SIGMA)
    step = lambda mode: peers_torch.Step(w.kind, w.torch_model, w.torch_x, w.torch_y, mode=mode, **kw)  # noqa: E731
    return {"plain step (torch, no clipping)": step(None), "Opacus ghost": step("ghost"), "Opacus hooks": step("hooks")}




# ---------------------------------------------------------------- agreement

def clipped_sums(w: Workload) -> dict[str, dict | str]:
    """Every contender's clipped sum (noise off) on `w`, by torch parameter name, float64; for a peer that
    refuses the model, its error message."""
    c, args = w.clip_norm, (w.loss_fn, w.params, w.xs, w.ys)
    out = {"naive vmap(grad) clip": w.by_name(naive_clipped_sum(*args, c)),
           OURS: w.by_name(gradlab_clipped_sum(*args, c))}
    if HAS_JAX_PRIVACY:
        out["jax-privacy clipped_grad"] = w.by_name(jax_privacy_clipped_sum(*args, c))
    if HAS_TORCH:
        for mode in ("ghost", "hooks"):
            s = peers_torch.Step(w.kind, w.torch_model, w.torch_x, w.torch_y, mode=mode, clip_norm=c,
                                 noise_multiplier=0.0)
            out[f"Opacus {mode}"] = _or_error(s.clipped_sum)
    return out


def _or_error(fn):
    """fn(), or the one-line message of what it raised (a peer refusing a model: Opacus ghost on tied weights)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - any refusal is reported, not hidden
        return f"{type(e).__name__}: {e}"


def max_rel_diff(a: dict, ref: dict) -> float:
    """max over leaves of max|a - ref| / max|ref|."""
    return max(float(np.max(np.abs(a[k].reshape(r.shape) - r)) / max(np.max(np.abs(r)), 1e-30))
               for k, r in ref.items())


def agreement(w: Workload) -> dict[str, float | str]:
    """Each contender's max relative difference to the naive vmap clipped sum (or its error message)."""
    sums = clipped_sums(w)
    ref = sums["naive vmap(grad) clip"]
    return {name: s if isinstance(s, str) else max_rel_diff(s, ref) for name, s in sums.items()}


# ---------------------------------------------------------------- time and memory

def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_steps(steps: dict, rounds: int) -> dict[str, float]:
    """Median seconds per step over interleaved rounds, after two warm-up calls each (a contender whose
    warm-up raises is left out)."""
    steps = {name: fn for name, fn in steps.items() if not isinstance(_or_error(lambda: (fn(), fn())), str)}
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            times[name].append(_timed(fn))
    return {name: statistics.median(ts) for name, ts in times.items()}


def step_peak(fn, repeats: int = 3) -> int:
    """Bytes the process's peak resident set rises above its resident set while `fn` runs `repeats` times
    (already compiled and warmed up): freed heap returned to the OS first (`malloc_trim`), then the kernel's
    high-water mark reset (`VmHWM`, by writing 5 to /proc/self/clear_refs), so the import, the compile and
    the warm-up are not in it. Exact, no sampling; the same for JAX and torch."""
    memory.release_memory()  # trims only: measure_memory turned the compiled-function budget off
    base = memory.rss_mb()
    memory.peak_rss_mb(reset=True)
    for _ in range(repeats):
        fn()
    return int((memory.peak_rss_mb() - base) * 2**20)


def breakdown(model: str, rounds: int = 7) -> dict[str, float]:
    """Where gradlab's DP-SGD step spends its time: median seconds of one batch gradient, the norms pass
    (`per_example_norms`), the clipped sum (norms and Σᵢ cᵢgᵢ in one pass) and the naive vmap clipped sum."""
    w = build(model)
    args = (w.loss_fn, w.params, w.xs, w.ys)
    fns = {"batch_grad": lambda: engine.batch_grad(*args),
           "per_example_norms": lambda: engine.per_example_norms(*args),
           "clipped_grad_sum": lambda: engine.clipped_grad_sum(*args, w.clip_norm),
           "naive vmap clipped sum": lambda: naive_jit(*args, w.clip_norm)}
    return time_steps({k: (lambda f: lambda: jax.block_until_ready(f()))(f) for k, f in fns.items()}, rounds)


naive_jit = eqx.filter_jit(naive_clipped_sum)


WORKLOADS = {"gpt": gpt_workload, "gpt-untied": lambda: gpt_workload(tied=False), "cnn": cnn_workload}


def build(model: str) -> Workload:
    return with_median_clip(WORKLOADS[model]())


def measure_memory(model: str, contender: str) -> dict:
    """In THIS process (a fresh one): build, compile and warm `contender` up, then
    - `process`: the peak resident set so far (Python, JAX and torch imported, both models built, the compile,
      two warm-up steps): what a fresh process needs;
    - `rss`: the step's own peak above the resident set before it (`step_peak`), steady state;
    - for JAX, `xla`: the temp + output bytes of XLA's buffer assignment for the compiled step (nothing runs).
    The compiled-function budget (`memory.MEMORY_BUDGET_MB`) is off: with torch imported the process passes
    it, and `release_memory` would drop the compiled step, so the measured steps would compile again."""
    memory.limit_malloc_arenas()
    memory.MEMORY_BUDGET_MB = 0
    w = build(model)
    steps = {**jax_steps(w), **torch_steps(w)}
    fn = steps[contender]
    fn(), fn()
    out = {"process": int(memory.peak_rss_mb() * 2**20), "rss": step_peak(fn)}
    if isinstance(fn, JaxStep):
        out["xla"] = fn.memory_analysis()
    return out


def memory_in_subprocess(model: str, contender: str) -> dict:
    """`measure_memory` in a fresh process; a JAX contender's imports no torch, so its "process" is JAX's own."""
    cmd = [sys.executable, "-m", "benchmarks.peers", "--memory", model, contender]
    jax_only = not any(k in contender for k in ("torch", "Opacus"))
    env = {**os.environ, **({"GRADLAB_PEERS_NO_TORCH": "1"} if jax_only else {})}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if r.returncode:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(model: str, rounds: int = 7, with_memory: bool = True) -> dict:
    w = build(model)
    agree = agreement(w)
    steps = {**jax_steps(w), **torch_steps(w)}
    med = time_steps(steps, rounds)
    mem = {name: memory_in_subprocess(model, name) for name in med} if with_memory else {}
    return dict(name=w.name, clip_norm=w.clip_norm, median=med, agreement=agree, memory=mem, rounds=rounds,
                load=os.getloadavg())


def _mb(b) -> str:
    return f"{b / 2**20:7.1f}" if b is not None else "      -"


def report(res: dict) -> str:
    med, mem = res["median"], res["memory"]
    lines = [f"{res['name']}: C = {res['clip_norm']:.3g} (median norm), sigma = {SIGMA}; median of "
             f"{res['rounds']} interleaved rounds; load average {res['load'][0]:.1f}",
             f"  {'contender':38s} {'ms/step':>8s} {'/ best plain':>12s} {'/ gradlab':>9s} {'step peak MB':>12s} "
             f"{'XLA MB':>7s} {'process MB':>10s} {'clipped sum: max rel diff vs naive vmap':>40s}"]
    for name, t in med.items():
        plain = med[PLAIN_TORCH] if "torch" in name or "Opacus" in name else min(med[PLAIN_JAX], med[PLAIN_MICRO])
        m = mem.get(name, {})
        diff = res["agreement"].get(name)
        lines.append(f"  {name:38s} {t * 1e3:8.1f} {t / plain:11.2f}x {t / med[OURS]:8.2f}x {_mb(m.get('rss')):>12s} "
                     f"{_mb(m.get('xla')):>7s} {_mb(m.get('process')):>10s} {'' if diff is None else f'{diff:.1e}':>40s}"
                     + (f"  memory: {m['error']}" if "error" in m else ""))
    lines += [f"  {name}: refused this model ({diff})" for name, diff in res["agreement"].items() if isinstance(diff, str)]
    return "\n".join(lines)


def check(tol: float = 1e-4) -> int:
    """Every installed peer's clipped sum equals the naive vmap sum (≤ `tol` relative) on small batches of
    both models. A peer that refuses a model (Opacus ghost on a tied head) is printed. Returns the exit status."""
    ok = True
    for name, w in small_workloads().items():
        agree = agreement(with_median_clip(w))
        print(name, {k: v if isinstance(v, str) else f"{v:.1e}" for k, v in agree.items()})
        ok &= all(v <= tol for v in agree.values() if not isinstance(v, str))  # a refusal is printed, not a diff
    print("agreement:", "OK" if ok else "FAILED", "" if HAS_TORCH and HAS_JAX_PRIVACY else
          "(some peers not installed: pip install -r requirements-bench.txt)")
    return 0 if ok else 1


def small_workloads() -> dict[str, Workload]:
    """Small versions of both models (seconds on a CPU): GPT tied and untied, the CNN on 6 images."""
    small = dict(vocab=32, d=16, layers=1, seq=8, batch=6)
    return {"gpt tied": gpt_workload(tied=True, **small), "gpt untied": gpt_workload(tied=False, **small),
            "cnn": cnn_workload(batch=6)}


def main(argv=None) -> int | None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--breakdown", action="store_true", help="time gradlab's parts (batch grad, norms, clipped sum)")
    ap.add_argument("--memory", nargs=2, metavar=("MODEL", "CONTENDER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory:
        print(json.dumps(measure_memory(*args.memory)))
        return None
    if args.check:
        return check()
    print(f"benchmarks.peers: jax {jax.__version__} on {jax.devices()[0].platform.upper()}"
          + (f", torch {torch.__version__} ({torch.get_num_threads()} threads)" if HAS_TORCH else "")
          + (f", jax-privacy {jax_privacy.__version__}" if HAS_JAX_PRIVACY else ""))
    for model in args.models:
        if args.breakdown:
            t = breakdown(model, args.rounds)
            print(f"{model}: " + ", ".join(f"{k} {v * 1e3:.1f} ms ({v / t['batch_grad']:.2f}x)" for k, v in t.items()))
            continue
        print(report(run(model, args.rounds, not args.no_memory)), flush=True)
    return None


if __name__ == "__main__":
    raise SystemExit(main())
