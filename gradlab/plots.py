"""Plotly figure builders: pure functions, data and a `Style` in, `go.Figure` out. Every axis is labelled."""

from __future__ import annotations

import dataclasses
import functools
import html
import re

import numpy as np
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gradlab import escape

NORM_LABEL = "per-example gradient norm ‖∇θ ℓ(xᵢ, yᵢ)‖₂"
TEMPLATE = "plotly_white"
FLIPPED_COLOR = "#d62728"


def _log10(values: np.ndarray) -> np.ndarray:
    return np.log10(np.maximum(np.asarray(values, np.float64), 1e-12))


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_of_ten(k: int) -> str:
    """`10⁻³` for k = −3: a tick label of a log axis."""
    return "10" + str(int(k)).translate(_SUPERSCRIPT)


def _decades(fig: go.Figure, log10_values, axis: str = "x", most: int | None = None) -> go.Figure:
    """Label an axis that shows log₁₀ values with powers of ten at every integer (10⁻², 10⁻¹, 10⁰), or at every
    second, third, … decade so that at most `most` labels show (a small facet has room for a few)."""
    v = np.asarray(log10_values, np.float64)
    v = v[np.isfinite(v)]
    if v.size:
        ks = list(range(int(np.floor(v.min())), int(np.ceil(v.max())) + 1))
        if most and len(ks) > most:
            step = -(-len(ks) // most)
            ks = [k for k in ks if k % step == 0]  # multiples of the step: 10⁰ stays labelled
        update = fig.update_xaxes if axis == "x" else fig.update_yaxes
        update(tickvals=ks, ticktext=[power_of_ten(k) for k in ks])
    return fig


# ---------------------------------------------------------------- readability (presenter mode)


@dataclasses.dataclass(frozen=True)
class Style:
    """Where a figure is shown, which sets its type sizes and wrapping (an argument of every builder, so a figure
    is a function of its arguments alone and a memo of them is complete).

    - `presenter`: a projector (presenter mode): tick labels 18 px, axis titles 20 px, shorter title lines.
    - `half`: a column of at most half the page: about 250 px on a 1024 px laptop screen with the sidebar open,
      where a one-line title of 50 characters was cut off.
    """

    presenter: bool = False
    half: bool = False


NORMAL = Style()


def figure(builder):
    """Mark `builder` (data in, `go.Figure` out) as one of this house's figure builders: it gains a keyword
    argument `style: Style = NORMAL`, and its figure is made `readable` in that style. `gradlab.ui.figures` shares
    every builder so marked (`builder.builds_figure`)."""

    @functools.wraps(builder)
    def build(*args, style: Style = NORMAL, **kwargs) -> go.Figure:
        return readable(builder(*args, **kwargs), style)

    build.builds_figure = True
    return build


#: (tick labels, axis titles, figure title, legend) in px, normal and presenter mode.
FONT_SIZES = {False: (14, 16, 17, 14), True: (18, 20, 22, 18)}
TICK_COLOR = "#222222"
#: px between the figure's top edge and its title's first line.
TITLE_PAD = 8


def _wrap(text: str, width: int) -> str:
    """Break a long title into lines of at most about `width` characters (Plotly titles do not wrap)."""
    if not text or len(text) <= width or "<br>" in text:
        return text
    words = []  # a bracketed group such as "(xᵢ, yᵢ)" stays on one line
    for word in text.split(" "):
        if words and words[-1].count("(") > words[-1].count(")"):
            words[-1] += " " + word
        else:
            words.append(word)
    lines, line = [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "<br>".join([*lines, line])


def _wrap_entries(key: str, width: int) -> str:
    """A colour key's entries (`<span …>name</span>`, space-separated) in lines of at most about `width` visible
    characters, broken only between entries."""
    lines, line, seen = [], [], 0
    for entry in re.split(r"(?<=</span>) ", key):
        n = len(re.sub(r"<[^>]+>", "", entry))
        if line and seen + 1 + n > width:
            lines.append(" ".join(line))
            line, seen = [], 0
        line.append(entry)
        seen += n + (1 if seen else 0)
    return "<br>".join([*lines, " ".join(line)])


def readable(fig: go.Figure, style: Style = NORMAL) -> go.Figure:
    """Type sizes and colours readable from the back of a room; log axes labelled with powers of ten.

    Applied to every figure a `figure` builder returns. In presenter mode (`Style(presenter=True)`) tick
    labels are 18 px and axis titles 20 px; long titles wrap instead of being cut at 1024 px.
    """
    big, half = style.presenter, style.half
    tick, axis, title, legend = FONT_SIZES[big]
    text = fig.layout.title.text if fig.layout.title and fig.layout.title.text else ""
    key = fig.layout.title.subtitle.text if text and fig.layout.title.subtitle.text else ""
    lines = key_lines = 1
    if text:
        # a chart in half of a 1024 px page is ~450 px wide in presenter mode (no sidebar), ~250 px with the sidebar
        width = 36 if big else 30 if half else 50
        text = _wrap(text, width)
        lines = text.count("<br>") + 1
        fig.update_layout(title=dict(text=text, font=dict(size=title, color="#111111")))
        if key:  # a colour key under the title (`_colour_key`), wrapped between its entries
            key = _wrap_entries(key, round(width * title / legend))
            key_lines = key.count("<br>") + 1
            fig.update_layout(title_subtitle=dict(text=key, font=dict(size=legend)))
        if lines > 1 or key:
            # a wrapped title hangs from the figure's top edge: Plotly centres a title in the top margin by its first
            # line's baseline, so the lines below grew down over the plot's top tick label (Home's three lines over
            # "12", issue 41). Each line's baseline is set by hand (`y`), so "top" puts the first baseline at the pad.
            fig.update_layout(title=dict(yref="container", y=1, yanchor="top", pad=dict(t=TITLE_PAD + title)))
    fig.update_layout(legend=dict(font=dict(size=legend)), font=dict(color="#111111"))
    if text:
        # room above the plot for every line of the title (centred in the top margin) and, below it,
        # the subplot titles that sit just above the plot: a wrapped title overlaps neither
        notes = max((str(a.text or "").count("<br>") + 1 for a in fig.layout.annotations), default=0)
        subplot_titles = (1 + notes) * (12 + tick) if notes else 0
        need = 20 + lines * round(1.3 * title) + subplot_titles + tick // 2  # and the top tick label's upper half
        if key:
            need += key_lines * round(1.4 * legend)
        fig.update_layout(margin=dict(t=max(need, fig.layout.margin.t or 0)))
    # on every axis itself, not on the figure's template: Streamlit's chart theme replaces the template
    axes = dict(tickfont=dict(size=tick, color=TICK_COLOR), title_font=dict(size=axis, color="#111111"), automargin=True)
    fig.update_xaxes(**axes)
    fig.update_yaxes(**axes)
    # long axis titles wrap (Plotly cuts them at the figure's edge); a y title runs along a short side
    x_chars = (28 if half else 40) if big else (24 if half else 60)
    fig.for_each_xaxis(lambda ax: ax.update(title_text=_wrap(ax.title.text, x_chars)) if ax.title.text else None)
    fig.for_each_yaxis(lambda ax: ax.update(title_text=_wrap(ax.title.text, 26 if big else 40)) if ax.title.text else None)
    x_lines = max((ax.title.text or "").count("<br>") + 1 for ax in fig.select_xaxes())
    fig.for_each_xaxis(lambda ax: _power_ticks(ax, fig, "x"))
    fig.for_each_yaxis(lambda ax: _power_ticks(ax, fig, "y"))
    if big:
        fig.update_annotations(font_size=max(16, tick - 2))
    # a colour bar's ticks and title as the axes' (Plotly's default 12 px, and its title touched the top tick)
    colorbar = dict(tickfont=dict(size=tick, color=TICK_COLOR), title=dict(font=dict(size=legend), side="right"))
    for trace in fig.data:  # a heatmap's own colour bar, or a scatter's markers': only where the builder drew one
        if "colorbar" in trace and trace.colorbar.title.text:
            trace.update(colorbar=colorbar)
        elif "marker" in trace and "colorbar" in trace.marker and trace.marker.colorbar.title.text:
            trace.update(marker_colorbar=colorbar)
    placed = fig.layout.legend
    if placed.orientation == "h" and placed.y is not None and placed.y < 0:
        # a legend below the plot goes to the figure's bottom edge, under room for the tick labels and the axis
        # title's lines (placed by hand it fell on the axis title), with as many rows as its entries take in the
        # chart's width on a 1024 px screen (one per entry left a presenter chart's plot 90 px high, issue 41)
        names = [str(t.name) for t in fig.data if t.showlegend is not False and t.name]
        legend_px = round(1.6 * legend) * _legend_rows(names, legend, LEGEND_WIDTH[big, half])
        fig.update_layout(legend=dict(yref="container", y=0, yanchor="bottom"),
                          margin=dict(b=70 + 28 * x_lines + legend_px),
                          height=(fig.layout.height or 450) + legend_px + 28 * (x_lines - 1))
    # at least MIN_PLOT px of plot between the margins (a projector's type and a tall legend squeezed a log axis's
    # labels over one another, issue 41)
    margin = fig.layout.margin
    inside = (fig.layout.height or 450) - (margin.t or 100) - (margin.b or 80)
    if inside < MIN_PLOT[big]:
        fig.update_layout(height=(fig.layout.height or 450) + MIN_PLOT[big] - inside)
    return fig


#: The width (px) a chart has on a 1024 px screen: by (presenter mode, half a page); the sidebar takes ~300 px
#: outside presenter mode.
LEGEND_WIDTH = {(True, False): 940, (True, True): 440, (False, False): 640, (False, True): 300}
#: The least height (px) of a figure's plot area, on a screen and on a projector.
MIN_PLOT = {False: 200, True: 240}


def _legend_rows(names: list[str], size: int, width: int) -> int:
    """How many rows a horizontal legend of `names` in `size` px type takes in `width` px (about: a character is
    0.55 of the type size wide, an entry's symbol and gap 50 px)."""
    rows, used = 1, 0.0
    for name in names:
        entry = 50 + 0.55 * size * len(re.sub(r"<[^>]*>", "", html.unescape(name)))  # a name as shown
        if used and used + entry > width:
            rows, used = rows + 1, 0.0
        used += entry
    return rows


def _power_ticks(ax, fig: go.Figure, letter: str) -> None:
    """A log axis labelled only at powers of ten, written 10⁻³ (not "2 3 4 5" inside a decade)."""
    if ax.type != "log":
        return
    ax.update(exponentformat="power", minorloglabels="none")
    if ax.range is not None or ax.autorange is False:
        return
    # an axis whose data spans less than a decade (one batch size timed) shows the powers of ten around it: inside
    # one decade Plotly labelled every half unit, "2.5 3 3.5 4", 18 px labels over one another on a projector (issue 41)
    name = ax.plotly_name.replace("axis", "")  # "x", "x2", …: as the traces name their axes
    values = []
    for trace in fig.data:
        if (getattr(trace, f"{letter}axis", None) or letter) == name and getattr(trace, letter, None) is not None:
            try:
                values += [float(v) for v in np.ravel(np.asarray(getattr(trace, letter), dtype=object)) if v is not None]
            except (TypeError, ValueError):  # categories
                return
    values = [v for v in values if np.isfinite(v) and v > 0]
    if values and np.log10(max(values)) - np.log10(min(values)) < 1:
        lo, hi = np.floor(np.log10(min(values))), np.ceil(np.log10(max(values)))
        if hi - lo < 1:
            lo, hi = lo - 0.5, hi + 0.5
        ax.update(range=[float(lo) - 0.05, float(hi) + 0.05])


#: The house's subscripted symbols, written plainly in the builders and typeset after escaping (Plotly's `<sub>`):
#: the clipped mean gradient Ḡ_C (and per layer k), the true mean G_k, the audit canary's parameter θ_canary.
_SUBSCRIPTS = (("Ḡ_C,k", "Ḡ<sub>C,k</sub>"), ("Ḡ_C", "Ḡ<sub>C</sub>"), ("G_k", "G<sub>k</sub>"),
               ("θ_canary", "θ<sub>canary</sub>"))


def _typeset(text: str) -> str:
    for plain, sub in _SUBSCRIPTS:
        text = text.replace(plain, sub)
    return text


def _escape_traces(fig: go.Figure) -> None:
    """Escape every trace's name, categories, text and hover text (`escape.plotly`): data, never markup. Builders
    put raw strings there (an upload's class names, a served model's leaf names) and this escapes them once; a
    trace's name then gets the house's subscripts (`_typeset`)."""
    for trace in fig.data:
        for field in ("name", "x", "y", "text", "hovertext"):
            value = getattr(trace, field, None)
            if value is not None:
                escaped = escape.plotly_all(value)
                if field == "name" and isinstance(escaped, str):
                    escaped = _typeset(escaped)
                if escaped is not value:
                    trace[field] = escaped


def _identified(ids: dict | None, n: int) -> tuple[list, str]:
    """Each point's `customdata` and the hover lines that name its example (issue 26, row identity).

    **Arguments** `ids`: the columns of `export.example_columns` for the `n` points in order (`"example"`: the
    position, then the row in the source under its name, e.g. `"CSV line"`, then input values), optionally more
    (`"label"`); None: positions only.

    **Returns** `customdata` (n rows: the position first, which a click reads back, then every other column) and a
    hovertemplate fragment `"<row name> 42<br>x1 = 0.31<br>…"`; names and text values are escaped (`escape.plotly`:
    a CSV's column and class names are data, never markup; a name in the template cannot be a placeholder)."""
    ids = {"example": np.arange(n)} if ids is None else ids
    position = np.asarray(ids.get("example", np.arange(n)), int)
    names = [k for k in ids if k != "example"]
    columns = [[escape.plotly(v) if isinstance(v, str) else (v.item() if hasattr(v, "item") else v)
                for v in ids[k]] for k in names]
    custom = [[int(position[i]), *(c[i] for c in columns)] for i in range(n)]
    if not names:
        return custom, "example %{customdata[0]}"
    lines = []
    for j, name in enumerate(names, start=1):
        numeric = j > 1 and isinstance(columns[j - 1][0], float) if n else False
        lines.append(f"{escape.plotly(name, template=True)}{' =' if j > 1 else ''} %{{customdata[{j}]{':.3g' if numeric else ''}}}")
    return custom, "<br>".join(lines)


def style_figure(fig: go.Figure, title: str, x: str, y: str, height: int = 380) -> go.Figure:
    """The house style on `fig`: title, axis titles, `TEMPLATE`, `height` pixels, margins, 15-pt dark text.
    The title, axis titles, trace names, categories and texts are text (`escape.plotly`): pass them raw, user data
    such as an upload's class and column names included; markup in them shows as typed.

    **Returns** `fig` (changed in place).
    """
    _escape_traces(fig)
    title, x, y = (_typeset(escape.plotly(t)) for t in (title, x, y))
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, template=TEMPLATE, height=height,
                      margin=dict(l=60, r=20, t=60, b=50), font=dict(size=15, color="#111111"))
    return fig


def norm_bins(norms: np.ndarray, *, log: bool = False, bins: int = 60) -> np.ndarray:
    """The `bins + 1` edges `norm_histogram` draws (on log10 of the norms when `log`): a click on a bar reads back
    its bin's index, and `norm_bin_members` the examples in it."""
    v = _log10(norms) if log else np.asarray(norms, np.float64)
    return np.histogram_bin_edges(v[np.isfinite(v)], bins=bins)


def norm_bin_members(norms: np.ndarray, b: int, *, log: bool = False, bins: int = 60) -> np.ndarray:
    """Positions in `norms` of the examples in bar `b` of `norm_histogram(norms, log=log)` (ascending by norm)."""
    edges = norm_bins(norms, log=log, bins=bins)
    v = _log10(norms) if log else np.asarray(norms, np.float64)
    where = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, len(edges) - 2)  # the last edge is in the last bin
    members = np.flatnonzero(where == int(b))
    return members[np.argsort(np.asarray(norms)[members])]


