"""URL state: a shared link (query parameters) reproduces the experiment, the page's controls and
its numbers; bad parameters are ignored, not fatal."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT, assert_clean

from gradlab import ui
from gradlab.experiment import Experiment, fit


def _open(page: str, query: dict[str, str]):
    """A fresh session opened on `views/<page>.py` with `query` as the URL's query string."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    at.switch_page(f"views/{page}.py")
    at.run()
    return at


def test_experiment_query_round_trip():
    exp = Experiment(dataset="moons", lr=0.3, steps=50, label_noise=0.15, seed=4, l2=0.0)
    q = exp.to_query()
    assert set(q) == {"dataset", "lr", "steps", "label_noise", "seed", "l2"}
    assert Experiment.from_query(q) == exp
    with pytest.raises(ValueError, match="lr"):
        Experiment.from_query({"lr": "fast"})


def test_shared_link_reproduces_the_norms_view_and_numbers():
    """?dataset=moons&label_noise=0.1&… on the norms page: same experiment, controls and numbers."""
    from gradlab.metrics import detection_roc
    from gradlab.summary import norm_summary

    query = {"dataset": "moons", "label_noise": "0.1", "steps": "50", "checkpoint_every": "25",
             "seed": "3", "topk": "5", "log": "true", "checkpoint": "25"}
    at = _open("norms", query)
    assert_clean(at)
    exp = Experiment(dataset="moons", label_noise=0.1, steps=50, checkpoint_every=25, seed=3)
    assert ui.experiment_from_state(at.session_state) == exp
    assert at.number_input(key="topk").value == 5
    assert at.toggle(key="log").value is True
    assert at.select_slider(key="checkpoint").value == 25
    metric = {m.label: m.value for m in at.metric}
    f = fit(exp)
    s = norm_summary(f, checkpoint=1)  # checkpoints at steps 0, 25, 50: index 1 is step 25
    assert f.run.steps[1] == 25
    assert metric["Training examples N"] == f"{len(s.norms):,}"
    assert metric["Median norm"] == f"{np.median(s.norms):.3g}"
    assert metric["Mislabel detection AUC"] == f"{detection_roc(s.norms, f.data.flipped).auc:.3f}"
    # the top-k table has k rows
    assert len(at.dataframe[0].value) == 5


def test_a_second_session_with_the_same_link_sees_the_same_numbers():
    query = {"dataset": "blobs", "steps": "50", "checkpoint_every": "25", "seed": "1"}
    a = _open("norms", query)
    b = _open("norms", query)
    ma = {m.label: m.value for m in a.metric}
    mb = {m.label: m.value for m in b.metric}
    assert ma and ma == mb


@pytest.mark.parametrize("query", [
    {"dataset": "imagenet"}, {"lr": "fast"}, {"steps": "-3"}, {"label_noise": "2"}, {"seed": "x"},
    {"model": "transformer", "width": "999"},
])
def test_bad_link_parameters_are_ignored_not_fatal(query):
    at = _open("home", query)
    assert_clean(at)
    assert ui.experiment_from_state(at.session_state) == Experiment()
