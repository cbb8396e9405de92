"""No user string as HTML or Markdown (issue 38, item 7): an upload's, a served model's or a link's text is shown
as the characters it holds, in Markdown, in figures and in exports.

The oracles (`tests/hostile.py`) render what the page sends: Markdown as CommonMark + GFM with raw HTML on (so an
unescaped `<img>` would be an element), plus the syntax Streamlit adds (LaTeX, `:color[…]`, shortcodes, bare-URL
autolinks) matched as its frontend matches it; Plotly text as plotly.js renders its HTML subset; CSV cells as a
spreadsheet reads them. Each of the 22 hostile strings carries a marker, and a page passes when every marker it
shows is shown as its whole text and nothing around it became an element.

Quick: the escaping functions, every figure builder that takes names, the exports, the sidebar uploader and
`ui.guard`. Tables are read as the CSV their toolbar downloads.
Slow: every page with an upload of all 22 strings, the 22 CSVs one by one on Gradient norms and DP clipping, a
served model with hostile names, and hostile link parameters.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, assert_clean, open_page
from hostile import (CORPUS, LINK_KEYS, batch_csv, csv_problems, hostile_csvs, hostile_link, markdown_problems,
                     page_problems, plotly_problems, rendered_text)

from gradlab import escape, export, plots
from gradlab.data import load_csv

RAW = [raw for raw, _ in CORPUS]
FACETS = [RAW[i] for i in (3, 7, 11, 13, 21)]
SHOWN = [shown for _, shown in CORPUS]
ALL = {f"{i:02d}" for i in range(1, 23)}


# ---------------------------------------------------------------- Markdown


def test_the_oracle_sees_live_markup_in_the_raw_strings():
    """Not vacuous: written raw into a caption, at the start or inside bold, most of the corpus is live Markdown (the
    rest, such as `+cmd|…` mid-sentence, is harmless there and is covered by the other media)."""
    live = [i for i, raw in enumerate(RAW) if markdown_problems(f"{raw}: 3 rows, label **{raw}**")]
    assert len(live) >= 18, [RAW[i] for i in set(range(22)) - set(live)]


@pytest.mark.parametrize("template", ["{}", "{}: 132 rows, 2 features", "Class **{}** loses most", "label *{}* (x)",
                                      "- {}", "> {}", "| {} |\n|---|", "`x` {} `y`", "{} $x$"])
def test_markdown_escape_shows_every_hostile_string_as_its_text(template):
    """Anywhere in a message (a line's start, bold, a list item, a quote, a table cell, between code spans) the
    escaped string renders as exactly its text: no element, no LaTeX, directive, shortcode or autolink."""
    for raw, shown in CORPUS:
        source = template.format(escape.markdown(raw))
        assert markdown_problems(source) == [], source
        assert " ".join(shown.split()) in rendered_text(source), source


def test_markdown_escape_keeps_ordinary_names_readable():
    for name in ["petal length (cm)", "x₁", "5,000 rows.", "T-shirt/top", "mean radius", "Ankle boot", "1", "-1",
                 "age_years", "ratio %", "naïve — «ok»", "😀 smile"]:
        assert rendered_text(f"label **{escape.markdown(name)}** here") == f"label {name} here"


def test_visible_shows_control_and_bidi_characters_and_keeps_everything_else():
    assert escape.visible("a\nb\tc\r") == "a␊b␉c␍"
    assert escape.visible("x\u202egnp.exe") == "x‹U+202E›gnp.exe"
    assert escape.visible("\x00\x7f\x85") == "␀␡‹U+0085›"
    for kept in ["שלום עולם", "مرحبا", "👩‍👩‍👧", "naïve", "x₁"]:  # scripts, emoji joined by ZWJ, combining marks
        assert escape.visible(kept) == kept
    assert escape.visible(3) == "3"


# ---------------------------------------------------------------- Plotly


def test_the_plotly_oracle_sees_live_markup_in_raw_strings():
    fig = {"data": [{"x": RAW, "name": RAW[3], "hovertemplate": RAW[21] + " %{x}"}], "layout": {"title": {"text": RAW[0]}}}
    found = " ".join(plotly_problems(fig))
    for marker in ("EVIL01", "EVIL04", "EVIL12", "EVIL14", "EVIL17", "EVIL22"):
        assert marker in found, marker


def test_plotly_escape_is_the_text_plotly_shows():
    assert escape.plotly("<b>x</b> & <br>") == "&lt;b&gt;x&lt;/b&gt; &amp; &lt;br&gt;"
    assert escape.plotly("%{x} a") == "%{x} a" and escape.plotly("%{x} a", template=True) == "&#37;{x} a"
    assert escape.plotly_all(np.array([1.0, 2.0])) is not None and escape.plotly_all(["a", 1]) == ["a", 1]
    assert escape.plotly_all(np.array(["<a>", "b"])) == ["&lt;a&gt;", "b"]


def _ids(n):
    return {"example": np.arange(n), "CSV line": np.arange(n) + 2, RAW[0]: np.linspace(0, 1, n),
            RAW[1]: np.linspace(1, 2, n), "label": [RAW[i % 22] for i in range(n)]}


def _markers(fig) -> set[str]:
    from hostile import MARKER, _strings, plotly_text

    return {m for _, s in _strings(fig.to_plotly_json()) for m in MARKER.findall(plotly_text(s)[0])}


def test_every_figure_that_takes_names_shows_them_as_text():
    """Each builder that gets an upload's or a served model's names (classes, features, leaves, curve names, image
    titles, hover columns), called with all 22: no live tag or placeholder, every name shown as its text."""
    rng = np.random.default_rng(0)
    n, k = 44, 22
    x2 = rng.normal(size=(n, 2))
    score = rng.normal(size=n)
    figs = {
        "per_class_clipping": plots.per_class_clipping(RAW, np.full(k, 0.5), np.full(k, 0.9), np.full(k, 0.8), 1.0),
        "per_class_accuracy": plots.per_class_accuracy(RAW, np.full(k, 0.5), np.full(k, 0.7)),
        # five facets (22 take a second to build): a link, a formula, a newline, an RTL override, a placeholder
        "norm_histogram_by_class": plots.norm_histogram_by_class(np.abs(score) + 0.1, np.arange(n) % 5, FACETS, log=True),
        "scatter_2d": plots.scatter_2d(x2, score, color_label="‖g‖", highlight=np.arange(3), ids=_ids(n),
                                       axis_names=(RAW[0], RAW[1]), title=RAW[4]),
        "scatter_1d": plots.scatter_1d(x2[:, 0], x2[:, 1], score, color_label="‖g‖", ids=_ids(n),
                                       axis_names=(RAW[11], "target (standardized)")),
        "point_picker": plots.point_picker(x2, score > 0, 0, axis_names=(RAW[12], RAW[13]), ids=_ids(n)),
        "influence_scatter_2d": plots.influence_scatter_2d(x2, score, [0, 1], [2, 3], x2[0], score_label="score",
                                                           ids=_ids(n), axis_names=(RAW[14], RAW[15])),
        "loo_scatter": plots.loo_scatter(score[:6], score[:6], np.arange(6), pearson=0.9, spearman=0.8,
                                         ids={key: np.asarray(v, object)[:6] for key, v in _ids(n).items()}),
        "image_grid": plots.image_grid(np.zeros((k, 4)), [(f"#{i} y={RAW[i]}", "0.5") for i in range(k)], image_shape=(2, 2)),
        "layer_share": plots.layer_share({raw: np.abs(score[:5]) for raw in RAW}),
        "equivalence_bars": plots.equivalence_bars(RAW, np.full(k, 1e-7), np.full(k, 1e-16)),
        "roc_figure": plots.roc_figure({raw: (np.array([0, 1]), np.array([0, 1]), 0.5) for raw in RAW[:6]}, RAW[16]),
        "dp_accuracy_curves": plots.dp_accuracy_curves({raw: (np.arange(3), np.full(3, 0.5)) for raw in RAW[:4]}),
    }
    every = set()
    for name, fig in figs.items():
        assert plotly_problems(fig, where=name) == []
        every |= _markers(fig)
    assert every == ALL  # every string reached some figure's text
    assert _markers(figs["per_class_clipping"]) == ALL and _markers(figs["norm_histogram_by_class"]) == {
        "04", "08", "12", "14", "22"}
    # a facet keeps the whole name, "=" included (px writes "facet_col=<name>"; the page once cut at the first "=")
    titles = [a.text for a in figs["norm_histogram_by_class"].layout.annotations]
    assert "class " + escape.plotly(RAW[7], template=True) in titles


def test_figures_keep_their_own_markup():
    """The builders' own line breaks stay line breaks: only the text they are given is escaped."""
    fig = plots.per_class_clipping(["a", "b"], np.array([0.1, 0.2]), np.array([0.9, 0.8]), np.array([0.7, 0.6]), 1.0)
    assert "fraction of the class<br>clipped" in [a.text for a in fig.layout.annotations]
    fig = plots.scatter_2d(np.zeros((2, 2)), np.zeros(2), color_label="c", ids=_ids(2))
    assert fig.data[0].hovertemplate.count("<br>") >= 4 and "<extra></extra>" in fig.data[0].hovertemplate


# ---------------------------------------------------------------- exports


def test_csv_cell_defuses_formulas_and_keeps_numbers_and_text():
    assert escape.csv_cell('=HYPERLINK("http://x")') == '\'=HYPERLINK("http://x")'
    assert [escape.csv_cell(v) for v in ["+cmd", "@SUM(A1)", "-2+3", "\tx", "\r=1", "  =1", "- item"]] == \
        ["'+cmd", "'@SUM(A1)", "'-2+3", "'\tx", "'\r=1", "'  =1", "'- item"]
    assert [escape.csv_cell(v) for v in ["-1", "+2.5e3", "-0.5", "cat", "a=b", "", -3.0, 7]] == \
        ["-1", "+2.5e3", "-0.5", "cat", "a=b", "", -3.0, 7]


def test_an_uploads_table_exports_without_a_formula_and_with_every_name():
    """The per-example table a page exports from a hostile upload (its columns, labels and predictions): a
    spreadsheet runs no cell; read back, every name is there, the formula-like ones behind one `'`."""
    data = load_csv(batch_csv(), RAW[3], "classification")
    idx = np.arange(len(data.y_train))
    table = pd.DataFrame({**export.example_columns(data, idx), "label": [data.class_names[c] for c in data.y_train],
                          "gradient norm": np.linspace(-1, 1, len(idx))})
    raw = export.to_csv(table)
    assert csv_problems(raw) == []
    back = pd.read_csv(io.BytesIO(raw))
    expected = {escape.csv_cell(name) for name in data.class_names}
    assert set(back["label"]) == expected and len(expected) == 22
    assert escape.csv_cell(RAW[0]) in back.columns and escape.csv_cell(RAW[1]) in back.columns
    assert back["gradient norm"].min() == -1.0  # numbers, negative ones included, stay numbers
    npz = np.load(io.BytesIO(export.to_npz(pd.DataFrame({"file": [1, 2], RAW[7]: ["a", "b"]}))))
    assert set(npz.files) == {"file", RAW[7]}  # any column name is a key (a column called "file" was an argument)


# ---------------------------------------------------------------- the sidebar uploader (no training)


def _uploader_only():
    from gradlab import ui

    ui.upload_controls()


def _upload(at, name: str, raw: bytes):
    at.file_uploader(key="upload_file").set_value((name, raw, "text/csv")).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_uploaders_caption_names_the_file_and_label_column_as_text():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_uploader_only, default_timeout=120)
    at.run()
    _upload(at, RAW[4] + ".csv", batch_csv())  # the file is named "**EVIL05 bold** __strong__.csv"
    problems, seen = page_problems(at)
    assert problems == []
    assert {"04", "05"} <= seen  # the label column and the file name, shown as text in the caption
    assert at.selectbox(key="upload_label").options[-1] == RAW[3]  # a selectbox lists plain text: names as they are


