"""Lecture scenarios: valid settings, one click opens the page with every control set, same numbers
as the library computes for the preset's experiment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, assert_clean, open_page

from gradlab import ui
from gradlab.data import DATASETS
from gradlab.experiment import Experiment, fit
from gradlab.models import ACTIVATIONS, MODELS
from gradlab.ui import pages
from gradlab.ui.presets import BY_NAME, LINE_OUTLIERS_IN_TRAIN, PRESETS, SIDEBAR_KEYS, Preset
from gradlab.train import OPTIMIZERS

# what each sidebar control accepts (a preset value outside these would be silently dropped by the widget)
ALLOWED = {
    "dataset": set(DATASETS), "model": set(MODELS), "activation": set(ACTIVATIONS), "optimizer": set(OPTIMIZERS),
    "lr": set(ui.LEARNING_RATES), "steps": set(ui.STEPS), "width": {8, 16, 32, 64, 128, 256, 512},
    "depth": {1, 2, 3, 4}, "batch_size": {16, 32, 64, 128, 256, 512, 2048},
    "l2": {0.0, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1}, "checkpoint_every": {10, 25, 50, 100, 250, 500},
}


def test_the_issue_scenarios_exist():
    names = {p.name.lower() for p in PRESETS}
    for wanted in ("mislabeled digits stand out", "clipping bias hits a rare class",
                   "the seeds' scalar example", "who influenced this prediction?"):
        assert wanted in names
    assert BY_NAME["Mislabeled digits stand out"].config == Experiment(dataset="digits", label_noise=0.1)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_preset_values_are_ones_the_controls_accept(preset: Preset):
    assert (ROOT / preset.page).is_file()
    assert preset.look_at.strip() and len(preset.look_at) < 400
    for key, value in preset.config.__dict__.items():
        if key in ALLOWED:
            assert value in ALLOWED[key], (key, value)
    assert 0.0 <= preset.config.label_noise < 1.0
    assert round(preset.config.label_noise / 0.05, 6) % 1 == 0  # the slider's step
    assert set(preset.state()) >= set(SIDEBAR_KEYS)


def test_bad_presets_are_refused():
    with pytest.raises(ValueError, match="unknown experiment fields"):
        Preset("x", "y", "views/norms.py", {"learning_rate": 0.1})
    with pytest.raises(ValueError, match="not controls of views/norms.py"):
        Preset("x", "y", "views/norms.py", widgets={"seed": 3})


def _click(at, name):
    next(b for b in at.button if b.label == name).click()
    at.run()


def _home():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.run()
    assert_clean(at)
    return at


def _page_title(page: str) -> str:
    """The words the page's nav label is made of (as in app.py), to find in its st.title."""
    return {"norms": "gradient norms", "dp_clipping": "dp clipping"}.get(Path(page).stem, Path(page).stem)


@pytest.mark.slow  # every preset at its own (full) settings
@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_clicking_a_preset_opens_its_page_with_every_control_set(preset: Preset):
    at = _home()
    # start from a different experiment, so the preset must reset fields it does not name
    at.session_state["seed"] = 7
    at.session_state["l2"] = 0.01
    at.run()
    _click(at, preset.name)
    assert_clean(at)
    titles = " ".join(t.value for t in at.title).lower().replace("_", " ")
    assert _page_title(preset.page) in titles, titles
    assert ui.experiment_from_state(at.session_state) == preset.config
    assert preset.widgets or preset.experiment, "a preset must set its experiment or its page's controls"
    assert set(preset.widgets) <= set(pages.page(preset.page).controls)
    for key, value in preset.widgets.items():
        assert at.session_state[key] == value, key
    # the address the click left is the preset: opened by another visitor, the same controls (a preset's value equal to
    # a number input's minimum once fell out of it, `perf_repeats=1`)
    from streamlit.testing.v1 import AppTest

    other = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    other.query_params.update(dict(at.query_params))
    other.switch_page(preset.page)
    other.run()
    kept = {k: v for k, v in preset.widgets.items() if k in at.query_params or k in other.session_state}
    assert {k: other.session_state[k] for k in kept} == kept, preset.name
    # a preset that leaves every page control at its default opens a view anyone gets by clicking the page
    fresh = open_page(preset.page.removeprefix("views/").removesuffix(".py"), **preset.experiment)
    drawn = {k: v for k, v in preset.widgets.items() if k in fresh.session_state}  # a diverged run stops the page early
    assert not drawn or preset.experiment or any(fresh.session_state[k] != v for k, v in drawn.items()), preset.name
    assert "_preset_goto" not in at.session_state


