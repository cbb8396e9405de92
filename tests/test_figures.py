"""Figures shared by sessions (`gradlab.ui.figures`): one object per distinct call, equal to a fresh build."""

import threading

import jax
import numpy as np

import inspect

from gradlab import audit_plots as audit_library
from gradlab import plots as library
from gradlab.ui import figures
from gradlab.ui.figures import audit_plots, plots


def test_same_arguments_share_one_figure_equal_to_a_fresh_build():
    norms = np.linspace(0.1, 3.0, 50)
    a, b = plots.norm_histogram(norms, log=True), plots.norm_histogram(norms.copy(), log=True)
    assert a is b
    assert a.to_json() == library.norm_histogram(norms, log=True).to_json()
    assert plots.norm_histogram(norms, log=False) is not a  # a keyword changes the key
    assert plots.norm_histogram(norms.astype(np.float64) * 2) is not a  # so do the values
    assert plots.norm_histogram(norms.astype(np.float32), log=True) is not a  # and the dtype
    bound = audit_plots.roc_loglog({}, epsilon=2.0, delta=1e-5)
    assert bound is audit_plots.roc_loglog({}, epsilon=2.0, delta=1e-5)
    assert bound is not audit_plots.roc_loglog({}, epsilon=3.0, delta=1e-5)


def test_presenter_mode_is_part_of_the_key_and_other_names_pass_through():
    assert plots.NORM_LABEL == library.NORM_LABEL
    norms = np.linspace(0.1, 3.0, 20)
    normal = plots.norm_histogram(norms)
    seen = {}

    def presenter_session():  # Streamlit runs each session on its own thread; the mode is per thread
        figures.set_presenter(True)
        seen["fig"] = plots.norm_histogram(norms)

    t = threading.Thread(target=presenter_session)
    t.start()
    t.join()
    assert seen["fig"] is not normal
    assert seen["fig"].layout.title.font.size > normal.layout.title.font.size


def test_a_figure_for_a_half_width_column_wraps_its_titles_and_is_its_own_entry():
    """Two charts side by side at 1024 px with the sidebar open are ~250 px wide each: a 42-character title and a
    54-character axis title on one line were cut off there."""
    norms = np.linspace(0.1, 3.0, 20)
    wide = plots.norm_histogram(norms, log=True)
    with figures.half_column():
        half = plots.norm_histogram(norms, log=True)
    assert figures.style() == library.NORMAL  # the block ends the style
    assert half is not wide and "<br>" not in wide.layout.title.text
    for text, chars in ((half.layout.title.text, 30), (half.layout.xaxis.title.text, 24)):
        lines = text.split("<br>")
        assert len(lines) > 1 and max(map(len, lines)) <= chars, text
    assert half.layout.margin.t > wide.layout.margin.t  # room for the title's second line


def test_an_argument_without_a_value_key_builds_unshared():
    rows = [{"n": 4, "approach": "loop", "run_s": 1.0}, {"n": 8, "approach": "loop", "run_s": 2.0}]
    labels = {"loop": "Python loop"}
    assert plots.timing_vs_n(rows, labels) is plots.timing_vs_n(rows, labels)
    odd = [{"n": 4, "approach": "loop", "run_s": 1.0, "note": object()}]
    assert plots.timing_vs_n(odd, labels) is not plots.timing_vs_n(odd, labels)
    with_key = [{"n": 4, "approach": "loop", "run_s": 1.0, "key": jax.random.key(0)}]  # no NumPy view: unkeyed
    assert plots.timing_vs_n(with_key, labels) is not plots.timing_vs_n(with_key, labels)


def test_the_gates_relief_drops_stored_results_and_keeps_shared_figures(monkeypatch):
    """When a heavy job would take the server over its budget, the gate's relief empties the stored results' memory
    tier; the shared figures (about 1 MB for the whole lecture) stay, so a room's students do not rebuild them."""
    from gradlab.ui import cache

    monkeypatch.setattr(cache, "SERVER_BUDGET_MB", 0)  # still over budget once compiled programs are dropped
    monkeypatch.setattr(cache, "release_memory", lambda force=False, full=None: None)  # keep the worker's compiled programs
    norms = np.linspace(0.5, 2.0, 30)
    first = plots.norm_histogram(norms)
    cache.STORE.put("relief-test", np.zeros(10), persist=False)
    cache._relieve()
    assert "relief-test" not in cache.STORE._memory
    assert plots.norm_histogram(norms) is first  # not rebuilt after the relief


