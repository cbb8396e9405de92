"""The registries are the only places that dispatch on an open-ended idea's name (shared/DESIGN.md: "nothing
outside it compares a kind, a method name or a source prefix"): each test greps the library and the pages."""

from __future__ import annotations

import re
import tokenize
from pathlib import Path

from gradlab import rules
from gradlab.influence import METHODS

ROOT = Path(__file__).resolve().parents[1]
#: Python 3.12 tokenizes an f-string into parts; its literal text is this token (older Pythons: one STRING token).
FSTRING_TEXT = getattr(tokenize, "FSTRING_MIDDLE", -1)

#: Tests of a `dataset` string's source prefix: `is_own`/`is_upload`, `startswith("upload:")`, `== UPLOAD`,
#: `dataset == own.OWN`, `"own" in …`. `gradlab/sources/` (the registry) is the one place that reads prefixes.
SOURCE_PREFIX_DISPATCH = re.compile(
    r"\bis_own\b|\bis_upload\b"
    r"|startswith\(\s*(?:UPLOAD|OWN|own\.OWN|[\"'](?:upload|own)\b)"
    r"|(?:==|!=)\s*(?:UPLOAD|OWN|own\.OWN|[\"'](?:upload|own)[\"'])"
    r"|(?:\bUPLOAD|\bOWN|[\"'](?:upload|own)[\"'])\s*(?:==|!=|\bin\b)")


def _code_lines(path: Path):
    """(line number, code) of a Python file: comments dropped, and every string that is not a bare word or prefix
    (`"upload"`, `"own:"`) blanked, so prose in docstrings and messages is not read as code."""
    lines: dict[int, list[str]] = {}
    with tokenize.open(path) as f:
        for tok in tokenize.generate_tokens(f.readline):
            if tok.type in (tokenize.COMMENT, FSTRING_TEXT):  # an f-string's text is prose, as a string's is
                continue
            text = tok.string
            if tok.type == tokenize.STRING and not re.fullmatch(r"[rbu]?([\"'])\w+:?\1", text):
                text = '""'
            lines.setdefault(tok.start[0], []).append(text)
    return [(i, " ".join(parts)) for i, parts in sorted(lines.items())]


def test_no_source_prefix_dispatch():
    """0 tests of a source prefix outside `gradlab/sources/`: a new source is one file and one registry line."""
    for bad in ('if exp.dataset.startswith("upload:"):', "if exp.is_own:", "dataset == own.OWN", "x == UPLOAD",
                "return self.dataset == UPLOAD or self.dataset.startswith(UPLOAD + ':')"):
        assert SOURCE_PREFIX_DISPATCH.search(bad), bad  # the pattern catches what the registry replaced
    for fine in ('exp.source.brings_model', 'own.ENV', 'own.OWN', 'UPLOAD_LABEL = "x"'):
        assert not SOURCE_PREFIX_DISPATCH.search(fine), fine
    files = [p for p in [*ROOT.glob("gradlab/**/*.py"), *ROOT.glob("views/*.py"), ROOT / "app.py"]
             if "sources" not in p.relative_to(ROOT).parts]
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files for i, line in _code_lines(p)
             if SOURCE_PREFIX_DISPATCH.search(line)]
    assert not found, "dispatch on a source prefix outside gradlab/sources (ask the Source instead):\n" + "\n".join(found)


def _rule_kind_dispatch(rel: str, lines) -> list[str]:
    """`rel:line: code` of every comparison on a layer kind among `lines` ((number, code) of the file `rel`): a
    kind's name compared or tested for membership (`== "conv"`, `in ("dense", …)`), or in `gradlab/rules/` any
    test of a site's kind (`.kind ==`, `kind in`, `isinstance(…kind…)`)."""
    names = "|".join(re.escape(k.name) for k in rules.KINDS)
    name_cmp = re.compile(rf"(==|!=|\bin\b|\bis\b)\s*[(\[{{]?[^#\n]*?[\"']({names})[\"']|[\"']({names})[\"']\s*(==|!=|\bin\b)")
    kind_cmp = re.compile(r"(?<!for )\bkind\s*(==|!=|\bin\b|\bnot in\b|\bis\b)|isinstance\([^)]*kind")
    in_rules = rel.startswith("gradlab/rules/")
    return [f"{rel}:{i}: {line.strip()}" for i, line in lines
            if name_cmp.search(line) or (in_rules and kind_cmp.search(line))]


def test_no_rule_kind_dispatch(tmp_path):
    """0 comparisons on a layer kind outside the kinds' own files (those defining a `RuleKind`) and
    `gradlab/rules/registry.py`: a new kind is one file and one registry line (issue 39)."""
    bad = tmp_path / "bad.py"  # what the registry replaced (gradlab/rules.py before it): each line is caught
    bad.write_text('if site.kind == "conv":\n    pass\naxis = 1 if kind == "conv" else 0\nx = s.kind in ("dense", "conv")\n')
    assert len(_rule_kind_dispatch("gradlab/rules/core.py", _code_lines(bad))) == 3
    assert len(_rule_kind_dispatch("gradlab/engine.py", _code_lines(bad))) == 3
    fine = tmp_path / "fine.py"
    fine.write_text('for kind in registry.for_prim(name):\n    pass\n"""a kind is named"""\n')
    assert _rule_kind_dispatch("gradlab/rules/core.py", _code_lines(fine)) == []
    fine.write_text('if spec.kind == "linear":\n    pass\n')  # another idea's kind, outside the rules
    assert _rule_kind_dispatch("gradlab/models.py", _code_lines(fine)) == []
    found = []
    for p in sorted(ROOT.glob("gradlab/**/*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel != "gradlab/rules/registry.py" and not re.search(r"^class \w+\(RuleKind\)", p.read_text(), re.M):
            found += _rule_kind_dispatch(rel, _code_lines(p))
    assert not found, "dispatch on a layer kind outside its own file (ask the RuleKind instead):\n" + "\n".join(found)


def _method_name_comparisons(names) -> list[re.Pattern]:
    names = "|".join(map(re.escape, names))
    q = r"""["']"""
    return [re.compile(p) for p in (
        rf"(==|!=)\s*{q}({names}){q}",                  # x == "trak"
        rf"{q}({names}){q}\s*(==|!=|\bin\b)",          # "trak" == x, "trak" in x
        rf"\bin\s*[\(\[\{{][^\)\]\}}]*{q}({names}){q}",  # x in ("grad_dot", ...)
        rf"case\s+{q}({names}){q}",                     # match/case
    )]


def test_no_method_name_dispatch():
    """No string comparison on an attribution method's name (`== "trak"`, `!= 'tracin'`, `in ("grad_dot", …)`,
    `case "influence"`) in `gradlab/` or `views/` outside the registry `gradlab/influence/methods/`."""
    patterns = _method_name_comparisons(METHODS)
    # what the page did before the registry is caught (the test is not vacuous)
    for before in ('if method == "trak":', "if method != 'influence' and method in scores:",
                   'if method in ("grad_dot", "tracin"):', '(trak_scores[0] if m_ == "trak" else scores[m_])'):
        assert any(p.search(before) for p in patterns), before
    files = [p for p in [*ROOT.glob("gradlab/**/*.py"), *ROOT.glob("views/*.py"), ROOT / "app.py"]
             if p.relative_to(ROOT).parts[:3] != ("gradlab", "influence", "methods")]
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files for i, line in _code_lines(p)
             if any(pat.search(line) for pat in patterns)]
    assert not found, "method names compared outside gradlab/influence/methods/:\n" + "\n".join(found)
