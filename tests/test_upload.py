"""Your own data: CSV validation (library), the sidebar uploader (AppTest), and per-session isolation.

Every bad CSV must produce a clear message (a `DataError` in the library, an `st.error` in the app),
never a traceback. Uploaded data must stay in its session: two sessions with different uploads see
their own numbers, and a third without an upload sees neither.
"""

from __future__ import annotations

import numpy as np
import pytest

from hostile import rendered_text

from gradlab.data import DataError, load_csv
from gradlab.experiment import Experiment, fit


def _table(n=40, d=3, *, seed=0, labels=None, header=None) -> bytes:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = labels if labels is not None else (x[:, 0] > 0).astype(int)
    header = header or [f"f{j}" for j in range(d)] + ["label"]
    rows = [",".join(header)] + [",".join(f"{v:.6g}" for v in row) + f",{t}" for row, t in zip(x, y)]
    return ("\n".join(rows) + "\n").encode()


GOOD = _table()

BAD = {
    "empty file": (b"", "empty"),
    "not utf-8": (b"\xff\xfe\x00\x01\x02binary", "UTF-8"),
    "single column": (b"label\n" + b"\n".join(b"1" for _ in range(20)), "single column"),
    "no such label column": (_table().replace(b"label", b"target"), "no column named 'label'"),
    "non-numeric feature": (
        b"colour,size,label\n" + b"\n".join(f"{'red' if i % 2 else 'blue'},{i},{i % 2}".encode() for i in range(30)),
        "non-numeric feature column(s): colour",
    ),
    "missing values": (_table().replace(b"\n", b"\n,", 1).replace(b"\n,", b"\n", 0), None),
    "too few rows": (_table(n=6), "at least 10"),
    "single class": (_table(labels=[1] * 40), "single class"),
    "too many rows": (_table(n=5001), "more than 5,000 rows"),
    "too many features": (_table(n=12, d=201), "201 feature columns"),
    "a class with one example": (_table(labels=[0] * 39 + [1]), "smallest class: 1"),
    "too many classes": (_table(labels=list(range(60)), n=60), "60 distinct values"),
}


def _missing_values_csv() -> bytes:
    lines = GOOD.decode().splitlines()
    first = lines[3].split(",")
    first[1] = ""
    lines[3] = ",".join(first)
    return ("\n".join(lines) + "\n").encode()


BAD["missing values"] = (_missing_values_csv(), "missing values in f1 (1 missing)")


@pytest.mark.parametrize("case", list(BAD))
def test_bad_csv_gives_a_clear_message(case):
    raw, expected = BAD[case]
    with pytest.raises(DataError) as err:
        load_csv(raw, "label", "classification")
    assert expected in str(err.value), str(err.value)


def test_regression_label_must_be_numeric_and_vary():
    named = b"a,label\n" + b"\n".join(f"{i},{'x' if i % 2 else 'y'}".encode() for i in range(20))
    with pytest.raises(DataError, match="not numeric"):
        load_csv(named, "label", "regression")
    const = b"a,label\n" + b"\n".join(f"{i},3".encode() for i in range(20))
    with pytest.raises(DataError, match="constant"):
        load_csv(const, "label", "regression")


def test_infinite_values_are_refused():
    raw = GOOD.replace(GOOD.splitlines()[5], b"inf," + b",".join(GOOD.splitlines()[5].split(b",")[1:]))
    with pytest.raises(DataError, match="infinite values in f0"):
        load_csv(raw, "label", "classification")


def test_good_csv_is_split_standardized_and_labels_follow_their_rows():
    """Labels are names; "dog" iff x1 >= 30. Standardization is increasing, so after the split every
    dog's x1 (train and test) still exceeds every cat's: the labels stayed with their rows."""
    raw = b"x1,x2,kind\n" + b"\n".join(f"{i},{(i * 7) % 11},{'dog' if i >= 30 else 'cat'}".encode() for i in range(60))
    d = load_csv(raw, "kind", "classification", seed=3)
    assert d.task == "classification" and d.class_names == ("cat", "dog")
    assert d.x_train.shape == (48, 2) and d.x_test.shape == (12, 2) and d.feature_names == ("x1", "x2")
    np.testing.assert_allclose(d.x_train.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(d.x_train.std(0), 1, atol=1e-5)
    x1 = np.concatenate([d.x_train[:, 0], d.x_test[:, 0]])
    y = np.concatenate([d.y_train, d.y_test])
    assert np.bincount(y).tolist() == [30, 30]
    assert x1[y == 1].min() > x1[y == 0].max()


def test_regression_csv_and_training():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(80, 2))
    y = 3 * x[:, 0] - x[:, 1] + 0.1 * rng.normal(size=80)
    raw = ("a,b,y\n" + "\n".join(f"{p:.6f},{q:.6f},{t:.6f}" for (p, q), t in zip(x, y))).encode()
    d = load_csv(raw, "y", "regression")
    assert d.task == "regression" and d.y_train.dtype == np.float32
    np.testing.assert_allclose(d.y_train.mean(), 0, atol=1e-5)
    f = fit(Experiment(dataset="upload", model="linear", steps=100, lr=0.1, checkpoint_every=50), data=d)
    assert f.run.losses[-1] < 0.1 * f.run.losses[0]