def test_a_refused_uploads_message_names_columns_as_text():
    """A non-numeric feature column named after hostile strings: the refusal names it, as text (sidebar)."""
    from streamlit.testing.v1 import AppTest

    raw = pd.DataFrame({RAW[0]: ["abc"] * 20, RAW[1]: ["x"] * 20, "f": np.arange(20), "label": np.arange(20) % 2})
    at = AppTest.from_function(_uploader_only, default_timeout=120)
    at.run()
    _upload(at, RAW[2] + ".csv", raw.to_csv(index=False).encode())
    messages = [e.value for e in at.error]
    assert messages and "This CSV cannot be used" in messages[0]
    problems, seen = page_problems(at)
    assert problems == [] and {"01", "02", "03"} <= seen


def _guarded():
    from hostile import CORPUS

    from gradlab import escape, ui

    with ui.guard("Refused"):
        raise escape.Refusal("Set **Training steps** to 500 or fewer.")
    with ui.guard("A data error"):
        raise ValueError(" ".join(raw for raw, _ in CORPUS))
    with ui.guard("Something else"):
        raise KeyError(CORPUS[0][0])


def test_guard_shows_gradlabs_refusals_as_markdown_and_every_other_message_as_text():
    """`ui.guard`: a refusal (`escape.Refusal`, gradlab's own words) keeps its bold; any other exception's message may
    quote a user's text (a CSV's column names, a served model's exception) and is text."""
    from hostile import rendered_html
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_guarded, default_timeout=60)
    at.run()
    refused, data, other = (e.value for e in at.error)
    assert "<strong>Training steps</strong>" in rendered_html(refused)
    problems, seen = page_problems(at)
    assert problems == [] and seen == ALL


