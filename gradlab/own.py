"""Your own model in the explorer: a single-example loss, its trained params and its data.

The contract (docs/own-model.md) is the engine's: a Python file, or `gradlab.explore(...)` from a notebook,
supplies

- `loss_fn(params, x, y) -> scalar`: the loss of ONE example;
- `params`: the trained model, any pytree (an Equinox module, Flax variables or NNX state, dicts of arrays);
- `data`: `(x, y)`, `(x_train, y_train, x_test, y_test)`, a dict with those keys, an NPZ path or a CSV path;

and optionally `predict_fn(params, x) -> output` (logits `(K,)` or a scalar), `task`, `class_names`,
`image_shape`, `label` (a CSV's label column), and `checkpoints` (params at earlier training steps, oldest
first, ending with `params`) with their `steps` and `learning_rates` (TracIn follows them).

With `init_fn(key) -> params` (and optionally `optimizer`, an optax `GradientTransformation`, `train_steps` and
`batch_size`: the recipe), gradlab's own training loop can train the model again from an initialization: DP-SGD
(which must replace the gradient by the engine's clipped, noised sum, so a user's own training step could not be
used for it), the audit's shadow models, the LDS's models on random halves and TRAK's ensemble.

The module is named only by the server's own start-up setting (`GRADLAB_OWN_MODEL`, which
`python -m gradlab serve` sets for the Streamlit process it starts): nothing a visitor sends (a URL, a
widget) names a file, so a hosted app never runs a module a visitor chose. The experiment names the model
by a fingerprint of its code, parameters and data (`dataset="own:<16 hex>"`): a changed file is a new
cache key, and results computed from it stay in the server's memory (never on disk).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import os
import pickle
import sys
import traceback
from pathlib import Path
from typing import Callable

import cloudpickle
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
from sklearn.model_selection import train_test_split

from gradlab.data import DataError, Dataset, read_csv
from gradlab.train import TrainResult

#: The environment variable that names the served model: a `.py` module or a `.pkl` spec from `explore`.
ENV = "GRADLAB_OWN_MODEL"
#: The sidebar's dataset choice for the served model; the experiment names it `"own:<fingerprint>"`.
OWN = "own"
#: The share of examples held out as test points when the data has no test split of its own (seeded).
TEST_FRACTION = 0.2
#: The recipe of a module with an `init_fn` but no `optimizer`, `train_steps` or `batch_size` of its own.
DEFAULT_RECIPE = {"optimizer": optax.adam(1e-3), "train_steps": 300, "batch_size": 128}


class OwnModelError(DataError):
    """A module or spec that does not meet the contract; the message says what to change."""


@dataclasses.dataclass(frozen=True, eq=False)
class OwnModel:
    """A user's model and data, checked against the contract.

    - `name`: `"own:"` + 16 hex digits of SHA-256 over the source, every parameter and every data array.
    - `source`: where it came from (a file name, or `"explore()"`), for the sidebar.
    - `loss_fn(params, x, y)`: the user's single-example loss; `params`: the trained pytree.
    - `predict_fn(params, x) -> output` or None (regression without one has no predictions).
    - `data`: a `Dataset`, features as given (not standardized: the model was trained on them).
    - `run`: a `TrainResult` of the user's `checkpoints` (just `params` at step 0 without them); no losses.
    - `init_fn(key) -> params` or None; `optimizer` (optax), `train_steps`, `batch_size`: the recipe with which
      gradlab's loop trains the model again (`recipe`).
    """

    name: str
    source: str
    loss_fn: Callable
    params: object
    predict_fn: Callable | None
    data: Dataset
    run: TrainResult
    init_fn: Callable | None = None
    optimizer: optax.GradientTransformation = DEFAULT_RECIPE["optimizer"]
    train_steps: int = DEFAULT_RECIPE["train_steps"]
    batch_size: int = DEFAULT_RECIPE["batch_size"]

    @property
    def has_run(self) -> bool:
        """Whether the module lists checkpoints of a training run (TracIn and the checkpoint picker need them)."""
        return len(self.run.checkpoints) > 1

    @property
    def trainable(self) -> bool:
        """Whether gradlab's loop can train the model from an initialization (the module defines `init_fn`)."""
        return self.init_fn is not None

    def recipe(self) -> dict:
        """The keyword arguments of `gradlab.train.train` that retrain this model as its module says: its optax
        `optimizer`, `train_steps` minibatches of `batch_size`, no L2 term (the user's loss holds any), two
        checkpoints (the initialization and the end). The learning rate is the optimizer's own (NaN: unknown)."""
        return dict(optimizer=self.optimizer, lr=float("nan"), steps=self.train_steps, batch_size=self.batch_size,
                    l2=0.0, checkpoint_every=max(self.train_steps, 1))

    def init(self, seed: int):
        """Fresh params from `init_fn(jax.random.key(seed))`. **Raises** `OwnModelError` saying what to add
        when the module has no `init_fn`."""
        if self.init_fn is None:
            raise OwnModelError(NEEDS_INIT)
        return self.init_fn(jax.random.key(seed))