@figure
def norm_histogram(norms: np.ndarray, *, log: bool = False, flipped: np.ndarray | None = None, bins: int = 60) -> go.Figure:
    """Histogram of per-example gradient norms; flipped-label examples stacked in red when given. Bars on the fixed
    bins of `norm_bins`, each bar's `customdata` its bin's index (a click opens the examples in it:
    `norm_bin_members`)."""
    v = _log10(norms) if log else np.asarray(norms, np.float64)
    edges = norm_bins(norms, log=log, bins=bins)
    centers, widths = (edges[1:] + edges[:-1]) / 2, np.diff(edges)
    fig = go.Figure()
    groups = ([("clean label", ~flipped, "#1f77b4"), ("flipped label", flipped, FLIPPED_COLOR)]
              if flipped is not None and np.any(flipped) else [("examples", np.ones(len(v), bool), "#1f77b4")])
    lo, hi = (lambda a: 10**a, lambda a: 10**a) if log else (lambda a: a, lambda a: a)
    for name, mask, color in groups:
        counts, _ = np.histogram(v[mask], bins=edges)
        fig.add_bar(x=centers, y=counts, width=widths, name=name, marker_color=color, customdata=np.arange(len(centers)),
                    hovertext=[f"{lo(a):.3g} to {hi(b):.3g}" for a, b in zip(edges[:-1], edges[1:])],
                    hovertemplate="‖g‖ %{hovertext}: %{y} examples (click to list them)<extra>" + name + "</extra>")
    fig.update_layout(barmode="stack", bargap=0, clickmode="event+select")
    if log:
        _decades(fig, v)
    return style_figure(fig, "Distribution of per-example gradient norms",
                   f"{NORM_LABEL} (log scale)" if log else NORM_LABEL, "number of training examples")


