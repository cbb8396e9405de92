"""Projected gradients at the trained checkpoint (issue 40): `engine.per_example_projections` against the flat
per-example gradient from a loop of `jax.grad` times the explicit Kronecker matrix Pa ⊗ Pd (in the factor layout's
row-major vec order), on a dense model and on two convolutional ones (im2col matmuls, and `lax.conv` through the conv
rule); the projected-gradient method's scores and self-influence against the same formula from formed gradients in
float64."""

from __future__ import annotations

from types import SimpleNamespace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradlab import engine, losses
from gradlab.influence import METHODS
from gradlab.influence.protocol import Context
from gradlab.models import CNN, ModelSpec, SimpleCNN, build_model


def _layouts(model):
    """The oracle's own map from each leaf's `jax.grad` to the rule's factor layout (I, O): eqx.nn.Linear
    W (O, I) x: Wᵀ; SimpleCNN's im2col weight (kh, kw, C) × O; `lax.conv` patches in (C, kh, kw) order × O."""
    def linear(g):
        return g.T

    def im2col(g):  # (O, C, kh, kw) -> (kh·kw·C, O)
        return jnp.transpose(g, (2, 3, 1, 0)).reshape(-1, g.shape[0])

    def lax_conv(g):  # (O, C, kh, kw) -> (C·kh·kw, O)
        return g.reshape(g.shape[0], -1).T

    conv = im2col if isinstance(model, SimpleCNN) else lax_conv
    names = engine.leaf_names(model)
    return {n: (conv if ".conv" in n else linear) for n in names if n.endswith("weight")}


def _explicit(projection, grads: list, layouts: dict):
    """φ from formed gradients: per leaf, (Pa ⊗ Pd)ᵀ vec(G) for a Kronecker leaf (np.kron, row-major vec of its
    factor layout), g for a whole one, Rᵀg for a dense one."""
    out = []
    for p, g in zip(projection, grads):
        g = np.asarray(g, np.float64)
        if p.how == "kronecker":
            layout = np.asarray(layouts[p.name](g))
            out.append(np.kron(np.asarray(p.pa, np.float64), np.asarray(p.pd, np.float64)).T @ layout.ravel())
        elif p.how == "whole":
            out.append(g.ravel())
        elif p.how == "skip":
            continue
        else:
            out.append(np.asarray(p.dense, np.float64).T @ g.ravel())
    return np.concatenate(out)


def _loop(model, xs, ys):
    """The oracle: one `jax.grad` per example (a Python loop, one compiled single-example gradient), each leaf's
    gradient in leaf order."""
    grad = eqx.filter_jit(eqx.filter_grad(losses.cross_entropy))
    return [jax.tree.leaves(eqx.filter(grad(model, x, y), eqx.is_array)) for x, y in zip(xs, ys)]


MODELS = {
    "mlp": lambda key: build_model(ModelSpec("mlp", width=40, depth=2, activation="tanh"), 36, 3, key=key),
    "simple_cnn": lambda key: SimpleCNN((10, 10), 3, key=key),
    "lax_conv": lambda key: CNN((6, 6), 3, "tanh", key=key),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "simple_cnn" else n for n in MODELS])
def test_projected_features_are_the_kronecker_projection_of_the_gradient(name):
    model = MODELS[name](jax.random.key(0))
    d = int(np.prod(model.image_shape)) if hasattr(model, "image_shape") else 36
    xs = jax.random.normal(jax.random.key(1), (5, d))
    ys = jnp.array([0, 1, 2, 1, 0])
    proj = engine.projections(losses.cross_entropy, model, xs, ys, k_in=6, k_out=2, key=3)
    hows = {p.name: p.how for p in proj}
    assert all(hows[n] == "kronecker" for n in _layouts(model)), hows  # every weight: no gradient formed
    assert any(p.pa.shape[0] > p.pa.shape[1] for p in proj if p.how == "kronecker")  # some side is compressed
    got = np.asarray(engine.per_example_projections(losses.cross_entropy, model, xs, ys, proj))
    want = np.stack([_explicit(proj, g, _layouts(model)) for g in _loop(model, xs, ys)])
    assert got.shape == want.shape == (5, sum(p.features for p in proj))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5 * np.abs(want).max())


def test_a_large_leaf_without_factors_is_projected_densely_and_exactly():
    """A weight used elementwise (no (a, δ) factors) larger than `PROJECT_WHOLE_MAX`: its formed gradient times the
    dense Gaussian; a small one is kept whole."""
    def loss(p, x, y):
        return jnp.sum((jnp.tanh(x * p["scale"]) @ p["w"] - y) ** 2)

    p = {"scale": jax.random.normal(jax.random.key(0), (1100,)), "w": jax.random.normal(jax.random.key(1), (1100, 2))}
    xs, ys = jax.random.normal(jax.random.key(2), (3, 1100)), jax.random.normal(jax.random.key(3), (3, 2))
    proj = engine.projections(loss, p, xs, ys, k_in=4, k_out=2, dense_dim=7)
    assert [q.how for q in proj] == ["gaussian", "kronecker"]
    got = np.asarray(engine.per_example_projections(loss, p, xs, ys, proj))
    grads = [jax.grad(loss)(p, x, y) for x, y in zip(xs, ys)]
    want = np.stack([_explicit(proj, [g["scale"], g["w"]], {"['w']": lambda a: a}) for g in grads])
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-5 * np.abs(want).max())


