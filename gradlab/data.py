"""Datasets: scikit-learn's bundled real sets, a Fashion-MNIST subset, generated toys, label noise, CSV import.

Nothing is downloaded: digits, breast cancer and diabetes ship inside scikit-learn; the Fashion-MNIST
subset ships inside gradlab (`gradlab/data/`, made by `scripts/make_fashion_subset.py`); the toys are
generated from a seed. Features are standardized with the training split's mean and std (per feature;
for Fashion-MNIST one mean and std over all pixels, as image pipelines do, so a pixel that is almost
always blank is not blown up).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import io

import numpy as np
import pandas as pd
from sklearn import datasets as skd
from sklearn.model_selection import train_test_split


class DataError(ValueError):
    """A dataset or setting that cannot work; the message says what to change."""


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A standardized train/test split.

    - `x_train (N, D) float32`, `y_train (N,)` int32 class ids or float32 targets; same for test.
    - `task`: `"classification"` or `"regression"`.
    - `flipped (N,) bool`: training labels replaced by label-noise injection (all False without).
    - `y_train_clean (N,)`: the training labels before noise.
    - `image_shape`: `(8, 8)` for digits, `(28, 28)` for Fashion-MNIST (x rows are flattened images), else None.
    - `rows_train (N,)`, `rows_test`: where each example came from, named by `row_label`: the line of an
      uploaded CSV (the header is line 1), the image's index in Fashion-MNIST (`"Fashion-MNIST index"`:
      0–59,999 its training file, 60,000–69,999 its test file), or the position in the bundled or
      generated array (`"index"`).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    task: str
    feature_names: tuple[str, ...]
    class_names: tuple[str, ...]
    flipped: np.ndarray
    y_train_clean: np.ndarray
    image_shape: tuple[int, int] | None = None
    x_mean: np.ndarray | None = None
    x_std: np.ndarray | None = None
    rows_train: np.ndarray | None = None
    rows_test: np.ndarray | None = None
    row_label: str = "index"

    def raw(self, x: np.ndarray) -> np.ndarray:
        """Undo the standardization of rows `x (n, D)`: the original feature values (pixels to draw)."""
        if self.x_mean is None:
            return x
        return x * self.x_std + self.x_mean

    def row(self, i: int, split: str = "train") -> int:
        """Example `i`'s name in its source, called `row_label` (a Fashion-MNIST index, an uploaded CSV's line, else
        its position): what a title, hover or export calls it, so a researcher can find it again."""
        rows = self.rows_train if split == "train" else self.rows_test
        return int(rows[i]) if rows is not None else int(i)

    @property
    def n_classes(self) -> int:
        """K classes (1 for regression: one output)."""
        return len(self.class_names) if self.task == "classification" else 1

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]


#: name -> human label; the order is the sidebar's.
DATASETS = {
    "digits": "Digits (8×8 images, 10 classes, scikit-learn)",
    "fashion": "Fashion-MNIST (28×28 images, 10 classes; 6,000 + 1,000 of Zalando's, MIT)",
    "breast_cancer": "Breast cancer (30 features, 2 classes, scikit-learn)",
    "diabetes": "Diabetes (10 features, regression, scikit-learn)",
    "blobs": "Blobs (2-D toy, 3 classes)",
    "moons": "Moons (2-D toy, 2 classes)",
    "circles": "Circles (2-D toy, 2 classes)",
    "spirals": "Spirals (2-D toy, 2 classes)",
    "line_outliers": "Line with outliers (1-D regression toy)",
}

TOY_SIZE = 600

#: The bundled Fashion-MNIST subset (see gradlab/data/README.md) and its class names, in label order.
FASHION_FILE = "fashion_mnist_subset.npz"
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")
#: Fashion-MNIST's training file has 60,000 images: a test image's index is 60,000 + its place in the test file.
FASHION_TEST_OFFSET = 60_000


def _spirals(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaved Archimedean spirals with Gaussian jitter."""
    t = np.sqrt(rng.uniform(0.05, 1.0, n)) * 3 * np.pi
    y = rng.integers(0, 2, n)
    r = t * np.where(y == 0, 1.0, -1.0)
    x = np.stack([r * np.cos(t), r * np.sin(t)], axis=1) + rng.normal(0, 0.3, (n, 2))
    return x, y


