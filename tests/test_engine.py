"""The engine against independent oracles: a Python loop of jax.grad, float64 NumPy, the seeds."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradlab import engine, losses
from gradlab.data import load_dataset
from gradlab.models import ModelSpec, build_model
from testdata import normal


def sq_err(w, x, y):
    return (w * x - y) ** 2


# ------------------------------------------------------------------ the seeds' worked examples


def test_seed_000_scalar_example():
    """Seed 000: grads of (w*x - y)^2 at w=1, x=[1, 2], y=[0, 0] are [2, 8]."""
    g = engine.per_example_grads(sq_err, 1.0, jnp.array([1.0, 2.0]), jnp.array([0.0, 0.0]))
    np.testing.assert_allclose(g, [2.0, 8.0])
    np.testing.assert_allclose(engine.per_example_norms(sq_err, 1.0, jnp.array([1.0, 2.0]), jnp.zeros(2)), [2.0, 8.0])


def test_seed_000_two_floats_as_tuple():
    """`w, b = 1.0, 0.0` as a tuple of Python floats: b gets its own per-example gradient."""
    loss = lambda p, x, y: (p[0] * x + p[1] - y) ** 2
    gw, gb = engine.per_example_grads(loss, (1.0, 0.0), jnp.array([1.0, 2.0]), jnp.zeros(2))
    np.testing.assert_allclose(gw, [2.0, 8.0])
    np.testing.assert_allclose(gb, [2.0, 4.0])


def test_seed_002_two_ways_give_ten():
    """Seed 002: vmap(grad(f)).sum() and grad(vmap(f).sum()) are both 10 for (w x)^2, w=1, x=[1,2]."""
    f = lambda w, x, y: (w * x) ** 2
    xs, ys = jnp.array([1.0, 2.0]), jnp.zeros(2)
    way_a = engine.per_example_grads(f, 1.0, xs, ys).sum()
    way_b = engine.batch_grad(f, 1.0, xs, ys, reduction="sum")
    np.testing.assert_allclose([way_a, way_b], [10.0, 10.0])


def test_seed_001_linear_model_shape_and_mean():
    """Seed 001: per-example grads of a linear model have shape (B, D); their mean is grad of the mean loss."""
    loss_one = lambda p, x, y: (jnp.dot(x, p) - y) ** 2
    params = jnp.array([1.0, 2.0, 3.0])
    xs = jax.random.normal(jax.random.key(0), (32, 3))
    ys = jax.random.normal(jax.random.key(1), (32,))
    g = engine.per_example_grads(loss_one, params, xs, ys)
    assert g.shape == (32, 3)
    mean_loss = lambda p: jnp.mean((xs @ p - ys) ** 2)
    np.testing.assert_allclose(g.mean(0), jax.grad(mean_loss)(params), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(engine.batch_grad(loss_one, params, xs, ys, reduction="mean"), jax.grad(mean_loss)(params), rtol=1e-5)


# ------------------------------------------------------------------ every model vs a Python loop


def python_loop(loss_fn, params, xs, ys):
    """The oracle: one jax.grad per example (eqx.filter_grad for modules), stacked."""
    rows = [eqx.filter_grad(loss_fn)(params, xs[i], ys[i]) for i in range(xs.shape[0])]
    return jax.tree.map(lambda *r: jnp.stack(r), *rows)


def models():
    digits = load_dataset("digits", seed=0)
    diabetes = load_dataset("diabetes", seed=0)
    key = jax.random.key(0)
    cases = []
    for kind in ("linear", "mlp"):  # gradlab's CNN: test_engine_zoo.py (equinox_cnn_zoo, every function) and
        # test_engine_ghost.py (cnn) check it against a loop of jax.grad
        m = build_model(ModelSpec(kind, width=16, depth=2), 64, 10, key=key, image_shape=(8, 8))
        cases.append((kind, losses.cross_entropy, m, digits.x_train[:37], digits.y_train[:37]))
    reg = build_model(ModelSpec("linear"), 10, 1, key=key)
    cases.append(("linear-regression", losses.mse, reg, diabetes.x_train[:23], diabetes.y_train[:23]))
    dict_params = {"w": jnp.linspace(-1, 1, 10), "b": 0.5}
    dict_loss = lambda p, x, y: (jnp.tanh(x @ p["w"] + p["b"]) - y) ** 2
    cases.append(("dict", dict_loss, dict_params, diabetes.x_train[:23], diabetes.y_train[:23]))
    return cases


MODELS = models()


@pytest.mark.parametrize("name,loss_fn,params,xs,ys", MODELS, ids=[c[0] for c in MODELS])
def test_per_example_grads_match_python_loop(name, loss_fn, params, xs, ys):
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    ours = engine.per_example_grads(loss_fn, params, xs, ys)
    oracle = python_loop(loss_fn, engine.as_params(params), xs, ys)
    a, b = engine.flatten_per_example(ours), engine.flatten_per_example(eqx.filter(oracle, eqx.is_inexact_array))
    assert a.shape == (xs.shape[0], engine.num_params(params))
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    chunked = engine.flatten_per_example(engine.per_example_grads(loss_fn, params, xs, ys, chunk_size=5))
    np.testing.assert_allclose(chunked, a, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(engine.flatten_per_example(engine.loop_per_example_grads(loss_fn, params, xs, ys)), b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name,loss_fn,params,xs,ys", MODELS, ids=[c[0] for c in MODELS])
def test_sum_and_mean_equal_batch_grad(name, loss_fn, params, xs, ys):
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    per = engine.flatten_per_example(engine.per_example_grads(loss_fn, params, xs, ys))
    flat = lambda t: jnp.concatenate([a.ravel() for a in jax.tree.leaves(t)])
    np.testing.assert_allclose(per.sum(0), flat(engine.batch_grad(loss_fn, params, xs, ys)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(per.mean(0), flat(engine.batch_grad(loss_fn, params, xs, ys, reduction="mean")), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name,loss_fn,params,xs,ys", MODELS, ids=[c[0] for c in MODELS])
def test_streamed_reductions_equal_materialized(name, loss_fn, params, xs, ys):
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    per = np.asarray(engine.flatten_per_example(engine.per_example_grads(loss_fn, params, xs, ys)), np.float64)
    norms = np.linalg.norm(per, axis=1)
    for chunk in (None, 4, 7):  # 7 does not divide N: the remainder chunk must be right too
        np.testing.assert_allclose(engine.per_example_norms(loss_fn, params, xs, ys, chunk_size=chunk), norms, rtol=1e-4, atol=1e-7)
    layers = engine.per_example_layer_norms(loss_fn, params, xs, ys, chunk_size=4)
    assert list(layers) == engine.leaf_names(params)
    np.testing.assert_allclose(np.sqrt(sum(np.square(np.asarray(v, np.float64)) for v in layers.values())), norms, rtol=1e-4)
    v = jax.tree.map(lambda a: jnp.cos(jnp.arange(a.size, dtype=jnp.float32)).reshape(a.shape), eqx.filter(engine.as_params(params), eqx.is_inexact_array))
    vflat = np.concatenate([np.ravel(a) for a in jax.tree.leaves(v)])
    np.testing.assert_allclose(engine.per_example_dots(loss_fn, params, xs, ys, v, chunk_size=7), per @ vflat, rtol=1e-4, atol=1e-5)
    c = float(np.median(norms))
    clipped = (per * np.minimum(1.0, c / norms)[:, None]).sum(0)
    got = engine.clipped_grad_sum(loss_fn, params, xs, ys, c, chunk_size=7)
    np.testing.assert_allclose(np.concatenate([np.ravel(a) for a in jax.tree.leaves(got)]), clipped, rtol=1e-4, atol=1e-5)


def test_softmax_regression_norms_match_float64_closed_form():
    """For softmax regression the per-example gradient is (p - e_y) ⊗ [x, 1]: its norm in float64 NumPy."""
    d = load_dataset("digits", seed=1)
    m = build_model(ModelSpec("linear"), 64, 10, key=jax.random.key(3))
    xs, ys = d.x_train[:200], d.y_train[:200]
    W, b = np.asarray(m.layer.weight, np.float64), np.asarray(m.layer.bias, np.float64)
    logits = xs.astype(np.float64) @ W.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    delta = p - np.eye(10)[ys]
    expected = np.linalg.norm(delta, axis=1) * np.sqrt(np.sum(xs.astype(np.float64) ** 2, 1) + 1.0)
    np.testing.assert_allclose(engine.per_example_norms(losses.cross_entropy, m, xs, ys), expected, rtol=2e-5)


# ------------------------------------------------------------------ compile once, stream, errors


def test_second_call_with_same_shapes_does_not_retrace():
    d = load_dataset("moons", seed=0)
    m = build_model(ModelSpec("mlp", 8, 1), 2, 2, key=jax.random.key(0))
    xs, ys = jnp.asarray(d.x_train), jnp.asarray(d.y_train)
    engine.per_example_norms(losses.cross_entropy, m, xs, ys)
    engine.per_example_grads(losses.cross_entropy, m, xs, ys)
    before = dict(engine.TRACES)
    m2 = jax.tree.map(lambda a: a * 1.5 if eqx.is_array(a) else a, m)  # new values, same shapes
    engine.per_example_norms(losses.cross_entropy, m2, xs, ys)
    engine.per_example_grads(losses.cross_entropy, m2, xs, ys)
    assert dict(engine.TRACES) == before


def test_auto_times_both_paths_once_and_stays_exact(monkeypatch):
    """method="auto" on a small computation: the rules and vmap are timed once per (loss, shapes, N), the choice
    is kept (a second call adds none), either choice agrees with a loop of jax.grad; inside a jit nothing is timed;
    a computation slower than AUTO_TIMING_S keeps the rules untimed."""
    monkeypatch.setattr(engine, "AUTO_CHOICES", __import__("collections").OrderedDict())
    monkeypatch.setattr(engine, "AUTO_TIMING", True)
    monkeypatch.setattr(engine, "AUTO_TIMING_S", float("inf"))
    n = engine.AUTO_MIN_N + 2  # n - 2 examples are still timed
    xs = normal(0, (n, 3))
    ys = jnp.arange(n) % 2
    w = normal(1, (3, 2))
    loss = lambda w, x, y: -jax.nn.log_softmax(jnp.tanh(x @ w) @ w.T @ w)[y]  # noqa: E731 - w used three times
    want = np.stack([np.asarray(jax.grad(loss)(w, xs[i], ys[i]), np.float64) for i in range(n)]).reshape(n, -1)
    norms = np.linalg.norm(want, axis=1)
    np.testing.assert_allclose(engine.per_example_norms(loss, w, xs, ys), norms, rtol=1e-5)
    total = engine.clipped_grad_sum(loss, w, xs, ys, 0.5)
    np.testing.assert_allclose(total.ravel(), np.minimum(1, 0.5 / norms) @ want, rtol=1e-5, atol=1e-6)
    choices = dict(engine.AUTO_CHOICES)
    assert sorted(k[0] for k in choices) == ["clipped_grad_sum", "norms"]
    assert set(choices.values()) <= {"auto", "vmap"}
    for choice in ("auto", "vmap"):  # each kept choice gives the loop's numbers
        for k in choices:
            engine.AUTO_CHOICES[k] = choice
        np.testing.assert_allclose(engine.per_example_norms(loss, w, xs, ys), norms, rtol=1e-5)
        np.testing.assert_allclose(engine.clipped_grad_sum(loss, w, xs, ys, 0.5).ravel(),
                                   np.minimum(1, 0.5 / norms) @ want, rtol=1e-5, atol=1e-6)
    assert len(engine.AUTO_CHOICES) == 2
    jax.jit(lambda w: engine.per_example_norms(loss, w, xs[:n - 1], ys[:n - 1]))(w)  # traced: not timed
    assert len(engine.AUTO_CHOICES) == 2
    monkeypatch.setattr(engine, "AUTO_TIMING_S", 0.0)
    engine.per_example_norms(loss, w, xs[:n - 2], ys[:n - 2])
    assert list(engine.AUTO_CHOICES.values())[-1] == "auto"


def test_streamed_norms_never_allocate_n_by_p():
    """XLA's own memory analysis: per-example grads output N x P x 4 bytes; streamed norms need ≪ that."""
    d = load_dataset("digits", seed=0)
    m = build_model(ModelSpec("mlp", 256, 2), 64, 10, key=jax.random.key(0))
    xs, ys, p = jnp.asarray(d.x_train), jnp.asarray(d.y_train), engine.as_params(m)
    full = engine.xla_memory("vmap", losses.cross_entropy, p, xs, ys)
    assert full["output"] >= xs.shape[0] * engine.num_params(m) * 4  # ~490 MB materialized
    for chunk, approach in ((128, "norms_vmap"), (None, "norms")):  # the reference path, and the rules' byte-sized chunks
        streamed = engine.xla_memory(approach, losses.cross_entropy, p, xs, ys, chunk_size=chunk)
        extra = streamed["temp"] + streamed["output"]
        assert extra < 150e6, f"streamed norms ({approach}) need {extra / 1e6:.0f} MB"


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="examples"):
        engine.per_example_grads(sq_err, 1.0, jnp.ones(3), jnp.ones(2))
    with pytest.raises(ValueError, match="chunk_size"):
        engine.per_example_norms(sq_err, 1.0, jnp.ones(3), jnp.ones(3), chunk_size=0)
    with pytest.raises(ValueError, match="C must be > 0"):
        engine.clipped_grad_sum(sq_err, 1.0, jnp.ones(3), jnp.ones(3), 0.0)
    with pytest.raises(ValueError, match="reduction"):
        engine.batch_grad(sq_err, 1.0, jnp.ones(3), jnp.ones(3), reduction="max")


