"""Membership inference: confidences, LiRA and the DP bound against direct computations; a memorizing
model leaks and DP-SGD leaks less."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.datasets import load_digits

from gradlab import audit, losses, membership, metrics, privacy
from gradlab.train import train_dp_sgd


def test_logit_confidence_is_log_odds_of_the_true_class():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 4)) * 3
    labels = rng.integers(0, 4, 6)
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    py = p[np.arange(6), labels]
    np.testing.assert_allclose(membership.logit_confidence(logits, labels), np.log(py / (1 - py)), rtol=1e-4, atol=1e-4)


def test_lira_offline_scores_by_hand():
    target = np.array([2.0, 0.0, 1.0])
    conf = np.array([[1.0, 0.0, 5.0], [3.0, 2.0, 5.0], [0.0, 9.0, 1.0]])
    shadow_in = np.array([[False, True, True], [False, False, True], [True, False, False]])
    # OUT means: ex0 (1+3)/2 = 2, ex1 (2+9)/2 = 5.5, ex2 1; residuals -1, 1, -3.5, 3.5, 0 → pooled sd
    sd = math.sqrt((1 + 1 + 3.5**2 * 2 + 0) / 4)
    np.testing.assert_allclose(membership.lira_offline_scores(target, conf, shadow_in), [0, -5.5 / sd, 0])
    with pytest.raises(ValueError, match="every shadow"):
        membership.lira_offline_scores(target, conf, np.ones((3, 3), bool))


def test_roc_and_tpr_at_low_fpr():
    is_member = np.array([1, 1, 1, 0, 0, 0, 0, 0], bool)
    scores = np.array([9, 8, 1, 7, 2, 3, 4, 0.5])
    r = metrics.roc(scores, is_member)
    # pairs (member, non-member) ranked correctly: 9 and 8 beat all 5, 1 beats only 0.5 → 11/15
    assert r.auc == pytest.approx(11 / 15)
    assert r.tpr_at_1 == pytest.approx(2 / 3) and r.tpr_at_01 == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="both"):
        metrics.roc(scores, np.ones(8, bool))


def test_dp_roc_bound():
    eps, delta = 1.0, 1e-5
    fpr = np.array([0.0, 0.01, 0.2, 0.9, 1.0])
    expected = np.minimum(np.minimum(math.e * fpr + delta, 1 - (1 - delta - fpr) / math.e), 1)
    np.testing.assert_allclose(membership.dp_roc_bound(fpr, eps, delta), expected)
    # the bound meets the audit's inequality with equality: the ε it implies back is ε
    assert audit.epsilon_from_rates(0.01, membership.dp_roc_bound(0.01, eps, 0.0), 0.0) == pytest.approx(eps)
    np.testing.assert_array_equal(membership.dp_roc_bound(fpr, math.inf, delta), 1.0)


class Mlp(eqx.Module):
    layers: tuple

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.layers = (eqx.nn.Linear(64, 32, key=k1), eqx.nn.Linear(32, 10, key=k2))

    def __call__(self, x):
        return self.layers[1](jax.nn.relu(self.layers[0](x)))


@pytest.mark.slow  # its parts are pinned by the tests above; the page runs the attack in test_membership_and_audit_render
def test_memorizing_model_leaks_and_dp_sgd_leaks_less():
    x, y = load_digits(return_X_y=True)
    x = ((x - x.mean(0)) / (x.std(0) + 1e-6)).astype(np.float32)[:128]
    y = y.astype(np.int32)[:128]
    loss_fn = losses.loss_for("classification")
    sigma = privacy.noise_multiplier_for_epsilon(target_epsilon=1.0, sample_rate=0.5, steps=100, delta=1e-5)
    res = membership.private_vs_nonprivate(Mlp(jax.random.key(0)), loss_fn, x, y, sample_rate=0.5, noise_multiplier=sigma,
                                           clip_norm=1.0, lr=0.01, steps=100, n_shadows=2)
    pub, priv = res["non-private"], res["DP-SGD"]
    assert pub.train_accuracy == 1.0 and pub.test_accuracy < 0.97  # memorized
    assert pub.rocs["lira"].auc > 0.6 and pub.rocs["loss"].auc > 0.6
    assert priv.rocs["lira"].auc < pub.rocs["lira"].auc - 0.05
    # the loss attack's AUC is the direct Mann–Whitney statistic of the losses
    lm, ln = pub.losses[pub.is_member], pub.losses[~pub.is_member]
    assert pub.rocs["loss"].auc == pytest.approx(np.mean((lm[:, None] < ln[None]) + 0.5 * (lm[:, None] == ln[None])))
    # the target really trained on its members: its losses match a direct evaluation of a retrained model
    again = train_dp_sgd(Mlp(jax.random.key(0)), loss_fn, x[pub.is_member], y[pub.is_member], sample_rate=0.5,
                         noise_multiplier=0.0, clip_norm=math.inf, optimizer="adam", lr=0.01, steps=100, seed=0,
                         checkpoint_every=100).final
    direct = jax.vmap(loss_fn, in_axes=(None, 0, 0))(again, jnp.asarray(x), jnp.asarray(y))
    np.testing.assert_allclose(pub.losses, np.asarray(direct), rtol=1e-4, atol=1e-5)


def test_the_attack_is_one_subset_ensemble_target_first_then_complementary_shadows():
    """`membership_inference` trains model 0 (the target) and the shadows on `halves`' masks with seeds
    seed·1000 + i, one by one (`gradlab.ensemble`); recomputed here by hand, model by model."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(21, 3)).astype(np.float32)   # odd: the last example is dropped
    y = (x[:, 0] + 0.3 * rng.normal(size=21) > 0).astype(int)

    def train_fn(xs, ys, s):  # a deterministic "training": ridge regression onto one-hot labels, jittered by the seed
        w = np.linalg.solve(xs.T @ xs + np.eye(3), xs.T @ np.eye(2)[ys])
        return jnp.asarray(w + 1e-3 * s)

    loss = lambda w, x, y: jax.nn.logsumexp(x @ w) - (x @ w)[y]  # noqa: E731
    logits = lambda w, xs: jnp.asarray(xs) @ w  # noqa: E731
    seen = []
    res = membership.membership_inference(train_fn, loss, logits, x, y, n_shadows=5, seed=2,
                                          progress=lambda i, t: seen.append((i, t)))
    masks = membership.halves(20, 5, seed=2)
    assert masks.shape == (6, 20) and (masks.sum(1) == 10).all()
    np.testing.assert_array_equal(masks[1] ^ masks[2], True)       # complementary pairs
    np.testing.assert_array_equal(res.is_member, masks[0])
    np.testing.assert_array_equal(res.shadow_in, masks[1:])
    want = [membership.logit_confidence(logits(train_fn(x[:20][m], y[:20][m], 2000 + i + 1), x[:20]), y[:20])
            for i, m in enumerate(masks[1:])]
    np.testing.assert_allclose(res.shadow_conf, want, rtol=1e-6)
    assert seen == [(i, 6) for i in range(1, 7)]
