"""Plotly figures of the privacy audit page: membership-inference ROCs with the DP bound, the audit's
ε lower bound against trials, and its observations. Pure functions, data in, `go.Figure` out."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from gradlab.membership import dp_roc_bound
from gradlab.plots import TEMPLATE, figure, style_figure

FLOOR = 1e-4  # log axes: rates below this are drawn at it
#: The x axis of `observation_histogram` for each canary of `gradlab.audit.CANARIES`: what its auditor observes.
OBSERVATION = {"gradient": "−Δθ_canary·qN/C (gradient canary)", "input": "model's margin on the canary"}


@figure
def roc_loglog(curves: dict[str, tuple[np.ndarray, np.ndarray, float]], *, epsilon: float | None, delta: float,
               floor: float = FLOOR, title: str = "Membership inference ROC (log-log)", height: int = 480,
               axes: tuple[str, str] = ("false positive rate (non-members called members)",
                                        "true positive rate (members found)")) -> go.Figure:
    """ROC curves `{name: (fpr, tpr, auc)}` on log-log axes, the chance line, and the (ε, δ)-DP bound on
    any attack's ROC (TPR ≤ e^ε·FPR + δ and its mirror). `floor`: the smallest FPR the data can measure
    (1 / number of non-members); smaller rates, 0 included, are drawn at it. With no curves: the bound alone,
    what the promise allows before any attack ran. `height` in px; `axes`: the (x, y) axis titles."""
    fig = go.Figure()
    grid = np.geomspace(floor, 1, 200)
    for name, (fpr, tpr, auc) in curves.items():
        fig.add_trace(go.Scatter(x=np.maximum(fpr, floor), y=np.maximum(tpr, FLOOR), mode="lines",
                                 name=f"{name} (AUC {auc:.3f})", line=dict(dash="dash" if "loss" in name else "solid")))
    fig.add_trace(go.Scatter(x=grid, y=grid, mode="lines", name="chance (TPR = FPR)", line=dict(dash="dot", color="gray")))
    if epsilon is not None and np.isfinite(epsilon):
        fig.add_trace(go.Scatter(x=grid, y=np.maximum(dp_roc_bound(grid, epsilon, delta), FLOOR), mode="lines",
                                 name=f"DP bound, ε = {epsilon:.2f}, δ = {delta:g}",
                                 line=dict(color="black", width=3), fill=None))
    fig.update_xaxes(type="log", range=[np.log10(floor), 0])
    fig.update_yaxes(type="log", range=[np.log10(FLOOR), 0])
    # under the axis title, never over the curves: the same ~100 px below the axes at any height
    fig.update_layout(legend=dict(orientation="h", y=-0.22 * 480 / max(int(height), 240), yanchor="top"))
    return style_figure(fig, title, *axes, height=height)


@figure
def epsilon_vs_trials(trials: np.ndarray, lower: np.ndarray | dict[str, np.ndarray], claimed: float, *,
                      confidence: float = 0.95, title: str = "Empirical ε lower bound as trials grow") -> go.Figure:
    """The audit's lower bound from the first n trials against n (log x), with the accountant's ε.

    `lower (K,)` is one bound's curve, or a dict of curves by estimator name (one line each)."""
    curves = lower if isinstance(lower, dict) else {"ε lower bound": lower}
    fig = go.Figure([go.Scatter(x=trials, y=c, mode="lines+markers", name=name) for name, c in curves.items()])
    fig.add_hline(y=claimed, line=dict(color="black", dash="dash"), annotation_text=f"accountant's ε = {claimed:.2f}")
    fig.update_xaxes(type="log")
    fig.update_layout(legend=dict(orientation="h", y=-0.3, x=0))
    return style_figure(fig, title, "trials (training runs with or without the canary)",
                        f"ε lower bound ({confidence:.0%} confidence)", height=420)


@figure
def observation_histogram(scores: np.ndarray, is_in: np.ndarray, threshold: float, *, xlabel: str,
                          title: str = "What the auditor observes", marked: float | None = None,
                          marked_name: str = "this trial") -> go.Figure:
    """Histograms of the observation with and without the canary (`scores (n,)`, `is_in (n,)`), and the test's
    threshold; `marked`: one trial's observation drawn as a line named `marked_name` (the canary's record card)."""
    fig = go.Figure()
    for label, mask, color in (("canary out", ~is_in, "#1f77b4"), ("canary in", is_in, "#d62728")):
        fig.add_trace(go.Histogram(x=scores[mask], name=label, opacity=0.55, marker_color=color, nbinsx=80,
                                   histnorm="probability density"))
    if np.isfinite(threshold):
        fig.add_vline(x=threshold, line=dict(color="black", dash="dash"), annotation_text="threshold")
    if marked is not None and np.isfinite(marked):
        fig.add_vline(x=marked, line=dict(color="#2ca02c", width=3), annotation_text=marked_name,
                      annotation_position="top left")
    fig.update_layout(barmode="overlay", template=TEMPLATE, legend=dict(orientation="h", y=-0.2))
    return style_figure(fig, title, xlabel, "density", height=400)
