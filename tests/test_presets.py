"""Lecture scenarios: valid settings, one click opens the page with every control set, same numbers
as the library computes for the preset's experiment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, assert_clean

from gradlab import ui
from gradlab.data import DATASETS
from gradlab.experiment import Experiment, fit
from gradlab.models import ACTIVATIONS, MODELS
from gradlab.presets import BY_NAME, PRESETS, SIDEBAR_KEYS, Preset
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
    with pytest.raises(ValueError, match="collide"):
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
    for key, value in preset.widgets.items():
        assert at.session_state[key] == value, key
    assert "_preset_goto" not in at.session_state


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
