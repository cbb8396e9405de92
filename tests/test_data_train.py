"""Datasets, models and training: splits, label noise, divergence, checkpoints."""

from __future__ import annotations

import equinox as eqx
import numpy as np
import pytest

from gradlab import losses
from gradlab.data import DATASETS, DataError, load_dataset, make_dataset
from gradlab.experiment import Experiment, fit
from gradlab.metrics import detection_roc, fraction_in_top, gradient_noise_scale
from gradlab.models import ModelSpec, build_model
from gradlab.train import TrainingError


@pytest.mark.parametrize("name", list(DATASETS))
def test_every_dataset_is_standardized_and_split(name):
    d = load_dataset(name, seed=3)
    assert d.x_train.dtype == np.float32 and d.x_train.shape[1] == d.x_test.shape[1]
    # images: one mean and std over every pixel (a blank corner pixel is not blown up); others per feature
    np.testing.assert_allclose(d.x_train.mean(None if name == "fashion" else 0), 0, atol=1e-4)
    if d.task == "classification":
        # stratified: every class in both splits, in about the same proportion
        assert set(np.unique(d.y_train)) == set(np.unique(d.y_test)) == set(range(d.n_classes))
        np.testing.assert_allclose(np.bincount(d.y_train) / len(d.y_train), np.bincount(d.y_test) / len(d.y_test), atol=0.03)


