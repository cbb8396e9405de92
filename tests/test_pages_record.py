"""AppTest: the Example record page (issue 43): its card from a link, the ensembles behind their button, the whole
picture; and every page's way of opening the card."""

from __future__ import annotations

import pytest
from conftest import FAST, assert_clean, open_page


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
    at.session_state["norms_topk_pick"] = {"selection": {"rows": [1], "columns": [], "cells": []}}
    at.run()
    assert_clean(at)
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
    at.session_state["infl_card_pick"] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    at.run()
    assert_clean(at)
    assert at.title[0].value == "Example record" and at.session_state["example"] == int(table["example"].iloc[0])

    at = open_page("privacy_audit", **FAST, mia_pool=64, mia_steps=40, mia_shadows=2, mia_q=0.5)
    at.button(key="run_mia").click().run()
    assert_clean(at)
    exposed = next(d.value for d in at.dataframe if "LiRA score, non-private" in d.value.columns)
    at.session_state["mia_card_pick"] = {"selection": {"rows": [2], "columns": [], "cells": []}}
    at.run()
    assert_clean(at)
    assert at.title[0].value == "Example record" and at.session_state["example"] == int(exposed["example"].iloc[2])
