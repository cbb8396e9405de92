"""Auditing gradlab's own DP-SGD: canaries through `train_dp_sgd`, and an empirical ε lower bound.

A DP-SGD run claims (ε, δ)-DP: no test can tell whether one example (a *canary*) was in the training
set with TPR > e^ε·FPR + δ. An audit (Jagielski et al. 2020; Nasr et al. 2021, 2023) trains many times
with and without the canary, observes the privatized output, guesses "in" when the observation passes
a threshold, and turns the guesses' (FPR, TPR), with Clopper–Pearson confidence intervals, into a
lower bound on the ε the code really spends. A bound above the accountant's ε is a bug. Beside that
Clopper–Pearson bound, `ESTIMATORS` reads the whole trade-off curve against the Gaussian family that
full-batch DP-SGD follows: a Gaussian-DP fit of μ (Nasr et al. 2023) and a one-run f-DP test (Mahloujifar
et al. 2024), far tighter for the same trials.

Trials are vectorized through the real training function: one `train_dp_sgd` run holds R independent
trials, each in its own block of parameters (trial r's examples only touch block r, per-example
clipping and the per-coordinate noise keep the blocks independent), so one run yields R observations.

- **Gradient canary** (white box, Nasr et al. 2023): parameter θ_r belongs to trial r only. The canary's
  loss is `10·C·θ_r`, so its gradient is a Dirac of norm 10C, clipped to exactly C·e_r. Each block also
  holds a fixed "anchor" example of loss `−2·C·θ_r` (the same in both worlds). The observation is
  −Δθ_r·qN/C: with plain SGD (lr 1) it is the sum of the T privatized gradient sums' coordinate r over C,
  N(−T, Tσ²) without the canary and N(0, Tσ²) with it at full batch: the sufficient statistic, so the
  audit can be tight.
- **Input canary** (black box): each block is a small logistic regression; the canary is a mislabeled
  outlier input, and the observation is the trained model's margin on it.

Absent canaries are replaced by an example with an exactly zero gradient, so N (and the divisor qN)
is public and the same in both worlds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy import optimize, special, stats

from gradlab import engine, privacy
from gradlab.clipping import clip_factor
from gradlab.train import train_dp_sgd

# ---------------------------------------------------------------- planted bugs


@dataclasses.dataclass(frozen=True)
class Bug:
    """A planted DP-SGD bug: `privatize` is a `privacy.Privatize` that computes the noisy clipped sum
    wrongly; `train_dp_sgd(…, privatize=bug.privatize)` runs DP-SGD with it."""

    name: str
    description: str
    privatize: privacy.Privatize


def _per_example(wrong_sum: Callable) -> privacy.Privatize:
    """A privatizer from `wrong_sum(per_example_grads, key, C, σ, batch_size) -> (sum, noise)`.

    The per-example gradients (`engine.per_example_grads`, the reference `vmap(grad)`) are masked by
    the batch's weights first, so a padded Poisson batch's padding contributes nothing.
    """

    def privatize(loss_fn, params, xs, ys, key, *, clip_norm, noise_multiplier, weights=None, batch_size=1.0):
        g = engine.per_example_grads(loss_fn, params, xs, ys, method="vmap")
        if weights is not None:
            g = jax.tree.map(lambda a: a * weights.reshape((-1,) + (1,) * (a.ndim - 1)), g)
        summed, noise = wrong_sum(g, key, clip_norm, noise_multiplier, batch_size)
        losses = jax.vmap(loss_fn, in_axes=(None, 0, 0))(params, xs, ys)
        norms = jnp.sqrt(sum(jnp.sum(jnp.square(a).reshape(a.shape[0], -1), 1) for a in jax.tree.leaves(g)))
        return jax.tree.map(jnp.add, summed, noise), losses, norms

    privatize.__name__ = privatize.__qualname__ = wrong_sum.__name__.lstrip("_")
    privatize.__doc__ = wrong_sum.__doc__
    return privatize


def _tree_sum(g):
    return jax.tree.map(lambda a: a.sum(0), g)


def _no_clipping(g, key, clip_norm, sigma, batch):
    """Forgets to clip: Σ gᵢ, with the noise still calibrated to C."""
    summed = _tree_sum(g)
    return summed, privacy.gaussian_noise(key, summed, clip_norm, sigma)


def _noise_not_scaled_by_c(g, key, clip_norm, sigma, batch):
    """Noise std σ instead of σ·C (the same for C = 1, too little noise for C > 1)."""
    summed, _ = privacy.clip_and_sum(g, clip_norm)
    return summed, privacy.gaussian_noise(key, summed, 1.0, sigma)


def _sum_clipped_per_microbatch(g, key, clip_norm, sigma, batch):
    """Clips the sum of each microbatch of two examples instead of each example (TF Privacy's
    `num_microbatches` < batch size, accounted as if per example): one example moves its microbatch's
    clipped sum by up to 2C."""

    def pairs(a):
        if a.shape[0] % 2:
            a = jnp.concatenate([a, jnp.zeros_like(a[:1])])
        return a.reshape((a.shape[0] // 2, 2) + a.shape[1:]).sum(1)

    summed, _ = privacy.clip_and_sum(jax.tree.map(pairs, g), clip_norm)
    return summed, privacy.gaussian_noise(key, summed, clip_norm, sigma)


def _noise_divided_by_batch_twice(g, key, clip_norm, sigma, batch):
    """Divides the noise by the batch size before the step divides the noisy sum by it again."""
    summed, _ = privacy.clip_and_sum(g, clip_norm)
    noise = privacy.gaussian_noise(key, summed, clip_norm, sigma)
    return summed, jax.tree.map(lambda z: z / batch, noise)


#: The planted bugs by name. Each is a mistake real DP-SGD code has shipped;
#: `train_dp_sgd(…, privatize=BUGS[name].privatize)` runs it in place of the correct noisy clipped sum.
BUGS: dict[str, Bug] = {
    b.name: b
    for b in (
        Bug("no per-example clipping", "The per-example gradients are summed without clipping; the noise "
            "is still σ·C, so one large gradient shows through.", _per_example(_no_clipping)),
        Bug("noise not scaled by C", "The noise std is σ instead of σ·C: harmless at C = 1, too little "
            "noise for C > 1 (invisible at C = 1: audit with C > 1).", _per_example(_noise_not_scaled_by_c)),
        Bug("sum clipped per microbatch", "The sum of each microbatch of two examples is clipped instead "
            "of each example, so one example can move the clipped sum by 2C while the accountant assumes C.",
            _per_example(_sum_clipped_per_microbatch)),
        Bug("noise divided by the batch size twice", "The noise is averaged over the batch before the noisy "
            "sum is divided by the batch size: the noise on the mean gradient is σC/B² instead of σC/B.",
            _per_example(_noise_divided_by_batch_twice)),
    )
}

# ---------------------------------------------------------------- the ε lower bound


def clopper_pearson_upper(k, n, alpha):
    """One-sided (1−α) Clopper–Pearson upper bound on a binomial proportion (k successes of n)."""
    k, n = np.asarray(k, float), np.asarray(n, float)
    with np.errstate(all="ignore"):
        return np.where(k >= n, 1.0, stats.beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1e-12)))


def clopper_pearson_lower(k, n, alpha):
    """One-sided (1−α) Clopper–Pearson lower bound on a binomial proportion."""
    k, n = np.asarray(k, float), np.asarray(n, float)
    with np.errstate(all="ignore"):
        return np.where(k <= 0, 0.0, stats.beta.ppf(alpha, np.maximum(k, 1e-12), n - k + 1))


def _eps_sides(fpr, tpr, delta):
    """(log((TPR−δ)/FPR), log((1−FPR−δ)/(1−TPR))), each floored at 0 (nan → 0)."""
    with np.errstate(all="ignore"):
        a = np.log(np.maximum(tpr - delta, 0) / fpr)
        b = np.log(np.maximum(1 - fpr - delta, 0) / (1 - tpr))
    return tuple(np.maximum(np.nan_to_num(v, nan=0.0, neginf=0.0, posinf=np.inf), 0.0) for v in (a, b))


def epsilon_from_rates(fpr_upper, tpr_lower, delta: float):
    """The ε an (FPR, TPR) forces: (ε, δ)-DP implies TPR ≤ e^ε·FPR + δ and 1−FPR ≤ e^ε·(1−TPR) + δ
    (Kairouz et al. 2015), so ε ≥ max(log((TPR−δ)/FPR), log((1−FPR−δ)/(1−TPR))), 0 if neither is
    positive. With a confidence upper bound on FPR and a lower bound on TPR this is a lower bound on ε.
    Array arguments broadcast."""
    a, b = _eps_sides(np.asarray(fpr_upper, float), np.asarray(tpr_lower, float), delta)
    return np.maximum(a, b)


#: Candidate thresholds: those that leave k errors (false positives, or false negatives for the mirror
#: inequality) in the picking half, for k on this geometric grid. A few dozen candidates instead of every
#: score keep the winner's curse small: among thousands of thresholds, the one with the best bound on the
#: picking half is mostly the luckiest, and the other half does not repeat its luck.
ERROR_GRID = tuple(int(round(10 * 2 ** (j / 2))) for j in range(30))


def _bounds_at_thresholds(scores, is_in, delta, alpha):
    """Candidate thresholds "guess in when score ≥ t" (see `ERROR_GRID`) and their CP-based ε bounds."""
    order = np.argsort(-scores, kind="stable")
    member = is_in[order]
    ranked = scores[order]
    n_in, n_out = int(member.sum()), int((~member).sum())
    tp = np.cumsum(member)
    fp = np.cumsum(~member)
    a_idx = np.searchsorted(fp, ERROR_GRID, side="right") - 1  # the last threshold with ≤ k false positives
    b_idx = np.searchsorted(tp, n_in - np.asarray(ERROR_GRID), side="left")  # the first with ≤ k false negatives
    idx = np.unique(np.clip(np.r_[a_idx, b_idx, len(scores) - 1], 0, len(scores) - 1))
    # a threshold between tied scores is not a real guess: move to the end of the tie
    idx = np.searchsorted(-ranked, -ranked[idx], side="right") - 1
    eps = epsilon_from_rates(clopper_pearson_upper(fp[idx], n_out, alpha / 2), clopper_pearson_lower(tp[idx], n_in, alpha / 2), delta)
    return eps, ranked[idx]


def epsilon_lower_bound(scores, is_in, *, delta: float, confidence: float = 0.95) -> tuple[float, float, int]:
    """An empirical ε lower bound from a membership test's scores over independent trials.

    The trials are split in two: every fourth trial picks the threshold and the direction (high or low
    score means "in") that gives the largest bound among `ERROR_GRID`'s candidates; on the other three quarters the
    guesses' FPR gets a one-sided Clopper–Pearson upper bound and TPR a lower bound, each at level
    (1 − confidence)/2, so both hold together with probability ≥ `confidence` and so does the ε from
    `epsilon_from_rates` (Nasr et al. 2021, §4; Jagielski et al. 2020).

    **Arguments**
    - `scores (n,)` float: one observation per trial; `is_in (n,)` bool: the canary was in the run.
    - `delta`: the δ of the claimed guarantee; `confidence`: e.g. 0.95.

    **Returns** `(ε lower bound ≥ 0, the chosen threshold, direction +1 (score ≥ t means in) or −1)`.

    **Raises** `ValueError` if the arrays differ in length or either world has fewer than 2 trials.
    """
    scores, is_in = np.asarray(scores, float), np.asarray(is_in, bool)
    if scores.shape != is_in.shape or scores.ndim != 1:
        raise ValueError(f"scores and is_in must be 1-D of one length, got {scores.shape} and {is_in.shape}")
    if min(is_in.sum(), (~is_in).sum()) < 4:
        raise ValueError("need at least 4 trials with and 4 without the canary")
    alpha = 1 - confidence
    pick = np.arange(len(scores)) % 4 == 0  # a quarter picks the threshold: the rest measures it more precisely
    test = ~pick
    best = (0.0, math.inf, 1)
    for sign in (1, -1):
        eps, thresholds = _bounds_at_thresholds(sign * scores[pick], is_in[pick], delta, alpha)
        i = int(np.argmax(eps))
        if eps[i] > best[0]:
            best = (float(eps[i]), float(thresholds[i]), sign)
    _, t, sign = best
    if not math.isfinite(t):
        return 0.0, t, sign
    guess = sign * scores[test] >= sign * t
    member = is_in[test]
    n_in, n_out = int(member.sum()), int((~member).sum())
    eps = epsilon_from_rates(clopper_pearson_upper(np.sum(guess & ~member), n_out, alpha / 2),
                             clopper_pearson_lower(np.sum(guess & member), n_in, alpha / 2), delta)
    return float(eps), t * sign, sign


# ---------------------------------------------------------------- Gaussian DP and f-DP estimators
#
# Both read the empirical trade-off curve (FPR, FNR at every threshold) through Clopper–Pearson bands and
# compare it with the Gaussian trade-off family G_μ(α) = Φ(Φ⁻¹(1−α) − μ) (Dong, Roth & Su 2019). Full-batch
# DP-SGD is exactly √T/σ-GDP, so the family is the right one there and the bounds can be tight. Scores are
# oriented: a higher score means "canary in" (negate them otherwise). Definitions follow
# `jax_privacy.auditing.CanaryScoreAuditor` (its `epsilon_from_gdp` and `epsilon_one_run_fdp`) so the numbers
# can be compared on the same scores (tests/test_audit.py, benchmarks/audit.py).


def _log_gdp_delta(epsilon: float, mu: float) -> float:
    """log δ(ε) of μ-GDP (see `gdp_delta`), computed in the log domain so tiny δ stay accurate."""
    a = stats.norm.logcdf(-epsilon / mu + mu / 2)
    b = epsilon + stats.norm.logcdf(-epsilon / mu - mu / 2)
    return float(a + np.log1p(-np.exp(min(b - a, 0.0)))) if b < a else -math.inf


def gdp_delta(epsilon: float, mu: float) -> float:
    """The δ at which μ-GDP gives ε: δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2).

    **Arguments** `epsilon` ε ≥ 0; `mu` μ > 0 (for the Gaussian mechanism, sensitivity / noise std).

    **Returns** δ ∈ [0, 1].

    Dong, Roth & Su 2019 ("Gaussian differential privacy"), Corollary 2.13; equal to Balle & Wang 2018, Thm 8.
    """
    return math.exp(_log_gdp_delta(float(epsilon), float(mu)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The ε of μ-GDP at δ: the root of `gdp_delta`(ε, μ) = δ (0 if μ ≤ 0 or δ(0) ≤ δ).

    **Arguments** `mu` μ; `delta` δ ∈ (0, 1).

    **Returns** ε ≥ 0 (capped at 100, as `jax_privacy.auditing` does).

    **Raises** `ValueError` unless 0 < δ < 1.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    mu = float(mu)
    if not mu > 0:
        return 0.0
    gap = lambda e: _log_gdp_delta(e, mu) - math.log(delta)  # noqa: E731  decreasing in ε
    if gap(0.0) <= 0:
        return 0.0
    if gap(100.0) >= 0:
        return 100.0
    return float(optimize.brentq(gap, 0.0, 100.0, xtol=1e-9))


def gdp_mu(epsilon: float, delta: float) -> float:
    """The μ whose GDP guarantee gives exactly (ε, δ): the inverse of `gdp_epsilon` in μ.

    **Arguments** `epsilon` ε ≥ 0; `delta` δ ∈ (0, 1).

    **Returns** μ > 0. For the Gaussian mechanism this is 1/σ of `dp_accounting.get_sigma_gaussian(ε, δ)`.

    **Raises** `ValueError` unless ε ≥ 0 and 0 < δ < 1.
    """
    if not (epsilon >= 0 and 0 < delta < 1):
        raise ValueError(f"need ε ≥ 0 and 0 < δ < 1, got {epsilon} and {delta}")
    gap = lambda m: _log_gdp_delta(epsilon, m) - math.log(delta)  # noqa: E731  increasing in μ
    hi = 1.0
    while gap(hi) < 0:
        hi *= 2
    return float(optimize.brentq(gap, 1e-12, hi, xtol=1e-12))


def _oriented(scores, is_in):
    scores, is_in = np.asarray(scores, float), np.asarray(is_in, bool)
    if scores.shape != is_in.shape or scores.ndim != 1:
        raise ValueError(f"scores and is_in must be 1-D of one length, got {scores.shape} and {is_in.shape}")
    if min(is_in.sum(), (~is_in).sum()) < 1:
        raise ValueError("need trials both with and without the canary")
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores must be finite")
    return scores, is_in


def roc_hull(scores, is_in) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The thresholds of the ROC curve's concave hull, with their error counts.

    The test is "guess in when score ≥ t" for every t among the scores and +∞. Thresholds strictly inside
    a hull segment are dropped: a randomized mix of the segment's ends does at least as well, so the
    estimators need only the hull (and correct for its size, not for every score).

    **Arguments** `scores (n,)` float (higher means in), `is_in (n,)` bool.

    **Returns** `(thresholds (k,), false negatives (k,), true negatives (k,))`, int counts, FN increasing.

    **Raises** `ValueError` for arrays of different shapes, non-finite scores, or an empty world.
    """
    scores, is_in = _oriented(scores, is_in)
    thresholds = np.r_[np.unique(scores), np.inf]
    fn = np.searchsorted(np.sort(scores[is_in]), thresholds, side="left")
    tn = np.searchsorted(np.sort(scores[~is_in]), thresholds, side="left")
    keep = np.arange(len(thresholds))
    while len(keep) > 2:  # drop every point on or below the chord of its neighbours until none is
        d = np.diff(np.stack([fn[keep], tn[keep]], 1).astype(float), axis=0)
        below = d[:-1, 1] * d[1:, 0] - d[1:, 1] * d[:-1, 0] <= 0
        if not below.any():
            break
        keep = keep[np.r_[True, ~below, True]]
    return thresholds[keep], fn[keep], tn[keep]


