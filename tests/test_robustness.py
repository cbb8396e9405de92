"""Extreme settings give messages, not crashes, on the pages that exist: a huge learning rate,
no training at all, almost all labels flipped, the widest/deepest model, an empty upload link."""

from __future__ import annotations

import math

import pytest
from conftest import assert_clean, open_page

from gradlab.experiment import Experiment, load_data

EXTREMES = {
    "lr=100 diverges": dict(dataset="moons", lr=100.0, optimizer="sgd", steps=50, checkpoint_every=25),
    "no training": dict(dataset="moons", steps=0),
    "95% labels flipped": dict(dataset="blobs", label_noise=0.95, steps=25, checkpoint_every=25),
    "regression, huge lr (Adam)": dict(dataset="line_outliers", model="linear", lr=100.0, steps=25, checkpoint_every=25),
}


def number(value: str) -> float:
    """An st.metric value as a float: "1,894" -> 1894, "32.7%" -> 32.7, "2.8×" -> 2.8."""
    return float(value.replace(",", "").rstrip("%×"))


# The influence page converges θ̂ and scores every method: ~15 s a case, so only its quick case runs in `-m "not slow"`.
CASES = [pytest.param(page, case, marks=[pytest.mark.slow] if page == "influence" and not case.startswith("lr=100") else [])
         for page in ("norms", "influence") for case in EXTREMES]


@pytest.mark.parametrize("page, case", CASES)
def test_extreme_settings_give_messages_not_tracebacks(page, case):
    at = open_page(page, **EXTREMES[case])
    assert_clean(at)
    text = " ".join(e.value for e in at.error) + " ".join(w.value for w in at.warning)
    shown = {m.label: m.value for m in at.metric}
    if case.startswith("lr=100"):
        # the run diverges: the page says so and names the setting to change, and shows no numbers
        assert "diverged" in text and "learning rate (now 100)" in text, text
        assert not shown, shown
    elif page == "norms":
        settings = {k: v for k, v in EXTREMES[case].items() if k in ("dataset", "label_noise")}
        n = len(load_data(Experiment(**settings)).y_train)
        assert shown["Training examples N"] == f"{n:,}", shown
        assert math.isfinite(number(shown["Median norm"])) and number(shown["Median norm"]) > 0, shown
        if case == "no training":
            assert 0 < number(shown["Training accuracy"]) <= 100, shown
        elif case == "95% labels flipped":  # the detector of the flipped labels is shown, an AUC
            assert 0 <= number(shown["Mislabel detection AUC"]) <= 1, shown
        else:  # regression: no accuracy
            assert "Training accuracy" not in shown, shown
    else:
        assert math.isfinite(number(shown["Test loss"])) and number(shown["Test loss"]) >= 0, shown
        assert shown["θ̂"] in ("minimum", "near-minimum"), shown
        if case == "no training":  # TracIn needs training steps, and the page says so
            assert "TracIn is unavailable" in text and "no training steps" in text, text
        elif case == "95% labels flipped":
            aucs = [number(v) for k, v in shown.items() if k.startswith("AUC")]
            assert len(aucs) >= 2 and all(0 <= a <= 1 for a in aucs), shown
        else:  # TracIn's SGD run diverges at lr 100; the influence function (L-BFGS) still converges
            assert "TracIn is unavailable" in text and "diverged" in text, text
            assert shown["θ̂"] == "minimum", shown


def test_upload_link_without_data_asks_for_a_file():
    """A shared link with dataset=upload opens without the uploader's data: a message, no crash."""
    at = open_page("norms", dataset="upload")
    assert_clean(at)
    assert any("upload a CSV" in i.value for i in at.info)
    assert not at.metric


# ---------------------------------------------------------------- the memory budget (library, no Streamlit)