#: What a module adds so that gradlab's training loop can train it from an initialization.
NEEDS_INIT = ("add `init_fn(key) -> params` to your model's module (a fresh initialization from a JAX PRNG key), and "
              "optionally `optimizer` (an optax GradientTransformation), `train_steps` and `batch_size`: gradlab's "
              "loop then trains your model from an initialization (docs/own-model.md)")


def configured() -> bool:
    """Whether this server was started with a model of its own (`GRADLAB_OWN_MODEL` set)."""
    return bool(os.environ.get(ENV))


@functools.cache
def _load_served(path: str) -> OwnModel:
    return load(path)


def served() -> OwnModel:
    """The model this server was started with (`GRADLAB_OWN_MODEL`), loaded once per process.

    **Raises** `OwnModelError` when there is none, or when the module does not meet the contract."""
    path = os.environ.get(ENV)
    if not path:
        raise OwnModelError("This view uses a model served with `python -m gradlab serve my_model.py`; this server "
                            "was started without one. Choose a dataset in the sidebar.")
    return _load_served(path)


def for_name(name: str) -> OwnModel:
    """The served model whose experiment name is `name` (`"own:<fingerprint>"`).

    **Raises** `OwnModelError` when the server serves none or another version (the file changed since the link)."""
    model = served()
    if name not in (OWN, model.name):
        raise OwnModelError(f"This link names a version of the served model ({name}) that this server no longer "
                            f"has: it serves {model.name} from {model.source}. Choose 'own' in the sidebar again.")
    return model


# ---------------------------------------------------------------- loading


def load(path: str | os.PathLike) -> OwnModel:
    """The model in a Python file (`my_model.py`: runs it, reads the contract's names) or in a spec pickled by
    `save_spec` (`.pkl`, what `explore` hands to the server it starts).

    **Raises** `OwnModelError` naming the file and what is missing or wrong (an import error with its last lines)."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise OwnModelError(f"{path} does not exist: pass the path of your model's Python file")
    raw = path.read_bytes()
    if path.suffix == ".pkl":
        try:
            spec = pickle.loads(raw)
        except Exception as err:  # noqa: BLE001 - any unpickling failure is a bad spec
            raise OwnModelError(f"{path.name} is not a spec written by gradlab.explore: {err}") from None
        return from_objects(**spec, source=spec.get("source", "explore()"), _salt=raw)
    if path.suffix != ".py":
        raise OwnModelError(f"{path.name}: expected a Python file (.py) that defines loss_fn, params and data")
    namespace = _run_module(path)
    return from_objects(**{k: namespace[k] for k in CONTRACT if k in namespace}, source=path.name, _salt=raw,
                        _where=path.name)


#: The names a module may define: the three required ones first.
CONTRACT = ("loss_fn", "params", "data", "predict_fn", "task", "class_names", "image_shape", "label", "checkpoints",
            "steps", "learning_rates", "init_fn", "optimizer", "train_steps", "batch_size")


def _run_module(path: Path) -> dict:
    """Import the user's file as a fresh module (its own directory on the path, for its own imports)."""
    name = f"gradlab_own_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickle and dataclasses look a module up by name
    added = str(path.parent) not in sys.path
    if added:
        sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - the user's code may raise anything; say where
        sys.modules.pop(name, None)
        last = "".join(traceback.format_exception(err)[-3:]).strip()
        raise OwnModelError(f"{path.name} raised {type(err).__name__} while loading:\n{last}") from None
    finally:
        if added:
            sys.path.remove(str(path.parent))
    return vars(module)