def test_image_titles_break_lines_on_newlines_and_keep_markup_as_text():
    fig = library.image_grid(np.zeros((2, 4)), ["#7 y=cat\n0.5", "<b>x</b>"], image_shape=(2, 2))
    texts = [a.text for a in fig.layout.annotations]
    assert texts[0] == "#7 y=cat<br>0.5"
    assert "<b>" not in texts[1] and "x" in texts[1]


def test_layer_share_labels_each_leaf_with_its_share_and_hovers_its_median():
    """The bars' labels are each leaf's share of Σᵢ‖gᵢ‖² (short: a half-width column at 1024 px cut longer ones off);
    the median per-example norm is in the hover."""
    layer = {"w": np.array([3.0, 4.0]), "b": np.array([1.0, 0.0])}  # squared sums 25 and 1
    bar = library.layer_share(layer).data[0]
    assert list(bar.text) == ["96.2%", "3.8%"]
    np.testing.assert_allclose(bar.customdata, [3.5, 0.5])
    assert "median" in bar.hovertemplate


def test_a_small_facet_labels_a_few_decades_with_ten_to_the_zero_among_them():
    norms = np.geomspace(1e-8, 1.0, 100)  # nine decades: a label each crowded a facet ~90 px wide
    fig = library.norm_histogram_by_class(norms, np.arange(100) % 10, [str(i) for i in range(10)], log=True)
    assert list(fig.layout.xaxis.tickvals) == [-6, -3, 0]
    assert list(fig.layout.xaxis.ticktext) == ["10⁻⁶", "10⁻³", "10⁰"]
    assert list(library.norm_histogram(norms, log=True).layout.xaxis.tickvals) == list(range(-8, 1))  # room for all


def _builders(module):
    """Every public function of `module` that returns a Plotly figure built from data (not one that restyles a
    figure it is given: `readable`, `style_figure`), by its signature."""
    return {name: fn for name, fn in vars(module).items() if inspect.isfunction(fn) and not name.startswith("_")
            and fn.__module__ == module.__name__ and "Figure" in str(inspect.signature(fn).return_annotation)
            and next(iter(inspect.signature(fn).parameters), "") != "fig"}


def test_every_public_builder_is_marked_and_shared():
    for module, shared in ((library, plots), (audit_library, audit_plots)):
        builders = _builders(module)
        assert len(builders) >= (25 if module is library else 3)
        for name, fn in builders.items():
            assert getattr(fn, "builds_figure", False), f"{module.__name__}.{name} lacks @figure"
            assert getattr(shared, name).__wrapped__ is fn, f"{module.__name__}.{name} is not shared"


def test_style_is_an_argument_and_the_library_keeps_no_state():
    norms = np.linspace(0.1, 3.0, 20)
    normal = library.norm_histogram(norms)
    big = library.norm_histogram(norms, style=library.Style(presenter=True))
    assert big.layout.xaxis.tickfont.size > normal.layout.xaxis.tickfont.size
    assert library.norm_histogram(norms).to_json() == normal.to_json()  # nothing carried over from the last call
    assert plots.norm_histogram(norms, style=library.Style(presenter=True)).to_json() == big.to_json()
    source = inspect.getsource(library) + inspect.getsource(audit_library)
    assert "threading" not in source and "global " not in source


def test_the_audit_observations_axis_typesets_the_canarys_parameter():
    """θ_canary is typeset as a subscript on the Privacy audit's and the canary card's histogram (a literal
    underscore showed on the projector, as Ḡ_C once did: issue 41)."""
    fig = audit_library.observation_histogram(np.r_[0.0, 1, 2, 3], np.r_[0, 1, 0, 1].astype(bool), 1.5,
                                              xlabel=audit_library.OBSERVATION["gradient"])
    assert "θ<sub>canary</sub>" in fig.layout.xaxis.title.text and "_" not in fig.layout.xaxis.title.text