def test_weighted_grads_match_python_loop():
    """Σᵢ W[i, k]·gᵢ for shared and per-leaf columns, against a loop of jax.grad (chunks with padding)."""
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), "b": jnp.asarray(rng.normal(size=4), jnp.float32)}
    xs = jnp.asarray(rng.normal(size=(11, 3)), jnp.float32)
    ys = jnp.asarray(rng.integers(0, 4, 11))

    def loss(p, x, y):
        return -jax.nn.log_softmax(jnp.tanh(x @ p["w"] + p["b"]))[y] + 0.1 * jnp.sum(p["w"] ** 2)

    rows = [jax.grad(loss)(params, x, y) for x, y in zip(xs, ys)]
    w = rng.uniform(size=(11, 5))
    got = engine.weighted_grads(loss, params, xs, ys, w, chunk_size=4)
    for name in ("b", "w"):
        want = np.einsum("ik,i...->k...", w, np.stack([np.asarray(r[name], np.float64) for r in rows]))
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)
    per_leaf = [w[:, :2], w[:, 2:]]  # leaves in tree order: "b", then "w"
    got = engine.weighted_grads(loss, params, xs, ys, per_leaf)
    for name, wl in zip(("b", "w"), per_leaf):
        want = np.einsum("ik,i...->k...", wl, np.stack([np.asarray(r[name], np.float64) for r in rows]))
        assert got[name].shape == (wl.shape[1],) + params[name].shape
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="N = 11"):
        engine.weighted_grads(loss, params, xs, ys, w[:5])


def test_a_chunked_pass_traces_one_body_and_equals_one_vmap():
    # `lax.map(batch_size=3)` over 7 examples runs the 1 left over through a second vmap: the example's program was
    # traced (and compiled) twice. `xla.map_chunks` pads with real examples and cuts the rows back: one body.
    from gradlab import xla

    traced = []

    def f(x):
        traced.append(1)
        return {"sq": x * x, "sum": jnp.sum(x)}

    xs = jnp.arange(21.0).reshape(7, 3)
    got = xla.map_chunks(f, xs, 3)
    assert len(traced) == 1
    want = jax.vmap(f)(xs)
    np.testing.assert_array_equal(got["sq"], want["sq"])
    np.testing.assert_array_equal(got["sum"], want["sum"])
    traced.clear()
    jax.lax.map(f, xs, batch_size=3)
    assert len(traced) == 2  # what it replaces: the scan's body and the leftover's vmap
    traced.clear()
    few = xla.map_chunks(f, xs[:2], 64)  # fewer examples than a chunk: one chunk of them, one body
    assert len(traced) == 1
    np.testing.assert_array_equal(few["sq"], want["sq"][:2])
