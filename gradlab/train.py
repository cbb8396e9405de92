"""Training with optax: minibatch steps compiled as `lax.scan` segments, a checkpoint after each.

Checkpoints (the model at step 0, k, 2k, …, steps) feed the pages: norms at a chosen checkpoint,
TracIn's sum over checkpoints. The objective is `mean_i loss_i + l2/2 ‖θ‖²`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gradlab.engine import as_params

OPTIMIZERS = {"adam": "Adam", "sgd": "SGD with momentum 0.9"}


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


def make_optimizer(name: str, lr: float) -> optax.GradientTransformation:
    """optax optimizer by name: `"adam"` or `"sgd"` (momentum 0.9). **Raises** ValueError."""
    if not (np.isfinite(lr) and lr > 0):
        raise TrainingError(f"the learning rate must be a positive number, got {lr:g}")
    if name == "adam":
        return optax.adam(lr)
    if name == "sgd":
        return optax.sgd(lr, momentum=0.9)
    raise TrainingError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def objective(loss_fn, params, xs, ys, l2: float):
    """`mean_i loss(params, x_i, y_i) + l2/2 ‖θ‖²` over the floating-point leaves of params."""
    losses = jax.vmap(loss_fn, in_axes=(None, 0, 0))(params, xs, ys)
    sq = sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(eqx.filter(params, eqx.is_inexact_array)))
    return losses.mean() + 0.5 * l2 * sq


@eqx.filter_jit
def _segment(loss_fn, params, opt_state, optimizer, xs, ys, keys, batch_size, l2):
    """Run len(keys) minibatch steps with lax.scan; returns (params, opt_state, losses)."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    n = xs.shape[0]

    def step(carry, key):
        d, s = carry
        idx = jax.random.choice(key, n, (batch_size,), replace=False)
        value, g = jax.value_and_grad(lambda d: objective(loss_fn, eqx.combine(d, static), xs[idx], ys[idx], l2))(d)
        updates, s = optimizer.update(g, s, d)
        return (optax.apply_updates(d, updates), s), value

    (diff, opt_state), losses = jax.lax.scan(step, (diff, opt_state), keys)
    return eqx.combine(diff, static), opt_state, losses


def train(
    model,
    loss_fn: Callable,
    xs,
    ys,
    *,
    optimizer: str = "adam",
    lr: float = 1e-2,
    steps: int = 300,
    batch_size: int = 128,
    l2: float = 0.0,
    seed: int = 0,
    checkpoint_every: int = 50,
    progress: Callable[[int, int], None] | None = None,
) -> TrainResult:
    """Train `model` on `(xs, ys)` with an optax optimizer, keeping checkpoints.

    **Arguments**
    - `loss_fn(model, x, y)`: single-example loss; `xs (N, D)`, `ys (N,)`.
    - `optimizer`: `"adam"` | `"sgd"`; `lr` > 0; `steps` ≥ 0 minibatch steps of `batch_size`
      examples drawn without replacement (the full set when batch_size ≥ N).
    - `l2`: L2 penalty λ in `mean loss + λ/2 ‖θ‖²`.
    - `checkpoint_every`: steps between checkpoints; `progress(step, steps)` is called after each.

    **Returns** a `TrainResult`.

    **Raises** `TrainingError` if the loss becomes NaN/inf (with the step and what to change) or a
    setting is impossible (no examples, lr ≤ 0).
    """
    n = int(xs.shape[0])
    if n == 0:
        raise TrainingError("no training examples: pick a larger dataset or a smaller test fraction")
    if steps < 0 or checkpoint_every < 1:
        raise TrainingError(f"steps must be ≥ 0 and checkpoint_every ≥ 1, got {steps} and {checkpoint_every}")
    if l2 < 0:
        raise TrainingError(f"the L2 penalty must be ≥ 0, got {l2:g}")
    opt = make_optimizer(optimizer, lr)
    params = as_params(model)
    opt_state = opt.init(eqx.filter(params, eqx.is_inexact_array))
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    batch_size = int(min(batch_size, n))
    keys = jax.random.split(jax.random.key(seed), max(steps, 1))
    checkpoints, at, losses, done = [params], [0], [], 0
    while done < steps:
        k = min(checkpoint_every, steps - done)
        params, opt_state, seg = _segment(loss_fn, params, opt_state, opt, xs, ys, keys[done : done + k], batch_size, float(l2))
        seg = np.asarray(seg)
        if not np.all(np.isfinite(seg)):
            bad = done + int(np.argmin(np.isfinite(seg))) + 1
            raise TrainingError(
                f"the training loss became {seg[~np.isfinite(seg)][0]} at step {bad}: the run diverged. "
                f"Lower the learning rate (now {lr:g}) or switch to Adam."
            )
        done += k
        losses.append(seg)
        checkpoints.append(params)
        at.append(done)
        if progress is not None:
            progress(done, steps)
    return TrainResult(
        checkpoints=tuple(checkpoints),
        steps=tuple(at),
        losses=np.concatenate(losses) if losses else np.zeros(0),
        lrs=tuple(float(lr) for _ in at),
    )