@pytest.mark.parametrize("standardize", ["feature", "global"])
def test_standardizing_in_blocks_gives_the_whole_array_values_bit_for_bit(standardize):
    """`make_dataset` standardizes in float64 blocks of rows (no whole float64 temporaries): every float32 value is
    the one the whole-array expression `((x - mu) / sd).astype(float32)` gives, over more rows than one block."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(2600, 17)).astype(np.uint8)  # pixel-like, as Fashion-MNIST's
    x[:, 3] = 7  # a constant column: sd 1
    y = rng.integers(0, 3, size=2600)
    d = make_dataset("t", x, y, "classification", seed=1, standardize=standardize)
    xtr = np.concatenate([d.x_train, d.x_test])
    raw = x.astype(np.float64)[np.concatenate([d.rows_train, d.rows_test])]
    train = raw[: len(d.x_train)]
    mu, sd = (train.mean(0), train.std(0)) if standardize == "feature" else (train.mean(), train.std())
    sd = np.where(sd > 0, sd, 1.0)
    want = ((raw - mu) / sd).astype(np.float32)
    assert xtr.dtype == np.float32 and np.array_equal(xtr, want)


def test_label_noise_flips_exactly_the_mask_to_other_classes():
    d = load_dataset("digits", seed=0, label_noise=0.1)
    assert d.flipped.sum() == round(0.1 * len(d.y_train))
    assert np.all(d.y_train[d.flipped] != d.y_train_clean[d.flipped])
    assert np.all(d.y_train[~d.flipped] == d.y_train_clean[~d.flipped])
    again = load_dataset("digits", seed=0, label_noise=0.1)
    np.testing.assert_array_equal(again.y_train, d.y_train)  # seeded


def test_impossible_settings_raise_data_errors():
    with pytest.raises(DataError, match="100%"):
        load_dataset("digits", label_noise=1.0)
    with pytest.raises(DataError, match="single class"):
        make_dataset("x", np.ones((10, 2)), np.zeros(10), "classification")
    with pytest.raises(DataError, match="too few"):
        make_dataset("x", np.ones((3, 2)), np.array([0, 1, 1]), "classification")


def test_training_reduces_loss_and_keeps_checkpoints():
    f = fit(Experiment(dataset="moons", steps=100, checkpoint_every=25))
    assert f.run.steps == (0, 25, 50, 75, 100)
    assert len(f.run.checkpoints) == 5 and len(f.run.losses) == 100
    assert f.run.losses[-10:].mean() < 0.5 * f.run.losses[:10].mean()
    acc = np.mean(np.asarray(losses.predict(f.model, f.data.x_test, "classification")) == f.data.y_test)
    assert acc > 0.85
    # the Influence page's test summary: both from one pass, as the two separate calls give them
    loss, pred = f.losses_and_predictions(f.model, f.data.x_test, f.data.y_test)
    np.testing.assert_allclose(loss, losses.per_example_losses(f.loss_fn, f.model, f.data.x_test, f.data.y_test),
                               rtol=1e-6)
    np.testing.assert_array_equal(pred, f.predict(f.model, f.data.x_test))


def test_diverging_run_says_what_to_change():
    with pytest.raises(TrainingError, match="learning rate"):
        fit(Experiment(dataset="diabetes", model="mlp", optimizer="sgd", lr=100.0, steps=50))


def test_cnn_needs_images():
    with pytest.raises(DataError, match="image"):
        fit(Experiment(dataset="moons", model="cnn", steps=0))


def test_experiment_round_trips_through_the_url():
    e = Experiment(dataset="moons", lr=0.3, label_noise=0.15, seed=7)
    q = e.to_query()
    assert q == {"dataset": "moons", "lr": "0.3", "label_noise": "0.15", "seed": "7"}
    assert Experiment.from_query(q) == e
    assert hash(Experiment.from_query(q)) == hash(e)
    with pytest.raises(ValueError, match="steps"):
        Experiment.from_query({"steps": "many"})


def test_metrics_against_hand_computed_values():
    det = detection_roc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1], bool))
    assert det.auc == pytest.approx(0.75)  # scikit-learn's documented example
    assert fraction_in_top(np.array([5, 1, 4, 2]), np.array([1, 0, 0, 1], bool), 0.5) == 0.5
    g = np.array([[1.0, 0.0], [3.0, 2.0], [-1.0, 1.0]])
    G = g.mean(0)
    cov_trace = np.trace(np.cov(g.T, ddof=1))
    assert gradient_noise_scale((g**2).sum(1), float(G @ G)) == pytest.approx(cov_trace / (G @ G))


def test_count_params_from_shapes_equals_the_built_model():
    """`experiment.count_params` traces the initializer without running it; it must count what the model holds."""
    from gradlab import engine
    from gradlab.experiment import Experiment, count_params, init_model, load_data

    for exp in (Experiment(), Experiment(width=32, depth=3), Experiment(model="cnn"), Experiment(model="linear", dataset="moons")):
        data = load_data(exp)
        assert count_params(exp, data) == engine.num_params(init_model(exp, data)), exp


def _end_of_run(opt, steps):
    """w after `steps` updates of `opt` on a fixed quadratic's gradient 2w + 0.3, from w = (1, -2, 3)."""
    import jax
    import jax.numpy as jnp
    import optax

    q = {"w": jnp.array([1.0, -2.0, 3.0])}
    s = opt.init(q)
    for _ in range(steps):
        u, s = opt.update(jax.tree.map(lambda w: 2 * w + 0.3, q), s, q)
        q = optax.apply_updates(q, u)
    return q["w"]


def _digits_lrs(optimizer):
    """`TrainResult.lrs` of a linear model trained 20 steps at lr 0.01 with `optimizer` on digits, checkpoints every 5."""
    import jax

    from gradlab.train import train

    d = load_dataset("digits")
    model = build_model(ModelSpec("linear"), d.n_features, d.n_classes, key=jax.random.key(0))
    return train(model, losses.cross_entropy, d.x_train, d.y_train, optimizer=optimizer, lr=0.01, steps=20,
                 checkpoint_every=5).lrs


def test_adam_linear_is_optax_adam_on_a_linear_schedule_and_tracin_sees_the_decayed_rate():
    import optax

    from gradlab.train import make_optimizer

    # two steps past the end: the rate stays 0
    np.testing.assert_allclose(_end_of_run(make_optimizer("adam_linear", 0.1, 10), 12),
                               _end_of_run(optax.adam(optax.linear_schedule(0.1, 0.0, 10)), 12), rtol=1e-6)
    with pytest.raises(TrainingError, match="number of steps"):
        make_optimizer("adam_linear", 0.1)
    np.testing.assert_allclose(_digits_lrs("adam_linear"), [0.01 * (1 - s / 20) for s in range(0, 21, 5)], rtol=1e-6)


