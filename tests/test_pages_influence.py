"""AppTest: the Influence page with small experiments; its controls exercised, no exception."""

from __future__ import annotations

import numpy as np

from conftest import FAST, assert_clean, open_page

LINEAR_NOISY = dict(FAST, model="linear", label_noise=0.1)


def _metric(at, label_start):
    return [m for m in at.metric if m.label.startswith(label_start)]


def test_influence_page_linear_digits_with_noise_and_retraining():
    at = open_page("influence", **LINEAR_NOISY)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert at.title[0].value == "Influence"
    # self-influence: both the last-checkpoint gradient norm and TracIn, with AUCs
    aucs = _metric(at, "AUC")
    assert {m.label for m in aucs} >= {"AUC · grad norm", "AUC · tracin"}
    assert all(0.5 < float(m.value) <= 1.0 for m in aucs)
    # agreement metrics between the chosen method (influence function) and the others
    assert _metric(at, "ρ(influence, grad dot)")

    # pick another test point, switch method and solver
    at.number_input(key="infl_test").set_value(5)
    at.selectbox(key="infl_method").set_value("TracIn")
    at.selectbox(key="infl_solver").set_value("cg")
    at.selectbox(key="infl_self").set_value("TracIn")
    at.slider(key="infl_top_pct").set_value(20)
    at.run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert at.metric[0].label == "Label"
    assert _metric(at, "Flipped in top 20% · tracin")
    assert any("TracIn" in h.value for h in at.subheader)

    # the retraining check: scatter + Pearson / Spearman
    at.number_input(key="infl_retrain_k").set_value(3)
    at.button(key="infl_retrain").click()
    at.run()
    assert_clean(at)
    pear = _metric(at, "Pearson r")
    assert pear and np.isfinite(float(pear[0].value))
    assert float(pear[0].value) > 0.5  # a linear model: predictions track retraining
    assert _metric(at, "Spearman ρ(tracin, actual)")


def test_influence_page_lissa_divergence_shows_a_message():
    at = open_page("influence", **LINEAR_NOISY)
    at.selectbox(key="infl_solver").set_value("lissa")
    at.run()
    at.number_input(key="infl_lissa_scale").set_value(0.001)
    at.run()
    assert_clean(at)
    assert any("LiSSA diverged" in e.value and "damping" in e.value for e in at.error)
    # the rest of the page keeps working (falls back to another method, self-influence still shown)
    assert _metric(at, "AUC · tracin")


def test_influence_page_2d_mlp_click_and_auto_cg_note():
    at = open_page("influence", **dict(FAST, dataset="moons", width=256))
    assert_clean(at)
    # an MLP barely trained: its Hessian is indefinite, CG stops with a message to raise the damping,
    # and the page falls back to the gradient dot product
    assert any("not positive definite" in e.value and "Raise the damping" in e.value for e in at.error)
    assert any("showing the gradient dot product" in w.value for w in at.warning)
    # with more damping CG runs; the MLP has more parameters than the exact-Hessian limit: a note says so
    at.select_slider(key="infl_damping").set_value(1.0)
    at.run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert any("conjugate gradient" in i.value and "1,282" in i.value for i in at.info)
    # a click on a test point in the chart selects it
    at.session_state["infl_pick"] = {"selection": {"points": [{"point_index": 7, "customdata": 7}]}}
    at.run()
    assert_clean(at)
    assert at.number_input(key="infl_test").value == 7