def gdp_mu_lower_bound(scores, is_in, *, confidence: float = 0.95) -> float:
    """A lower confidence bound on μ of a μ-GDP mechanism, from its canary scores.

    μ-GDP means every test has FNR ≥ Φ(Φ⁻¹(1−FPR) − μ), i.e. μ ≥ Φ⁻¹(1−FPR) − Φ⁻¹(FNR). At each threshold of
    `roc_hull`, FPR and FNR get one-sided Clopper–Pearson upper bounds at level (1−confidence)/(2k)
    (Bonferroni over the k hull thresholds and both rates); the largest μ they force is the bound.

    **Arguments** `scores (n,)`, higher means in; `is_in (n,)` bool; `confidence` ∈ (0.5, 1).

    **Returns** μ lower bound ≥ 0.

    **Raises** `ValueError` as `roc_hull`, or for a confidence outside (0.5, 1).

    Nasr et al. 2023 ("Tight auditing of differentially private machine learning"), §5; Dong, Roth & Su 2019,
    Eq. 6. Unlike `jax_privacy.auditing.epsilon_from_gdp` (2.0.0), a test worse than chance is not
    read backwards: its |μ| would use upper bounds where the reversed test needs lower ones, and on Gaussian
    scores it then reports ε above the true ε far more often than 5% of the time.
    """
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    _, fn, tn = roc_hull(scores, is_in)
    n_in, n_out = fn[-1], tn[-1]
    alpha = (1 - confidence) / (2 * len(fn))
    fnr = clopper_pearson_upper(fn, n_in, alpha)
    fpr = clopper_pearson_upper(n_out - tn, n_out, alpha)
    with np.errstate(all="ignore"):
        mu = stats.norm.isf(fpr) - stats.norm.ppf(fnr)
    return float(max(np.max(np.nan_to_num(mu, nan=-np.inf)), 0.0))