def test_memory_estimates_match_the_real_arrays():
    """The estimates count what the algorithms hold: checked against real checkpoints and gradients."""
    import jax
    import numpy as np

    from gradlab import engine, memory
    from gradlab.experiment import Experiment, fit

    f = fit(Experiment(dataset="moons", model="mlp", width=8, steps=25, checkpoint_every=10))
    p = engine.num_params(f.model)
    assert len(f.run.checkpoints) == memory.n_checkpoints(25, 10) == 4  # steps 0, 10, 20, 25
    held = sum(np.asarray(a).nbytes for c in f.run.checkpoints for a in jax.tree.leaves(c) if hasattr(a, "nbytes"))
    assert held == 4 * p * 4 and memory.training_bytes(p, 4) == (4 + 4) * p * 4
    g = engine.per_example_grads(f.loss_fn, f.model, f.data.x_train[:32], f.data.y_train[:32])
    assert memory.per_example_grads_bytes(32, p) == memory.XLA_COPIES * sum(a.nbytes for a in jax.tree.leaves(g))
    # the influence estimate counts TRAK's projection (P x k floats) and θ̂'s L-BFGS-B (float64 P-vectors on the host)
    import tracemalloc

    import jax.numpy as jnp

    from gradlab.influence import scores, solvers

    assert scores.random_projection(jax.random.key(0), p, 16, jnp.float32).nbytes == 4 * p * 16
    pw = 20_000  # least squares on P = 20,000 weights: SciPy's arrays dwarf its fixed ones
    xs, ys = jax.random.normal(jax.random.key(1), (16, pw)), jnp.arange(16.0)
    square = lambda w, x, y: 0.5 * (x @ w - y) ** 2  # noqa: E731
    solvers.minimize(square, jnp.zeros(pw), xs, ys, l2=1e-2, max_iter=2)  # compiled outside the measurement
    tracemalloc.start()
    try:
        solvers.minimize(square, jnp.zeros(pw), xs, ys, l2=1e-2, max_iter=20)
        held = tracemalloc.get_traced_memory()[1]  # NumPy's arrays are traced: SciPy's workspace and the copies
    finally:
        tracemalloc.stop()
    assert 8 * pw * (2 * memory.LBFGS_MEMORY + 5) <= held <= 8 * pw * memory.LBFGS_VECTORS
    assert memory.influence_bytes(p, 16, 5, 4) - memory.influence_bytes(p, 0, 5, 4) == 4 * (p * 16 + 3 * 16 * 16)
    # k ≥ P: no projection and no kernel, conjugate gradient's vectors for 8 test points at a time
    assert scores.random_projection(jax.random.key(0), p, p, jnp.float32) is None
    assert memory.influence_bytes(p, 10 * p, 5, 4) - memory.influence_bytes(p, 0, 5, 4) == 4 * 40 * p


def test_over_budget_settings_are_refused_with_the_largest_that_fits():
    """The widest, deepest MLP on digits (P = 826,378) with 2000 steps and a checkpoint every 10:
    201 checkpoints = 677 MB. Over the 96 MB budget the message names "every 100 steps" (21
    checkpoints + 4 P of optimizer state = 79 MB fits; every 50 = 41 checkpoints = 142 MB does not)."""
    from gradlab import memory
    from gradlab.experiment import check_training_memory
    from gradlab.experiment import Experiment

    p = 64 * 512 + 512 + 3 * (512 * 512 + 512) + 512 * 10 + 10
    assert p == 826_378
    assert memory.BUDGET_BYTES == 96 * 2**20
    with pytest.raises(memory.OverBudget, match=r"Checkpoint every\*\* to 100 steps"):
        check_training_memory(Experiment(width=512, depth=4, steps=2000, checkpoint_every=10), p)
    with pytest.raises(memory.OverBudget):
        check_training_memory(Experiment(width=512, depth=4, steps=2000, checkpoint_every=50), p)
    check_training_memory(Experiment(width=512, depth=4, steps=2000, checkpoint_every=100), p)  # fits: no error
    # DP-SGD streams its Poisson batch buffer through the engine's chunks: any q fits this MLP; a model whose
    # DP_SGD_VECTORS + checkpoints P-vectors alone pass the budget fits none and is told to shrink
    assert memory.largest_sample_rate(1437, p, n_features=64) == 1.0
    assert memory.largest_sample_rate(1437, 3_000_000) == 0.0 and "smaller model" in memory.dp_sgd_fix(1437, 3_000_000)
    # seed 003's SimpleCNN on the Fashion subset: its accuracy curve keeps two intervals (3 checkpoints), the MLP ten
    q, cnn = 256 / 6000, 1_199_882
    assert memory.dp_checkpoint_every(6000, q, cnn, 200, n_features=784) == 100
    assert memory.dp_sgd_bytes(6000, q, cnn, n_features=784, checkpoints=3) <= memory.BUDGET_BYTES
    assert memory.dp_sgd_bytes(6000, q, cnn, n_features=784, checkpoints=4) > memory.BUDGET_BYTES
    assert memory.dp_checkpoint_every(1437, 0.2, p, 200, n_features=64) == 20
    # Influence: a 256-wide MLP (P = 85,002) fits TRAK's k = 128 but not 256 (the default is 1024); the widest
    # MLP fits no k and is told the largest P that fits
    dims = [64, 128, 256, 512, 1024]
    p = 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    assert memory.influence_bytes(p, 128, 5, 7) <= memory.BUDGET_BYTES < memory.influence_bytes(p, 256, 5, 7)
    assert "k ≤ 128" in memory.influence_fix(p, dims, 5, 7)
    assert "at most 147,961 parameters" in memory.influence_fix(826_378, dims, 5, 7)  # θ̂'s L-BFGS-B: 88 P-floats