def save_spec(path: str | os.PathLike, **spec) -> None:
    """Write `spec` (the keyword arguments of `from_objects`) for a server to `load`: with `cloudpickle`, so a
    loss written in a notebook travels by value. **Raises** `OwnModelError` when it cannot be pickled."""
    try:
        Path(path).write_bytes(cloudpickle.dumps(spec))
    except Exception as err:  # noqa: BLE001
        raise OwnModelError(f"the model could not be pickled for the explorer's server: {err}") from None


def from_objects(loss_fn=None, params=None, data=None, *, predict_fn=None, task=None, class_names=None,
                 image_shape=None, label=None, checkpoints=None, steps=None, learning_rates=None, init_fn=None,
                 optimizer=None, train_steps=None, batch_size=None,
                 source="explore()", _salt: bytes = b"", _where: str = "your model") -> OwnModel:
    """Check the contract and build an `OwnModel` (see the module docstring for each argument).

    **Raises** `OwnModelError` naming the missing or wrong piece: no `loss_fn`/`params`/`data`, data of the
    wrong shape, labels out of range, a loss that does not return a scalar on the first example, an `init_fn`
    whose params differ in structure or shapes from `params`, an `optimizer` that is not an optax one."""
    missing = [n for n, v in (("loss_fn", loss_fn), ("params", params), ("data", data)) if v is None]
    if missing:
        raise OwnModelError(f"{_where} does not define {', '.join(missing)}: the explorer needs loss_fn(params, x, y) "
                            "-> scalar, params (any pytree) and data ((x, y), a dict, an NPZ or a CSV path)")
    if not callable(loss_fn) or (predict_fn is not None and not callable(predict_fn)):
        raise OwnModelError(f"{_where}: loss_fn and predict_fn must be functions")
    dataset = as_dataset(data, task=task, class_names=class_names, image_shape=image_shape, label=label)
    run = _run(params, checkpoints, steps, learning_rates, _where)
    _check_loss(loss_fn, params, dataset, _where)
    _check_labels(loss_fn, predict_fn, params, dataset, _where)
    name = f"{OWN}:{_fingerprint(_salt, params, run.checkpoints, dataset)}"
    if predict_fn is None and dataset.task == "classification":
        predict_fn = _LossArgmin(loss_fn, dataset.n_classes)
    recipe = _recipe(params, init_fn, optimizer, train_steps, batch_size, _where)
    return OwnModel(name, source, loss_fn, params, predict_fn, dataset, run, **recipe)


def _recipe(params, init_fn, optimizer, train_steps, batch_size, where) -> dict:
    """The training recipe's fields of `OwnModel`, checked: `init_fn` traced once (never run) against `params`."""
    given = {k: v for k, v in (("optimizer", optimizer), ("train_steps", train_steps), ("batch_size", batch_size))
             if v is not None}
    if init_fn is None:
        if given:
            raise OwnModelError(f"{where} sets {', '.join(given)} but no init_fn: {NEEDS_INIT}")
        return {}
    if not callable(init_fn):
        raise OwnModelError(f"{where}: init_fn must be a function of a JAX PRNG key that returns fresh params")
    try:
        fresh = eqx.filter_eval_shape(init_fn, jax.random.key(0))
    except Exception as err:  # noqa: BLE001 - the user's init may raise anything
        raise OwnModelError(f"{where}: init_fn(jax.random.key(0)) failed: {type(err).__name__}: {err}") from None
    if jax.tree.structure(fresh) != jax.tree.structure(params) or _shapes(fresh) != _shapes(params):
        raise OwnModelError(f"{where}: init_fn(key) must return params of the same structure and shapes as params")
    optimizer = given.get("optimizer", DEFAULT_RECIPE["optimizer"])
    if not isinstance(optimizer, optax.GradientTransformation):
        raise OwnModelError(f"{where}: optimizer must be an optax GradientTransformation (e.g. optax.adam(1e-3)), "
                            f"got {type(optimizer).__name__}")
    out = {"init_fn": init_fn, "optimizer": optimizer}
    for key in ("train_steps", "batch_size"):
        value = given.get(key, DEFAULT_RECIPE[key])
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise OwnModelError(f"{where}: {key} must be a whole number ≥ 1, got {value!r}")
        out[key] = int(value)
    return out


