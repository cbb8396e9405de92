"""The bundled Fashion-MNIST subset: made bit for bit by its script, equal to Debian's IDX files, loaded with its
official split and its row names; seed 003's SimpleCNN on it against `eqx.nn.Conv2d` and the seed's shapes."""

from __future__ import annotations

import gzip
import importlib.util
import tomllib
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradlab import data, models
from gradlab.experiment import Experiment, check_training_work, count_params, forward_macs

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "gradlab" / "data" / data.FASHION_FILE
DEBIAN = Path("/usr/share/datasets/fashion-mnist")
needs_debian = pytest.mark.skipif(not (DEBIAN / "train-images-idx3-ubyte.gz").exists(),
                                  reason="Debian's dataset-fashion-mnist is not installed")


def _script():
    spec = importlib.util.spec_from_file_location("make_fashion_subset", ROOT / "scripts" / "make_fashion_subset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _idx(name: str) -> np.ndarray:
    """An IDX file read independently of the script: 16-byte image header, 8-byte label header."""
    raw = gzip.decompress((DEBIAN / name).read_bytes())
    return np.frombuffer(raw[16:], np.uint8).reshape(-1, 28, 28) if "images" in name else np.frombuffer(raw[8:], np.uint8)


def test_shipped_subset_is_small_stratified_and_what_the_package_data_names():
    assert SHIPPED.stat().st_size <= 5 * 2**20
    d = data.fashion_arrays()
    for split, n, total in (("train", 6000, 60_000), ("test", 1000, 10_000)):
        assert d[f"x_{split}"].shape == (n, 28, 28) and d[f"x_{split}"].dtype == np.uint8
        assert np.all(np.bincount(d[f"y_{split}"], minlength=10) == n // 10)
        idx = d[f"index_{split}"]
        assert np.all(np.diff(idx) > 0) and 0 <= idx[0] and idx[-1] < total  # distinct, in original order
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["gradlab"]
    assert "data/*.npz" in package_data and "data/README.md" in package_data


@needs_debian
def test_subset_holds_debians_images_at_its_indices():
    d = data.fashion_arrays()
    for split, name in (("train", "train"), ("test", "t10k")):
        images, labels = _idx(f"{name}-images-idx3-ubyte.gz"), _idx(f"{name}-labels-idx1-ubyte.gz")
        np.testing.assert_array_equal(d[f"x_{split}"], images[d[f"index_{split}"]])
        np.testing.assert_array_equal(d[f"y_{split}"], labels[d[f"index_{split}"]])


@pytest.mark.slow
@needs_debian
def test_script_reproduces_the_shipped_file_bit_for_bit(tmp_path):
    written = _script().main(["--out", str(tmp_path)])
    assert written.read_bytes() == SHIPPED.read_bytes()


def test_load_fashion_keeps_the_official_split_names_rows_and_undoes_its_scaling():
    d, raw = data.load_dataset("fashion", label_noise=0.1), data.fashion_arrays()
    assert d.x_train.shape == (6000, 784) and d.x_test.shape == (1000, 784) and d.image_shape == (28, 28)
    assert d.class_names[0] == "T-shirt/top" and d.n_classes == 10
    # rows: training images by their index, test images after the 60,000 training ones (as in OpenML's 70,000)
    np.testing.assert_array_equal(d.rows_train, raw["index_train"])
    np.testing.assert_array_equal(d.rows_test, raw["index_test"] + 60_000)
    assert d.row_label == "Fashion-MNIST index"
    np.testing.assert_array_equal(d.y_test, raw["y_test"])
    np.testing.assert_array_equal(d.y_train_clean, raw["y_train"])
    assert d.flipped.sum() == 600 and np.all(d.y_train[d.flipped] != raw["y_train"][d.flipped])
    # one mean and std over every training pixel: the pixels come back exactly
    assert abs(d.x_train.mean()) < 1e-4 and abs(d.x_train.std() - 1) < 1e-4
    assert np.all(d.x_std == d.x_std[0])
    np.testing.assert_allclose(d.raw(d.x_train[:5]), raw["x_train"][:5].reshape(5, -1), atol=1e-3)


def test_a_fixed_split_that_leaves_a_side_empty_is_refused():
    x, y = np.zeros((10, 2)), np.arange(10) % 2
    with pytest.raises(data.DataError, match="test mask"):
        data.make_dataset("t", x, y, "classification", test_mask=np.zeros(10, bool))
    with pytest.raises(data.DataError, match="standardize"):
        data.make_dataset("t", x, y, "classification", standardize="per-image")


def _seed_forward(m, x):
    """Seed 003's forward with Equinox's own convolutions (lax.conv) and max-pool: the oracle for the im2col path."""
    z = jax.nn.relu(m.conv2(jax.nn.relu(m.conv1(x.reshape(1, 28, 28)))))
    z = eqx.nn.MaxPool2d(2, 2)(z)
    return jax.nn.log_softmax(m.fc2(jax.nn.relu(m.fc1(z.reshape(-1)))))


def test_simple_cnn_is_seed_003s_network():
    m = models.build_model(models.ModelSpec("simple_cnn"), 784, 10, key=jax.random.key(0), image_shape=(28, 28))
    shapes = {k: v.shape for k, v in zip(["c1w", "c1b", "c2w", "c2b", "f1w", "f1b", "f2w", "f2b"],
                                         jax.tree.leaves(eqx.filter(m, eqx.is_array)))}
    assert shapes["c1w"] == (32, 1, 3, 3) and shapes["c2w"] == (64, 32, 3, 3)
    assert shapes["f1w"] == (128, 9216) and shapes["f2w"] == (10, 128)  # nn.Linear(9216, 128), nn.Linear(128, 10)
    assert sum(np.prod(s) for s in shapes.values()) == 1_199_882
    xs = jax.random.normal(jax.random.key(1), (3, 784))
    got = jax.vmap(m)(xs)
    np.testing.assert_allclose(got, jax.vmap(lambda x: _seed_forward(m, x))(xs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jnp.exp(got).sum(1), 1.0, rtol=1e-5)  # log-probabilities (the seed's NLL input)
    with pytest.raises(data.DataError, match="images"):
        models.build_model(models.ModelSpec("simple_cnn"), 30, 2, key=jax.random.key(0))
    with pytest.raises(data.DataError, match="classifier"):
        models.build_model(models.ModelSpec("simple_cnn"), 64, 1, key=jax.random.key(0), image_shape=(8, 8))


def test_simple_cnn_starts_from_eqx_nns_initializer_distribution():
    """One uniform draw for all layers (`models._uniform_layers`): each leaf U(−1/√fan_in, 1/√fan_in) as
    eqx.nn.Conv2d / eqx.nn.Linear (and PyTorch) draw it: within the bound, spread over it, a different draw per
    seed and the same one again for the same seed."""
    def leaves(seed):
        m = models.SimpleCNN((28, 28), 10, key=jax.random.key(seed))
        return [np.asarray(a) for a in jax.tree.leaves(eqx.filter(m, eqx.is_array))]

    a, b, c = leaves(0), leaves(0), leaves(1)
    fans = [9, 9, 288, 288, 9216, 9216, 128, 128]  # conv1, conv2, fc1, fc2: weight and bias share the weight's fan-in
    for leaf, again, other, fan in zip(a, b, c, fans):
        bound = 1 / np.sqrt(fan)
        assert np.abs(leaf).max() <= bound and np.abs(leaf).max() > 0.8 * bound
        assert abs(np.std(leaf) / (bound / np.sqrt(3)) - 1) < 0.3  # U(−a, a) has std a/√3
        np.testing.assert_array_equal(leaf, again)
        assert not np.array_equal(leaf, other)


def test_training_work_counts_the_convolutions_multiply_adds():
    fashion, digits = data.load_dataset("fashion"), data.load_dataset("digits")
    exp = Experiment(dataset="fashion", model="simple_cnn")
    by_hand = 26 * 26 * 32 * 9 + 24 * 24 * 64 * 32 * 9 + 9216 * 128 + 128 * 10  # conv1, conv2, fc1, fc2
    assert abs(forward_macs(exp, fashion) / by_hand - 1) < 0.02
    mlp = Experiment(dataset="digits", model="mlp")
    assert abs(forward_macs(mlp, digits) / count_params(mlp, digits) - 1) < 0.01  # a dense layer: one MAC per weight
    p, macs = count_params(exp, fashion), forward_macs(exp, fashion)
    with pytest.raises(ValueError, match=r"Training steps\*\* to 50 or fewer"):  # 300 × 128: ~110 CPU-s
        check_training_work(exp, p, macs)
    check_training_work(exp.replace(steps=100, batch_size=64), p, macs)  # ~20 CPU-s: within the 30 s budget