def test_a_shared_figure_is_drawn_from_its_dict_made_once_and_sends_the_same_spec(monkeypatch):
    """`ui.chart` hands `st.plotly_chart` a shared figure's `to_dict()` made once (`FIGURES.spec`): the spec sent is
    the one the figure itself gives; an unshared figure and an evicted one are drawn as before."""
    import plotly.graph_objects as go
    import plotly.io as pio
    import plotly.tools

    from gradlab.ui import widgets

    norms = np.random.default_rng(3).lognormal(size=500)
    fig = plots.norm_histogram(norms, log=True)
    calls = []
    real = type(fig).to_dict

    def counted(self):
        calls.append(self)
        return real(self)

    monkeypatch.setattr(go.Figure, "to_dict", counted)
    first = figures.FIGURES.spec(fig)
    again = figures.FIGURES.spec(fig)
    assert again is first and len(calls) == 1
    drawn = widgets._Drawn(first)
    sent = plotly.tools.return_figure_from_figure_or_data(drawn, validate_figure=True)  # what st.plotly_chart does
    assert pio.to_json(sent, validate=False) == pio.to_json(real(fig), validate=False)
    assert figures.FIGURES.spec(go.Figure(fig)) is None  # not held: Streamlit makes its dict as before
    figures.FIGURES.clear()
    assert figures.FIGURES.spec(fig) is None


def test_a_speed_up_within_two_decades_labels_two_and_five_and_a_wide_one_keeps_its_decades():
    rows = [{"approach": "loop", "n": n, "run_s": 0.03 * n} for n in (4, 16, 64)]
    rows += [{"approach": "vmap", "n": n, "run_s": 0.03 * n / s} for n, s in ((4, 3.0), (16, 9.0), (64, 25.0))]
    narrow = library.speedup_vs_loop(rows, {"loop": "loop", "vmap": "vmap(grad)"})
    assert narrow.layout.yaxis.type == "log" and narrow.layout.yaxis.dtick == "D2"
    rows[-1] = {"approach": "vmap", "n": 64, "run_s": 0.03 * 64 / 5000.0}  # 1 to 5,000: decades are enough
    assert library.speedup_vs_loop(rows, {"loop": "loop", "vmap": "vmap(grad)"}).layout.yaxis.dtick is None


def test_step_4s_figures_name_each_drawn_line_in_its_colour_under_the_title():
    # the legend sits under the plot, below a projector's first screen (issue 41): the key under the title names the
    # lines drawn, in their colours, and wraps between entries on a projector's half-width chart
    rows = [{"approach": a, "n": n, "run_s": t * n} for a, t in (("loop", 1e-3), ("vmap", 1e-4), ("norms", 2e-5))
            for n in (16, 64)]
    labels = {a: a for a in ("loop", "vmap", "batch", "norms")}  # batch chosen but not timed: not in the key
    timing = library.timing_vs_n(rows, labels)
    key = timing.layout.title.subtitle.text
    for a in ("loop", "vmap", "norms"):
        assert f"color:{library.APPROACH_COLORS[a]}'>━ {library.APPROACH_SHORT[a]}<" in key
    assert library.APPROACH_SHORT["batch"] not in key and "<br>" not in key
    speedup = library.speedup_vs_loop(rows, labels).layout.title.subtitle.text
    assert library.APPROACH_SHORT["loop"] not in speedup and library.APPROACH_SHORT["vmap"] in speedup
    rows += [{"approach": "batch", "n": n, "run_s": 1e-5 * n} for n in (16, 64)]
    projector = library.timing_vs_n(rows, labels, style=library.Style(presenter=True, half=True))
    assert projector.layout.title.subtitle.text.count("<br>") == 1  # four entries: two lines at 440 px
    assert projector.layout.margin.t > timing.layout.margin.t  # and room for them above the plot