@figure
def norm_histogram_by_class(norms: np.ndarray, labels: np.ndarray, class_names, *, log: bool = False) -> go.Figure:
    """One small histogram of per-example gradient norms per (training) label."""
    v = _log10(norms) if log else np.asarray(norms)
    # facet titles and px's hover template hold the names: an upload's names are text (`%` too, in the template)
    safe = [escape.plotly(c, template=True) for c in class_names]
    names = [safe[int(c)] for c in labels]
    order = [c for c in safe if c in set(names)]
    fig = px.histogram(x=v, facet_col=names, facet_col_wrap=5, nbins=30,
                       category_orders={"facet_col": order}, template=TEMPLATE)
    fig.for_each_annotation(lambda a: a.update(text="class " + a.text.split("=", 1)[1]))  # "facet_col=<name>"
    fig.update_xaxes(title_text="")
    fig.update_yaxes(title_text="")
    rows = int(np.ceil(len(order) / 5))
    if log:
        _decades(fig, v, most=4)  # a facet is a fifth of the page: ~90 px at 1024 px with the sidebar open
    fig.update_layout(title=f"Per class ({'log-scale ' if log else ''}norm on x, count on y)", height=230 * rows + 80,
                      margin=dict(l=40, r=20, t=70, b=40), font=dict(size=14), showlegend=False)
    return fig


@figure
def layer_share(layer_norms: dict[str, np.ndarray]) -> go.Figure:
    """Bar per parameter leaf: its share of the total squared per-example norm (mean over examples)."""
    names = list(layer_norms)
    sq = np.stack([np.square(np.asarray(layer_norms[k], np.float64)) for k in names])
    share = sq.sum(1) / max(sq.sum(), 1e-30)
    median = [float(np.median(layer_norms[k])) for k in names]
    # the bar's label is the share alone (a half-width column at 1024 px cut "8.6% · median …" off); the median
    # per-example norm of the leaf is in the hover
    fig = go.Figure(go.Bar(x=share * 100, y=names, orientation="h", marker_color="#1f77b4",
                           text=[f"{s * 100:.1f}%" for s in share], textposition="auto", customdata=median,
                           hovertemplate="%{y}: %{x:.1f}% of Σᵢ‖gᵢ‖², median ‖gᵢ‖ %{customdata:.3g}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    return style_figure(fig, "Which layers carry the gradient", "share of Σᵢ‖gᵢ‖² (%)",
                   "parameter leaf", height=max(260, 60 * len(names) + 120))


@figure
def image_grid(images: np.ndarray, titles: list[str], *, cols: int = 8, image_shape=(8, 8)) -> go.Figure:
    """Small grayscale images (rows of flattened pixels) with a title each, e.g. top-k digits.

    One heatmap of the images tiled into a grid (NaN between tiles) with the titles as annotations:
    a single trace and one pair of axes, where a subplot per image made Plotly update dozens of axes
    on every rerun (most of the Influence page's warm time). A title is a tuple of lines, or a string split on "\n";
    each line is shown as text (`escape.plotly`: a class name from a CSV stays text, its own newline shown as ␊ in
    a tuple's line).
    """
    images = np.asarray(images, np.float64)
    n = len(images)
    h, w = image_shape
    cols = max(1, min(cols, n))
    rows = max(1, int(np.ceil(n / cols)))
    gap, head = 1, max(3, h // 2)  # pixels between tiles; rows of room for a two-line title above each
    tile_w, tile_h = w + gap, h + head
    canvas = np.full((rows * tile_h, cols * tile_w - gap), np.nan)
    for i, img in enumerate(images):
        r, c = divmod(i, cols)
        canvas[r * tile_h + head: (r + 1) * tile_h, c * tile_w: c * tile_w + w] = img.reshape(image_shape)
    notes = [dict(x=(i % cols) * tile_w + (w - 1) / 2, y=(i // cols) * tile_h + head - 0.6, text="<br>".join(escape.plotly(line) for line in (str(text).split("\n") if isinstance(text, str) else text)),
                  showarrow=False, yanchor="bottom", font=dict(size=12)) for i, text in enumerate(titles[:n])]
    fig = go.Figure(go.Heatmap(z=canvas, colorscale="gray_r", showscale=False, hoverinfo="skip"),
                    layout=dict(template=TEMPLATE, height=170 * rows + 40, margin=dict(l=10, r=10, t=50, b=10),
                                plot_bgcolor="white", annotations=notes))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, autorange="reversed")  # row 0 at the top, images upright
    return fig


@figure
def scatter_2d(x: np.ndarray, color: np.ndarray, *, color_label: str, highlight: np.ndarray | None = None,
               ids: dict | None = None, axis_names=("x₁", "x₂"), title: str = "") -> go.Figure:
    """Scatter of 2-D inputs coloured by a per-example value, `highlight` indices circled; a hover names each
    example by `ids` (`_identified`: its row in the source and its input)."""
    custom, who = _identified(ids, len(x))
    fig = go.Figure(go.Scattergl(
        x=x[:, 0], y=x[:, 1], mode="markers", customdata=custom,
        marker=dict(color=color, colorscale="Viridis", size=7, colorbar=dict(title=color_label)),
        hovertemplate=who + "<br>" + color_label + " %{marker.color:.3g}<extra></extra>",
        name="training examples"))
    if highlight is not None and len(highlight):
        fig.add_trace(go.Scatter(x=x[highlight, 0], y=x[highlight, 1], mode="markers", name="top-k",
                                 marker=dict(size=16, color="rgba(0,0,0,0)", line=dict(color=FLIPPED_COLOR, width=2.5))))
    fig.update_layout(legend=dict(orientation="h", y=-0.15))
    return style_figure(fig, title, axis_names[0], axis_names[1], height=480)


@figure
def scatter_1d(x: np.ndarray, y: np.ndarray, color: np.ndarray, *, color_label: str, highlight=None, ids: dict | None = None,
               axis_names=("x", "y"), title: str = "") -> go.Figure:
    """Regression data `y` against a single feature `x`, coloured by a per-example value (`ids`: as `scatter_2d`)."""
    return scatter_2d(np.stack([np.asarray(x).ravel(), np.asarray(y)], 1), color, color_label=color_label,
                      highlight=highlight, ids=ids, axis_names=axis_names, title=title)


@figure
def roc_figure(curves: dict[str, tuple[np.ndarray, np.ndarray, float]], title: str) -> go.Figure:
    """ROC curves `{name: (fpr, tpr, auc)}` with the chance diagonal."""
    fig = go.Figure()
    for name, (fpr, tpr, auc) in curves.items():
        fig.add_trace(go.Scatter(x=fpr, y=tpr, mode="lines", name=f"{name} (AUC {auc:.3f})"))
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="chance", line=dict(dash="dot", color="gray")))
    fig.update_layout(legend=dict(x=0.45, y=0.08))
    return style_figure(fig, title, "false positive rate (clean examples flagged)", "true positive rate (flipped labels found)", height=420)


@figure
def training_curve(losses: np.ndarray, checkpoint_steps, current_step: int | None = None) -> go.Figure:
    """Minibatch training objective per step, checkpoints marked."""
    steps = np.arange(1, len(losses) + 1)
    fig = go.Figure(go.Scatter(x=steps, y=losses, mode="lines", name="minibatch objective"))
    for s in checkpoint_steps:
        fig.add_vline(x=s, line=dict(color="lightgray", width=1))
    if current_step is not None:
        fig.add_vline(x=current_step, line=dict(color=FLIPPED_COLOR, width=2))
    fig.update_yaxes(type="log")
    return style_figure(fig, "Training objective (red: the checkpoint shown)", "training step", "mean loss + λ/2‖θ‖² (log scale)", height=300)


# ---------------------------------------------------------------- influence

PROPONENT_COLOR = "#2ca02c"
OPPONENT_COLOR = "#d62728"


