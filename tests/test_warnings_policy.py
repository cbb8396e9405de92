"""pytest.ini makes DeprecationWarnings errors (issue 42): a removal JAX, jaxlib, Equinox, Optax, Flax or Streamlit
announces fails the suite. An `ignore` may only name a warning a dependency raises from its own internals, never one
of those packages' deprecations as a whole, and says why on the comment line above it."""

import configparser
import re
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("jax", "jaxlib", "equinox", "optax", "flax", "streamlit")


def test_deprecations_are_errors_and_every_ignore_is_named_with_a_reason():
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "pytest.ini")
    lines = [ln.strip() for ln in ini["pytest"]["filterwarnings"].splitlines() if ln.strip()]
    assert lines[0] == "error::DeprecationWarning"
    raw = (ROOT / "pytest.ini").read_text().splitlines()
    for ln in lines[1:]:
        action, message, category, module = (ln.split(":") + ["", "", ""])[:4]
        assert action != "ignore" or message, f"an ignore without a message names no single warning: {ln}"
        assert not (action == "ignore" and "Deprecation" in category and not message), ln
        assert module.split(".")[0] not in PACKAGES or message, f"a whole package's deprecations ignored: {ln}"
        at = next(i for i, r in enumerate(raw) if r.strip() == ln)
        assert raw[at - 1].strip().startswith("#"), f"no reason on the line above: {ln}"


def test_a_deprecation_in_a_test_is_an_error():
    assert any(f[0] == "error" and f[2] is DeprecationWarning for f in warnings.filters), warnings.filters[:5]
    try:
        warnings.warn("gone in the next release", DeprecationWarning, stacklevel=1)
    except DeprecationWarning:
        return
    raise AssertionError("a DeprecationWarning did not raise")


def test_no_source_file_silences_deprecations_for_itself():
    """The same rule in code: no `filterwarnings("ignore", category=DeprecationWarning)` without a message."""
    pattern = re.compile(r"filterwarnings\(\s*[\"']ignore[\"']\s*,\s*category\s*=\s*DeprecationWarning\s*\)")
    offenders = [str(p.relative_to(ROOT)) for d in ("gradlab", "views", "tests") for p in (ROOT / d).rglob("*.py")
                 if p.name != Path(__file__).name and pattern.search(p.read_text())]
    offenders += ["app.py"] if pattern.search((ROOT / "app.py").read_text()) else []
    assert offenders == []
