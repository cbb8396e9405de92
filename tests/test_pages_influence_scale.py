"""AppTest: the Influence page where θ̂ does not fit (issue 40), at small settings: the digits MLP with the cost rates
patched so that θ̂'s L-BFGS and a pass per click look as they do on seed 003's 1.2 M-parameter CNN. The page opens on
projected gradients at the trained checkpoint, shows proponents and opponents as images, says what does not fit and
why, and answers a further test point without another pass over the training set."""

from __future__ import annotations

import pytest

from conftest import FAST, assert_clean, open_page


@pytest.mark.slow  # trains the digits MLP and opens the page twice (~20 CPU-s)
def test_influence_page_at_the_checkpoint_when_theta_hat_does_not_fit(monkeypatch):
    from gradlab import costs, engine

    monkeypatch.setattr(costs, "LBFGS_RATE", 1e3)      # θ̂ (and retraining) would take hours
    monkeypatch.setattr(costs, "PASS_FACTOR", 2e4)     # a streamed pass per click costs seconds
    calls = []
    project = engine.per_example_projections
    monkeypatch.setattr(engine, "per_example_projections", lambda *a, **k: calls.append(len(a[2])) or project(*a, **k))

    at = open_page("influence", **dict(FAST, label_noise=0.1))
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert at.selectbox(key="infl_method").value == "logra"           # the default that fits
    assert any("Opened on" in i.value and "does not fit" in i.value for i in at.info)
    assert any(h.value.startswith("Proponents and opponents: Projected gradients") for h in at.subheader)
    assert any("θ̂ is not converged here" in i.value and "L-BFGS" in i.value for i in at.info)
    assert any("retraining check does not fit" in i.value for i in at.info)
    assert any("Not computed beside the picked method" in c.value and "grad dot" in c.value for c in at.caption)
    assert [m for m in at.metric if m.label.startswith("AUC · projected")]  # its self-influence, from its features
    assert not [m for m in at.metric if m.label.startswith("‖∇F(θ̂)‖")]
    assert calls == [1437 + 360]  # one pass over the training and the test set

    at.number_input(key="infl_test").set_value(5)
    at.run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert calls == [1437 + 360]  # a click is a lookup: no pass over the training (or test) set

    # picking a method that needs θ̂ says why it does not fit and keeps the one that does
    at.selectbox(key="infl_method").set_value("influence")
    at.run()
    assert_clean(at)
    assert any("does not fit this server" in w.value and "θ̂" in w.value for w in at.warning)
    assert any(h.value.startswith("Proponents and opponents: Projected gradients") for h in at.subheader)
