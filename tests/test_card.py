"""gradlab.card (the record page's cheap quantities) against independent computations: a loop of jax.grad per
checkpoint, NumPy's clipping factor, the record table's own columns; the default pair never two of one run."""

from __future__ import annotations

import jax
import numpy as np
import pandas as pd
import pytest

from gradlab import card, record
from gradlab.experiment import Experiment, fit


@pytest.fixture(scope="module")
def fitted():
    return fit(Experiment(dataset="wine", model="linear", steps=20, checkpoint_every=10, label_noise=0.2))


def loop_norm(f, params, i):
    d = f.data
    g = jax.grad(f.loss_fn)(params, d.x_train[i], d.y_train[i])
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(a, np.float64))) for a in jax.tree.leaves(g)
                             if hasattr(a, "shape"))))


def test_trajectory_and_table_against_a_loop(fitted):
    f = fitted
    t = card.trajectory(f)
    n = len(f.data.y_train)
    assert t.norms.shape == (len(f.run.checkpoints), n) and list(t.steps) == list(f.run.steps)
    for i in (0, 7):
        want = [loop_norm(f, p, i) for p in f.run.checkpoints]
        np.testing.assert_allclose(t.norms[:, i], want, rtol=1e-4)
        np.testing.assert_allclose(card.norms_over_training(f, i), want, rtol=1e-4)
        assert t.tracin[i] == pytest.approx(np.sum(np.square(want)), rel=1e-4)
    tab = card.table(f, t, clip_norm=0.5)
    assert list(tab["index"]) == list(range(n))
    assert list(tab["row"]) == list(f.source.row_ids(f.data)[1])
    np.testing.assert_allclose(tab["clip_factor"], np.minimum(1.0, 0.5 / t.norms[-1]), rtol=1e-6)
    assert tab["clipped"].tolist() == (t.norms[-1] > 0.5).tolist()
    assert tab["flipped"].sum() == f.data.flipped.sum() > 0


def test_subset_trajectory_keeps_its_rows(fitted):
    t = card.trajectory(fitted, size=40)
    tab = card.table(fitted, t, clip_norm=1.0)
    assert len(tab) == 40 and list(tab["index"]) == list(t.index)


def test_the_default_pair_is_never_two_quantities_of_one_run():
    rng = np.random.default_rng(0)
    a = rng.normal(size=200)
    frame = pd.DataFrame({"grad_norm": a, "loss": a + 0.01 * rng.normal(size=200), "tracin": a ** 3,
                          "memorization": a + rng.normal(size=200)})
    corr = record.rank_correlations(frame, list(frame))
    best = card.strongest_across(corr)
    assert best is not None and "memorization" in (best.a, best.b)
    assert card.strongest_across(record.rank_correlations(frame, ["grad_norm", "loss", "tracin"])) is None


def test_trajectory_size_and_estimates():
    assert card.trajectory_size(1437, 4810, 7) == 1437  # the default experiment: every example before a button
    assert card.trajectory_size(60_000, 1_200_000, 11, 12_000_000) < 60_000
    both = card.ensembles_seconds(4810, 1437, model="mlp", steps=300, batch_size=128)
    parts = sum(card.ensembles_seconds(4810, 1437, model="mlp", steps=300, batch_size=128, private=p) for p in (False, True))
    assert parts < both <= 30  # the default experiment's button fits the work budget
