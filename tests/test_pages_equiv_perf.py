"""AppTest: the Equivalence and Performance pages render, and their main controls work."""

from conftest import FAST, assert_clean, open_page


def _texts(at):
    return " ".join(m.value for m in at.markdown) + " ".join(str(c.value) for c in at.code)


def test_equivalence_page_experiment_scalar_and_mean():
    at = open_page("equivalence", **FAST)
    assert_clean(at)
    # no error box: the two pitfalls that raise show JAX's message as an expected outcome, not an app failure
    assert not at.error, [e.value for e in at.error]
    assert sum("Expected: this is the error JAX gives" in c.value for c in at.caption) == 2
    labels = [m.label for m in at.metric]
    assert any("float32" in l for l in labels) and any("float64" in l for l in labels)
    # the pitfalls ran live: the real JAX error is on the page, and the seeds' [2., 8.]
    assert any("vmap was requested to map its argument along axis 0" in c.value for c in at.code)
    assert "[2., 8.]" in _texts(at)

    at.radio(key="eq_example").set_value("scalar").run()
    assert_clean(at)
    assert any("**10**" in m.value for m in at.markdown)
    at.radio(key="eq_reduction").set_value("mean").run()
    assert_clean(at)
    ratio = next(m for m in at.metric if "‖Σ gᵢ‖" in m.label)
    assert ratio.value == "2.0"  # N = 2 examples: sum vs mean differ by N


def test_performance_page_sweep_and_controls():
    at = open_page("performance", perf_sizes=[4, 16], perf_repeats=1, **FAST)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert any("speed-up" in m.label for m in at.metric)
    at.multiselect(key="perf_approaches").set_value(["vmap", "rules", "batch", "norms_vmap", "norms"]).run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert any("streamed norms / batch" in m.label for m in at.metric)


def test_the_scalar_example_draws_the_seeds_numbers():
    """Step 1's point as a figure, on Equivalence and as Home's picture: bars g1 = 2, g2 = 8, their sum 10 and the
    summed loss's gradient 10."""
    import json

    for at in (open_page("equivalence", eq_example="scalar"), open_page("home")):
        assert_clean(at)
        bars = json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]
        assert bars["type"] == "bar" and [float(v) for v in bars["y"]] == [2.0, 8.0, 10.0, 10.0]
