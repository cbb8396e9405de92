"""The per-example record (issue 43): one training example seen from every page at once, and every example's
quantities side by side. No Streamlit.

The cheap quantities come from one norm pass per checkpoint (`summary.norm_summary`) and one dot-product pass over
the test set (`engine.per_example_dots`): the gradient norm over training, how clipping at C treats it, its loss and
prediction, TracIn self-influence (Pruthi et al. 2020: Σ_t ‖∇ℓᵢ(θ_t)‖² over the checkpoints) and the test points
its gradient helps or hurts most (grad-dot, ⟨∇ℓᵢ, ∇ℓ_test⟩). The ensemble's quantities, memorization (Feldman &
Zhang 2020) and LiRA (Carlini et al. 2022), come from an ensemble trained on random halves
(`gradlab.ensemble`), for the non-private model and for DP-SGD at an ε (`exposure`).
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import numpy as np
import pandas as pd
from scipy import stats

from gradlab import costs, engine, ensemble, export, membership, privacy
from gradlab.experiment import Fitted, init_model
from gradlab.train import train_dp_sgd
from gradlab.summary import SUBSET_SIZES, norm_summary

#: The whole picture's quantities: column → what it is (an axis title). Every one is per training example. The loss
#: is in the table but not here: at a fixed input a softmax's gradient norm is nearly a function of it (ρ ≈ 1 on the
#: default experiment), a relation by construction that would always be "the strongest".
QUANTITIES = {
    "gradient norm": "gradient norm ‖gᵢ‖ (final model)",
    "TracIn self-influence": "TracIn self-influence Σₜ‖gᵢ(θₜ)‖²",
    "memorization": "memorization: P(correct | in) − P(correct | out)",
    "LiRA score": "LiRA score (higher: more exposed)",
}
#: Quantities that need the ensemble (`exposure`); the others are cheap.
ENSEMBLE_QUANTITIES = ("memorization", "LiRA score")
#: Models in the default ensemble (complementary random halves: every example is OUT of half of them).
ENSEMBLE_MODELS = 16


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
    `summary.SUBSET_SIZES` that fits (at least the smallest), as `summary.summary_size` does for one checkpoint."""
    left = costs.WORK_BUDGET_SECONDS - training_seconds - costs.PAGE_SECONDS
    if trajectory_seconds(num_params, n, checkpoints, macs) <= left:
        return n
    fits = [m for m in SUBSET_SIZES if m < n and trajectory_seconds(num_params, m, checkpoints, macs) <= left]
    return fits[-1] if fits else min(SUBSET_SIZES[0], n)


def norms_over_training(f: Fitted, i: int) -> np.ndarray:
    """Example `i`'s gradient norm at every checkpoint of `f.run`: `(K,)` (`engine.per_example_norms`)."""
    d = f.data
    xs, ys = d.x_train[i:i + 1], d.y_train[i:i + 1]
    return np.asarray([float(engine.per_example_norms(f.loss_fn, m, xs, ys)[0]) for m in f.run.checkpoints])


def clip_factor(norms, clip_norm: float) -> np.ndarray:
    """min(1, C/‖gᵢ‖): what clipping at C keeps of each gradient (1: not clipped). `norms (n,)` → `(n,)`."""
    norms = np.asarray(norms, np.float64)
    return np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30))


def table(f: Fitted, t: Trajectory, *, clip_norm: float, exposure: Exposure | None = None) -> pd.DataFrame:
    """One row per example of `t.index`: who it is (`export.example_columns`: the example, its row in the source),
    its label, prediction, whether its label was flipped, and every quantity of `QUANTITIES` (the ensemble's when
    `exposure` is given, else absent) plus the clipping factor at `clip_norm`."""
    d = f.data
    idx = t.index
    classify = d.task == "classification"
    name = (lambda c: d.class_names[int(c)]) if classify else (lambda v: float(v))
    cols = {**export.example_columns(d, idx, features=0),
            "label": [name(d.y_train[i]) for i in idx],
            "prediction": [name(p) if np.isfinite(p) else None for p in np.asarray(t.predictions, np.float64)],
            "flipped label": np.asarray(d.flipped[idx], bool),
            "gradient norm": t.norms[-1], "loss": t.losses, "TracIn self-influence": t.tracin,
            "clipping factor": clip_factor(t.norms[-1], clip_norm)}
    if exposure is not None:
        cols["memorization"] = exposure.memorization[idx]
        cols["LiRA score"] = exposure.lira[idx]
    return pd.DataFrame(cols)


