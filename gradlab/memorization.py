"""Memorization of each training example, estimated from one subset ensemble (Feldman & Zhang 2020).

An example is memorized when the model gets it right only if it trained on it:

    mem(A, S, i) = P[h(xᵢ) = yᵢ | h ← A(S), i ∈ S] − P[h(xᵢ) = yᵢ | h ← A(S), i ∉ S]

(Feldman 2020, "Does learning require memorization?", §1.1; Feldman & Zhang 2020, "What Neural Networks Memorize and
Why", eq. 1), the probabilities over random subsets S of the training set and the training's own randomness. The
estimator (Feldman & Zhang 2020, §2, eq. 2) trains M models on random subsets (`ensemble_for`: halves, as Carlini et
al. 2022 train their shadow models) and, per example, subtracts the fraction of OUT models that classify it
correctly from that of the IN models (`memorization`).

The same ensemble's per-model, per-example outputs give the membership attacks of `gradlab.membership`
(LiRA's φ = log(p_y / (1 − p_y)), the loss), so `gradlab.record` reads one ensemble for both. `ensemble_for` keeps
only those outputs, `(M, N)` numpy arrays, never the models: a few hundred KB for the digits MLP.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Bool

from gradlab import ensemble, experiment, privacy
from gradlab.membership import logit_confidence
from gradlab.train import train_dp_sgd

__all__ = ["DEFAULT_MODELS", "DP_EPSILON", "DP_DELTA", "DP_CLIP_NORM", "EnsembleOutputs", "Memorization",
           "paired_halves", "dp_settings", "ensemble_for", "outputs_of", "memorization"]

#: M, the models of the default ensemble. 32: every example is IN 16 models and OUT of 16 (`paired_halves`), so the
#: memorization of an example has a standard error ≤ 0.18 (≤ 0.5·√(2/16)), LiRA's leave-one-model-out evaluation pools
#: 32 targets × ~720 non-members (an FPR of 0.1% is then ~23 false positives, not a fraction of one), and the digits
#: MLP's ensemble and its DP-SGD twin train in ~15 CPU-s together, half the 30 CPU-s budget behind the button
#: (docs/record.md). 16 models halve the cost but leave ~11 non-members' worth of resolution at FPR 0.1%.
DEFAULT_MODELS = 32
#: The privacy of the DP-SGD ensemble: the DP clipping page's target ε = 3 at δ = 1e-5, clipping norm C = 1.
DP_EPSILON = 3.0
DP_DELTA = 1e-5
DP_CLIP_NORM = 1.0


@dataclasses.dataclass(frozen=True, eq=False)
class EnsembleOutputs:
    """What M models trained on subsets say about every training example (no models kept: store-friendly).

    - `masks (M, N)` bool: model m trained on example i.
    - `losses (M, N)` float32: ℓ(θ_m, zᵢ) in nats; `correct (M, N)` bool: argmax of model m's logits is yᵢ (the
      training label, flipped or not); `conf (M, N)` float32: φ = log(p_y / (1 − p_y)) (`membership.logit_confidence`).
    - `test_accuracy (M,)`: each model on the experiment's test split.
    - `private`: DP-SGD models; then `epsilon`, `delta` (the guarantee of each model, RDP accountant), `noise_multiplier`
      σ and `clip_norm` C; else `epsilon` = inf and σ = 0.
    - `seed`: the masks' and the trainings' seed; `cpu_seconds`: what training and evaluating them took (process CPU).
    """

    masks: np.ndarray
    losses: np.ndarray
    correct: np.ndarray
    conf: np.ndarray
    test_accuracy: np.ndarray
    private: bool = False
    epsilon: float = math.inf
    delta: float = DP_DELTA
    noise_multiplier: float = 0.0
    clip_norm: float = math.inf
    seed: int = 0
    cpu_seconds: float = float("nan")

    def __len__(self) -> int:
        return len(self.masks)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays (what a store holds)."""
        return sum(a.nbytes for a in (self.masks, self.losses, self.correct, self.conf, self.test_accuracy))


@dataclasses.dataclass(frozen=True, eq=False)
class Memorization:
    """Per-example memorization (Feldman & Zhang 2020, eq. 2), all `(N,)`: `value` = `p_in` − `p_out` in [−1, 1],
    its standard error `se`, the fractions of IN and OUT models right on the example, and how many of each."""

    value: np.ndarray
    se: np.ndarray
    p_in: np.ndarray
    p_out: np.ndarray
    n_in: np.ndarray
    n_out: np.ndarray


