"""The labels of every Plotly figure on a page, as the browser drew them: cut off the figure, over one another, or
too small to read (issue 41). Used by tests/test_browser_figures_links.py and runnable against a server:

    python -m benchmarks.figure_audit http://127.0.0.1:8501              # every page, 1024×768 and 1400×900
    python -m benchmarks.figure_audit http://127.0.0.1:8501 --pages norms,geometry --presenter

Reads the bounding boxes of the SVG text Plotly draws (the figure's title, axis titles, tick labels, legend entries,
annotations, colour-bar labels) against the figure's own box (`.main-svg`) and each other. No pytest here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.browser import PAGES, launch, page_errors, streamlit_server, wait_until_idle

#: Window sizes of the audit: a projector or small laptop, and a common laptop.
SIZES = ((1024, 768), (1400, 900))

#: The smallest type (px) a figure's label may have: on a projector (presenter mode), and on a screen.
MIN_PX = {True: 16, False: 12}

# Every figure's labels: [{figure, title, box, labels: [{kind, text, box, size}]}]. A label's kind is the part it is
# ("xtick", "ytitle", "legend", "annotation", "title", "colorbar"); hidden labels (display: none, no size) are left out.
_LABELS_JS = """() => {
  const kindOf = (el) => {
    const c = el.getAttribute('class') || '';
    if (el.closest('.hoverlayer') || el.closest('.modebar')) return null;
    if (c.includes('gtitle')) return 'title';
    if (/^[xy]\\d*title$/.test(c.split(' ')[0])) return c[0] + 'title';
    if (c.includes('legendtext')) return 'legend';
    if (c.includes('annotation-text')) return 'annotation';
    if (el.closest('.colorbar')) return 'colorbar';
    const layer = el.closest('.xaxislayer-above, .yaxislayer-above');
    if (layer) return layer.classList.contains('xaxislayer-above') ? 'xtick' : 'ytick';
    return null;
  };
  const box = (r) => ({left: r.left, top: r.top, right: r.right, bottom: r.bottom});
  return [...document.querySelectorAll('.js-plotly-plot')].map((plot, figure) => {
    const svg = plot.querySelector('.main-svg');
    const title = plot.querySelector('.gtitle');
    const labels = [];
    for (const el of plot.querySelectorAll('.main-svg text')) {
      const kind = kindOf(el);
      if (!kind) continue;
      const r = el.getBoundingClientRect();
      const style = getComputedStyle(el);
      if (!el.textContent.trim() || r.width < 1 || r.height < 1 || style.display === 'none'
          || style.visibility === 'hidden' || Number(style.opacity) === 0) continue;
      // its four corners on the screen: a turned tick label's box, not the upright box around it
      const b = el.getBBox(), m = el.getScreenCTM();
      const corners = [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]]
        .map(([x, y]) => [m.a * x + m.c * y + m.e, m.b * x + m.d * y + m.f]);
      // the size of the label's main text (a superscript tspan is smaller by design)
      labels.push({kind, text: el.textContent.trim(), box: box(r), corners, size: parseFloat(style.fontSize)});
    }
    return {figure, title: title ? title.textContent : '', box: box(svg.getBoundingClientRect()), labels};
  });
}"""

#: Overlaps smaller than this (px, in both directions) are glyphs' spare room touching, not labels over one another.
TOLERANCE = 2.0


def _overlap(a: list, b: list) -> float:
    """How deep the convex quadrilaterals `a` and `b` (corners, in order) run into each other, in px: the least
    overlap of their shadows on any of their edges' normals (separating axes); ≤ 0 when they do not meet."""
    depth = float("inf")
    for poly in (a, b):
        for (x0, y0), (x1, y1) in zip(poly, poly[1:] + poly[:1]):
            nx, ny = y0 - y1, x1 - x0
            length = (nx * nx + ny * ny) ** 0.5
            if length == 0:
                continue
            pa = [(x * nx + y * ny) / length for x, y in a]
            pb = [(x * nx + y * ny) / length for x, y in b]
            depth = min(depth, min(max(pa), max(pb)) - max(min(pa), min(pb)))
    return depth