@figure
def point_picker(xy: np.ndarray, correct: np.ndarray, selected: int, *, axis_names=("x₁", "x₂"), ids: dict | None = None,
                      title: str = "Test points: click one") -> go.Figure:
    """Clickable scatter of test points `xy (M, 2)` (inputs, or index vs loss), misclassified as crosses.

    Each marker's `customdata` starts with its test index (read back from `st.plotly_chart(on_select=...)`); a
    hover names the test point by `ids` (`_identified`: its row in the source and its input).
    """
    xy = np.asarray(xy, np.float64)
    correct = np.asarray(correct, bool)
    custom, who = _identified(ids, len(xy))
    fig = go.Figure(go.Scatter(
        x=xy[:, 0], y=xy[:, 1], mode="markers", customdata=custom, name="test points",
        marker=dict(size=8, color=np.where(correct, "#1f77b4", OPPONENT_COLOR),
                    symbol=np.where(correct, "circle", "x")),
        hovertemplate="test point " + who.removeprefix("example ") + "<extra></extra>"))
    fig.add_trace(go.Scatter(x=[xy[selected, 0]], y=[xy[selected, 1]], mode="markers", name="chosen test point",
                             marker=dict(size=20, symbol="star", color="gold", line=dict(color="black", width=1.5)),
                             hoverinfo="skip"))
    fig.update_layout(legend=dict(orientation="h", y=-0.2), clickmode="event+select")
    return style_figure(fig, title + " (blue: correct, red ×: misclassified)", axis_names[0], axis_names[1], height=360)


@figure
def influence_scatter_2d(x_train: np.ndarray, scores: np.ndarray, proponents, opponents, test_x: np.ndarray, *,
                         score_label: str, ids: dict | None = None, axis_names=("x₁", "x₂"), title: str = "") -> go.Figure:
    """2-D training inputs coloured by an influence score (diverging, 0 = white), the top-k proponents
    ringed green, the top-k opponents ringed red, and the test point as a star; `ids` as `scatter_2d`."""
    x = np.asarray(x_train, np.float64)
    s = np.asarray(scores, np.float64)
    lim = float(np.quantile(np.abs(s), 0.98)) or 1.0
    custom, who = _identified(ids, len(x))
    fig = go.Figure(go.Scattergl(
        x=x[:, 0], y=x[:, 1], mode="markers", customdata=custom, name="training examples",
        marker=dict(color=s, colorscale="RdBu", cmid=0, cmin=-lim, cmax=lim, size=7,
                    colorbar=dict(title=score_label), line=dict(width=0.3, color="gray")),
        hovertemplate=who + "<br>score %{marker.color:.3g}<extra></extra>"))
    for ids, color, name in ((proponents, PROPONENT_COLOR, "top proponents"), (opponents, OPPONENT_COLOR, "top opponents")):
        ids = np.asarray(ids, int)
        fig.add_trace(go.Scatter(x=x[ids, 0], y=x[ids, 1], mode="markers", name=name,
                                 marker=dict(size=16, color="rgba(0,0,0,0)", line=dict(color=color, width=2.5))))
    t = np.asarray(test_x, np.float64).ravel()
    fig.add_trace(go.Scatter(x=[t[0]], y=[t[1]], mode="markers", name="test point",
                             marker=dict(size=22, symbol="star", color="gold", line=dict(color="black", width=1.5))))
    fig.update_layout(legend=dict(orientation="h", y=-0.15))
    return style_figure(fig, title, axis_names[0], axis_names[1], height=480)


@figure
def agreement_heatmap(matrix: np.ndarray, names: list[str], *, title: str = "Agreement between methods") -> go.Figure:
    """Rank-correlation matrix (e.g. Spearman ρ) between score vectors, annotated."""
    m = np.asarray(matrix, np.float64)
    fig = go.Figure(go.Heatmap(z=m, x=names, y=names, zmin=-1, zmax=1, colorscale="RdBu", reversescale=False,
                               text=np.round(m, 2), texttemplate="%{text}", colorbar=dict(title="Spearman ρ", tickvals=[-1, 0, 1])))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(tickangle=-90)  # upright names: six or more overlap when Plotly tilts them (1024 px, presenter)
    return style_figure(fig, title, "method", "method", height=380)


@figure
def loo_scatter(predicted: np.ndarray, actual: np.ndarray, indices: np.ndarray, *, pearson: float, spearman: float,
                n_top: int | None = None, ids: dict | None = None, title: str | None = None) -> go.Figure:
    """Predicted vs actual leave-one-out change in test loss, the y = x line (Koh & Liang 2017, Fig. 2).

    The first `n_top` entries are the predicted proponents (green), the rest opponents (red); a hover names each
    removed example by `ids` (the columns of `export.example_columns` for `indices`), else by its position.
    """
    custom, who = _identified(ids if ids is not None else {"example": np.asarray(indices)}, len(indices))
    p, a = np.asarray(predicted, np.float64), np.asarray(actual, np.float64)
    n_top = len(p) // 2 if n_top is None else n_top
    groups = (slice(0, n_top), slice(n_top, None))
    fig = go.Figure()
    for sl, color, name in zip(groups, (PROPONENT_COLOR, OPPONENT_COLOR), ("most positive prediction", "most negative prediction")):
        fig.add_trace(go.Scatter(x=p[sl], y=a[sl], mode="markers", name=name, customdata=custom[sl],
                                 marker=dict(size=10, color=color),
                                 hovertemplate=who + "<br>predicted %{x:.3g}<br>actual %{y:.3g}<extra></extra>"))
    lo = float(min(p.min(), a.min())) if len(p) else 0.0
    hi = float(max(p.max(), a.max())) if len(p) else 1.0
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line=dict(dash="dot", color="gray")))
    fig.update_layout(legend=dict(orientation="h", y=-0.2))
    title = title or f"Predicted vs actual leave-one-out change (Pearson {pearson:.3f}, Spearman {spearman:.3f})"
    return style_figure(fig, title, "predicted change in test loss (influence function)",
                   "actual change in test loss (retrained without the example)", height=460)


# ---------------------------------------------------------------- DP clipping and DP-SGD

PRIVATE_COLOR = "#9467bd"
NONPRIVATE_COLOR = "#7f7f7f"
#: Clipping's bias: the cosine of the clipped mean gradient with the true one, and their norm ratio (both figures).
COSINE_COLOR, NORM_RATIO_COLOR = "#1f77b4", "#ff7f0e"


@figure
def clipping_histograms(norms: np.ndarray, clipped_norms: np.ndarray, clip_norm: float, *, log: bool = False,
                        bins: int = 60) -> go.Figure:
    """Overlaid histograms of per-example gradient norms before and after clipping at C (C marked)."""
    f = _log10 if log else np.asarray
    v, w = f(norms), f(clipped_norms)
    edges = np.linspace(float(min(v.min(), w.min())), float(max(v.max(), w.max())) + 1e-9, bins + 1)
    size = float(edges[1] - edges[0])
    fig = go.Figure()
    fig.add_histogram(x=v, name="before clipping ‖gᵢ‖", xbins=dict(start=edges[0], end=edges[-1], size=size),
                      marker_color="#1f77b4", opacity=0.55)
    fig.add_histogram(x=w, name="after clipping min(‖gᵢ‖, C)", xbins=dict(start=edges[0], end=edges[-1], size=size),
                      marker_color=PRIVATE_COLOR, opacity=0.55)
    fig.add_vline(x=float(f(np.array([clip_norm]))[0]), line=dict(color=FLIPPED_COLOR, width=2, dash="dash"),
                  annotation_text="C", annotation_position="top")
    fig.update_layout(barmode="overlay", legend=dict(orientation="h", y=-0.22))
    if log:
        _decades(fig, np.concatenate([v, w]))
    return style_figure(fig, "Per-example norms before and after clipping at C",
                   f"{NORM_LABEL} (log scale)" if log else NORM_LABEL, "number of training examples", height=420)


def _mark_log_x(fig: go.Figure, x: float, text: str, color: str) -> None:
    """A vertical line at data value `x` on a log x axis, labelled `text` at its top. Plotly places shapes in data
    units but annotations on a log axis in log₁₀ units (plotly.js#1258), so the label takes log₁₀(x)."""
    fig.add_vline(x=x, line=dict(color=color, width=2))
    fig.add_annotation(x=float(np.log10(x)), xref="x", y=1.0, yref="paper", text=text, showarrow=False,
                       xanchor="right", yanchor="bottom", font=dict(color=color))