def epsilon_lower_bound_gdp(scores, is_in, *, delta: float, confidence: float = 0.95) -> float:
    """ε lower bound assuming a Gaussian trade-off: `gdp_epsilon`(`gdp_mu_lower_bound`, δ).

    Holds with probability ≥ `confidence` for a mechanism that is μ-GDP for its true μ, as full-batch
    DP-SGD is (μ = √T/σ); for subsampled DP-SGD (q < 1) the trade-off is not Gaussian and the number is an
    estimate, not a bound. Uses every threshold at once, so it needs far fewer trials than one
    Clopper–Pearson threshold at a tiny FPR.

    **Arguments** `scores (n,)`, higher means in; `is_in (n,)` bool; `delta` δ ∈ (0, 1); `confidence`.

    **Returns** ε ≥ 0.

    **Raises** `ValueError` as `gdp_mu_lower_bound` and `gdp_epsilon`.

    Nasr et al. 2023 §5 (the GDP audit), with the conversion of Dong, Roth & Su 2019, Corollary 2.13.
    """
    return gdp_epsilon(gdp_mu_lower_bound(scores, is_in, confidence=confidence), delta)


def _fdp_rejects(mu: float, m: int, n_guess: int, n_correct: int, alpha: float) -> float:
    """> 0 when `n_correct` right of `n_guess` guesses among m canaries reject μ-GDP at level α.

    Mahloujifar et al. 2024, Alg. 3 ("audit_rh_with_cap"): the most correct guesses a μ-GDP mechanism allows
    with probability α, built up one guess at a time along the trade-off curve's inverse.
    """
    r, h = alpha * n_correct / m, alpha * (n_guess - n_correct) / m
    for i in range(n_correct - 1, -1, -1):
        h_new = max(h, float(special.ndtr(special.ndtri(r) - mu)))
        if h_new == h:  # nothing moves any more
            break
        r, h = min(r + i / (n_guess - i) * (h_new - h), 1.0), h_new
    return r + h - n_guess / m