def problems(figures: list[dict], *, min_px: float) -> list[str]:
    """Every label of `figures` (`_LABELS_JS`'s answer) cut by its figure's edge, over another label, or smaller than
    `min_px`, as one line each."""
    out = []
    for f in figures:
        name = f"figure {f['figure']} {f['title'][:50]!r}"
        fb, labels = f["box"], f["labels"]
        for lab in labels:
            b = lab["box"]
            cut = max(fb["left"] - b["left"], b["right"] - fb["right"], fb["top"] - b["top"], b["bottom"] - fb["bottom"])
            if cut > TOLERANCE:
                out.append(f"{name}: {lab['kind']} {lab['text'][:40]!r} cut off by {cut:.0f} px")
            if lab["size"] < min_px:
                out.append(f"{name}: {lab['kind']} {lab['text'][:40]!r} is {lab['size']:.0f} px (< {min_px})")
        for i, a in enumerate(labels):
            for b in labels[i + 1:]:
                if (depth := _overlap(a["corners"], b["corners"])) > TOLERANCE:
                    out.append(f"{name}: {a['kind']} {a['text'][:30]!r} overlaps {b['kind']} {b['text'][:30]!r} "
                               f"by {depth:.0f} px")
    return out


def figures(page) -> list[dict]:
    """The labels of every figure on `page` now (`_LABELS_JS`)."""
    return page.evaluate(_LABELS_JS)


def settle(page, *, timeout: float = 120) -> int:
    """Wait until every Plotly figure on the page has drawn (and its fonts laid out); **returns** how many there are."""
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].every((p) => p.querySelector('.main-svg'))",
                           timeout=timeout * 1000)
    page.evaluate("() => document.fonts.ready.then(() => null)")
    page.wait_for_timeout(400)  # Plotly's automargin redraws once after the first draw
    return page.locator(".js-plotly-plot").count()


def shoot(page, figure: int, path: Path) -> None:
    """A screenshot of figure number `figure` on `page` (scrolled into view) to `path`."""
    box = page.evaluate("""(i) => { const p = document.querySelectorAll('.js-plotly-plot')[i]; p.scrollIntoView({block: 'center'});
                                   const r = p.getBoundingClientRect(); return {x: r.left, y: r.top, width: r.width, height: r.height}; }""",
                        figure)
    size = page.viewport_size
    x, y = max(box["x"], 0), max(box["y"], 0)
    clip = {"x": x, "y": y, "width": min(box["width"], size["width"] - x), "height": min(box["height"], size["height"] - y)}
    if clip["width"] > 0 and clip["height"] > 0:
        page.screenshot(path=str(path), clip=clip)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("base", nargs="?", help="a running server (default: start one)")
    parser.add_argument("--pages", default="all", help="url paths, e.g. norms,geometry ('all')")
    parser.add_argument("--presenter", action="store_true", help="presenter mode")
    parser.add_argument("--query", default="", help="extra URL parameters for every page")
    parser.add_argument("--shots", default="screenshots/audit", help="where the screenshots go")
    args = parser.parse_args(argv)
    paths = [p for p, *_ in PAGES] if args.pages == "all" else ["" if p == "home" else p for p in args.pages.split(",")]
    shots = Path(args.shots)
    shots.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    found = 0
    with sync_playwright() as pw:
        browser = launch(pw)
        server = streamlit_server() if not args.base else None
        base = server.__enter__()[0] if server else args.base.rstrip("/")
        try:
            page = browser.new_page(viewport={"width": SIZES[0][0], "height": SIZES[0][1]})
            for path in paths:
                query = "&".join(q for q in (args.query, "presenter=true" if args.presenter else "") if q)
                page.goto(f"{base}/{path}" + (f"?{query}" if query else ""))
                wait_until_idle(page, timeout=600)
                for width, height in SIZES:
                    page.set_viewport_size({"width": width, "height": height})
                    n = settle(page)
                    lines = problems(figures(page), min_px=MIN_PX[args.presenter])
                    name = f"{path or 'home'}_{width}{'_p' if args.presenter else ''}"
                    page.screenshot(path=str(shots / f"{name}.png"))
                    for i in sorted({int(line.split()[1]) for line in lines}):  # each figure with a problem, whole
                        shoot(page, i, shots / f"{name}_fig{i}.png")
                    print(f"{path or 'home'} {width}x{height}: {n} figures, {len(lines)} problems {page_errors(page)[:1]}")
                    for line in lines:
                        print("   ", line)
                    found += len(lines)
        finally:
            if server:
                server.__exit__(None, None, None)
            browser.close()
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
