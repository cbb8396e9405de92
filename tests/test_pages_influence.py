"""AppTest: the Influence page with small experiments; its controls exercised, no exception."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import FAST, assert_clean, open_page

LINEAR_NOISY = dict(FAST, model="linear", label_noise=0.1, infl_trak_models=2)  # a small TRAK ensemble keeps the test quick


def _metric(at, label_start):
    return [m for m in at.metric if m.label.startswith(label_start)]


@pytest.mark.slow  # retraining and LDS on the page
def test_influence_page_linear_digits_with_noise_retraining_and_lds():
    at = open_page("influence", **LINEAR_NOISY)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert at.title[0].value == "Influence"
    # the one optimum: its gradient norm is shown and, for a convex model, below the target
    gnorm = _metric(at, "‖∇F(θ̂)‖ at the point used")
    assert gnorm and float(gnorm[0].value) < 1e-5
    assert _metric(at, "θ̂")[0].value == "minimum"
    # self-influence: gradient norm, TracIn and the influence function, with AUCs
    aucs = _metric(at, "AUC")
    assert {m.label for m in aucs} == {"AUC · gradient norm", "AUC · TracIn", "AUC · influence function",
                                       "AUC · projected (LoGra)"}
    assert all(0.5 < float(m.value) <= 1.0 for m in aucs)
    # every single-model method is scored: agreement metrics against the chosen one (influence function); TRAK
    # trains its ensemble and EK-FAC builds its curvature only when picked (on_demand)
    assert {m.label for m in _metric(at, "ρ(influence function,")} == {
        "ρ(influence function, grad dot)", "ρ(influence function, grad cosine)", "ρ(influence function, TracIn)",
        "ρ(influence function, projected (LoGra))"}
    # TRAK on a convex model with k ≥ P (650 parameters) and no damping: the Gauss–Newton matrix of softmax
    # regression is its Hessian and both ensemble models converge to the one optimum, so TRAK is the influence function
    at.select_slider(key="infl_damping").set_value(0.0)
    at.selectbox(key="infl_method").set_value("trak")
    at.run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert float(_metric(at, "ρ(TRAK, influence function)")[0].value) >= 0.99
    assert len(_metric(at, "ρ(TRAK,")) == 5  # the single-model methods; EK-FAC is prepared only when picked
    at.select_slider(key="infl_damping").set_value(1e-2)
    # under Adam, TracIn says it follows the SGD-trained run
    at.number_input(key="infl_test").set_value(5)
    at.selectbox(key="infl_method").set_value("tracin")
    at.selectbox(key="infl_solver").set_value("cg")
    at.selectbox(key="infl_self").set_value("TracIn")
    at.slider(key="infl_top_pct").set_value(20)
    at.run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert any("TracIn is derived for SGD" in i.value for i in at.info)
    assert _metric(at, "Flipped in top 20% · TracIn")
    assert any("TracIn" in h.value for h in at.subheader)

    # the retraining check at the same θ̂: scatter + Pearson / Spearman
    at.number_input(key="infl_retrain_k").set_value(3)
    at.button(key="run_infl_retrain").click()
    at.run()
    assert_clean(at)
    pear = _metric(at, "Pearson r")
    assert pear and float(pear[0].value) > 0.9  # a converged convex model: predictions track retraining
    assert _metric(at, "Spearman ρ(TracIn, actual)")
    # the verdict at the top of the page carries the same number
    assert any(f"r = {pear[0].value}" in x.value and "holds" in x.value for x in at.success)

    # the LDS of every method on the same subsets, behind its button
    at.select_slider(key="infl_lds_m").set_value(20)
    at.select_slider(key="infl_lds_t").set_value(16)
    at.button(key="run_infl_lds").click()
    at.run()
    assert_clean(at)
    lds = {m.label: float(m.value) for m in _metric(at, "LDS ·")}
    assert set(lds) == {"LDS · grad dot", "LDS · grad cosine", "LDS · TracIn", "LDS · influence function", "LDS · TRAK",
                        "LDS · projected (LoGra)", "LDS · EK-FAC"}
    assert all(-1 <= v <= 1 for v in lds.values())
    assert lds["LDS · influence function"] > 0.3  # a convex model: far better than chance


@pytest.mark.slow  # over 5 s of the quick subset; the full suite keeps the diverging-LiSSA message
def test_influence_page_lissa_divergence_shows_a_message():
    at = open_page("influence", **dict(LINEAR_NOISY, dataset="moons"))  # 480 examples: the quick subset's Influence page
    at.selectbox(key="infl_solver").set_value("lissa")
    at.run()
    at.number_input(key="infl_lissa_scale").set_value(0.001)
    at.run()
    assert_clean(at)
    assert any("LiSSA diverged" in e.value and "damping" in e.value for e in at.error)
    # the rest of the page keeps working (falls back to another method, self-influence still shown)
    assert any("showing the gradient dot product" in w.value for w in at.warning)
    assert _metric(at, "AUC · TracIn")


@pytest.mark.slow
def test_influence_page_2d_mlp_damping_click_and_auto_cg_note():
    at = open_page("influence", **dict(FAST, dataset="moons", width=256, infl_trak_models=2))
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    # the MLP has more parameters than the exact-Hessian limit: a note says CG runs instead
    assert any("conjugate gradient" in i.value and "1,282" in i.value for i in at.info)
    # no damping on a ReLU network's near-minimum: CG meets negative curvature and says to raise δ
    at.select_slider(key="infl_damping").set_value(0.0)
    at.run()
    assert_clean(at)
    assert any("not positive definite" in e.value and "Raise the damping" in e.value for e in at.error)
    # a click on a test point in the chart selects it
    at.session_state["infl_pick"] = {"selection": {"points": [{"point_index": 7, "customdata": 7}]}}
    at.run()
    assert_clean(at)
    assert at.number_input(key="infl_test").value == 7


@pytest.mark.slow
def test_influence_page_default_network_first_load():
    """The app's default experiment (digits MLP): the page opens without an error, θ̂ is reported."""
    at = open_page("influence", timeout=900)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert float(_metric(at, "‖∇F(θ̂)‖ at the point used")[0].value) < 1e-2
    assert np.isfinite(float(_metric(at, "Test loss")[0].value))


