"""A restarted server answers from the results store on disk: no training, no recomputation."""

import pytest

from conftest import assert_clean, open_page

from gradlab import summary
from gradlab.ui import cache

SETTINGS = dict(steps=30, checkpoint_every=10, seed=11)


def _refuse(*args, **kwargs):
    raise AssertionError("recomputed after a restart instead of reading the store")


def test_a_restarted_server_answers_its_first_visitor_from_disk(monkeypatch):
    first = open_page("norms", **SETTINGS)
    assert_clean(first)
    cache.STORE.clear_memory()  # what a restart leaves: the disk tier only
    monkeypatch.setattr(cache, "fit", _refuse)
    monkeypatch.setattr(summary, "norm_summary", _refuse)
    again = open_page("norms", **SETTINGS)
    assert_clean(again)
    assert [m.value for m in again.metric] == [m.value for m in first.metric]


@pytest.mark.slow  # the warm-up runs two pages in full; the restart test below covers reading them back
def test_the_warm_up_presses_heavy_sections_so_every_visitor_sees_them():
    """`gradlab.warm` fills the store with a page's default view and its button-started sections: the next
    visitor sees the membership attack's and the audit's numbers without pressing anything."""
    from gradlab.ui import warm

    seconds, at = warm.run_page("privacy_audit", press=True)
    assert_clean(at)
    visitor = open_page("privacy_audit")
    assert_clean(visitor)
    labels = {m.label for m in visitor.metric}
    assert {"LiRA AUC, non-private", "ε lower bound, Gaussian DP (95%)"} <= labels
    assert not [b for b in visitor.button if (b.key or "").startswith("run_")]


@pytest.mark.slow  # three runs of the Performance page
def test_a_restarted_server_shows_the_timings_it_measured_on_this_machine(monkeypatch):
    """Timings are kept under the machine's hardware (`bench.machine()`): after a restart the Performance page
    shows the sweep it measured, and when, instead of timing again; on other hardware it times anew."""
    from gradlab import bench

    query = dict(perf_sizes=[4], perf_repeats=1, perf_approaches=["batch"], dataset="moons")
    first = open_page("performance", **query)
    assert_clean(first)
    cache.STORE.clear_memory()
    monkeypatch.setattr(bench, "sweep", _refuse)
    again = open_page("performance", **query)
    assert_clean(again)
    assert any("Timed on this machine at" in c.value for c in again.caption)
    assert again.dataframe[0].value.equals(first.dataframe[0].value)
    monkeypatch.setattr(bench, "machine", lambda: "another machine")
    elsewhere = open_page("performance", **query)
    assert any("refused" in str(e.value) or "recomputed" in str(e.value) for e in [*elsewhere.exception, *elsewhere.error])
