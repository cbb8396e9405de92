"""benchmarks/peers: every DP-SGD peer gives the same clipped sum on the same tensors (noise off). The
reference (a naive vmap clipped sum) against a Python loop of jax.grad; the peers (Opacus ghost and hooks,
jax-privacy) against it where installed (requirements-bench.txt), skipped otherwise."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from benchmarks import peers

SMALL = dict(vocab=32, d=16, layers=1, seq=8, batch=6)


@pytest.mark.slow
def test_reference_clipped_sum_is_a_loop_of_jax_grad():
    """The benchmark's reference: Σᵢ min(1, C/‖gᵢ‖)·gᵢ with gᵢ from a Python loop of jax.grad, in float64."""
    w = peers.with_median_clip(peers.gpt_workload(tied=True, **SMALL))
    grad = jax.jit(jax.grad(w.loss_fn))
    total, norms = None, []
    for i in range(w.batch):
        g = {k: np.asarray(v, np.float64) for k, v in grad(w.params, w.xs[i], w.ys[i]).items()}
        norms.append(np.sqrt(sum(np.sum(a ** 2) for a in g.values())))
        total = {k: min(1.0, w.clip_norm / norms[-1]) * a + (0 if total is None else total[k]) for k, a in g.items()}
    ref = w.by_name(peers.naive_clipped_sum(w.loss_fn, w.params, w.xs, w.ys, w.clip_norm))
    assert peers.max_rel_diff(ref, total) < 1e-5
    assert peers.max_rel_diff(w.by_name(peers.gradlab_clipped_sum(w.loss_fn, w.params, w.xs, w.ys, w.clip_norm)),
                              total) < 1e-4
    clipped = sum(n > w.clip_norm * (1 + 1e-6) for n in norms)
    assert 0 < clipped < w.batch  # C is the median norm: the sum mixes clipped and unclipped examples


@pytest.mark.slow
@pytest.mark.skipif(not (peers.HAS_TORCH and peers.HAS_JAX_PRIVACY),
                    reason="torch, opacus and jax-privacy not installed (requirements-bench.txt)")
def test_every_peer_gives_the_same_clipped_sum():
    """gradlab, jax-privacy, Opacus hooks and ghost on the tied and untied GPT and seed 003's CNN, with the
    same weights (copied from torch): each within float32 tolerance of the reference. Opacus' ghost
    clipping refuses a tied head (it raises); it must never return a different sum."""
    for name, w in peers.small_workloads().items():
        agree = peers.agreement(peers.with_median_clip(w))
        assert set(agree) == {"naive vmap(grad) clip", "gradlab dp_sgd_gradient", "jax-privacy clipped_grad",
                              "Opacus ghost", "Opacus hooks"}
        for peer, diff in agree.items():
            if peer == "Opacus ghost" and name == "gpt tied" and isinstance(diff, str):
                assert "tying" in diff
                continue
            assert diff < 1e-4, (name, peer, diff)
