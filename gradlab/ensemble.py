"""One ensemble of models trained on random subsets of a training set: the membership attack's shadow models
(`gradlab.membership`), the linear datamodeling score's retrains (`gradlab.influence.evaluation`) and, later, the
per-example record (memorization, LiRA) all come from `subset_ensemble`.

M models, model m trained on the examples where `masks[m]` is True (a fraction α of N, ½ by default: Ilyas et al.
2022's datamodels, Park et al. 2023's LDS, Carlini et al. 2022's shadows), either

- with the experiment's recipe, all M at once (`by_recipe`: `vmap` over subsets of one jitted `lax.scan`, the
  minibatches `gradlab.train.train` would draw), or
- by any training function, one model after another (`one_by_one`: DP-SGD, a served model's own loop).

The result keeps the masks `(M, N)` bool beside the models, so every per-model output (`Ensemble.outputs`: losses,
logits, correctness on all N or on test points) lines up with who was IN and who was OUT.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from gradlab import engine
from gradlab.train import make_optimizer, objective

PyTree = Any
#: `trainer(masks (M, N) bool) -> (models, static)`: a list of M models and None, or the M models' differentiable
#: leaves stacked on axis 0 and the static part they share.
Trainer = Callable[[np.ndarray], tuple[Any, Any]]


def random_masks(n: int, m: int, *, fraction: float = 0.5, seed: int = 0) -> np.ndarray:
    """M random subsets of ⌊fraction·N⌋ of N examples each (each drawn without repeats, `rng.choice`), as an
    `(M, N)` bool mask. **Raises** `ValueError` unless 0 < fraction < 1, M ≥ 1 and every subset has an example."""
    h = int(fraction * n)
    if not (0 < fraction < 1) or m < 1 or h < 1:
        raise ValueError(f"need M ≥ 1 subsets of a fraction in (0, 1) of N = {n}, got M = {m}, fraction = {fraction:g}")
    rng = np.random.default_rng(seed)
    masks = np.zeros((m, n), bool)
    for row in masks:
        row[rng.choice(n, h, replace=False)] = True
    return masks


def subsets_of(masks: np.ndarray) -> np.ndarray:
    """The `(M, H)` int indices (sorted rows) of masks that each hold H examples. **Raises** `ValueError` when the
    subsets' sizes differ."""
    masks = np.asarray(masks, bool)
    sizes = masks.sum(1)
    if len(set(sizes.tolist())) > 1:
        raise ValueError(f"the subsets hold different numbers of examples ({sizes.min()} to {sizes.max()})")
    return np.stack([np.flatnonzero(r) for r in masks]) if len(masks) else np.zeros((0, 0), int)


@dataclasses.dataclass(frozen=True, eq=False)
class Ensemble:
    """M models on random subsets: `masks (M, N)` bool (model m trained on the examples where `masks[m]`) and
    `models`: a list of M models (`static` None), or their differentiable leaves stacked on axis 0 (combine one
    with `static`: `model(m)`)."""

    masks: np.ndarray
    models: Any
    static: Any = None

    def __len__(self) -> int:
        return len(self.masks)

    @property
    def subsets(self) -> np.ndarray:
        """`(M, H)` int: each model's training examples (`subsets_of`)."""
        return subsets_of(self.masks)

    def model(self, m: int) -> PyTree:
        """Model m as a whole (for a stacked ensemble, its leaves combined with `static`)."""
        if self.static is None:
            return self.models[m]
        return eqx.combine(jax.tree.map(lambda a: a[m], self.models), self.static)

    def outputs(self, fn: Callable[[PyTree], Any]) -> np.ndarray:
        """`fn(model)` of every model stacked: `(M, ...)`. A stacked ensemble is vmapped (one compiled program)."""
        if self.static is None:
            return np.stack([np.asarray(fn(m)) for m in self.models])
        return np.asarray(jax.vmap(lambda d: fn(eqx.combine(d, self.static)))(self.models))