def test_adam_warmup_is_optax_adam_with_b2_099_on_a_joined_warmup_and_decay_schedule_and_tracin_sees_its_rate():
    import optax

    from gradlab.train import make_optimizer

    # 20 steps: warm-up over round(0.1 · 20) = 2 steps (0.05, 0.1), then 0.1 · (20 − t) / 18 from t = 2
    reference = optax.adam(optax.join_schedules(
        [optax.linear_schedule(0.05, 0.1, 1), optax.linear_schedule(0.1, 0.0, 18)], boundaries=[2]), b2=0.99)
    # two steps past the end: the rate stays 0
    np.testing.assert_allclose(_end_of_run(make_optimizer("adam_warmup", 0.1, 20), 22), _end_of_run(reference, 22),
                               rtol=1e-5)
    with pytest.raises(TrainingError, match="number of steps"):
        make_optimizer("adam_warmup", 0.1)
    np.testing.assert_allclose(_digits_lrs("adam_warmup"), [0.005, 0.01 * 15 / 18, 0.01 * 10 / 18, 0.01 * 5 / 18, 0.0],
                               rtol=1e-5)


def test_epoch_order_shows_every_example_once_per_epoch_and_random_order_draws_each_batch_without_repeats():
    from gradlab.train import minibatch_order

    idx = minibatch_order(10, 7, 4, seed=3, order="epoch")  # 28 draws: epochs 1 and 2 whole, 8 of the third
    assert idx.shape == (7, 4)
    flat = idx.ravel()
    for epoch in (flat[:10], flat[10:20]):
        assert sorted(epoch) == list(range(10))
    assert len(set(flat[20:])) == 8
    assert not np.array_equal(flat[:10], flat[10:20])  # a new order each epoch
    np.testing.assert_array_equal(idx, minibatch_order(10, 7, 4, seed=3, order="epoch"))  # seeded
    with pytest.raises(TrainingError, match="order"):
        minibatch_order(10, 7, 4, seed=3, order="sorted")


def test_the_moving_average_checkpoints_are_the_debiased_ema_of_every_steps_parameters():
    import jax

    from gradlab.train import train

    d = load_dataset("digits")
    model = build_model(ModelSpec("linear"), d.n_features, d.n_classes, key=jax.random.key(0))
    kw = dict(optimizer="adam_warmup", lr=0.05, steps=12, batch_size=32, seed=1, order="epoch")
    every = train(model, losses.cross_entropy, d.x_train, d.y_train, checkpoint_every=1, **kw)  # θ_1 … θ_12
    avg = train(model, losses.cross_entropy, d.x_train, d.y_train, checkpoint_every=5, ema=0.9, **kw)
    assert avg.steps == (0, 5, 10, 12)
    ema = np.zeros(np.asarray(model.layer.weight).shape)  # float64 oracle: e_t = 0.9 e_(t-1) + 0.1 θ_t, then e_t / (1 − 0.9^t)
    for t in range(1, 13):
        ema = 0.9 * ema + 0.1 * np.asarray(every.checkpoints[t].layer.weight, np.float64)
        if t in avg.steps:
            np.testing.assert_allclose(avg.checkpoints[avg.steps.index(t)].layer.weight, ema / (1 - 0.9 ** t),
                                       rtol=2e-5, atol=1e-7)
    np.testing.assert_array_equal(avg.checkpoints[0].layer.weight, model.layer.weight)  # step 0: the initialization
    np.testing.assert_array_equal(avg.losses, every.losses)  # the optimizer's own path is unchanged
    with pytest.raises(TrainingError, match="decay"):
        train(model, losses.cross_entropy, d.x_train, d.y_train, steps=2, ema=1.0)


