"""The presenter and readability CSS targets Streamlit's own element names (`data-testid="stMetricValue"`,
`.stElementContainer`): not a public API. This pins every name it uses to the installed Streamlit's front end, so an
upgrade that renames one fails here instead of silently dropping presenter mode's layout (issue 39, item 7)."""

import re
from pathlib import Path

import streamlit

from gradlab.ui import lecture

CSS = lecture._PRESENTER_CSS + lecture._READABLE_CSS
BUNDLE = Path(streamlit.__file__).parent / "static" / "static" / "js"


def _names_in_css() -> set[str]:
    return set(re.findall(r'data-testid="(st\w+)"', CSS)) | set(re.findall(r"\.(st[A-Z]\w*)", CSS))


def _names_in_streamlit() -> set[str]:
    text = "".join(p.read_text(errors="replace") for p in BUNDLE.glob("*.js"))
    return set(re.findall(r"[`\"'](st[A-Z]\w*)[`\"']", text))


def test_every_selector_names_an_element_of_the_installed_streamlit():
    used, known = _names_in_css(), _names_in_streamlit()
    assert len(used) >= 10, used  # the CSS was read (a broken regex would pass vacuously)
    assert {"stMetricValue", "stElementContainer", "stSidebar"} <= known  # and so was the bundle
    assert not used - known, f"Streamlit {streamlit.__version__} has no element named {sorted(used - known)}"
    assert "stNoSuchElement" not in known
