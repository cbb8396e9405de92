"""gradlab.bench on tiny problems: timings are well-formed, memory matches the real arrays."""

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
    rows = bench.sweep(*tiny, [2, 8], ["loop", "vmap", "batch", "norms"], repeats=1, loop_max=4,
                       progress=lambda f, text: calls.append(f))
    cells = [(t.n, t.approach) for t in rows]
    assert cells == [(2, "loop"), (2, "vmap"), (2, "batch"), (2, "norms"), (8, "vmap"), (8, "batch"), (8, "norms")]
    assert all(t.run_s > 0 and t.first_s > 0 and t.compile_s >= 0 for t in rows)
    assert calls[-1] == 1.0 and calls == sorted(calls)


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
    out = bench.xla_memory("vmap", loss, model, xs, ys)["output"]
    assert real <= out <= real + 16 * len(jax.tree.leaves(model))  # + XLA's tuple of buffer pointers
    assert bench.xla_memory("loop", loss, model, xs, ys) is None


def test_digits_workload_shape():
    loss, model, xs, ys = bench.digits_mlp()
    assert xs.shape == (1797, 64) and ys.shape == (1797,)
    assert engine.num_params(model) == 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10


def test_torch_peers_agree_with_the_engine():
    """benchmarks/torch_cnn: same weights, same gradients as torch.func and Opacus (when installed)."""
    pytest.importorskip("torch")
    from benchmarks import torch_cnn

    res = torch_cnn.run(batch=2, rounds=1, with_loop=False)
    assert res["reference"] == "torch.func vmap(grad)"
    assert set(res["agreement"]) >= {"gradlab per_example_grads (layer rules)", "gradlab vmap(grad)"}
    assert all(v < 1e-4 for v in res["agreement"].values()), res["agreement"]
