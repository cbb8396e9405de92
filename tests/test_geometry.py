"""Geometry: arrows are the engine's per-example gradients, checked against a Python loop of jax.grad;
their mean is engine.batch_grad; clipping, noise, trajectories and the remove-an-example check."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from gradlab import engine, geometry


@pytest.mark.parametrize("name", list(geometry.PROBLEMS))
def test_arrows_are_per_example_gradients_and_their_mean_is_the_batch_gradient(name):
    p = geometry.problem(name)
    a = geometry.arrows(p, p.start)
    loop = np.stack([np.asarray(jax.grad(p.loss_fn)(p.start, x, y)) for x, y in zip(p.xs, p.ys)])
    np.testing.assert_allclose(a, loop, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a, np.asarray(engine.per_example_grads(p.loss_fn, p.start, p.xs, p.ys)), rtol=1e-6)
    np.testing.assert_allclose(geometry.mean_arrow(p, p.start),
                               np.asarray(engine.batch_grad(p.loss_fn, p.start, p.xs, p.ys, reduction="mean")), rtol=1e-6)
    np.testing.assert_allclose(geometry.mean_arrow(p, p.start), loop.mean(0), rtol=1e-4, atol=1e-5)


def test_scalar_example_is_the_seeds():
    p = geometry.problem("scalar")
    a = geometry.arrows(p, p.start)
    assert a[:, 0].tolist() == [2.0, 8.0] and a[:, 0].sum() == 10.0  # dℓ/dw, seed 002
    assert a[:, 1].tolist() == [2.0, 4.0]                              # dℓ/db = 2(w·x + b − y)


def test_clipping_and_noise_cloud():
    g = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    c = geometry.clip(g, 1.0)
    np.testing.assert_allclose(c, [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]])
    with pytest.raises(ValueError, match="C must be > 0"):
        geometry.clip(g, 0.0)
    cloud = geometry.noise_cloud(np.array([1.0, -1.0]), 2.0, 1.5, 10, samples=20_000)
    np.testing.assert_allclose(cloud.std(0), [0.3, 0.3], rtol=0.03)       # σ·C/B
    np.testing.assert_allclose(cloud.mean(0), [1.0, -1.0], atol=0.01)


def test_trajectories_share_batches_and_differ_by_clipping_and_noise():
    p = geometry.problem("line")
    kw = dict(lr=p.lr, steps=5, batch_size=p.batch_size, clip_norm=1.0, noise_multiplier=1.0)
    sgd, clipped, dp = (geometry.trajectory(p, m, **kw) for m in geometry.METHODS)
    # SGD by hand: the same minibatches (rng from seed 0), mean of the loop gradients
    rng, theta = np.random.default_rng(0), p.start.astype(np.float64)
    for _ in range(5):
        idx = rng.choice(p.n, p.batch_size, replace=False)
        theta = theta - p.lr * np.mean([np.asarray(jax.grad(p.loss_fn)(p.start * 0 + theta.astype(np.float32), p.xs[i], p.ys[i]))
                                        for i in idx], 0)
    np.testing.assert_allclose(sgd[-1], theta, rtol=1e-4)
    # clipped SGD moves at most η·C per step
    assert np.all(np.linalg.norm(np.diff(clipped, axis=0), axis=1) <= p.lr * 1.0 + 1e-6)
    assert not np.allclose(dp, clipped)
    assert sgd.shape == (6, 2)
    with pytest.raises(ValueError, match="batch size"):
        geometry.trajectory(p, "sgd", lr=0.1, steps=2, batch_size=p.n + 1)


@pytest.mark.parametrize("name", ["line", "logistic"])
def test_removing_an_example_matches_retraining_and_influence_is_close(name):
    p = geometry.problem(name)
    i = int(np.flatnonzero(p.marked)[0])
    r = geometry.remove_example(p, i)
    # the retrained optimum has zero gradient on the other N − 1 examples
    keep = np.arange(p.n) != i
    assert np.abs(geometry.arrows(p, r.retrained)[keep].mean(0)).max() < 1e-4
    if name == "line":  # least squares in closed form (float64) as the oracle
        X = np.stack([p.xs, np.ones(p.n)], 1).astype(np.float64)
        sol = np.linalg.lstsq(X[keep], p.ys[keep].astype(np.float64), rcond=None)[0]
        np.testing.assert_allclose(r.retrained, sol, rtol=1e-4, atol=1e-4)
    assert np.linalg.norm(r.retrained - r.optimum) > 0.01      # removing an outlier/flip moves the optimum
    assert r.error < 0.2                                        # and the influence function predicts where


def test_scalar_removal_has_no_unique_optimum():
    with pytest.raises(ValueError, match="no unique minimum"):
        geometry.remove_example(geometry.problem("scalar"), 0)


def test_loss_surface_is_the_mean_loss():
    p = geometry.problem("scalar")
    a, b, z = geometry.loss_surface(p, resolution=7)
    j, i = 2, 5
    expected = np.mean([(a[i] * x + b[j] - y) ** 2 for x, y in zip(p.xs, p.ys)])
    np.testing.assert_allclose(z[j, i], expected, rtol=1e-5)


def test_every_arrow_tip_lies_inside_the_frame():
    """Arrows from a θ near the window's corner, longer than the window: the axes widen to hold every tip."""
    import numpy as np

    from gradlab import plots

    a = b = np.linspace(-1, 1, 5)
    surface = (a, b, np.ones((5, 5)))
    theta = np.array([0.9, 0.9])
    grads = np.array([[3.0, 0.0], [0.0, -4.0], [-1.0, 2.0]])
    fig = plots.gradient_field(surface, theta, grads, grads.mean(0), scale=1.0, labels=np.zeros(3, int),
                               marked=np.zeros(3, bool))
    (x0, x1), (y0, y1) = fig.layout.xaxis.range, fig.layout.yaxis.range
    tips = theta + grads
    assert (x0 < tips[:, 0]).all() and (tips[:, 0] < x1).all() and (y0 < tips[:, 1]).all() and (tips[:, 1] < y1).all()
    assert x0 <= -1 and x1 >= 1 and y0 <= -1 and y1 >= 1  # the whole loss surface still shows


