"""Per-example summaries of a trained experiment at one checkpoint, as NumPy arrays for the pages."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from gradlab import costs, engine, losses
from gradlab.experiment import Fitted
from gradlab.metrics import gradient_noise_scale

#: Subset sizes the summary may take when the whole training set would not fit the work budget (`summary_size`).
SUBSET_SIZES = (250, 500, 1000, 2000, 4000)


@dataclasses.dataclass(frozen=True, eq=False)
class NormSummary:
    """Training-set per-example quantities at one checkpoint, over the examples `index` (all of them, or a
    fixed random subset when the whole set would not fit the work budget: `summary_size`).

    - `index (n,)`: the training-set rows summarized, ascending; every array below is aligned with it.
    - `norms (n,)`: global L2 norm of each per-example gradient.
    - `layer_norms {leaf name: (n,)}`: the same per parameter leaf.
    - `losses (n,)`, `predictions (n,)`: per-example loss and predicted class / value.
    - `noise_scale`: B_simple = tr(Σ)/‖G‖² in examples, over these n (McCandlish et al. 2018).
    - `step`: the training step of the checkpoint; `num_params`: P; `n_train`: N, the training set's size.
    """

    index: np.ndarray
    norms: np.ndarray
    layer_norms: dict[str, np.ndarray]
    losses: np.ndarray
    predictions: np.ndarray
    noise_scale: float
    step: int
    num_params: int
    n_train: int

    @property
    def is_subset(self) -> bool:
        return len(self.index) < self.n_train


def summary_size(n: int, num_params: int, macs: int, training_seconds: float = 0.0, *, checkpoints: int = 1) -> int:
    """How many of the `n` training examples a summary covers (at each of `checkpoints` checkpoints: the record's
    trajectory takes one per checkpoint): all of them when `checkpoints` × `costs.summary_seconds` fits what
    `costs.WORK_BUDGET_SECONDS` leaves after the training's estimate (`training_seconds`: a shared link trains and
    summarizes before any button) and the page's own work (`costs.PAGE_SECONDS`), else the largest of `SUBSET_SIZES`
    that fits (at least the smallest: the page always shows some examples)."""
    left = costs.WORK_BUDGET_SECONDS - training_seconds - costs.PAGE_SECONDS
    fits = lambda m: checkpoints * costs.summary_seconds(num_params, m, macs) <= left  # noqa: E731
    if fits(n):
        return n
    smaller = [m for m in SUBSET_SIZES if m < n and fits(m)]
    return smaller[-1] if smaller else min(SUBSET_SIZES[0], n)


def subset(n: int, size: int) -> np.ndarray:
    """`size` of `range(n)`, ascending, drawn at random with a fixed seed (the same rows at every checkpoint, seed
    and visit); all of them when `size ≥ n`."""
    if size >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).choice(n, size, replace=False))


def norm_summary(f: Fitted, checkpoint: int = -1, *, size: int | None = None) -> NormSummary:
    """Per-example gradient norms (global and per leaf), losses, predictions and B_simple.

    **Arguments** `f`: a fitted experiment; `checkpoint`: index into `f.run.checkpoints`; `size`: how many training
    examples to cover (a fixed random subset, `subset`; None: all).

    **Returns** a `NormSummary` from one streamed pass (`engine.layer_norms_and_grad_sum`: never holds N x P).
    """
    model = f.run.checkpoints[checkpoint]
    d = f.data
    n_train = len(d.y_train)
    index = subset(n_train, n_train if size is None else size)
    xs, ys = jnp.asarray(d.x_train[index]), jnp.asarray(d.y_train[index])
    if f.source.brings_model:  # a user's params: predictions come from its own predict_fn (or the loss)
        layer, per_loss, total = engine.layer_norms_and_grad_sum(f.loss_fn, model, xs, ys)
        predictions = f.predict(model, xs)
    else:
        # gradlab's own loss (`losses.loss_for`), the predictions read from the engine pass's own forward pass
        layer, per_loss, total, predictions = engine.layer_norms_and_grad_sum(
            losses.with_prediction(d.task), model, xs, ys, has_aux=True)
    layer = {k: np.asarray(v) for k, v in layer.items()}
    sq = sum(np.square(v.astype(np.float64)) for v in layer.values())
    g_sq = sum(float(np.sum(np.square(np.asarray(a, np.float64)))) for a in jax.tree.leaves(total)) / len(index) ** 2
    return NormSummary(
        index=index,
        norms=np.sqrt(sq).astype(np.float32),
        layer_norms=layer,
        losses=np.asarray(per_loss),
        predictions=np.asarray(predictions),
        noise_scale=gradient_noise_scale(sq, g_sq),
        step=f.run.steps[checkpoint],
        num_params=engine.num_params(model),
        n_train=n_train,
    )
