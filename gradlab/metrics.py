"""Summary statistics of per-example quantities: the ROC of a score as a detector, gradient noise scale."""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Bool, Real
from sklearn.metrics import roc_auc_score, roc_curve


@dataclasses.dataclass(frozen=True, eq=False)
class Roc:
    """How well a score ranks the positives first: ROC curve `fpr (M,)`, `tpr (M,)` and its area `auc`."""

    fpr: np.ndarray
    tpr: np.ndarray
    auc: float

    def tpr_at(self, fpr: float) -> float:
        """The largest TPR among ROC points with FPR ≤ `fpr` (0 if none)."""
        ok = self.fpr <= fpr
        return float(self.tpr[ok].max()) if np.any(ok) else 0.0

    @property
    def tpr_at_1(self) -> float:
        """TPR at 1% FPR (the low-FPR regime Carlini et al. 2022 argue membership attacks be judged in)."""
        return self.tpr_at(0.01)

    @property
    def tpr_at_01(self) -> float:
        """TPR at 0.1% FPR."""
        return self.tpr_at(0.001)


def roc(scores: Real[np.ndarray, "N"], positive: Bool[np.ndarray, "N"]) -> Roc:
    """ROC of `scores` (high = positive) as a detector of `positive`, by scikit-learn's `roc_curve` and `roc_auc_score`.

    NaN scores count as 0 and +inf as the largest float (a diverged example is still ranked).

    **Arguments** `scores (N,)` float; `positive (N,)` bool (flipped labels, training-set members, …).

    **Returns** a `Roc`. **Raises** `ValueError` unless both classes are present.
    """
    positive = np.asarray(positive, bool)
    if positive.all() or not positive.any():
        raise ValueError("an ROC needs both positives and negatives")
    scores = np.nan_to_num(np.asarray(scores, np.float64), nan=0.0, posinf=np.finfo(np.float64).max)
    fpr, tpr, _ = roc_curve(positive, scores)
    return Roc(fpr, tpr, float(roc_auc_score(positive, scores)))


def detection_roc(scores: Real[np.ndarray, "N"], flagged: Bool[np.ndarray, "N"]) -> Roc | None:
    """`roc(scores, flagged)`, or None when `flagged` is all one value (a page then shows no detection).

    **Arguments** `scores (N,)` (high = suspicious), `flagged (N,)` bool (e.g. flipped labels).
    """
    flagged = np.asarray(flagged, bool)
    return None if flagged.all() or not flagged.any() else roc(scores, flagged)


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