def _fdp_epsilon_at(m, n_guess, n_correct, alpha, delta, eps_lo):
    """The largest ε whose GDP claim (μ = `gdp_mu`(ε, δ)) these counts reject, or `eps_lo` if none above it."""
    mu_lo = gdp_mu(eps_lo, delta)
    if _fdp_rejects(mu_lo, m, n_guess, n_correct, alpha) <= 0:
        return eps_lo
    mu_hi = max(2 * mu_lo, 1.0)
    while _fdp_rejects(mu_hi, m, n_guess, n_correct, alpha) > 0:
        mu_lo, mu_hi = mu_hi, 2 * mu_hi
    mu = optimize.brentq(lambda u: _fdp_rejects(u, m, n_guess, n_correct, alpha), mu_lo, mu_hi, xtol=1e-9)
    return max(gdp_epsilon(mu, delta), eps_lo)


def epsilon_lower_bound_fdp(scores, is_in, *, delta: float, confidence: float = 0.95) -> float:
    """ε lower bound from auditing the Gaussian f-DP claim with the guesses of one threshold.

    At each threshold of `roc_hull` (Bonferroni over them) the guesses "in" (score ≥ t), n of them with c
    correct among m canaries, are tested against the μ-GDP trade-off; the bound is the largest ε whose
    claim (μ with `gdp_epsilon`(μ, δ) = ε) is rejected at level 1 − confidence. The test stays valid when all
    canaries share one training run (it does not need independent trials), which costs tightness here.

    **Arguments** `scores (n,)`, higher means in; `is_in (n,)` bool; `delta` δ ∈ (0, 1); `confidence`.

    **Returns** ε ≥ 0.

    **Raises** `ValueError` as `roc_hull`, or for a confidence outside (0.5, 1).

    Mahloujifar, Melis & Chaudhuri 2024 ("Auditing f-differential privacy in one run"), Alg. 3 with the
    Gaussian family, as `jax_privacy.auditing.CanaryScoreAuditor.epsilon_one_run_fdp`.
    """
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    _, fn, tn = roc_hull(scores, is_in)
    n_in, n_out = fn[-1], tn[-1]
    tp, fp = n_in - fn, n_out - tn
    guesses = tp + fp
    alpha = (1 - confidence) / len(fn)
    with np.errstate(all="ignore"):  # most precise first: later thresholds are then mostly skipped
        order = np.argsort(-(1 - clopper_pearson_upper(fp, guesses, alpha)))
    best = 0.0
    for i in order:
        # a precision below e^ε/(1+e^ε) cannot beat ε (the same shortcut as jax_privacy)
        if guesses[i] == 0 or tp[i] / guesses[i] <= special.expit(best):
            continue
        best = _fdp_epsilon_at(int(n_in + n_out), int(guesses[i]), int(tp[i]), alpha, delta, best)
    return float(best)