@dataclasses.dataclass(frozen=True)
class _LossArgmin:
    """A classifier's prediction without a `predict_fn`: the class whose label gives the lowest loss, `(K,)`
    scores `-loss(params, x, k)` (for cross-entropy these are the log-probabilities)."""

    loss_fn: Callable
    n_classes: int

    def __call__(self, params, x):
        return -jax.vmap(lambda k: self.loss_fn(params, x, k))(jnp.arange(self.n_classes))


def _run(params, checkpoints, steps, lrs, where) -> TrainResult:
    """The user's checkpoints as a `TrainResult` (steps 0, 1, … and learning rate 1 unless given)."""
    if checkpoints is None:
        return TrainResult(checkpoints=(params,), steps=(0,), losses=np.zeros(0), lrs=(0.0,))
    checkpoints = tuple(checkpoints)
    n = len(checkpoints)
    steps = tuple(int(s) for s in (range(n) if steps is None else steps))
    lrs = tuple(float(v) for v in ([1.0] * n if lrs is None else lrs))
    if n == 0 or len(steps) != n or len(lrs) != n or list(steps) != sorted(set(steps)):
        raise OwnModelError(f"{where}: checkpoints, steps and learning_rates must have the same non-zero length "
                            f"(got {n}, {len(steps)}, {len(lrs)}) and steps must increase")
    shape = jax.tree.structure(params)
    if any(jax.tree.structure(c) != shape for c in checkpoints):
        raise OwnModelError(f"{where}: every checkpoint must have the structure of params")
    return TrainResult(checkpoints=checkpoints, steps=steps, losses=np.zeros(0), lrs=lrs)


def _shapes(tree) -> list:
    """(shape, dtype) of every leaf (a non-array leaf: its type's name)."""
    return [(getattr(a, "shape", None), str(getattr(a, "dtype", type(a).__name__))) for a in jax.tree.leaves(tree)]


def _check_loss(loss_fn, params, data: Dataset, where: str) -> None:
    try:
        value = eqx.filter_eval_shape(loss_fn, params, data.x_train[0], data.y_train[0])
    except Exception as err:  # noqa: BLE001 - the user's loss may raise anything
        raise OwnModelError(f"{where}: loss_fn(params, x, y) failed on the first training example "
                            f"(x {data.x_train.shape[1:]}, y {data.y_train[0]!r}): {type(err).__name__}: {err}") from None
    if getattr(value, "shape", None) != ():
        raise OwnModelError(f"{where}: loss_fn must return the scalar loss of one example, got shape "
                            f"{getattr(value, 'shape', type(value).__name__)}")


#: Training examples `_check_labels` evaluates every label on (the loss must treat each the same way).
LABEL_CHECK_EXAMPLES = 3