def paired_halves(n: int, m: int, *, seed: int = 0) -> np.ndarray:
    """M masks over N examples in complementary pairs: model 2k trains on a random half (⌊N/2⌋ examples) and model
    2k + 1 on ⌊N/2⌋ of the rest (all of it for even N), so every example is IN about M/2 models and OUT of about M/2
    (exactly M/2 for even N and M): the balanced design of Carlini et al. 2022's shadow models. An odd M ends with one
    unpaired half. **Returns** `(M, N)` bool. **Raises** `ValueError` unless M ≥ 2 and N ≥ 2."""
    if m < 2 or n < 2:
        raise ValueError(f"an ensemble on halves needs M ≥ 2 models and N ≥ 2 examples, got M = {m}, N = {n}")
    rng = np.random.default_rng(seed)
    h = n // 2
    masks = np.zeros((m, n), bool)
    for k in range(0, m, 2):
        perm = rng.permutation(n)
        masks[k, perm[:h]] = True
        if k + 1 < m:
            masks[k + 1, perm[h:2 * h]] = True
    return masks


def dp_settings(fitted, n: int, *, epsilon: float = DP_EPSILON, delta: float = DP_DELTA,
                clip_norm: float = DP_CLIP_NORM) -> dict:
    """The DP-SGD recipe of the DP clipping page for `fitted`'s model trained on `n` examples: an expected batch of 256
    (q = 256/n), 200 steps of Adam at 0.02 (or the model's `experiment.DP_SGD_DEFAULTS`), clipping norm C and σ
    calibrated so the run spends `epsilon` at `delta` (`privacy.noise_multiplier_for_epsilon`, RDP accountant).
    **Returns** the keyword arguments of `gradlab.train.train_dp_sgd` (without the seed)."""
    dp = {"expected_batch": 256, "steps": 200, "lr": 0.02,
          **experiment.DP_SGD_DEFAULTS.get(fitted.experiment.model, {})}
    q = min(1.0, dp["expected_batch"] / n)
    sigma = privacy.noise_multiplier_for_epsilon(target_epsilon=float(epsilon), sample_rate=q, steps=int(dp["steps"]),
                                                 delta=float(delta))
    return dict(sample_rate=q, noise_multiplier=sigma, clip_norm=float(clip_norm), optimizer="adam", lr=dp["lr"],
                steps=int(dp["steps"]), l2=0.0, delta=float(delta))


def _forward(fitted):
    return (lambda m, xs: jax.vmap(m)(xs)) if fitted.predict_fn is None else (
        lambda m, xs: jax.vmap(lambda x: fitted.predict_fn(m, x))(xs))


def outputs_of(models: ensemble.Ensemble, loss_fn: Callable, logits_fn: Callable, xs, ys, test_xs=None,
               test_ys=None) -> dict[str, np.ndarray]:
    """Every model's loss, correctness and φ on every example of `(xs (N, …), ys (N,))`, and accuracy on the test
    points: `{"losses", "correct", "conf": (M, N), "test_accuracy": (M,)}` (a stacked ensemble is vmapped).
    `logits_fn(model, xs) -> (N, K)`."""
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    logits = models.outputs(lambda m: logits_fn(m, xs))                                      # (M, N, K)
    losses = models.outputs(lambda m: jax.vmap(loss_fn, in_axes=(None, 0, 0))(m, xs, ys))    # (M, N)
    labels = np.asarray(ys)
    conf = np.stack([logit_confidence(lg, labels) for lg in logits]).astype(np.float32)
    if test_xs is None or len(test_ys) == 0:
        acc = np.full(len(logits), np.nan)
    else:
        txs = jnp.asarray(test_xs)
        acc = (models.outputs(lambda m: jnp.argmax(logits_fn(m, txs), -1)) == np.asarray(test_ys)).mean(1)
    return {"losses": np.asarray(losses, np.float32), "correct": np.argmax(logits, -1) == labels[None],
            "conf": conf, "test_accuracy": np.asarray(acc, np.float64)}


