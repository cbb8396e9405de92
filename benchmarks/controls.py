"""Change one of a page's controls in the browser, whatever its kind, as a visitor would (click, arrow key, type).

`change(page, key)` finds the control by its key (Streamlit gives its block the class `st-key-<key>`; every page
control's key is its URL parameter, `gradlab.ui.pages`) and moves it to another value: a toggle or checkbox flips, a
number input steps (up, or down at its maximum; an empty one gets 1), a slider moves one notch (back at its end), a
radio picks another option, a selectbox or multiselect another item. Used by tests/test_browser_figures_links.py.
No pytest here.
"""

from __future__ import annotations


def _value(page, key: str) -> str:
    return page.locator(f".st-key-{key}").first.evaluate(
        """(el) => [...el.querySelectorAll('input')].map((i) => i.type === 'checkbox' || i.type === 'radio'
              ? String(i.checked) : (i.getAttribute('aria-valuetext') || i.value)).join('|')
              + '|' + el.innerText""")


def present(page, key: str) -> bool:
    """Whether the page shows control `key` now."""
    return page.locator(f".st-key-{key}").count() > 0 and page.locator(f".st-key-{key}").first.is_visible()


def change(page, key: str) -> str:
    """Move control `key` on `page` to another value; **returns** the kind of control it was. **Raises**
    `LookupError` when the page does not show it, `RuntimeError` when nothing changed."""
    block = page.locator(f".st-key-{key}").first
    if not present(page, key):
        raise LookupError(key)
    block.scroll_into_view_if_needed()
    if block.locator("input").count() and all(i.is_disabled() for i in block.locator("input").all()):
        raise RuntimeError(f"control {key!r} is disabled")
    before = _value(page, key)
    kind = block.evaluate("""(el) => { const t = el.querySelector('[data-testid^="st"]'); return t ? t.dataset.testid : ''; }""")
    inner = lambda testid: block.locator(f'[data-testid="{testid}"]').count() > 0  # noqa: E731
    if inner("stCheckbox") or inner("stToggle") or block.locator('input[type="checkbox"]').count():
        kind = "toggle"
        block.locator("label").first.click()
    elif inner("stRadio") or block.locator('input[type="radio"]').count():
        kind = "radio"
        labels = block.locator('label:has(input[type="radio"])')
        now = labels.evaluate_all("(ls) => ls.findIndex((l) => l.querySelector('input').checked)")
        labels.nth((now + 1) % labels.count()).click()
    elif inner("stNumberInput"):
        kind = "number"
        field = block.locator("input").first
        up, down = block.locator('[data-testid="stNumberInputStepUp"]'), block.locator('[data-testid="stNumberInputStepDown"]')
        if not field.input_value():
            field.fill("1")
            field.press("Enter")
        elif up.count() and up.first.is_visible() and up.first.is_enabled():
            up.first.click()
        elif down.count() and down.first.is_visible() and down.first.is_enabled():
            down.first.click()
        else:  # a narrow column hides the step buttons: the keyboard steps, Enter commits
            field.focus()
            field.press("ArrowUp")
            field.press("Enter")
            page.wait_for_timeout(150)
            if _value(page, key) == before:
                field.press("ArrowDown")
                field.press("Enter")
    elif inner("stSlider") or block.locator('input[type="range"]').count():
        kind = "slider"  # react-aria's slider: a hidden range input takes the keys
        knob = block.locator('input[type="range"]').first
        knob.focus()
        knob.press("ArrowRight")
        page.wait_for_timeout(150)
        if _value(page, key) == before:
            knob.press("ArrowLeft")
    elif inner("stMultiSelect"):
        kind = "multiselect"
        block.locator("input").first.click()
        page.locator('[role="option"]').first.click()
        page.keyboard.press("Escape")
    elif inner("stSelectbox"):
        kind = "selectbox"
        block.locator("input").first.click()
        options = page.locator('[role="option"]')
        options.first.wait_for()
        now = options.evaluate_all("(os) => os.findIndex((o) => o.getAttribute('aria-selected') === 'true')")
        options.nth((now + 1) % options.count()).click()
    else:
        raise RuntimeError(f"control {key!r}: no way to change a {kind or 'block'}")
    page.wait_for_timeout(150)
    if _value(page, key) == before:
        raise RuntimeError(f"control {key!r} ({kind}) did not change from {before[:80]!r}")
    return kind
