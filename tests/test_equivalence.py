"""gradlab.equivalence against independent oracles: the seeds' numbers, NumPy float64 algebra."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradlab import equivalence, losses, models


def test_scalar_example_is_the_seeds():
    loss, w, xs, ys = equivalence.scalar_example()
    cmp = equivalence.compare(loss, w, xs, ys)
    assert float(cmp.way_a["params"]) == 10.0 and float(cmp.way_b["params"]) == 10.0
    assert cmp.max_abs32 == 0.0 and cmp.n == 2 and cmp.num_params == 1
    mean = equivalence.compare(loss, w, xs, ys, reduction="mean")
    assert float(mean.way_a["params"]) == 5.0 == float(mean.way_b["params"])


def _linear_problem(n=300, d=5):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d)).astype(np.float32) * 10
    y = rng.standard_normal(n).astype(np.float32)
    model = models.Linear(d, "scalar", key=jax.random.key(0))
    return model, x, y


def test_float64_reference_matches_numpy_algebra():
    """Linear regression: Σᵢ 2(w·xᵢ + b − yᵢ) xᵢ in NumPy float64 is the independent reference."""
    model, x, y = _linear_problem()
    w = np.asarray(model.layer.weight, np.float64)[0]
    b = float(model.layer.bias[0])
    r = x.astype(np.float64) @ w + b - y
    ref_w, ref_b = 2 * r @ x.astype(np.float64), 2 * r.sum()
    cmp = equivalence.compare(losses.mse, model, jnp.asarray(x), jnp.asarray(y))
    by = {l.name: l for l in cmp.leaves}
    wl, bl = by[".layer.weight"], by[".layer.bias"]
    # the float64 ways agree with each other to ~1e-16 relative ...
    assert wl.rel64 < 1e-13 and bl.rel64 < 1e-13
    # ... and the error of each float32 way measured against them is its error against NumPy
    np.testing.assert_allclose(wl.err_b32, np.max(np.abs(cmp.way_b[".layer.weight"][0] - ref_w)), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(bl.err_a32, abs(float(cmp.way_a[".layer.bias"][0]) - ref_b), rtol=1e-6, atol=1e-9)
    # float32 rounding is visible but small
    assert 0 < wl.rel32 + bl.rel32 < 1e-4
    assert wl.rel32 > wl.rel64


def test_mlp_ways_agree_and_mean_vs_sum_is_off_by_n():
    model = models.MLP(4, 3, 8, 1, "tanh", key=jax.random.key(1))
    xs = jax.random.normal(jax.random.key(2), (50, 4))
    ys = jnp.arange(50) % 3
    cmp = equivalence.compare(losses.cross_entropy, model, xs, ys)
    assert [l.name for l in cmp.leaves][0] == ".mlp.layers[0].weight"
    assert cmp.max_rel32 < 1e-5 and cmp.max_rel64 < 1e-13
    s = equivalence.mean_vs_sum(losses.cross_entropy, model, xs, ys)
    assert s.n == 50
    assert s.ratio == pytest.approx(50, rel=1e-5)
    assert s.mean_vs_mean < 1e-6 * max(s.scale, 1)
    assert s.sum_vs_mean > 10 * s.scale  # the trap is not rounding


def test_compare_all_is_compare_for_both_reductions_and_mean_vs_sum():
    """The page's one-pass version gives the same numbers; its mean way (a) is a loop of grad / N."""
    model = models.MLP(4, 3, 8, 1, "tanh", key=jax.random.key(1))
    xs = jax.random.normal(jax.random.key(2), (30, 4))
    ys = jnp.arange(30) % 3
    both, scaling = equivalence.compare_all(losses.cross_entropy, model, xs, ys)
    for r in ("sum", "mean"):
        one = equivalence.compare(losses.cross_entropy, model, xs, ys, reduction=r)
        assert both[r].reduction == r and both[r].leaves == one.leaves
    assert scaling == equivalence.mean_vs_sum(losses.cross_entropy, model, xs, ys)
    import equinox as eqx

    loop = sum(eqx.filter_grad(losses.cross_entropy)(model, xs[i], ys[i]).mlp.layers[0].weight for i in range(30)) / 30
    np.testing.assert_allclose(both["mean"].way_a[".mlp.layers[0].weight"], loop, rtol=1e-5, atol=1e-7)
    assert scaling.ratio == pytest.approx(30, rel=1e-5)


def test_way_a_in_chunks_equals_one_vmap(monkeypatch):
    model, x, y = _linear_problem(n=37)
    whole = equivalence.way_a(losses.mse, model, jnp.asarray(x), jnp.asarray(y))
    monkeypatch.setattr(equivalence, "MAX_MATERIALIZED", 6 * 10)  # P = 6: chunks of 10 examples
    chunked = equivalence.way_a(losses.mse, model, jnp.asarray(x), jnp.asarray(y))
    np.testing.assert_allclose(chunked.layer.weight, whole.layer.weight, rtol=1e-5)


