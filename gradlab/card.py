"""The per-example record (issue 43): one training example seen from every page at once, and every example's
quantities side by side. No Streamlit.

The cheap quantities come from one norm pass per checkpoint (`summary.norm_summary`) and one dot-product pass over
the test set (`engine.per_example_dots`): the gradient norm over training, how clipping at C treats it, its loss and
prediction, TracIn self-influence (Pruthi et al. 2020: Σ_t ‖∇ℓᵢ(θ_t)‖² over the checkpoints) and the test points
its gradient helps or hurts most (grad-dot, ⟨∇ℓᵢ, ∇ℓ_test⟩). The ensembles' quantities, memorization (Feldman &
Zhang 2020) and LiRA (Carlini et al. 2022), come from `gradlab.record` (`record.ensemble_for`, as trained and with
DP-SGD at an ε; `record.per_example_table`), which this module's `table` joins.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from gradlab import costs, engine, record
from gradlab.clipping import clip_factor
from gradlab.experiment import DP_SGD_DEFAULTS, Fitted
from gradlab.summary import norm_summary, summary_size

#: The whole picture's quantities: a column of `record.per_example_table` (or of `table`, without the ensembles) →
#: what it is (an axis title). Every one is per training example; `record.strongest_relation` picks the default pair
#: across the sources (`record.SOURCES`: the loss and ‖gᵢ‖ of one model rank alike by construction).
QUANTITIES = {
    "grad_norm": "gradient norm ‖gᵢ‖ (final model)",
    "loss": "loss ℓᵢ (final model)",
    "tracin": "TracIn self-influence Σₜ‖gᵢ(θₜ)‖²",
    "memorization": "memorization P(correct | in) − P(correct | out)",
    "lira": "online LiRA score of the trained model (log Λ)",
    "lira_member": "LiRA score as a member (log Λ)",
    "memorization_dp": "memorization under DP-SGD",
    "lira_member_dp": "LiRA score as a member, DP-SGD (log Λ)",
}
#: Short names of `QUANTITIES` (titles, sentences, the correlation table).
SHORT = {"grad_norm": "gradient norm", "loss": "loss", "tracin": "TracIn self-influence", "memorization": "memorization",
         "lira": "LiRA score", "lira_member": "LiRA as a member", "memorization_dp": "memorization (DP-SGD)",
         "lira_member_dp": "LiRA as a member (DP-SGD)"}
#: Quantities one training run gives (its checkpoints and final model): they rank alike partly by construction (TracIn
#: sums the same norms the final ‖gᵢ‖ is the last of), so the default pair is never two of them.
ONE_RUN = frozenset({"grad_norm", "loss", "tracin", "self_influence", "confidence", "phi", "clip_factor"})


def strongest_across(correlations: pd.DataFrame) -> record.Relation | None:
    """`record.strongest_relation` of `correlations` (`record.rank_correlations`' table) less the pairs of two
    `ONE_RUN` quantities (None when no pair is left)."""
    keep = [not (a in ONE_RUN and b in ONE_RUN) for a, b in zip(correlations["a"], correlations["b"])]
    return record.strongest_relation(correlations[keep])


#: Models in each ensemble (complementary random halves: every example is OUT of half of them).
ENSEMBLE_MODELS = record.DEFAULT_MODELS


@dataclasses.dataclass(frozen=True, eq=False)
class Trajectory:
    """The cheap per-example quantities over the examples `index (n,)` (all N, or the norm summary's subset):
    `steps (K,)` the checkpoints' training steps, `norms (K, n)` the gradient norm at each, and at the final model
    `losses (n,)` and `predictions (n,)`."""

    index: np.ndarray
    steps: np.ndarray
    norms: np.ndarray
    losses: np.ndarray
    predictions: np.ndarray

    @property
    def tracin(self) -> np.ndarray:
        """TracIn self-influence `(n,)`: Σ over checkpoints of ‖gᵢ(θ_t)‖² (Pruthi et al. 2020, with a constant step)."""
        return np.sum(np.square(self.norms.astype(np.float64)), axis=0)


def trajectory(f: Fitted, *, size: int | None = None) -> Trajectory:
    """Every checkpoint's per-example gradient norms (one streamed pass each, `summary.norm_summary`) over `size`
    examples (its fixed subset; None: all), and the final model's losses and predictions."""
    summaries = [norm_summary(f, k, size=size) for k in range(len(f.run.checkpoints))]
    last = summaries[-1]
    return Trajectory(index=last.index, steps=np.asarray([s.step for s in summaries]),
                      norms=np.stack([s.norms for s in summaries]), losses=last.losses, predictions=last.predictions)


def trajectory_seconds(num_params: int, n: int, checkpoints: int, macs: int = 0) -> float:
    """Estimated CPU-seconds of `trajectory`: one norm summary per checkpoint (`costs.summary_seconds`)."""
    return checkpoints * costs.summary_seconds(num_params, n, macs)


def trajectory_size(n: int, num_params: int, checkpoints: int, macs: int = 0, training_seconds: float = 0.0) -> int:
    """How many of the `n` examples `trajectory` covers before a button: all when its estimate fits what
    `costs.WORK_BUDGET_SECONDS` leaves after the training and the page (`costs.PAGE_SECONDS`), else the largest of
    `summary.SUBSET_SIZES` that fits (at least the smallest): `summary.summary_size` at `checkpoints`."""
    return summary_size(n, num_params, macs, training_seconds, checkpoints=checkpoints)


def norms_over_training(f: Fitted, i: int) -> np.ndarray:
    """Example `i`'s gradient norm at every checkpoint of `f.run`: `(K,)` (`engine.per_example_norms`)."""
    d = f.data
    xs, ys = d.x_train[i:i + 1], d.y_train[i:i + 1]
    return np.asarray([float(engine.per_example_norms(f.loss_fn, m, xs, ys)[0]) for m in f.run.checkpoints])


def table(f: Fitted, t: Trajectory, *, clip_norm: float, outputs: record.EnsembleOutputs | None = None,
          dp: record.EnsembleOutputs | None = None) -> pd.DataFrame:
    """One row per training example (the whole picture): `record.per_example_table` of the ensembles `outputs` and
    `dp` when given, else its cheap columns (who it is, label, prediction, loss, ‖gᵢ‖, clipping at `clip_norm`) over
    the examples of `t`; either way with `tracin` (NaN off `t`'s subset) and `clip_factor` at `clip_norm`."""
    d = f.data
    n = len(d.y_train)
    if outputs is not None:
        out = record.per_example_table(f, outputs, dp=dp, clip_norm=clip_norm)
        out["tracin"] = np.nan
        out.loc[t.index, "tracin"] = t.tracin
        return out
    idx = t.index
    norms = np.asarray(t.norms[-1], np.float64)
    row_label, row_ids = f.source.row_ids(d)  # each example's name in its source (an upload's CSV line, …)
    out = pd.DataFrame({
        "index": idx, "row": np.asarray(row_ids)[idx], "label": d.y_train[idx], "flipped": np.asarray(d.flipped[idx], bool),
        "prediction": t.predictions, "loss": np.asarray(t.losses, np.float64), "grad_norm": norms,
        "clip_factor": clip_factor(norms, clip_norm), "clipped": norms > clip_norm, "tracin": t.tracin})
    out.attrs.update(clip_norm=float(clip_norm), row_label=row_label, models=0, epsilon=None)
    return out if len(idx) == n else out.reset_index(drop=True)


def ensembles_seconds(num_params: int, n: int, *, model: str, steps: int, batch_size: int, m: int = ENSEMBLE_MODELS,
                      macs: int = 0, private: bool | None = None) -> float:
    """Estimated CPU-seconds of the card's ensembles (`costs.record_ensemble_seconds`): the recipe's (`private` False),
    DP-SGD's with the DP clipping page's recipe for `model` (200 steps of an expected 256, or
    `experiment.DP_SGD_DEFAULTS`; `private` True), or both and the table (None: `costs.record_seconds`)."""
    dp = {"expected_batch": 256, "steps": 200, **DP_SGD_DEFAULTS.get(model, {})}
    kw = dict(models=m, steps=steps, batch_size=batch_size, dp_steps=dp["steps"], dp_batch=dp["expected_batch"], macs=macs)
    if private is None:
        return costs.record_seconds(num_params, n, **kw)
    return costs.record_ensemble_seconds(num_params, n, private=private, **kw)


__all__ = ["QUANTITIES", "SHORT", "ONE_RUN", "strongest_across", "ENSEMBLE_MODELS", "Trajectory", "trajectory", "trajectory_seconds", "trajectory_size",
           "norms_over_training", "clip_factor", "table", "ensembles_seconds"]