@pytest.mark.slow  # the LDS on the page
def test_influence_page_method_added_the_registry_way_end_to_end():
    """The last-layer method (one file plus one registry line): picked on the page it ranks proponents, joins the
    agreement and self-influence tables, and gets its LDS beside every other method; a one-layer model does not offer
    it and says why."""
    at = open_page("influence", **dict(FAST, dataset="moons", width=16, label_noise=0.1, infl_trak_models=2))
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    at.selectbox(key="infl_method").set_value("last_layer")
    at.run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert any(h.value == "Proponents and opponents: Last-layer gradient dot product (representer kernel)"
               for h in at.subheader)
    assert len(_metric(at, "ρ(last layer,")) == 5                 # every other single-model method (EK-FAC: when picked)
    assert 0.5 < float(_metric(at, "AUC · last layer")[0].value) <= 1.0
    at.select_slider(key="infl_lds_m").set_value(20)
    at.select_slider(key="infl_lds_t").set_value(16)
    at.button(key="run_infl_lds").click()
    at.run()
    assert_clean(at)
    lds = {m.label: float(m.value) for m in _metric(at, "LDS ·")}
    assert set(lds) == {"LDS · grad dot", "LDS · grad cosine", "LDS · TracIn", "LDS · influence function", "LDS · TRAK",
                        "LDS · last layer", "LDS · projected (LoGra)", "LDS · EK-FAC"}
    assert lds["LDS · last layer"] > 0.2                          # far better than chance on a small MLP
    # a linear model: the method is not offered, and the page says why
    linear = open_page("influence", **dict(FAST, dataset="moons", model="linear"))
    assert_clean(linear)
    assert "last_layer" not in linear.selectbox(key="infl_method").options
    assert any("Last-layer gradient dot product" in c.value and "one layer" in c.value for c in linear.caption)