@figure
def clipping_bias_curve(grid: np.ndarray, cosine: np.ndarray, norm_ratio: np.ndarray, clip_norm: float, *,
                        cosine_layer: np.ndarray | None = None, norm_ratio_layer: np.ndarray | None = None,
                        fraction_clipped: np.ndarray | None = None) -> go.Figure:
    """Bias of clipping as C varies: cos∠(Ḡ_C, G) and ‖Ḡ_C‖/‖G‖ (flat solid, per-layer dashed), C marked."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=grid, y=cosine, mode="lines", name="cosine (flat clipping)", line=dict(color=COSINE_COLOR)))
    fig.add_trace(go.Scatter(x=grid, y=norm_ratio, mode="lines", name="norm ratio (flat)", line=dict(color=NORM_RATIO_COLOR)))
    if cosine_layer is not None:
        fig.add_trace(go.Scatter(x=grid, y=cosine_layer, mode="lines", name="cosine (per-layer, C/√L each)",
                                 line=dict(color=COSINE_COLOR, dash="dash")))
    if norm_ratio_layer is not None:
        fig.add_trace(go.Scatter(x=grid, y=norm_ratio_layer, mode="lines", name="norm ratio (per-layer)",
                                 line=dict(color=NORM_RATIO_COLOR, dash="dash")))
    if fraction_clipped is not None:
        fig.add_trace(go.Scatter(x=grid, y=fraction_clipped, mode="lines", name="fraction clipped (flat)",
                                 line=dict(color="gray", dash="dot")))
    fig.update_xaxes(type="log")
    _mark_log_x(fig, float(clip_norm), "current C", FLIPPED_COLOR)
    shown = np.concatenate([np.asarray(v, np.float64) for v in (cosine, norm_ratio, cosine_layer, norm_ratio_layer)
                            if v is not None])
    shown = shown[np.isfinite(shown)]
    top = max(1.08, float(shown.max()) * 1.05) if shown.size else 1.08  # the norm ratio can exceed 1
    fig.update_yaxes(range=[min(-0.05, float(shown.min()) - 0.05) if shown.size else -0.05, top])
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return style_figure(fig, "Clipping bias: clipped mean Ḡ_C vs true mean G",
                   "clipping norm C (log scale)", "cos∠(Ḡ_C, G)  ·  ‖Ḡ_C‖/‖G‖  ·  fraction clipped", height=460)


@figure
def per_class_clipping(class_names, fraction_clipped: np.ndarray, cosine: np.ndarray, norm_ratio: np.ndarray,
                       clip_norm: float) -> go.Figure:
    """Per class at C: fraction of examples clipped and the bias of the class's clipped mean gradient."""
    names = [str(c) for c in class_names]
    # the right plot's title names its two bars in their colours: the legend sits under the plot, below a projector's
    # first screen when a lecture step opens on this figure (step 9)
    key = (f"<span style='color:{COSINE_COLOR}'>cos∠</span> and <span style='color:{NORM_RATIO_COLOR}'>norm ratio</span> of the "
           "class's<br>clipped mean gradient (its bias)")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.16,  # room for the right plot's y title
                        subplot_titles=("fraction of the class<br>clipped", key))
    fig.add_trace(go.Bar(x=names, y=fraction_clipped, name="fraction clipped", marker_color=PRIVATE_COLOR), 1, 1)
    fig.add_trace(go.Bar(x=names, y=cosine, name="cos∠(Ḡ_C,k, G_k)", marker_color=COSINE_COLOR), 1, 2)
    fig.add_trace(go.Bar(x=names, y=norm_ratio, name="‖Ḡ_C,k‖/‖G_k‖", marker_color=NORM_RATIO_COLOR), 1, 2)
    fig.update_xaxes(title_text="class", type="category")
    fig.update_yaxes(title_text="fraction clipped", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title_text="cosine · norm ratio", range=[0, 1.05], row=1, col=2)
    fig.update_layout(barmode="group", legend=dict(orientation="h", y=-0.25))
    return style_figure(fig, f"Per class at C = {clip_norm:.3g}: who gets clipped, whose gradient is distorted",
                   "class", "", height=420)


@figure
def signal_noise_curve(grid: np.ndarray, clipped_mean_norm: np.ndarray, noise_norm: np.ndarray, clip_norm: float,
                       *, noise_std: np.ndarray | None = None) -> go.Figure:
    """Signal ‖Ḡ_C‖ against the noise norm σC√P/B as C varies (log-log), current C marked."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=grid, y=clipped_mean_norm, mode="lines", name="signal ‖Ḡ_C‖ (clipped mean gradient)",
                             line=dict(color="#1f77b4")))
    fig.add_trace(go.Scatter(x=grid, y=noise_norm, mode="lines", name="noise norm σ·C·√P / B",
                             line=dict(color=FLIPPED_COLOR)))
    if noise_std is not None:
        fig.add_trace(go.Scatter(x=grid, y=noise_std, mode="lines", name="noise std per coordinate σ·C / B",
                                 line=dict(color=FLIPPED_COLOR, dash="dot")))
    fig.update_xaxes(type="log")
    _mark_log_x(fig, float(clip_norm), "current C", "black")
    fig.update_yaxes(type="log")
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return style_figure(fig, "Signal vs noise in one DP-SGD step", "clipping norm C (log scale)",
                   "norm of the averaged update (log scale)", height=440)


@figure
def dp_accuracy_curves(curves: dict[str, tuple[np.ndarray, np.ndarray]], *, title: str = "Test accuracy during training") -> go.Figure:
    """Test accuracy vs training step, one line per run `{name: (steps, accuracy)}` (private first)."""
    fig = go.Figure()
    colors = [PRIVATE_COLOR, NONPRIVATE_COLOR, "#2ca02c", "#ff7f0e"]
    for (name, (steps, acc)), color in zip(curves.items(), colors):
        fig.add_trace(go.Scatter(x=steps, y=np.asarray(acc) * 100, mode="lines+markers", name=name, line=dict(color=color)))
    fig.update_yaxes(range=[0, 100])
    fig.update_layout(legend=dict(orientation="h", y=-0.22))
    return style_figure(fig, title, "training step", "test accuracy (%)", height=400)


@figure
def epsilon_curve(steps: np.ndarray, epsilons: np.ndarray, *, delta: float, accountant: str,
                  target: float | None = None) -> go.Figure:
    """ε spent vs training step (at fixed δ), the target ε as a horizontal line."""
    fig = go.Figure(go.Scatter(x=steps, y=epsilons, mode="lines+markers", name=f"ε ({accountant})",
                               line=dict(color=PRIVATE_COLOR)))
    if target is not None and np.isfinite(target):
        fig.add_hline(y=float(target), line=dict(color=FLIPPED_COLOR, dash="dash"), annotation_text=f"target ε = {target:g}")
    fig.update_layout(showlegend=False)
    return style_figure(fig, f"Privacy spent: ε after each step at δ = {delta:g} ({accountant})", "training step",
                   "ε (privacy loss bound)", height=400)


@figure
def per_class_accuracy(class_names, private: np.ndarray, nonprivate: np.ndarray) -> go.Figure:
    """Per-class test accuracy of the private and the non-private model, side by side."""
    names = [str(c) for c in class_names]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=names, y=np.asarray(private) * 100, name="DP-SGD", marker_color=PRIVATE_COLOR))
    fig.add_trace(go.Bar(x=names, y=np.asarray(nonprivate) * 100, name="non-private", marker_color=NONPRIVATE_COLOR))
    fig.update_xaxes(type="category")
    fig.update_yaxes(range=[0, 100])
    fig.update_layout(barmode="group", legend=dict(orientation="h", y=-0.22))
    return style_figure(fig, "Per-class test accuracy: private vs non-private (who pays for privacy)", "class",
                   "test accuracy (%)", height=400)


# ---------------------------------------------------------------- equivalence and performance

FLOAT32_COLOR = "#1f77b4"
FLOAT64_COLOR = "#ff7f0e"
APPROACH_COLORS = {"loop": "#7f7f7f", "vmap": "#1f77b4", "rules": "#17becf", "batch": "#2ca02c",
                   "norms_vmap": "#9467bd", "norms": "#d62728"}
#: Each approach's name in a figure's colour key (`_colour_key`): short enough for four on one line at half width.
APPROACH_SHORT = {"loop": "Python loop", "vmap": "vmap(grad)", "rules": "layer rules", "batch": "batch gradient",
                  "norms_vmap": "norms (vmap)", "norms": "streamed norms"}


def _colour_key(fig: go.Figure, approaches) -> go.Figure:
    """Name `approaches` (keys of `APPROACH_COLORS`) in their colours under the title (a subtitle). The legend sits
    under the plot, below a projector's first screen when a lecture step opens on the figure (step 4), so without the
    key the lines' colours said nothing there. Call after `style_figure` (which escapes the title, not this)."""
    key = " ".join(f"<span style='color:{APPROACH_COLORS[a]}'>━ {APPROACH_SHORT[a]}</span>" for a in approaches
                   if a in APPROACH_SHORT)
    if key:
        fig.update_layout(title_subtitle_text=key)  # `readable` wraps it and makes room for it
    return fig


