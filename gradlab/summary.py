"""Per-example summaries of a trained experiment at one checkpoint, as NumPy arrays for the pages."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from gradlab import engine, losses
from gradlab.experiment import Fitted
from gradlab.metrics import gradient_noise_scale


@dataclasses.dataclass(frozen=True, eq=False)
class NormSummary:
    """Training-set per-example quantities at one checkpoint.

    - `norms (N,)`: global L2 norm of each per-example gradient.
    - `layer_norms {leaf name: (N,)}`: the same per parameter leaf.
    - `losses (N,)`, `predictions (N,)`: per-example loss and predicted class / value.
    - `noise_scale`: B_simple = tr(Σ)/‖G‖² in examples (McCandlish et al. 2018).
    - `step`: the training step of the checkpoint; `num_params`: P.
    """

    norms: np.ndarray
    layer_norms: dict[str, np.ndarray]
    losses: np.ndarray
    predictions: np.ndarray
    noise_scale: float
    step: int
    num_params: int


def norm_summary(f: Fitted, checkpoint: int = -1, *, chunk_size: int | None = None) -> NormSummary:
    """Per-example gradient norms (global and per leaf), losses, predictions and B_simple.

    **Arguments** `f`: a fitted experiment; `checkpoint`: index into `f.run.checkpoints`.

    **Returns** a `NormSummary` (streamed: never holds the N x P matrix).
    """
    model = f.run.checkpoints[checkpoint]
    d = f.data
    xs, ys = jnp.asarray(d.x_train), jnp.asarray(d.y_train)
    layer = engine.per_example_layer_norms(f.loss_fn, model, xs, ys, chunk_size=chunk_size)
    sq = sum(np.square(np.asarray(v, np.float64)) for v in layer.values())
    # the mean gradient streamed over the engine's chunks (one vmap over every example would hold all
    # their activations: gigabytes for a CNN on a few thousand 28×28 images)
    g_mean = engine.weighted_grads(f.loss_fn, model, xs, ys, jnp.full((len(d.y_train), 1), 1.0 / len(d.y_train)),
                                   chunk_size=chunk_size)
    g_sq = float(sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(g_mean)))
    if f.experiment.is_own:  # a user's params: predictions come from its own predict_fn (or the loss)
        per_loss, predictions = losses.per_example_losses(f.loss_fn, model, xs, ys), f.predict(model, xs)
    else:
        per_loss, predictions = losses.losses_and_predictions(f.loss_fn, model, xs, ys, d.task)
    return NormSummary(
        norms=np.sqrt(sq).astype(np.float32),
        layer_norms={k: np.asarray(v) for k, v in layer.items()},
        losses=np.asarray(per_loss),
        predictions=np.asarray(predictions),
        noise_scale=gradient_noise_scale(sq, g_sq),
        step=f.run.steps[checkpoint],
        num_params=engine.num_params(model),
    )
