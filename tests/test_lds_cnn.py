"""benchmarks/lds_cnn: dattri's LDS protocol on SimpleCNN. The cheap parts only: the recipe scaled to a prefix of the
training images, and the torch copy of the Equinox SimpleCNN (the weights dattri scores) computing the same loss
(skipped where torch is not installed: requirements-bench.txt)."""

from __future__ import annotations

import importlib.util

import jax
import numpy as np
import pytest

from benchmarks import lds_cnn as bench
from gradlab.models import SimpleCNN


def test_recipe_scales_with_the_training_images():
    """At 6,000 images the app's experiment itself; at 2,000 a third of its steps and checkpoint interval, the rest
    of the recipe unchanged."""
    assert bench.experiment(6000) == bench.EXPERIMENT
    e = bench.experiment(2000)
    assert (e.steps, e.checkpoint_every) == (100, 17)
    assert e.replace(steps=300, checkpoint_every=50) == bench.EXPERIMENT


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is a benchmark-only dependency")
def test_torch_copy_computes_the_same_loss():
    """The torch SimpleCNN with the Equinox model's weights (torch names and layouts) gives the same −ℓ."""
    model = SimpleCNN((28, 28), 10, key=jax.random.key(3))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(3, 784)).astype(np.float32), np.array([0, 4, 9])
    logp = np.stack([np.asarray(model(xi)) for xi in x])
    assert np.allclose(bench.torch_outputs(model, x, y), logp[np.arange(3), y], atol=1e-5)
