"""The Practice page under AppTest: Run and Check go through the sandbox; a solved problem lands in the URL; hints
open one at a time; the solution waits behind its toggle; refused code is a message; the page can be turned off."""

import importlib

import pytest

from conftest import assert_clean, open_page
from gradlab import practice


def texts(elements):
    return " ".join(e.value for e in elements)


@pytest.fixture(scope="module")
def page():
    at = open_page("practice")
    assert_clean(at)
    return at


def test_opens_on_the_first_problem_with_its_starter_code(page):
    at = page
    assert at.selectbox(key="problem").value == "per_example_grads"
    assert at.text_area(key="practice_code_per_example_grads").value == practice.PROBLEMS[0].starter
    assert "per_example_grads(w, b, x_batch, y_batch)" in texts(at.markdown)
    assert not at.success and not at.error and at.get("progress")[0].proto.text == "Solved 0 of 10"


def test_a_pitfall_is_diagnosed_then_the_fix_is_solved_and_recorded_in_the_url(page):
    at = page
    at.text_area(key="practice_code_per_example_grads").set_value(practice.BY_SLUG["per_example_grads"].pitfalls[0].example)
    at.button(key="practice_check").click().run()
    assert_clean(at)
    assert "A summed gradient instead of per-example ones" in texts(at.warning), [e.value for e in at.error]
    assert "solved" not in at.query_params
    at.text_area(key="practice_code_per_example_grads").set_value(practice.PROBLEMS[0].solution)
    at.button(key="practice_check").click().run()
    assert_clean(at)
    assert "Correct" in texts(at.success)
    assert at.query_params["solved"] in ("1", ["1"])


def test_refused_code_is_a_message_and_run_shows_output(page):
    at = page
    at.text_area(key="practice_code_per_example_grads").set_value("import os\nprint(os.environ)\n")
    at.button(key="practice_run").click().run()
    assert_clean(at)
    assert "was not run" in texts(at.error) and "import os" in texts(at.error)
    at.text_area(key="practice_code_per_example_grads").set_value(practice.PROBLEMS[0].solution + "print('hello')\n")
    at.button(key="practice_run").click().run()
    assert_clean(at)
    assert any("hello" in c.value for c in at.code)


def test_back_to_the_starter_code(page):
    at = page
    at.text_area(key="practice_code_per_example_grads").set_value("# my attempt\n")
    at.button(key="practice_reset").click().run()
    assert_clean(at)
    assert at.text_area(key="practice_code_per_example_grads").value == practice.PROBLEMS[0].starter
    assert not at.warning  # no "default value and Session State" warning from Streamlit


def test_hints_one_at_a_time_and_the_solution_behind_a_toggle(page):
    at = page
    assert not [i for i in at.info if "Hint 1" in i.value]
    at.button(key="practice_hint").click().run()
    assert [i for i in at.info if "Hint 1" in i.value] and not [i for i in at.info if "Hint 2" in i.value]
    assert not any(c.value == practice.PROBLEMS[0].solution.strip() for c in at.code)
    at.toggle(key="practice_solution_per_example_grads").set_value(True).run()
    assert any(c.value.strip() == practice.PROBLEMS[0].solution.strip() for c in at.code)


def test_a_link_opens_problem_n_with_progress():
    from streamlit.testing.v1 import AppTest

    from conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.query_params["problem"] = "dp_sgd_step"
    at.query_params["solved"] = "1,3"
    at.switch_page("views/practice.py")
    at.run()
    assert_clean(at)
    assert at.selectbox(key="problem").value == "dp_sgd_step"
    assert at.get("progress")[0].proto.text == "Solved 2 of 10: 1, 3"
    assert at.query_params["solved"] in ("1,3", ["1,3"])


def test_practice_off_leaves_the_page_out(monkeypatch):
    from gradlab.ui import pages

    monkeypatch.setenv("GRADLAB_PRACTICE", "off")
    try:
        assert "practice" not in {p.url_path for p in importlib.reload(pages).PAGES}
    finally:
        monkeypatch.undo()
        assert "practice" in {p.url_path for p in importlib.reload(pages).PAGES}


def _linked_steps():
    from gradlab.ui.presets import LECTURE

    return [(i, s.practice) for i, s in enumerate(LECTURE, 1) if s.practice]


def test_lecture_steps_name_existing_practice_problems():
    linked = _linked_steps()
    assert len(linked) >= 5 and all(slug in practice.BY_SLUG for _, slug in linked)
    assert linked[0] == (1, "per_example_grads")  # the seeds' example: the first problem


