"""AppTest: the Example record page (issue 43): its card from a link, the ensembles behind their button, the whole
picture; and every page's way of opening the card."""

from __future__ import annotations

import pytest
from conftest import FAST, assert_clean, open_page


def select_row(at, key: str, row: int) -> None:
    """Select `row` of the selectable table `key` as a click does (its selection event), run, and check the page."""
    at.session_state[key] = {"selection": {"rows": [row], "columns": [], "cells": []}}
    at.run()
    assert_clean(at)


def metric(at, label):
    return next(m.value for m in at.metric if m.label.startswith(label))


def test_record_page_card_and_whole_picture():
    at = open_page("record", **FAST)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert at.number_input(key="example").value is None  # no card until an example is picked
    # the cheap picture opens on its strongest relation across sources: TracIn (every checkpoint) and the final model
    assert {at.selectbox(key="rec_x").value, at.selectbox(key="rec_y").value} & {"tracin"}
    at.number_input(key="example").set_value(5).run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert metric(at, "Label")
    assert metric(at, "Clipped at C") in ("no",) or metric(at, "Clipped at C").startswith("yes")
    assert not any(m.label == "Memorization" for m in at.metric)  # the ensemble waits for its button
    at.button(key="run_record_ensembles").click().run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    memo = [m.value for m in at.metric if m.label == "Memorization"]
    assert len(memo) == 2  # as trained and DP-SGD, side by side
    assert {"memorization", "lira_member", "memorization_dp", "lira_member_dp"} <= set(at.selectbox(key="rec_x").options)
    assert len([m for m in at.metric if m.label == "LiRA score as a member"]) == 2
    # the whole training set, side by side: mean memorization and LiRA's TPR at 0.1% FPR, as trained and under DP-SGD
    for label in ("Mean memorization as trained", "Mean memorization under DP-SGD",
                  "LiRA TPR at 0.1% FPR as trained", "LiRA TPR at 0.1% FPR under DP-SGD"):
        assert metric(at, label)
    attacks_table = next(d.value for d in at.dataframe if "TPR at 0.1% FPR" in d.value.columns)
    assert len(attacks_table) == 6 and attacks_table["ROC AUC"].between(0, 1).all()  # 3 attacks x 2 ensembles
    # the picture moves to the strongest relation across sources, which the ensembles bring
    pair = {at.selectbox(key="rec_x").value, at.selectbox(key="rec_y").value}
    assert pair & {"memorization", "lira", "lira_member", "memorization_dp", "lira_member_dp"}, pair


def test_whole_picture_click_opens_the_card():
    at = open_page("record", **FAST)
    at.session_state["rec_pick"] = {"selection": {"points": [{"point_index": 3, "customdata": [11, 0, "x"]}]}}
    at.run()
    assert_clean(at)
    assert at.number_input(key="example").value == 11
    assert any(s.value.startswith("The card of example 11") for s in at.subheader)


def test_norms_page_opens_the_card_from_a_top_k_row_and_a_histogram_bar():
    at = open_page("norms", **FAST)
    table = at.dataframe[0].value
    at.session_state["norms_hist_pick"] = {"selection": {"points": [{"point_index": 0, "customdata": 0}]}}
    at.run()
    assert_clean(at)
    links = at.get("page_link")
    assert links and all(link.proto.page.endswith("record") or "record" in link.proto.page for link in links), \
        [link.proto for link in links][:1]
    select_row(at, "norms_topk_pick", 1)
    assert at.title[0].value == "Example record"
    assert at.session_state["example"] == int(table["example"].iloc[1])


def test_geometry_arrow_opens_its_card():
    at = open_page("geometry")
    at.session_state["geo_pick"] = {"selection": {"points": [{"point_index": 4, "customdata": 4}]}}
    at.run()
    assert_clean(at)
    link = next(link for link in at.get("page_link") if "record card" in link.proto.label)
    assert link.proto.query_string in ("example=4&rec_set=line", "rec_set=line&example=4"), link.proto
    at = open_page("record", rec_set="logistic", example=4)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert any(s.value.startswith("The card of example 4 (logistic)") for s in at.subheader)
    assert metric(at, "Removing it moves the optimum by")