@dataclasses.dataclass(frozen=True)
class Estimator:
    """One way to turn canary scores into an ε lower bound.

    `bound(scores, is_in, delta=, confidence=) -> ε`; `gaussian`: the bound holds only for a Gaussian trade-off
    (DP-SGD at full batch); `assumes`: what it needs, in words; `why`: one sentence on how tight it is and why;
    `reference`: the paper.
    """

    name: str
    bound: Callable[..., float]
    gaussian: bool
    assumes: str
    why: str
    reference: str


def _clopper_pearson_bound(scores, is_in, *, delta, confidence):
    return epsilon_lower_bound(scores, is_in, delta=delta, confidence=confidence)[0]


#: The estimators an audit reports, each at the audit's confidence. Scores are oriented (higher = in).
ESTIMATORS: dict[str, Estimator] = {
    e.name: e
    for e in (
        Estimator("Clopper–Pearson", _clopper_pearson_bound, False, "independent trials",
                  "it reads one threshold, so it must measure a tiny false-positive rate and most of the ε hides in "
                  "the width of that rate's interval", "Jagielski et al. 2020; Nasr et al. 2021"),
        Estimator("Gaussian DP", epsilon_lower_bound_gdp, True, "independent trials and a Gaussian trade-off "
                  "(DP-SGD at full batch)", "it fits μ of the Gaussian trade-off DP-SGD follows to every threshold at "
                  "once, so no tiny rate has to be measured", "Nasr et al. 2023; Dong, Roth & Su 2019"),
        Estimator("f-DP (one run)", epsilon_lower_bound_fdp, True, "a Gaussian trade-off (DP-SGD at full batch); "
                  "the trials need not be independent", "it stays valid even if every canary shared one training "
                  "run, and pays for that generality with a looser bound", "Mahloujifar et al. 2024"),
    )
}


# ---------------------------------------------------------------- canaries through train_dp_sgd

CANARY_SCALE = 10.0  # the gradient canary's gradient norm, in units of C (clipped to C)
ANCHOR_SCALE = 2.0  # the anchor example's gradient norm in units of C (so microbatch clipping shows)
CANARIES = {"gradient": "white-box gradient canary (a Dirac gradient)", "input": "input-space canary (a mislabeled outlier)"}


def gradient_canary_loss(params, x, y):
    """Loss of one example of the gradient audit: y·θ[block], a Dirac gradient of norm |y|."""
    return y * params["theta"][x[0].astype(jnp.int32)]


def input_canary_loss(params, x, y):
    """Logistic loss of one example of the input audit: block x[0], features x[1:], label y ∈ {−1, 1}."""
    w = params["w"][x[0].astype(jnp.int32)]
    return jax.nn.softplus(-y * jnp.dot(w, x[1:]))


def _input_block(rng: np.random.Generator, n: int = 7):
    """One block's fixed training set: n points of two Gaussian blobs in 2-D, labels ±1."""
    y = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    f = y[:, None] * np.array([1.0, 1.0]) + 0.3 * rng.standard_normal((n, 2))
    return f, y


