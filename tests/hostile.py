"""Hostile user text and the oracles that say whether a page showed it as text (issue 38, item 7).

`CORPUS`: 22 strings a visitor can put in a CSV's column names and label values (or a served model's names, or a
link), each holding a marker `EVILnn` inside its markup, and the text a page must show for it (`visible`: one line,
nothing hidden). `hostile_csvs()` builds 22 CSVs from them; `batch_csv()` one CSV whose label column holds all 22.

The oracles render what a page sends the browser and look for the markers:
- `markdown_problems(source)`: CommonMark + GFM tables and strikethrough (markdown-it-py, raw HTML on, so an
  unescaped `<img>` is an element), plus the constructs Streamlit adds (LaTeX `$…$`, `:color[…]` directives,
  `:emoji:` and `:material/…:` shortcodes, GFM's bare-URL and e-mail autolinks), matched as Streamlit's own
  frontend matches them;
- `plotly_problems(figure)`: Plotly's HTML subset as plotly.js renders text (tags, entities, `%{…}` placeholders);
- `csv_problems(data)`: a spreadsheet's formula rule.
Each returns a list of problems (empty: every marker it saw was shown as exactly its text).
"""

from __future__ import annotations

import csv
import html
import io
import json
import re

import numpy as np

#: (raw string, what a page must show). Markers EVIL01–EVIL22 sit inside each string's markup.
CORPUS: list[tuple[str, str]] = [
    ("<img src=http://x.invalid/EVIL01.png onerror=alert(1)>",) * 2,
    ("[EVIL02 link](http://evil.invalid/EVIL02)",) * 2,
    ("![EVIL03](http://x.invalid/EVIL03.png)",) * 2,
    ('<a href="http://evil.invalid/EVIL04">EVIL04 click</a>',) * 2,
    ("**EVIL05 bold** __strong__",) * 2,
    ("$\\alpha_{EVIL06}$ and $$x EVIL06$$",) * 2,
    (":red[EVIL07 red] :blue-background[EVIL07]",) * 2,
    ('=HYPERLINK("http://evil.invalid/EVIL08","click")',) * 2,
    ("+cmd|' /C calc'!A0 EVIL09",) * 2,
    ("@SUM(1+1)*cmd EVIL10",) * 2,
    ("`EVIL11 code` ``x``",) * 2,
    ("EVIL12 line one\n# heading\n\n- item", "EVIL12 line one␊# heading␊␊- item"),
    ("EVIL13" + "_long" * 80,) * 2,
    ("EVIL14 \u202egnp.exe\u202c", "EVIL14 ‹U+202E›gnp.exe‹U+202C›"),
    ("www.evil.invalid/EVIL15",) * 2,
    ("http://evil.invalid/EVIL16 and <http://evil.invalid/EVIL16>",) * 2,
    ("EVIL17 <script>alert(1)</script>",) * 2,
    (":material/warning: :EVIL18: :streamlit: :smile: a -> b <= c",) * 2,
    ("- EVIL19 list",) * 2,
    ("~~EVIL20 strike~~ _em_ *em* > quote",) * 2,
    ("1. EVIL21 &amp; &lt;b&gt; \\*",) * 2,
    ("<b>EVIL22</b> %{EVIL22} EVIL22@evil.invalid <br> &",) * 2,
]
assert len(CORPUS) == 22 and all(f"EVIL{i:02d}" in raw for i, (raw, _) in enumerate(CORPUS, start=1))
MARKER = re.compile(r"EVIL(\d\d)")


def shown(i: int) -> str:
    """What a page shows for corpus string `i` (0-based)."""
    return CORPUS[i][1]


