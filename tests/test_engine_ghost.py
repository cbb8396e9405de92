"""The per-layer-rule path (gradlab.rules, read from the traced loss) against a Python loop of jax.grad."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from gradlab import engine, losses, models, rules
from testdata import filled, normal, randint

KEY = jax.random.key(0)


def _data(n, d, classes):
    xs = normal(1, (n, d))
    ys = randint(2, (n,), classes) if classes > 1 else normal(2, (n,))
    return xs, ys


def _model(cls, *args):
    """`cls(*args, key=KEY)`'s shapes with seeded values (`testdata.filled`: no eager init compiles)."""
    return filled(eqx.filter_eval_shape(cls, *args, key=KEY), 0, scale=0.1)


CASES = {
    "linear-regression": (lambda: _model(models.Linear, 3, "scalar"), 3, 1, losses.mse),
    "softmax-regression": (lambda: _model(models.Linear, 5, 4), 5, 4, losses.cross_entropy),
    "mlp-relu-2": (lambda: _model(models.MLP, 6, 3, 8, 2, "relu"), 6, 3, losses.cross_entropy),
    "mlp-tanh-regression": (lambda: _model(models.MLP, 4, "scalar", 8, 1, "tanh"), 4, 1, losses.mse),
    "cnn": (lambda: _model(models.CNN, (8, 8), 10), 64, 10, losses.cross_entropy),
}


def _oracle(loss_fn, model, xs, ys):
    """Python loop of jax.grad, one example at a time (no vmap)."""
    diff, static = eqx.partition(model, eqx.is_inexact_array)
    g = jax.grad(lambda d, x, y: loss_fn(eqx.combine(d, static), x, y))
    rows = [g(diff, xs[i], ys[i]) for i in range(xs.shape[0])]
    return jax.tree.map(lambda *r: np.stack(r), *rows)


@pytest.mark.parametrize("name", list(CASES))
def test_rules_equal_the_loop_on_every_model(name):
    make, d, k, loss_fn = CASES[name]
    model = make()
    xs, ys = _data(7, d, k)
    assert engine.resolve_method("auto", loss_fn, model, xs, ys) == "ghost"
    want = _oracle(loss_fn, model, xs, ys)
    got = engine.per_example_grads(loss_fn, model, xs, ys, method="ghost", chunk_size=3)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # norms: streamed ghost norms == materialized vmap norms == loop norms
    flat = np.concatenate([np.reshape(b, (7, -1)) for b in jax.tree.leaves(want)], axis=1)
    want_norms = np.linalg.norm(flat.astype(np.float64), axis=1)
    for chunk in (None, 3):
        fast = engine.per_example_norms(loss_fn, model, xs, ys, method="ghost", chunk_size=chunk)
        np.testing.assert_allclose(fast, want_norms, rtol=1e-5)
    plain = engine.per_example_norms(loss_fn, model, xs, ys, method="vmap")
    np.testing.assert_allclose(plain, want_norms, rtol=1e-5)
    layers_fast = engine.per_example_layer_norms(loss_fn, model, xs, ys, method="ghost", chunk_size=4)
    layers_vmap = engine.per_example_layer_norms(loss_fn, model, xs, ys, method="vmap")
    assert list(layers_fast) == list(layers_vmap) == engine.leaf_names(model)
    for key in layers_vmap:
        np.testing.assert_allclose(layers_fast[key], layers_vmap[key], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "conv",
    [
        lambda: eqx.nn.Conv2d(2, 3, 3, stride=2, padding=1, key=KEY),
        lambda: eqx.nn.Conv2d(2, 3, (2, 3), dilation=2, padding=((0, 1), (2, 0)), key=KEY),
        lambda: eqx.nn.Conv1d(2, 4, 3, stride=2, use_bias=False, key=KEY),
    ],
)
def test_conv_rule_with_stride_padding_dilation(conv):
    layer = conv()

    class Net(eqx.Module):
        conv: eqx.Module

        def __call__(self, x):
            return jnp.tanh(self.conv(x)).reshape(-1)[:3]

    net = Net(layer)
    spatial = (7, 6) if layer.num_spatial_dims == 2 else (9,)
    xs = normal(3, (5, 2) + spatial)
    ys = jnp.array([0, 1, 2, 0, 1])
    want = _oracle(losses.cross_entropy, net, xs, ys)
    got = engine.per_example_grads(losses.cross_entropy, net, xs, ys, method="ghost")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_module_float_fields_are_not_parameters():
    """A pooling layer's float init (-inf) stays a static field, not a differentiable leaf."""
    model = eqx.nn.Sequential([eqx.nn.Linear(4, 4, key=KEY), eqx.nn.Lambda(lambda x: x[None]),
                               eqx.nn.MaxPool1d(2, stride=2), eqx.nn.Lambda(jnp.ravel)])
    assert engine.as_params(model).layers[2].init == -jnp.inf
    assert isinstance(engine.as_params(model).layers[2].init, float)
    assert engine.as_params((1.0, 2.0))[0].dtype == jnp.float32
    xs, ys = normal(5, (3, 4)), jnp.array([0, 1, 0])
    for method in ("vmap", "ghost"):
        g = engine.per_example_grads(losses.cross_entropy, model, xs, ys, method=method)
        assert g.layers[0].weight.shape == (3, 4, 4)


