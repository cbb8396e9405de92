"""AppTest: Fashion-MNIST and seed 003's SimpleCNN from the sidebar: images shown, rows named by their
Fashion-MNIST index, and a SimpleCNN training over the work budget refused with the steps that fit."""

from __future__ import annotations

import time

import pytest
from conftest import assert_clean, open_page

from gradlab.experiment import Experiment, load_data


def metric(at, label):
    return next(m.value for m in at.metric if m.label.startswith(label))


def test_norms_page_on_fashion_names_rows_by_their_fashion_mnist_index():
    at = open_page("norms", dataset="fashion", model="linear", steps=25, checkpoint_every=25)
    assert_clean(at)
    assert not at.error
    assert metric(at, "Training examples") == "6,000"
    table = at.dataframe[0].value
    rows = set(load_data(Experiment(dataset="fashion")).rows_train.tolist())
    assert "Fashion-MNIST index" in table.columns and set(table["Fashion-MNIST index"]) <= rows
    assert set(table["label"]) <= {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                                   "Sneaker", "Bag", "Ankle boot"}
    heatmaps = [c for c in at.get("plotly_chart") if '"heatmap"' in c.proto.spec]  # the top-k images
    assert heatmaps


def test_simple_cnn_at_the_default_steps_is_refused_with_the_steps_that_fit():
    at = open_page("norms", dataset="fashion", model="simple_cnn")  # 300 steps × 128: ~110 CPU-s
    assert_clean(at)
    assert "CPU-seconds" in at.error[0].value and "Training steps** to 50 or fewer" in at.error[0].value


@pytest.mark.slow
def test_norms_page_on_simple_cnn_cold():
    start = time.perf_counter()
    at = open_page("norms", dataset="fashion", model="simple_cnn", steps=25, batch_size=32, checkpoint_every=25,
                   lr=0.003)
    assert_clean(at)
    assert not at.error
    assert metric(at, "Training examples") == "6,000"
    assert "P = 1,199,882 parameters" in next(m.help for m in at.metric if m.label.startswith("Training examples"))
    print(f"norms page, SimpleCNN on Fashion-MNIST, 25 steps of 32, cold: {time.perf_counter() - start:.1f} s")
