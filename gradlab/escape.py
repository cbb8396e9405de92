"""User text stays text: one escaping function per medium the pages write to.

A user's string is any text gradlab did not write itself: an uploaded CSV's column, label and file names
(`gradlab.data.load_csv`), a served model's class, feature, leaf and file names and its error messages
(`gradlab.own`, `python -m gradlab serve`, `gradlab.explore`), a URL query parameter. Each medium gets it
through one function, applied where the text enters that medium:

| medium | function | what it would otherwise do with a name |
|---|---|---|
| Streamlit Markdown: `st.markdown`, captions, alerts, metric labels and values, widget labels, help, radio options | `markdown` | `![x](http://…)` loads an image, `[x](http://…)` and `www.x.org` become links, `**x**` bold, `$x$` LaTeX, `:red[x]` colour, `:smile:` an emoji, `# x` a heading |
| Plotly text: titles, axis titles, categories (tick labels), legends, annotations, hover | `plotly` | `<a href>` becomes a link, `<b>` bold, `<br>` a line break, `%{x}` in a hover template another value |
| a CSV cell (exports) | `csv_cell` | `=HYPERLINK(…)`, `+cmd`, `-2+3`, `@SUM(…)` run as formulas in a spreadsheet |

All three start from `visible`: control characters (a newline in a column name) and the invisible Unicode
characters that reorder text (a right-to-left override that shows `gpj.exe` as `exe.jpg`) become visible marks, so
a name is shown on one line as the characters it holds. Tables (`st.dataframe`) and selectbox options draw plain
text and need none of these. No Streamlit here: the library's figure builders and exports use these too.
"""

from __future__ import annotations

import html
import re

#: Unicode's bidirectional formatting characters: invisible, they reorder the text around them (Trojan Source).
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _shown(c: str) -> str:
    code = ord(c)
    if code < 0x20:
        return chr(0x2400 + code)  # Unicode's control pictures: "\n" is shown as ␊, a tab as ␉
    if code == 0x7F:
        return "\u2421"  # ␡
    return f"‹U+{code:04X}›"


_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029" + "".join(sorted(BIDI_CONTROLS)) + "]")


def visible(text) -> str:
    """`str(text)` on one line with nothing hidden: C0 controls as their control pictures (a newline as `␊`, a tab
    as `␉`), other control characters, line and paragraph separators and the bidirectional formatting characters
    as `‹U+202E›`. Everything else, emoji and right-to-left scripts included, is kept as it is."""
    return _INVISIBLE.sub(lambda m: _shown(m.group()), str(text))


# ---------------------------------------------------------------- Markdown


class Refusal(ValueError):
    """gradlab refusing a setting (over the work or the memory budget): a message gradlab writes from its own numbers
    and names only, as Markdown (the control to change in **bold**), so pages show it as written. Any other
    exception's message is shown as text (`markdown`): a `DataError` quotes a user's column names and files, and an
    exception from a served model's code says whatever that code says."""

#: Characters that open a CommonMark, GitHub-flavoured or Streamlit Markdown construct anywhere in a line:
#: `\` escapes, `` ` `` code, `*` `_` emphasis, `[ ]` links, images and `:color[…]` directives, `< >` HTML and
#: autolinks, `&` entities, `$` LaTeX, `:` emoji and `:material/…:` icons and `http:` autolinks, `~` strikethrough,
#: `|` tables, `#` headings, `@` e-mail autolinks. Each is backslash-escaped (CommonMark escapes any ASCII
#: punctuation); other punctuation (`, . ( ) ' " ! ? / = % -`) opens nothing inside a line and stays as it is.
MARKDOWN_SPECIAL = "\\`*_[]<>&$:~|#@"
_MD_SPECIAL = re.compile("[" + re.escape(MARKDOWN_SPECIAL) + "]")
_MD_WWW = re.compile(r"(?i)(www)\.")  # GFM's `www.example.com` autolink
_MD_LINE_START = re.compile(r"^(\s*)([-+=]|\d+(?=[.)]))")  # a list item, a setext underline, `1.` / `1)`
#: What Streamlit's Markdown changes in the text after parsing, where escapes no longer count: GFM links `http://…`,
#: `www.…` and `a@b.org`; `:material/icon:`, `:streamlit:` (an image) and, when the message has a shortcode of its
#: own, `:smile:` become icons; `->`, `<-`, `--`, `>=`, `<=`, `~=` between spaces become arrows and signs. An
#: invisible word joiner (U+2060) goes where it breaks each: before `http`, `www.` and `@`, after every `:`, and
#: between the two characters of each pair.
_MD_TEXT_PASS = re.compile(r"(?i)(?=https?:|www\.|@)|(?<=:)|(?<=[-<>~])(?=[->=])")
WORD_JOINER = "\u2060"