@pytest.mark.slow  # a lecture step runs its page (the equivalence of the seeds' example)
def test_a_lecture_step_links_to_its_practice_problem():
    """A step with a problem shows a link that opens Practice on it (`?problem=<slug>`)."""
    from streamlit.testing.v1 import AppTest

    from conftest import ROOT

    step, slug = _linked_steps()[0]
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.query_params["step"] = str(step)
    at.switch_page("views/lecture.py")
    at.run()
    assert_clean(at)
    links = [e.proto for e in at.get("page_link")]
    link = next(x for x in links if "Try it yourself" in x.label)
    assert link.page.endswith("practice") and f"problem={slug}" in link.query_string, link


def test_a_link_to_an_unknown_problem_says_so():
    from streamlit.testing.v1 import AppTest

    from conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.query_params["problem"] = "nonsense"
    at.switch_page("views/practice.py")
    at.run()
    assert_clean(at)
    assert at.selectbox(key="problem").value == "per_example_grads"
    assert "problem=nonsense" in texts(at.warning), texts(at.warning)


@pytest.mark.slow  # its own app session (~5 s)
def test_a_fix_it_problem_is_solved_by_choosing_its_cause():
    """A wrong cause is answered with why it is not the reason (not solved); the right one solves the problem."""
    from streamlit.testing.v1 import AppTest

    from conftest import ROOT

    p = practice.BY_SLUG["fix_mean"]
    wrong, right = next(c for c in p.causes if not c.right), next(c for c in p.causes if c.right)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.query_params["problem"] = "fix_mean"
    at.switch_page("views/practice.py")
    at.run()
    assert_clean(at)
    assert p.question in texts(at.markdown) and at.radio(key="practice_cause_fix_mean").value is None
    at.radio(key="practice_cause_fix_mean").set_value(wrong.text).run()
    assert wrong.why in texts(at.error) and "solved" not in at.query_params
    at.radio(key="practice_cause_fix_mean").set_value(right.text).run()
    assert_clean(at)
    assert right.why in texts(at.success) and at.query_params["solved"] in ("6", ["6"])
    assert at.get("progress")[0].proto.text == "Solved 1 of 10: 6"


def test_without_an_os_sandbox_a_shared_server_offers_files_and_runs_nothing(monkeypatch):
    """Fail closed: the OS wall cannot be set up and the server is not bound to localhost. The page says why, Run and
    Check are disabled, the problem downloads as a file, and the "choose the cause" questions still answer."""
    from gradlab.practice import sandbox

    monkeypatch.setattr(sandbox, "os_wall", lambda: "bubblewrap is not installed")
    monkeypatch.setattr(sandbox, "execute", lambda *a, **k: pytest.fail("free-form code ran"))
    at = open_page("practice", problem="fix_in_axes")
    assert_clean(at)
    assert "runs no free-form code: bubblewrap is not installed" in texts(at.warning)
    assert at.button(key="practice_run").disabled and at.button(key="practice_check").disabled
    right = next(c.text for c in practice.BY_SLUG["fix_in_axes"].causes if c.right)
    at.radio(key="practice_cause_fix_in_axes").set_value(right).run()
    assert "Explained: solved!" in texts(at.success)


def test_the_problem_as_a_file_checks_the_seeds_input_locally(tmp_path):
    """`practice.as_file`: the starter says "Not yet", the reference solution "Correct", run as a plain script."""
    import subprocess
    import sys

    p = practice.BY_SLUG["per_example_grads"]
    text = practice.as_file(p)
    for code, verdict in ((text, "Not yet"), (text.replace(p.starter.rstrip(), p.solution.rstrip()), "Correct")):
        path = tmp_path / "p.py"
        path.write_text(code)
        done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
        assert verdict in done.stdout, (done.stdout, done.stderr[-500:])


def test_a_session_pressing_run_too_often_is_asked_to_slow_down(monkeypatch):
    from gradlab.ui import cache

    monkeypatch.setattr(cache, "PRACTICE_PER_MINUTE", 1)
    at = open_page("practice")
    at.button(key="practice_run").click().run()
    assert "Slow down" not in texts(at.error)
    at.button(key="practice_run").click().run()
    assert_clean(at)
    assert "Slow down" in texts(at.error) and "at most 1 run a minute" in texts(at.error)
