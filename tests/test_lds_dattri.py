"""benchmarks/lds_dattri: dattri's LDS protocol. The JAX pieces against NumPy; the smoke run against dattri
itself on the same tensors (skipped where torch, dattri or mnist1d are not installed: requirements-bench.txt)."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp

from benchmarks import lds_dattri as bench

PEERS = all(importlib.util.find_spec(m) is not None for m in ("torch", "dattri", "mnist1d"))


def test_loss_is_torch_cross_entropy_layout():
    """Linear layers in torch's (out, in) layout with ReLU between; the loss is −log softmax at the label."""
    r = bench.Recipe(hidden=(5,), lr=0.1, momentum=0.0, batch=4, epochs=1)
    p = bench.init_params(jax.random.key(0), r, 3, 4)
    assert sorted(p) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert p["fc1.weight"].shape == (5, 3) and float(jnp.max(jnp.abs(p["fc1.weight"]))) <= 1 / np.sqrt(3)
    x = np.array([0.5, -1.0, 2.0], np.float32)
    a = {k: np.asarray(v, np.float64) for k, v in p.items()}
    z = a["fc2.weight"] @ np.maximum(a["fc1.weight"] @ x + a["fc1.bias"], 0) + a["fc2.bias"]
    assert float(bench.loss(p, x, 2)) == pytest.approx(logsumexp(z) - z[2], rel=1e-5)