def _write(header: list[str], rows: list[list]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue().encode()


def csv_bytes(features: list[str], label: str, classes: list[str], *, rows_per_class: int = 8, seed: int = 0) -> bytes:
    """A CSV with 2-D numeric features named `features`, a label column `label` holding `classes`: separable blobs."""
    rng = np.random.default_rng(seed)
    rows = []
    for k, name in enumerate(classes):
        centre = 3 * np.array([np.cos(2 * np.pi * k / len(classes)), np.sin(2 * np.pi * k / len(classes))])
        for _ in range(rows_per_class):
            x = centre + rng.normal(scale=0.5, size=2)
            rows.append([*(f"{v:.4f}" for v in x[: len(features)]), name])
    return _write([*features, label], rows)


def hostile_csvs() -> list[tuple[str, bytes]]:
    """22 CSVs: CSV i names its two features after corpus strings i and i+1, its label column after i+2, and its
    three classes after i+3, i+4, i+5 (mod 22). Every string is a feature, the label column and a class somewhere."""
    out = []
    n = len(CORPUS)
    for i in range(n):
        raw = [CORPUS[(i + j) % n][0] for j in range(6)]
        out.append((f"hostile_{i + 1:02d}.csv", csv_bytes(raw[:2], raw[2], raw[3:])))
    return out


def batch_csv(rows_per_class: int = 6) -> bytes:
    """One CSV with every corpus string: two features named after strings 1 and 2, the label column after 4, and
    22 classes named after all 22 (so every page that names classes shows all of them)."""
    return csv_bytes([CORPUS[0][0], CORPUS[1][0]], CORPUS[3][0], [raw for raw, _ in CORPUS],
                     rows_per_class=rows_per_class)


#: 22 controls DP clipping draws for a linear model (sidebar and page): a link may set each to anything, and the page
#: names every value it could not use (`ui.url_warnings`).
LINK_KEYS = ["dataset", "lr", "label_noise", "seed", "optimizer", "batch_size", "l2", "dp_clip_checkpoint", "dp_clip_c",
             "dp_clip_sigma", "dp_clip_batch", "dp_clip_log", "dp_sgd_q", "dp_sgd_steps", "dp_sgd_c", "dp_sgd_opt",
             "dp_sgd_mode", "dp_sgd_eps", "dp_sgd_lr", "dp_sgd_delta", "dp_sgd_accountant", "dp_sgd_seed"]


def hostile_link() -> dict[str, str]:
    """DP clipping's query parameters with each of the 22 strings as a control's value (a linear model, 50 steps)."""
    return {"model": "linear", "steps": "50", "checkpoint_every": "25",
            **{key: raw for key, (raw, _) in zip(LINK_KEYS, CORPUS)}}


# ---------------------------------------------------------------- Markdown as Streamlit renders it

def _markdown_it():
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


_TAG = re.compile(r"<[^>]*>")
# Streamlit's frontend (StreamlitMarkdown.js): LaTeX after code and escapes are cut out; emoji shortcodes; directives
_SKIP = re.compile(r"(?m)^ {0,3}(`{3,}|~{3,})[\s\S]*?(?:\n[ \t]*\1|\Z)"  # a fenced block
                   r"|\\[!-/:-@\[-`{-~]"  # a backslash escape (CommonMark: any ASCII punctuation)
                   r"|(?<!`)(`+)[^`\n]+\2(?!`)")  # a code span
_EXTRAS = {
    "LaTeX block": re.compile(r"(?<!\$)\$\$+(?!\$)[\s\S]*?\$\$"),
    "LaTeX": re.compile(r"(?<!\$)\$(?![\s$])[^$\n]*?[^\s$]\$(?!\d)"),
    "emoji or icon shortcode": re.compile(r":[\w+-][\w_+/-]*:"),
    "directive": re.compile(r":[a-z][a-z0-9-]*\[[^\]]*\]"),
    "bare URL autolink": re.compile(r"(?i)\b(?:https?://|ftp://|www\.)[^\s<]+"),
    "e-mail autolink": re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"),
}
# GFM's second pass (mdast-util-gfm-autolink-literal, in Streamlit's bundle): bare URLs and e-mail addresses found in
# the parsed text, escapes already resolved, when the character before is a line's start, a space or punctuation
_TEXT_URL = re.compile(r"(https?://|www(?=\.))([-.\w]+)([^ \t\r\n]*)", re.I | re.ASCII)
_TEXT_EMAIL = re.compile(r"([-.\w+]+)@([-\w]+(?:\.[-\w]+)+)", re.ASCII)
#: Zero-width characters a reader does not see (`gradlab.escape.markdown` puts a word joiner before `http`, `www.`, `@`)
INVISIBLE = dict.fromkeys(map(ord, "\u2060\u200b"))


def _linkable_after(text: str, start: int, email: bool) -> bool:
    import unicodedata

    if start == 0:
        return True
    c = text[start - 1]
    return (c.isspace() or unicodedata.category(c)[0] in "PS") and not (email and c == "/")


# Streamlit's own passes over the parsed text (StreamlitMarkdown.js): icons, its logo, emoji (loaded when the raw
# source has a shortcode), arrows and signs between spaces
_TEXT_ICON = re.compile(r":(material_[\w-]+|streamlit):")
_EMOJI_NEEDED = re.compile(r":(?!material/|streamlit:)[\w+-][\w_+-]*:")
_TEXT_EMOJI = re.compile(r":[\w+-][\w_+-]*:")
_TEXT_ARROW = re.compile(r"(?:^|\s)(<->|->|<-|--|>=|<=|~=)(?=\s|$)")


def text_passes(source: str, html_out: str) -> list[str]:
    """What Streamlit changes in the parsed text of Markdown `source` (rendered to `html_out`, after Streamlit's
    own `:material/` → `:material_` on the source): icons, its logo, emoji, arrows."""
    found = []
    emoji = bool(_EMOJI_NEEDED.search(source))
    for segment in re.split(r"<a\b[^>]*>.*?</a>", html_out, flags=re.S):
        for text in (html.unescape(t) for t in _TAG.split(segment)):
            found += [f"icon {m.group()}" for m in _TEXT_ICON.finditer(text)]
            found += [f"emoji {m.group()}" for m in _TEXT_EMOJI.finditer(text)] if emoji else []
            found += [f"sign {m.group(1)}" for m in _TEXT_ARROW.finditer(text)]
    return found


def text_autolinks(html_out: str) -> list[str]:
    """What GFM's text pass would link in rendered HTML: its text outside links, each segment as parsed text."""
    found = []
    for segment in re.split(r"<a\b[^>]*>.*?</a>", html_out, flags=re.S):
        for text in (html.unescape(t) for t in _TAG.split(segment)):
            found += [m.group() for m in _TEXT_URL.finditer(text) if _linkable_after(text, m.start(), False)]
            for m in _TEXT_EMAIL.finditer(text):
                start = m.start()
                while start < m.end() and not _linkable_after(text, start, True):  # the pass looks behind each start
                    start += 1
                if start < m.start(2) - 1:
                    found.append(m.group()[start - m.start():])
    return found


def unescaped(source: str) -> str:
    """`source` with every backslash escape (`\\$`) and code span replaced by NULs: what is left is where Markdown
    and Streamlit's extras still look for syntax."""
    return _SKIP.sub(lambda m: "\0" * len(m.group()), source)


def rendered_html(source: str) -> str:
    """Markdown `source` as HTML (CommonMark + GFM tables and strikethrough, raw HTML passed through)."""
    return _markdown_it().render(source)


def rendered_text(source: str) -> str:
    """The text a reader sees for Markdown `source` (tags dropped, entities decoded, on one line). AppTest's `.value`
    of a Markdown element is its source, where a user's text is escaped (`gradlab.escape.markdown`): compare this."""
    return " ".join(html.unescape(_TAG.sub(" ", rendered_html(source))).translate(INVISIBLE).split())


def markdown_problems(source: str, where: str = "") -> list[str]:
    """Every way Markdown `source` shows corpus markup live instead of as text (empty list: none)."""
    markers = set(MARKER.findall(source))
    if not markers:
        return []
    problems = []
    out = rendered_html(source)
    if re.search(r"<img\b", out):
        problems.append(f"{where}: an <img> element")
    for href in re.findall(r"<a\b[^>]*href=\"([^\"]*)\"", out):
        if "invalid" in href or "EVIL" in href:
            problems.append(f"{where}: a link to {href}")
    if re.search(r"<(script|iframe|style)\b", out):
        problems.append(f"{where}: raw HTML")
    for hit in text_autolinks(out):
        if MARKER.search(hit) or "invalid" in hit:
            problems.append(f"{where}: GFM would link {hit[:60]!r}")
    for hit in text_passes(source, rendered_html(source.replace(":material/", ":material_"))):
        problems.append(f"{where}: Streamlit would draw {hit[:60]!r}")
    flat = rendered_text(source)
    for m in sorted(markers):
        expected = " ".join(shown(int(m) - 1).split())
        if expected not in flat:
            problems.append(f"{where}: EVIL{m} is not shown as its text {expected[:60]!r}: {flat[:300]!r}")
    plain = unescaped(source)
    for name, pattern in _EXTRAS.items():
        for hit in pattern.finditer(plain):
            if MARKER.search(hit.group()):
                problems.append(f"{where}: Streamlit would render {hit.group()[:60]!r} as a {name}")
    return problems


# ---------------------------------------------------------------- Plotly's HTML subset

#: Tags gradlab's figure builders write themselves (line breaks, hover boxes).
OWN_TAGS = {"br", "b", "i", "sub", "sup", "extra", "em"}
_PLACEHOLDER = re.compile(r"%\{([^}]*)\}")


def _strings(node, path=""):
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _strings(v, f"{path}[{i}]")


def plotly_text(s: str) -> tuple[str, list[str]]:
    """What plotly.js shows for text `s` (its HTML subset: own tags dropped, `<br>` a space, entities decoded), and
    the tags it would have made of markup it does not know."""
    foreign = [t for t in _TAG.findall(s) if t.strip("</>").split()[0].lower() not in OWN_TAGS] if "<" in s else []
    text = re.sub(r"<br\s*/?>", " ", s)
    text = _TAG.sub("", text)
    return html.unescape(text), foreign


def plotly_problems(figure, where: str = "") -> list[str]:
    """Every string of a Plotly figure (a `go.Figure`, its dict or JSON) that would show corpus markup live."""
    if hasattr(figure, "to_plotly_json"):
        figure = figure.to_plotly_json()
    if isinstance(figure, str):
        figure = json.loads(figure)
    problems = []
    for path, s in _strings(figure):
        markers = set(MARKER.findall(s))
        if not markers:
            continue
        if path.endswith("template"):
            for ph in _PLACEHOLDER.findall(s):
                if MARKER.search(ph):
                    problems.append(f"{where}{path}: %{{{ph}}} is a live placeholder")
        text, foreign = plotly_text(s)
        if any(MARKER.search(t) or "invalid" in t or "script" in t for t in foreign) or any(
                t.lower().startswith(("<a", "<img", "<script", "<span", "<style")) for t in foreign):
            problems.append(f"{where}{path}: live tags {foreign[:3]}")
        flat = " ".join(text.split())
        for m in sorted(markers):
            expected = " ".join(shown(int(m) - 1).split())
            if m in MARKER.findall(flat) and expected not in flat:
                problems.append(f"{where}{path}: EVIL{m} is not shown as its text: {flat[:200]!r}")
    return problems


# ---------------------------------------------------------------- spreadsheets

_NUMBER = re.compile(r"\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*")


def csv_problems(data: bytes) -> list[str]:
    """Cells of CSV `data` (header included) that a spreadsheet would run as a formula."""
    problems = []
    for r, row in enumerate(csv.reader(io.StringIO(data.decode()))):
        for c, cell in enumerate(row):
            if cell.lstrip(" ").startswith(("=", "+", "-", "@", "\t", "\r")) and not _NUMBER.fullmatch(cell):
                problems.append(f"row {r} column {c}: {cell[:60]!r} is a formula")
    return problems


# ---------------------------------------------------------------- a whole page (AppTest)

#: Proto fields that Streamlit's frontend draws as plain text (never Markdown): a selectbox's and a select slider's
#: options (the upload's label column picker lists the CSV's column names), code blocks, ids and keys. Tables
#: (`st.dataframe`) draw text too, and their toolbar downloads the cells as CSV: checked as a spreadsheet reads them.
PLAIN_FIELDS = {("Selectbox", "options"), ("MultiSelect", "options"), ("Slider", "options"), ("Code", "codeText"),
                ("Selectbox", "rawValue"), ("Selectbox", "value")}
TABLE_TYPES = {"Dataframe", "ArrowTable", "Arrow"}


def _nodes(node):
    yield node
    for child in (getattr(node, "children", None) or {}).values():
        yield from _nodes(child)


def page_problems(at) -> tuple[list[str], set[str]]:
    """Every element of an AppTest page (main area and sidebar, blocks such as expanders included) checked for
    corpus markup shown live: Markdown fields by `markdown_problems`, Plotly figures by `plotly_problems`, raw HTML
    elements for any marker at all, tables as the CSV their toolbar downloads (`csv_problems`). **Returns** (problems,
    the markers the page showed as text)."""
    from google.protobuf.json_format import MessageToDict

    problems, seen = [], set()
    for node in _nodes(at._tree):
        proto = getattr(node, "proto", None)
        if proto is None or not hasattr(proto, "DESCRIPTOR"):
            continue
        kind = type(proto).__name__
        if kind in TABLE_TYPES:
            table = node.value
            found = csv_problems(table.to_csv(index=False).encode())
            problems += [f"{kind} (its toolbar's CSV) {p}" for p in found]
            seen |= set(MARKER.findall(" ".join(map(str, [*table.columns, *table.astype(str).to_numpy().ravel()]))))
            continue
        if kind == "PlotlyChart":
            spec = json.loads(proto.spec) if proto.spec else {}
            found = plotly_problems(spec, where=f"PlotlyChart {spec.get('layout', {}).get('title', {}).get('text', '')[:40]!r}")
            problems += found
            seen |= {m for _, s in _strings(spec) for m in MARKER.findall(plotly_text(s)[0])}
            continue
        for path, s in _strings(MessageToDict(proto)):
            if not MARKER.search(s):
                continue
            field = path.lstrip(".").split("[")[0].split(".")[-1]
            if (kind, field) in PLAIN_FIELDS or field in ("id", "formId"):
                continue
            if kind == "Html":
                problems.append(f"Html{path}: a marker in raw HTML")
                continue
            found = markdown_problems(s, where=f"{kind}{path}")
            problems += found
            if not found:
                seen |= set(MARKER.findall(rendered_text(s)))
    return problems, seen