def _check_labels(loss_fn, predict_fn, params, data: Dataset, where: str) -> None:
    """Refuse class ids the model has no output for, at load: JAX never raises on an out-of-range index, it clamps it
    (`logits[12]` of 10 logits is `logits[9]`; `one_hot(12, 10)` is all zeros), so labels 1..12 on a model of 10
    outputs would train and score silently wrong.

    With a `predict_fn` whose output is `(K,)`, every label must be below K. Without one, the loss is evaluated
    (one compiled call) at every label 0..max on the first `LABEL_CHECK_EXAMPLES` training examples and at a label
    far out of range: when the top labels, two or more, score exactly what that far label scores on every one of
    these examples, while other labels score differently, they are past the model's outputs. A loss that cannot
    be evaluated so (not vmappable) is not checked here. **Raises** `OwnModelError` naming the labels and the fix."""
    if data.task != "classification" or not len(data.y_train):
        return
    top = int(max(data.y_train.max(), data.y_test.max() if len(data.y_test) else 0))
    fix = ("Labels must be the class ids 0..K-1 of a model with K outputs, as your loss indexes them: shift them "
           "(y - 1 for labels 1..K) or give the model more outputs.")
    if predict_fn is not None:
        try:
            shape = tuple(eqx.filter_eval_shape(predict_fn, params, data.x_train[0]).shape)
        except Exception:  # noqa: BLE001 - the user's predict_fn may raise anything; the pages say so later
            return
        if len(shape) == 1 and shape[0] > 1 and top >= shape[0]:
            raise OwnModelError(f"{where}: the labels go up to {top}, but predict_fn gives {shape[0]} outputs "
                                f"(class ids 0..{shape[0] - 1}). {fix}")
        return
    if top < 2 or top > 1000:
        return
    labels = np.arange(top + 2, dtype=data.y_train.dtype)
    labels[-1] = 2 * top + 1000  # far past any output the labels could index
    xs = jnp.asarray(data.x_train[:LABEL_CHECK_EXAMPLES])
    try:
        scores = eqx.filter_jit(lambda p, xs, ys: jax.vmap(lambda x: jax.vmap(lambda y: loss_fn(p, x, y))(ys))(xs))(
            params, xs, jnp.asarray(labels))
        scores = np.asarray(scores)
    except Exception:  # noqa: BLE001 - a loss that does not vmap: the engine's own calls say so on the pages
        return
    same = np.all(scores[:, :-1] == scores[:, -1:], axis=0)  # (top + 1,): label j scores as the far label everywhere
    first = top + 1
    while first > 0 and same[first - 1]:
        first -= 1
    if top + 1 - first >= 2 and first > 0:
        raise OwnModelError(
            f"{where}: labels {first}..{top} all give loss_fn the same loss as a label far out of range on each of the "
            f"first {len(xs)} training examples: the model seems to have at most {first + 1} outputs (class ids "
            f"0..{first}), and JAX scores a larger label as its last class instead of raising. {fix}")


def _fingerprint(salt: bytes, params, checkpoints, data: Dataset) -> str:
    h = hashlib.sha256(salt)
    for leaf in jax.tree.leaves((params, checkpoints)):
        if hasattr(leaf, "dtype"):
            h.update(np.asarray(leaf).tobytes())
    for a in (data.x_train, data.y_train, data.x_test, data.y_test):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- data