# ---------------------------------------------------------------- the uploader in the app (AppTest)


def _uploader_app():
    import streamlit as st

    from gradlab import ui
    from gradlab.experiment import Experiment

    ui.upload_controls()
    if ui.uploaded() is not None:
        f = ui.fitted(Experiment(dataset=ui.uploaded()["name"], model="linear", steps=25, checkpoint_every=25))
        st.metric("rows used for training", f.data.x_train.shape[0])


@pytest.mark.parametrize("case", ["empty file", "not utf-8", "non-numeric feature", "missing values",
                                  "too few rows", "single class", "too many rows", "a class with one example"])
def test_uploader_shows_a_message_not_a_traceback(case):
    from streamlit.testing.v1 import AppTest

    raw, expected = BAD[case]
    at = AppTest.from_function(_uploader_app, default_timeout=120)
    at.run()
    at.file_uploader(key="upload_file").set_value(("bad.csv", raw, "text/csv")).run()
    assert not at.exception, [e.value for e in at.exception]
    messages = " ".join(rendered_text(e.value) for e in at.error)  # what the visitor reads (names escaped)
    assert "This CSV cannot be used" in messages and expected in messages, messages
    assert "_upload" not in at.session_state
    assert not at.metric
    # the app keeps working: a good file afterwards is accepted
    at.file_uploader(key="upload_file").set_value(("good.csv", GOOD, "text/csv")).run()
    assert not at.exception and not at.error
    assert at.metric[0].value == "32"


def test_uploader_label_and_task_controls():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_uploader_app, default_timeout=120)
    at.run()
    at.file_uploader(key="upload_file").set_value(("good.csv", GOOD, "text/csv")).run()
    assert at.selectbox(key="upload_label").value == "label"
    at.selectbox(key="upload_label").set_value("f0").run()   # a continuous column as class label
    assert "is it a regression target" in " ".join(rendered_text(e.value) for e in at.error)
    at.radio(key="upload_task").set_value("regression").run()  # as a regression target it works
    assert not at.error and not at.exception and at.metric


# ---------------------------------------------------------------- isolation between sessions


def _norms_page_with_upload(raw: bytes | None):
    """A session on the Gradient norms page with dataset=upload and (optionally) its own upload."""
    from conftest import open_page

    at = open_page("norms", dataset="upload", model="linear", steps=50, checkpoint_every=25, timeout=300)
    if raw is not None:
        at.file_uploader(key="upload_file").set_value(("mine.csv", raw, "text/csv")).run()
    return at


def _metric(at, label):
    return next(m.value for m in at.metric if m.label == label)


@pytest.mark.slow
def test_uploads_never_leak_between_sessions():
    """Same Experiment(dataset="upload") in two sessions with different data: each sees its own numbers."""
    from gradlab.summary import norm_summary

    raw_a = _table(n=50, seed=1)
    raw_b = _table(n=90, seed=2, labels=None)
    a = _norms_page_with_upload(raw_a)
    b = _norms_page_with_upload(raw_b)
    c = _norms_page_with_upload(None)
    for at in (a, b, c):
        assert not at.exception, [e.value for e in at.exception]
    assert _metric(a, "Training examples N") == "40"
    assert _metric(b, "Training examples N") == "72"
    # the third session has no upload: it is asked for one and shows no numbers
    assert not c.metric and any("upload a CSV" in i.value for i in c.info)

    # each session's median norm is what the library computes on that session's own data
    exp = Experiment(dataset="upload", model="linear", steps=50, checkpoint_every=25)
    for at, raw in ((a, raw_a), (b, raw_b)):
        f = fit(exp, data=load_csv(raw, "label", "classification"))
        s = norm_summary(f)
        assert _metric(at, "Median norm") == f"{np.median(s.norms):.3g}"
    assert _metric(a, "Median norm") != _metric(b, "Median norm")

    # each session's experiment names its own bytes: the key of every cache downstream
    from gradlab.experiment import upload_name

    for at, raw in ((a, raw_a), (b, raw_b)):
        assert at.session_state["_upload"]["name"] == upload_name(raw, "label", "classification")
    assert upload_name(raw_a, "label", "classification") != upload_name(raw_b, "label", "classification")
    # a fourth session uploading A's bytes is served A's numbers (from the shared cache)
    d = _norms_page_with_upload(raw_a)
    assert _metric(d, "Median norm") == _metric(a, "Median norm")