def test_label_smoothing_trains_on_the_cross_entropy_against_the_smoothed_target():
    import jax

    from gradlab.train import train

    d = load_dataset("digits")
    model = build_model(ModelSpec("linear"), d.n_features, d.n_classes, key=jax.random.key(0))
    x, y = d.x_train[:5], d.y_train[:5]
    z = np.asarray(jax.vmap(model)(x), np.float64)  # float64 oracle: −Σ_k q_k log softmax(z)_k, q = 0.8 onehot + 0.2 / K
    q = 0.8 * np.eye(d.n_classes)[y] + 0.2 / d.n_classes
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    got = [float(losses.smoothed_cross_entropy(model, x[i], y[i], 0.2)) for i in range(5)]
    np.testing.assert_allclose(got, -(q * logp).sum(1), rtol=1e-5)
    kw = dict(optimizer="adam", lr=0.05, steps=4, batch_size=32, checkpoint_every=4)
    plain = train(model, losses.cross_entropy, d.x_train, d.y_train, **kw)
    smooth = train(model, losses.cross_entropy, d.x_train, d.y_train, label_smoothing=0.2, **kw)
    assert smooth.losses[0] > plain.losses[0]  # same first batch and weights: the smoothed target costs more
    with pytest.raises(TrainingError, match="cross-entropy"):
        train(model, losses.mse, d.x_train, d.y_train.astype(np.float32), steps=2, label_smoothing=0.1)


def test_a_model_starts_from_its_recipe_and_simple_cnns_fits_the_work_budget():
    from gradlab import costs
    from gradlab.experiment import MODEL_DEFAULTS, count_params, forward_macs, load_data

    exp = Experiment.from_query({"dataset": "fashion", "model": "simple_cnn"})
    assert exp == Experiment(dataset="fashion", **{"model": "simple_cnn", **MODEL_DEFAULTS["simple_cnn"]})
    assert exp.to_query() == {"dataset": "fashion", "model": "simple_cnn"}
    assert Experiment.from_state({"dataset": "fashion", "model": "simple_cnn"}) == exp
    mine = exp.replace(steps=500, optimizer="adam")  # a visitor's own settings round-trip too
    assert Experiment.from_query(mine.to_query()) == mine and mine.to_query()["steps"] == "500"
    assert Experiment.from_query({"model": "mlp"}) == Experiment()
    data = load_data(exp)
    need = costs.training_seconds(count_params(exp, data), exp.steps, exp.batch_size, forward_macs(exp, data))
    assert need <= costs.WORK_BUDGET_SECONDS  # its 85% test accuracy: python -m benchmarks.fashion_cnn


def test_a_loss_with_its_prediction_equals_the_loss_and_predict_apart():
    f = fit(Experiment(steps=20, checkpoint_every=20))
    d, m = f.data, f.model
    loss, pred = eqx.filter_vmap(losses.with_prediction(d.task), in_axes=(None, 0, 0))(m, d.x_train, d.y_train)
    np.testing.assert_allclose(loss, losses.per_example_losses(f.loss_fn, m, d.x_train, d.y_train), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(pred, losses.predict(m, d.x_train, d.task))


def test_an_example_is_named_by_its_row_in_the_source():
    from gradlab.data import FASHION_TEST_OFFSET, fashion_arrays

    d, raw = load_dataset("fashion"), fashion_arrays()
    for i in (0, 5, 4321):  # the image shown as row #r is Fashion-MNIST's image r
        at = int(np.flatnonzero(raw["index_train"] == d.row(i))[0])
        np.testing.assert_allclose(d.raw(d.x_train[i]).reshape(28, 28), raw["x_train"][at], atol=1e-3)
    at = int(np.flatnonzero(raw["index_test"] + FASHION_TEST_OFFSET == d.row(3, "test"))[0])
    np.testing.assert_allclose(d.raw(d.x_test[3]).reshape(28, 28), raw["x_test"][at], atol=1e-3)