def test_removal_close_up_frames_the_three_points():
    import numpy as np

    from gradlab import geometry, plots

    r = geometry.remove_example(geometry.problem("logistic"), 2)
    fig = plots.removal_zoom(r)
    (x0, x1), (y0, y1) = fig.layout.xaxis.range, fig.layout.yaxis.range
    pts = np.array([r.optimum, r.retrained, r.predicted])
    assert (x0 < pts[:, 0]).all() and (pts[:, 0] < x1).all() and (y0 < pts[:, 1]).all() and (pts[:, 1] < y1).all()
    assert x1 - x0 < 4 * np.ptp(pts, 0).max() + 1e-6  # a close-up, not the whole window
    # the right panel zooms on the moved optimum: the cross and the diamond a third of its window apart or more (on the
    # left they overlapped, 6% of the move apart)
    (u0, u1), (v0, v1) = fig.layout.xaxis2.range, fig.layout.yaxis2.range
    apart = np.abs(r.retrained - r.predicted) / np.array([u1 - u0, v1 - v0])
    assert apart.max() >= 1 / 3, apart
    assert (u0 < pts[1:, 0]).all() and (pts[1:, 0] < u1).all() and (v0 < pts[1:, 1]).all() and (pts[1:, 1] < v1).all()


def test_a_new_problem_brings_its_own_learning_rate_and_batch_size(page):
    """The page's η and B follow the problem picked: the sliders kept the old problem's values while their defaults
    (what a link without them gives) became the new one's, so a copied link showed another η (issue 41)."""
    at = page("geometry")
    for name in ("scalar", "logistic", "line"):
        at.radio(key="geo_problem").set_value(name).run()
        assert not at.exception, [e.value for e in at.exception]
        q = geometry.problem(name)
        assert at.select_slider(key="geo_lr").value == q.lr, name
        assert at.number_input(key="geo_batch").value == min(q.batch_size, q.n), name
