"""The attribution protocol and its registry (`gradlab.influence.methods.METHODS`), checked against independent
oracles: a loop of `jax.grad` in float64 for the last-layer method (the one added the registry way), the pre-registry
functions of `scores` for every other method, and the one subset ensemble against its draws and the training loop."""

from __future__ import annotations

import re
from types import SimpleNamespace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradlab import ensemble, losses
from gradlab.experiment import Experiment, fit
from gradlab.influence import METHODS, scores
from gradlab.influence import fitted as ifit
from gradlab.influence import methods
from gradlab.influence.methods import last_layer
from gradlab.influence.protocol import Context, Method
from gradlab.models import ModelSpec, build_model
from gradlab.ui import pages


def test_every_method_declares_the_protocol():
    """Names are URL codes, labels and short labels unique, controls declared on the page, cache keys complete."""
    keys = set(pages.control_keys())
    for name, m in METHODS.items():
        assert m.name == name and re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        assert m.label and m.short and (m.self_label is None) == (m.self_short is None), name
        assert set(m.prepare_reads) <= set(m.reads), name  # a score's key holds what its preparation read
        assert {c.key for c in m.controls} <= keys and {c.name for c in m.controls} <= set(m.reads), name
    assert len({m.short for m in METHODS.values()}) == len(METHODS) == len({m.label for m in METHODS.values()})


def _mlp_context(n=30, seed=0):
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(n, 3))
    ys = rng.integers(0, 3, n)
    model = build_model(ModelSpec("mlp", width=5, depth=1, activation="tanh"), 3, 3, key=jax.random.key(seed))
    model = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64) if isinstance(a, jax.Array) else a, model)
    data = SimpleNamespace(x_train=xs, y_train=ys, x_test=xs[:4] + 0.1, y_test=ys[:4], task="classification")
    f = SimpleNamespace(model=model, loss_fn=losses.cross_entropy, data=data)
    return Context(f, {}, lambda: None), model, xs, ys


def _last_layer_grad(model, x, y):
    """The oracle: the output layer's (weight, bias) gradient of one example, by `jax.grad` of the whole model."""
    g = eqx.filter_grad(losses.cross_entropy)(model, jnp.asarray(x), jnp.asarray(y))
    out = g.mlp.layers[-1]
    return np.concatenate([np.ravel(out.weight), np.ravel(out.bias)])


