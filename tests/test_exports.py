"""Exports: CSV/NPZ of per-example tables round-trip; the per-example gradient NPZ equals a Python
loop of jax.grad; over the budget the matrix is refused with a reason."""

from __future__ import annotations

import io

import jax
import numpy as np
import pandas as pd
import pytest
from conftest import assert_clean, open_page

from gradlab import export
from gradlab.experiment import Experiment, fit


def test_csv_and_npz_round_trip():
    table = {"example": np.arange(4), "norm": np.array([0.5, 1.5, 2.0, 0.1], np.float32),
             "grad": np.arange(8.0).reshape(4, 2)}
    frame = pd.read_csv(io.BytesIO(export.to_csv(table)))
    assert list(frame.columns) == ["example", "norm", "grad[0]", "grad[1]"]
    np.testing.assert_allclose(frame["grad[1]"], [1, 3, 5, 7])
    z = np.load(io.BytesIO(export.to_npz(table)))
    assert z["grad"].shape == (4, 2) and z["norm"].dtype == np.float32
    df = pd.DataFrame({"label": ["a", "b"], "score": [1.0, -2.0]})
    z = np.load(io.BytesIO(export.to_npz(df)))
    assert z["label"].tolist() == ["a", "b"] and z["score"].tolist() == [1.0, -2.0]
    assert export.export_bytes(table) == 4 * 8 + 4 * 4 + 8 * 8


def test_gradient_npz_equals_a_loop_of_jax_grad():
    f = fit(Experiment(dataset="moons", model="mlp", width=8, steps=25, checkpoint_every=25))
    z = np.load(io.BytesIO(export.gradients_npz(f)))
    model = f.model
    import equinox as eqx

    diff, static = eqx.partition(model, eqx.is_inexact_array)
    for i in (0, 7, len(f.data.y_train) - 1):
        g = jax.grad(lambda d: f.loss_fn(eqx.combine(d, static), f.data.x_train[i], f.data.y_train[i]))(diff)
        flat = np.concatenate([np.ravel(a) for a in jax.tree.leaves(g)])
        np.testing.assert_allclose(z["grads"][i], flat, rtol=1e-5, atol=1e-6)
    assert z["grads"].shape == (len(f.data.y_train), int(z["leaf_sizes"].sum()))
    assert len(z["leaf_names"]) == len(z["leaf_sizes"])


@pytest.mark.slow  # a page load at the widest model; the files: the tests above
def test_norms_page_offers_downloads_and_refuses_a_huge_gradient_matrix():
    at = open_page("norms", dataset="moons", steps=50, checkpoint_every=25)
    assert_clean(at)
    # moons: the per-example gradient matrix is small, so it is offered
    assert not any("export limit" in c.value for c in at.caption)
    old = export.EXPORT_BUDGET_BYTES
    try:
        export.EXPORT_BUDGET_BYTES = 1000  # a budget the matrix cannot fit: the reason is shown instead
        at.run()
        assert_clean(at)
        assert any("export limit" in c.value and "not built" in c.value for c in at.caption)
    finally:
        export.EXPORT_BUDGET_BYTES = old


def test_csv_export_defuses_formulas_and_keeps_numbers():
    import io

    import pandas as pd

    from gradlab.export import to_csv

    table = pd.DataFrame({"=cmd|' /C calc'!A0": [1.5, -2.0], "label": ["=HYPERLINK(\"http://x\")", "@SUM(A1)"],
                          "ok": ["cat", "-dog"]})
    back = pd.read_csv(io.BytesIO(to_csv(table)))
    assert list(back.columns)[0].startswith("'=")
    assert list(back["label"]) == ["'=HYPERLINK(\"http://x\")", "'@SUM(A1)"]
    assert list(back["ok"]) == ["cat", "'-dog"]
    assert back.iloc[:, 0].tolist() == [1.5, -2.0]  # numbers, negative ones included, stay numbers