def test_a_link_over_the_work_budget_is_refused_before_training(monkeypatch):
    """The measured 175-CPU-s link: refused with the estimate and the most steps that fit, nothing trained (gradlab's
    training loop is never called: a check load cannot move, where a wall-clock bound could)."""
    from conftest import assert_clean, open_page

    from gradlab import experiment

    trained = []
    monkeypatch.setattr(experiment, "train", lambda *a, **k: trained.append(1) or pytest.fail("it trained"))
    at = open_page("norms", steps=2000, width=512, depth=4, batch_size=2048, checkpoint_every=500)
    assert_clean(at)
    text = " ".join(e.value for e in at.error)
    assert "CPU-seconds" in text and "Training steps" in text, text
    assert trained == []


def test_influence_and_performance_links_over_the_work_budget_are_refused(monkeypatch):
    """A wide network on Influence (θ̂ by L-BFGS over every example: about 110 CPU-s): the influence function is
    refused with its estimate, before any L-BFGS, and the page opens on a method at the trained checkpoint that fits
    (issue 40: each method gated on its own cost). Performance under a 5-CPU-s budget (the default sweep is about 8)
    runs a reduced sweep and says which sizes it left out, never an error (issue 40: a reduced setting that fits)."""
    from conftest import assert_clean, open_page

    from gradlab import costs

    at = open_page("influence", width=256, depth=3, steps=20, checkpoint_every=10)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert at.selectbox(key="infl_method").value != "influence"
    assert any("Opened on" in i.value and "CPU-seconds" in i.value and "θ̂" in i.value for i in at.info)
    assert not [m for m in at.metric if m.label.startswith("L-BFGS")]  # θ̂ never converged
    monkeypatch.setattr(costs, "WORK_BUDGET_SECONDS", 5.0)
    perf = open_page("performance", perf_repeats=3, seed=4242)  # timings are stored on disk: settings no other test times
    assert_clean(perf)
    assert not perf.error, [e.value for e in perf.error]
    said = " ".join(i.value for i in perf.info)
    assert "left out" in said and "CPU-seconds" in said, said


CRAFTED_SELECTIONS = [
    None, {}, {"selection": None}, {"selection": {"points": []}}, {"selection": {"points": "x"}},
    {"selection": {"points": [None]}}, {"selection": {"points": [{"customdata": "1; DROP"}]}},
    {"selection": {"points": [{"customdata": ["a"]}]}}, {"selection": {"points": [{"point_index": -3}]}},
    {"selection": {"points": [{"point_index": 10**30}]}}, {"selection": {"points": [{"point_index": float("nan")}]}},
    {"selection": {"points": [{"point_index": 2.5}]}}, {"selection": {"points": [{"customdata": True}]}},
    {"selection": {"points": [{"customdata": [7, "x"]}]}},
]


def test_a_crafted_chart_selection_is_ignored_never_a_traceback():
    """What a visitor's client may send as a Plotly selection: only a whole index in range picks an example."""
    from gradlab.ui import picked_index

    results = [picked_index(event, 10) for event in CRAFTED_SELECTIONS]
    assert results[:-1] == [None] * (len(CRAFTED_SELECTIONS) - 1) and results[-1] == 7
    assert picked_index({"selection": {"points": [{"point_index": 3}]}}, 10) == 3


@pytest.mark.parametrize("page, key", [("geometry", "geo_pick"), pytest.param("influence", "infl_pick", marks=pytest.mark.slow)])
def test_pages_survive_crafted_selections(page, key):
    from conftest import assert_clean, open_page

    at = open_page(page, steps=20, checkpoint_every=10)
    for event in CRAFTED_SELECTIONS[4:8]:
        at.session_state[key] = event
        at.run()
        assert_clean(at)