def test_the_projection_is_jax_randoms_normal_draw_bit_for_bit():
    """`projections` draws its matrices in one program (`engine._draws`): the values are still, bit for bit, each
    matrix drawn on its own as defined (`jax.random.normal` at key(seed) folded in by leaf and side, / √k; the identity
    where a side is no larger than k), so the stored LDS and every server's features keep their meaning. k = 12: √k
    is no power of two (the scale's rounding shows), and conv1's 9 inputs and fc2's 10 outputs are identities."""
    k = 12
    model = MODELS["simple_cnn"](jax.random.key(0))
    xs, ys = jax.random.normal(jax.random.key(1), (1, 100)), jnp.array([1])
    proj = engine.projections(losses.cross_entropy, model, xs, ys, k_in=k, k_out=k, key=5)

    def drawn(i, side, rows):
        if rows <= k:
            return np.eye(rows, dtype=np.float32)
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(5), i), side)
        return np.asarray(jax.random.normal(key, (rows, k), jnp.float32) / np.sqrt(k))

    leaves = [p.name for p in proj]
    checked = 0
    for p in proj:
        if p.how == "kronecker":
            i = leaves.index(p.name)
            for side, mat in enumerate((p.pa, p.pd)):
                want = drawn(i, side, mat.shape[0])
                assert np.asarray(mat).dtype == want.dtype and np.array_equal(np.asarray(mat), want), (p.name, side)
                checked += 1
    assert checked == 8  # conv1, conv2, fc1, fc2: both sides each


def _dots(fn, *args) -> int:
    """How many dot products the program `fn(*args)` traces (nested jaxprs included)."""
    return str(jax.make_jaxpr(fn)(*args)).count("dot_general")


@pytest.mark.parametrize("name", ["mlp", "lax_conv", pytest.param("simple_cnn", marks=pytest.mark.slow)])
def test_leaving_the_first_layer_out_keeps_every_other_feature_and_drops_its_backward_pass(name):
    """`first_layer` names the first layer's weight and bias; `skip=` leaves them out: every other leaf's features are
    still the Kronecker projection of its `jax.grad` (the loop), and the pass traces fewer dot products (the second
    layer's input gradient, which only the first layer needs, is gone)."""
    model = MODELS[name](jax.random.key(0))
    d = int(np.prod(model.image_shape)) if hasattr(model, "image_shape") else 36
    xs = jax.random.normal(jax.random.key(1), (5, d))
    ys = jnp.array([0, 1, 2, 1, 0])
    first = engine.first_layer(losses.cross_entropy, model, xs, ys)
    names = engine.leaf_names(model)
    assert first == tuple(names[:2]) and first[0].endswith("weight") and first[1].endswith("bias"), first
    full = engine.projections(losses.cross_entropy, model, xs, ys, k_in=6, k_out=2, key=3)
    proj = engine.projections(losses.cross_entropy, model, xs, ys, k_in=6, k_out=2, key=3, skip=first)
    assert [p.how for p in proj[:2]] == ["skip", "skip"] and [p.features for p in proj[:2]] == [0, 0]
    got = np.asarray(engine.per_example_projections(losses.cross_entropy, model, xs, ys, proj))
    want = np.stack([_explicit(proj, g, _layouts(model)) for g in _loop(model, xs, ys)])
    assert got.shape == want.shape == (5, sum(p.features for p in full[2:]))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5 * np.abs(want).max())
    run = lambda mats: engine.per_example_projections(losses.cross_entropy, model, xs, ys, mats)  # noqa: E731
    # gone: the first layer's own projection (A·Pa, δ·Pd, their product) and the second layer's input gradient
    assert _dots(run, full) - _dots(run, proj) == 4


def test_the_first_layer_is_the_first_the_loss_computes_not_the_first_leaf():
    """Leaves in tree order ("a_out" before "b_in") against the data flow (x → b_in → a_out): the first layer is
    b_in; a one-layer loss has none to leave out; an unknown name to skip is refused."""
    p = {"a_out": jax.random.normal(jax.random.key(0), (5, 3)), "b_in": jax.random.normal(jax.random.key(1), (4, 5))}

    def loss(p, x, y):
        return jnp.sum((jnp.tanh(x @ p["b_in"]) @ p["a_out"] - y) ** 2)

    xs, ys = jnp.ones((2, 4)), jnp.zeros((2, 3))
    assert engine.leaf_names(p) == ["['a_out']", "['b_in']"]
    assert engine.first_layer(loss, p, xs, ys) == ("['b_in']",)
    assert engine.first_layer(lambda p, x, y: jnp.sum(x @ p["b_in"]), p, xs, ys) == ()
    with pytest.raises(ValueError, match="no differentiable leaf named"):
        engine.projections(loss, p, xs, ys, k_in=2, k_out=2, skip=("['c']",))


