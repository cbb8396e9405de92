"""Issue 40, item 6: a researcher's ~1M-parameter Equinox CNN served with `python -m gradlab serve` gets Equivalence
and Performance as seed 003's SimpleCNN does: a declared subset, the loop and vmap(grad) at the N that fits."""

from __future__ import annotations

import pytest
from conftest import assert_clean, open_page

from gradlab import own

CNN = '''
import equinox as eqx, jax, jax.numpy as jnp, numpy as np

class CNN(eqx.Module):
    c1: eqx.nn.Conv2d
    c2: eqx.nn.Conv2d
    fc: eqx.nn.Linear

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.c1 = eqx.nn.Conv2d(1, 32, 3, key=k1)
        self.c2 = eqx.nn.Conv2d(32, 64, 3, key=k2)
        self.fc = eqx.nn.Linear(24 * 24 * 64, 26, key=k3)

    def __call__(self, x):
        h = jax.nn.relu(self.c2(jax.nn.relu(self.c1(x.reshape(1, 28, 28)))))
        return self.fc(h.reshape(-1))

def loss_fn(model, x, y):
    logits = model(x)
    return jax.nn.logsumexp(logits) - logits[y]

params = CNN(jax.random.key(0))
rng = np.random.default_rng(0)
data = (rng.normal(size=(100, 28, 28)).astype(np.float32), np.arange(100) % 26)
'''


@pytest.fixture
def served_cnn(tmp_path, monkeypatch):
    path = tmp_path / "my_cnn.py"
    path.write_text(CNN)
    monkeypatch.setenv(own.ENV, str(path))
    yield own.served()
    own._load_served.cache_clear()


@pytest.mark.slow
def test_equivalence_and_performance_on_a_served_million_parameter_cnn(served_cnn):
    from gradlab import engine

    p = engine.num_params(served_cnn.params)
    assert 900_000 < p < 1_100_000
    at = open_page("equivalence", dataset=own.OWN)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    n = next(m for m in at.metric if m.label == "N examples").value
    said = " ".join(i.value for i in at.info)
    # 80 training examples (the 80/20 split of 100); way (b)'s float64 intermediates bound the subset, and it says so
    assert n.endswith(" of 80") and "Compared on" in said and "drawn at random (seed 0" in said and "per example" in said
    assert any("float64" in m.label for m in at.metric)

    at = open_page("performance", dataset=own.OWN, perf_sizes=[16, 64], perf_repeats=1)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    labels = [m.label for m in at.metric]
    assert "vmap speed-up over loop" in labels and "vmap / batch gradient" in labels  # seed 003's comparison, shown
    warned = " ".join(w.value for w in at.warning)
    assert "skipped" in warned and "also timed at **N = " in warned
