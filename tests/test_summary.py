"""The norm summary's one fused pass (`engine.layer_norms_and_grad_sum`) against a Python loop of `jax.grad`, and
its subset: which rows, the same numbers as the engine on those rows, and a size that fits the work budget."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradlab import costs, engine, losses, models, summary
from gradlab.experiment import Experiment, count_params, fit, forward_macs, load_data
from gradlab.metrics import gradient_noise_scale


def loop(loss, params, xs, ys):
    """Per-leaf squared norms (N, L), losses (N,) and Σᵢ gᵢ by a Python loop of jax.grad, in float64."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    vg = jax.jit(jax.value_and_grad(lambda d, x, y: loss(eqx.combine(d, static), x, y)))
    sq, ls, total = [], [], None
    for x, y in zip(xs, ys):
        value, g = vg(diff, x, y)
        g = [np.asarray(a, np.float64) for a in jax.tree.leaves(g)]
        sq.append([np.sum(a * a) for a in g])
        ls.append(float(value))
        total = g if total is None else [t + a for t, a in zip(total, g)]
    return np.array(sq), np.array(ls), total


def no_rule(p, x, y):  # every leaf enters a nonlinearity first: the vmap(grad) path
    return jnp.square(jnp.sum(jnp.sin(p["w"]) * x) + jnp.tanh(p["b"]) - y)


def no_rule_and_sum(p, x, y):
    return no_rule(p, x, y), jnp.sum(x)


@pytest.mark.parametrize("case", [pytest.param("simple_cnn", marks=pytest.mark.slow), "no_rule"])
def test_one_pass_equals_the_loop(case):
    if case == "simple_cnn":  # convolutions as patch products, max-pool, dense layers: every leaf by a rule
        params, loss = models.SimpleCNN((10, 10), 3, key=jax.random.key(0)), losses.cross_entropy
        xs, ys = jax.random.normal(jax.random.key(1), (7, 100)), jnp.array([0, 1, 2, 0, 1, 2, 0])
    else:
        params, loss = {"w": jnp.linspace(-1.0, 1.0, 5), "b": jnp.float32(0.3)}, no_rule
        xs, ys = jax.random.normal(jax.random.key(1), (7, 5)), jnp.linspace(-1.0, 1.0, 7)
    layer, got_loss, total = engine.layer_norms_and_grad_sum(loss, params, xs, ys, chunk_size=3)  # remainder 1
    sq, want_loss, want_total = loop(loss, params, xs, ys)
    assert list(layer) == engine.leaf_names(params)
    np.testing.assert_allclose(np.stack([np.asarray(v) for v in layer.values()], 1), np.sqrt(sq), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(total), want_total):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # has_aux: the same pass, and each example's aux (the predicted class) from the loss's own forward pass
    with_aux = no_rule_and_sum if case == "no_rule" else losses.cross_entropy_and_prediction
    *same, aux = engine.layer_norms_and_grad_sum(with_aux, params, xs, ys, chunk_size=3, has_aux=True)
    for a, b in zip(jax.tree.leaves(same), jax.tree.leaves((layer, got_loss, total))):
        np.testing.assert_array_equal(a, b)
    want = jnp.sum(xs, 1) if case == "no_rule" else np.argmax(jax.vmap(params)(xs), -1)
    np.testing.assert_allclose(aux, want, rtol=1e-6)


@pytest.fixture(scope="module")
def digits():
    return fit(Experiment(steps=30, checkpoint_every=30))


@pytest.mark.slow  # ~6 s: five compiled programs
def test_a_subset_summary_is_the_engine_on_those_rows(digits):
    f, size = digits, 300
    s = summary.norm_summary(f, size=size)
    idx = summary.subset(len(f.data.y_train), size)
    assert s.is_subset and s.n_train == len(f.data.y_train) and np.array_equal(s.index, idx)
    assert len(set(idx)) == size and np.all(np.diff(idx) > 0) and idx[-1] > size  # random rows, not the first ones
    xs, ys = f.data.x_train[idx], f.data.y_train[idx]
    np.testing.assert_allclose(s.norms, engine.per_example_norms(f.loss_fn, f.model, xs, ys), rtol=1e-4)
    np.testing.assert_allclose(s.losses, losses.per_example_losses(f.loss_fn, f.model, xs, ys), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(s.predictions, losses.predict(f.model, xs, "classification"))
    g = engine.batch_grad(f.loss_fn, f.model, xs, ys, reduction="mean")
    g_sq = sum(float(np.sum(np.square(np.asarray(a, np.float64)))) for a in jax.tree.leaves(g))
    assert s.noise_scale == pytest.approx(gradient_noise_scale(np.square(s.norms.astype(np.float64)), g_sq), rel=1e-3)
    full = summary.norm_summary(f)
    assert not full.is_subset and np.array_equal(full.index, np.arange(len(f.data.y_train)))
    np.testing.assert_allclose(full.norms[idx], s.norms, rtol=1e-5)


def test_the_summary_covers_what_the_budget_leaves_after_training():
    """The digits MLP: every example. Seed 003's SimpleCNN on Fashion-MNIST, had the link to train it: its training
    leaves the summary less than the whole set costs, so the smallest subset (training, summary and page near the
    budget's edge: 25 + 3.5 + 4 CPU-s estimated). The page trains it from a button instead and then summarizes
    every example (`ui.cache.summary_size`, tests/test_pages_fashion.py)."""
    for exp, whole in [(Experiment(), True), (Experiment.for_model("simple_cnn").replace(dataset="fashion"), False)]:
        d = load_data(exp)
        p, m, n = count_params(exp, d), forward_macs(exp, d), len(d.y_train)
        train = costs.training_seconds(p, exp.steps, exp.batch_size, m)
        size = summary.summary_size(n, p, m, train)
        assert (size == n) == whole
        if whole:
            assert train + costs.summary_seconds(p, size, m) + costs.PAGE_SECONDS <= costs.WORK_BUDGET_SECONDS
        else:
            assert size == summary.SUBSET_SIZES[0]
            assert train <= costs.WORK_BUDGET_SECONDS  # the training itself passes `check_training_work`
            assert train + costs.summary_seconds(p, size, m) + costs.PAGE_SECONDS < 1.2 * costs.WORK_BUDGET_SECONDS
