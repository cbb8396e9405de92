"""gradlab.bench on tiny problems: timings are well-formed, memory matches the real arrays."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradlab import bench, engine, losses, models


@pytest.fixture(scope="module")
def tiny():
    model = models.MLP(3, 2, 4, 1, "relu", key=jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (8, 3))
    return losses.cross_entropy, model, xs, jnp.arange(8) % 2


def test_sweep_cells_and_loop_max(tiny):
    calls = []
    rows = bench.sweep(*tiny, [2, 8], ["loop", "vmap", "batch", "norms"], repeats=2, loop_max=4,
                       progress=lambda f, text: calls.append(f))
    cells = [(t.n, t.approach) for t in rows]
    assert cells == [(2, "loop"), (2, "vmap"), (2, "batch"), (2, "norms"), (8, "vmap"), (8, "batch"), (8, "norms")]
    assert [t.repeats for t in rows] == [1, 2, 2, 2, 2, 2, 2]  # the slow loop is timed once
    assert calls[-1] == 1.0 and calls == sorted(calls)


def test_time_approach_reports_first_call_and_median_run(tiny, monkeypatch):
    """With a scripted clock: first call 5 s, three runs of 1, 3, 2 s -> run 2 s (median), compile 3 s."""
    ticks = iter([0.0, 5.0, 10.0, 11.0, 20.0, 23.0, 30.0, 32.0])
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(ticks))
    t = bench.time_approach("batch", *tiny, repeats=3)
    assert (t.first_s, t.run_s, t.compile_s, t.repeats, t.n) == (5.0, 2.0, 3.0, 3, 8)


def test_sweep_rejects_bad_input(tiny):
    with pytest.raises(ValueError, match="between 1 and 8"):
        bench.sweep(*tiny, [0, 9])
    with pytest.raises(ValueError, match="unknown approach"):
        bench.sweep(*tiny, [2], ["fastest"])


def test_runner_results_match_the_engine(tiny):
    loss, model, xs, ys = tiny
    got = bench.runner("rules", loss, model, xs, ys)()
    want = engine.loop_per_example_grads(loss, model, xs, ys)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_memory_by_construction_and_xla(tiny):
    loss, model, xs, ys = tiny
    p = engine.num_params(model)
    assert bench.memory_bytes("vmap", 8, p) == 8 * p * 4
    assert bench.memory_bytes("norms_vmap", 1000, p, chunk_size=256) == 256 * p * 4
    assert bench.memory_bytes("batch", 8, p) == p * 4
    # XLA's output buffer for vmap(grad) is exactly the N x P per-example gradients it returns
    real = sum(a.nbytes for a in jax.tree.leaves(engine.per_example_grads(loss, model, xs, ys, method="vmap")))
    assert real == 8 * p * 4
    out = engine.xla_memory("vmap", loss, model, xs, ys)["output"]
    assert real <= out <= real + 16 * len(jax.tree.leaves(model))  # + XLA's tuple of buffer pointers
    assert engine.xla_memory("loop", loss, model, xs, ys) is None


def test_digits_workload_shape():
    loss, model, xs, ys = bench.digits_mlp()
    assert xs.shape == (1797, 64) and ys.shape == (1797,)
    assert engine.num_params(model) == 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10


def test_maxpool_near_ties_are_found_in_float64():
    """A window whose two largest inputs differ by 1e-8 relative is a near-tie; one 1e-3 apart is not."""
    from benchmarks import torch_cnn

    model = torch_cnn.SimpleCNN(key=jax.random.key(0))
    # conv1, conv2 as identities on channel 0 (centre tap): the pooled input is relu(x) cropped.
    w1 = jnp.zeros((32, 1, 3, 3)).at[0, 0, 1, 1].set(1.0)
    w2 = jnp.zeros((64, 32, 3, 3)).at[0, 0, 1, 1].set(1.0)
    model = eqx.tree_at(lambda m: (m.conv1.weight, m.conv1.bias, m.conv2.weight, m.conv2.bias), model,
                        (w1, jnp.zeros((32, 1, 1)), w2, jnp.zeros((64, 1, 1))))
    xs = np.zeros((3, 1, 28, 28))
    xs[0, 0, 2, 2], xs[0, 0, 2, 3] = 0.5, 0.5 * (1 + 1e-8)   # near-tie
    xs[1, 0, 2, 2], xs[1, 0, 2, 3] = 0.5, 0.5 * (1 + 1e-3)   # clear winner
    xs[2, 0, 2, 2], xs[2, 0, 2, 3] = -0.5, -0.5              # tie below zero: relu makes it irrelevant
    assert torch_cnn.maxpool_near_ties(model, xs) == [0]


# ---------------------------------------------------------------- issue 40: the sweep planned from memory and time


def test_the_sweep_is_planned_from_memory_with_a_reduced_n_for_what_fits_no_chosen_size():
    """Seed 003's SimpleCNN (P = 1,199,882; 1.47 MB of intermediates per example, `memory.example_bytes`): vmap(grad)
    and the loop fit none of 16, 64, 256 within 96 MB, so every approach is also timed at the largest N where they
    fit (the oracle: 3·N·P·4 + N·1.47 MB computed here), and the largest N go until the estimate fits the time."""
    from gradlab import costs, memory

    p, each, budget = 1_199_882, 1_466_016, 96 * 2**20
    approaches, sizes = ["loop", "vmap", "batch", "norms"], [16, 64, 256]
    kw = dict(n_available=6000, repeats=2, loop_max=256, example_bytes=each, macs=12_000_000, budget_bytes=budget)
    n_fit = max(n for n in range(1, 100) if memory.XLA_COPIES * n * p * 4 + n * each <= budget)
    plan = bench.plan_sweep(approaches, sizes, p, **kw)
    assert plan.reduced == n_fit == 6 and plan.over_time == ()
    cells = dict(plan.cells)
    assert cells["loop"] == cells["vmap"] == (6,)  # seed 003's comparison, at the N that fits
    assert cells["batch"] == (6, 16)  # 64 × 1.47 MB of activations + 3P floats pass 96 MB
    assert cells["norms"] == (6, 16, 64, 256)  # streamed: chunks of the engine's size at any N
    assert ("vmap", 16) in plan.over_memory and ("batch", 64) in plan.over_memory
    assert plan.seconds == pytest.approx(costs.timing_seconds(p, plan.cells, repeats=2, macs=12_000_000))
    timed = bench.plan_sweep(approaches, sizes, p, **kw, seconds=plan.seconds - 1)  # the largest N goes first
    assert timed.over_time == (256,) and dict(timed.cells)["norms"] == (6, 16, 64) and timed.seconds <= plan.seconds - 1
    # the digits MLP: every chosen cell fits, nothing added, nothing left out (its page's numbers do not move)
    mlp = bench.plan_sweep(approaches, sizes, 4810, n_available=1437, repeats=2, loop_max=256, example_bytes=1284,
                           macs=4810, seconds=26)
    assert mlp.cells == tuple((a, (16, 64, 256)) for a in approaches) and mlp.reduced is None
    assert not mlp.over_memory and not mlp.over_time


def test_the_sweep_estimate_counts_compiling_each_cell():
    """Measured on seed 003's SimpleCNN from cold processes (benchmarks/RESULTS.md): compiling a batch gradient took
    1.6–2.1 CPU-s, vmap(grad) 2.3–2.5, per cell; the old estimate's 0.5 s per cell was 4× short."""
    from gradlab import costs

    assert 1.0 <= costs.cell_compile_seconds("batch", 12_000_000) <= 3.0
    assert 1.5 <= costs.cell_compile_seconds("vmap", 12_000_000) <= 4.0
    one = costs.timing_seconds(1_199_882, [("batch", [16])], repeats=2, macs=12_000_000)
    two = costs.timing_seconds(1_199_882, [("batch", [16, 64])], repeats=2, macs=12_000_000)
    assert two - one >= costs.cell_compile_seconds("batch", 12_000_000)  # a new N compiles again
    loops = costs.timing_seconds(1_199_882, [("loop", [2, 6])], repeats=2, macs=12_000_000)
    assert loops < 2 * costs.cell_compile_seconds("loop", 12_000_000)  # the loop compiles its gradient once