# ---------------------------------------------------------------- pages (slow)

UPLOAD = dict(dataset="upload", model="linear", steps=50, checkpoint_every=25)


def _page_with_upload(page: str, name: str, raw: bytes, **controls):
    at = open_page(page, **UPLOAD, **controls)
    _upload(at, name, raw)
    assert_clean(at)
    return at


@pytest.mark.slow
@pytest.mark.parametrize("page", ["norms", "dp_clipping", "influence"])
def test_pages_that_name_classes_and_features_show_all_22_as_text(page):
    """The pages that draw an upload's class and feature names (figures, captions, metrics, hovers) and the sidebar:
    with all 22 strings as classes, two as features and one as the label column, nothing is live and every string
    is shown. DP clipping trains its private and non-private models for the per-class accuracy figure too."""
    at = _page_with_upload(page, RAW[4] + ".csv", batch_csv(), **({"dp_sgd_steps": 20} if page == "dp_clipping" else {}))
    if page == "dp_clipping":
        at.button(key="run_dp_sgd").click().run()
        assert_clean(at)
        assert any("Per-class test accuracy" in json.dumps(json.loads(c.proto.spec)["layout"].get("title", {}))
                   for c in at.get("plotly_chart"))
    assert not at.error, [e.value for e in at.error]
    problems, seen = page_problems(at)
    assert problems == []
    assert seen == ALL, sorted(ALL - seen)