@pytest.mark.slow  # the Influence page's first load (θ̂, TracIn, the solves) and the membership attack's models
def test_influence_and_privacy_audit_open_the_card():
    at = open_page("influence", dataset="moons", model="linear", **FAST)
    assert_clean(at)
    table = next(d.value for d in at.dataframe if "example" in d.value.columns)
    select_row(at, "infl_card_pick", 0)
    assert at.title[0].value == "Example record" and at.session_state["example"] == int(table["example"].iloc[0])

    # a pool no other page test uses: the attack is computed here (a stored result would show no button)
    at = open_page("privacy_audit", **FAST, mia_pool=56, mia_steps=40, mia_shadows=2, mia_q=0.5)
    at.button(key="run_mia").click().run()
    assert_clean(at)
    exposed = next(d.value for d in at.dataframe if "LiRA score, non-private" in d.value.columns)
    select_row(at, "mia_card_pick", 2)
    assert at.title[0].value == "Example record" and at.session_state["example"] == int(exposed["example"].iloc[2])


# an audit no other test computes (C = 0.5, 4096 trials): its card opens from a link, first behind the audit's button
CANARY_AUDIT = dict(audit_sigma="2.0", audit_steps="1", audit_q="1.0", audit_c="0.5", audit_trials="4096",
                    audit_canary="gradient", audit_bug="none (correct DP-SGD)")


def open_canary(trial: int | None = None, **audit_params):
    from streamlit.testing.v1 import AppTest

    from conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.run()
    at.query_params.update({"rec_set": "canary", **audit_params, **({} if trial is None else {"rec_trial": str(trial)})})
    at.switch_page("views/record.py")
    at.run()
    return at


def test_the_canary_card_from_a_link_shows_its_norm_clip_and_trial():
    from gradlab import audit

    at = open_canary(**CANARY_AUDIT)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    if "run_audit" in {b.key for b in at.button}:  # a link never starts the audit: its button, with its estimate
        assert any("about" in b.label for b in at.button if b.key == "run_audit")
        at.button(key="run_audit").click().run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert metric(at, "Gradient norm ‖g‖") == "5"  # 10·C at C = 0.5: a Dirac gradient
    assert metric(at, "Clipped at C = 0.5?") == "yes: ×0.10"
    assert not any(m.label == "The canary was" for m in at.metric)  # no trial picked yet
    # trial 3: the numbers of the same audit computed by the library (the page's audit has seed 0)
    ref = audit.audit_dp_sgd(noise_multiplier=2.0, steps=1, clip_norm=0.5, trials=4096)
    at.number_input(key="rec_trial").set_value(3).run()
    assert_clean(at)
    assert metric(at, "Trial 3's observation") == f"{ref.scores[3]:.3g}"
    assert metric(at, "The canary was") == ("in" if ref.is_in[3] else "out")
    assert metric(at, "The test guessed") == ("in" if ref.guesses[3] else "out")
    guess = ref.guesses
    assert metric(at, "The test: TPR at its FPR") == f"{guess[ref.is_in].mean():.1%} at {guess[~ref.is_in].mean():.1%}"
    assert len(at.get("plotly_chart")) == 1  # its trials, in and out, with trial 3 marked


def test_a_canary_link_with_a_bad_setting_is_a_message():
    at = open_canary(**dict(CANARY_AUDIT, audit_sigma="0.1", audit_canary="gradient"))
    assert_clean(at)
    assert any("noise multiplier σ" in e.value and "below 0.3" in e.value for e in at.error), [e.value for e in at.error]
    assert not any("does not use" in w.value for w in at.warning), [w.value for w in at.warning]