def test_header_only_and_duplicate_columns_get_clear_messages():
    import pytest

    from gradlab.data import DataError, read_csv

    with pytest.raises(DataError, match="header row but no data rows"):
        read_csv(b"a,b,label\n")
    with pytest.raises(DataError, match=r"'a' appears more than once \(columns 1, 3\)"):
        read_csv(b"a,b,a,label\n1,2,3,0\n4,5,6,1\n")
    assert read_csv(b"a,b.1,label\n1,2,0\n").shape == (1, 3)  # a dotted name alone is no duplicate


def test_per_example_tables_name_each_examples_csv_line_and_feature_values():
    """Row i of the CSV (line i + 2: the header is line 1) holds x1 = i: after the shuffled split, the exported
    columns give back each training example's own line and its original, unstandardized values."""
    from gradlab.data import load_dataset
    from gradlab.export import example_columns

    raw = b"x1,x2,kind\n" + b"\n".join(f"{i},{(i * 7) % 11},{'dog' if i >= 30 else 'cat'}".encode() for i in range(60))
    d = load_csv(raw, "kind", "classification", seed=3)
    cols = example_columns(d, np.arange(len(d.y_train)))
    assert d.row_label == "CSV line" and list(cols)[:4] == ["example", "CSV line", "x1", "x2"]
    np.testing.assert_allclose(cols["x1"], cols["CSV line"] - 2, atol=1e-4)  # the original value of that line
    np.testing.assert_allclose(cols["x2"], (cols["x1"].round() * 7) % 11, atol=1e-4)
    assert sorted(np.concatenate([d.rows_train, d.rows_test])) == list(range(2, 62))
    digits = load_dataset("digits")
    from sklearn.datasets import load_digits

    bundled = load_digits()
    cols = example_columns(digits, np.arange(5))
    assert "index" in cols and "0" not in cols  # pixels are not spelled out
    np.testing.assert_array_equal(bundled.target[cols["index"]], digits.y_train[:5])


def test_a_column_name_cannot_become_an_image_link_or_html_in_a_message():
    """A CSV whose non-numeric column is named like a Markdown image and an HTML link: the message names it as
    text (escaped), so the visitor's browser loads nothing and follows nothing (tests/test_user_text.py: all 22)."""
    from hostile import rendered_html
    from streamlit.testing.v1 import AppTest

    evil = "![x](http://example.com/a.png) <a href='http://example.com'>c</a>"
    raw = f'"{evil}",f1,label\n' + "\n".join(f"abc,{i},{i % 2}" for i in range(20)) + "\n"
    at = AppTest.from_function(_uploader_app, default_timeout=120)
    at.run()
    at.file_uploader(key="upload_file").set_value(("evil.csv", raw.encode(), "text/csv")).run()
    assert not at.exception
    messages = [e.value for e in at.error]
    assert "This CSV cannot be used" in messages[0]
    assert evil in rendered_text(messages[0]), messages  # the name as typed, as text
    assert "<img" not in rendered_html(messages[0]) and "<a " not in rendered_html(messages[0])


def test_messages_name_the_csv_line_of_a_bad_value():
    """The header is line 1: a word in row 5 of the data is line 6; missing values name their lines."""
    rows = [f"{i},{i * 2},{i % 2}" for i in range(20)]
    rows[4] = "4,abc,0"
    with pytest.raises(DataError, match=r"'abc' at line 6"):
        load_csv(("a,b,label\n" + "\n".join(rows) + "\n").encode(), "label", "classification")
    rows = [f"{i},{i * 2},{i % 2}" for i in range(20)]
    rows[2], rows[7] = "2,,0", ",14,1"
    with pytest.raises(DataError, match=r"at line\(s\) 4, 9"):
        load_csv(("a,b,label\n" + "\n".join(rows) + "\n").encode(), "label", "classification")


def test_an_unusable_upload_is_explained_in_the_main_area():
    """With the experiment on the upload and a bad file, the page itself says why (not only the sidebar)."""
    from conftest import ROOT
    from streamlit.testing.v1 import AppTest

    rows = [f"{i},{i * 2},{i % 2}" for i in range(20)]
    rows[4] = "4,abc,0"
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.query_params["dataset"] = "upload"
    at.switch_page("views/norms.py")
    at.run()
    at.sidebar.file_uploader(key="upload_file").set_value(("bad.csv", ("a,b,label\n" + "\n".join(rows)).encode(), "text/csv")).run()
    assert not at.exception
    main = [e.value for e in at.main.error]
    assert any("line 6" in rendered_text(m) and "This CSV cannot be used" in m for m in main), main