@pytest.mark.slow
def test_every_other_page_shows_the_uploads_names_as_text():
    """Pages that do not draw an upload's names still carry the sidebar (file name, label column): one session tours
    them with the upload held (a lecture step sets its own dataset: nothing of the upload is left to show there)."""
    at = _page_with_upload("privacy_audit", RAW[4] + ".csv", batch_csv())
    for page in ["privacy_audit", "performance", "equivalence", "geometry", "home", "practice", "lecture"]:
        at.switch_page(f"views/{page}.py").run()
        assert_clean(at)
        problems, seen = page_problems(at)
        assert problems == [], page
        assert {"04", "05"} <= seen or page == "lecture", (page, seen)


@pytest.mark.slow
@pytest.mark.parametrize("page", ["norms", "dp_clipping"])
def test_22_hostile_csvs_one_after_another(page):
    """The issue's pages with each of the 22 hostile CSVs (each string as a feature, the label column and a class
    somewhere), uploaded one after another in one session: nothing live, every name shown."""
    at = open_page(page, **UPLOAD)
    for i, (name, raw) in enumerate(hostile_csvs()):
        _upload(at, RAW[i] + ".csv", raw)
        at.selectbox(key="upload_label").set_value(RAW[(i + 2) % 22]).run()  # the last upload's label column is kept
        assert not at.error, (name, [e.value for e in at.error])
        problems, seen = page_problems(at)
        assert problems == [], name
        # the file (caption), its label column (caption), its three classes (figures) and, on Gradient norms, its two
        # features (axis titles, hovers) were shown
        expected = {i, (i + 2) % 22, (i + 3) % 22, (i + 4) % 22, (i + 5) % 22} | ({(i + 1) % 22} if page == "norms" else set())
        assert {f"{j + 1:02d}" for j in expected} <= seen, (name, seen)