def test_python_float_params_fall_back_to_vmap():
    """The seeds' scalar example has no layers: auto uses vmap, ghost refuses clearly."""
    loss = lambda p, x, y: (p[0] * x + p[1] - y) ** 2
    xs, ys = jnp.array([1.0, 2.0]), jnp.array([0.0, 0.0])
    assert engine.resolve_method("auto", loss, (1.0, 0.0), xs, ys) == "vmap"
    g = engine.per_example_grads(loss, (1.0, 0.0), xs, ys)
    np.testing.assert_allclose(g[0], [2.0, 8.0])
    with pytest.raises(rules.RulesUnsupported, match="no parameter leaf"):
        engine.per_example_norms(loss, (1.0, 0.0), xs, ys, method="ghost")


def test_a_penalty_inside_the_loss_adds_one_gradient_to_every_example():
    """An L2 penalty reads the weight a second time, from no example: its gradient p is one array for every
    example, so the weight keeps its dense rule (‖gᵢ‖² = ‖dᵢ‖² + 2⟨dᵢ, p⟩ + ‖p‖², the ghost form); a leaf read
    only by a penalty (`s`) has gᵢ = p. Against a loop of jax.grad: gradients, norms, dots, the clipped sum."""
    model = models.Linear(3, 2, key=KEY)
    s = jnp.array([0.5, -1.0])

    def penalized(p, x, y):
        m, s = p
        return losses.cross_entropy(m, x, y) + 0.1 * jnp.sum(m.layer.weight ** 2) + jnp.sum(jnp.exp(s))

    params = (model, s)
    xs, ys = _data(5, 3, 2)
    rows = {r["leaf"]: r for r in engine.explain(penalized, params, xs, ys)}
    assert rows["[0].layer.weight"]["kind"] == "dense+data-free" and "2⟨dᵢ, p⟩" in rows["[0].layer.weight"]["why"]
    assert rows["[1]"]["kind"] == "data-free", rows
    want = _oracle(penalized, params, xs, ys)
    got = engine.per_example_grads(penalized, params, xs, ys, chunk_size=2)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    flat = np.concatenate([np.reshape(w, (5, -1)) for w in jax.tree.leaves(want)], axis=1).astype(np.float64)
    norms = np.linalg.norm(flat, axis=1)
    np.testing.assert_allclose(engine.per_example_norms(penalized, params, xs, ys, chunk_size=2), norms, rtol=1e-5)
    v = jax.tree.map(lambda a: jnp.cos(jnp.arange(a.size, dtype=a.dtype)).reshape(a.shape), engine.as_params(params))
    v_flat = np.concatenate([np.ravel(a) for a in jax.tree.leaves(v)])
    np.testing.assert_allclose(engine.per_example_dots(penalized, params, xs, ys, v, chunk_size=2), flat @ v_flat,
                               rtol=1e-5, atol=1e-6)
    c = float(np.median(norms))
    total = engine.clipped_grad_sum(penalized, params, xs, ys, c, chunk_size=2)
    scale = np.minimum(1.0, c / norms)
    for g, w in zip(jax.tree.leaves(total), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, np.tensordot(scale, w, axes=1), rtol=1e-5, atol=1e-6)