INPUT_CANARY = (np.array([-2.0, 2.0]), 1.0)  # an outlier the blobs say nothing about, labelled +1


GRADIENT_LR, INPUT_LR = 1.0, 0.5


@functools.cache
def _sgd(lr: float) -> optax.GradientTransformation:
    """Plain SGD, one object per learning rate: the jitted DP-SGD step compiles once, not once per run."""
    return optax.sgd(lr)


def _trial_run(kind: str, is_in: np.ndarray, *, noise_multiplier, steps, sample_rate, clip_norm, delta, bug, seed):
    """One `train_dp_sgd` run holding len(is_in) trials; returns the (R,) observations."""
    r = len(is_in)
    blocks = np.arange(r, dtype=np.float32)
    if kind == "gradient":
        # example 2r: the canary (or a zero-gradient stand-in), example 2r+1: the anchor
        xs = np.repeat(blocks, 2)[:, None]
        ys = np.stack([np.where(is_in, CANARY_SCALE * clip_norm, 0.0), np.full(r, -ANCHOR_SCALE * clip_norm)], 1).ravel()
        params, loss, lr = {"theta": jnp.zeros(r)}, gradient_canary_loss, GRADIENT_LR
    else:
        f, y = _input_block(np.random.default_rng(0))
        n = len(f) + 1
        cf, cy = INPUT_CANARY
        feats = np.concatenate([np.broadcast_to(f, (r,) + f.shape), np.where(is_in[:, None, None], cf, 0.0) * np.ones((r, 1, 2))], 1)
        xs = np.concatenate([np.repeat(blocks, n)[:, None], feats.reshape(-1, 2)], 1)
        ys = np.tile(np.r_[y, cy], r)
        params, loss, lr = {"w": jnp.zeros((r, 2))}, input_canary_loss, INPUT_LR
    run = train_dp_sgd(params, loss, jnp.asarray(xs, jnp.float32), jnp.asarray(ys, jnp.float32),
                       sample_rate=sample_rate, noise_multiplier=noise_multiplier, clip_norm=clip_norm,
                       optimizer=_sgd(lr), steps=steps, checkpoint_every=max(steps, 1), seed=seed, delta=delta,
                       privatize=privacy.noisy_clipped_sum if bug is None else BUGS[bug].privatize)
    if kind == "gradient":
        n_total = len(ys)
        return -np.asarray(run.final["theta"], np.float64) * sample_rate * n_total / clip_norm
    w = np.asarray(run.final["w"], np.float64)
    return cy * w @ INPUT_CANARY[0]


@dataclasses.dataclass(frozen=True, eq=False)
class AuditResult:
    """An audit of DP-SGD with canaries.

    - `epsilon_lower`: the Clopper–Pearson ε lower bound at `confidence` from all trials; `epsilon_claimed`:
      the PLD accountant's ε for the same run (q, σ, T, δ).
    - `estimates`: every estimator of `ESTIMATORS` by name, its ε lower bound at `confidence` (each holds on
      its own at that level, under its `assumes`); `curves`: each one's bound from the first n_k trials.
    - `mu_lower`: `gdp_mu_lower_bound` of the scores (full batch: the true μ is √T/σ).
    - `scores (n,)`, `is_in (n,)`: each trial's observation and whether its canary was in.
    - `trials_curve (K,)`, `epsilon_curve (K,)`: the bound from the first n_k trials (each point is a
      95% bound on its own, not all at once).
    - `threshold`, `direction`: the test the bound uses (guess "in" when direction·score ≥ direction·threshold).
    """

    epsilon_lower: float
    epsilon_claimed: float
    scores: np.ndarray
    is_in: np.ndarray
    trials_curve: np.ndarray
    epsilon_curve: np.ndarray
    threshold: float
    direction: int
    noise_multiplier: float
    steps: int
    sample_rate: float
    clip_norm: float
    delta: float
    bug: str | None
    canary: str
    confidence: float
    estimates: dict[str, float] = dataclasses.field(default_factory=dict)
    curves: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    mu_lower: float = 0.0

    @property
    def trials(self) -> int:
        return len(self.scores)

    @property
    def gaussian(self) -> bool:
        """Whether the Gaussian-trade-off estimators hold: full-batch DP-SGD is exactly √T/σ-GDP."""
        return self.sample_rate == 1.0

    @property
    def valid(self) -> dict[str, float]:
        """The estimates whose assumption holds for this run (the Gaussian ones only at full batch)."""
        return {n: e for n, e in self.estimates.items() if self.gaussian or not ESTIMATORS[n].gaussian}

    @property
    def caught(self) -> list[str]:
        """The estimators whose bound is above the claimed ε, among `valid`."""
        return [n for n, e in self.valid.items() if e > self.epsilon_claimed]

    @property
    def guesses(self) -> np.ndarray:
        """(n,) bool: the audit's test on each trial, "in" when direction·score ≥ direction·threshold."""
        return self.direction * self.scores >= self.direction * self.threshold

    @property
    def tightest(self) -> str:
        """The estimator with the largest bound (the most informative), among `valid`."""
        return max(self.valid, key=self.valid.get)


TRIALS_PER_RUN = {"gradient": 2048, "input": 256}