@pytest.mark.slow
def test_link_parameters_are_shown_as_text():
    """A link's values come back in the page's words: 22 control values no control can take (URL warnings) and a room
    code (the lecture)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.query_params.update(hostile_link())
    at.switch_page("views/dp_clipping.py")
    at.run()
    assert_clean(at)
    problems, seen = page_problems(at)
    assert problems == [] and seen == ALL, (problems, sorted(ALL - seen))
    warned = " ".join(rendered_text(w.value) for w in at.warning)
    for key, shown in zip(LINK_KEYS, SHOWN):
        assert f"{key}={' '.join(shown.split())}" in warned, (key, warned)

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.query_params.update({"room": RAW[3], "step": "1"})
    at.switch_page("views/lecture.py")
    at.run()
    assert_clean(at)
    problems, seen = page_problems(at)
    assert problems == [] and "04" in seen, (problems, seen)


HOSTILE_MODULE = '''
import jax.numpy as jnp
import numpy as np

rng = np.random.default_rng(0)
x = rng.normal(size=(60, 2)).astype(np.float32)
y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)
data = {"x": x, "y": y}
task = "classification"
class_names = CLASSES
params = {LEAF_W: jnp.zeros((2, 3)), LEAF_B: jnp.zeros(3)}


def loss_fn(p, x, y):
    logits = x @ p[LEAF_W] + p[LEAF_B]
    return jnp.log(jnp.sum(jnp.exp(logits))) - logits[y]


def predict_fn(p, x):
    return x @ p[LEAF_W] + p[LEAF_B]
'''


@pytest.mark.slow
def test_a_served_models_names_are_shown_as_text(tmp_path, monkeypatch):
    """`python -m gradlab serve` of a module whose file, class and parameter names are hostile: the sidebar's caption,
    the per-class and per-layer figures and the metrics show them as text."""
    from gradlab import own

    path = tmp_path / (RAW[4] + ".py")  # "**EVIL05 bold** __strong__.py"
    source = (HOSTILE_MODULE.replace("CLASSES", repr((RAW[0], RAW[7], RAW[21])))
              .replace("LEAF_W", repr(RAW[1])).replace("LEAF_B", repr(RAW[16])))
    path.write_text(source)
    monkeypatch.setenv(own.ENV, str(path))
    try:
        at = open_page("norms", dataset=own.OWN)
        assert_clean(at)
        assert not at.error, [e.value for e in at.error]
        problems, seen = page_problems(at)
        assert problems == []
        assert {"01", "02", "05", "08", "17", "22"} <= seen, seen
    finally:
        own._load_served.cache_clear()


@pytest.mark.slow
def test_a_served_models_error_is_shown_as_text(tmp_path, monkeypatch):
    """A served module that fails while loading with a hostile message (and a hostile file name): the sidebar's
    error and the page's say it, as text."""
    from gradlab import own

    (tmp_path / "message.txt").write_text(" ".join(RAW[i] for i in (0, 1, 3, 15, 17, 21)))
    path = tmp_path / (RAW[4] + ".py")
    path.write_text("from pathlib import Path\nraise ValueError((Path(__file__).parent / 'message.txt').read_text())\n")
    monkeypatch.setenv(own.ENV, str(path))
    try:
        at = open_page("norms", dataset=own.OWN)
        assert_clean(at)
        assert at.error
        problems, seen = page_problems(at)
        assert problems == []
        assert {"01", "02", "04", "05", "16", "18", "22"} <= seen, seen
    finally:
        own._load_served.cache_clear()