def test_every_term_a_page_explains_is_in_the_glossary():
    """`ui.terms(...)` calls in the views name only terms the glossary explains (a missing one would raise)."""
    import ast
    from pathlib import Path

    from gradlab.glossary import TERMS

    used = set()
    for path in Path(__file__).resolve().parents[1].glob("views/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "terms":
                used |= {a.value for a in node.args if isinstance(a, ast.Constant)}
    assert used >= {"TracIn", "TRAK", "LDS", "LiRA", "L-BFGS", "H⁻¹v", "RDP", "PLD", "B_simple"}
    assert used <= set(TERMS), used - set(TERMS)


def test_current_c_is_marked_where_c_is_on_log_axes():
    """On a log x axis the line sits at C (data units) and its label at log₁₀ C (Plotly's annotation units)."""
    import numpy as np

    from gradlab import plots

    grid = np.geomspace(1e-4, 1e1, 30)
    for fig in (plots.clipping_bias_curve(grid, np.ones(30), np.ones(30), 0.0019),
                plots.signal_noise_curve(grid, np.ones(30), np.ones(30), 0.0019)):
        (line,) = [sh for sh in fig.layout.shapes if sh.type == "line"]
        assert line.x0 == line.x1 == 0.0019
        label = next(a for a in fig.layout.annotations if a.text == "current C")
        assert label.x == np.log10(0.0019)


def test_user_strings_in_figures_are_text_not_markup():
    """An upload's class names reach legends, categories and axis titles: Plotly would render `<a href>` there."""
    import json

    import numpy as np

    from gradlab import plots

    evil = '<a href="http://example.com">c</a>'
    fig = plots.per_class_clipping([evil, "b"], np.array([0.1, 0.2]), np.array([0.9, 0.8]), np.array([0.7, 0.6]), 1.0)
    fig = plots.norm_histogram_by_class(np.array([1.0, 2.0, 3.0, 4.0]), np.array([0, 1, 0, 1]), [evil, "b"])
    spec = json.dumps(fig.to_plotly_json())
    assert "<a href" not in spec and "&lt;a href" in spec
    grid = plots.image_grid(np.zeros((1, 4)), [evil], cols=1, image_shape=(2, 2))
    assert "<a href" not in json.dumps(grid.to_plotly_json())


def test_a_toy_hover_names_the_example_by_its_row_and_shows_its_input():
    """Issue 26 item 3 on the 2-D toys: the oracle is scikit-learn's generator itself (the source the rows name)."""
    from sklearn.datasets import make_moons

    from gradlab import plots
    from gradlab.data import TOY_SIZE, load_dataset

    data = load_dataset("moons", seed=0)
    x_src, y_src = make_moons(TOY_SIZE, noise=0.2, random_state=0)
    ids = {**export.example_columns(data, np.arange(len(data.y_train))),
           "label": [data.class_names[c] for c in data.y_train]}
    fig = plots.scatter_2d(data.x_train, np.ones(len(data.y_train)), color_label="‖g‖", ids=ids)
    trace = fig.data[0]
    assert trace.hovertemplate.startswith("index %{customdata[1]}<br>x₁ = %{customdata[2]:.3g}<br>x₂ = %{customdata[3]:.3g}")
    for i in (0, 7, len(data.y_train) - 1):
        position, row, x1, x2, label = trace.customdata[i]
        assert position == i  # a click reads the position back; the hover shows the generator's row
        np.testing.assert_allclose([x1, x2], x_src[row], rtol=1e-5)
        assert label == str(y_src[row])
        np.testing.assert_allclose([trace.x[i], trace.y[i]], data.x_train[i])  # drawn where the split put it
    assert sorted(np.asarray(trace.customdata)[:, 1].astype(int).tolist()) == sorted(data.rows_train.tolist())
    # the LOO scatter names its retrained examples the same way; without ids, by position
    loo = plots.loo_scatter(np.arange(4.0), np.arange(4.0), np.array([5, 9, 2, 1]), pearson=1, spearman=1,
                            ids={k: np.asarray(v)[[5, 9, 2, 1]] for k, v in ids.items()})
    assert [c[1] for c in loo.data[0].customdata] == [data.row(5), data.row(9)]
    plain = plots.loo_scatter(np.arange(2.0), np.arange(2.0), np.array([5, 9]), pearson=1, spearman=1)
    assert plain.data[0].hovertemplate.startswith("example %{customdata[0]}")


@pytest.mark.slow
def test_the_norms_page_hovers_rows_on_a_toy():
    import json

    at = open_page("norms", dataset="moons")
    assert_clean(at)
    templates = [t.get("hovertemplate", "") for chart in at.get("plotly_chart")
                 for t in json.loads(chart.proto.spec)["data"]]
    assert any(t.startswith("index %{customdata[1]}<br>x₁ = ") for t in templates), templates
