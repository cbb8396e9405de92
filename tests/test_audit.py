"""The DP-SGD audit: its statistics against scipy and the Gaussian mechanism, soundness on correct
DP-SGD, and every planted bug caught."""

import math

import numpy as np
import optax
import pytest
from scipy import stats

from gradlab import audit, privacy
from gradlab.train import train_dp_sgd


def gaussian_dp_epsilon(mu: float, delta: float) -> float:
    """ε(δ) of the Gaussian mechanism with sensitivity/σ = μ (Balle & Wang 2018, Thm 8), by bisection."""
    def d(eps):
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
    lo, hi = 0.0, 50.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return hi


def test_clopper_pearson_matches_scipy_exact_interval():
    for k, n in [(0, 50), (3, 50), (25, 50), (50, 50), (7, 1000)]:
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert float(audit.clopper_pearson_lower(k, n, 0.025)) == pytest.approx(ci.low, abs=1e-9)
        assert float(audit.clopper_pearson_upper(k, n, 0.025)) == pytest.approx(ci.high, abs=1e-9)


def test_epsilon_from_rates_is_the_dp_inequality():
    # TPR = 0.5 at FPR = 0.01: ε ≥ log((0.5 − δ)/0.01); the mirror side 0.99/0.5 is smaller
    assert audit.epsilon_from_rates(0.01, 0.5, 1e-5) == pytest.approx(math.log((0.5 - 1e-5) / 0.01))
    assert audit.epsilon_from_rates(0.5, 0.99, 0.0) == pytest.approx(math.log(0.5 / 0.01))
    assert audit.epsilon_from_rates(0.3, 0.2, 0.0) == 0.0  # worse than guessing: no evidence


def test_lower_bound_on_gaussian_scores_is_sound_and_informative():
    # scores of a Gaussian mechanism with μ = 1: the true ε at δ = 1e-5 is the analytic 4.38
    rng = np.random.default_rng(0)
    is_in = rng.random(20_000) < 0.5
    scores = rng.standard_normal(20_000) + is_in
    eps, _, direction = audit.epsilon_lower_bound(scores, is_in, delta=1e-5)
    true = gaussian_dp_epsilon(1.0, 1e-5)
    assert true == pytest.approx(privacy.dp_sgd_epsilon(sample_rate=1, noise_multiplier=1, steps=1, delta=1e-5,
                                                        accountant="pld"), rel=1e-2)
    assert 1.0 < eps < true and direction == 1
    assert audit.epsilon_lower_bound(rng.standard_normal(4000), rng.random(4000) < 0.5, delta=1e-5)[0] < 0.5
    with pytest.raises(ValueError, match="at least 4"):
        audit.epsilon_lower_bound(np.zeros(10), np.zeros(10, bool), delta=1e-5)


def test_gradient_canary_observations_follow_the_gaussian_mechanism():
    # full batch, T steps: out ~ N(−T, Tσ²) (the anchor), in ~ N(0, Tσ²): the canary adds exactly C per step
    r = audit.audit_dp_sgd(noise_multiplier=2.0, steps=2, clip_norm=0.5, trials=2048, seed=1)
    s_in, s_out = r.scores[r.is_in], r.scores[~r.is_in]
    se = 2.0 * math.sqrt(2) / math.sqrt(len(s_out))
    assert s_out.mean() == pytest.approx(-2.0, abs=4 * se) and s_in.mean() == pytest.approx(0.0, abs=4 * se)
    assert s_out.std() == pytest.approx(2.0 * math.sqrt(2), rel=0.08)
    assert r.epsilon_claimed == pytest.approx(privacy.dp_sgd_epsilon(sample_rate=1, noise_multiplier=2, steps=2,
                                                                     delta=1e-5, accountant="pld"))


@pytest.mark.parametrize("sigma,steps", [(1.0, 1), (2.0, 1), (2.0, 2), (2.0, 4), (1.0, 4)])
def test_sound_on_correct_dp_sgd(sigma, steps):
    r = audit.audit_dp_sgd(noise_multiplier=sigma, steps=steps, trials=4096, seed=steps)
    assert r.epsilon_lower <= r.epsilon_claimed
    if sigma / math.sqrt(steps) <= 1:  # μ ≥ 1: 4096 trials already show most of the ε (not a vacuous audit)
        assert r.epsilon_lower > 0.25 * r.epsilon_claimed


def test_input_canary_audit_is_sound():
    r = audit.audit_dp_sgd(noise_multiplier=1.0, steps=2, trials=1024, canary="input")
    assert 0 <= r.epsilon_lower <= r.epsilon_claimed


@pytest.mark.parametrize("bug", ["no per-example clipping", "noise not scaled by C", "noise divided by the batch size twice"])
def test_planted_bug_is_caught(bug):
    # C = 10: at C = 1 "noise not scaled by C" is no bug at all (σ·1 = σ)
    r = audit.audit_dp_sgd(noise_multiplier=1.0, steps=1, clip_norm=10.0, bug=bug, trials=4096)
    assert r.epsilon_lower > r.epsilon_claimed + 0.5


def test_microbatch_bug_is_caught():
    # one example moves a clipped microbatch sum by 2C: a Gaussian mechanism with μ = 2 (ε ≈ 10) accounted as
    # μ = 1 (ε ≈ 4.38); telling them apart takes ~10⁵ trials
    r = audit.audit_dp_sgd(noise_multiplier=1.0, steps=1, bug="sum clipped per microbatch", trials=131_072)
    assert r.epsilon_claimed < r.epsilon_lower <= gaussian_dp_epsilon(2.0, 1e-5)


def test_privatize_hook_leaves_correct_training_alone():
    import jax.numpy as jnp

    xs = jnp.arange(4.0)[:, None]
    ys = jnp.array([1.0, -3.0, 0.5, 2.0])
    kw = dict(sample_rate=1.0, noise_multiplier=1.0, clip_norm=1.0, optimizer=optax.sgd(1.0), steps=2, seed=3)
    p = {"theta": jnp.zeros(4)}
    plain = train_dp_sgd(p, audit.gradient_canary_loss, xs, ys, **kw).final["theta"]
    unclipped = train_dp_sgd(p, audit.gradient_canary_loss, xs, ys, privatize=audit.BUGS["no per-example clipping"].privatize,
                             **kw).final["theta"]
    # the same noise either way; θ_T = −Σ_t (sum + noise)/N, and only examples 1 (y = −3, clipped to −1) and
    # 3 (y = 2, clipped to 1) differ: plain − unclipped = −T·(clipped − raw)/N
    diff = np.asarray(plain - unclipped)
    np.testing.assert_allclose(diff, [0, -2 * 2 / 4, 0, -2 * -1 / 4], atol=1e-5)
    with pytest.raises(ValueError, match="unknown planted bug"):
        audit.audit_dp_sgd(noise_multiplier=1.0, steps=1, bug="nope")