def audit_dp_sgd(
    *,
    noise_multiplier: float,
    steps: int,
    sample_rate: float = 1.0,
    clip_norm: float = 1.0,
    delta: float = 1e-5,
    bug: str | None = None,
    seed: int = 0,
    trials: int = 20_000,
    canary: str = "gradient",
    confidence: float = 0.95,
    progress: Callable[[int, int], None] | None = None,
) -> AuditResult:
    """Audit gradlab's DP-SGD (`gradlab.train.train_dp_sgd`): an empirical ε lower bound from canaries.

    Each trial flips a fair coin to put its canary in or not, trains with the real `train_dp_sgd`
    (R trials per run, see the module docstring), observes the trained parameters, and the observations
    of all trials give `epsilon_lower_bound`. 2048 gradient-canary trials (256 input-canary trials) share a run.

    **Arguments**
    - `noise_multiplier` σ ≥ 0, `steps` T ≥ 1, `sample_rate` q ∈ (0, 1], `clip_norm` C > 0, `delta` δ.
    - `bug`: None, or a name in `BUGS` (a planted bug the audit should catch).
    - `seed`: the trials' coins and the runs' seeds; `trials` ≥ 16 (rounded up to whole runs).
    - `canary`: `"gradient"` (white box, tight) or `"input"` (a mislabeled outlier input).
    - `confidence`: of the lower bound; `progress(done, total)`: called after each run.

    **Returns** an `AuditResult`: `epsilon_lower` (Clopper–Pearson) ≤ the true ε with probability ≥
    `confidence` (if the trials are independent, as they are for correct per-example clipping), the same for
    each estimator of `ESTIMATORS` in `estimates` (Gaussian DP and f-DP: at full batch, q = 1), and
    `epsilon_claimed`, the PLD accountant's ε for (q, σ, T, δ) (Nasr et al. 2021, 2023; Jagielski et al. 2020;
    Mahloujifar et al. 2024).

    **Raises** `ValueError` for an unknown bug or canary, or settings `train_dp_sgd` refuses.
    """
    if bug is not None and bug not in BUGS:
        raise ValueError(f"unknown planted bug {bug!r}; choose one of {', '.join(BUGS)}")
    if canary not in CANARIES:
        raise ValueError(f"unknown canary {canary!r}; choose one of {', '.join(CANARIES)}")
    if int(steps) < 1 or int(trials) < 16:
        raise ValueError(f"an audit needs steps ≥ 1 and trials ≥ 16, got {steps} and {trials}")
    sigma = privacy.check_noise_multiplier(noise_multiplier)
    claimed = privacy.dp_sgd_epsilon(sample_rate=sample_rate, noise_multiplier=sigma, steps=int(steps), delta=delta,
                                     accountant="pld")
    per_run = min(TRIALS_PER_RUN[canary], int(trials))
    runs = math.ceil(int(trials) / per_run)
    rng = np.random.default_rng(seed)
    is_in = rng.random(runs * per_run) < 0.5
    scores = []
    for i in range(runs):
        scores.append(_trial_run(canary, is_in[i * per_run:(i + 1) * per_run], noise_multiplier=sigma, steps=int(steps),
                                 sample_rate=sample_rate, clip_norm=clip_norm, delta=delta, bug=bug,
                                 seed=int(rng.integers(2**31))))
        if progress is not None:
            progress(i + 1, runs)
    scores = np.concatenate(scores)
    eps, t, sign = epsilon_lower_bound(scores, is_in, delta=delta, confidence=confidence)
    n = len(scores)
    curve = np.unique(np.r_[np.geomspace(min(64, n), n, 8).astype(int), n])
    # every estimator reads the scores oriented "higher means in", as both canaries' observations are
    curves = {name: np.array([e.bound(scores[:k], is_in[:k], delta=delta, confidence=confidence)
                              if min(is_in[:k].sum(), (~is_in[:k]).sum()) >= 4 else 0.0 for k in curve])
              for name, e in ESTIMATORS.items()}
    estimates = {name: float(c[-1]) for name, c in curves.items()}  # the last curve point is all n trials
    return AuditResult(epsilon_lower=eps, epsilon_claimed=claimed, scores=scores, is_in=is_in, trials_curve=curve,
                       epsilon_curve=curves["Clopper–Pearson"], threshold=t, direction=sign, noise_multiplier=sigma,
                       steps=int(steps), sample_rate=float(sample_rate), clip_norm=float(clip_norm), delta=float(delta),
                       bug=bug, canary=canary, confidence=confidence, estimates=estimates, curves=curves,
                       mu_lower=gdp_mu_lower_bound(scores, is_in, confidence=confidence))


# ---------------------------------------------------------------- one canary's record


def canary_example(canary: str, clip_norm: float) -> tuple[Callable, dict, jnp.ndarray, jnp.ndarray]:
    """The canary of an audit as one example of a one-trial run, where the audit starts from.

    **Arguments** `canary`: a name in `CANARIES`; `clip_norm` C > 0 (the gradient canary's loss scales with it).

    **Returns** `(loss_fn, params, xs (1, d), ys (1,))`, gradlab's engine contract: `loss_fn(params, x, y)` is the
    canary's own loss (`gradient_canary_loss`: 10·C·θ₀; `input_canary_loss`: the logistic loss of `INPUT_CANARY`),
    `params` the audit's initial parameters (zeros) of trial block 0, `xs[0] = [block 0, features…]`.

    **Raises** `ValueError` for an unknown canary or C ≤ 0.
    """
    if canary not in CANARIES:
        raise ValueError(f"unknown canary {canary!r}; choose one of {', '.join(CANARIES)}")
    clip_norm = privacy.check_clip_norm(clip_norm)
    if canary == "gradient":
        return (gradient_canary_loss, {"theta": jnp.zeros(1)}, jnp.zeros((1, 1)),
                jnp.array([CANARY_SCALE * clip_norm], jnp.float32))
    features, label = INPUT_CANARY
    return (input_canary_loss, {"w": jnp.zeros((1, 2))}, jnp.asarray(np.r_[0.0, features][None], jnp.float32),
            jnp.array([label], jnp.float32))