def test_float64_does_not_leak_to_other_threads():
    """enable_x64 is thread-local: while one thread computes the float64 reference, others stay float32."""
    model, x, y = _linear_problem(n=2000, d=50)
    seen, done = set(), threading.Event()

    def work():
        try:
            equivalence.compare(losses.mse, model, jnp.asarray(x), jnp.asarray(y))
        finally:
            done.set()

    t = threading.Thread(target=work)
    t.start()
    while not done.is_set():
        seen.add(jnp.zeros(1, float).dtype)
        seen.add(jnp.asarray(1.0).dtype)
    t.join()
    assert seen == {jnp.dtype("float32")}
    assert not jax.config.jax_enable_x64


def test_pitfalls_run_live_with_real_output():
    out = {p.title: p for p in equivalence.run_pitfalls()}
    no_axes = out["vmap without in_axes"]
    assert no_axes.raised and "ValueError" in no_axes.output and "axis 0" in no_axes.output
    fixed = out["vmap with in_axes=(None, 0): one gradient per example"]
    assert not fixed.raised and "[2., 8.]" in fixed.output and "shape (2,)" in fixed.output
    summed = out["grad of the summed loss: one number, not N"]
    assert not summed.raised and "10." in summed.output and "shape ()" in summed.output
    assert out["grad of a non-scalar: the per-example losses are not a loss"].raised
    # the code shown is the code executed
    assert "in_axes=" not in no_axes.code and "in_axes=(None, 0)" in fixed.code


def test_shapes_rows():
    model = models.MLP(4, 3, 8, 1, "relu", key=jax.random.key(1))
    rows = equivalence.shapes(losses.cross_entropy, model, jnp.ones((20, 4)), jnp.zeros(20, int))
    assert rows[0] == {"leaf": ".mlp.layers[0].weight", "per-example (N, ...)": "(20, 8, 4)", "summed (...)": "(8, 4)"}


def test_bad_reduction():
    loss, w, xs, ys = equivalence.scalar_example()
    with pytest.raises(ValueError, match="reduction"):
        equivalence.compare(loss, w, xs, ys, reduction="median")


# ---------------------------------------------------------------- issue 40: at any size, on a declared subset


def test_example_bytes_counts_what_one_more_example_computes():
    """The oracle is a hand count: tanh(x @ W) summed computes 5 + 5 + 1 numbers per example; the weight's own
    values (a transpose of W, computed once for the batch) do not grow with it."""
    from gradlab import memory

    w = jnp.ones((4, 5))
    loss = lambda w, x, y: jnp.sum(jnp.tanh(x @ w.T.T)) + y  # noqa: E731 - W.T.T: parameter-only values
    xs, ys = np.ones((3, 4), np.float32), np.zeros(3, np.float32)
    assert memory.example_bytes(loss, w, xs, ys) == 4 * (5 + 5 + 1 + 1)  # dot, tanh, sum, + y
    assert memory.example_bytes(loss, w, xs, ys, itemsize=8) == 8 * 12


def test_the_subset_is_the_largest_that_fits_memory_and_time():
    from gradlab import costs

    p, each = 1_199_882, 2_932_032  # seed 003's SimpleCNN in float64 (memory.example_bytes)
    mem = equivalence.plan_subset(6000, p, each, macs=12_000_000, seconds_left=1e9, budget_bytes=40 * each + 1)
    assert (mem.n, mem.why, mem.reduced) == (40, "memory", True)
    cost = lambda n: costs.equivalence_seconds(p, n, 12_000_000)  # noqa: E731
    left = cost(25) + 1e-9
    slow = equivalence.plan_subset(6000, p, each, macs=12_000_000, seconds_left=left, budget_bytes=10**12)
    assert (slow.n, slow.why) == (25, "time") and cost(slow.n) <= left < cost(slow.n + 1)
    small = equivalence.plan_subset(1437, 4810, 2568, seconds_left=26)  # the digits MLP: every example
    assert (small.n, small.why, small.reduced) == (1437, "all", False)
    tiny = equivalence.plan_subset(100, p, each, macs=12_000_000, seconds_left=0.0)  # nothing fits: one example
    assert tiny.n == 1


def test_a_reduced_comparison_is_the_comparison_of_those_examples():
    model, x, y = _linear_problem(n=50)
    idx = equivalence.subset_indices(50, 12)
    assert len(set(idx.tolist())) == 12 and list(idx) == sorted(idx)
    np.testing.assert_array_equal(idx, equivalence.subset_indices(50, 12))  # the same draw for every visitor
    sx, sy = equivalence.take(x, y, 12)
    np.testing.assert_array_equal(sx, x[idx])
    assert equivalence.take(x, y, 50)[0] is x  # all of them: the arrays themselves
    cmp = equivalence.compare(losses.mse, model, jnp.asarray(sx), jnp.asarray(sy))
    # the oracle: Σᵢ 2(w·xᵢ + b − yᵢ) xᵢ in NumPy float64 over those 12 rows
    w, b = np.asarray(model.layer.weight, np.float64)[0], float(model.layer.bias[0])
    r = x[idx].astype(np.float64) @ w + b - y[idx]
    np.testing.assert_allclose(cmp.way_b[".layer.weight"][0], 2 * r @ x[idx].astype(np.float64), rtol=1e-4)
    assert cmp.n == 12
