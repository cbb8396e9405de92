"""One experiment: a small frozen, hashable config, and the data + trained model it produces.

The config is the cache key of everything downstream and round-trips through the URL as plain
strings (`to_query` / `from_query`), so a shared link reproduces the exact numbers (seeded).
Its fields are listed once, here: the sidebar's widget keys, the URL's parameter names and the
presets' experiment fields are `CONTROLS`, derived from `dataclasses.fields`.

`dataset` names the data's source (`gradlab.sources`: one registry keyed by the string's prefix), which
loads the data, builds and trains the model, and says whether results may be stored on disk. An uploaded
CSV is named by a hash of its bytes, label column and task (`upload_name`), e.g. `dataset="upload:3fa9…"`:
two uploads of different bytes are different experiments, so no cache keyed on the experiment can serve
one person's upload to another. A model served with `python -m gradlab serve my_model.py` (`gradlab.own`)
is `dataset="own:<fingerprint>"`: its loss, trained params and data come from the server's start-up
setting, never from the URL, and every other field is unused (`canonical` sets them to their defaults).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from gradlab import costs, escape, losses, memory
from gradlab import data as data_mod
from gradlab.models import ModelSpec
from gradlab.sources import UPLOAD, Source, source_of, upload_name
from gradlab.train import TrainResult, train

__all__ = ["Experiment", "Fitted", "CONTROLS", "MODEL_DEFAULTS", "DP_SGD_DEFAULTS", "UPLOAD", "upload_name", "load_data",
           "init_model", "count_params", "forward_macs", "check_training_memory", "check_training_work", "fit", "recipe"]


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
    test_fraction: float = dataclasses.field(default=0.2, metadata={"control": False})
    #: How minibatches are drawn (`train.ORDERS`), the parameters' moving-average decay (0: off) and the label
    #: smoothing of the training loss (0: off): set by a model's recipe (`MODEL_DEFAULTS`), not in the sidebar.
    order: str = dataclasses.field(default="random", metadata={"control": False})
    ema: float = dataclasses.field(default=0.0, metadata={"control": False})
    label_smoothing: float = dataclasses.field(default=0.0, metadata={"control": False})

    def replace(self, **changes) -> "Experiment":
        return dataclasses.replace(self, **changes)

    @classmethod
    def for_model(cls, model: str = "mlp") -> "Experiment":
        """The defaults with `model` and the training recipe it starts from (`MODEL_DEFAULTS`): what a link
        or the sidebar that names only the model trains."""
        return cls(model=model, **MODEL_DEFAULTS.get(model, {}))

    def to_query(self) -> dict[str, str]:
        """The fields that differ from the defaults (the model's, `for_model`), as URL query strings."""
        default = Experiment.for_model(self.model).replace(model=Experiment().model)
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
        return cls.for_model(kwargs.get("model", cls().model)).replace(**kwargs)

    @classmethod
    def from_state(cls, state) -> "Experiment":
        """The experiment that a mapping of control values describes (sidebar widget keys in
        `st.session_state`, or parsed query parameters); absent or unparsable values are the defaults.

        Fields a model does not use are set to their defaults (`canonical`), so two equal views
        share one cache key. Never raises: a shared link with nonsense values opens the defaults.
        """
        default = cls()
        kwargs = {}
        for name in CONTROLS:  # the model's own defaults (`for_model`) fill the rest
            if name not in state:
                continue
            kind = type(getattr(default, name))
            try:
                value = kind(state[name])
            except (TypeError, ValueError):
                continue
            if kind is float and value != value:  # NaN
                continue
            kwargs[name] = value
        return cls.for_model(kwargs.get("model", default.model)).replace(**kwargs).canonical()

    def canonical(self) -> "Experiment":
        """The same experiment with the fields its model ignores at their defaults (width and depth
        exist only for the MLP, the activation only for MLP and CNN)."""
        default = Experiment()
        if self.source.brings_model:  # the user's own trained model: nothing here changes it
            return self.source.canonical(self)
        changes = {}
        if self.model != "mlp":
            changes.update(width=default.width, depth=default.depth)
        if self.model not in ("mlp", "cnn"):
            changes.update(activation=default.activation)
        return self.replace(**changes) if changes else self

    @property
    def source(self) -> Source:
        """Where the data (and a served model) come from: `sources.source_of(dataset)`."""
        return source_of(self.dataset)

    @property
    def in_memory_only(self) -> bool:
        """Whether results computed from this experiment stay out of the disk store: an upload's (someone's
        data) and a served model's (the user's code, which need not pickle): `not source.persist`."""
        return not self.source.persist

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(self.model, self.width, self.depth, self.activation)


#: The training recipe a model starts from where it differs from `Experiment`'s defaults. Seed 003's SimpleCNN
#: (12 M multiply-adds per example) on the Fashion-MNIST subset: 300 steps of 32 with Adam (β₂ = 0.99), its rate
#: warmed up over 30 steps to 0.005 and decayed linearly to 0 (`adam_warmup`), the examples in a new random order
#: each epoch, the cross-entropy's labels smoothed by 0.1: 85.1–86.7% test accuracy on the subset's 1,000 test
#: images at seeds 0–9 (mean 86.1%), 86.0–87.1% on all 10,000 of Fashion-MNIST's (mean 86.6%), within the 30 CPU-s a
#: visitor's settings may cost (benchmarks/RESULTS.md, "SimpleCNN on every seed").
MODEL_DEFAULTS = {
    "simple_cnn": {"steps": 300, "batch_size": 32, "optimizer": "adam_warmup", "lr": 0.005, "checkpoint_every": 50,
                   "order": "epoch", "label_smoothing": 0.1},
}

#: The DP clipping page's DP-SGD settings a model starts from where the page's own (an expected batch of 256, 200 steps,
#: Adam at 0.02) would cost more than a visitor may spend: `expected_batch` qN, `steps` T and Adam's `lr`. Seed 003's
#: SimpleCNN: its two runs (private and non-private) of 20 steps of 120 fit the 30 CPU-s budget, and at the page's
#: target ε = 3 (δ = 1e-5) the private one reaches ~67% test accuracy (benchmarks/RESULTS.md, "SimpleCNN over ten
#: seeds": 60 × 40 at Adam 0.003 gave 55%).
DP_SGD_DEFAULTS = {
    "simple_cnn": {"expected_batch": 120, "steps": 20, "lr": 0.01},
}

#: The Experiment fields that are controls: sidebar widget keys and URL query parameters, in order.
CONTROLS = tuple(f.name for f in dataclasses.fields(Experiment) if f.metadata.get("control", True))

@dataclasses.dataclass(frozen=True, eq=False)
class Fitted:
    """An experiment's data, loss and trained checkpoints; `predict_fn(params, x)` gives one example's output
    (None: the model is callable, `model(x)`, as gradlab's own are)."""

    experiment: Experiment
    data: data_mod.Dataset
    loss_fn: Callable
    run: TrainResult
    predict_fn: Callable | None = None

    @property
    def model(self):
        return self.run.final

    @property
    def source(self) -> Source:
        """The experiment's data source (`Experiment.source`)."""
        return self.experiment.source

    @property
    def trainable(self) -> bool:
        """Whether gradlab's training loop can train this experiment again (new seeds, DP-SGD, subsets): always
        for gradlab's own models; for a served model when its module defines `init_fn` (`Source.trainable`)."""
        return self.source.trainable

    @property
    def recipe(self) -> dict:
        """How gradlab's loop trains this experiment again: the keyword arguments of `gradlab.train.train`
        (`optimizer`, a name or an optax transformation, `lr`, `steps`, `batch_size`, `l2`, `checkpoint_every`):
        the experiment's fields, or a served model's module's recipe (`Source.recipe`)."""
        return recipe(self.experiment)

    def predict(self, params, xs):
        """Predictions `(N,)` of `params` on `xs (N, ...)`: class ids or real values; NaN for a served regression
        model without a `predict_fn`."""
        if self.source.brings_model and self.predict_fn is None:
            return np.full(len(xs), np.nan, np.float32)
        return losses.predict(params, xs, self.data.task, self.predict_fn)

    def losses_and_predictions(self, params, xs, ys) -> tuple[np.ndarray, np.ndarray]:
        """`(losses (N,), predictions (N,))` of `params` on a batch, as `per_example_losses` and `predict` give them,
        from one pass (`losses.losses_and_predictions`)."""
        if self.source.brings_model and self.predict_fn is None:
            return np.asarray(losses.per_example_losses(self.loss_fn, params, xs, ys)), self.predict(params, xs)
        got = losses.losses_and_predictions(self.loss_fn, params, xs, ys, self.data.task, self.predict_fn)
        return tuple(np.asarray(a) for a in got)


def load_data(exp: Experiment, upload: dict | None = None) -> data_mod.Dataset:
    """The experiment's dataset, from its source (`Source.load`): a bundled or generated set, an upload's CSV,
    a served model's data. Not cached here (`gradlab.ui.cache.data` keeps each once per `sources.data_key`).

    **Arguments** `upload`: `{"bytes", "label", "task"}` of the CSV whose hash is in `exp.dataset` (an upload
    experiment only). **Raises** `DataError` for impossible settings, or for an upload experiment without
    its bytes (they are not in the config)."""
    return exp.source.load(exp, upload)


def init_model(exp: Experiment, data: data_mod.Dataset):
    """The untrained model for `exp` on `data`, initialized from `exp.seed` (`Source.init_model`).

    A served model is initialized by its module's `init_fn(jax.random.key(exp.seed))`.

    **Raises** `DataError` for a served model whose module has no `init_fn`, saying what to add."""
    return exp.source.init_model(exp, data)


def count_params(exp: Experiment, data: data_mod.Dataset) -> int:
    """P, the number of parameters of `exp`'s model on `data` (shapes only: nothing is initialized, in about 15 ms
    against a second of compiling the initializers; `Source.count_params`): lets a page refuse a model too large
    before anything trains."""
    return exp.source.count_params(exp, data)


def forward_macs(exp: Experiment, data: data_mod.Dataset) -> int:
    """Multiply-adds of one example's forward pass through `exp`'s model on `data` (`Source.forward_macs`: half the
    FLOPs of XLA's cost analysis of the lowered, never compiled or run, forward): P for dense models, about 10 P for
    seed 003's SimpleCNN, whose convolutions reuse each weight at every position; 0 for a served model (its forward
    is the user's own)."""
    return exp.source.forward_macs(exp, data)


def check_training_memory(exp: Experiment, num_params: int) -> None:
    """Refuse to train `num_params` parameters and keep more checkpoints than fit the memory budget.

    **Raises** `memory.MemoryBudgetError` (a ValueError) naming the setting that fits."""
    need = memory.training_bytes(num_params, memory.n_checkpoints(exp.steps, exp.checkpoint_every))
    every = memory.largest(
        sorted({e for e in (10, 25, 50, 100, 250, 500, exp.steps) if e >= 1}, reverse=True),
        lambda e: memory.training_bytes(num_params, memory.n_checkpoints(exp.steps, e)))
    fix = (f"Set **Checkpoint every** to {every} steps or more (Advanced), or use a smaller model."
           if every else "Use a smaller model.")
    memory.check(f"Training {num_params:,} parameters and keeping "
                 f"{memory.n_checkpoints(exp.steps, exp.checkpoint_every)} checkpoints", need, fix)


def check_training_work(exp: Experiment, num_params: int, macs: int = 0) -> None:
    """Refuse a training over `costs.WORK_BUDGET_SECONDS` CPU-s that no one has stored yet; name the most
    training steps that fit. `macs`: the forward pass's multiply-adds (`forward_macs`; convolutions cost more
    than their P). **Raises** `escape.Refusal` (a ValueError) with the estimate and the fix (gradlab's Markdown)."""
    need = costs.training_seconds(num_params, exp.steps, exp.batch_size, macs)
    if need <= costs.WORK_BUDGET_SECONDS:
        return
    fits = [s for s in (25, 50, 100, 200, 300, 500, 1000, 2000)
            if costs.training_seconds(num_params, s, exp.batch_size, macs) <= costs.WORK_BUDGET_SECONDS]
    fix = f"Set **Training steps** to {fits[-1]} or fewer, or a smaller batch or model." if fits else "Use a smaller model."
    raise escape.Refusal(f"Training {num_params:,} parameters for {exp.steps} steps of {exp.batch_size} examples would take "
                     f"about {need:.0f} CPU-seconds on this shared server (the limit is {costs.WORK_BUDGET_SECONDS:.0f}). "
                     + fix)


def fit(exp: Experiment, data: data_mod.Dataset | None = None, progress=None) -> Fitted:
    """Load data, build the model, train with checkpoints.

    **Arguments** `exp`; `data` to train on instead of `load_data(exp)` (an uploaded CSV);
    `progress(step, steps)` called after each checkpoint.

    A source that brings its model (a served one) is not trained at seed 0 on its own data: its checkpoints are the
    ones its module lists (`Source.trained`). At another seed, or on other `data` (a subset), its module's `init_fn`
    and recipe train it with gradlab's loop.

    **Raises** `DataError` / `TrainingError` (both ValueError) with a message that says what to change (for a
    served model without `init_fn`, what to add to its module).
    """
    source = exp.source
    data = data if data is not None else source.load(exp)
    loss_fn = source.loss_fn(data)
    run = source.trained(exp, data)
    if run is None:
        run = train(source.init_model(exp, data), loss_fn, data.x_train, data.y_train, **source.recipe(exp),
                    seed=exp.seed, progress=progress)
    return Fitted(exp, data, loss_fn, run, source.predict_fn())


def recipe(exp: Experiment) -> dict:
    """The keyword arguments of `gradlab.train.train` that train `exp` (all but the seed; `Source.recipe`): its
    fields, or a served model's module's recipe."""
    return exp.source.recipe(exp)
