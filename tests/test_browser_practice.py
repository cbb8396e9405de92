"""Browser: a student solves two Practice problems by typing into the editor, fails one with a known pitfall and
reads its diagnosis, then solves that one by choosing its cause, in headless Chromium against a real server (the
sandboxed child processes included)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.browser import CHROMIUM, ROOT, page_errors, streamlit_server, wait_until_idle

from gradlab import practice

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"Debian's chromium is not installed at {CHROMIUM}")]

SHOTS = ROOT / "screenshots"


def _type_and_check(page, code: str) -> str:
    """Replace the editor's text by `code` (as typed), press Check, wait; return the main column's text."""
    editor = page.get_by_role("textbox", name="Your code")
    editor.fill(code)
    editor.press("Control+Enter")  # apply the edit (Streamlit's text area), as a student does before Check
    wait_until_idle(page)
    page.get_by_role("button", name="Check").click()
    page.wait_for_timeout(500)
    wait_until_idle(page, timeout=120)
    assert page_errors(page) == []
    return page.locator('[data-testid="stMainBlockContainer"]').inner_text()


def _pick(page, slug: str) -> None:
    box = page.locator(".st-key-problem")
    box.click()
    page.keyboard.type(slug)
    page.keyboard.press("Enter")
    page.wait_for_timeout(500)
    wait_until_idle(page)


def test_solve_two_problems_by_typing_and_fail_one_with_a_pitfall(browser, tmp_path):
    SHOTS.mkdir(exist_ok=True)
    with streamlit_server(log_path=tmp_path / "server.log") as (base, _):
        page = browser.new_page(viewport={"width": 1280, "height": 1600})
        page.goto(f"{base}/practice")
        wait_until_idle(page)
        text = _type_and_check(page, practice.BY_SLUG["per_example_grads"].solution)
        assert "Correct" in text and "Solved 1 of 10" in text, text[:1500]
        assert "solved=1" in page.url

        _pick(page, "equivalent_two_ways")
        text = _type_and_check(page, practice.BY_SLUG["equivalent_two_ways"].solution)
        assert "Correct" in text and "Solved 2 of 10: 1, 4" in text, text[:1500]
        assert "problem=equivalent_two_ways" in page.url and "solved=1%2C4" in page.url.replace(",", "%2C")

        _pick(page, "fix_in_axes")
        text = _type_and_check(page, practice.BY_SLUG["fix_in_axes"].starter)  # unchanged: the seed's mistake
        assert "Not yet" in text or "ValueError" in text, text[:1500]
        assert "without `in_axes`" in text or "without in_axes" in text, text[:2000]
        assert "Solved 2 of 10" in text
        page.screenshot(path=str(SHOTS / "practice_pitfall.png"), full_page=True)

        causes = practice.BY_SLUG["fix_in_axes"].causes  # or explain it: the right cause solves it
        right = next(i for i, c in enumerate(causes) if c.right)
        page.locator('.st-key-practice_cause_fix_in_axes [data-testid="stRadioOption"]').nth(right).click()
        page.wait_for_timeout(500)
        wait_until_idle(page)
        text = page.locator('[data-testid="stMainBlockContainer"]').inner_text()
        assert "Explained: solved!" in text and "Solved 3 of 10: 1, 2, 4" in text, text[-1500:]
        page.close()
