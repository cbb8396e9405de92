"""`python -m gradlab`: the headless command, checked against a jax.grad loop and the accountant."""

from __future__ import annotations

import io
import subprocess
import sys

import equinox as eqx
import jax
import numpy as np
import pandas as pd
import pytest

from gradlab import cli, engine, influence, losses, privacy
from gradlab.data import load_dataset
from gradlab.models import ModelSpec, build_model


@pytest.fixture(scope="module")
def moons_csv(tmp_path_factory):
    """The moons toy as a user's CSV: two feature columns and a label column named "class"."""
    ds = load_dataset("moons", seed=0)
    x = np.concatenate([ds.raw(ds.x_train), ds.raw(ds.x_test)])
    y = np.concatenate([ds.y_train, ds.y_test])
    path = tmp_path_factory.mktemp("cli") / "moons.csv"
    pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "class": y}).to_csv(path, index=False)
    return path


def _args(*extra):
    return ["--model", "linear", "--train-steps", "0", "--block", "100", *extra]


def test_norms_from_csv_match_a_grad_loop(moons_csv, tmp_path, capsys):
    out = tmp_path / "norms.parquet"
    assert cli.main(["norms", "--data", str(moons_csv), "--label", "class", *_args("--out", str(out))]) == 0
    log = capsys.readouterr().out
    assert "memory estimate: per device (XLA, one block)" in log and "wrote" in log
    table = pd.read_parquet(out)
    # the oracle: the same split and initial model, one jax.grad per example
    ds = cli.data_from_spec(str(moons_csv), label="class", task="classification", seed=0, label_noise=0.0,
                       test_fraction=0.2)
    model = build_model(ModelSpec("linear"), 2, 2, key=jax.random.key(0))
    g = eqx.filter_jit(eqx.filter_grad(losses.cross_entropy))
    norms = [np.sqrt(sum(float(np.sum(np.square(a))) for a in jax.tree.leaves(g(model, x, y))))
             for x, y in zip(ds.x_train, ds.y_train)]
    assert len(table) == len(ds.x_train) == 480  # 5 blocks of 100, the last one padded and trimmed
    np.testing.assert_allclose(table["grad_norm"], norms, rtol=1e-5)
    np.testing.assert_array_equal(table["label"], ds.y_train)
    layers = table[[c for c in table if c.startswith("grad_norm.")]].to_numpy(np.float64)
    np.testing.assert_allclose(np.sqrt(np.square(layers).sum(1)), norms, rtol=1e-5)


def test_dp_sgd_npz_epsilon_from_the_accountant(tmp_path, capsys):
    ds = load_dataset("blobs", seed=0)
    data = tmp_path / "blobs.npz"
    np.savez(data, x=np.concatenate([ds.x_train, ds.x_test]), y=np.concatenate([ds.y_train, ds.y_test]))
    out = tmp_path / "dp.npz"
    argv = ["dp-sgd", "--data", str(data), "--model", "linear", "--steps", "40", "--checkpoint-every", "20",
            "--sample-rate", "0.05", "--noise-multiplier", "1.0", "--clip-norm", "0.5", "--out", str(out)]
    assert cli.main(argv) == 0
    z = np.load(out)
    assert z["step"].tolist() == list(range(1, 41))
    assert np.isnan(z["epsilon"][:19]).all() and np.isfinite(z["epsilon"][[19, 39]]).all()
    expected = privacy.dp_sgd_epsilon(sample_rate=0.05, noise_multiplier=1.0, steps=40, delta=1e-5)
    assert z["epsilon"][39] == pytest.approx(expected, rel=1e-9)
    assert ((z["clipped_fraction"] >= 0) & (z["clipped_fraction"] <= 1)).all()
    assert f"ε = {expected:.3g}" in capsys.readouterr().out


def test_influence_columns_are_the_library_scores(tmp_path):
    out = tmp_path / "influence.csv"
    argv = ["influence", "--data", "moons", *_args("--test-index", "3", "--damping", "0.1", "--out", str(out))]
    assert cli.main(argv) == 0
    table = pd.read_csv(out)
    ds = load_dataset("moons", seed=0)
    model = build_model(ModelSpec("linear"), 2, 2, key=jax.random.key(0))
    want = influence.predicted_loo_change(losses.cross_entropy, model, ds.x_train, ds.y_train, ds.x_test[3],
                                          ds.y_test[3], damping=0.1)
    np.testing.assert_allclose(table["loo_change_test3"], want, rtol=1e-5, atol=1e-9)
    norms = engine.per_example_norms(losses.cross_entropy, model, ds.x_train, ds.y_train)
    np.testing.assert_allclose(table["self_influence"], np.square(norms), rtol=1e-5)


@pytest.mark.parametrize("argv,message", [
    (["norms", "--data", "nope"], "neither a bundled dataset"),
    (["norms", "--data", "missing.csv"], "no file"),
    (["norms", "--data", "moons", "--out", "x.xlsx"], "use a .csv, .npz or .parquet"),
    (["influence", "--data", "moons", "--test-index", "9999"], "out of range"),
    (["dp-sgd", "--data", "moons", "--sample-rate", "2"], "--sample-rate q must be in (0, 1]"),
])
def test_bad_input_says_what_to_fix(argv, message, capsys):
    argv = argv + (["--estimate-only", "--train-steps", "0"] if argv[0] != "dp-sgd" else ["--estimate-only"])
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_csv_without_label_column(moons_csv, capsys):
    assert cli.main(["norms", "--data", str(moons_csv), "--estimate-only"]) == 2
    assert "needs --label COLUMN" in capsys.readouterr().err


def test_progress_bar_follows_the_train_functions_progress_calls():
    stream = io.StringIO()
    bar = cli.progress_bar("work", 100, stream=stream)
    for i in (1, 50, 100):  # progress(step, steps) as train() calls it, after each checkpoint
        bar(i, 100)
    out = stream.getvalue()
    assert out.startswith("\rwork:") and out.endswith("\n")  # closed at the end
    assert "100%" in out and "100/100" in out.rsplit("\r", 1)[-1]
    later = cli.progress_bar("more", 10, stream=stream)
    later(4, 8)  # a new total from the caller
    later(8, 8)
    assert "8/8" in stream.getvalue().rsplit("\r", 1)[-1]


@pytest.mark.slow  # a fresh interpreter importing JAX; main() is tested above
def test_python_dash_m_gradlab_devices():
    r = subprocess.run([sys.executable, "-m", "gradlab", "devices"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"devices: {jax.device_count()} × {jax.devices()[0].device_kind}")
