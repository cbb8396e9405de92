"""The data `Source` protocol: where an experiment's examples (and, for a served model, its model) come from.

An experiment names its data by one string, `Experiment.dataset` (the URL's and the config's value): a bundled
name (`"digits"`), an uploaded CSV by the hash of its bytes (`"upload:3fa9…"`), the served model by its
fingerprint (`"own:1c0e…"`). The part before the first `:` is the source's *prefix*, its key in the registry
(`gradlab.sources.SOURCES`); `gradlab.sources.source_of(dataset)` gives the `Source` that serves it.

A source answers every question that used to be a test of the prefix: how to load the data, how to build and
train a model on it, whether gradlab's loop can train it again, whether results computed from it may go to the
disk store, and how an example (a row) is named. A new source subclasses `Source`, overrides what differs (at
least `load` and `label`), and gets one line in `SOURCES` (docs/extending.md, "How to add a data source").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from gradlab import losses
from gradlab.data import Dataset
from gradlab.models import build_model
from gradlab.params import num_params

if TYPE_CHECKING:  # annotations only: the experiment module imports this one
    from gradlab.experiment import Experiment
    from gradlab.train import TrainResult

#: The `Experiment` fields a source's `load` may read: the data of two experiments equal on these are equal
#: (a cache of loaded data is keyed on them, `data_key`).
DATA_FIELDS = ("dataset", "seed", "label_noise", "test_fraction")


class Source:
    """One source of data, bound to one `dataset` string (`name`). Subclass it and override what differs.

    Class attributes (what every page may ask without loading anything):

    - `label`: what the sidebar shows under the dataset choice (one line of plain text).
    - `persist`: whether results computed from it may be written to the disk store (False: someone's upload,
      a served model's code, which stay in the server's memory only).
    - `brings_model`: whether the source brings its own loss, trained params and checkpoints (a served model):
      gradlab's model and training controls then do not apply, and its forward pass is the user's own.
    - `needs_upload`: whether `load` needs the bytes a session uploaded (they are never in the config or URL).
    """

    label: str = ""
    persist: bool = True
    brings_model: bool = False
    needs_upload: bool = False

    def __init__(self, name: str):
        self.name = name  #: the complete `dataset` string, e.g. "digits", "upload:3fa9…"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    @property
    def prefix(self) -> str:
        """The registry key: `name` up to its first `:`."""
        return self.name.split(":", 1)[0]

    @classmethod
    def choices(cls, prefix: str) -> tuple[str, ...]:
        """The sidebar's dataset choices this registry entry offers (default: its prefix; none: not offered)."""
        return (prefix,)

    # ------------------------------------------------------------ data

    def load(self, exp: "Experiment", upload: dict | None = None) -> Dataset:
        """The experiment's `Dataset` (split, standardized, label noise injected from `exp.seed`).

        **Arguments** `exp`: reads only `DATA_FIELDS`; `upload`: `{"bytes", "label", "task"}` of the session's
        upload (sources with `needs_upload` only). **Raises** `DataError` with what to change."""
        raise NotImplementedError(f"{type(self).__name__}.load")

    def row_ids(self, data: Dataset, split: str = "train") -> tuple[str, np.ndarray]:
        """How each example is named where it came from, for titles, hovers and exports: `(row_label, ids (N,) int)`,
        e.g. `("CSV line", [2, 3, …])` or `("Fashion-MNIST index", …)`; by default what the loaded `Dataset` says
        (`Dataset.row_label`, `rows_train`/`rows_test`, else positions)."""
        rows = data.rows_train if split == "train" else data.rows_test
        n = len(data.y_train if split == "train" else data.y_test)
        return data.row_label, np.arange(n) if rows is None else np.asarray(rows)

    # ------------------------------------------------------------ model

    def init_model(self, exp: "Experiment", data: Dataset):
        """The untrained model for `exp` on `data`, initialized from `exp.seed` (gradlab's model zoo: `exp.spec`)."""
        return build_model(exp.spec, data.n_features, data.n_classes, key=jax.random.key(exp.seed),
                           image_shape=data.image_shape)

    def shapes(self, exp: "Experiment", data: Dataset):
        """The params' shapes (`jax.ShapeDtypeStruct` leaves): `init_model` traced, never run (no compile)."""
        return eqx.filter_eval_shape(self.init_model, exp, data)

    def count_params(self, exp: "Experiment", data: Dataset) -> int:
        """P, the number of parameters of `exp`'s model on `data` (`params.num_params` of `shapes`)."""
        return num_params(self.shapes(exp, data))

    def forward_macs(self, exp: "Experiment", data: Dataset) -> int:
        """Multiply-adds of one example's forward pass (half the FLOPs of XLA's cost analysis of the lowered,
        never compiled or run, forward): P for dense models, about 10 P for seed 003's SimpleCNN."""
        arrays, static = eqx.partition(self.shapes(exp, data), lambda leaf: isinstance(leaf, jax.ShapeDtypeStruct))
        x = jax.ShapeDtypeStruct(data.x_train.shape[1:], jnp.float32)
        cost = jax.jit(lambda a, x: eqx.combine(a, static)(x)).lower(arrays, x).cost_analysis() or {}
        return int(cost.get("flops", 0) // 2)

    def loss_fn(self, data: Dataset) -> Callable:
        """`loss(params, x, y) -> scalar`, one example's loss (gradlab's for the task)."""
        return losses.loss_for(data.task)

    def predict_fn(self) -> Callable | None:
        """`predict(params, x)` for one example, or None: the model is callable (`model(x)`, gradlab's own)."""
        return None

    def trained(self, exp: "Experiment", data: Dataset) -> "TrainResult | None":
        """Checkpoints the source brings for `exp` on `data` (None: gradlab's loop trains `init_model`)."""
        return None

    @property
    def trainable(self) -> bool:
        """Whether gradlab's training loop can train this source's model from an initialization (new seeds,
        DP-SGD, subsets)."""
        return True

    def recipe(self, exp: "Experiment") -> dict:
        """The keyword arguments of `gradlab.train.train` that train `exp` (all but the seed): its fields."""
        return dict(optimizer=exp.optimizer, lr=exp.lr, steps=exp.steps, batch_size=exp.batch_size, l2=exp.l2,
                    checkpoint_every=exp.checkpoint_every, order=exp.order, ema=exp.ema,
                    label_smoothing=exp.label_smoothing)

    def canonical(self, exp: "Experiment") -> "Experiment":
        """`exp` with the fields this source ignores at their defaults (two equal views share one cache key)."""
        return exp