def ensemble_for(fitted, m: int = DEFAULT_MODELS, *, private: bool = False, epsilon: float = DP_EPSILON,
                 delta: float = DP_DELTA, clip_norm: float = DP_CLIP_NORM, seed: int = 0,
                 masks: np.ndarray | None = None,
                 progress: Callable[[int, int], None] | None = None) -> EnsembleOutputs:
    """The experiment's subset ensemble: M models on random halves of its training set (`paired_halves`, or `masks`),
    each from the experiment's initialization, and what every model says about every training example.

    - `private=False`: the experiment's recipe (`Fitted.recipe`: optimizer, rate, steps, batch, λ), all M in one
      vmapped scan (`ensemble.by_recipe`; model m draws its minibatches as `train(…, seed=seed + 1 + m)`).
    - `private=True`: DP-SGD (`gradlab.train.train_dp_sgd`, Abadi et al. 2016) with the DP clipping page's recipe at
      (`epsilon`, `delta`) and clipping norm C (`dp_settings`: σ calibrated for a run on one half), model after model
      (`ensemble.one_by_one`).

    **Arguments** `fitted`: a `gradlab.experiment.Fitted` classifier whose model gradlab can train (`Fitted.trainable`);
    `m` ≥ 2; `seed`; `masks (M, N)` bool with rows of one size in place of `paired_halves(N, m, seed=seed)`;
    `progress(done, total)` after each DP-SGD model (the vmapped recipe reports once, at the end).

    **Returns** `EnsembleOutputs` (`(M, N)` losses, correctness and φ; the masks; per-model test accuracy).

    **Raises** `ValueError` for a regression task, a model gradlab cannot train again, M < 2, masks of the wrong shape
    or of rows of different sizes, or a recipe the vmapped trainer does not follow (an epoch order, a moving average,
    label smoothing: use `masks` with a `one_by_one` ensemble and `outputs_of` instead).
    """
    data = fitted.data
    if data.task != "classification":
        raise ValueError("memorization and LiRA need a classifier (a label to get right); this task is regression")
    if not fitted.trainable:
        raise ValueError("this served model has no init_fn, so gradlab cannot train it on subsets")
    n = len(data.y_train)
    masks = paired_halves(n, m, seed=seed) if masks is None else np.asarray(masks, bool)
    if masks.ndim != 2 or masks.shape[1] != n or len(masks) < 2:
        raise ValueError(f"masks must be (M ≥ 2, {n}) bool, got shape {masks.shape}")
    exp = fitted.experiment
    init = experiment.init_model(exp, data) if exp.source.brings_model else fitted.run.checkpoints[0]
    xs, ys = np.asarray(data.x_train), np.asarray(data.y_train)
    start = time.process_time()
    if private:
        h = int(masks.sum(1).max())
        dp = dp_settings(fitted, h, epsilon=epsilon, delta=delta, clip_norm=clip_norm)

        def train_fn(x, y, s):
            return train_dp_sgd(init, fitted.loss_fn, x, y, seed=s, checkpoint_every=dp["steps"], **dp).final

        trainer = ensemble.one_by_one(train_fn, xs, ys, [seed * 1000 + 1 + i for i in range(len(masks))],
                                      progress=progress)
        eps = privacy.dp_sgd_epsilon(sample_rate=dp["sample_rate"], noise_multiplier=dp["noise_multiplier"],
                                     steps=dp["steps"], delta=delta)
        meta = dict(private=True, epsilon=eps, delta=float(delta), noise_multiplier=dp["noise_multiplier"],
                    clip_norm=float(clip_norm))
    else:
        r = fitted.recipe
        odd = {k: r[k] for k, plain in (("order", "random"), ("ema", 0.0), ("label_smoothing", 0.0))
               if r.get(k, plain) != plain}
        if odd:
            raise ValueError(f"the vmapped ensemble follows the plain recipe only; this one sets {odd}")
        trainer = ensemble.by_recipe(init, fitted.loss_fn, xs, ys, optimizer=r["optimizer"], lr=r["lr"],
                                     steps=r["steps"], batch_size=r["batch_size"], l2=r["l2"], seed=seed + 1)
        meta = dict(private=False)
    models = ensemble.subset_ensemble(trainer, n, len(masks), masks=masks)
    out = outputs_of(models, fitted.loss_fn, _forward(fitted), xs, ys, data.x_test, data.y_test)
    if not private and progress is not None:
        progress(len(masks), len(masks))
    return EnsembleOutputs(masks=masks, seed=int(seed), cpu_seconds=time.process_time() - start, **out, **meta)


def memorization(correct: Bool[np.ndarray, "M N"], masks: Bool[np.ndarray, "M N"]) -> Memorization:
    """Each example's memorization estimated from M models (Feldman & Zhang 2020, eq. 2):
    mem(i) = P̂[correct on i | i ∈ S] − P̂[correct on i | i ∉ S], the fractions of the IN models (`masks[:, i]`) and
    of the OUT models that classify example i as labelled, with the standard error of a difference of two independent
    binomial proportions, √(p_in(1 − p_in)/n_in + p_out(1 − p_out)/n_out) (0 when both fractions are 0 or 1).

    **Arguments** `correct (M, N)` bool (`EnsembleOutputs.correct`); `masks (M, N)` bool.

    **Returns** a `Memorization` of `(N,)` arrays.

    **Raises** `ValueError` if the shapes differ or an example is IN every model or OUT of every model.
    """
    correct, masks = np.asarray(correct, bool), np.asarray(masks, bool)
    if correct.shape != masks.shape or correct.ndim != 2:
        raise ValueError(f"correct and masks must both be (M, N), got {correct.shape} and {masks.shape}")
    n_in, n_out = masks.sum(0), (~masks).sum(0)
    if np.any(n_in == 0) or np.any(n_out == 0):
        raise ValueError(f"{int(np.sum((n_in == 0) | (n_out == 0)))} examples are IN every model or OUT of every model: "
                         "train more models")
    p_in = (correct & masks).sum(0) / n_in
    p_out = (correct & ~masks).sum(0) / n_out
    se = np.sqrt(p_in * (1 - p_in) / n_in + p_out * (1 - p_out) / n_out)
    return Memorization(p_in - p_out, se, p_in, p_out, n_in, n_out)