def test_last_layer_matches_a_loop_of_jax_grad_in_float64(x64):
    ctx, model, xs, ys = _mlp_context()
    assert last_layer.last_layer(model) == (".mlp.layers[1].weight", ".mlp.layers[1].bias")
    m = METHODS["last_layer"]
    got = m.scores(ctx, None, jnp.asarray(ctx.fitted.data.x_test), jnp.asarray(ctx.fitted.data.y_test)).values
    train = np.stack([_last_layer_grad(model, x, y) for x, y in zip(xs, ys)])                     # (N, P_last)
    test = np.stack([_last_layer_grad(model, x, y) for x, y in zip(ctx.fitted.data.x_test, ctx.fitted.data.y_test)])
    assert got.dtype == np.float64 and got.shape == (4, len(xs))
    np.testing.assert_allclose(got, test @ train.T, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(m.self_influence(ctx, None), np.sum(train**2, 1), rtol=1e-10)
    # the representer form: a dense softmax output layer's gradient is (p − e_y) ⊗ [a; 1]
    hidden = jax.vmap(lambda x: jnp.tanh(model.mlp.layers[0](x)))(jnp.asarray(xs))
    delta = jax.nn.softmax(jax.vmap(model)(jnp.asarray(xs))) - jax.nn.one_hot(ys, 3)
    kernel = (delta @ delta.T) * (hidden @ hidden.T + 1)
    np.testing.assert_allclose(train @ train.T, kernel, rtol=1e-10, atol=1e-14)


def test_last_layer_does_not_apply_to_one_layer():
    lin = SimpleNamespace(model=build_model(ModelSpec("linear"), 3, 3, key=jax.random.key(0)))
    mlp = SimpleNamespace(model=build_model(ModelSpec("mlp", width=4), 3, 3, key=jax.random.key(0)))
    assert "one layer" in METHODS["last_layer"].applies(lin) and METHODS["last_layer"].applies(mlp) is None


@pytest.fixture(scope="module")
def moons():
    return fit(Experiment(dataset="moons", model="mlp", width=8, steps=60, checkpoint_every=20, optimizer="sgd", lr=0.1))


def test_registry_scores_equal_the_functions_they_wrap(moons):
    """Each method's scores through the protocol equal the `scores` functions the page called before the registry."""
    ctx = ifit.context(moons, {"l2": 1e-2, "damping": 0.1}, max_iter=200)
    xs, ys = ifit.arrays(moons)
    rows = (0, 3)
    got = ifit.score_test_points(ctx, rows)
    assert list(got.scores) == [n for n in METHODS if not METHODS[n].on_demand] and not got.errors
    f, model = moons.loss_fn, moons.model
    ckpts, lrs = scores.tracin_checkpoints(moons.run)  # an SGD run: TracIn follows it as it is
    base = ctx.optimum()
    for j, r in enumerate(rows):
        x, y = ifit.test_point(moons, r)
        want = {"grad_dot": scores.grad_dot(f, model, xs, ys, x, y), "grad_cosine": scores.grad_cosine(f, model, xs, ys, x, y),
                "tracin": scores.tracin(f, ckpts, lrs, xs, ys, x, y),
                "influence": scores.predicted_loo_change(f, base.params, xs, ys, x, y, l2=base.l2, damping=0.1)}
        for name, w in want.items():
            np.testing.assert_allclose(got.scores[name][j], w, rtol=2e-4, atol=1e-6 * float(np.abs(w).max()), err_msg=name)
    selfs, errors = ifit.self_influence_scores(ctx)
    assert set(selfs) == {n for n, m in METHODS.items() if m.self_label and not m.on_demand} and not errors
    np.testing.assert_allclose(selfs["tracin"], scores.self_influence(f, None, xs, ys, method="tracin", checkpoints=ckpts,
                                                                      lrs=lrs), rtol=1e-5)


def test_lds_table_loops_over_the_registry(moons):
    returned = []  # the page's `between` returns compiled programs: before every method (+340 MB at once without)
    ctx = ifit.context(moons, {"n_models": 2, "proj_dim": "64"}, max_iter=200, between=lambda: returned.append(1))
    table = ifit.lds_table(ctx, m=8, n_test=6)
    assert set(table.results) | set(table.errors) == set(METHODS) and not table.errors
    assert len(returned) >= len(METHODS)
    assert table.outputs.shape == (8, 6) and table.ensemble.masks.shape == (8, len(moons.data.y_train))
    assert all(-1 <= r.mean <= 1 for r in table.results.values())
    # the LDS's ensemble is the one ensemble: its subsets are `random_subsets`' draws
    np.testing.assert_array_equal(table.subsets, ifit.evaluation.random_subsets(len(moons.data.y_train), 8, seed=0))


def test_one_ensemble_masks_and_models():
    masks = ensemble.random_masks(20, 4, fraction=0.25, seed=3)
    assert masks.shape == (4, 20) and (masks.sum(1) == 5).all()
    rng = np.random.default_rng(3)   # the draws: one `rng.choice` per model
    np.testing.assert_array_equal(ensemble.subsets_of(masks), np.sort([rng.choice(20, 5, replace=False) for _ in range(4)]))
    xs, ys = np.arange(20.0)[:, None], np.arange(20) % 2
    got = ensemble.subset_ensemble(ensemble.one_by_one(lambda x, y, s: (float(x.sum()), s), xs, ys, [7, 8, 9]), 20, 3,
                                   seed=1)
    assert [got.model(i) for i in range(3)] == [(float(xs[m].sum()), s) for m, s in zip(got.masks, [7, 8, 9])]
    np.testing.assert_array_equal(got.outputs(lambda m: np.array(m[0])), [xs[m].sum() for m in got.masks])
    with pytest.raises(ValueError, match="different numbers"):
        ensemble.subsets_of(np.array([[True, False], [True, True]]))


def test_a_method_registered_in_one_line_reaches_the_scores_and_the_lds(moons, monkeypatch):
    """What `docs/extending.md` promises: a `Method` subclass plus one registry entry is scored, self-influenced and
    LDS-scored by the same loops as the built-in methods, with nothing else edited."""
    class Same(Method):  # +1 for a training example with the test point's label, −1 otherwise
        name, label, short = "same_label", "Same label", "same label"
        self_label, self_short = "1 for every example", "same label"

        def test_features(self, ctx, state, xs, ys):
            return jnp.asarray(ys)[:, None]

        def train_scores(self, ctx, state, features):
            return jnp.where(features == ctx.arrays()[1][None], 1.0, -1.0)

        def self_influence(self, ctx, state):
            return np.ones(len(ctx.fitted.data.y_train))

    monkeypatch.setitem(methods.METHODS, "same_label", Same())
    ctx = ifit.context(moons, max_iter=100)
    got = ifit.score_test_points(ctx, (0, 1), names=["grad_dot", "same_label"])
    y = moons.data.y_train
    np.testing.assert_array_equal(got.scores["same_label"], np.where(y[None] == moons.data.y_test[[0, 1], None], 1, -1))
    assert "same_label" in ifit.self_influence_scores(ctx, names=["same_label"])[0]
    table = ifit.lds_table(ctx, m=6, n_test=4, names=["same_label"])
    assert set(table.results) == {"same_label"} and -1 <= table.results["same_label"].mean <= 1


def test_the_stored_lds_table_names_registered_methods_and_reproducing_commands():
    """The SimpleCNN LDS table shipped in gradlab/data (benchmarks/lds_cnn.py): every gradlab row is a registered
    method, every row carries the command that reproduces it, and a measured LDS is a Spearman mean in [-1, 1]."""
    import json
    from importlib import resources

    from gradlab.influence import METHODS, stored_lds

    table, about = stored_lds("fashion", "simple_cnn")
    raw = json.loads(resources.files("gradlab").joinpath("data", "lds_simple_cnn.json").read_text())
    assert {r["method"] for r in raw["methods"] if r["side"] == "gradlab"} <= set(METHODS)
    assert {r["side"] for r in raw["methods"]} == {"gradlab", "dattri"}
    assert len(table) == len(raw["methods"]) and table["command"].str.startswith("python -m benchmarks.lds_cnn").all()
    measured = table["LDS"].dropna()
    assert measured.between(-1, 1).all() and (table["SE"].dropna() >= 0).all()
    assert about["experiment"]["model"] == "simple_cnn" and stored_lds("digits", "mlp") is None


def test_a_test_point_out_of_range_is_named_before_any_scoring(x64):
    """One range check for one point and for many: the first missing row is named, and nothing is scored."""
    ctx, *_ = _mlp_context()
    x, y = ifit.test_point(ctx.fitted, 3)
    assert np.allclose(np.asarray(x), ctx.fitted.data.x_test[3]) and int(y) == ctx.fitted.data.y_test[3]
    for bad, rows in ((4, [0, 4, 9]), (-1, [-1])):
        with pytest.raises(ValueError, match=rf"test point {bad} does not exist: there are 4 test points \(0 to 3\)"):
            ifit.score_test_points(ctx, rows, names=["last_layer"])
    with pytest.raises(ValueError, match="test point 4 does not exist"):
        ifit.test_point(ctx.fitted, 4)