def subset_ensemble(trainer: Trainer, n: int, m: int, *, fraction: float = 0.5, seed: int = 0,
                    masks: np.ndarray | None = None) -> Ensemble:
    """THE ensemble of models on random subsets: draw M masks over N examples (`random_masks`, fraction α, `seed`)
    or take `masks (M, N)` as given (a caller's own design, e.g. complementary halves), train one model per mask with
    `trainer` (`by_recipe` or `one_by_one`), and return them with their masks.

    **Returns** an `Ensemble`. **Raises** `ValueError` for masks that are not `(M, N)` or as `random_masks`.
    """
    masks = random_masks(n, m, fraction=fraction, seed=seed) if masks is None else np.asarray(masks, bool)
    if masks.ndim != 2 or masks.shape[1] != n:
        raise ValueError(f"masks must be (M, {n}) bool, got shape {masks.shape}")
    models, static = trainer(masks)
    return Ensemble(masks, models, static)


def one_by_one(train_fn: Callable[[Any, Any, int], PyTree], xs, ys, seeds: Sequence[int], *,
               progress: Callable[[int, int], None] | None = None) -> Trainer:
    """A trainer that calls `train_fn(xs[mask], ys[mask], seeds[m]) -> model` for each mask in turn (any training
    procedure: DP-SGD, a served model's loop); `progress(done, total)` after each model."""
    xs, ys = np.asarray(xs), np.asarray(ys)

    def trainer(masks):
        models = []
        for i, mask in enumerate(masks):
            models.append(train_fn(xs[mask], ys[mask], int(seeds[i])))
            if progress is not None:
                progress(i + 1, len(masks))
        return models, None

    return trainer


@eqx.filter_jit
def _train_subsets(loss_fn, diff, static, update, state0, xs, ys, subsets, keys, batch_size, l2):
    h = subsets.shape[1]

    def run(subset, key_seq):
        def step(carry, key):
            d, s = carry
            idx = subset[jax.random.choice(key, h, (batch_size,), replace=False)]
            g = jax.grad(lambda d: objective(loss_fn, eqx.combine(d, static), xs[idx], ys[idx], l2))(d)
            updates, s = update(g, s, d)
            return (jax.tree.map(lambda a, u: a + u, d, updates), s), None

        (d, _), _ = jax.lax.scan(step, (diff, state0), key_seq)
        return d

    return jax.vmap(run)(subsets, keys)


def train_stacked(model, loss_fn, xs, ys, subsets: np.ndarray, *, optimizer: str = "adam", lr: float = 1e-2,
                  steps: int = 300, batch_size: int = 128, l2: float = 0.0, seed: int = 0) -> PyTree:
    """Train one model per row of `subsets (M, H)` int with the recipe of `gradlab.train.train` (same initialization
    `model`, optimizer, steps, minibatches of `batch_size` drawn without replacement from the subset, L2 λ), all M at
    once: `vmap` over subsets of a jitted `lax.scan` over steps. Subset m's model is the one
    `train(model, loss_fn, xs[S_m], ys[S_m], seed=seed + m, …)` returns.

    **Returns** the differentiable leaves of the M trained models stacked on a leading axis (combine with
    `eqx.partition(model, …)[1]`).
    """
    diff, static = eqx.partition(engine.as_params(model), eqx.is_inexact_array)
    opt = make_optimizer(optimizer, lr, max(steps, 1))
    subsets = jnp.asarray(subsets)
    # subset m draws its minibatches as `train(…, seed=seed + m)` would on the subset's examples
    keys = jnp.stack([jax.random.split(jax.random.key(seed + m), max(steps, 1))[:steps] for m in range(len(subsets))])
    bs = int(min(batch_size, subsets.shape[1]))
    return _train_subsets(loss_fn, diff, static, opt.update, opt.init(diff), jnp.asarray(xs), jnp.asarray(ys), subsets,
                          keys, bs, jnp.float32(l2))


def by_recipe(model, loss_fn, xs, ys, *, optimizer: str = "adam", lr: float = 1e-2, steps: int = 300,
              batch_size: int = 128, l2: float = 0.0, seed: int = 0) -> Trainer:
    """A trainer with the experiment's recipe from initialization `model`, all M models at once (`train_stacked`;
    the subsets must be of one size). The keyword arguments are `gradlab.experiment.Fitted.recipe`'s."""
    static = eqx.partition(engine.as_params(model), eqx.is_inexact_array)[1]

    def trainer(masks):
        return train_stacked(model, loss_fn, xs, ys, subsets_of(masks), optimizer=optimizer, lr=lr, steps=steps,
                             batch_size=batch_size, l2=l2, seed=seed), static

    return trainer


__all__ = ["Ensemble", "Trainer", "random_masks", "subsets_of", "subset_ensemble", "one_by_one", "by_recipe",
           "train_stacked"]