def markdown(text) -> str:
    """`text` as Markdown that shows exactly `visible(text)`: no link, image, HTML, emphasis, code, LaTeX, colour,
    emoji, icon, heading or list, wherever in a message it is placed (a line's start included).

    Markdown characters are backslash-escaped (`MARKDOWN_SPECIAL`). Streamlit also links, draws icons and arrows in
    the text after parsing, where escapes no longer count: invisible word joiners (U+2060) break those patterns
    (`_MD_TEXT_PASS`; the text looks the same, a copy holds the joiners).

    Apply it to the user's part of a message only; the message's own Markdown around it stays Markdown:
    `st.caption(f"label **{escape.markdown(name)}**")`. Not idempotent: escape a string once.
    """
    s = _MD_TEXT_PASS.sub(WORD_JOINER, visible(text))
    s = _MD_SPECIAL.sub(lambda m: "\\" + m.group(), s)
    s = _MD_WWW.sub(r"\1\\.", s)
    return _MD_LINE_START.sub(lambda m: m.group(1) + ("\\" + m.group(2) if not m.group(2).isdigit() else m.group(2) + "\\"),
                              s, count=1)


# ---------------------------------------------------------------- Plotly

def plotly(text, *, template: bool = False) -> str:
    """`text` for a Plotly text field: `visible(text)` with `&`, `<` and `>` as entities, so Plotly's HTML subset
    (`<a href>`, `<b>`, `<br>`, `<span style>`) shows as the characters typed. With `template=True` (a name inside a
    `hovertemplate` or `texttemplate`) `%` is an entity too: `%{x}` in a name is not a placeholder.
    Not idempotent: a figure builder escapes the raw strings it is given, once."""
    s = html.escape(visible(text), quote=False)
    return s.replace("%", "&#37;") if template else s


def plotly_all(values):
    """`plotly` applied to every string in `values` (a string, or a list, tuple or array of values); numbers and
    other values are kept. Returns `values` itself when nothing changes."""
    if isinstance(values, str):
        return plotly(values)
    if isinstance(values, (list, tuple)) or (hasattr(values, "dtype") and getattr(values, "dtype", None) == object):
        out = [plotly(v) if isinstance(v, str) else v for v in values]
        return values if all(a is b for a, b in zip(out, values)) else out
    if getattr(getattr(values, "dtype", None), "kind", "") == "U":
        return [plotly(v) for v in values.tolist()]
    return values


# ---------------------------------------------------------------- CSV cells

#: A spreadsheet runs a cell that starts with one of these as a formula (OWASP "CSV injection"); tab and carriage
#: return are on the list because some spreadsheets skip them before reading the formula.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def csv_cell(value):
    """`value` as a CSV cell that a spreadsheet shows and never runs: a string that starts like a formula
    (`= + - @`, tab, carriage return, also after leading spaces) gets a leading `'`, the quote spreadsheets read
    as "this cell is text" (Excel and LibreOffice hide it). A string that is a plain number (`-1`, `+2.5e3`: a class
    name from a numeric label column) stays as it is: a spreadsheet reads it as that number, not a formula.
    Anything but a string (numbers, negative ones included) is returned unchanged."""
    if not isinstance(value, str):
        return value
    start = value.lstrip(" ")
    if value.startswith(FORMULA_STARTS) or start.startswith(FORMULA_STARTS):
        if _NUMBER.fullmatch(value.strip(" ")):
            return value
        return "'" + value
    return value