def test_a_preset_opens_from_a_link_that_holds_sidebar_values():
    """A link with sidebar values (as a visitor's own changes write them into it), then a preset's click: the page
    switch empties the link, which Streamlit refuses to do by clearing it while it holds a bound control's value (this
    raised StreamlitAPIException before; session 37)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.query_params.update(seed="7", l2="0.01")
    at.run()
    assert_clean(at)
    assert at.session_state["seed"] == 7
    _click(at, "The seeds' scalar example")
    assert_clean(at)
    assert "equivalence" in " ".join(t.value for t in at.title).lower()
    assert at.session_state["seed"] == ui.DEFAULT.seed and at.session_state["eq_example"] == "scalar"


@pytest.mark.slow
def test_mislabeled_digits_preset_shows_the_library_numbers():
    """The norms page after the preset shows N, median norm and AUC as computed here directly."""
    from gradlab.metrics import detection_roc
    from gradlab.summary import norm_summary

    preset = BY_NAME["Mislabeled digits stand out"]
    at = _home()
    _click(at, preset.name)
    assert_clean(at)
    metric = {m.label: m.value for m in at.metric}
    f = fit(preset.config)
    s = norm_summary(f)
    assert metric["Training examples N"] == f"{len(s.norms):,}"
    assert metric["Median norm"] == f"{np.median(s.norms):.3g}"
    assert metric["Mislabel detection AUC"] == f"{detection_roc(s.norms, f.data.flipped).auc:.3f}"
    assert float(metric["Mislabel detection AUC"]) > 0.8  # the point of the scenario


def test_preset_link_reproduces_the_preset():
    """Opening the preset's query string as a URL gives the same experiment as clicking it."""
    from streamlit.testing.v1 import AppTest

    for preset in PRESETS:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
        for k, v in preset.query().items():
            at.query_params[k] = v
        at.run()
        assert ui.experiment_from_state(at.session_state) == preset.config, preset.name


# ------------------------------------------------------------------ each preset's "look at", with a number


def _norms(f, checkpoint=-1):
    from gradlab import engine

    return np.asarray(engine.per_example_norms(f.loss_fn, f.run.checkpoints[checkpoint], f.data.x_train, f.data.y_train))


def test_scalar_preset_shows_the_seeds_numbers():
    preset = BY_NAME["The seeds' scalar example"]
    assert "[2, 8]" in preset.look_at and "10" in preset.look_at
    at = _home()
    _click(at, preset.name)
    assert_clean(at)
    radio = at.radio(key="eq_example")
    assert radio.value == "scalar"
    text = " ".join(m.value for m in at.markdown)
    assert "Way (a) = **10**, way (b) = **10**" in text
    assert "[2., 8.]" in text


def test_mislabeled_digits_top16_are_mostly_flipped_and_shown_on_a_log_scale():
    import re

    preset = BY_NAME["Mislabeled digits stand out"]
    assert preset.widgets["log"] is True
    n_said, k_said = map(int, re.search(r"(\d+) of (\d+)", preset.look_at).groups())
    f = fit(preset.config)
    top = np.argsort(-_norms(f))[:k_said]
    found, chance = int(f.data.flipped[top].sum()), float(f.data.flipped.mean()) * k_said
    # The preset's text says n_said; float rounding of training can move one or two ranks (13 was seen on a
    # clean clone), so assert the property with a margin: within 2 of what the text says, far above chance.
    assert abs(found - n_said) <= 2 and found >= 4 * chance, (found, n_said, chance)
    assert n_said > k_said // 2


def test_outliers_preset_circles_exactly_the_outliers():
    preset = BY_NAME["Outliers pull hardest in regression"]
    f = fit(preset.config)
    x, y = f.data.x_train[:, 0].astype(np.float64), f.data.y_train.astype(np.float64)
    # outliers found independently: far from a least-squares line fitted to the points within 1 std of a first fit
    resid = y - np.polyval(np.polyfit(x, y, 1), x)
    inner = np.abs(resid) < resid.std()
    resid = y - np.polyval(np.polyfit(x[inner], y[inner], 1), x)
    outliers = np.abs(resid) > 1.0
    assert outliers.sum() == LINE_OUTLIERS_IN_TRAIN == preset.widgets["topk"]
    top = np.argsort(-_norms(f))[:preset.widgets["topk"]]
    assert set(top) == set(np.flatnonzero(outliers))


