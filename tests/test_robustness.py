"""Extreme settings give messages, not crashes, on the pages that exist: a huge learning rate,
no training at all, almost all labels flipped, the widest/deepest model, an empty upload link."""

from __future__ import annotations

import pytest
from conftest import assert_clean, open_page

EXTREMES = {
    "lr=100 diverges": dict(dataset="moons", lr=100.0, optimizer="sgd", steps=50, checkpoint_every=25),
    "no training": dict(dataset="moons", steps=0),
    "95% labels flipped": dict(dataset="blobs", label_noise=0.95, steps=25, checkpoint_every=25),
    "regression, huge lr (Adam)": dict(dataset="line_outliers", model="linear", lr=100.0, steps=25, checkpoint_every=25),
}


@pytest.mark.parametrize("page", ["norms", "influence"])
@pytest.mark.parametrize("case", list(EXTREMES))
def test_extreme_settings_give_messages_not_tracebacks(page, case):
    at = open_page(page, **EXTREMES[case])
    assert_clean(at)
    text = " ".join(e.value for e in at.error) + " ".join(w.value for w in at.warning)
    if case.startswith("lr=100"):
        # the run diverges: the page must say so (and what to change) instead of showing numbers
        assert "learning rate" in text.lower() or "diverge" in text.lower() or "nan" in text.lower(), text


def test_upload_link_without_data_asks_for_a_file():
    """A shared link with dataset=upload opens without the uploader's data: a message, no crash."""
    at = open_page("norms", dataset="upload")
    assert_clean(at)
    assert any("upload a CSV" in i.value for i in at.info)
    assert not at.metric