@figure
def equivalence_bars(names: list[str], rel32, rel64, *, reduction: str = "sum") -> go.Figure:
    """Per parameter leaf: max relative |way (a) − way (b)| in float32 and float64 (log scale).

    A log axis has no zero: an exact zero gets no bar, and the words "exact 0" at the bottom of
    its group instead. `reduction` ("sum" or "mean") names the two ways in the title.
    """
    fig = go.Figure()
    nonzero = [v for vals in (rel32, rel64) for v in np.asarray(vals, np.float64) if v > 0]
    for label, vals, color, shift in (("float32", rel32, FLOAT32_COLOR, -0.2), ("float64", rel64, FLOAT64_COLOR, 0.2)):
        vals = np.asarray(vals, np.float64)
        fig.add_bar(x=names, y=np.where(vals > 0, vals, np.nan), name=label, marker_color=color,
                    text=["" if v == 0 else f"{v:.1e}" for v in vals], textposition="outside", cliponaxis=False)
        for i, v in enumerate(vals):
            if v == 0:
                fig.add_annotation(x=i + shift, xref="x", y=0.02, yref="paper", text="exact 0", showarrow=False,
                                   textangle=-90, yanchor="bottom", font=dict(color=color))
    for label, eps, color in (("float32 ε ≈ 1.2e-7", np.finfo(np.float32).eps, FLOAT32_COLOR),
                              ("float64 ε ≈ 2.2e-16", np.finfo(np.float64).eps, FLOAT64_COLOR)):
        fig.add_scatter(x=[names[0], names[-1]] if names else [], y=[eps, eps], mode="lines", name=label,
                        line=dict(dash="dot", color=color))
    lo = min([*nonzero, np.finfo(np.float64).eps]) / 10
    hi = max([*nonzero, np.finfo(np.float32).eps]) * 100
    fig.update_yaxes(type="log", range=[np.log10(lo), np.log10(hi)], exponentformat="power", dtick=2)
    fig.update_layout(barmode="group", legend=dict(orientation="h", y=-0.3))
    return style_figure(fig, f"vmap(grad(f)).{reduction}(0) vs grad({reduction}(vmap(f))): max relative difference per leaf",
                   "parameter leaf", "max |a − b| / max |b|")


@figure
def timing_vs_n(rows: list[dict], labels: dict[str, str], reference: list[dict] | None = None) -> go.Figure:
    """Log-log run time vs batch size N, one line per approach. `rows`: dicts with approach, n, run_s.
    `reference`: stored timings of the same view (dicts with approach, n, min_s), drawn dashed in the same colours."""
    fig = go.Figure()
    for a, label in labels.items():
        pts = sorted((r["n"], r["run_s"]) for r in rows if r["approach"] == a)
        if pts:
            n, t = zip(*pts)
            fig.add_scatter(x=n, y=np.asarray(t) * 1e3, mode="lines+markers", name=label, legendgroup=a,
                            line_color=APPROACH_COLORS.get(a))
        ref = sorted((r["n"], r["min_s"]) for r in reference or () if r["approach"] == a)
        if ref:
            n, t = zip(*ref)
            fig.add_scatter(x=n, y=np.asarray(t) * 1e3, mode="lines", name=f"{label}, reference", legendgroup=a,
                            showlegend=False, line=dict(color=APPROACH_COLORS.get(a), dash="dash", width=1.5))
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    title = "Run time vs batch size: live (solid), reference (dashed)" if reference else \
        "Run time vs batch size (compile excluded)"
    style_figure(fig, title, "batch size N (log)", "time per call, ms (log)", height=460)
    return _colour_key(fig, [a for a in labels if any(r["approach"] == a for r in rows)])


@figure
def speedup_vs_loop(rows: list[dict], labels: dict[str, str]) -> go.Figure:
    """Log-log speed-up over the Python loop (loop time / approach time) vs N."""
    loop = {r["n"]: r["run_s"] for r in rows if r["approach"] == "loop"}
    fig = go.Figure()
    shown = [1.0]
    for a, label in labels.items():
        if a == "loop":
            continue
        pts = sorted((r["n"], loop[r["n"]] / r["run_s"]) for r in rows if r["approach"] == a and r["n"] in loop)
        if pts:
            n, s = zip(*pts)
            shown += [v for v in s if v > 0]
            fig.add_scatter(x=n, y=s, mode="lines+markers", name=label, line_color=APPROACH_COLORS.get(a))
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_xaxes(type="log")
    # within two decades (speed-ups of 1 to ~30), label 2 and 5 too: Plotly's own choice labelled only "10"
    fig.update_yaxes(type="log", **({"dtick": "D2"} if np.log10(max(shown) / min(shown)) < 2 else {}))
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    style_figure(fig, "Speed-up over the Python loop of jax.grad", "batch size N (log)", "loop time / time (log)", height=460)
    return _colour_key(fig, [a for a in labels if a != "loop" and any(r["approach"] == a and r["n"] in loop for r in rows)])


@figure
def memory_bars(labels: list[str], needed_bytes, xla_bytes=None) -> go.Figure:
    """Memory per approach: what it must hold by construction (and XLA's allocation), log MB. Horizontal bars: the
    approaches' names are long, and as column labels they turned on their side, took half the figure's height and ran
    into each other at 1024 px (issue 41)."""
    fig = go.Figure()
    fig.add_bar(y=labels, x=np.asarray(needed_bytes, np.float64) / 1e6, name="by construction (N×P×4 or chunk×P×4)",
                orientation="h", marker_color=FLOAT32_COLOR, text=[f"{b / 1e6:.3g} MB" for b in needed_bytes],
                textposition="outside", cliponaxis=False)
    if xla_bytes is not None:
        fig.add_bar(y=labels, x=np.asarray(xla_bytes, np.float64) / 1e6, name="XLA temporaries + outputs",
                    orientation="h", marker_color=FLOAT64_COLOR, text=[f"{b / 1e6:.3g} MB" for b in xla_bytes],
                    textposition="outside", cliponaxis=False)
    shown = [v for v in np.concatenate([np.ravel(needed_bytes), np.ravel(xla_bytes if xla_bytes is not None else [])])
             .astype(np.float64) / 1e6 if v > 0]
    lo, hi = (np.log10(min(shown)), np.log10(max(shown))) if shown else (-3.0, 0.0)
    # room right of the longest bar for its "4.93 MB" (drawn outside the bar, it was cut at the figure's edge)
    fig.update_xaxes(type="log", range=[lo - 0.5, hi + 0.25 * (hi - lo) + 0.6])
    fig.update_yaxes(autorange="reversed")  # in the order given, top down
    fig.update_layout(barmode="group")
    return style_figure(fig, "Memory each approach needs", "MB (log)", "", height=120 + 60 * len(labels) * (1 + (xla_bytes is not None)))


# ---------------------------------------------------------------- geometry: two parameters on the screen

CLASS_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c")
METHOD_COLORS = {"sgd": "#1f77b4", "clipped": "#9467bd", "dp": "#2ca02c"}
CLIPPED_COLOR = "#9467bd"


def _arrows(fig: go.Figure, start, ends, color: str, width: float, name: str, *, opacity: float = 1.0,
            legend: bool = True) -> None:
    """Arrows from `start (2,)` to each row of `ends (K, 2)` as ONE trace: segments with an arrowhead
    marker at the tip (`angleref="previous"` turns it along the segment); 60 annotations take seconds."""
    ends = np.atleast_2d(np.asarray(ends, np.float64))
    if not len(ends):
        return
    x, y, size = [], [], []
    for e in ends:
        x += [float(start[0]), float(e[0]), None]
        y += [float(start[1]), float(e[1]), None]
        size += [0, 9 + 2.5 * width, 0]
    fig.add_scatter(x=x, y=y, mode="lines+markers", name=name, opacity=opacity, showlegend=legend,
                    line=dict(color=color, width=width), hoverinfo="skip",
                    marker=dict(symbol="arrow", angleref="previous", size=size, color=color))


