"""The privacy audit page under AppTest: membership inference and the DP-SGD audit, controls exercised."""

import pytest

from conftest import assert_clean, open_page
from gradlab import audit

SMALL = dict(mia_pool=64, mia_steps=40, mia_shadows=2, mia_q=0.5, audit_trials=4096)


def metric(at, label):
    return next(m.value for m in at.metric if m.label == label)


def press(at, *names):
    """Press the heavy sections' buttons (a link alone never starts them)."""
    for name in names:
        if f"run_{name}" in {b.key for b in at.button}:  # absent when the result is already stored
            at.button(key=f"run_{name}").click()
            at.run()
    return at


@pytest.fixture(scope="module")
def page():
    at = press(open_page("privacy_audit", steps=50, checkpoint_every=25, **SMALL), "mia", "audit")
    assert_clean(at)
    return at


@pytest.mark.slow  # two page loads; the refusal itself: test_robustness's budget tests
def test_a_link_starts_nothing_heavy_and_one_over_budget_says_what_fits():
    """Opening the page shows buttons with their estimates, not results; the crafted link's attack (about 56
    CPU-s) is refused with its cost and the largest setting that fits; its audit (about 10 CPU-s) waits for a press."""
    # settings no other test computes (σ = 2.75): a result another test stored would show without its button
    at = open_page("privacy_audit", steps=50, checkpoint_every=25, **dict(SMALL, mia_pool=60, audit_trials=16384,
                                                                           audit_sigma=2.75))
    assert_clean(at)
    assert not [m for m in at.metric if m.label.startswith("LiRA")]
    assert {b.key for b in at.button} >= {"run_mia", "run_audit"}
    assert any("about" in b.label for b in at.button if b.key == "run_mia")
    heavy = open_page("privacy_audit", steps=50, checkpoint_every=25, mia_shadows=16, mia_steps=2000, mia_pool=1437,
                      audit_trials=262144, audit_steps=16)
    assert_clean(heavy)
    warnings = [w.value for w in heavy.warning if "CPU-seconds" in w.value]
    assert len(warnings) == 1 and "training steps" in warnings[0], [w.value for w in heavy.warning]
    assert "run_mia" not in {b.key for b in heavy.button} and "run_audit" in {b.key for b in heavy.button}
    assert not [m for m in heavy.metric if m.label.startswith(("LiRA", "ε lower bound"))]


def test_membership_and_audit_render(page):
    at = page
    assert float(metric(at, "LiRA AUC, non-private")) > 0.5
    claimed = float(metric(at, "Accountant's ε (PLD)"))
    assert claimed == pytest.approx(1.99, abs=0.01)  # σ = 2, one step, full batch
    bounds = {name: float(metric(at, f"ε lower bound, {name} (95%)")) for name in audit.ESTIMATORS}
    assert all(0.0 <= b <= claimed for b in bounds.values()), bounds
    assert any("No violation" in s.value for s in at.success)
    # the page names the tightest estimator and says why, in one sentence
    best = max(bounds, key=bounds.get)
    assert any(m.value.startswith(f"**{best}** is the tightest") and audit.ESTIMATORS[best].why in m.value
               for m in at.markdown)
    table = next(d.value for d in at.dataframe if "estimator" in d.value.columns)
    assert list(table["estimator"]) == list(audit.ESTIMATORS) and set(table["confidence"]) == {0.95}
    assert len(at.get("plotly_chart")) >= 4


def test_planted_bug_is_caught_on_the_page(page):
    at = page
    at.selectbox(key="audit_bug").set_value("no per-example clipping")
    at.number_input(key="audit_sigma").set_value(1.0)
    press(at.run(), "audit")  # new settings: the audit waits for a press again
    assert_clean(at)
    assert any("caught a bug" in e.value for e in at.error)
    for name in audit.ESTIMATORS:  # every estimator sees this one
        assert float(metric(at, f"ε lower bound, {name} (95%)")) > float(metric(at, "Accountant's ε (PLD)"))


def test_bad_setting_is_a_message_not_a_traceback(page):
    at = page
    at.radio(key="audit_canary").set_value("input")
    at.number_input(key="audit_q").set_value(0.5)
    at.number_input(key="mia_c").set_value(0.0)  # C = 0 is refused with a message; the audit still runs
    press(at.run(), "audit")
    assert_clean(at)
    assert any("Membership inference could not run" in e.value for e in at.error)
    assert float(metric(at, "Accountant's ε (PLD)")) > 0
    # q < 1: the Gaussian estimators are shown as estimates and the tightest named is an assumption-free one
    assert any("not Gaussian" in c.value for c in at.caption)
    assert any(m.value.startswith("**Clopper–Pearson** is the tightest") for m in at.markdown)


def test_a_second_visitor_sees_the_same_numbers_and_no_error():
    """Both sections are shared results: the second session is served the first one's stored numbers without
    pressing anything, with no error box (it used to replay the first session's progress bar and fail)."""
    first = press(open_page("privacy_audit", steps=50, checkpoint_every=25, **SMALL), "mia", "audit")
    second = open_page("privacy_audit", steps=50, checkpoint_every=25, **SMALL)
    for at in (first, second):
        assert_clean(at)
        assert not at.error, [e.value for e in at.error]
    for label in ("LiRA AUC, non-private", "ε lower bound, Gaussian DP (95%)", "ε lower bound, Clopper–Pearson (95%)"):
        assert metric(first, label) == metric(second, label)
