"""Membership inference: was this example in the training set? Attacks, ROC, and the DP bound on any attack.

- Loss-threshold attack (Yeom et al. 2018, "Privacy risk in machine learning"): members have lower loss.
- Offline LiRA (Carlini et al. 2022, "Membership inference attacks from first principles", §VI): shadow
  models trained on random halves of the data; for each example, the shadows that did NOT train on it
  give the distribution of its logit-scaled confidence φ = log(p_y / (1 − p_y)); the score is how far the
  target's φ sits above that distribution, in standard deviations (one-sided, global variance).
- (ε, δ)-DP bounds every attack's ROC: TPR ≤ e^ε·FPR + δ and 1 − FPR ≤ e^ε·(1 − TPR) + δ
  (Kairouz et al. 2015), i.e. TPR ≤ 1 − e^(−ε)·(1 − δ − FPR).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from gradlab import ensemble
from gradlab.metrics import Roc, roc
from gradlab.train import train_dp_sgd


def logit_confidence(logits, labels) -> np.ndarray:
    """φ = log(p_y / (1 − p_y)) = logit_y − logsumexp_{k≠y} logit_k, computed stably.

    **Arguments** `logits (N, K)`, `labels (N,)` int. **Returns** `(N,)` float64 (nats).
    """
    logits = jnp.asarray(logits, jnp.float32)
    labels = jnp.asarray(labels, jnp.int32)
    own = jnp.take_along_axis(logits, labels[:, None], 1)[:, 0]
    others = jnp.where(jax.nn.one_hot(labels, logits.shape[1], dtype=bool), -jnp.inf, logits)
    return np.asarray(own - jax.nn.logsumexp(others, axis=1), np.float64)


def loss_attack_scores(losses) -> np.ndarray:
    """Yeom et al. (2018): the score is −loss (low loss ⇒ member). `losses (N,)` → `(N,)` float64."""
    return -np.asarray(losses, np.float64)


def lira_offline_scores(target_conf, shadow_conf, shadow_in) -> np.ndarray:
    """Offline LiRA (Carlini et al. 2022, Algorithm 1 without IN models, fixed variance).

    **Arguments**
    - `target_conf (N,)`: φ of each example under the target model.
    - `shadow_conf (S, N)`: φ under each of S shadow models; `shadow_in (S, N)` bool: shadow s trained on example i.

    **Returns** `(N,)` float64: (φ_target − μ_out,i) / σ_out, with μ_out,i the mean φ of example i over the
    shadows that left it out and σ_out the standard deviation of those φ pooled over all examples (a global
    variance: the paper's choice for few shadows). Higher ⇒ member.

    **Raises** `ValueError` if shapes disagree or some example is in every shadow (no OUT model for it).
    """
    return lira_offline(target_conf, shadow_conf, shadow_in, global_variance=True)


#: Below this many shadow models LiRA fits one variance over all examples (its "fixed variance"): Carlini et al. 2022
#: (§IV) estimate a global variance rather than one per example when they have fewer than 64 shadow models.
LIRA_PER_EXAMPLE_MIN_SHADOWS = 64


def _check_shadows(target_conf, shadow_conf, shadow_in):
    target_conf = np.asarray(target_conf, np.float64)
    shadow_conf, shadow_in = np.asarray(shadow_conf, np.float64), np.asarray(shadow_in, bool)
    if shadow_conf.ndim != 2 or shadow_conf.shape != shadow_in.shape or shadow_conf.shape[1:] != target_conf.shape:
        raise ValueError(f"shapes disagree: target {target_conf.shape}, shadows {shadow_conf.shape} and {shadow_in.shape}")
    return target_conf, shadow_conf, shadow_in


def gaussian_fits(shadow_conf, which, *, global_variance: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each example's Gaussian fit of φ over the shadows where `which (S, N)` is True: means `(N,)` and standard
    deviations `(N,)`. With `global_variance` one standard deviation pooled over all examples' residuals (divisor
    Σᵢ nᵢ − 1), else each example's own (divisor nᵢ − 1; NaN where nᵢ < 2). Means are NaN where nᵢ = 0."""
    shadow_conf, which = np.asarray(shadow_conf, np.float64), np.asarray(which, bool)
    n = which.sum(0)
    mu = np.where(which, shadow_conf, 0).sum(0) / np.where(n > 0, n, 1)
    mu = np.where(n > 0, mu, np.nan)
    sq = np.where(which, (shadow_conf - np.where(n > 0, mu, 0)) ** 2, 0.0)
    if global_variance:
        sd = np.full(mu.shape, np.sqrt(sq.sum() / max(int(n.sum()) - 1, 1)))
    else:
        sd = np.where(n > 1, np.sqrt(sq.sum(0) / np.maximum(n - 1, 1)), np.nan)
    return mu, np.maximum(sd, 1e-12)


def lira_online(target_conf, shadow_conf, shadow_in, *, global_variance: bool | None = None) -> np.ndarray:
    """Online LiRA (Carlini et al. 2022, "Membership Inference Attacks From First Principles", §IV, Algorithm 1): per
    example, Gaussian fits of φ = log(p_y / (1 − p_y)) over the shadow models that trained on it (IN) and over those that
    did not (OUT); the score is the log likelihood ratio of the target's φ under the two,
    log Λᵢ = log N(φᵢ; μ_in,i, σ_in²) − log N(φᵢ; μ_out,i, σ_out²) (`scipy.stats.norm.logpdf`). Higher ⇒ member.

    **Arguments**
    - `target_conf (N,)`: φ of each example under the target model (`logit_confidence`).
    - `shadow_conf (S, N)`: φ under each of S shadow models; `shadow_in (S, N)` bool: shadow s trained on example i.
    - `global_variance`: one σ_in and one σ_out pooled over all examples (the paper's choice for few shadows) or a
      variance per example; None: global below `LIRA_PER_EXAMPLE_MIN_SHADOWS` shadows.

    **Returns** `(N,)` float64, in nats.

    **Raises** `ValueError` if shapes disagree, or some example has no IN or no OUT shadow (or fewer than 2 of either
    with per-example variances): train more shadows.
    """
    target_conf, shadow_conf, shadow_in = _check_shadows(target_conf, shadow_conf, shadow_in)
    pooled = len(shadow_in) < LIRA_PER_EXAMPLE_MIN_SHADOWS if global_variance is None else bool(global_variance)
    need = 1 if pooled else 2
    for name, which in (("IN", shadow_in), ("OUT", ~shadow_in)):
        few = which.sum(0) < need
        if np.any(few):
            raise ValueError(f"{int(few.sum())} examples have fewer than {need} {name} shadow models: train more shadows")
    mu_in, sd_in = gaussian_fits(shadow_conf, shadow_in, global_variance=pooled)
    mu_out, sd_out = gaussian_fits(shadow_conf, ~shadow_in, global_variance=pooled)
    return stats.norm.logpdf(target_conf, mu_in, sd_in) - stats.norm.logpdf(target_conf, mu_out, sd_out)


def lira_offline(target_conf, shadow_conf, shadow_in, *, global_variance: bool | None = None) -> np.ndarray:
    """Offline LiRA (Carlini et al. 2022, §IV, Algorithm 1 without IN models): how far the target's φ sits above
    the Gaussian fit of φ over the shadows that did NOT train on the example, z = (φᵢ − μ_out,i) / σ_out, a one-sided
    test (its p-value is `scipy.stats.norm.sf(z)`). Higher ⇒ member.

    **Arguments** as `lira_online` (`global_variance` None: global below `LIRA_PER_EXAMPLE_MIN_SHADOWS` shadows).

    **Returns** `(N,)` float64, in standard deviations.

    **Raises** `ValueError` if shapes disagree or some example has no OUT shadow (fewer than 2 with per-example
    variances).
    """
    target_conf, shadow_conf, shadow_in = _check_shadows(target_conf, shadow_conf, shadow_in)
    pooled = len(shadow_in) < LIRA_PER_EXAMPLE_MIN_SHADOWS if global_variance is None else bool(global_variance)
    few = (~shadow_in).sum(0) < (1 if pooled else 2)
    if np.any(few):
        raise ValueError(f"{int(few.sum())} examples are in every shadow model: train more shadows")
    mu, sd = gaussian_fits(shadow_conf, ~shadow_in, global_variance=pooled)
    return (target_conf - mu) / sd


def leave_one_model_out(score_fn: Callable, conf, losses, masks) -> tuple[np.ndarray, np.ndarray]:
    """An attack evaluated on an ensemble as Carlini et al. 2022 evaluate theirs: each model in turn is the
    target, the other M − 1 its shadows; the scores of all targets on all examples are pooled.

    **Arguments** `score_fn(target_conf (N,), target_losses (N,), shadow_conf (M−1, N), shadow_in (M−1, N)) -> (N,)`
    (e.g. `lambda c, l, sc, si: lira_online(c, sc, si)`); `conf (M, N)` φ and `losses (M, N)` of every model on every
    example; `masks (M, N)` bool: model m trained on example i.

    **Returns** `(scores (M·N,), is_member (M·N,) bool)`: feed them to `gradlab.metrics.roc`.
    """
    conf, losses, masks = np.asarray(conf), np.asarray(losses), np.asarray(masks, bool)
    scores = []
    for t in range(len(masks)):
        rest = np.arange(len(masks)) != t
        scores.append(np.asarray(score_fn(conf[t], losses[t], conf[rest], masks[rest]), np.float64))
    return np.concatenate(scores), masks.reshape(-1)


def dp_roc_bound(fpr, epsilon: float, delta: float) -> np.ndarray:
    """The highest TPR any membership test can reach at `fpr` against an (ε, δ)-DP training run.

    min(1, e^ε·FPR + δ, 1 − e^(−ε)·(1 − δ − FPR)) (Kairouz et al. 2015, Thm 2.1). `fpr` any shape in [0, 1].
    """
    fpr = np.asarray(fpr, np.float64)
    if not np.isfinite(epsilon):
        return np.ones_like(fpr)
    return np.clip(np.minimum(np.exp(epsilon) * fpr + delta, 1 - np.exp(-epsilon) * (1 - delta - fpr)), 0, 1)


@dataclasses.dataclass(frozen=True, eq=False)
class MembershipResult:
    """Membership inference against one training procedure.

    - `is_member (N,)`: the target's training half of the pool; `losses (N,)`, `conf (N,)`: the target's
      loss and φ on every pool example.
    - `scores`: `{"loss": (N,), "lira": (N,)}`; `rocs`: `{name: Roc}`.
    - `train_accuracy`, `test_accuracy`: the target on its members and on the non-members.
    - `shadow_in (S, N)` bool and `shadow_conf (S, N)`: which examples each shadow trained on and its φ on every
      example (the ensemble's masks and per-model outputs, `gradlab.ensemble`).
    """

    is_member: np.ndarray
    losses: np.ndarray
    conf: np.ndarray
    scores: dict
    rocs: dict[str, Roc]
    train_accuracy: float
    test_accuracy: float
    shadow_in: np.ndarray | None = None
    shadow_conf: np.ndarray | None = None


def membership_inference(train_fn: Callable, loss_fn: Callable, logits_fn: Callable, xs, ys, *, n_shadows: int = 8,
                         seed: int = 0, progress: Callable[[int, int], None] | None = None) -> MembershipResult:
    """Train a target and `n_shadows` shadow models on random halves of `(xs, ys)`; attack the target.

    The shadows come in complementary pairs (a random half and the other half), so each example has
    OUT shadows to compare with (Carlini et al. 2022 likewise balance their shadows' halves).

    **Arguments**
    - `train_fn(xs_half, ys_half, seed) -> model`: the training procedure under attack (e.g. DP-SGD).
    - `loss_fn(model, x, y) -> scalar`; `logits_fn(model, xs) -> (n, K)` logits.
    - `xs (N, D)`, `ys (N,)` int: the pool; N even ≥ 4. Every half has N/2 examples (one compiled shape).
    - `n_shadows` ≥ 2; `seed`; `progress(done, total)` after each model.

    **Returns** a `MembershipResult` for the loss attack (Yeom et al. 2018) and offline LiRA (Carlini et al. 2022).

    **Raises** `ValueError` for N < 4, n_shadows < 2, or an example no shadow left out (raise n_shadows).
    """
    xs, ys = np.asarray(xs), np.asarray(ys)
    n = len(ys) - len(ys) % 2
    if n < 4 or n_shadows < 2:
        raise ValueError(f"membership inference needs ≥ 4 examples and ≥ 2 shadow models, got {len(ys)} and {n_shadows}")
    xs, ys = xs[:n], ys[:n]
    # one ensemble (`gradlab.ensemble`): model 0 the target on a random half, then the shadows in complementary pairs
    masks = halves(n, n_shadows, seed)
    models = ensemble.subset_ensemble(ensemble.one_by_one(train_fn, xs, ys, [int(seed) * 1000 + i for i in range(len(masks))],
                                                          progress=progress), n, len(masks), masks=masks)
    member, shadow_in, target = masks[0], masks[1:], models.model(0)
    shadow_conf = np.stack([logit_confidence(logits_fn(models.model(i), xs), ys) for i in range(1, len(masks))])
    conf = logit_confidence(logits_fn(target, xs), ys)
    losses = np.asarray(jax.vmap(loss_fn, in_axes=(None, 0, 0))(target, jnp.asarray(xs), jnp.asarray(ys)), np.float64)
    scores = {"loss": loss_attack_scores(losses), "lira": lira_offline_scores(conf, shadow_conf, shadow_in)}
    correct = np.asarray(jnp.argmax(logits_fn(target, xs), -1)) == ys
    return MembershipResult(is_member=member, losses=losses, conf=conf, scores=scores,
                            rocs={k: roc(v, member) for k, v in scores.items()},
                            train_accuracy=float(correct[member].mean()), test_accuracy=float(correct[~member].mean()),
                            shadow_in=shadow_in, shadow_conf=shadow_conf)


def halves(n: int, n_shadows: int, seed: int = 0) -> np.ndarray:
    """The attack's `(1 + n_shadows, n)` bool masks: row 0 the target's random half, then the shadows' halves in
    complementary pairs (a random half and the other half), so every example has OUT shadows (Carlini et al. 2022
    balance their shadows' halves likewise). Each half is `rng.permutation(n)[: n // 2]` of one generator."""
    rng = np.random.default_rng(seed)

    def half():
        mask = np.zeros(n, bool)
        mask[rng.permutation(n)[: n // 2]] = True
        return mask

    member = half()
    pairs = [m for _ in range((n_shadows + 1) // 2) for m in (lambda h: (h, ~h))(half())][:n_shadows]
    return np.stack([member, *pairs])


ATTACKS = {"loss": "loss threshold (Yeom et al. 2018)", "lira": "offline LiRA (Carlini et al. 2022)"}


def private_vs_nonprivate(model, loss_fn: Callable, xs, ys, *, sample_rate: float, noise_multiplier: float,
                          clip_norm: float, optimizer: str = "adam", lr: float = 0.01, steps: int = 200,
                          n_shadows: int = 4, seed: int = 0, progress: Callable[[float], None] | None = None,
                          predict_fn: Callable | None = None) -> dict[str, MembershipResult]:
    """Membership inference against DP-SGD and against the same training without clipping or noise.

    Both procedures are `gradlab.train.train_dp_sgd` from `model` with the same Poisson-sampled batches,
    optimizer and steps (the non-private one with σ = 0 and C = inf, as the DP clipping page compares them),
    on the same random halves of the pool `(xs, ys)`.

    **Arguments** `model(x) -> logits (K,)` (an Equinox module or any callable pytree; or params with
    `predict_fn(params, x) -> logits (K,)`, a served model's), `loss_fn(model, x, y)`,
    `xs (N, D)`, `ys (N,)` int; the DP-SGD settings; `n_shadows` per procedure; `progress(fraction)`.

    **Returns** `{"non-private": MembershipResult, "DP-SGD": MembershipResult}`.

    **Raises** `ValueError` (`TrainingError`) for impossible settings or a diverging run.
    """

    def logits_fn(m, x):
        return jax.vmap(m if predict_fn is None else (lambda one: predict_fn(m, one)))(jnp.asarray(x))

    out = {}
    for j, (name, sigma, c) in enumerate((("non-private", 0.0, float("inf")), ("DP-SGD", noise_multiplier, clip_norm))):
        def train_fn(x, y, s, sigma=sigma, c=c):
            return train_dp_sgd(model, loss_fn, x, y, sample_rate=sample_rate, noise_multiplier=sigma, clip_norm=c,
                                optimizer=optimizer, lr=lr, steps=steps, seed=s, checkpoint_every=max(steps, 1)).final

        tick = None if progress is None else (lambda i, t, j=j: progress((j + i / t) / 2))
        out[name] = membership_inference(train_fn, loss_fn, logits_fn, xs, ys, n_shadows=n_shadows, seed=seed, progress=tick)
    return out