@figure
def gradient_field(surface, theta, grads, mean, *, scale: float, labels, marked, marked_name: str = "",
                   param_names=("w", "b"), clip_norm: float | None = None, clipped=None, clipped_mean=None,
                   cloud=None, trajectories: dict | None = None, removal=None, title: str = "") -> go.Figure:
    """The loss surface over two parameters with every example's gradient as an arrow from `theta`.

    **Arguments**
    - `surface`: `(θ₀ (R,), θ₁ (R,), mean loss (R, R))` from `gradlab.geometry.loss_surface`.
    - `theta (2,)`: the current point; `grads (N, 2)`: per-example gradients; `mean (2,)` their mean.
    - `scale`: arrows are drawn from θ to θ + scale·gᵢ (one scale for every arrow, the clipping ball and the cloud).
    - `labels (N,)` class index for the colour; `marked (N,) bool` drawn red and thicker (outliers, flipped labels).
    - `clip_norm` C with `clipped (N, 2)` and `clipped_mean (2,)`: the ball of radius C and the clipped arrows.
    - `cloud (S, 2)`: possible noisy DP steps (clipped mean + noise) as dots.
    - `trajectories`: `{method: (T, 2) path}`; `removal`: a `gradlab.geometry.Removal`.
    """
    a, b, z = surface
    theta = np.asarray(theta, np.float64)
    fig = go.Figure(go.Contour(x=a, y=b, z=np.log10(np.maximum(z, 1e-12)), colorscale="Blues", reversescale=True,
                               opacity=0.55, ncontours=18, showscale=False, name="mean loss (log₁₀)",
                               contours=dict(showlabels=False), hovertemplate="%{x:.2f}, %{y:.2f}<extra>loss surface</extra>"))
    if clip_norm is not None:
        t = np.linspace(0, 2 * np.pi, 120)
        r = scale * clip_norm
        fig.add_scatter(x=theta[0] + r * np.cos(t), y=theta[1] + r * np.sin(t), mode="lines", name=f"clipping ball ‖g‖ ≤ C = {clip_norm:g}",
                        line=dict(color=CLIPPED_COLOR, width=2, dash="dash"), hoverinfo="skip")
    if cloud is not None:
        c = theta + scale * np.asarray(cloud)
        fig.add_scatter(x=c[:, 0], y=c[:, 1], mode="markers", name="DP noise: possible noisy clipped means",
                        marker=dict(size=4, color="#2ca02c", opacity=0.45), hoverinfo="skip")
    marked = np.asarray(marked, bool)
    labels = np.asarray(labels, int)
    shown = np.asarray(clipped if clipped is not None else grads, np.float64)
    word = "clipped gᵢ" if clipped is not None else "per-example gradient gᵢ"
    classes = sorted(set(labels.tolist()))
    for k in classes:
        sel = (labels == k) & ~marked
        _arrows(fig, theta, theta + scale * shown[sel], CLASS_COLORS[k % len(CLASS_COLORS)], 1.6,
                f"{word}, class {k}" if len(classes) > 1 else word, opacity=0.7)
    if marked.any():
        article = "an" if marked_name[:1] and marked_name[0] in "aeiou" else "a"
        _arrows(fig, theta, theta + scale * shown[marked], FLIPPED_COLOR, 2.8, f"{word} of {article} {marked_name}")
    _arrows(fig, theta, theta + scale * np.asarray(mean)[None, :], "#000000", 5, "mean gradient (batch_grad)")
    if clipped_mean is not None:
        _arrows(fig, theta, theta + scale * np.asarray(clipped_mean)[None, :], CLIPPED_COLOR, 5, "clipped mean")
    for method, path in (trajectories or {}).items():
        path = np.asarray(path)
        fig.add_scatter(x=path[:, 0], y=path[:, 1], mode="lines+markers", name=f"{_METHOD_NAMES.get(method, method)} path",
                        line=dict(color=METHOD_COLORS.get(method, "#444"), width=3), marker=dict(size=5))
    if removal is not None:
        for point, name, symbol, color in ((removal.optimum, "optimum θ*", "star", "gold"),
                                           (removal.retrained, f"θ* without #{removal.index} (retrained)", "x", "#d62728"),
                                           (removal.predicted, "influence-function prediction", "diamond-open", "#111111")):
            fig.add_scatter(x=[point[0]], y=[point[1]], mode="markers", name=name,
                            marker=dict(size=16, symbol=symbol, color=color, line=dict(color="#111111", width=1.5)))
    fig.add_scatter(x=[theta[0]], y=[theta[1]], mode="markers", name="current θ",
                    marker=dict(size=13, color="#111111", symbol="circle"))
    (x0, x1), (y0, y1) = _frame(fig, (float(a[0]), float(a[-1])), (float(b[0]), float(b[-1])))
    fig.update_xaxes(range=[x0, x1], constrain="domain")
    fig.update_yaxes(range=[y0, y1], scaleanchor="x", scaleratio=1, constrain="domain")
    fig.update_layout(legend=dict(orientation="h", y=-0.18, x=0, yanchor="top"), hovermode="closest")
    return style_figure(fig, title or f"Per-example gradients gᵢ at θ on the loss contours (arrows ×{scale:.2g})",
                   f"{param_names[0]} (parameter 1)", f"{param_names[1]} (parameter 2)", height=640)


_METHOD_NAMES = {"sgd": "SGD", "clipped": "clipped SGD", "dp": "DP-SGD"}


@figure
def removal_zoom(removal, param_names=("w", "b")) -> go.Figure:
    """Two close-ups of where removing one example moves the optimum. Left: θ* (star), the retrained θ*₋ᵢ (cross) and
    the influence-function prediction (diamond), on axes fitted to the three points (the move is often a hundredth of
    the loss surface's window). Right: zoomed on the moved optimum, fitted to the cross and the diamond alone, so the
    prediction's error shows apart from the move (a good prediction lands on the cross at the left's scale)."""
    points = [(removal.optimum, "optimum θ*", "star", "gold"),
              (removal.retrained, f"θ* without #{removal.index} (retrained)", "x", "#d62728"),
              (removal.predicted, "influence-function prediction", "diamond-open", "#111111")]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.14,
                        subplot_titles=("the move", "zoomed on the moved optimum"))
    for col in (1, 2):
        for point, name, symbol, color in points[col - 1:]:  # the star has no place at the right's scale
            fig.add_scatter(x=[float(point[0])], y=[float(point[1])], mode="markers", name=name, showlegend=col == 1,
                            legendgroup=name, marker=dict(size=18 if col == 1 else 22, symbol=symbol, color=color,
                                                          line=dict(color="#111111", width=1.5)), row=1, col=col)
    fig.add_scatter(x=[float(removal.optimum[0]), float(removal.retrained[0])],
                    y=[float(removal.optimum[1]), float(removal.retrained[1])], mode="lines", showlegend=False,
                    line=dict(color="#d62728", dash="dot"), hoverinfo="skip", row=1, col=1)
    for col, pts in ((1, [p[0] for p in points]), (2, [p[0] for p in points[1:]])):
        pts = np.array(pts, np.float64)
        half = max(float(np.ptp(pts, 0).max()), 1e-9) * (0.8 if col == 1 else 1.0)
        mid = (pts.max(0) + pts.min(0)) / 2
        fig.update_xaxes(range=[mid[0] - half, mid[0] + half], row=1, col=col, nticks=4)
        fig.update_yaxes(range=[mid[1] - half, mid[1] + half], row=1, col=col, nticks=5,
                         scaleanchor="x" if col == 1 else "x2", scaleratio=1)
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    fig = style_figure(fig, "Close-up: the optimum moves, the influence function predicts where",
                       f"{param_names[0]} (parameter 1)", f"{param_names[1]} (parameter 2)", height=420)
    fig.update_xaxes(title_text=f"{param_names[0]} (parameter 1)", row=1, col=2)
    return fig


@figure
def scalar_gradients(per_example, summed_loss_grad) -> go.Figure:
    """The seeds' example: one bar per example's gradient (vmap(grad)), their sum, and the gradient of the summed
    loss (grad(sum)): the last two are equal."""
    per_example = [float(v) for v in np.ravel(per_example)]
    names = [f"g{i + 1} (example {i + 1})" for i in range(len(per_example))] + ["Σᵢ gᵢ", "∇ Σᵢ ℓᵢ"]
    values = per_example + [sum(per_example), float(summed_loss_grad)]
    colors = ["#1f77b4"] * len(per_example) + ["#ff7f0e", "#2ca02c"]
    fig = go.Figure(go.Bar(x=names, y=values, marker_color=colors, text=[f"{v:g}" for v in values],
                           textposition="outside"))
    fig.update_yaxes(range=[0, max(values) * 1.2])
    return style_figure(fig, "Per-example gradients, their sum, and the gradient of the summed loss",
                        "", "gradient in w", height=400)


