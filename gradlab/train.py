"""Training with optax: minibatch steps compiled as `lax.scan` segments, a checkpoint after each.

Checkpoints (the model at step 0, k, 2k, …, steps) feed the pages: norms at a chosen checkpoint,
TracIn's sum over checkpoints. The objective is `mean_i loss_i + l2/2 ‖θ‖²`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gradlab import losses, privacy, xla
from gradlab.params import as_params

OPTIMIZERS = {"adam": "Adam", "sgd": "SGD with momentum 0.9",
              "adam_linear": "Adam, its learning rate decayed linearly to 0 over the run",
              "adam_warmup": "Adam (β₂ = 0.99), its learning rate raised linearly over the first 10% of the run, "
                             "then decayed linearly to 0"}
#: How `train` draws its minibatches (`minibatch_order`).
ORDERS = {"random": "each step draws its batch at random, independently of the others",
          "epoch": "a new random order of the training examples each epoch, every example once per epoch"}

#: The share of the run `adam_warmup` spends raising its learning rate, and its β₂ (Adam's default 0.999 averages the
#: squared gradients over ~1,000 steps, longer than a 300-step run; on SimpleCNN 0.99 measured the same within noise).
WARMUP_FRACTION = 0.1
WARMUP_B2 = 0.99


class TrainingError(ValueError):
    """Training cannot go on (a NaN or infinite loss); the message says what to change."""


@dataclasses.dataclass(frozen=True, eq=False)
class TrainResult:
    """Checkpoints of one run.

    - `checkpoints`: models at `steps[i]` (step 0 is the initialization, the last is the end).
    - `steps (C,)` int; `losses (S,)` the minibatch objective at every step.
    - `lrs (C,)`: the learning rate in force at each checkpoint (TracIn weights).
    """

    checkpoints: tuple
    steps: tuple[int, ...]
    losses: np.ndarray
    lrs: tuple[float, ...]

    @property
    def final(self):
        return self.checkpoints[-1]


def adam_linear(learning_rate, total_steps) -> optax.GradientTransformation:
    """Adam whose step size falls linearly from `learning_rate` at step 0 to 0 at `total_steps`
    (`optax.linear_schedule`'s shape): on seed 003's SimpleCNN it reaches a given accuracy in fewer
    steps than a constant rate (benchmarks/RESULTS.md, "SimpleCNN's default recipe")."""
    return optax.chain(optax.scale_by_adam(),
                       optax.scale_by_schedule(lambda t: -learning_rate * jnp.maximum(1.0 - t / total_steps, 0.0)))


def warmup_linear(step, total_steps, warmup_fraction: float = WARMUP_FRACTION) -> jax.Array:
    """The factor on the peak learning rate at `step` (from 0) of a run of `total_steps` with a linear warm-up over
    its first w = max(1, round(`warmup_fraction` · T)) steps and a linear decay to 0 after: (step + 1) / w, then
    (T − step) / (T − w) (the "linear schedule with warm-up" of Goyal et al. 2017 and Hugging Face's
    `get_linear_schedule_with_warmup`), clipped to [0, 1]. Works on numbers and traced arrays."""
    warmup = jnp.maximum(jnp.round(warmup_fraction * total_steps), 1.0)
    rise, fall = (step + 1) / warmup, (total_steps - step) / jnp.maximum(total_steps - warmup, 1.0)
    return jnp.clip(jnp.minimum(rise, fall), 0.0, 1.0)


def adam_warmup(learning_rate, total_steps, warmup_fraction=WARMUP_FRACTION) -> optax.GradientTransformation:
    """Adam with β₂ = `WARMUP_B2` whose step size rises linearly to `learning_rate` over the first tenth of
    `total_steps` and falls linearly to 0 at `total_steps` (`warmup_linear`). The warm-up lets seed 003's SimpleCNN
    take a higher peak rate than `adam_linear`: 300 steps of 32 at 0.005 average 85.4% test accuracy over ten seeds,
    against 84.7% for `adam_linear`'s 500 steps of 16 at 0.0015 (benchmarks/RESULTS.md, "SimpleCNN over ten seeds";
    its recipe since adds an epoch order and label smoothing, "SimpleCNN on every seed")."""
    return optax.chain(optax.scale_by_adam(b2=WARMUP_B2), optax.scale_by_schedule(
        lambda t: -learning_rate * warmup_linear(t, total_steps, warmup_fraction)))


@functools.cache
def _optimizer(name: str) -> optax.GradientTransformation:
    """One optax object per name, its learning rate (and a schedule's length) a state entry
    (`inject_hyperparams`): the jitted training steps take `update` as a static argument, so they
    compile once per name and shapes, not once per run, learning rate or number of steps."""
    if name == "adam":
        return optax.inject_hyperparams(optax.adam)(learning_rate=1.0)
    if name == "sgd":
        return optax.inject_hyperparams(optax.sgd)(learning_rate=1.0, momentum=0.9)
    if name == "adam_linear":
        return optax.inject_hyperparams(adam_linear)(learning_rate=1.0, total_steps=1.0)
    if name == "adam_warmup":
        return optax.inject_hyperparams(adam_warmup)(learning_rate=1.0, total_steps=1.0,
                                                     warmup_fraction=WARMUP_FRACTION)
    raise TrainingError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def make_optimizer(name: str | optax.GradientTransformation, lr: float, steps: int | None = None) -> optax.GradientTransformation:
    """optax optimizer by name: `"adam"`, `"sgd"` (momentum 0.9), `"adam_linear"` (Adam, the rate
    decayed linearly to 0 over `steps`) or `"adam_warmup"` (Adam with β₂ = 0.99, a linear warm-up over the first
    tenth of `steps`, then the linear decay) with (peak) learning rate `lr`.

    An optax `GradientTransformation` in place of the name is returned as it is (`lr` and `steps` unused): a
    served model's own optimizer (`gradlab.own`).

    **Raises** `TrainingError` for an unknown name, a learning rate that is not a positive number,
    or `"adam_linear"` / `"adam_warmup"` without a number of steps ≥ 1.
    """
    if isinstance(name, optax.GradientTransformation):
        return name
    if not (np.isfinite(lr) and lr > 0):
        raise TrainingError(f"the learning rate must be a positive number, got {lr:g}")
    base = _optimizer(name)
    if name in ("adam_linear", "adam_warmup") and not (steps and steps >= 1):
        raise TrainingError(f"{name} decays over the run: it needs the number of steps (≥ 1)")

    def init(params):
        state = base.init(params)
        state.hyperparams["learning_rate"] = jnp.asarray(lr, jnp.float32)
        if "total_steps" in state.hyperparams:
            state.hyperparams["total_steps"] = jnp.asarray(steps, jnp.float32)
        return state

    return optax.GradientTransformation(init, base.update)


def objective(loss_fn, params, xs, ys, l2: float):
    """`mean_i loss(params, x_i, y_i) + l2/2 ‖θ‖²` over the floating-point leaves of params."""
    losses = jax.vmap(loss_fn, in_axes=(None, 0, 0))(params, xs, ys)
    sq = sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(eqx.filter(params, eqx.is_inexact_array)))
    return losses.mean() + 0.5 * l2 * sq


@eqx.filter_jit
def _segment(loss_fn, params, opt_state, avg, update, xs, ys, batches, batch_size, l2, decay):
    """Run len(batches) minibatch steps with lax.scan; returns (params, opt_state, avg, losses).

    `batches`: one PRNG key per step (a minibatch drawn without replacement from N) or one row of example indices
    per step `(k, batch_size)`. `avg`: None, or `(ema, t)` an exponential moving average of the parameters with
    `decay` (zero-initialized, `t` steps so far; `_averaged` debiases it)."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    n = xs.shape[0]

    def step(carry, batch):
        d, s, a = carry
        idx = batch if jnp.issubdtype(batch.dtype, jnp.integer) else jax.random.choice(batch, n, (batch_size,), replace=False)
        value, g = jax.value_and_grad(lambda d: objective(loss_fn, eqx.combine(d, static), xs[idx], ys[idx], l2))(d)
        updates, s = update(g, s, d)
        d = optax.apply_updates(d, updates)
        if a is not None:
            a = (jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, a[0], d), a[1] + 1)
        return (d, s, a), value

    (diff, opt_state, avg), losses = jax.lax.scan(step, (diff, opt_state, avg), batches)
    return eqx.combine(diff, static), opt_state, avg, losses