def test_clipping_preset_clips_the_minority_class_more():
    import re

    preset = BY_NAME["Clipping bias hits a rare class"]
    f = fit(preset.config)
    y, c = f.data.y_train, preset.widgets["dp_clip_c"]
    counts = np.bincount(y)
    minority = int(np.argmin(counts))
    assert f.data.class_names[minority] == "malignant" and f"{counts[minority]} of {len(y)}" in preset.look_at
    norms = _norms(f)
    frac = [float(np.mean(norms[y == k] > c)) for k in range(2)]
    assert frac[minority] > frac[1 - minority]
    said = [int(v) / 100 for v in re.findall(r"(\d+)%", preset.look_at)]  # "about 16% against 10%"
    assert abs(said[0] - frac[minority]) < 0.03 and abs(said[1] - frac[1 - minority]) < 0.03


def test_influence_preset_most_self_influential_are_flipped():
    from gradlab.influence import self_influence

    preset = BY_NAME["Who influenced this prediction?"]
    f = fit(preset.config)
    s = np.asarray(self_influence(f.loss_fn, f.model, f.data.x_train, f.data.y_train, method="grad_norm"))
    top = np.argsort(-s)[:preset.widgets["infl_k"]]
    assert f.data.flipped[top].mean() > 0.5          # "mostly flipped labels"
    assert f.data.flipped.mean() == pytest.approx(0.1, abs=0.01)


def test_performance_preset_times_the_loop_and_vmap_and_they_agree():
    """The preset's sweep times the loop and one vmap(grad) call at its largest N, and both give the same
    per-example gradients. How much slower the loop is (the text says over 10×) is a benchmark line,
    `python -m benchmarks.loop_vs_vmap` (benchmarks/RESULTS.md): a timing ratio asserted here failed at load 15
    (2.9 against a floor of 3; issue 42), and load cannot move what is asserted now."""
    import jax

    from gradlab import bench
    from gradlab.experiment import init_model, load_data
    from gradlab.losses import loss_for

    preset = BY_NAME["Per-example gradients cost about one gradient"]
    assert "over 10× slower" in preset.look_at  # the claim benchmarks/loop_vs_vmap.py measures
    data = load_data(preset.config)
    n = max(preset.widgets["perf_sizes"])
    assert n == 256
    loss, model = loss_for(data.task), init_model(preset.config, data)
    xs, ys = data.x_train[:n], data.y_train[:n]
    rows = bench.sweep(loss, model, xs, ys, [n], ["loop", "vmap"], repeats=1)
    assert [(r.n, r.approach, r.repeats) for r in rows] == [(n, "loop", 1), (n, "vmap", 1)]
    loop, vmap = (bench.runner(a, loss, model, xs, ys)() for a in ("loop", "vmap"))
    for a, b in zip(jax.tree.leaves(loop), jax.tree.leaves(vmap)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert a.shape == b.shape and a.shape[0] == n
        # measured: at most 1.9e-7 of the leaf's largest entry (float32 sums in another order), with 1 and 2 threads
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b))


def test_diverging_preset_says_so():
    preset = BY_NAME["A learning rate of 100 diverges"]
    at = _home()
    _click(at, preset.name)
    assert_clean(at)
    assert any("learning rate" in e.value.lower() for e in at.error), [e.value for e in at.error]


def test_every_models_recipe_is_a_value_its_sidebar_controls_offer():
    from gradlab.experiment import MODEL_DEFAULTS

    from gradlab.experiment import CONTROLS
    from gradlab.train import ORDERS

    for model in MODEL_DEFAULTS:
        exp = Experiment.for_model(model)
        assert all(getattr(exp, k) in ALLOWED[k] for k in MODEL_DEFAULTS[model] if k in CONTROLS), model
        # the recipe-only fields (no sidebar control) hold values `train` takes
        assert exp.order in ORDERS and 0 <= exp.ema < 1 and 0 <= exp.label_smoothing < 1, model
