"""AppTest: the home page and the Gradient norms page, controls exercised, bad settings shown as errors."""

from __future__ import annotations

import math

from conftest import FAST, assert_clean, open_page

from gradlab.experiment import Experiment, load_data


def metric(at, label):
    return next(m.value for m in at.metric if m.label.startswith(label))


def test_home_links_every_page():
    at = open_page("home")
    assert_clean(at)
    assert "vmap" in at.code[0].value and "in_axes=(None, 0, 0)" in at.code[0].value


def test_norms_page_default_and_controls():
    at = open_page("norms", **FAST)
    assert_clean(at)
    assert metric(at, "Training examples") == "1,437"
    assert at.toggle(key="log").value is True  # a log axis by default: the heavy tail shows
    at.toggle(key="log").set_value(False).run()
    at.number_input(key="topk").set_value(5).run()
    at.select_slider(key="checkpoint").set_value(25).run()
    assert_clean(at)
    assert len(at.dataframe[0].value) == 5
    # label noise on: the mislabel detector appears with a real AUC
    at.session_state["label_noise"] = 0.1
    at.run()
    assert_clean(at)
    assert 0.5 < float(metric(at, "Mislabel detection AUC")) <= 1.0


def test_norms_page_on_2d_and_regression_data():
    for dataset, model in (("moons", "mlp"), ("line_outliers", "linear"), ("breast_cancer", "linear")):
        at = open_page("norms", dataset=dataset, model=model, **FAST)
        assert_clean(at)
        assert not at.error
        data = load_data(Experiment(dataset=dataset))
        assert metric(at, "Training examples") == f"{len(data.y_train):,}", dataset
        median = float(metric(at, "Median norm"))
        assert math.isfinite(median) and median > 0, (dataset, median)
        labels = [m.label for m in at.metric]
        if data.task == "classification":
            assert 0 < float(metric(at, "Training accuracy").rstrip("%")) <= 100, dataset
        else:
            assert not any(label.startswith("Training accuracy") for label in labels), labels
        if data.n_features <= 2:  # moons (2-D) and line_outliers (1-D): the training set coloured by norm
            assert len(at.get("plotly_chart")) >= 3, dataset


def test_impossible_settings_give_messages_not_tracebacks():
    at = open_page("norms", label_noise=1.0, **FAST)
    assert_clean(at)
    assert "100%" in at.error[0].value
    at = open_page("norms", dataset="diabetes", model="mlp", optimizer="sgd", lr=100.0, **FAST)
    assert_clean(at)
    assert "learning rate" in at.error[0].value
    at = open_page("norms", dataset="moons", model="cnn", **FAST)
    assert_clean(at)
    assert "image" in at.error[0].value