def _frame(fig: go.Figure, xr: tuple[float, float], yr: tuple[float, float], margin: float = 0.04):
    """Axis ranges that hold the surface's window and every point drawn on it (arrow tips, the clipping ball,
    the noise cloud, paths, markers), with a `margin` (a fraction of the span) around them: no arrow is cut."""
    xs, ys = [*xr], [*yr]
    for trace in fig.data:
        if trace.type == "scatter" and trace.x is not None:
            xs += [float(v) for v in trace.x if v is not None]
            ys += [float(v) for v in trace.y if v is not None]
    lo_x, hi_x, lo_y, hi_y = min(xs), max(xs), min(ys), max(ys)
    pad_x, pad_y = margin * (hi_x - lo_x), margin * (hi_y - lo_y)
    return (lo_x - pad_x, hi_x + pad_x), (lo_y - pad_y, hi_y + pad_y)


@figure
def geometry_data(xs, ys, theta, *, labels, marked, marked_name: str = "", removed: int | None = None,
                  kind: str = "line", title: str = "Training examples: click one to remove it") -> go.Figure:
    """The training data of a two-parameter problem, clickable (`customdata[0]` = example index); a hover names
    each example by its index in the problem's arrays and shows its input and target.

    `kind="line"`: points (x, y) and the line y = θ₀·x + θ₁; `kind="logistic"`: 2-D inputs coloured
    by label and the decision boundary θ·x = 0. `removed` is crossed out.
    """
    xs, ys, theta = np.asarray(xs, np.float64), np.asarray(ys, np.float64), np.asarray(theta, np.float64)
    marked, labels = np.asarray(marked, bool), np.asarray(labels, int)
    pts = np.stack([xs, ys], 1) if kind == "line" else xs
    colors = [FLIPPED_COLOR if m else CLASS_COLORS[c % 3] for m, c in zip(marked, labels)]
    n = len(pts)
    inputs = {"x": xs, "y": ys} if kind == "line" else {"x₁": xs[:, 0], "x₂": xs[:, 1], "label y": ys}
    custom, who = _identified({"example": np.arange(n), "index": np.arange(n), **inputs,
                               **({marked_name: np.where(marked, "yes", "no")} if marked_name else {})}, n)
    fig = go.Figure(go.Scatter(x=pts[:, 0], y=pts[:, 1], mode="markers", customdata=custom,
                               marker=dict(size=11, color=colors, line=dict(color="#111111", width=0.8)),
                               name="training examples (red: " + (marked_name or "marked") + ")",
                               hovertemplate=who + "<extra></extra>"))
    lo, hi = float(pts[:, 0].min()) - 0.3, float(pts[:, 0].max()) + 0.3
    if kind == "line":
        fig.add_scatter(x=[lo, hi], y=[theta[0] * lo + theta[1], theta[0] * hi + theta[1]], mode="lines",
                        name="fit y = w·x + b at θ", line=dict(color="#111111", width=3))
    elif abs(theta[1]) > 1e-9:
        fig.add_scatter(x=[lo, hi], y=[-theta[0] * lo / theta[1], -theta[0] * hi / theta[1]], mode="lines",
                        name="decision boundary θ·x = 0", line=dict(color="#111111", width=3))
        fig.update_yaxes(range=[float(pts[:, 1].min()) - 0.5, float(pts[:, 1].max()) + 0.5])
    if removed is not None and 0 <= removed < len(pts):
        fig.add_scatter(x=[pts[removed, 0]], y=[pts[removed, 1]], mode="markers", name=f"removed #{removed}",
                        marker=dict(size=22, symbol="x-open", color="#111111", line=dict(width=3)))
    fig.update_layout(clickmode="event+select", legend=dict(orientation="h", y=-0.25))
    names = ("x", "y") if kind == "line" else ("x₁", "x₂")
    return style_figure(fig, title, names[0], names[1], height=460)


# ---------------------------------------------------------------- influence: the linear datamodeling score


@figure
def lds_bars(names: list[str], means, per_test: list, *, m: int) -> go.Figure:
    """Each method's LDS (mean over test points) as a bar, with every test point's Spearman ρ as dots."""
    fig = go.Figure(go.Bar(x=names, y=np.asarray(means, np.float64), name="LDS (mean over test points)",
                           marker_color="#1f77b4", text=[f"{v:.3f}" for v in means], textposition="outside"))
    for name, rho in zip(names, per_test):
        rho = np.asarray(rho, np.float64)
        fig.add_trace(go.Box(x=[name] * len(rho), y=rho, name=name, boxpoints="all", jitter=0.4, pointpos=0,
                             marker=dict(size=4, color="#7f7f7f"), line=dict(width=0), fillcolor="rgba(0,0,0,0)",
                             showlegend=False, hovertemplate="Spearman ρ %{y:.3f}<extra></extra>"))
    fig.update_yaxes(range=[-1, 1.1])
    return style_figure(fig, f"Linear datamodeling score over {m} models trained on random halves",
                   "attribution method", "Spearman ρ(predicted, actual output)", height=420)


# ---------------------------------------------------------------- the per-example record (issue 43)

@figure
def norm_over_training(steps, norms: np.ndarray, everyone: np.ndarray | None = None, *, clip_norm: float | None = None,
                       name: str = "this example") -> go.Figure:
    """One example's gradient norm at each checkpoint (`steps (K,)`, `norms (K,)`), beside the median and the 10–90%
    band of every example's (`everyone (K, n)`) and the clipping norm C as a line."""
    fig = go.Figure()
    if everyone is not None:
        q10, q50, q90 = np.percentile(np.asarray(everyone, np.float64), [10, 50, 90], axis=1)
        fig.add_trace(go.Scatter(x=list(steps) + list(steps)[::-1], y=list(q90) + list(q10)[::-1], fill="toself", mode="lines",
                                 fillcolor="rgba(31,119,180,0.15)", line=dict(width=0), name="10–90% of examples",
                                 hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=steps, y=q50, mode="lines", name="median example", line=dict(color="#1f77b4", dash="dash")))
    fig.add_trace(go.Scatter(x=steps, y=norms, mode="lines+markers", name=name, line=dict(color="#111111", width=3)))
    if clip_norm is not None:
        fig.add_hline(y=clip_norm, line=dict(color=FLIPPED_COLOR, dash="dot"))
        # on a log axis an annotation's y is log10 of the value (add_hline's own annotation took C as the exponent)
        fig.add_annotation(x=0, xref="paper", y=float(np.log10(max(clip_norm, 1e-30))), yref="y", showarrow=False,
                           text=f"C = {clip_norm:.3g}", xanchor="left", yanchor="bottom", font=dict(color=FLIPPED_COLOR))
    fig.update_yaxes(type="log")
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return style_figure(fig, "Its gradient norm over training", "training step (checkpoint)", "‖gᵢ‖ (log scale)", height=360)


@figure
def quantity_scatter(x: np.ndarray, y: np.ndarray, *, x_label: str, y_label: str, flipped: np.ndarray | None = None,
                     ids: dict | None = None, selected: int | None = None, title: str = "") -> go.Figure:
    """Two per-example quantities against each other for every training example (`x, y (n,)`), planted flipped
    labels in red, the example at position `selected` circled; each point's `customdata[0]` is its example (a click
    reads it back). Both axes on a log scale when their values are positive and span over two decades."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    custom, who = _identified(ids, len(x))
    custom = np.asarray(custom, dtype=object)
    flipped = np.zeros(len(x), bool) if flipped is None else np.asarray(flipped, bool)
    fig = go.Figure()
    for name, mask, color in (("clean label", ~flipped, "#1f77b4"), ("flipped label (planted)", flipped, FLIPPED_COLOR)):
        if mask.any():
            fig.add_trace(go.Scattergl(x=x[mask], y=y[mask], mode="markers", name=name, customdata=custom[mask].tolist(),
                                       marker=dict(color=color, size=7, opacity=0.7),
                                       hovertemplate=who + f"<br>{escape.plotly(x_label, template=True)} %{{x:.3g}}"
                                       f"<br>{escape.plotly(y_label, template=True)} %{{y:.3g}}<extra></extra>"))
    if selected is not None and 0 <= selected < len(x):
        fig.add_trace(go.Scatter(x=[x[selected]], y=[y[selected]], mode="markers", name="this example",
                                 marker=dict(size=18, color="rgba(0,0,0,0)", line=dict(color="#111111", width=3)),
                                 hoverinfo="skip"))
    for axis, v in (("x", x), ("y", y)):
        if np.all(v[np.isfinite(v)] > 0) and np.nanmax(v) > 100 * np.nanmin(v):
            fig.update_layout(**{f"{axis}axis_type": "log"})
    fig.update_layout(legend=dict(orientation="h", y=-0.2), clickmode="event+select")
    return style_figure(fig, title, x_label, y_label, height=460)
