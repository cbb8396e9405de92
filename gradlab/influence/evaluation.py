"""Is an attribution right? Two ground truths, both by actually retraining.

- **Leave-one-out** (Koh & Liang 2017, Fig. 2): `check_against_retraining` removes the training
  examples with the most extreme predictions one at a time, retrains warm-started from the same θ̂ the
  scores were computed at (`solvers.minimize`), and compares predicted with actual test-loss changes.
- **The linear datamodeling score** (LDS; Ilyas et al. 2022, Park et al. 2023 §2): train M models on
  random half-subsets S_m of the training set with the experiment's own recipe (`train_on_subsets`,
  all M in one vmapped, jitted scan), record each test point's output, and score a method by the
  Spearman correlation, over the M subsets, between Σ_{i∈S_m} τ_i(z) and the actual output of z,
  averaged over test points (`lds`). The output is −ℓ(z): monotone in p_y, so its ranks (and the
  LDS) equal those of TRAK's margin log p_y − log(1 − p_y).
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from typing import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from scipy import stats

from gradlab import engine, ensemble
from gradlab.influence.scores import influence_scores
from gradlab.influence.solvers import InverseHVP, LossFn, Method, Minimum, PyTree, minimize

# ------------------------------------------------------------------ summaries


def correlations(a, b) -> tuple[float, float]:
    """(Pearson r, Spearman ρ) of two score vectors (scipy.stats); NaN if fewer than 3 or constant."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan"), float("nan")
    return float(stats.pearsonr(a, b)[0]), float(stats.spearmanr(a, b)[0])


def method_agreement(scores: dict[str, np.ndarray]) -> np.ndarray:
    """Spearman rank correlation matrix (M × M) between the score vectors of M methods (scipy.stats)."""
    m = np.stack([np.asarray(v, np.float64) for v in scores.values()], 1)
    if m.shape[1] == 1:
        return np.ones((1, 1))
    return np.atleast_2d(np.nan_to_num(np.asarray(stats.spearmanr(m).statistic, np.float64), nan=0.0))