def test_full_batch_training_is_gradient_descent():
    """One epoch with batch = the subset is one SGD step per epoch: NumPy's closed-form softmax-regression gradient."""
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(8, 3)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32)
    r = bench.Recipe(hidden=(), lr=0.5, momentum=0.0, batch=4, epochs=3)
    p0 = bench.init_params(jax.random.key(1), r, 3, 3)
    subset = np.array([[1, 4, 5, 6]])
    stacked = jax.tree.map(lambda a: a[None], p0)
    final, ckpts = bench.train(stacked, jnp.asarray(xs), jnp.asarray(ys), subset, jnp.stack([jax.random.key(2)]), r,
                               n_checkpoints=3)
    w, b = np.asarray(p0["linear.weight"], np.float64), np.asarray(p0["linear.bias"], np.float64)
    x, y = xs[subset[0]].astype(np.float64), ys[subset[0]]
    for epoch in range(3):
        z = x @ w.T + b
        g = np.exp(z - logsumexp(z, axis=1, keepdims=True))
        g[np.arange(4), y] -= 1
        w, b = w - 0.5 * g.T @ x / 4, b - 0.5 * g.mean(0)
        np.testing.assert_allclose(ckpts["linear.weight"][0, epoch], w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(final["linear.weight"][0], w, rtol=1e-4, atol=1e-6)


def test_load_standardizes_and_refuses_what_it_cannot_give():
    d = bench.load("digits", 500, 100)
    assert d.x.dtype == np.float32 and d.y.dtype == np.int32 and d.n_classes == 10
    assert d.x.shape == (500, 64) and d.x_test.shape == (100, 64)
    np.testing.assert_allclose(d.x.mean(0), 0, atol=1e-5)
    with pytest.raises(ValueError, match="1797|asked for"):
        bench.load("digits", 5000, 500)
    with pytest.raises(ValueError, match="unknown data source"):
        bench.load("fashion", 10, 10)


def test_cached_build_reuses_only_the_same_setup(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    split = lambda t: bench.Split(rng.normal(size=(60, 4)).astype(np.float32), rng.integers(0, 3, 60),
                                  rng.normal(size=(t, 4)).astype(np.float32), rng.integers(0, 3, t), 3)
    data, path = split(8), str(tmp_path / "setup.pkl")

    def fake_build(name, data, *, retrains, trak_models):     # what `build` returns, without the training
        model = lambda: {"linear.weight": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)}
        return bench.Setup(name, bench.RECIPES[name], data, rng.integers(0, 60, (retrains, 30)),
                           rng.normal(size=(retrains, 8)), model(), [model()], [model() for _ in range(trak_models)], 0.0)

    monkeypatch.setattr(bench, "build", fake_build)
    first = bench.cached_build(path, "lr", data, retrains=2, trak_models=1)

    def no_build(*args, **kwargs):
        raise AssertionError("built again")

    monkeypatch.setattr(bench, "build", no_build)
    again = bench.cached_build(path, "lr", data, retrains=2, trak_models=1)
    np.testing.assert_array_equal(again.truth, first.truth)
    np.testing.assert_array_equal(again.full["linear.weight"], first.full["linear.weight"])
    for changed in [dict(data=split(8)), dict(retrains=3)]:
        with pytest.raises(AssertionError, match="built again"):
            bench.cached_build(path, "lr", **{"data": data, "retrains": 2, "trak_models": 1, **changed})


def test_best_damping_keeps_the_best_and_notes_refusals_and_labels():
    subsets = bench.inf.random_subsets(20, 12, seed=0)
    rng = np.random.default_rng(0)
    tau = rng.normal(size=(3, 20))
    truth = np.stack([tau[:, s].sum(1) for s in subsets])           # an exactly additive ground truth
    info = bench.inf.InverseHVP("cg", None, 10, 0.5, truncated=True)

    def score(delta):
        if delta == 0:
            raise bench.InfluenceError("conjugate gradient did not solve: raise the damping")
        return (tau if delta == 1 else rng.normal(size=tau.shape)), info

    per_test, delta, notes, label = bench.best_damping(score, [0.0, 0.1, 1.0], subsets, truth)
    assert delta == 1.0 and label == "truncated, 10 steps, residual 0.5"
    np.testing.assert_allclose(per_test, 1.0)
    assert notes[0] == "δ = 0: conjugate gradient did not solve" and notes[2].startswith("δ = 1: 1.000 (truncated")


@pytest.mark.slow
@pytest.mark.skipif(not PEERS, reason="torch, dattri and mnist1d are benchmark-only (requirements-bench.txt)")
def test_truncated_cg_influence_agrees_with_dattri_where_ten_steps_nearly_solve():
    """The MLP's influence function, 10 CG steps on both sides (gradlab from 0, dattri from v): at δ = 1, where ten
    steps nearly solve (H + δI)x = v, both are close to the same exact solve and rank the training set alike."""
    data = bench.load("mnist1d", 300, 10)
    s = bench.build("mlp", data, retrains=2, trak_models=1)
    g, info = bench.gradlab_influence(s, 1.0, cg_steps=10)
    assert info.truncated and info.residual < 0.05, info.label
    d = bench.dattri_scores(s, "influence", damping=1.0, cg_iters=10)
    rho = [np.corrcoef(a, b)[0, 1] for a, b in zip(g, d)]
    assert min(rho) > 0.99, min(rho)


@pytest.mark.slow
@pytest.mark.skipif(not PEERS, reason="torch, dattri and mnist1d are benchmark-only (requirements-bench.txt)")
def test_smoke_gradlab_and_dattri_agree_on_the_same_models():
    """A small run of the protocol: dattri's LDS metric equals gradlab's on the same scores, and where both sides
    compute the same quantity without approximation (IF with the exact Hessian at one damping; TRAK with k ≥ P, where
    dattri's projection is invertible) the scores rank the training set alike."""
    import torch
    from dattri.metric import lds as dattri_lds

    data = bench.load("mnist1d", 600, 20)     # N > P = 410: TRAK's ΦᵀΦ is invertible
    s = bench.build("lr", data, retrains=10, trak_models=2)
    for method, kw in [("influence", {"damping": 0.1}), ("trak", {})]:
        g = bench.gradlab_scores(s, method, **kw)
        d = bench.dattri_scores(s, method, **kw)
        assert g.shape == d.shape == (20, 600)
        rho = [np.corrcoef(a, b)[0, 1] for a, b in zip(g, d)]
        assert min(rho) > 0.999, (method, min(rho))        # float32 on both sides
        ours = bench.inf.lds(g, s.subsets, s.truth).per_test
        theirs = dattri_lds(torch.tensor(g.T), (torch.tensor(s.truth), torch.tensor(s.subsets)))[0]
        np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-6)
    grad_dot = bench.gradlab_scores(s, "grad_dot")
    assert grad_dot.shape == (20, 600) and not np.allclose(grad_dot, bench.gradlab_scores(s, "tracin"))