@dataclasses.dataclass(frozen=True)
class CanaryRecord:
    """One audit's canary, as the Example record card shows an example (`canary_record`).

    - `canary`: its kind (`CANARIES`); `loss`: its loss in words; `features (2,)` and `label`: the input canary's
      input and the label it was planted with (None for the gradient canary, which has no input, only a loss).
    - `grad_norm`: ‖g‖ of its own loss at the parameters the audit starts from (loss units per parameter unit);
      `clip_factor`: min(1, C/‖g‖) at the audit's `clip_norm` C, the share of it correct DP-SGD keeps.
    - `grad_norm_trained`, `clip_factor_trained`: the same at trial `trial`'s trained model (input canary with a
      trial; None otherwise: the gradient canary's loss is linear, so its gradient is the same at every θ).
    - `scores_in (n_in,)`, `scores_out (n_out,)`: the observations of the trials with and without it.
    - `threshold`, `direction`: the audit's test (guess "in" when direction·score ≥ direction·threshold); `tpr`,
      `fpr`: that test's rates over all the trials.
    - `trial`, `observation`, `trial_in`, `guessed_in`: one chosen trial (None when none is chosen).
    """

    canary: str
    loss: str
    features: np.ndarray | None
    label: float | None
    clip_norm: float
    grad_norm: float
    clip_factor: float
    grad_norm_trained: float | None
    clip_factor_trained: float | None
    scores_in: np.ndarray
    scores_out: np.ndarray
    threshold: float
    direction: int
    tpr: float
    fpr: float
    trial: int | None = None
    observation: float | None = None
    trial_in: bool | None = None
    guessed_in: bool | None = None

    @property
    def correct(self) -> bool | None:
        """Whether the test guessed the chosen trial's membership right (None: no trial chosen)."""
        return None if self.trial is None else self.guessed_in == self.trial_in


def canary_record(result: AuditResult, trial: int | None = None) -> CanaryRecord:
    """Describe the canary of an audit: what it is, what clipping does to it, and what the trials say about it.

    The gradient norm is `engine.per_example_norms` of the canary's own loss (`canary_example`) at the parameters
    the audit starts from: the gradient canary's is exactly 10·C (a Dirac gradient, clipped to C: factor 0.1). For
    the input canary and a chosen trial it is also taken at that trial's trained model: the logistic loss's
    gradient −y·σ(−m)·x depends on the trained weights only through the margin m = y·w·x, which is the trial's
    observation, so weights w = m·y·x/‖x‖² (the same margin) give the trained model's gradient exactly, without
    retraining. The evidence is the audit's own threshold test (`AuditResult.threshold`, `direction`) on its trials.

    **Arguments**
    - `result`: an `audit_dp_sgd` result (`scores (n,)`, `is_in (n,)`, its `canary` and `clip_norm` C).
    - `trial`: a trial r in [0, n) to describe, or None.

    **Returns** a `CanaryRecord`.

    **Raises** `ValueError` for a trial outside [0, n) or a result without trials in both worlds.

    Canaries: Jagielski et al. 2020 ("Auditing differentially private machine learning"); Nasr et al. 2023 ("Tight
    auditing of differentially private machine learning"), whose white-box gradient canary this is.
    """
    scores, is_in = np.asarray(result.scores, np.float64), np.asarray(result.is_in, bool)
    n = len(scores)
    if is_in.all() or not is_in.any():
        raise ValueError("the audit needs trials both with and without the canary")
    if trial is not None and not (0 <= int(trial) < n):
        raise ValueError(f"trial {trial} is not one of this audit's trials (0 to {n - 1})")
    c = float(result.clip_norm)
    loss_fn, params, xs, ys = canary_example(result.canary, c)
    g = float(engine.per_example_norms(loss_fn, params, xs, ys)[0])
    keep = lambda norm: float(clip_factor(norm, c))  # noqa: E731
    guess = np.asarray(result.guesses, bool)
    g_trained = None
    if trial is not None and result.canary == "input":
        x, y = np.asarray(xs[0, 1:], np.float64), float(ys[0])
        w = scores[int(trial)] * y * x / (x @ x)  # the trained margin m = y·w·x
        g_trained = float(engine.per_example_norms(loss_fn, {"w": jnp.asarray(w[None], jnp.float32)}, xs, ys)[0])
    features, label = (None, None) if result.canary == "gradient" else (np.asarray(INPUT_CANARY[0]), float(INPUT_CANARY[1]))
    return CanaryRecord(
        canary=result.canary,
        loss=(f"{CANARY_SCALE:g}·C·θᵣ, linear in its trial's own parameter θᵣ" if result.canary == "gradient" else
              "the logistic loss softplus(−y·wᵣ·x) of a mislabeled outlier x in its trial's logistic regression wᵣ"),
        features=features, label=label, clip_norm=c, grad_norm=g, clip_factor=keep(g),
        grad_norm_trained=g_trained, clip_factor_trained=None if g_trained is None else keep(g_trained),
        scores_in=scores[is_in], scores_out=scores[~is_in], threshold=float(result.threshold),
        direction=int(result.direction), tpr=float(guess[is_in].mean()), fpr=float(guess[~is_in].mean()),
        **({} if trial is None else dict(trial=int(trial), observation=float(scores[int(trial)]),
                                         trial_in=bool(is_in[int(trial)]), guessed_in=bool(guess[int(trial)]))))
