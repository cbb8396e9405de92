"""URL state: a shared link (query parameters) reproduces the experiment, the page's controls and
its numbers; bad parameters are ignored, not fatal."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT, assert_clean
from hostile import rendered_text

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
             "seed": "3", "topk": "5", "log": "false", "checkpoint": "25"}
    at = _open("norms", query)
    assert_clean(at)
    exp = Experiment(dataset="moons", label_noise=0.1, steps=50, checkpoint_every=25, seed=3)
    assert ui.experiment_from_state(at.session_state) == exp
    assert at.number_input(key="topk").value == 5
    assert at.toggle(key="log").value is False
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


@pytest.mark.slow
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


def test_controls_are_the_experiment_fields_and_nonsense_opens_the_defaults():
    import dataclasses

    from gradlab.experiment import CONTROLS

    recipe_only = {"test_fraction", "order", "ema", "label_smoothing"}  # set by code or a model's recipe, not a control
    assert CONTROLS == tuple(f.name for f in dataclasses.fields(Experiment) if f.name not in recipe_only)
    # unparsable values fall back to the defaults field by field; parsable ones are kept
    exp = Experiment.from_state({"lr": "fast", "seed": "abc", "steps": "50", "label_noise": "nan",
                                 "width": "128", "unknown": "1"})
    assert exp == Experiment(steps=50, width=128)
    # fields a model ignores are canonical, so equal views share one cache key
    assert Experiment.from_state({"model": "linear", "width": "512", "activation": "tanh"}) == Experiment(model="linear")
    assert Experiment.from_state({"model": "cnn", "depth": "3", "activation": "tanh"}) == Experiment(model="cnn", activation="tanh")


def test_an_upload_is_named_by_its_bytes_label_and_task():
    from gradlab.experiment import upload_name

    a = upload_name(b"x,y\n1,0\n", "y", "classification")
    assert a.startswith("upload:") and len(a) == len("upload:") + 16
    assert Experiment(dataset=a).source.needs_upload and not Experiment().source.needs_upload
    assert Experiment(dataset=a).in_memory_only and not Experiment().in_memory_only
    assert len({a, upload_name(b"x,y\n1,1\n", "y", "classification"), upload_name(b"x,y\n1,0\n", "x", "classification"),
                upload_name(b"x,y\n1,0\n", "y", "regression")}) == 4


def test_short_codes_work_and_a_bad_link_value_is_named_not_dropped_silently():
    """`dp_sgd_accountant=pld` and `dp_sgd_opt=sgd` are codes the controls take as written; `eq_example=scalar` too.
    A link with an unknown code and a word for a number says which values it could not use."""
    good = _open("dp_clipping", {"dataset": "breast_cancer", "model": "linear", "steps": "50", "checkpoint_every": "25",
                                 "dp_sgd_accountant": "pld", "dp_sgd_opt": "sgd"})
    assert_clean(good)
    assert at_value(good, "dp_sgd_accountant") == "pld" and at_value(good, "dp_sgd_opt") == "sgd"
    assert not [w for w in good.warning if "link" in w.value]
    from streamlit.testing.v1 import AppTest

    bad = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)  # the link opened directly on its page
    bad.query_params.update({"eq_example": "nonsense", "steps": "many"})
    bad.switch_page("views/equivalence.py")
    bad.run()
    assert_clean(bad)
    text = " ".join(rendered_text(w.value) for w in bad.warning)  # as read: the link's values are escaped Markdown
    assert "eq_example=nonsense" in text and "steps=many" in text, text


def at_value(at, key):
    return at.session_state[key]


def test_every_page_control_is_declared_once_in_the_registry():
    """Views draw their URL-bound controls through ui.control / ui.choice (which refuse an undeclared key), and
    none binds a widget to the URL by hand; every declared key is drawn by its page."""
    import ast

    from gradlab.ui import pages

    drawn = {}
    for page in pages.PAGES:
        source = (ROOT / page.path).read_text()
        assert 'bind="query-params"' not in source, page.path
        keys = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("control", "choice", "checkpoint_picker"):
                keys |= {kw.value.value for kw in node.keywords if kw.arg == "key" and isinstance(kw.value, ast.Constant)}
                if node.func.attr == "choice" and len(node.args) >= 4:
                    keys.add(node.args[3].value)
                if node.func.attr == "checkpoint_picker" and not node.keywords:
                    keys.add("checkpoint")
        drawn[page.path] = keys
        assert keys <= set(page.controls), (page.path, keys - set(page.controls))
    # infl_test: key=INDEX; the attribution methods' controls are declared in their registry and drawn by a loop
    from gradlab.influence.methods import controls as influence_controls

    registry = {c.key for c in influence_controls()}
    assert "for control in m_.controls" in (ROOT / "views/influence.py").read_text()
    assert set().union(*drawn.values()) | {"infl_test"} | registry == set(pages.control_keys())


def _bound_number_in_a_fragment():
    import streamlit as st

    from gradlab.ui.widgets import fragment

    @fragment
    def part():
        st.number_input("n", 0, 9, 0, key="n", bind="query-params")

    part()


def test_the_server_writes_a_changed_control_into_the_link_and_drops_it_at_its_default():
    """The browser wrote a bound control's change into the address bar, except when the control mounted again while
    its page computed (Influence's test point after its method changed, on a cold store: issue 41), and the link lost
    it. AppTest's client writes no change at all: only the server's `ui.write_bound_values` puts it in the link.
    Back at its default the parameter goes, and the link's other parameters stay."""
    at = _open("norms", {"steps": "50", "checkpoint_every": "25"})
    assert_clean(at)
    at.number_input(key="seed").set_value(3).run()
    assert at.query_params.get("seed") == "3" and at.query_params.get("steps") == "50", at.query_params
    at.number_input(key="seed").set_value(ui.DEFAULT.seed).run()
    assert "seed" not in at.query_params and at.query_params.get("steps") == "50", at.query_params


def test_a_fragment_writes_its_control_into_the_link_after_it():
    """`ui.fragment` writes its controls after the fragment's body. AppTest reruns the whole script, never the
    fragment alone, so this checks the call the wrapper makes (the one a fragment-only rerun relies on: app.py's
    call after the page does not run then), not a fragment-only rerun itself."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_bound_number_in_a_fragment, default_timeout=60)
    at.run()
    at.number_input(key="n").set_value(3).run()
    assert at.query_params.get("n") == "3", at.query_params