def _line_outliers(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """y = 2x + 1 + noise, with 5% of the targets shifted far off the line."""
    x = rng.uniform(-3, 3, (n, 1))
    y = 2 * x[:, 0] + 1 + rng.normal(0, 0.5, n)
    out = rng.choice(n, size=max(1, n // 20), replace=False)
    y[out] += rng.choice([-1, 1], out.size) * rng.uniform(8, 12, out.size)
    return x, y


def _raw(name: str, seed: int):
    """(x, y, task, feature names, class names, image shape) before splitting."""
    rng = np.random.default_rng(seed)
    if name == "digits":
        d = skd.load_digits()
        return d.data, d.target, "classification", tuple(f"pixel {i}" for i in range(64)), tuple(map(str, range(10))), (8, 8)
    if name == "breast_cancer":
        d = skd.load_breast_cancer()
        return d.data, d.target, "classification", tuple(d.feature_names), tuple(d.target_names), None
    if name == "diabetes":
        d = skd.load_diabetes()
        return d.data, d.target, "regression", tuple(d.feature_names), ("target",), None
    if name == "blobs":
        x, y = skd.make_blobs(TOY_SIZE, centers=3, cluster_std=1.5, random_state=seed)
        return x, y, "classification", ("x₁", "x₂"), ("0", "1", "2"), None
    if name == "moons":
        x, y = skd.make_moons(TOY_SIZE, noise=0.2, random_state=seed)
        return x, y, "classification", ("x₁", "x₂"), ("0", "1"), None
    if name == "circles":
        x, y = skd.make_circles(TOY_SIZE, noise=0.1, factor=0.5, random_state=seed)
        return x, y, "classification", ("x₁", "x₂"), ("0", "1"), None
    if name == "spirals":
        x, y = _spirals(TOY_SIZE, rng)
        return x, y, "classification", ("x₁", "x₂"), ("0", "1"), None
    if name == "line_outliers":
        x, y = _line_outliers(200, rng)
        return x, y, "regression", ("x",), ("y",), None
    raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def flip_labels(
    y: np.ndarray, rate: float, n_classes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Replace a fraction `rate` of labels by a different class, chosen uniformly.

    **Returns** `(noisy labels (N,), flipped mask (N,) bool)`; exactly round(rate·N) are flipped.

    **Raises** `DataError` if rate is outside [0, 1) or there is one class only.
    """
    if not 0.0 <= rate < 1.0:
        raise DataError(f"label-noise rate must be in [0, 1), got {rate:g}: at 100% no label is left to learn from")
    flipped = np.zeros(y.shape[0], bool)
    k = int(round(rate * y.shape[0]))
    if k == 0:
        return y.copy(), flipped
    if n_classes < 2:
        raise DataError("label noise needs at least two classes")
    idx = rng.choice(y.shape[0], size=k, replace=False)
    flipped[idx] = True
    noisy = y.copy()
    noisy[idx] = (y[idx] + rng.integers(1, n_classes, k)) % n_classes
    return noisy, flipped


def corrupt_targets(y: np.ndarray, rate: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Regression "label noise": shift a fraction `rate` of targets by ±3 standard deviations."""
    if not 0.0 <= rate < 1.0:
        raise DataError(f"label-noise rate must be in [0, 1), got {rate:g}")
    flipped = np.zeros(y.shape[0], bool)
    k = int(round(rate * y.shape[0]))
    idx = rng.choice(y.shape[0], size=k, replace=False)
    flipped[idx] = True
    noisy = y.copy()
    noisy[idx] += rng.choice([-3.0, 3.0], k) * max(float(y.std()), 1e-6)
    return noisy, flipped


def make_dataset(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    task: str,
    *,
    seed: int = 0,
    label_noise: float = 0.0,
    test_fraction: float = 0.2,
    feature_names: tuple[str, ...] | None = None,
    class_names: tuple[str, ...] | None = None,
    image_shape: tuple[int, int] | None = None,
    rows: np.ndarray | None = None,
    row_label: str = "index",
    test_mask: np.ndarray | None = None,
    standardize: str = "feature",
) -> Dataset:
    """Split (stratified for classification), standardize, and inject label noise into the train split.

    **Arguments**
    - `x (N, D)` numeric features; `y (N,)` labels (any values for classification: they are
      mapped to 0..K-1 in sorted order) or real targets.
    - `task`: `"classification"` or `"regression"`; `seed` for the split and the noise.
    - `label_noise`: fraction of training labels flipped to another class, in [0, 1).
    - `test_fraction`: in (0, 1).
    - `rows (N,)`: each row's name in its source (default: its position), called `row_label`.
    - `test_mask (N,) bool`: a fixed split (a dataset's official test set) instead of a random one;
      `test_fraction` is then unused.
    - `standardize`: `"feature"` (each column its own mean and std) or `"global"` (one mean and std over
      every value: images).

    **Returns** a `Dataset`; regression targets are standardized too.

    **Raises** `DataError` with a fix when the split leaves no examples or a class too small to
    stratify, the noise rate is impossible, or shapes disagree.
    """
    x = np.asarray(x, np.float64)
    y = np.asarray(y)
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise DataError(f"features must be (N, D) and labels (N,), got {x.shape} and {y.shape}")
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test fraction must be in (0, 1), got {test_fraction:g}")
    n = x.shape[0]
    if task == "classification":
        values, y = np.unique(y, return_inverse=True)
        class_names = class_names or tuple(str(v) for v in values)
        if len(values) < 2:
            raise DataError("the label column has a single class: a classifier needs at least two")
        counts = np.bincount(y)
        n_test = int(np.ceil(test_fraction * n))
        if counts.min() < 2 or n_test < len(values) or n - n_test < len(values):
            raise DataError(
                f"too few examples to split {n} rows into train and test with every one of the "
                f"{len(values)} classes in both (smallest class: {counts.min()} rows); add rows or "
                "change the test fraction"
            )
        stratify = y
    else:
        class_names = class_names or ("target",)
        stratify = None
        if n < 4:
            raise DataError(f"only {n} rows: need at least 4 to split into train and test")
    rows = np.arange(n) if rows is None else np.asarray(rows)
    if test_mask is None:
        xtr, xte, ytr, yte, rtr, rte = train_test_split(x, y, rows, test_size=test_fraction, random_state=seed,
                                                        stratify=stratify)
    else:
        test = np.asarray(test_mask, bool)
        if test.shape != (n,) or test.all() or not test.any():
            raise DataError(f"the test mask must be (N,) = ({n},) booleans with both splits non-empty")
        xtr, xte, ytr, yte, rtr, rte = x[~test], x[test], y[~test], y[test], rows[~test], rows[test]
    if standardize not in ("feature", "global"):
        raise DataError(f"standardize must be 'feature' or 'global', got {standardize!r}")
    if standardize == "global":
        mu, sd = np.full(x.shape[1], xtr.mean()), np.full(x.shape[1], xtr.std())
    else:
        mu, sd = xtr.mean(0), xtr.std(0)
    sd = np.where(sd > 0, sd, 1.0)
    xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
    rng = np.random.default_rng(seed + 1)
    if task == "classification":
        ytr, yte = ytr.astype(np.int32), yte.astype(np.int32)
        noisy, flipped = flip_labels(ytr, label_noise, len(class_names), rng)
    else:
        ym, ys = ytr.mean(), ytr.std() or 1.0
        ytr, yte = ((ytr - ym) / ys).astype(np.float32), ((yte - ym) / ys).astype(np.float32)
        noisy, flipped = corrupt_targets(ytr, label_noise, rng)
    return Dataset(
        name=name,
        x_train=xtr.astype(np.float32),
        y_train=noisy,
        x_test=xte.astype(np.float32),
        y_test=yte,
        task=task,
        feature_names=tuple(feature_names or (f"x{i}" for i in range(x.shape[1]))),
        class_names=tuple(class_names),
        flipped=flipped,
        y_train_clean=ytr,
        image_shape=image_shape,
        x_mean=mu.astype(np.float32),
        x_std=sd.astype(np.float32),
        rows_train=rtr,
        rows_test=rte,
        row_label=row_label,
    )


def fashion_arrays() -> dict[str, np.ndarray]:
    """The bundled Fashion-MNIST subset as stored: `x_train (6000, 28, 28) uint8`, `y_train (6000,)`,
    `index_train (6000,)` (index in Fashion-MNIST's training file), and the same for the 1,000 test images.

    **Raises** `DataError` when the file is missing from the installation (package data not installed)."""
    try:
        with (importlib.resources.files("gradlab") / "data" / FASHION_FILE).open("rb") as f, np.load(f) as d:
            return {k: d[k] for k in d.files}
    except FileNotFoundError:
        raise DataError(f"gradlab/data/{FASHION_FILE} is missing from this installation: reinstall gradlab, or "
                        "run scripts/make_fashion_subset.py (needs Debian's dataset-fashion-mnist)") from None


def load_fashion(*, seed: int = 0, label_noise: float = 0.0) -> Dataset:
    """The Fashion-MNIST subset with its official split (6,000 training, 1,000 test images), flattened to
    `(N, 784)` and standardized by one mean and std over the training pixels (Xiao et al., 2017, arXiv:1708.07747).

    Rows are named by their index in Fashion-MNIST (test images: 60,000 + index in the test file).
    **Raises** `DataError` for an impossible noise rate or a missing data file."""
    d = fashion_arrays()
    x = np.concatenate([d["x_train"], d["x_test"]]).reshape(-1, 28 * 28)
    y = np.concatenate([d["y_train"], d["y_test"]])
    rows = np.concatenate([d["index_train"], d["index_test"] + FASHION_TEST_OFFSET])
    test = np.arange(len(y)) >= len(d["y_train"])
    return make_dataset("fashion", x, y, "classification", seed=seed, label_noise=label_noise,
                        feature_names=tuple(f"pixel {i}" for i in range(784)), class_names=FASHION_CLASSES,
                        image_shape=(28, 28), rows=rows, row_label="Fashion-MNIST index", test_mask=test,
                        standardize="global")


def load_dataset(name: str, *, seed: int = 0, label_noise: float = 0.0, test_fraction: float = 0.2) -> Dataset:
    """Load a bundled or generated dataset by name (see `DATASETS`), split and standardized.

    Fashion-MNIST keeps its own split (`test_fraction` is unused there, see `load_fashion`).

    **Raises** `DataError` for an unknown name or an impossible setting (see `make_dataset`).
    """
    if name == "fashion":
        return load_fashion(seed=seed, label_noise=label_noise)
    x, y, task, feats, classes, image_shape = _raw(name, seed)
    return make_dataset(
        name, x, y, task, seed=seed, label_noise=label_noise, test_fraction=test_fraction,
        feature_names=feats, class_names=classes, image_shape=image_shape,
    )


# ---------------------------------------------------------------- your own data: CSV import

#: Limits for an uploaded CSV: enough for teaching-size data, small enough for a 690 MB server.
CSV_MIN_ROWS = 10
CSV_MAX_ROWS = 5000
CSV_MAX_FEATURES = 200
CSV_MAX_CLASSES = 50


def read_csv(file_like, *, max_rows: int = CSV_MAX_ROWS, max_features: int = CSV_MAX_FEATURES):
    """Parse a CSV with a header row into a `pandas.DataFrame`, enforcing the size limits.

    **Arguments** `file_like`: a path, bytes, or a binary/text file object (an uploaded file);
    `max_rows`, `max_features`: the limits (the label column is not counted as a feature).

    **Returns** the table (at most `max_rows` rows, at most `max_features + 1` columns).

    **Raises** `DataError` when the file is empty, not UTF-8 text, not parseable as CSV, or over a limit.
    """
    if isinstance(file_like, (bytes, bytearray)):
        file_like = io.BytesIO(file_like)
    if hasattr(file_like, "seek"):
        file_like.seek(0)
    try:
        table = pd.read_csv(file_like, nrows=max_rows + 1, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise DataError("the file is empty: a CSV needs a header row and at least one row of numbers") from None
    except UnicodeDecodeError:
        raise DataError("the file is not UTF-8 text: save it as a plain CSV (comma-separated, UTF-8)") from None
    except (pd.errors.ParserError, ValueError) as err:
        raise DataError(f"the file could not be read as CSV ({str(err).strip().splitlines()[0]}); "
                        "check that every row has the same number of comma-separated fields") from None
    if len(table) == 0:
        raise DataError("the file has a header row but no data rows: add at least one row of numbers under it")
    names = [str(c) for c in table.columns]
    renamed = [c for c in names if "." in c and c.rsplit(".", 1)[0] in names and c.rsplit(".", 1)[1].isdigit()]
    if renamed:
        first = renamed[0].rsplit(".", 1)[0]
        cols = [i + 1 for i, c in enumerate(names) if c == first or c in renamed and c.rsplit(".", 1)[0] == first]
        raise DataError(f"the column name {first!r} appears more than once (columns {', '.join(map(str, cols))}): "
                        "rename one so every column has its own name")
    if len(table) > max_rows:
        raise DataError(f"more than {max_rows:,} rows: the limit keeps the app fast and within memory; "
                        f"upload a random sample of at most {max_rows:,} rows")
    if table.shape[1] - 1 > max_features:
        raise DataError(f"{table.shape[1] - 1:,} feature columns: the limit is {max_features:,}; "
                        "drop columns or reduce the dimension (e.g. PCA) first")
    if table.shape[1] < 2:
        raise DataError("the file has a single column: it needs at least one feature column and a label column")
    return table


def load_csv(
    file_like,
    label_column: str,
    task: str,
    *,
    seed: int = 0,
    label_noise: float = 0.0,
    test_fraction: float = 0.2,
    max_rows: int = CSV_MAX_ROWS,
    max_features: int = CSV_MAX_FEATURES,
    min_rows: int = CSV_MIN_ROWS,
    max_classes: int = CSV_MAX_CLASSES,
    name: str = "upload",
) -> Dataset:
    """Turn a user's CSV (numeric features + one label column) into a split, standardized `Dataset`.

    Every column except `label_column` is a feature and must be numeric. For classification the
    label column may hold any values (numbers or names: they become classes in sorted order);
    for regression it must be numeric.

    **Arguments**
    - `file_like`: path, bytes or file object of a CSV with a header row.
    - `label_column`: the header of the label column; `task`: `"classification"` or `"regression"`.
    - `seed`, `label_noise`, `test_fraction`: as in `make_dataset`.
    - `max_rows`, `max_features`, `min_rows`, `max_classes`: the limits.

    **Returns** a `Dataset` named `name`: `x_train (N, D) float32`, labels `(N,)`.

    **Raises** `DataError`, each with a message that says what to fix: unreadable file, unknown label
    column, non-numeric feature columns, missing or infinite values, too few rows, a single class,
    too many classes, more rows or features than the limits, a class too small to split.
    """
    if task not in ("classification", "regression"):
        raise DataError(f"task must be 'classification' or 'regression', got {task!r}")
    table = read_csv(file_like, max_rows=max_rows, max_features=max_features)
    if label_column not in table.columns:
        raise DataError(f"no column named {label_column!r}; the columns are: {', '.join(map(str, table.columns))}")
    features = table.drop(columns=[label_column])
    non_numeric = [str(c) for c in features.columns if not _numeric(features[c])]
    if non_numeric:
        shown = ", ".join(non_numeric[:8]) + (f" and {len(non_numeric) - 8} more" if len(non_numeric) > 8 else "")
        column = features[features.columns[[str(c) for c in features.columns].index(non_numeric[0])]]
        bad = column[pd.to_numeric(column, errors="coerce").isna() & column.notna()]
        first = f" (first: {str(bad.iloc[0])[:40]!r} at line {bad.index[0] + 2})" if len(bad) else ""
        raise DataError(f"non-numeric feature column(s): {shown}{first}. Features must be numbers: encode "
                        "categories as numbers (e.g. one-hot) or drop those columns")
    missing = table.isna().sum()
    missing = missing[missing > 0]
    if len(missing):
        where = ", ".join(f"{c} ({n} missing)" for c, n in list(missing.items())[:8])
        lines = (np.flatnonzero(table.isna().any(axis=1).to_numpy()) + 2)[:5]  # line 1 is the header
        raise DataError(f"missing values in {where}, at line(s) {', '.join(map(str, lines))}"
                        f"{' …' if table.isna().any(axis=1).sum() > 5 else ''}. Drop or fill those rows before uploading")
    x = features.to_numpy(np.float64)
    if not np.isfinite(x).all():
        bad = [str(c) for c, ok in zip(features.columns, np.isfinite(x).all(0)) if not ok]
        raise DataError(f"infinite values in {', '.join(bad[:8])}: replace them with finite numbers")
    n = len(table)
    if n < min_rows:
        raise DataError(f"only {n} row(s): at least {min_rows} are needed to train and to hold out a test split")
    labels = table[label_column]
    if task == "regression":
        if not _numeric(labels):
            raise DataError(f"the label column {label_column!r} is not numeric: regression needs numeric targets "
                            "(or choose classification)")
        y = labels.to_numpy(np.float64)
        if not np.isfinite(y).all():
            raise DataError(f"infinite values in the label column {label_column!r}")
        if np.ptp(y) == 0:
            raise DataError(f"the label column {label_column!r} is constant: there is nothing to regress")
        class_names = None
    else:
        values = labels.astype(str) if not _numeric(labels) else labels
        if _numeric(labels) and not np.all(np.mod(labels.to_numpy(np.float64), 1) == 0):
            example = next(v for v in labels if v % 1 != 0)
            raise DataError(f"the label column {label_column!r} holds non-integer numbers (e.g. {example:g}): "
                            "is it a regression target? Choose regression, or another label column")
        k = values.nunique()
        if k < 2:
            raise DataError(f"the label column {label_column!r} has a single class ({values.iloc[0]!s}): "
                            "a classifier needs at least two")
        if k > max_classes:
            raise DataError(f"the label column {label_column!r} has {k:,} distinct values (the limit is {max_classes}): "
                            "is it a regression target? Choose regression, or another label column")
        y = values.to_numpy()
        class_names = tuple(str(v) for v in np.unique(y))
    return make_dataset(
        name, x, y, task, seed=seed, label_noise=label_noise, test_fraction=test_fraction,
        feature_names=tuple(str(c) for c in features.columns), class_names=class_names,
        rows=np.arange(n) + 2, row_label="CSV line",  # line 1 is the header
    )


def _numeric(column) -> bool:
    """Whether a pandas column holds numbers (bools count as 0/1)."""
    return bool(pd.api.types.is_numeric_dtype(column.dtype))
