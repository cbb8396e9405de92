"""Results of `ui.cache.shared` are keyed by the page that defines the function (issue 39, item 4).

Streamlit runs every page as `__main__`, and the lecture runs each step's page the same way, so a key on
`fn.__module__` alone let two pages' functions of the same name and parameters share one result.
"""

import runpy
import textwrap
import threading
import time
import uuid

from gradlab.ui import cache

PAGE = """
from gradlab.ui import cache

@cache.shared(gated=False, persist=False)
def calibrated_sigma(epsilon):
    return epsilon * {factor}
"""


def _page(tmp_path, name, factor):
    path = tmp_path / name
    path.write_text(textwrap.dedent(PAGE.format(factor=factor)))
    return runpy.run_path(str(path), run_name="__main__")["calibrated_sigma"]


def test_two_pages_defining_the_same_function_get_two_results(tmp_path):
    dp_clipping, privacy_audit = _page(tmp_path, "dp_clipping.py", 2.0), _page(tmp_path, "privacy_audit.py", 3.0)
    assert dp_clipping.__module__ == privacy_audit.__module__ == "__main__"
    assert dp_clipping(1.5) == 3.0
    assert privacy_audit(1.5) == 4.5  # today's code (key on `__module__`) returned the first page's 3.0
    assert dp_clipping.key(1.5) != privacy_audit.key(1.5)


def test_the_same_page_run_twice_shares_its_result(tmp_path):
    first, again = _page(tmp_path, "norms.py", 2.0), _page(tmp_path, "norms.py", 2.0)
    assert first.key(0.5) == again.key(0.5)


def test_a_page_inside_the_app_is_keyed_by_its_path_relative_to_the_root():
    path = cache._ROOT / "views" / "dp_clipping.py"
    fn = type("F", (), {})()
    fn.__module__ = "__main__"
    fn.__code__ = compile("0", str(path), "eval")
    assert cache.origin(fn) == "views/dp_clipping.py"


def test_sessions_waiting_on_one_key_compute_once_and_log_one_computation(monkeypatch, capsys):
    """A cold room's followers reach the same ungated computation at once: the key's file lock lets one compute, the
    others find its result, and only the computation is logged (`GRADLAB_LOG_RUNS`: 25 lines for one, before)."""
    monkeypatch.setattr(cache, "LOG_RUNS", True)
    calls, tag = [], uuid.uuid4().hex  # a key no earlier test or run stored

    @cache.shared(gated=False)
    def slow_sigma(epsilon, tag):
        calls.append(epsilon)
        time.sleep(0.5)
        return epsilon * 2

    threads = [threading.Thread(target=slow_sigma, args=(1.5, tag)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1.5] and slow_sigma(1.5, tag) == 3.0
    assert capsys.readouterr().err.count("gradlab-compute ") == 1