def extreme_indices(scores, k: int) -> np.ndarray:
    """The k highest then the k lowest entries of `scores` (proponents, then opponents), no repeats."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    k = int(min(k, len(order) // 2))
    return np.concatenate([order[:k], order[::-1][:k]])


def point_loss(loss_fn: LossFn, params: PyTree, x, y) -> float:
    """ℓ(θ, x, y) of one example as a Python float."""
    return float(loss_fn(engine.as_params(params), x, y))


# ------------------------------------------------------------------ leave-one-out retraining


def loo_retrain(loss_fn: LossFn, base: Minimum, xs, ys, indices: Sequence[int], *, max_iter: int = 2000,
                progress: Callable[[int, int], None] | None = None) -> list[Minimum]:
    """Actual leave-one-out retraining: for each i, minimize the objective of `base` (same λ, same
    gradient-norm target) without z_i, warm-started from θ̂ = `base.params`. `progress(done, total)`.

    **Returns** one `Minimum` per index. **Raises** `ValueError` for an index out of range.
    """
    out = []
    for k, i in enumerate(indices):
        out.append(minimize(loss_fn, base.params, xs, ys, l2=base.l2, exclude=int(i), tol=base.tol, max_iter=max_iter))
        if progress is not None:
            progress(k + 1, len(indices))
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class RetrainingCheck:
    """Predicted vs actual leave-one-out change of one test loss (Koh & Liang 2017, Fig. 2).

    `indices (k,)` removed; `predicted (k,)` the influence function at θ̂; `actual (k,)`
    L_test(θ̂₋ᵢ) − L_test(θ̂); `pearson`, `spearman`; `base` θ̂ (the same point the ranking used);
    `retrained` one `Minimum` each; `ihvp` how the inverse HVP was solved; `all_predicted (N,)`.
    """

    indices: np.ndarray
    predicted: np.ndarray
    actual: np.ndarray
    pearson: float
    spearman: float
    base: Minimum
    retrained: list
    ihvp: InverseHVP
    all_predicted: np.ndarray


def check_against_retraining(
    loss_fn: LossFn, base: Minimum, train_xs, train_ys, test_x, test_y, *, damping: float = 0.0, k: int = 8,
    indices: Sequence[int] | None = None, method: Method = "auto", max_iter: int = 2000,
    progress: Callable[[int, int], None] | None = None, **solver,
) -> RetrainingCheck:
    """Influence-function predictions at θ̂ against actual leave-one-out retraining from θ̂.

    1. `influence_scores` at θ̂ = `base.params` (λ = `base.l2`, damping δ on the Hessian only).
    2. For `indices` (default: the k most positive and k most negative predictions) retrain without
       each (`loo_retrain`) and measure L_test(θ̂₋ᵢ) − L_test(θ̂).

    **Arguments** `base`: the `Minimum` from `solvers.minimize` (converge once, reuse for the ranking and
    this check); `test_x`, `test_y` one example. **Returns** a `RetrainingCheck`.
    **Raises** `InfluenceError` as `solvers.inverse_hvp_batch`.
    """
    one = lambda a: jnp.asarray(a)[None]
    scores, info = influence_scores(loss_fn, base.params, train_xs, train_ys, one(test_x), one(test_y), l2=base.l2,
                                    damping=damping, method=method, **solver)
    scores = np.asarray(scores[0])
    idx = np.asarray(indices if indices is not None else extreme_indices(scores, k), int)
    l0 = point_loss(loss_fn, base.params, test_x, test_y)
    retrained = loo_retrain(loss_fn, base, train_xs, train_ys, idx, max_iter=max_iter, progress=progress)
    actual = np.array([point_loss(loss_fn, m.params, test_x, test_y) - l0 for m in retrained])
    pear, spear = correlations(scores[idx], actual)
    return RetrainingCheck(idx, scores[idx], actual, pear, spear, base, retrained, info, scores)


# ------------------------------------------------------------------ the linear datamodeling score


def random_subsets(n: int, m: int, *, fraction: float = 0.5, seed: int = 0) -> np.ndarray:
    """M random subsets of ⌊fraction·N⌋ training examples each, without repeats: `(M, H)` int, sorted rows
    (`gradlab.ensemble.random_masks`, the same draws).

    **Raises** `ValueError` unless 0 < fraction < 1, M ≥ 1 and every subset has at least one example.
    """
    return ensemble.subsets_of(ensemble.random_masks(n, m, fraction=fraction, seed=seed))


def subset_masks(subsets: np.ndarray, n: int) -> np.ndarray:
    """`(M, N)` float mask: 1 where example i is in subset m."""
    mask = np.zeros((len(subsets), n))
    np.put_along_axis(mask, np.asarray(subsets), 1.0, axis=1)
    return mask


def train_on_subsets(model, loss_fn: LossFn, xs, ys, subsets: np.ndarray, *, optimizer: str = "adam", lr: float = 1e-2,
                     steps: int = 300, batch_size: int = 128, l2: float = 0.0, seed: int = 0) -> PyTree:
    """Train one model per subset with the recipe of `gradlab.train.train`, all M at once
    (`gradlab.ensemble.train_stacked`, the scan `ensemble.by_recipe` runs). Subset m's model is the one
    `train(model, loss_fn, xs[S_m], ys[S_m], seed=seed + m, …)` returns.

    **Arguments** `subsets (M, H)` int (`random_subsets`). **Returns** the differentiable leaves of the
    M trained models stacked on a leading axis (combine with `eqx.partition(model, …)[1]`).
    """
    return ensemble.train_stacked(model, loss_fn, xs, ys, subsets, optimizer=optimizer, lr=lr, steps=steps,
                                  batch_size=batch_size, l2=l2, seed=seed)


def subset_outputs(loss_fn: LossFn, model, stacked: PyTree, test_xs, test_ys) -> np.ndarray:
    """The output −ℓ(θ_m, z_t) of each subset model on each test point: `(M, T)` (`stacked`: `train_on_subsets`'s
    leaves; `model` gives the static part)."""
    _, static = eqx.partition(engine.as_params(model), eqx.is_inexact_array)
    return ensemble_outputs(loss_fn, ensemble.Ensemble(np.zeros((0, 0), bool), stacked, static), test_xs, test_ys)


def ensemble_outputs(loss_fn: LossFn, models: ensemble.Ensemble, test_xs, test_ys) -> np.ndarray:
    """The LDS's output −ℓ(θ_m, z_t) of each model of an ensemble on each test point: `(M, T)`."""
    txs, tys = jnp.asarray(test_xs), jnp.asarray(test_ys)
    return models.outputs(lambda m: -jax.vmap(loss_fn, in_axes=(None, 0, 0))(m, txs, tys))


