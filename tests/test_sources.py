"""Data sources (`gradlab.sources`): the registry, the example source added the registry way (wine: one file, one
line), every page opened with it, and an uploaded CSV parsed once on a cold visit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_wine

from conftest import FAST, assert_clean, open_page
from gradlab import sources
from gradlab.experiment import Experiment, count_params, fit, init_model, load_data
from gradlab.params import num_params
from gradlab.sources.bundled import Bundled
from gradlab.sources.wine import Wine
from gradlab.ui import pages


def test_source_of_reads_the_prefix_and_the_string_stays_the_config():
    assert type(sources.source_of("digits")) is Bundled and type(sources.source_of("nonsense")) is Bundled
    assert sources.source_of("wine").name == "wine" and isinstance(sources.source_of("wine"), Wine)
    up, own = sources.source_of("upload:0123456789abcdef"), sources.source_of("own:0123456789abcdef")
    assert up.needs_upload and not up.persist and not up.brings_model and up.prefix == "upload"
    assert own.brings_model and not own.persist and own.prefix == "own"
    assert sources.source_of("digits").persist and not sources.source_of("digits").needs_upload
    exp = Experiment(dataset="wine", seed=3)
    assert Experiment.from_query(exp.to_query()) == exp and hash(exp) == hash(Experiment(dataset="wine", seed=3))
    assert "wine" in sources.choices() and sources.choices()[-1] == "upload"


def test_an_unknown_name_opens_and_says_why_on_load():
    exp = Experiment.from_query({"dataset": "nonsense"})  # a bad link parses
    with pytest.raises(ValueError, match="unknown dataset 'nonsense'"):
        load_data(exp)


def test_wine_is_scikit_learns_set_split_and_standardized():
    """Independent oracle: scikit-learn's own arrays; every row of the split is one of them, standardized."""
    d = load_data(Experiment(dataset="wine"))
    raw = load_wine()
    assert (len(d.y_train) + len(d.y_test), d.n_features, d.n_classes) == (178, 13, 3)
    assert d.class_names == tuple(raw.target_names) and d.feature_names == tuple(raw.feature_names)
    rows = np.concatenate([d.rows_train, d.rows_test])
    assert sorted(rows.tolist()) == list(range(178))
    np.testing.assert_allclose(d.raw(d.x_train), raw.data[d.rows_train], rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(d.y_train, raw.target[d.rows_train])
    np.testing.assert_allclose(d.x_train.mean(0), 0, atol=1e-5)
    label, ids = sources.source_of("wine").row_ids(d, "test")
    assert label == "index" and (ids == d.rows_test).all()


def test_one_parameter_counter_from_shapes_and_from_arrays():
    exp = Experiment(dataset="wine", width=16)
    d = load_data(exp)
    model = init_model(exp, d)
    assert count_params(exp, d) == num_params(model) == 13 * 16 + 16 + 16 * 3 + 3
    assert fit(exp.replace(steps=25, checkpoint_every=25), data=d).data is d


#: Pages over ~3 s with wine from an empty compile cache on 2 cores (measured: privacy audit and influence 10 s, norms
#: and performance 5–6 s, equivalence 4 s, lecture and home 3–4 s): the whole suite only (pytest.ini's `slow`).
SLOW_PAGES = {"privacy_audit", "influence", "norms", "performance", "equivalence", "lecture", "home"}


@pytest.mark.parametrize("page", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_PAGES else name
                                  for name in (p.path.removeprefix("views/").removesuffix(".py") for p in pages.PAGES)])
def test_every_page_opens_with_the_example_source(page):
    """The wine source, added as one file plus one registry line, through every page: no exception."""
    at = open_page(page, dataset="wine", model="linear", **FAST)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    if page != "lecture":  # a lecture step sets its own experiment
        assert at.session_state["dataset"] == "wine"


def _csv(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    table = pd.DataFrame(x, columns=["a", "b", "c"]).assign(label=(x[:, 0] + x[:, 1] > 0).astype(int))
    return table.to_csv(index=False).encode()


def test_a_cold_visit_with_an_uploaded_csv_parses_it_once(monkeypatch):
    """Sidebar (columns, validation), P, N, the forward's multiply-adds and the training: one `pandas.read_csv`."""
    calls = []
    real = pd.read_csv
    monkeypatch.setattr(pd, "read_csv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    raw = _csv(60, seed=12345)  # bytes no other test uploads: nothing of it is cached yet
    at = open_page("norms", dataset="upload", model="linear", **FAST)
    calls.clear()
    at.file_uploader(key="upload_file").set_value(("mine.csv", raw, "text/csv")).run()
    assert_clean(at)
    assert any(m.label == "Training examples N" and m.value == "48" for m in at.metric)
    assert len(calls) == 1, f"the CSV was parsed {len(calls)} times"