def test_the_projected_methods_layers_setting():
    """`logra_layers`: auto leaves a small first layer out (SimpleCNN's conv1: under 1% of the parameters) and keeps
    a large one (the MLP's); all keeps every layer; rest leaves the first out; anything else is refused."""
    from gradlab.influence.methods.logra import left_out

    cnn, mlp = MODELS["simple_cnn"](jax.random.key(0)), MODELS["mlp"](jax.random.key(0))
    x_cnn, x_mlp, y = jnp.ones((1, 100)), jnp.ones((1, 36)), jnp.array([1])
    assert left_out(losses.cross_entropy, cnn, x_cnn, y, "auto") == (".conv1.weight", ".conv1.bias")
    assert left_out(losses.cross_entropy, cnn, x_cnn, y, "all") == ()
    assert left_out(losses.cross_entropy, mlp, x_mlp, y, "auto") == ()
    assert left_out(losses.cross_entropy, mlp, x_mlp, y, "rest") == tuple(engine.leaf_names(mlp)[:2])
    with pytest.raises(ValueError, match="logra_layers"):
        left_out(losses.cross_entropy, mlp, x_mlp, y, "first")


def _context(kernel, n=40):
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(n, 5)), rng.integers(0, 3, n)
    model = build_model(ModelSpec("mlp", width=24, depth=1, activation="tanh"), 5, 3, key=jax.random.key(0))
    model = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64) if isinstance(a, jax.Array) else a, model)
    data = SimpleNamespace(x_train=xs, y_train=ys, x_test=xs[:3] + 0.2, y_test=ys[:3], task="classification")
    f = SimpleNamespace(model=model, loss_fn=losses.cross_entropy, data=data)
    return Context(f, {"logra_k": 8, "logra_kernel": kernel}, lambda: None), model, xs, ys


@pytest.mark.parametrize("kernel", ["after", "inner"])
def test_projected_gradient_scores_match_formed_gradients_in_float64(x64, kernel):
    """τ = φ(z)ᵀ(ΦᵀΦ + λI)⁻¹φᵢ (λ = 0.3 · tr(ΦᵀΦ)/k) or ⟨φ(z), φᵢ⟩, Φ from the loop of jax.grad times the explicit
    Kronecker matrices; self-influence φᵢᵀ(ΦᵀΦ + λI)⁻¹φᵢ or ‖φᵢ‖²."""
    ctx, model, xs, ys = _context(kernel)
    m = METHODS["logra"]
    state = m.prepare(ctx)
    layouts = _layouts(model)
    phi = np.stack([_explicit(state.projection, g, layouts) for g in _loop(model, jnp.asarray(xs), jnp.asarray(ys))])
    d = ctx.fitted.data
    phi_t = np.stack([_explicit(state.projection, g, layouts)
                      for g in _loop(model, jnp.asarray(d.x_test), jnp.asarray(d.y_test))])
    k = phi.shape[1]
    assert k < engine.num_params(model)  # a real projection
    if kernel == "after":
        lam = 0.3 * np.trace(phi.T @ phi) / k
        kinv = np.linalg.inv(phi.T @ phi + lam * np.eye(k))
        want, want_self = phi_t @ kinv @ phi.T, np.einsum("ik,kl,il->i", phi, kinv, phi)
    else:
        want, want_self = phi_t @ phi.T, np.sum(phi * phi, axis=1)
    got = m.scores(ctx, state, jnp.asarray(d.x_test), jnp.asarray(d.y_test)).values
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9 * np.abs(want).max())
    np.testing.assert_allclose(m.self_influence(ctx, state), want_self, rtol=1e-7)
    assert m.every_test_point(ctx) and not m.needs_optimum


def test_preparing_returns_memory_between_drawing_the_projection_and_the_pass(x64):
    """The page's `between` (memory.release_memory) runs after the projection is drawn, before the features' pass
    compiles: on SimpleCNN the Influence page's peak fell from 687–697 to 637 MB (benchmarks/RESULTS.md)."""
    import dataclasses

    ctx, *_ = _context("after")
    calls = []
    ctx = dataclasses.replace(ctx, between=lambda: calls.append(engine.TRACES["per_example_projections"]))
    before = engine.TRACES["per_example_projections"]
    METHODS["logra"].prepare(ctx)
    assert calls == [before]  # once, and before the pass was traced
