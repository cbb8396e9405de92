"""One experiment: a small frozen, hashable config, and the data + trained model it produces.

The config is the cache key of everything downstream and round-trips through the URL as plain
strings (`to_query` / `from_query`), so a shared link reproduces the exact numbers (seeded).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from gradlab import data as data_mod
from gradlab import losses
from gradlab.models import ModelSpec, build_model
from gradlab.train import TrainResult, train


@dataclasses.dataclass(frozen=True)
class Experiment:
    """Everything that determines the data and the trained checkpoints.

    Defaults show the point at first load and train in about a second on a 2-core CPU:
    digits, a one-hidden-layer MLP (64 units), 300 Adam steps.
    """

    dataset: str = "digits"
    model: str = "mlp"
    width: int = 64
    depth: int = 1
    activation: str = "relu"
    optimizer: str = "adam"
    lr: float = 0.01
    steps: int = 300
    batch_size: int = 128
    l2: float = 1e-4
    label_noise: float = 0.0
    seed: int = 0
    checkpoint_every: int = 50
    test_fraction: float = 0.2

    def replace(self, **changes) -> "Experiment":
        return dataclasses.replace(self, **changes)

    def to_query(self) -> dict[str, str]:
        """The fields that differ from the defaults, as URL query strings."""
        default = Experiment()
        return {
            f.name: str(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }

    @classmethod
    def from_query(cls, query: dict[str, str]) -> "Experiment":
        """Parse `to_query`'s output (unknown keys ignored). **Raises** ValueError on a bad value."""
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name in query:
                kind = type(getattr(cls(), f.name))
                try:
                    kwargs[f.name] = kind(query[f.name])
                except ValueError:
                    raise ValueError(f"URL parameter {f.name}={query[f.name]!r} is not a valid {kind.__name__}") from None
        return cls(**kwargs)

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(self.model, self.width, self.depth, self.activation)


@dataclasses.dataclass(frozen=True, eq=False)
class Fitted:
    """An experiment's data, loss and trained checkpoints."""

    experiment: Experiment
    data: data_mod.Dataset
    loss_fn: Callable
    run: TrainResult

    @property
    def model(self):
        return self.run.final


def load_data(exp: Experiment) -> data_mod.Dataset:
    """The experiment's dataset. **Raises** `DataError` for impossible settings."""
    return data_mod.load_dataset(exp.dataset, seed=exp.seed, label_noise=exp.label_noise, test_fraction=exp.test_fraction)


def init_model(exp: Experiment, data: data_mod.Dataset):
    """The untrained model for `exp` on `data`, initialized from `exp.seed`."""
    return build_model(exp.spec, data.n_features, data.n_classes, key=jax.random.key(exp.seed), image_shape=data.image_shape)


def fit(exp: Experiment, data: data_mod.Dataset | None = None, progress=None) -> Fitted:
    """Load data, build the model, train with checkpoints.

    **Arguments** `exp`; `data` to train on instead of `load_data(exp)` (an uploaded CSV);
    `progress(step, steps)` called after each checkpoint.

    **Raises** `DataError` / `TrainingError` (both ValueError) with a message that says what to change.
    """
    data = data if data is not None else load_data(exp)
    loss_fn = losses.loss_for(data.task)
    run = train(
        init_model(exp, data), loss_fn, data.x_train, data.y_train,
        optimizer=exp.optimizer, lr=exp.lr, steps=exp.steps, batch_size=exp.batch_size,
        l2=exp.l2, seed=exp.seed, checkpoint_every=exp.checkpoint_every, progress=progress,
    )
    return Fitted(exp, data, loss_fn, run)
