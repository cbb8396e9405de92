"""The record of one training example, and the whole picture over all of them: what one subset ensemble and the
engine say about each example.

For every training example i of a fitted classifier (`per_example_table`, one row each; `record_of`, one card):

- who it is: its index, its row in the source (`Dataset.row`), its label (flipped or not), the trained model's
  prediction, loss and confidence;
- its gradient at the trained model (`engine.per_example_norms`): ‖gᵢ‖, and what DP-SGD's clipping at norm C does to it
  (clipped when ‖gᵢ‖ > C, scaled by min(1, C/‖gᵢ‖): Abadi et al. 2016, Algorithm 1);
- its self-influence: ‖gᵢ‖² (grad-dot's, Pruthi et al. 2020) or any method of `gradlab.influence.METHODS` with one;
- its memorization (Feldman & Zhang 2020) ± its standard error, from the ensemble (`gradlab.memorization`);
- how visible its membership is: online and offline LiRA (Carlini et al. 2022) of the trained model against the
  ensemble as shadow models, and LiRA's mean score over the ensemble's own models that trained on it (each in turn the
  target, the others its shadows: `lira_member`), the per-example measure the DP-SGD ensemble has too;
- (the card) the test points its gradient helps and hurts most: ⟨gᵢ, g_t⟩ over the test set, streamed
  (`engine.per_example_dots`): one SGD step on i lowers test loss t by ≈ η⟨gᵢ, g_t⟩.

`rank_correlations` ranks every pair of these columns against each other (Spearman's ρ with a 95% Fisher-z interval,
scipy) and `strongest_relation` names the strongest non-trivial pair. `attack_rocs` evaluates the attacks on an
ensemble as Carlini et al. do (leave one model out, ROC by scikit-learn).

The names of `gradlab.memorization` and `gradlab.membership` this page uses are re-exported here (`memorization`,
`ensemble_for`, `lira_online`, `lira_offline`), so a page imports one module.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from jaxtyping import Float
from scipy import stats

from gradlab import engine
from gradlab.clipping import clip_factor
from gradlab.privacy import check_clip_norm
from gradlab.influence import fitted as influence_fitted
from gradlab.influence.methods import METHODS
from gradlab.influence.protocol import Method
from gradlab.membership import leave_one_model_out, lira_offline, lira_online, logit_confidence, loss_attack_scores
from gradlab.memorization import (DEFAULT_MODELS, DP_CLIP_NORM, DP_DELTA, DP_EPSILON, EnsembleOutputs, Memorization,
                                  ensemble_for, memorization)
from gradlab.metrics import Roc, roc

__all__ = ["Record", "Relation", "ensemble_for", "EnsembleOutputs", "Memorization", "memorization", "lira_online",
           "lira_offline", "lira_member", "attack_rocs", "attack_summary", "ATTACKS", "FPRS", "self_influence_of", "per_example_table",
           "record_of", "dots_with_test_points", "rank_correlations", "strongest_relation", "COLUMNS", "CORRELATED", "SOURCES", "source_of", "DEFAULT_MODELS",
           "DP_EPSILON", "DP_DELTA", "DP_CLIP_NORM"]

#: The attacks `attack_rocs` evaluates: name → what it is.
ATTACKS = {"lira_online": "online LiRA (Carlini et al. 2022)", "lira_offline": "offline LiRA (Carlini et al. 2022)",
           "loss": "loss threshold (Yeom et al. 2018)"}
#: The false-positive rates membership attacks are judged at (Carlini et al. 2022 argue for ≤ 0.1%).
FPRS = (0.001, 0.01)

#: What each column of `per_example_table` holds (units in brackets).
COLUMNS = {
    "index": "position in the training split", "row": "the example's name in its source (Dataset.row)",
    "label": "training label (after label noise)", "clean_label": "label before noise", "flipped": "label was flipped",
    "prediction": "trained model's class", "correct": "prediction == label", "loss": "trained model's loss [nats]",
    "confidence": "trained model's p_y", "phi": "log(p_y / (1 − p_y)) [nats]",
    "grad_norm": "‖gᵢ‖ at the trained model [loss per parameter unit]", "clip_factor": "min(1, C/‖gᵢ‖)",
    "clipped": "‖gᵢ‖ > C", "self_influence": "self-influence (method in attrs['self_influence'])",
    "memorization": "P[correct | in] − P[correct | out]", "memorization_se": "its standard error",
    "p_in": "fraction of IN models right", "p_out": "fraction of OUT models right",
    "lira": "online LiRA of the trained model, log Λ [nats]", "lira_offline": "offline LiRA of the trained model [sd]",
    "lira_member": "mean online LiRA score when a member, leave one model out [nats]",
    "memorization_dp": "memorization under DP-SGD", "memorization_dp_se": "its standard error",
    "lira_member_dp": "lira_member under DP-SGD [nats]",
}
#: Where each compared column is measured: one trained model's gradient and outputs, the ensemble's models, LiRA's
#: attack on the trained model (its φ against the ensemble), the DP-SGD ensemble (`strongest_relation` pairs sources).
SOURCES = {
    "trained model": ("loss", "confidence", "phi", "grad_norm", "clip_factor", "self_influence"),
    "ensemble": ("memorization", "p_in", "p_out", "lira_member"),
    "attack on the trained model": ("lira", "lira_offline"),
    "DP-SGD ensemble": ("memorization_dp", "lira_member_dp"),
}


def source_of(column: str) -> str:
    """The `SOURCES` entry that holds `column` (the column itself when none does)."""
    return next((s for s, cols in SOURCES.items() if column in cols), column)


#: The columns `rank_correlations` compares by default (those present in the table).
CORRELATED = ("memorization", "self_influence", "grad_norm", "loss", "lira", "lira_member", "memorization_dp",
              "lira_member_dp")


def lira_member(outputs: EnsembleOutputs, *, global_variance: bool | None = None) -> np.ndarray:
    """Each example's online LiRA score (log Λ, nats) averaged over the ensemble's models that trained on it, each in
    turn the target and the other M − 1 its shadow models (Carlini et al. 2022's evaluation, per example): how loudly
    LiRA says "member" when the example is one. `(N,)` float64. **Raises** `ValueError` as `lira_online`."""
    scores, member = leave_one_model_out(lambda c, l, sc, si: lira_online(c, sc, si, global_variance=global_variance),
                                         outputs.conf, outputs.losses, outputs.masks)
    scores, member = scores.reshape(outputs.masks.shape), member.reshape(outputs.masks.shape)
    return np.where(member, scores, 0.0).sum(0) / np.maximum(member.sum(0), 1)


def attack_rocs(outputs: EnsembleOutputs, *, global_variance: bool | None = None) -> dict[str, Roc]:
    """The ROC of each attack of `ATTACKS` on an ensemble, leave one model out (`membership.leave_one_model_out`: each
    model the target, the others its shadows, M·N scores pooled) by scikit-learn (`metrics.roc`); read
    `Roc.tpr_at(fpr)` and `Roc.auc`. **Returns** `{name: Roc}`. **Raises** `ValueError` as `lira_online`."""
    fns = {"lira_online": lambda c, l, sc, si: lira_online(c, sc, si, global_variance=global_variance),
           "lira_offline": lambda c, l, sc, si: lira_offline(c, sc, si, global_variance=global_variance),
           "loss": lambda c, l, sc, si: loss_attack_scores(l)}
    return {name: roc(*leave_one_model_out(fn, outputs.conf, outputs.losses, outputs.masks)) for name, fn in fns.items()}


def attack_summary(rocs: dict[str, Roc], fprs: Sequence[float] = FPRS) -> pd.DataFrame:
    """`attack_rocs`' ROCs as a table: one row per attack, its name (`ATTACKS`), `auc` and `tpr@{fpr}` for each of
    `fprs` (the largest TPR at an FPR ≤ fpr, `Roc.tpr_at`)."""
    return pd.DataFrame([{"attack": name, "label": ATTACKS.get(name, name), "auc": r.auc,
                          **{f"tpr@{fpr:g}": r.tpr_at(fpr) for fpr in fprs}} for name, r in rocs.items()])


def self_influence_of(fitted, method: Method | str | None = None) -> tuple[np.ndarray, str]:
    """Every training example's self-influence `(N,)` and its name: ‖∇θℓ(θ, zᵢ)‖² at the trained model (None, the
    default), or `method`'s (a `gradlab.influence.Method` or its name in `METHODS`, prepared on `fitted` with its
    default settings: `influence.fitted.context`). **Raises** `ValueError` for a method without self-influence or one
    that cannot run here (`influence.UNAVAILABLE`)."""
    if method is None:
        xs, ys = jnp.asarray(fitted.data.x_train), jnp.asarray(fitted.data.y_train)
        return np.square(np.asarray(engine.per_example_norms(fitted.loss_fn, fitted.model, xs, ys), np.float64)), \
            "gradient norm² ‖gᵢ‖²"
    if isinstance(method, str):
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        method = METHODS[method]
    if method.self_label is None:
        raise ValueError(f"{method.label} has no self-influence")
    ctx = influence_fitted.context(fitted)
    return np.asarray(method.self_influence(ctx, method.prepare(ctx)), np.float64), method.self_label


def per_example_table(fitted, outputs: EnsembleOutputs, *, dp: EnsembleOutputs | None = None,
                      clip_norm: float = DP_CLIP_NORM, self_influence: Method | str | None = None,
                      global_variance: bool | None = None) -> pd.DataFrame:
    """Every training example's record, one row each (the "whole picture"): the columns of `COLUMNS`.

    **Arguments**
    - `fitted`: a `gradlab.experiment.Fitted` classifier; `outputs`: its ensemble (`ensemble_for(fitted, M)`), whose
      models are the shadow models of LiRA against `fitted.model`.
    - `dp`: the DP-SGD ensemble (`ensemble_for(fitted, M, private=True)`) for the `*_dp` columns, or None.
    - `clip_norm` C > 0 for `clipped` and `clip_factor`; `self_influence`: None (‖gᵢ‖²) or a method (`self_influence_of`).
    - `global_variance`: LiRA's variance (None: global below 64 shadows, `membership.LIRA_PER_EXAMPLE_MIN_SHADOWS`).

    **Returns** a `pandas.DataFrame` of N rows; `attrs` holds `clip_norm`, `self_influence` (its name), `models` M,
    `epsilon` (the DP ensemble's, or None) and `row_label`.

    **Raises** `ValueError` if the ensemble's N is not the training set's, C ≤ 0, or as `memorization` and
    `lira_online`.
    """
    data = fitted.data
    n = len(data.y_train)
    if outputs.masks.shape[1] != n or (dp is not None and dp.masks.shape[1] != n):
        raise ValueError(f"the ensemble covers {outputs.masks.shape[1]} examples, the training set has {n}")
    clip_norm = check_clip_norm(clip_norm)
    xs, ys = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
    model = fitted.model
    forward = (lambda x: model(x)) if fitted.predict_fn is None else (lambda x: fitted.predict_fn(model, x))
    logits = np.asarray(jax.vmap(forward)(xs))
    labels = np.asarray(data.y_train)
    probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), -1))
    phi = logit_confidence(logits, labels)
    losses = np.asarray(jax.vmap(fitted.loss_fn, in_axes=(None, 0, 0))(model, xs, ys), np.float64)
    norms = np.asarray(engine.per_example_norms(fitted.loss_fn, model, xs, ys), np.float64)
    si, si_name = (np.square(norms), "gradient norm² ‖gᵢ‖²") if self_influence is None else \
        self_influence_of(fitted, self_influence)
    mem = memorization(outputs.correct, outputs.masks)
    table = pd.DataFrame({
        "index": np.arange(n), "row": [data.row(i) for i in range(n)], "label": labels,
        "clean_label": np.asarray(data.y_train_clean), "flipped": np.asarray(data.flipped, bool),
        "prediction": logits.argmax(1), "correct": logits.argmax(1) == labels, "loss": losses,
        "confidence": probs[np.arange(n), labels], "phi": phi, "grad_norm": norms,
        "clip_factor": clip_factor(norms, clip_norm), "clipped": norms > clip_norm,
        "self_influence": si, "memorization": mem.value, "memorization_se": mem.se, "p_in": mem.p_in,
        "p_out": mem.p_out,
        "lira": lira_online(phi, outputs.conf, outputs.masks, global_variance=global_variance),
        "lira_offline": lira_offline(phi, outputs.conf, outputs.masks, global_variance=global_variance),
        "lira_member": lira_member(outputs, global_variance=global_variance),
    })
    if dp is not None:
        mdp = memorization(dp.correct, dp.masks)
        table["memorization_dp"] = mdp.value
        table["memorization_dp_se"] = mdp.se
        table["lira_member_dp"] = lira_member(dp, global_variance=global_variance)
    table.attrs.update(clip_norm=float(clip_norm), self_influence=si_name, models=len(outputs),
                       epsilon=None if dp is None else float(dp.epsilon), row_label=data.row_label)
    return table


@dataclasses.dataclass(frozen=True)
class Record:
    """One training example's record (the card): the row of `per_example_table` as named fields, plus the test points
    its gradient helps and hurts most.

    - `index`, `row` (its name in the source, called `row_label`), `label`, `clean_label`, `flipped`, `prediction`,
      `loss` (nats), `confidence` p_y.
    - `grad_norm` ‖gᵢ‖ at the trained model; `clip_norm` C; `clipped` (‖gᵢ‖ > C); `clip_factor` min(1, C/‖gᵢ‖).
    - `self_influence` and its method's name `self_influence_method`.
    - `memorization` ± `memorization_se`, from `p_in` and `p_out`; `lira` (log Λ, nats), `lira_offline` (sd) and
      `lira_member` (nats); the DP-SGD ensemble's `memorization_dp` ± `memorization_dp_se` and `lira_member_dp` at
      `epsilon` (None without one).
    - `helps`, `hurts`: up to k `(test index, ⟨gᵢ, g_t⟩)` pairs, the largest positive and the most negative dot
      products (loss² per parameter²); training on i lowers the loss of the test points it helps.
    """

    index: int
    row: int
    row_label: str
    label: int
    clean_label: int
    flipped: bool
    prediction: int
    loss: float
    confidence: float
    grad_norm: float
    clip_norm: float
    clipped: bool
    clip_factor: float
    self_influence: float
    self_influence_method: str
    memorization: float
    memorization_se: float
    p_in: float
    p_out: float
    lira: float
    lira_offline: float
    lira_member: float
    helps: tuple[tuple[int, float], ...] = ()
    hurts: tuple[tuple[int, float], ...] = ()
    memorization_dp: float | None = None
    memorization_dp_se: float | None = None
    lira_member_dp: float | None = None
    epsilon: float | None = None


def dots_with_test_points(fitted, i: int) -> Float[np.ndarray, "T"]:
    """⟨gᵢ, g_t⟩ of training example i's gradient with every test point's at the trained model, `(T,)`, streamed over
    the test set (`engine.per_example_dots`, never T × P). **Raises** `ValueError` for an index out of range."""
    data = fitted.data
    if not 0 <= int(i) < len(data.y_train):
        raise ValueError(f"training example {i} does not exist: there are {len(data.y_train)} (0 to {len(data.y_train) - 1})")
    xs, ys = jnp.asarray(data.x_train[int(i):int(i) + 1]), jnp.asarray(data.y_train[int(i):int(i) + 1])
    g = jax.tree.map(lambda a: a[0], engine.per_example_grads(fitted.loss_fn, fitted.model, xs, ys))
    if len(data.y_test) == 0:
        return np.zeros(0)
    return np.asarray(engine.per_example_dots(fitted.loss_fn, fitted.model, jnp.asarray(data.x_test),
                                              jnp.asarray(data.y_test), g), np.float64)


def record_of(fitted, i: int, table: pd.DataFrame, *, k: int = 5) -> Record:
    """Training example i's `Record`: its row of `table` (`per_example_table(fitted, …)`) and the k test points its
    gradient helps and hurts most (`dots_with_test_points`, one streamed pass over the test set).

    **Raises** `ValueError` for an index outside the training set or a table of another size.
    """
    n = len(fitted.data.y_train)
    if len(table) != n:
        raise ValueError(f"the table has {len(table)} rows, the training set {n}")
    if not 0 <= int(i) < n:
        raise ValueError(f"training example {i} does not exist: there are {n} (0 to {n - 1})")
    r = table.iloc[int(i)]
    dots = dots_with_test_points(fitted, int(i))
    order = np.argsort(-dots, kind="stable")
    helps = tuple((int(t), float(dots[t])) for t in order[:k] if dots[t] > 0)
    hurts = tuple((int(t), float(dots[t])) for t in order[::-1][:k] if dots[t] < 0)
    opt = lambda name: None if name not in table else float(r[name])  # noqa: E731
    return Record(
        index=int(i), row=int(r["row"]), row_label=str(table.attrs.get("row_label", "index")), label=int(r["label"]),
        clean_label=int(r["clean_label"]), flipped=bool(r["flipped"]), prediction=int(r["prediction"]),
        loss=float(r["loss"]), confidence=float(r["confidence"]), grad_norm=float(r["grad_norm"]),
        clip_norm=float(table.attrs.get("clip_norm", DP_CLIP_NORM)), clipped=bool(r["clipped"]),
        clip_factor=float(r["clip_factor"]), self_influence=float(r["self_influence"]),
        self_influence_method=str(table.attrs.get("self_influence", "")), memorization=float(r["memorization"]),
        memorization_se=float(r["memorization_se"]), p_in=float(r["p_in"]), p_out=float(r["p_out"]),
        lira=float(r["lira"]), lira_offline=float(r["lira_offline"]), lira_member=float(r["lira_member"]),
        helps=helps, hurts=hurts, memorization_dp=opt("memorization_dp"), memorization_dp_se=opt("memorization_dp_se"),
        lira_member_dp=opt("lira_member_dp"), epsilon=table.attrs.get("epsilon"))


#: Spearman's ρ's Fisher-z standard error is √(1.06 / (n − 3)) (Fieller, Hartley & Pearson 1957), not Pearson's
#: √(1 / (n − 3)).
FIELLER = 1.06


def rank_correlations(table: pd.DataFrame, columns: Sequence[str] | None = None, *,
                      level: float = 0.95) -> pd.DataFrame:
    """Spearman's rank correlation of every pair of `columns` (default: those of `CORRELATED` in `table`) over the
    rows where both are finite, by `scipy.stats.spearmanr`, with a `level` confidence interval from Fisher's z:
    tanh(atanh ρ ± z_{(1+level)/2} · √(1.06 / (n − 3))) (Fieller, Hartley & Pearson 1957's variance for Spearman).

    **Returns** a DataFrame, one row per pair: `a`, `b`, `rho`, `low`, `high`, `p` (scipy's two-sided p-value), `n`;
    NaN where a column is constant or n < 4.

    **Raises** `ValueError` for a column not in the table or a level outside (0, 1).
    """
    if not 0 < level < 1:
        raise ValueError(f"the confidence level must be in (0, 1), got {level:g}")
    columns = [c for c in CORRELATED if c in table] if columns is None else list(columns)
    missing = [c for c in columns if c not in table]
    if missing:
        raise ValueError(f"no column {', '.join(missing)} in the table")
    zq = stats.norm.ppf(0.5 + level / 2)
    rows = []
    for a, b in itertools.combinations(columns, 2):
        x, y = table[a].to_numpy(np.float64), table[b].to_numpy(np.float64)
        ok = np.isfinite(x) & np.isfinite(y)
        n = int(ok.sum())
        rho = p = low = high = math.nan
        if n >= 4 and np.ptp(x[ok]) > 0 and np.ptp(y[ok]) > 0:
            res = stats.spearmanr(x[ok], y[ok])
            rho, p = float(res.statistic), float(res.pvalue)
            z, se = math.atanh(min(max(rho, -1 + 1e-15), 1 - 1e-15)), math.sqrt(FIELLER / (n - 3))
            low, high = math.tanh(z - zq * se), math.tanh(z + zq * se)
        rows.append({"a": a, "b": b, "rho": rho, "low": low, "high": high, "p": p, "n": n})
    return pd.DataFrame(rows, columns=["a", "b", "rho", "low", "high", "p", "n"])


@dataclasses.dataclass(frozen=True)
class Relation:
    """A pair of per-example quantities and how alike they rank: Spearman's `rho` in [`low`, `high`] over `n`
    examples; `text` says it in a sentence."""

    a: str
    b: str
    rho: float
    low: float
    high: float
    n: int

    @property
    def text(self) -> str:
        how = "rank alike" if self.rho > 0 else "rank in opposite orders"
        return (f"{self.a} and {self.b} {how}: Spearman ρ = {self.rho:.2f} (95% CI {self.low:.2f} to {self.high:.2f}, "
                f"{self.n:,} examples)")


def strongest_relation(correlations: pd.DataFrame, *, across: bool = True, identical: float = 0.999) -> Relation | None:
    """The pair of `rank_correlations` with the largest |ρ| whose interval excludes 0, skipping pairs that rank
    (almost) identically (|ρ| ≥ `identical`: one is a monotone function of the other, as ‖gᵢ‖ and ‖gᵢ‖²) and, with
    `across`, pairs measured by the same source (`SOURCES`: the loss, ‖gᵢ‖ and ‖gᵢ‖² of one trained model rank
    alike by construction, ρ ≈ 0.99 on digits; memorization against self-influence is news).
    **Returns** a `Relation`, or None when no pair qualifies."""
    c = correlations.dropna(subset=["rho"])
    c = c[(c["rho"].abs() < identical) & ((c["low"] > 0) | (c["high"] < 0))]
    if across:
        c = c[[source_of(a) != source_of(b) for a, b in zip(c["a"], c["b"])]]
    if c.empty:
        return None
    r = c.loc[c["rho"].abs().idxmax()]
    return Relation(str(r["a"]), str(r["b"]), float(r["rho"]), float(r["low"]), float(r["high"]), int(r["n"]))