def test_a_layer_applied_twice_takes_the_summed_rule():
    """One Linear applied twice: each leaf has two uses, whose gradients from (a, δ) are summed per example."""
    class Twice(eqx.Module):
        lin: eqx.nn.Linear

        def __call__(self, x):
            return self.lin(jnp.tanh(self.lin(x)))

    net = Twice(eqx.nn.Linear(3, 3, key=KEY))
    loss = losses.cross_entropy
    xs, ys = _data(4, 3, 3)
    rows = engine.explain(loss, net, xs, ys)
    assert [r["path"] for r in rows] == ["rule", "rule"] and all("used 2 times" in r["why"] for r in rows), rows
    want = _oracle(loss, net, xs, ys)
    got = engine.per_example_grads(loss, net, xs, ys, method="ghost")
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        engine.per_example_norms(loss, net, xs, ys),
        np.sqrt(sum(np.sum(np.reshape(b, (4, -1)) ** 2, 1) for b in jax.tree.leaves(want))), rtol=1e-5
    )


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="method"):
        engine.per_example_norms(losses.mse, models.Linear(2, "scalar", key=KEY), jnp.ones((2, 2)), jnp.ones(2), method="fast")


def test_a_matrix_used_three_ways_takes_pairwise_ghost_products():
    """One matrix as an embedding table, as `h @ W` and as `W @ h`: ‖Σₖ gₖ‖² from the uses' pairwise ghost inner
    products (both orientations of a dense use against one-hot lookups), against a loop of jax.grad."""
    w = normal(6, (32, 32), 0.2)

    def loss(w, ids, y):
        h = jnp.tanh(w[ids] @ w)
        return jnp.sum((w @ h.mean(0) - y) ** 2)

    ids = randint(7, (5, 4), 32, 1, 3)
    ys = normal(8, (5, 32))
    (row,) = engine.explain(loss, w, ids, ys)
    assert row["path"] == "rule" and "ghost inner products" in row["why"], row
    want = np.stack([jax.grad(loss)(w, ids[i], ys[i]) for i in range(5)])
    np.testing.assert_allclose(engine.per_example_norms(loss, w, ids, ys),
                               np.linalg.norm(want.reshape(5, -1), axis=1), rtol=1e-5)


@pytest.mark.slow  # nested loops compile slowly
def test_rules_through_a_cond_and_a_scan_inside_a_scan():
    """A scan whose step holds a `lax.cond` (two dense layers, one per branch) and an inner `fori_loop`
    (a scan applying `u` twice): sites two loops deep, zeros from the branch not taken, against a loop of grad."""
    p = {"a": normal(9, (3, 3), 0.5), "b": normal(10, (3, 3), 0.5), "u": normal(11, (3, 3), 0.5), "c": jnp.ones(3)}

    def loss(p, x, y):
        def step(h, xt):
            h = lax.cond(xt[0] > 0, lambda h: jnp.tanh(h @ p["a"]), lambda h: jnp.sin(h @ p["b"]), h + xt)
            h = lax.fori_loop(0, 2, lambda _, h: jnp.tanh(h @ p["u"] * p["c"]), h)
            return h, h

        _, hs = lax.scan(step, jnp.zeros(3), x)
        return jnp.sum((hs.mean(0) - y) ** 2)

    xs, ys = normal(12, (5, 4, 3)), normal(13, (5, 3))
    assert all(r["path"] == "rule" for r in engine.explain(loss, p, xs, ys))
    want = _oracle(loss, p, xs, ys)
    for g, w in zip(jax.tree.leaves(engine.per_example_grads(loss, p, xs, ys, chunk_size=3)), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(engine.per_example_norms(loss, p, xs, ys, chunk_size=3),
                               np.sqrt(sum(np.sum(np.reshape(w, (5, -1)) ** 2, 1) for w in jax.tree.leaves(want))),
                               rtol=1e-4)