def helps_and_hurts(f: Fitted, i: int, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """The test points example `i`'s gradient helps and hurts most: grad-dot scores ⟨∇ℓᵢ, ∇ℓ_test⟩ at the final
    model (a step on example i lowers a test loss when positive). **Returns** `(order (2k,) test indices: the k
    it helps most, then the k it hurts most; scores (n_test,))`."""
    d = f.data
    g = engine.per_example_grads(f.loss_fn, f.model, d.x_train[i:i + 1], d.y_train[i:i + 1])
    g = jax.tree.map(lambda a: a[0], g)
    scores = np.asarray(engine.per_example_dots(f.loss_fn, f.model, d.x_test, d.y_test, g), np.float64)
    order = np.argsort(-scores)
    k = min(k, len(scores) // 2)
    return np.concatenate([order[:k], order[::-1][:k]]), scores


def rank_correlations(frame: pd.DataFrame, columns=None, *, confidence: float = 0.95) -> pd.DataFrame:
    """Spearman's ρ of every pair of `columns` (default: the `QUANTITIES` in `frame`), with a `confidence` interval
    from Fisher's z with Fieller et al.'s (1957) variance 1.06/(n − 3). **Returns** a DataFrame `x, y, ρ, low,
    high, n`, strongest |ρ| first."""
    columns = [c for c in (columns or QUANTITIES) if c in frame]
    z = stats.norm.ppf(0.5 + confidence / 2)
    rows = []
    for a, b in itertools.combinations(columns, 2):
        ok = np.isfinite(frame[a].to_numpy(np.float64)) & np.isfinite(frame[b].to_numpy(np.float64))
        n = int(ok.sum())
        if n < 4:
            continue
        rho = float(stats.spearmanr(frame[a][ok], frame[b][ok]).statistic)
        if not np.isfinite(rho):
            continue
        half = z * np.sqrt(1.06 / (n - 3))
        at = np.arctanh(np.clip(rho, -0.999999, 0.999999))
        rows.append(dict(x=a, y=b, ρ=rho, low=float(np.tanh(at - half)), high=float(np.tanh(at + half)), n=n))
    out = pd.DataFrame(rows, columns=["x", "y", "ρ", "low", "high", "n"])
    return out.reindex(out["ρ"].abs().sort_values(ascending=False).index).reset_index(drop=True)


def strongest_relation(correlations: pd.DataFrame) -> tuple[str, str] | None:
    """The pair `(x, y)` with the largest |ρ| in `rank_correlations`' table (None when it is empty)."""
    if correlations.empty:
        return None
    row = correlations.iloc[0]
    return str(row["x"]), str(row["y"])

# ---------------------------------------------------------------- the ensemble: memorization and LiRA


@dataclasses.dataclass(frozen=True, eq=False)
class Exposure:
    """How exposed each of the N training examples is, from M models on random halves (`masks (M, N)`):
    `memorization (N,)` = P(correct | in) − P(correct | out) over the models (Feldman & Zhang 2020), `lira (N,)` the
    offline LiRA score of the target model (Carlini et al. 2022: its confidence φ against the models that left the
    example out; `membership.lira_offline_scores`), `target_correct (N,)` bool, and for DP-SGD its σ, C and ε."""

    masks: np.ndarray
    memorization: np.ndarray
    lira: np.ndarray
    target_correct: np.ndarray
    private: bool = False
    epsilon: float = float("inf")
    noise_multiplier: float = 0.0
    clip_norm: float = float("inf")


def halves(n: int, m: int, *, seed: int = 0) -> np.ndarray:
    """`(m, n)` bool masks of ⌊n/2⌋ examples each, in complementary pairs (a random half, then the rest less one
    example at random when n is odd), so every example is OUT of about half the models and the subsets share one
    size (`ensemble.by_recipe` trains them in one vmapped scan)."""
    rng = np.random.default_rng(seed)
    h, masks = n // 2, []
    while len(masks) < m:
        order = rng.permutation(n)
        masks += [np.isin(np.arange(n), order[:h]), np.isin(np.arange(n), order[h:2 * h])]
    return np.stack(masks[:m])


def _logits(f: Fitted, model, xs):
    apply = model if f.predict_fn is None else (lambda x: f.predict_fn(model, x))
    return jax.vmap(apply)(xs)


def dp_settings(f: Fitted, epsilon: float, *, delta: float = 1e-5) -> tuple[float, float, int]:
    """DP-SGD with the experiment's recipe at `epsilon`: `(q, σ, steps)` with q = batch/N and σ calibrated by the
    RDP accountant (`privacy.noise_multiplier_for_epsilon`) over the recipe's steps."""
    r = f.recipe
    n = len(f.data.y_train)
    q = min(1.0, r["batch_size"] / n)
    steps = int(r["steps"])
    sigma = privacy.noise_multiplier_for_epsilon(target_epsilon=epsilon, sample_rate=q, steps=steps, delta=delta)
    return q, float(sigma), steps


def exposure(f: Fitted, m: int = ENSEMBLE_MODELS, *, private: bool = False, epsilon: float = 4.0,
             clip_norm: float = 1.0, delta: float = 1e-5, seed: int = 0, progress=None) -> Exposure:
    """Memorization and LiRA for every training example from `m` models trained on complementary random halves
    (`halves`) with the experiment's recipe (`ensemble.by_recipe`, all at once) or, with `private=True`,
    with DP-SGD at `epsilon` (δ = `delta`, clipping at `clip_norm`; each half and the target, trained on all N, one
    after another). The target is the experiment's model, or the DP-SGD model on all N.

    **Raises** `ValueError` for a regression task (both read class confidences) or a model gradlab cannot train.
    """
    d = f.data
    if d.task != "classification":
        raise ValueError("memorization and LiRA score class confidences: choose a classification dataset")
    if not f.trainable:
        raise ValueError("the ensemble trains the model from an initialization: this served model has no init_fn")
    n = len(d.y_train)
    xs, ys = np.asarray(d.x_train), np.asarray(d.y_train)
    masks = halves(n, m, seed=seed)
    init = init_model(f.experiment, d)
    r = f.recipe
    tick = (lambda i, total: progress(i / total, f"model {i} of {total}")) if progress else None
    if private:
        q, sigma, steps = dp_settings(f, epsilon, delta=delta)

        def train_fn(x, y, s):
            return train_dp_sgd(init, f.loss_fn, x, y, sample_rate=q, noise_multiplier=sigma, clip_norm=clip_norm,
                                optimizer=r["optimizer"], lr=r["lr"], steps=steps, l2=r.get("l2", 0.0), seed=s,
                                checkpoint_every=max(steps, 1)).final

        target = train_fn(xs, ys, seed + m)
        models = ensemble.subset_ensemble(ensemble.one_by_one(train_fn, xs, ys, range(seed, seed + m), progress=tick),
                                          n, m, masks=masks)
    else:
        sigma, target = 0.0, f.model
        trainer = ensemble.by_recipe(init, f.loss_fn, xs, ys, optimizer=r["optimizer"], lr=r["lr"], steps=r["steps"],
                                     batch_size=r["batch_size"], l2=r.get("l2", 0.0), seed=seed)
        models = ensemble.subset_ensemble(trainer, n, m, masks=masks)
    jx = jax.numpy.asarray(xs)
    logits = models.outputs(lambda model: _logits(f, model, jx))  # (M, N, K)
    correct = np.argmax(logits, -1) == ys[None]
    memo = (np.where(masks, correct, 0).sum(0) / np.maximum(masks.sum(0), 1)
            - np.where(~masks, correct, 0).sum(0) / np.maximum((~masks).sum(0), 1))
    shadow_conf = np.stack([membership.logit_confidence(lg, ys) for lg in logits])
    target_logits = np.asarray(_logits(f, target, jx))
    lira = membership.lira_offline_scores(membership.logit_confidence(target_logits, ys), shadow_conf, masks)
    return Exposure(masks=masks, memorization=memo, lira=lira, target_correct=np.argmax(target_logits, -1) == ys,
                    private=private, epsilon=epsilon if private else float("inf"), noise_multiplier=sigma,
                    clip_norm=clip_norm if private else float("inf"))


def exposure_seconds(num_params: int, n: int, *, steps: int, batch_size: int, m: int = ENSEMBLE_MODELS,
                     private: bool = False, macs: int = 0) -> float:
    """Estimated CPU-seconds of `exposure`: `m` trainings of the recipe on N/2 examples (one vmapped scan: its
    compile once, 0.15 s of set-up per model), or with DP-SGD `m + 1` runs at the expected batch; then a forward
    pass of every model over the N examples."""
    if private:
        return (m + 1) * (costs.dp_sgd_seconds(num_params, steps, batch_size, macs) + costs.MODEL_SETUP_SECONDS) + 2.0
    one = costs.training_seconds(num_params, steps, batch_size, macs) - 2.0
    return 2.0 + m * (0.15 + one) + m * costs.summary_seconds(num_params, n, macs) / 10


__all__ = ["Exposure", "exposure", "exposure_seconds", "dp_settings", "QUANTITIES", "ENSEMBLE_QUANTITIES", "ENSEMBLE_MODELS", "Trajectory", "trajectory", "trajectory_seconds", "trajectory_size",
           "norms_over_training", "halves",
           "clip_factor", "table", "helps_and_hurts", "rank_correlations", "strongest_relation"]