def test_the_privacy_audit_opens_the_canary_card_by_link_and_by_a_trial_row():
    at = open_page("privacy_audit", **FAST, audit_c=0.5, audit_trials=4096)
    if "run_audit" in {b.key for b in at.button}:
        at.button(key="run_audit").click().run()
    assert_clean(at)
    link = next(link for link in at.get("page_link") if "canary" in link.proto.label)
    assert link.proto.page.endswith("record") and "rec_set=canary" in link.proto.query_string
    assert "audit_c=0.5" in link.proto.query_string and "audit_trials=4096" in link.proto.query_string
    trials = next(d.value for d in at.dataframe if "test guessed" in d.value.columns)
    assert set(trials["canary"]) == {"in", "out"}
    select_row(at, "audit_card_pick", 1)
    trial = int(trials["trial"].iloc[1])
    assert at.title[0].value == "Example record" and at.session_state["rec_trial"] == trial
    assert "run_audit" not in {b.key for b in at.button}  # the page's stored audit: the card opens at once
    assert any(s.value == f"The card of the canary (gradient) at trial {trial}" for s in at.subheader)
    assert metric(at, "Gradient norm ‖g‖") == "5"
    # each row's trial stays in the card's link, trial 0 too (a number input's minimum: once dropped from the URL as
    # its default when the card's control lost its default of None, CI 2026-12-03)
    for row in (0, 1):
        at.switch_page("views/privacy_audit.py").run()
        select_row(at, "audit_card_pick", row)
        trial = int(trials["trial"].iloc[row])
        assert at.title[0].value == "Example record" and at.query_params.get("rec_trial") == str(trial), \
            (trial, dict(at.query_params))


def test_the_canary_link_round_trips_the_audit_settings_and_refuses_what_the_page_would():
    from gradlab.ui import audit as audit_ui
    from gradlab.ui import pages

    for settings in [audit_ui.from_url({}), (0.35, 3, 0.25, 2.5, 65536, "input", "noise not scaled by C")]:
        assert audit_ui.from_url(audit_ui.link(settings)) == settings
    assert audit_ui.from_url({}) == (2.0, 1, 1.0, 1.0, 16384, "gradient", None)  # the Privacy audit page's defaults
    # the card reads exactly the Privacy audit page's controls, declared there once
    assert set(pages.page("views/record.py").reads) == set(audit_ui.KEYS) <= set(pages.page("views/privacy_audit.py").controls)
    for bad, says in [({"audit_steps": "2.5"}, "whole number"), ({"audit_q": "2"}, "above 1"),
                      ({"audit_trials": "1000"}, "not one of"), ({"audit_canary": "loss"}, "not a canary"),
                      ({"audit_bug": "typo"}, "not a planted bug"), ({"audit_c": "nan"}, "not a number")]:
        with pytest.raises(ValueError, match=says):
            audit_ui.from_url(bad)


def test_a_card_switch_the_browser_swallowed_is_made_again_with_its_state():
    """Streamlit folds a browser's rerun that arrives with `st.switch_page`'s into one, and the browser's page wins:
    the page before runs again. The next run makes the switch again with the card's control set again (the page before
    may have dropped it); a switch lost as many times as it may be is given up (no loop)."""
    from gradlab.ui import card, state

    at = open_page("norms", **FAST)
    at.session_state[state._SWITCH] = (card.PAGE, {}, {"example": 5}, 1)  # `open_card(5)`'s, lost: its state carries it
    at.run()
    assert_clean(at)
    assert any(s.value.startswith("The card of example 5") for s in at.subheader), [s.value for s in at.subheader]
    assert state._SWITCH not in at.session_state

    at = open_page("norms", **FAST)
    at.session_state[state._SWITCH] = (card.PAGE, {"example": "5"}, {"example": 5}, 0)  # lost every time it may be
    at.run()
    assert_clean(at)
    assert at.title[0].value == "Gradient norms" and state._SWITCH not in at.session_state