def as_dataset(data, *, task=None, class_names=None, image_shape=None, label=None) -> Dataset:
    """The user's data as a `Dataset`, features as given (not standardized).

    **Arguments** `data`: `(x, y)` or `(x_train, y_train, x_test, y_test)`; a dict with keys `x`, `y` or
    `x_train`, `y_train`, `x_test`, `y_test`; a path to an NPZ with those keys or to a CSV (header row, numeric
    features, the `label` column, by default the last). `x (N, ...)`, `y (N,)`: int class ids `0..K-1` or real
    targets. Without a test split, a seeded 20 % of the examples are the test points. `task` defaults to
    classification for integer labels; `image_shape` to `(H, W)` for `x (N, H, W)`.

    Rows are named by their place in the source: `"CSV line"` (the header is line 1) or `"index"` (the row of
    the array it came from: `x`, or `x_train` / `x_test`).

    **Raises** `OwnModelError` for an unreadable file, mismatched lengths, or labels that are not 0..K-1."""
    row_label, source_rows, split = "index", None, ""
    if isinstance(data, (str, os.PathLike)):
        path = Path(data).expanduser()
        if path.suffix == ".csv":
            arrays, class_names = _csv(path, label, task, class_names)
            row_label, source_rows = "CSV line", np.arange(len(arrays["y"])) + 2
        elif path.suffix == ".npz":
            try:
                with np.load(path) as z:
                    arrays = {k: z[k] for k in z.files}
            except (OSError, ValueError) as err:
                raise OwnModelError(f"data: could not read {path}: {err}") from None
        else:
            raise OwnModelError(f"data: {path.name} is neither .npz nor .csv")
    elif isinstance(data, dict):
        arrays = dict(data)
    elif isinstance(data, (tuple, list)) and len(data) in (2, 4):
        arrays = dict(zip(("x_train", "y_train", "x_test", "y_test") if len(data) == 4 else ("x", "y"), data))
    else:
        raise OwnModelError("data must be (x, y), (x_train, y_train, x_test, y_test), a dict, or an NPZ/CSV path")
    if {"x_train", "y_train", "x_test", "y_test"} <= set(arrays):
        xtr, ytr, xte, yte = (np.asarray(arrays[k]) for k in ("x_train", "y_train", "x_test", "y_test"))
        rtr, rte = np.arange(len(ytr)), np.arange(len(yte))
    elif {"x", "y"} <= set(arrays):
        x, y = np.asarray(arrays["x"]), np.asarray(arrays["y"])
        _same_length(x, y)
        rows = np.arange(len(y)) if source_rows is None else source_rows
        xtr, xte, ytr, yte, rtr, rte = train_test_split(x, y, rows, test_size=TEST_FRACTION, random_state=0)
        split = f"train_test_split(x, y, test_size={TEST_FRACTION}, random_state=0)"
    else:
        raise OwnModelError(f"data has keys {sorted(arrays)}: give x and y, or x_train, y_train, x_test and y_test")
    _same_length(xtr, ytr)
    _same_length(xte, yte)
    task = task or ("classification" if np.issubdtype(ytr.dtype, np.integer) else "regression")
    if task == "classification":
        ytr, yte = ytr.astype(np.int32), yte.astype(np.int32)
        k = len(class_names) if class_names else int(max(ytr.max(), yte.max())) + 1
        if min(ytr.min(), yte.min()) < 0 or max(ytr.max(), yte.max()) >= k:
            raise OwnModelError(f"classification labels must be class ids 0..{k - 1}")
        class_names = tuple(map(str, class_names or range(k)))
    elif task == "regression":
        ytr, yte, class_names = ytr.astype(np.float32), yte.astype(np.float32), ("target",)
    else:
        raise OwnModelError(f"task must be 'classification' or 'regression', got {task!r}")
    xtr, xte = _features(xtr), _features(xte)
    if image_shape is None and xtr.ndim == 3:
        image_shape = xtr.shape[1:]
    names = tuple(f"x{i}" for i in range(xtr.shape[1])) if xtr.ndim == 2 else ()
    return Dataset(name=OWN, x_train=xtr, y_train=ytr, x_test=xte, y_test=yte, task=task, feature_names=names,
                   class_names=class_names, flipped=np.zeros(len(ytr), bool), y_train_clean=ytr,
                   image_shape=tuple(image_shape) if image_shape is not None else None,
                   rows_train=rtr, rows_test=rte, row_label=row_label, split=split)


def _same_length(x, y) -> None:
    if x.ndim < 1 or y.ndim != 1 or len(x) != len(y) or len(y) < 2:
        raise OwnModelError(f"data: x must be (N, ...) and y (N,) with N ≥ 2, got {x.shape} and {y.shape}")


def _features(x: np.ndarray) -> np.ndarray:
    """Floating features as float32 (what JAX computes in); integer ones (token ids) as they are."""
    return x.astype(np.float32) if np.issubdtype(x.dtype, np.floating) else x


def _csv(path: Path, label, task, class_names):
    """`{"x", "y"}` from a CSV, the label column `label` (default: the last); class names for text labels."""
    table = read_csv(path, max_rows=10**7, max_features=10**5)
    label = label or str(table.columns[-1])
    if label not in table.columns:
        raise OwnModelError(f"data: {path.name} has no column {label!r}; its columns: {', '.join(map(str, table.columns))}")
    y = table[label]
    if task != "regression" and not pd.api.types.is_numeric_dtype(y.dtype):
        values, y = np.unique(y.astype(str), return_inverse=True)
        class_names = class_names or tuple(values)
    return {"x": table.drop(columns=[label]).to_numpy(np.float32), "y": np.asarray(y)}, class_names
