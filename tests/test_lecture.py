"""Lecture: at least 10 steps, each a full view with its controls set, 2-3 sentences of narration,
speaker notes, Back / Next, the step in the URL; presenter mode enlarges figure text."""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT, assert_clean

from gradlab.ui import pages
from gradlab.ui.presets import LECTURE


def test_the_story_has_at_least_ten_distinct_steps():
    assert len(LECTURE) >= 10
    for i, s in enumerate(LECTURE):
        sentences = [x for x in re.split(r"(?<=[.?!])\s+", s.narration.strip()) if x]
        assert 2 <= len(sentences) <= 3, (s.title, sentences)
        assert s.notes.strip(), s.title
        assert (ROOT / s.preset.page).is_file()
        assert set(s.preset.widgets) <= set(pages.page(s.preset.page).controls), s.title
        if i:
            before = LECTURE[i - 1].preset
            assert (s.preset.page, s.preset.config, dict(s.preset.widgets)) != \
                   (before.page, before.config, dict(before.widgets)), s.title
    shown = {s.preset.page for s in LECTURE}
    assert {"views/equivalence.py", "views/performance.py", "views/norms.py", "views/dp_clipping.py",
            "views/influence.py", "views/geometry.py"} <= shown


def test_every_step_declares_its_figure_and_its_page_marks_the_blocks_it_names():
    """A step's point (issue 41): the title of the figure its narration is about, and the page's blocks that hold it
    (`ui.point(name)`), which the lecture draws first; the browser test at 1024×768 reads that figure."""
    for s in LECTURE:
        assert s.figure.strip(), s.title
        source = (ROOT / s.preset.page).read_text()
        for name in s.point:
            assert f'ui.point("{name}")' in source, (s.title, name)
    assert {s.point[0] for s in LECTURE if s.point} >= {"dp_per_class", "dp_sgd", "influence_proponents", "geo_removal"}


def _lecture(step=None, presenter=False):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    if step is not None:
        at.query_params["step"] = str(step)
    if presenter:
        at.query_params["presenter"] = "true"
    at.switch_page("views/lecture.py")
    at.run()
    assert_clean(at)
    return at


def _button(at, label):
    return next(b for b in at.button if b.label == label)


def _state(at, step):
    """The step's controls as the session has them."""
    keys = [*pages.page(LECTURE[step - 1].preset.page).controls, "dataset", "model", "label_noise", "steps"]
    return {k: at.session_state[k] for k in keys if k in at.session_state}


def test_next_and_back_walk_the_first_steps_and_the_url_reproduces_each():
    at = _lecture(1)
    assert "1/" in at.title[0].value and at.radio(key="eq_example").value == "scalar"
    assert _button(at, "Back").disabled and not _button(at, "Next").disabled
    assert [e.label for e in at.expander][:1] == ["Speaker notes, live room and warm-up"]
    first = _state(at, 1)
    _button(at, "Next").click()
    at.run()
    assert_clean(at)
    assert at.query_params["step"] in ("2", ["2"]) and "2/" in at.title[0].value
    assert at.radio(key="geo_problem").value == "scalar" and at.session_state["geo_paths"] is True
    second = _state(at, 2)
    # a fresh session opened on ?step=2 shows the same view
    fresh = _lecture(2)
    assert _state(fresh, 2) == second and fresh.title[0].value == at.title[0].value
    _button(at, "Back").click()
    at.run()
    assert_clean(at)
    assert at.query_params["step"] in ("1", ["1"]) and _state(at, 1) == first


def test_odd_step_parameters_open_a_valid_step():
    from gradlab.ui.lecture import parse_step

    assert [parse_step(r, 13) for r in ("abc", "0", "-3", "99", "4.0", "nan", "1e400")] == [1, 1, 1, 13, 4, 1, 1]
    at = _lecture("abc")
    assert at.title[0].value.startswith("Lecture 1/")


def test_presenter_mode_enlarges_figure_text():
    def tick_sizes(at):
        # on the axis itself: Streamlit's chart theme replaces the figure's template in the browser
        spec = json.loads(at.get("plotly_chart")[0].proto.spec)
        return spec["layout"]["xaxis"]["tickfont"]["size"], spec["layout"]["xaxis"]["title"]["font"]["size"]

    normal, big = _lecture(2), _lecture(2, presenter=True)
    assert big.toggle(key="presenter").value is True
    assert tick_sizes(big) == (18, 20) and tick_sizes(normal) == (14, 16)


def _view(at):
    """What a step shows: its page's controls as the session has them, and every metric (label, value)."""
    step = int(at.query_params["step"][0] if isinstance(at.query_params["step"], list) else at.query_params["step"])
    controls = {k: at.session_state[k] for k in pages.page(LECTURE[step - 1].preset.page).controls
                if k in at.session_state}
    return controls, [(m.label, m.value) for m in at.metric if "time" not in m.label.lower() and "×" not in m.value]


@pytest.mark.slow
def test_every_step_reached_with_next_shows_what_its_link_shows():
    """Nothing carries over: walking the lecture with Next gives, at each step, the controls and the metric values
    of that step's own link opened fresh (timings excepted: they are measured live)."""
    at = _lecture(1)
    for step in range(1, len(LECTURE) + 1):
        if step > 1:
            _button(at, "Next").click()
            at.run()
            assert_clean(at)
        walked, fresh = _view(at), _view(_lecture(step))
        assert walked == fresh, f"step {step}: {LECTURE[step - 1].title}"
