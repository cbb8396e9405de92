"""Auditing gradlab's own DP-SGD: canaries through `train_dp_sgd`, and an empirical ε lower bound.

A DP-SGD run claims (ε, δ)-DP: no test can tell whether one example (a *canary*) was in the training
set with TPR > e^ε·FPR + δ. An audit (Jagielski et al. 2020; Nasr et al. 2021, 2023) trains many times
with and without the canary, observes the privatized output, guesses "in" when the observation passes
a threshold, and turns the guesses' (FPR, TPR), with Clopper–Pearson confidence intervals, into a
lower bound on the ε the code really spends. A bound above the accountant's ε is a bug.

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
from scipy import stats

from gradlab import engine, privacy
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

    - `epsilon_lower`: ε lower bound at `confidence` from all trials; `epsilon_claimed`: the PLD
      accountant's ε for the same run (q, σ, T, δ).
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

    @property
    def trials(self) -> int:
        return len(self.scores)


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

    **Returns** an `AuditResult`: `epsilon_lower` ≤ the true ε with probability ≥ `confidence` (if the
    trials are independent, as they are for correct per-example clipping) and `epsilon_claimed`, the
    PLD accountant's ε for (q, σ, T, δ) (Nasr et al. 2021, 2023; Jagielski et al. 2020).

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
    eps_curve = np.array([epsilon_lower_bound(scores[:k], is_in[:k], delta=delta, confidence=confidence)[0]
                          if min(is_in[:k].sum(), (~is_in[:k]).sum()) >= 4 else 0.0 for k in curve])
    return AuditResult(epsilon_lower=eps, epsilon_claimed=claimed, scores=scores, is_in=is_in, trials_curve=curve,
                       epsilon_curve=eps_curve, threshold=t, direction=sign, noise_multiplier=sigma, steps=int(steps),
                       sample_rate=float(sample_rate), clip_norm=float(clip_norm), delta=float(delta), bug=bug,
                       canary=canary, confidence=confidence)
