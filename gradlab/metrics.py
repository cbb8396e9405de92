"""Summary statistics of per-example quantities: detection ROC, gradient noise scale."""

from __future__ import annotations

import dataclasses

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve


@dataclasses.dataclass(frozen=True)
class Detection:
    """How well a score ranks flagged examples first: ROC curve `(fpr, tpr)` and its AUC."""

    fpr: np.ndarray
    tpr: np.ndarray
    auc: float


def detection_roc(scores: np.ndarray, flagged: np.ndarray) -> Detection | None:
    """ROC of `scores (N,)` (high = suspicious) as a detector of `flagged (N,) bool` (e.g. flipped labels).

    Uses scikit-learn's `roc_curve` / `roc_auc_score`. **Returns** None when `flagged` is all one value.
    """
    flagged = np.asarray(flagged, bool)
    if flagged.all() or not flagged.any():
        return None
    scores = np.nan_to_num(np.asarray(scores, np.float64), nan=0.0, posinf=np.finfo(np.float64).max)
    fpr, tpr, _ = roc_curve(flagged, scores)
    return Detection(fpr, tpr, float(roc_auc_score(flagged, scores)))


def fraction_in_top(scores: np.ndarray, flagged: np.ndarray, fraction: float) -> float:
    """Fraction of the flagged examples found among the top `fraction` of `scores` (recall at x%)."""
    flagged = np.asarray(flagged, bool)
    k = max(1, int(round(fraction * len(scores))))
    top = np.argsort(-np.asarray(scores))[:k]
    return float(flagged[top].sum() / max(flagged.sum(), 1))


def gradient_noise_scale(sq_norms: np.ndarray, mean_grad_sq_norm: float) -> float:
    """Simple gradient noise scale B_simple = tr(Σ) / ‖G‖² (McCandlish et al. 2018, eq. 2.8).

    **Arguments** `sq_norms (N,)`: ‖g_i‖² of the per-example gradients; `mean_grad_sq_norm`:
    ‖G‖² with G = (1/N) Σ g_i. tr(Σ) is the unbiased per-example covariance trace
    `(Σ‖g_i‖² − N‖G‖²) / (N − 1)`.

    **Returns** B_simple in examples (the batch size at which gradient noise and signal are
    comparable); `inf` when G = 0.
    """
    n = len(sq_norms)
    trace = (float(np.sum(sq_norms)) - n * mean_grad_sq_norm) / max(n - 1, 1)
    return float("inf") if mean_grad_sq_norm <= 0 else max(trace, 0.0) / mean_grad_sq_norm