@eqx.filter_jit
def _averaged(params, avg, decay):
    """The debiased moving average `ema / (1 − decay^t)` as a model like `params` (Adam's bias correction;
    `optax.ema(debias=True)`): at t = 1 it is the first step's parameters, not a mix with zeros."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    ema, t = avg
    return eqx.combine(jax.tree.map(lambda e: e / (1 - decay ** t), ema), static)


def minibatch_order(n: int, steps: int, batch_size: int, seed: int, order: str = "random"):
    """Each step's minibatch: `"random"` → `(steps,)` PRNG keys, each step drawing `batch_size` of the N examples
    without replacement independently of the other steps (`_segment`); `"epoch"` → `(steps, batch_size)` int32
    indices from a new random permutation of the N examples per epoch, cut into consecutive batches (every example
    once per epoch; a batch that spans two epochs takes the end of one and the start of the next, and may hold an
    example twice), as PyTorch's `DataLoader(shuffle=True)` without its short last batch. `batch_size` ≤ N.
    **Raises** `TrainingError` for another order."""
    if order == "random":
        return jax.random.split(jax.random.key(seed), max(steps, 1))
    if order != "epoch":
        raise TrainingError(f"unknown minibatch order {order!r}; choose one of {', '.join(ORDERS)}")
    rng = np.random.default_rng(seed)
    epochs = -(-max(steps, 1) * batch_size // n)
    flat = np.concatenate([rng.permutation(n) for _ in range(epochs)])
    return flat[: max(steps, 1) * batch_size].reshape(max(steps, 1), batch_size).astype(np.int32)


def _check_run(xs, steps: int, checkpoint_every: int, l2: float) -> int:
    """N, the number of training examples. **Raises** `TrainingError` for a run that cannot start."""
    n = int(xs.shape[0])
    if n == 0:
        raise TrainingError("no training examples: pick a larger dataset or a smaller test fraction")
    if steps < 0 or checkpoint_every < 1:
        raise TrainingError(f"steps must be ≥ 0 and checkpoint_every ≥ 1, got {steps} and {checkpoint_every}")
    if l2 < 0:
        raise TrainingError(f"the L2 penalty must be ≥ 0, got {l2:g}")
    return n


def train(
    model,
    loss_fn: Callable,
    xs,
    ys,
    *,
    optimizer: str | optax.GradientTransformation = "adam",
    lr: float = 1e-2,
    steps: int = 300,
    batch_size: int = 128,
    l2: float = 0.0,
    seed: int = 0,
    checkpoint_every: int = 50,
    order: str = "random",
    ema: float = 0.0,
    label_smoothing: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
) -> TrainResult:
    """Train `model` on `(xs, ys)` with an optax optimizer, keeping checkpoints.

    **Arguments**
    - `loss_fn(model, x, y)`: single-example loss; `xs (N, D)`, `ys (N,)`.
    - `optimizer`: `"adam"` | `"sgd"` | `"adam_linear"` | `"adam_warmup"`, or an optax transformation (`lr` unused); `lr` > 0; `steps` ≥ 0 minibatch steps of `batch_size`
      examples drawn without replacement (the full set when batch_size ≥ N).
    - `l2`: L2 penalty λ in `mean loss + λ/2 ‖θ‖²`.
    - `checkpoint_every`: steps between checkpoints; `progress(step, steps)` is called after each.
    - `order`: how minibatches are drawn, `"random"` (each step independently) or `"epoch"` (a new permutation of
      the examples per epoch); see `minibatch_order`.
    - `ema`: 0 (off), or a decay in (0, 1): every checkpoint after step 0 is then the exponential moving average of
      the parameters over the steps so far, debiased (Polyak averaging with exponential weights: Polyak & Juditsky
      1992; Izmailov et al. 2018, arXiv:1803.05407), not the last step's parameters; the optimizer itself goes on
      from the last step's.
    - `label_smoothing`: ε in [0, 1): minimize `losses.smoothed_cross_entropy` in place of `loss_fn`, which must then
      be `losses.cross_entropy` (the checkpoints are explored with it; `TrainResult.losses` are the smoothed ones).

    **Returns** a `TrainResult`.

    **Raises** `TrainingError` if the loss becomes NaN/inf (with the step and what to change) or a
    setting is impossible (no examples, lr ≤ 0, an unknown order, a decay outside [0, 1), label smoothing outside
    [0, 1) or of a loss other than `losses.cross_entropy`).
    """
    n = _check_run(xs, steps, checkpoint_every, l2)
    opt = make_optimizer(optimizer, lr, max(steps, 1))
    params = as_params(model)
    opt_state = opt.init(eqx.filter(params, eqx.is_inexact_array))
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    batch_size = int(min(batch_size, n))
    batches = minibatch_order(n, steps, batch_size, seed, order)
    if not 0.0 <= ema < 1.0:
        raise TrainingError(f"the moving average's decay must be in [0, 1) (0: off), got {ema:g}")
    decay = jnp.float32(ema)
    objective_loss = _training_loss(loss_fn, label_smoothing)
    avg = (jax.tree.map(jnp.zeros_like, eqx.filter(params, eqx.is_inexact_array)), jnp.int32(0)) if ema else None
    checkpoints, at, losses, done = [params], [0], [], 0
    lrs = [_lr_in_use(opt_state, lr)]  # TracIn weights: the learning rate the optimizer used at each checkpoint
    while done < steps:
        k = min(checkpoint_every, steps - done)
        params, opt_state, avg, seg = _segment(objective_loss, params, opt_state, avg, opt.update, xs, ys,
                                               batches[done : done + k], batch_size, jnp.float32(l2), decay)
        seg = np.asarray(seg)
        if not np.all(np.isfinite(seg)):
            bad = done + int(np.argmin(np.isfinite(seg))) + 1
            raise TrainingError(
                f"the training loss became {seg[~np.isfinite(seg)][0]} at step {bad}: the run diverged. "
                + (f"Lower the learning rate (now {lr:g}) or switch to Adam." if np.isfinite(lr)
                   else "Lower your optimizer's learning rate.")
            )
        done += k
        losses.append(seg)
        checkpoints.append(params if avg is None else _averaged(params, avg, decay))
        at.append(done)
        lrs.append(_lr_in_use(opt_state, lr))
        if progress is not None:
            progress(done, steps)
    return TrainResult(
        checkpoints=tuple(checkpoints),
        steps=tuple(at),
        losses=np.concatenate(losses) if losses else np.zeros(0),
        lrs=tuple(lrs),
    )


def _training_loss(loss_fn, label_smoothing: float):
    """The loss `train` minimizes: `loss_fn`, or with ε > 0 `losses.smoothed_cross_entropy` at ε (a
    `jax.tree_util.Partial`: ε is traced, so another ε compiles nothing new). **Raises** `TrainingError` (see `train`)."""
    if not 0.0 <= label_smoothing < 1.0:
        raise TrainingError(f"label smoothing must be in [0, 1) (0: off), got {label_smoothing:g}")
    if not label_smoothing:
        return loss_fn
    if loss_fn is not losses.cross_entropy:
        raise TrainingError("label smoothing applies to the cross-entropy of a classifier; set it to 0 for this loss")
    return jax.tree_util.Partial(losses.smoothed_cross_entropy, smoothing=jnp.float32(label_smoothing))


def _lr_in_use(opt_state, default: float) -> float:
    """The learning rate in the optimizer state (`inject_hyperparams`; `adam_linear`'s and `adam_warmup`'s at the
    state's step, the one its next update takes), else `default`."""
    hyper = getattr(opt_state, "hyperparams", None)
    if not hyper or "learning_rate" not in hyper:
        return float(default)
    lr = float(hyper["learning_rate"])
    if "warmup_fraction" in hyper:
        lr *= float(warmup_linear(float(opt_state.count), float(hyper["total_steps"]), float(hyper["warmup_fraction"])))
    elif "total_steps" in hyper:
        lr *= max(1.0 - float(opt_state.count) / float(hyper["total_steps"]), 0.0)
    return lr


# ---------------------------------------------------------------- DP-SGD (Abadi et al. 2016)


@dataclasses.dataclass(frozen=True, eq=False)
class DPTrainResult:
    """Checkpoints of one DP-SGD run and the privacy spent so far at each.

    - `checkpoints`, `steps (C,)`: as `TrainResult`.
    - `losses (S,)`: mean loss over each step's Poisson batch (before the update).
    - `batch_sizes (S,)` int: how many examples Poisson sampling drew at each step.
    - `clipped_fraction (S,)`: share of the batch whose gradient norm exceeded C.
    - `epsilons (C,)`: ε spent after `steps[i]` steps at `delta`, from `accountant` (inf when σ = 0).
    - `overflow_steps`: steps whose batch overflowed the fixed buffer (examples dropped; ~never).
    """

    checkpoints: tuple
    steps: tuple[int, ...]
    losses: np.ndarray
    batch_sizes: np.ndarray
    clipped_fraction: np.ndarray
    epsilons: np.ndarray
    sample_rate: float
    noise_multiplier: float
    clip_norm: float
    delta: float
    accountant: str
    buffer_size: int
    overflow_steps: int

    @property
    def final(self):
        return self.checkpoints[-1]


def dp_buffer_size(n: int, sample_rate: float) -> int:
    """Fixed size M of the padded batch buffer for Poisson sampling with rate q from N examples.

    M = min(N, ⌈qN + 7·√(qN(1−q))⌉ + 8): the Binomial(N, q) batch size exceeds it with probability
    below 1e-11 per step, so the jitted step has one shape while the batch size varies.
    """
    mean = n * sample_rate
    return int(min(n, math.ceil(mean + 7 * math.sqrt(mean * (1 - sample_rate))) + 8))


def poisson_sample(key, n: int, sample_rate, buffer_size: int):
    """One Poisson-sampled batch: each of the N examples joins independently with probability q.

    **Returns** `(idx (M,) int32, mask (M,) bool, count)`: the first `count` entries of `idx` are
    the selected examples (in increasing order), the rest are padding (`mask` False). If more than
    M examples are drawn, the extra ones are dropped (see `dp_buffer_size`).
    """
    chosen = jax.random.uniform(key, (n,)) < sample_rate
    count = jnp.sum(chosen)
    idx = jnp.nonzero(chosen, size=buffer_size, fill_value=0)[0]
    return idx.astype(jnp.int32), jnp.arange(buffer_size) < count, count


def _dp_keys(seed: int, steps: int):
    """Per-step keys of a DP-SGD run: `(sampling key, noise key)` pairs, shape (steps, 2)."""
    keys = jax.random.split(jax.random.key(seed), max(steps, 1))
    return jax.vmap(lambda k: jax.random.split(k, 2))(keys)


def dp_sgd_batches(n: int, sample_rate: float, steps: int, seed: int = 0) -> list[np.ndarray]:
    """The indices `train_dp_sgd(…, seed=seed)` samples at each step (for tests and inspection)."""
    m = dp_buffer_size(n, sample_rate)
    out = []
    for k in _dp_keys(seed, steps)[:steps]:
        idx, mask, _ = poisson_sample(k[0], n, sample_rate, m)
        out.append(np.asarray(idx)[np.asarray(mask)])
    return out


@xla.jit
def _dp_segment(loss_fn, params, opt_state, update, xs, ys, keys, q, clip_norm, sigma, l2, buffer_size, privatize):
    """len(keys) DP-SGD steps with lax.scan: Poisson batch → `privacy.dp_sgd_gradient` → + λθ → optax.

    The padded batch's mask is the per-example weight of the privatized sum, so padding counts for
    nothing; the divisor is the expected batch size qN (public, as the accountant assumes).
    """
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    n = xs.shape[0]

    def step(carry, key):
        d, s = carry
        idx, mask, count = poisson_sample(key[0], n, q, buffer_size)
        m = mask.astype(jnp.float32)
        g, losses, norms = privacy.dp_sgd_gradient(
            loss_fn, eqx.combine(d, static), xs[idx], ys[idx], key[1], clip_norm=clip_norm, noise_multiplier=sigma,
            batch_size=q * n, weights=m, privatize=privatize)
        n_clipped = jnp.sum(m * (norms > clip_norm))
        grad = jax.tree.map(lambda a, p: a + l2 * p, g, d)
        updates, s = update(grad, s, d)
        b = jnp.maximum(count, 1)
        return (optax.apply_updates(d, updates), s), (jnp.sum(losses * m) / b, count, n_clipped / b)

    (diff, opt_state), (losses, counts, clipped) = jax.lax.scan(step, (diff, opt_state), keys)
    return eqx.combine(diff, static), opt_state, losses, counts, clipped


def train_dp_sgd(
    model,
    loss_fn: Callable,
    xs,
    ys,
    *,
    sample_rate: float,
    noise_multiplier: float,
    clip_norm: float,
    optimizer: str | optax.GradientTransformation = "sgd",
    lr: float = 0.1,
    steps: int = 300,
    l2: float = 0.0,
    seed: int = 0,
    checkpoint_every: int = 50,
    delta: float = 1e-5,
    accountant: str = "rdp",
    progress: Callable[[int, int], None] | None = None,
    privatize: privacy.Privatize = privacy.noisy_clipped_sum,
) -> DPTrainResult:
    """Train with DP-SGD (Abadi et al. 2016, Algorithm 1) with any optax optimizer, keeping checkpoints.

    Each step: Poisson-sample a batch (each example joins with probability q, the sampling the
    accountant assumes; a fixed-size padded buffer with a mask keeps one compiled shape), compute
    the sum of per-example gradients each clipped to L2 norm ≤ C (ghost clipping: per-layer-rule
    norms, then one weighted backward pass), add N(0, σ²C² I), divide by the expected batch size
    qN (`privacy.dp_sgd_gradient`), add the (data-independent) L2 term λθ, and apply the optimizer. With σ = 0 and
    C = inf it is plain minibatch training on the same sampled batches.

    **Arguments**
    - `model`, `loss_fn(model, x, y)`, `xs (N, D)`, `ys (N,)`: as `train`.
    - `sample_rate`: q ∈ (0, 1]; `noise_multiplier`: σ ≥ 0; `clip_norm`: C > 0 (inf: no clipping).
    - `optimizer`: `"adam"`, `"sgd"` (momentum 0.9) or any `optax.GradientTransformation`
      (then `lr` is ignored); `lr` > 0.
    - `steps` ≥ 0; `l2` ≥ 0; `seed` for sampling, noise; `checkpoint_every` ≥ 1.
    - `delta` δ ∈ (0, 1) and `accountant` (`"rdp"` | `"pld"`) for the ε reported at each checkpoint.
    - `progress(step, steps)`: called after each checkpoint.
    - `privatize`: what turns each batch into its noisy clipped sum (`privacy.Privatize`); the
      default `privacy.noisy_clipped_sum` is correct DP-SGD. The audit passes its planted bugs
      (`gradlab.audit.BUGS`) here to check that it catches them.

    **Returns** a `DPTrainResult`.

    **Raises** `ValueError` (`TrainingError`) for C ≤ 0, σ < 0, q ∉ (0, 1], δ ∉ (0, 1), impossible
    settings, or a diverging run (NaN/inf loss), with what to change.
    """
    try:
        q = privacy.check_sample_rate(sample_rate)
        sigma = privacy.check_noise_multiplier(noise_multiplier)
        c = privacy.check_clip_norm(clip_norm)
        delta = privacy.check_delta(delta)
        privacy.check_accountant(accountant)
    except ValueError as err:
        raise TrainingError(str(err)) from None
    n = _check_run(xs, steps, checkpoint_every, l2)
    opt = make_optimizer(optimizer, lr, max(steps, 1))
    params = as_params(model)
    opt_state = opt.init(eqx.filter(params, eqx.is_inexact_array))
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    m = dp_buffer_size(n, q)
    keys = _dp_keys(seed, steps)
    scalars = tuple(jnp.float32(v) for v in (q, c, sigma, l2))
    checkpoints, at, losses, counts, clipped, done = [params], [0], [], [], [], 0
    while done < steps:
        k = min(checkpoint_every, steps - done)
        params, opt_state, seg, cnt, clp = _dp_segment(loss_fn, params, opt_state, opt.update, xs, ys, keys[done : done + k], *scalars, m, privatize)
        seg = np.asarray(seg)
        params_ok = all(bool(jnp.all(jnp.isfinite(a))) for a in jax.tree.leaves(eqx.filter(params, eqx.is_inexact_array)))
        if not (np.all(np.isfinite(seg)) and params_ok):
            bad = done + (int(np.argmin(np.isfinite(seg))) + 1 if not np.all(np.isfinite(seg)) else k)
            raise TrainingError(
                f"the DP-SGD training loss became NaN or infinite by step {bad}: the run diverged. "
                f"Lower the learning rate (now {lr:g}), the noise σ or the clipping norm C, or switch to Adam."
            )
        done += k
        losses.append(seg)
        counts.append(np.asarray(cnt))
        clipped.append(np.asarray(clp))
        checkpoints.append(params)
        at.append(done)
        if progress is not None:
            progress(done, steps)
    counts = np.concatenate(counts) if counts else np.zeros(0, int)
    epsilons = privacy.dp_sgd_epsilons(sample_rate=q, noise_multiplier=sigma, steps=at, delta=delta, accountant=accountant)
    return DPTrainResult(
        checkpoints=tuple(checkpoints),
        steps=tuple(at),
        losses=np.concatenate(losses) if losses else np.zeros(0),
        batch_sizes=counts,
        clipped_fraction=np.concatenate(clipped) if clipped else np.zeros(0),
        epsilons=epsilons,
        sample_rate=q,
        noise_multiplier=sigma,
        clip_norm=c,
        delta=delta,
        accountant=accountant,
        buffer_size=m,
        overflow_steps=int(np.sum(counts > m)),
    )