@dataclasses.dataclass(frozen=True, eq=False)
class LDS:
    """A method's linear datamodeling score: `mean` over test points (NaN-free ones) and `per_test (T,)`."""

    mean: float
    per_test: np.ndarray


def lds(scores, subsets: np.ndarray, outputs) -> LDS:
    """Linear datamodeling score (Park et al. 2023, eq. 4): for each test point t, the Spearman correlation
    over the M subsets between the predicted Σ_{i∈S_m} τ_t,i and the actual output `outputs[m, t]`;
    then the mean over test points.

    **Arguments** `scores (T, N)` (high = raises the output); `subsets (M, H)` int; `outputs (M, T)`.

    **Returns** an `LDS`; a test point whose predictions or outputs are constant gets NaN and is left
    out of the mean. **Raises** `ValueError` if the shapes disagree.
    """
    scores, outputs = np.asarray(scores, np.float64), np.asarray(outputs, np.float64)
    subsets = np.asarray(subsets)
    if scores.ndim != 2 or outputs.shape != (subsets.shape[0], scores.shape[0]):
        raise ValueError(f"scores must be (T, N) and outputs (M, T); got {scores.shape}, {outputs.shape}, "
                         f"{subsets.shape[0]} subsets")
    predicted = scores[:, subsets].sum(-1)                                         # (T, M)
    return lds_of_predictions(predicted.T, outputs)


def lds_of_predictions(predicted, outputs) -> LDS:
    """LDS from predicted outputs `(M, T)` directly (e.g. a datamodel's, or the actual outputs: LDS 1)."""
    p, o = np.asarray(predicted, np.float64).T, np.asarray(outputs, np.float64).T   # (T, M)
    rp, ro = stats.rankdata(p, axis=1), stats.rankdata(o, axis=1)
    rp, ro = rp - rp.mean(1, keepdims=True), ro - ro.mean(1, keepdims=True)
    denom = np.sqrt((rp ** 2).sum(1) * (ro ** 2).sum(1))
    rho = np.where(denom > 0, (rp * ro).sum(1) / np.where(denom > 0, denom, 1.0), np.nan)
    ok = np.isfinite(rho)
    return LDS(float(rho[ok].mean()) if ok.any() else float("nan"), rho)


#: LDS tables measured offline by a benchmark and shipped with the package: (dataset, model) -> file in gradlab/data.
STORED_LDS = {("fashion", "simple_cnn"): "lds_simple_cnn.json"}


def stored_lds(dataset: str, model: str):
    """The LDS table a benchmark measured offline for (`dataset`, `model`) (`STORED_LDS`; written by
    `python -m benchmarks.lds_cnn`, dattri's protocol: random halves, −ℓ on held-out test points, Spearman over
    subsets averaged over test points), or None when none is shipped.

    **Returns** `(table, about)`: a pandas DataFrame, one row per method and side (gradlab or dattri), with its
    `LDS`, `SE` (over test points), `CPU-s` (preparing and scoring, process time) and the `command` that reproduces
    it (NaN where not measured), and `about`, the file's header (`command`, `measured`, `machine`, `experiment`).
    **Raises** `ValueError` for a file of another schema."""
    name = STORED_LDS.get((dataset, model))
    if name is None:
        return None
    raw = json.loads(resources.files("gradlab").joinpath("data", name).read_text())
    if raw.get("schema") != 1:
        raise ValueError(f"{name}: schema {raw.get('schema')!r}, expected 1")
    rows = [{"side": r["side"], "method": r["label"], "LDS": r["lds"], "SE": r["se"], "CPU-s": r["cpu_s"],
             "command": r["command"], "note": r.get("note") or ""} for r in raw["methods"]]
    table = pd.DataFrame(rows).astype({"LDS": float, "SE": float, "CPU-s": float})
    return table, {k: raw[k] for k in ("command", "measured", "machine", "experiment", "benchmark") if k in raw}
