"""Issue 38's goal for user text, in Debian's chromium: a CSV whose column, label and file names hold images, links,
HTML, Markdown and formulas (`tests/hostile.py`, all 22 strings) is uploaded on Gradient norms and the session goes on
to DP clipping and Influence; then a link sets 22 controls to the 22 strings. In the page's DOM there is no `<img>` with an outside source and no `<a>` to a hostile
address (Plotly's SVG links included), no LaTeX, no alert, and the browser requests nothing from the hostile hosts;
the names are on the page as text. Screenshots in screenshots/user_text_*.png. Marked slow.
"""

from __future__ import annotations

from urllib.parse import urlencode, urlparse

import pytest
from conftest import BROWSER_MARKS
from benchmarks.browser import ROOT, page_errors, streamlit_server, wait_until_idle
from hostile import CORPUS, INVISIBLE, LINK_KEYS, batch_csv, hostile_link

pytestmark = BROWSER_MARKS
pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

SHOTS = ROOT / "screenshots"
VIEWPORT = {"width": 1400, "height": 2400}

#: Every element and attribute that would make a hostile string live: images and links (HTML and SVG), scripts,
#: frames, KaTeX's output, and text of an element that only markup makes.
DOM_CHECK = """() => {
  const hostile = (s) => !!s && /invalid|EVIL/.test(s);
  const out = [];
  for (const img of document.querySelectorAll('img, image')) {
    const src = img.getAttribute('src') || img.getAttribute('href') || img.getAttribute('xlink:href');
    if (hostile(src)) out.push('img ' + src);
  }
  for (const a of document.querySelectorAll('a')) {
    const href = a.getAttribute('href') || a.getAttribute('xlink:href');
    if (hostile(href)) out.push('a ' + href);
  }
  for (const el of document.querySelectorAll('script, iframe, object, embed')) {
    if (hostile(el.outerHTML)) out.push(el.tagName + ' ' + el.outerHTML.slice(0, 80));
  }
  for (const el of document.querySelectorAll('.katex, del, s, li, blockquote')) {
    if (/EVIL/.test(el.textContent)) out.push(el.tagName + '.' + el.className + ' ' + el.textContent.slice(0, 80));
  }
  return out;
}"""


def _outside(url: str) -> bool:
    """A request to a hostile host (`x.invalid`, `evil.invalid`): an image or link of a name made live."""
    return "invalid" in (urlparse(url).hostname or "")


def _check(page, requests: list[str], dialogs: list[str], shot: str) -> str:
    wait_until_idle(page, timeout=300)
    page.screenshot(path=str(SHOTS / f"user_text_{shot}.png"), full_page=True)
    assert page_errors(page) == []
    assert page.evaluate(DOM_CHECK) == []
    assert requests == [] and dialogs == []
    return page.locator('[data-testid="stApp"]').inner_text().translate(INVISIBLE)  # as read: word joiners are unseen


def test_a_hostile_csv_is_text_in_chromium(browser):
    SHOTS.mkdir(exist_ok=True)
    with streamlit_server(log_path=SHOTS / "streamlit_user_text.log") as (base, _):
        context = browser.new_context(viewport=VIEWPORT)
        page = context.new_page()
        requests, dialogs = [], []
        page.on("request", lambda r: requests.append(r.url) if _outside(r.url) else None)
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(f"{base}/norms?dataset=upload&model=linear&steps=50&checkpoint_every=25")
        wait_until_idle(page, timeout=300)
        name = CORPUS[4][0] + ".csv"  # "**EVIL05 bold** __strong__.csv"
        page.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(
            files=[{"name": name, "mimeType": "text/csv", "buffer": batch_csv()}])
        page.wait_for_selector('text=132 rows', timeout=120_000)
        text = _check(page, requests, dialogs, "norms")
        # the names are there, as typed: the file, the label column (sidebar caption)
        assert f"{name}: 132 rows, 2 features, label {CORPUS[3][0]} (classification)." in text, text[:3000]

        for label, shot in (("DP clipping", "dp_clipping"), ("Influence", "influence")):
            page.locator('[data-testid="stSidebarNav"]').get_by_text(label, exact=True).click()
            page.wait_for_url(f"**/{shot}**", timeout=60_000)
            text = _check(page, requests, dialogs, shot)
            assert f"label {CORPUS[3][0]} (classification)" in text  # the upload is still this session's
        context.close()

        # a link that sets 22 controls to the 22 strings: the page names each value it could not use, as text
        context = browser.new_context(viewport=VIEWPORT)
        page = context.new_page()
        page.on("request", lambda r: requests.append(r.url) if _outside(r.url) else None)
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(f"{base}/dp_clipping?{urlencode(hostile_link())}")
        text = " ".join(_check(page, requests, dialogs, "link").split())
        for key, (_, shown) in zip(LINK_KEYS, CORPUS):
            assert f"{key}={' '.join(shown.split())}" in text, (key, text[:3000])
        context.close()
