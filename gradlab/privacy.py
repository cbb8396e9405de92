"""DP-SGD's three ingredients: per-example clipping, Gaussian noise, and privacy accounting.

One step of DP-SGD (Abadi et al. 2016, "Deep Learning with Differential Privacy", Algorithm 1):
draw a batch by **Poisson sampling** (each of the N examples joins independently with probability
q, the *sampling rate*), clip every per-example gradient to L2 norm at most **C** (the *clipping
norm*), sum, add Gaussian noise N(0, σ²C² I) (σ is the *noise multiplier*) and divide by the
expected batch size qN.

- Clipping uses optax's helpers (`optax.per_example_global_norm_clip`, flat; and
  `optax.per_example_layer_norm_clip`, per layer with C/√L per leaf, McMahan et al. 2017).
- The privacy guarantee (ε, δ) of T such steps comes from Google's `dp-accounting`: the Rényi-DP
  accountant (Mironov 2017; Mironov, Talwar, Zhang 2019 for the sampled Gaussian) or the privacy
  loss distribution accountant (Koskela et al. 2020; Doroshenko et al. 2022), composed over the
  event `SelfComposed(PoissonSampled(q, Gaussian(σ)), T)`. Nothing here is a hand-rolled formula.
  The accountants assume Poisson sampling: that is why `gradlab.train.train_dp_sgd` samples that way.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float

from gradlab import engine

PyTree = Any
Accountant = Literal["rdp", "pld"]

#: human-readable names of the accountants, for pages and reports.
ACCOUNTANTS = {
    "rdp": "Rényi DP (dp-accounting RdpAccountant)",
    "pld": "Privacy loss distribution (dp-accounting PLDAccountant)",
}


# ---------------------------------------------------------------- checks


def check_clip_norm(clip_norm: float) -> float:
    """C as a float. **Raises** `ValueError` unless C > 0 (C = inf means "no clipping")."""
    c = float(clip_norm)
    if not c > 0:  # also catches NaN
        raise ValueError(
            f"the clipping norm C must be > 0, got {clip_norm:g}: C bounds each example's gradient norm, "
            "so C ≤ 0 would erase every gradient"
        )
    return c


def check_noise_multiplier(noise_multiplier: float) -> float:
    """σ as a float. **Raises** `ValueError` unless σ ≥ 0 and finite."""
    s = float(noise_multiplier)
    if not (s >= 0 and math.isfinite(s)):
        raise ValueError(
            f"the noise multiplier σ must be a finite number ≥ 0, got {noise_multiplier:g} "
            "(σ is the noise std in units of C; σ = 0 means no privacy)"
        )
    return s


def check_sample_rate(sample_rate: float) -> float:
    """q as a float. **Raises** `ValueError` unless 0 < q ≤ 1."""
    q = float(sample_rate)
    if not 0 < q <= 1:
        raise ValueError(
            f"the sampling rate q must be in (0, 1], got {sample_rate:g}: it is the probability that "
            "each example joins a batch"
        )
    return q


def check_delta(delta: float) -> float:
    """δ as a float. **Raises** `ValueError` unless 0 < δ < 1."""
    d = float(delta)
    if not 0 < d < 1:
        raise ValueError(
            f"δ must be in (0, 1), got {delta:g}; the usual choice is well below 1/N "
            "(e.g. 1e-5), the probability that the ε guarantee fails"
        )
    return d


def check_steps(steps: int) -> int:
    """T as an int. **Raises** `ValueError` unless T ≥ 0 is an integer."""
    if int(steps) != steps or steps < 0:
        raise ValueError(f"the number of steps must be an integer ≥ 0, got {steps}")
    return int(steps)


def check_batch_size(batch_size: float) -> float:
    """B as a float. **Raises** `ValueError` unless B > 0 (an expected batch size may be fractional)."""
    b = float(batch_size)
    if not (b > 0 and math.isfinite(b)):
        raise ValueError(f"the batch size must be > 0, got {batch_size:g}")
    return b


def check_accountant(accountant: str) -> str:
    """The accountant's name. **Raises** `ValueError` unless it is a key of `ACCOUNTANTS`."""
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {accountant!r}; choose one of {', '.join(ACCOUNTANTS)}")
    return accountant


# ---------------------------------------------------------------- clipping and noise


def clip_and_sum(per_example: PyTree, clip_norm: float | Array) -> tuple[PyTree, Array]:
    """Σᵢ gᵢ·min(1, C/‖gᵢ‖₂): clip each per-example gradient to global L2 norm C, then sum.

    Uses `optax.per_example_global_norm_clip` (the DP-SGD aggregate before noise, Abadi et al.
    2016, Algorithm 1). Zero rows (padding) contribute nothing and count as unclipped; `C = inf`
    returns the plain sum.

    **Arguments**
    - `per_example`: pytree whose leaves have shape `(B, *leaf.shape)` (e.g. from
      `gradlab.engine.per_example_grads` or `jax.vmap(jax.grad(loss))`).
    - `clip_norm`: C > 0 (a float or a traced scalar).

    **Returns** `(clipped sum, a pytree like one example's gradient; number clipped, int scalar)`.

    **Raises** `ValueError` if leaves disagree on B (from optax).
    """
    leaves, treedef = jax.tree.flatten(per_example)
    summed, n_clipped = optax.per_example_global_norm_clip(leaves, clip_norm)
    return jax.tree.unflatten(treedef, summed), n_clipped


def clip_and_sum_per_layer(per_example: PyTree, clip_norm: float | Array) -> tuple[PyTree, list[Array]]:
    """Per-layer clipping: each of the L leaves of gᵢ is clipped to C/√L, then summed over examples.

    The clipped gradient's global norm is still at most C, so the same noise σC gives the same
    guarantee (McMahan et al. 2017, "Learning differentially private recurrent language models").
    Uses `optax.per_example_layer_norm_clip(…, uniform=True)`.

    **Arguments** as `clip_and_sum`.

    **Returns** `(clipped sum pytree, list of per-leaf counts of clipped examples)`.
    """
    leaves, treedef = jax.tree.flatten(per_example)
    summed, n_clipped = optax.per_example_layer_norm_clip(leaves, clip_norm, uniform=True)
    return jax.tree.unflatten(treedef, summed), n_clipped


def gaussian_noise(key: Array, like: PyTree, clip_norm: float | Array, noise_multiplier: float | Array) -> PyTree:
    """Noise N(0, (σC)² I) shaped like `like`: what DP-SGD adds to the clipped gradient sum.

    With σ = 0 the noise is exactly zero, also when C = inf (0·inf is taken as 0).

    **Arguments** `key`: a JAX PRNG key; `like`: a pytree of arrays; `clip_norm` C; `noise_multiplier` σ.

    **Returns** a pytree like `like` (same shapes and dtypes).
    """
    std = jnp.where(jnp.asarray(noise_multiplier) > 0, jnp.asarray(noise_multiplier) * clip_norm, 0.0)
    leaves, treedef = jax.tree.flatten(like)
    keys = jax.random.split(key, len(leaves))
    noise = [std.astype(a.dtype) * jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, leaves)]
    return jax.tree.unflatten(treedef, noise)


#: A privatizer: `privatize(loss_fn, params, xs, ys, key, *, clip_norm, noise_multiplier, weights,
#: batch_size) -> (noisy sum, losses (B,), norms (B,))`, the one part of a DP-SGD step that sees
#: individual examples. `noisy_clipped_sum` is the correct one; `gradlab.audit.BUGS` holds wrong ones.
Privatize = Callable[..., tuple[PyTree, Array, Array]]


def noisy_clipped_sum(
    loss_fn: Callable,
    params: PyTree,
    xs: Any,
    ys: Any,
    key: Array,
    *,
    clip_norm: float | Array,
    noise_multiplier: float | Array,
    weights: Float[Array, "B"] | None = None,
    batch_size: float | Array | None = None,
) -> tuple[PyTree, Float[Array, "B"], Float[Array, "B"]]:
    """The privatized sum of one batch: Σᵢ wᵢ·min(1, C/‖gᵢ‖)·gᵢ + N(0, σ²C² I) (Abadi et al. 2016, Algorithm 1).

    The clipped sum is book-keeping ghost clipping (`engine.clipped_sum_core`: one pass per chunk, the
    per-layer rules' (aᵢ, δᵢ) give the norms and then Σᵢ cᵢ aᵢᵀδᵢ, no per-example gradient built); the
    noise is `gaussian_noise`.
    Traceable: called inside the jitted DP-SGD step.

    **Arguments**
    - `loss_fn(params, x, y)`, `params`, `xs (B, …)`, `ys (B, …)`: as `engine.per_example_grads`.
    - `key`: the PRNG key of the noise; `clip_norm` C > 0 (inf: no clipping); `noise_multiplier` σ ≥ 0.
    - `weights (B,)`: per-example weights wᵢ (the 0/1 mask of a padded Poisson batch); None: all 1.
    - `batch_size`: the divisor the step applies afterwards; the correct privatizer does not need it
      (it is part of the privatizer's signature for the planted bugs that misuse it).

    **Returns** `(noisy sum, a pytree like the differentiable params; losses (B,); unclipped
    gradient norms ‖gᵢ‖ (B,))`.
    """
    summed, losses, norms = engine.clipped_sum_core(loss_fn, params, xs, ys, clip_norm, weights=weights)
    noise = gaussian_noise(key, summed, clip_norm, noise_multiplier)
    return jax.tree.map(jnp.add, summed, noise), losses, norms


def dp_sgd_gradient(
    loss_fn: Callable,
    params: PyTree,
    xs: Any,
    ys: Any,
    key: Array,
    *,
    clip_norm: float | Array,
    noise_multiplier: float | Array,
    batch_size: float | Array,
    weights: Float[Array, "B"] | None = None,
    privatize: Privatize = noisy_clipped_sum,
) -> tuple[PyTree, Float[Array, "B"], Float[Array, "B"]]:
    """One DP-SGD gradient: the privatized sum of the batch divided by the (expected) batch size.

    The step every DP-SGD loop in gradlab takes (`gradlab.train.train_dp_sgd`, the Geometry page's
    trajectories, the audit's planted bugs through `privatize`); the optimizer then applies it
    (Abadi et al. 2016, Algorithm 1: g̃ = (Σᵢ clip_C(gᵢ) + N(0, σ²C² I)) / B).

    **Arguments**
    - `loss_fn`, `params`, `xs (B, …)`, `ys (B, …)`, `key`, `clip_norm` C, `noise_multiplier` σ,
      `weights (B,)`: as `noisy_clipped_sum`.
    - `batch_size`: the divisor: qN (the expected size of a Poisson batch, public) or B.
    - `privatize`: the function that turns the batch into its noisy clipped sum; `noisy_clipped_sum`
      (default) is correct DP-SGD.

    **Returns** `(gradient, a pytree like the differentiable params; losses (B,); norms (B,))`.
    """
    noisy, losses, norms = privatize(loss_fn, params, xs, ys, key, clip_norm=clip_norm,
                                     noise_multiplier=noise_multiplier, weights=weights, batch_size=batch_size)
    return jax.tree.map(lambda a: a / batch_size, noisy), losses, norms


def noise_std_of_mean(clip_norm: float, noise_multiplier: float, batch_size: float) -> float:
    """σ·C/B: the per-coordinate std of the noise on the averaged (divided by B) clipped gradient."""
    return float(noise_multiplier) * float(clip_norm) / float(batch_size)


# ---------------------------------------------------------------- accounting (dp-accounting)


@contextlib.contextmanager
def _quiet_absl():
    """Silence dp-accounting's absl warnings (e.g. RDP orders it drops when a series does not
    converge: it excludes them from the minimum, which keeps ε a valid upper bound)."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def dp_sgd_event(*, sample_rate: float, noise_multiplier: float, steps: int) -> dp_accounting.DpEvent:
    """The `dp_accounting` event of T DP-SGD steps: `SelfComposed(PoissonSampled(q, Gaussian(σ)), T)`."""
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)), steps
    )


#: PLD discretization used for fast previews (σ search, intermediate points of ε curves). Like the
#: default 1e-4 it is a pessimistic (upper-bound) discretization, ~10x faster, within ~1e-5 relative.
COARSE_PLD_INTERVAL = 1e-3


def make_accountant(accountant: Accountant = "rdp", *, coarse: bool = False) -> dp_accounting.PrivacyAccountant:
    """A fresh dp-accounting accountant: `"rdp"` → `RdpAccountant()` (its default orders), `"pld"` →
    `PLDAccountant()` (value discretization 1e-4, or `COARSE_PLD_INTERVAL` with `coarse=True`), both
    with add-or-remove-one neighbouring datasets."""
    if check_accountant(accountant) == "rdp":
        return dp_accounting.rdp.RdpAccountant()
    if coarse:
        return dp_accounting.pld.PLDAccountant(value_discretization_interval=COARSE_PLD_INTERVAL)
    return dp_accounting.pld.PLDAccountant()


def dp_sgd_epsilon(
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    delta: float,
    accountant: Accountant = "rdp",
) -> float:
    """ε of DP-SGD: T steps of the Poisson-subsampled Gaussian mechanism, at a given δ.

    Composes `SelfComposed(PoissonSampled(q, Gaussian(σ)), T)` in Google's `dp-accounting` and asks
    the accountant for ε(δ). RDP (Mironov 2017; Mironov et al. 2019) is the classic moments
    accountant; PLD (Koskela et al. 2020) is tighter (smaller ε for the same run).

    **Arguments**
    - `sample_rate`: q ∈ (0, 1], the Poisson sampling probability (expected batch size / N).
    - `noise_multiplier`: σ ≥ 0, noise std in units of the clipping norm C.
    - `steps`: T ≥ 0 training steps.
    - `delta`: δ ∈ (0, 1).
    - `accountant`: `"rdp"` or `"pld"`.

    **Returns** ε ≥ 0 as a float: 0 for T = 0, `inf` for σ = 0 (no privacy).

    **Raises** `ValueError` for q ∉ (0, 1], σ < 0, δ ∉ (0, 1), T < 0 or an unknown accountant.
    """
    q = check_sample_rate(sample_rate)
    sigma = check_noise_multiplier(noise_multiplier)
    t = check_steps(steps)
    d = check_delta(delta)
    check_accountant(accountant)
    if t == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    return _epsilon(float(q), float(sigma), int(t), float(d), accountant)


@functools.lru_cache(maxsize=256)
def _epsilon(q: float, sigma: float, t: int, d: float, accountant: str) -> float:
    """`dp_sgd_epsilon` of checked arguments, kept: the accountant is deterministic, and the same run's ε is asked for
    again and again (an audit's trials, its report, the DP pages' metrics); a PLD composition costs ~0.1–1 s."""
    acc = make_accountant(accountant)
    with _quiet_absl():
        acc.compose(dp_sgd_event(sample_rate=q, noise_multiplier=sigma, steps=t))
        return float(acc.get_epsilon(d))


def dp_sgd_epsilons(
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: Sequence[int],
    delta: float,
    accountant: Accountant = "rdp",
) -> np.ndarray:
    """ε after each number of steps in `steps` (the privacy spent so far, for an ε-vs-step curve).

    One accountant composes the steps incrementally (T₁ steps, then T₂ − T₁ more, …). With PLD the
    intermediate points use the coarser (still pessimistic) discretization `COARSE_PLD_INTERVAL`
    for speed; the last point is always the default accountant's ε, as `dp_sgd_epsilon`.

    **Arguments** as `dp_sgd_epsilon`, with `steps` a non-decreasing sequence of step counts.

    **Returns** `(len(steps),)` float64 array of ε (0 at 0 steps, inf everywhere after if σ = 0).

    **Raises** as `dp_sgd_epsilon`, or if `steps` decreases.
    """
    q = check_sample_rate(sample_rate)
    sigma = check_noise_multiplier(noise_multiplier)
    d = check_delta(delta)
    counts = [check_steps(t) for t in steps]
    if any(b < a for a, b in zip(counts, counts[1:])):
        raise ValueError("steps must be non-decreasing")
    acc = make_accountant(accountant, coarse=True)
    out, done = [], 0
    with _quiet_absl():
        for t in counts[:-1] if accountant == "pld" else counts:
            if t == 0:
                out.append(0.0)
                continue
            if sigma == 0:
                out.append(math.inf)
                continue
            if t > done:
                acc.compose(dp_sgd_event(sample_rate=q, noise_multiplier=sigma, steps=t - done))
                done = t
            out.append(float(acc.get_epsilon(d)))
    if accountant == "pld" and counts:
        out.append(dp_sgd_epsilon(sample_rate=q, noise_multiplier=sigma, steps=counts[-1], delta=d, accountant="pld"))
    return np.array(out, dtype=np.float64)


def _epsilon_coarse(q: float, sigma: float, steps: int, delta: float) -> float:
    acc = make_accountant("pld", coarse=True)
    with _quiet_absl():
        acc.compose(dp_sgd_event(sample_rate=q, noise_multiplier=sigma, steps=steps))
        return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def noise_multiplier_for_epsilon(
    *,
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: Accountant = "rdp",
    tol: float = 1e-3,
) -> float:
    """The smallest noise multiplier σ whose T steps of DP-SGD stay within (ε, δ).

    The inverse of `dp_sgd_epsilon`, found with `dp_accounting.calibrate_dp_mechanism` (Brent's
    method on ε(σ) − ε_target over σ, each ε from a fresh accountant). For PLD the search is
    bracketed by the RDP answer and runs on the coarse PLD discretization; the result is then
    checked (and raised by `tol` if needed) with the default PLD accountant.

    **Arguments** `target_epsilon` > 0; `sample_rate` q, `steps` T ≥ 1, `delta` δ and `accountant`
    as in `dp_sgd_epsilon`; `tol`: tolerance on σ.

    **Returns** σ (float) with `dp_sgd_epsilon(…, noise_multiplier=σ) ≤ target_epsilon`, within `tol`
    of the smallest such σ.

    **Raises** `ValueError` for bad q, δ, T < 1, ε ≤ 0, or when no σ in [0.05, 2³⁰] reaches ε.
    """
    q = check_sample_rate(sample_rate)
    d = check_delta(delta)
    t = check_steps(steps)
    check_accountant(accountant)
    eps = float(target_epsilon)
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"the target ε must be a finite number > 0, got {target_epsilon:g}")
    if t < 1:
        raise ValueError("calibrating σ needs at least one training step")
    lower = 0.05
    if accountant == "pld":
        # PLD is slow for small σ: bracket with the (faster, looser) RDP σ, search on a coarse PLD.
        hi = noise_multiplier_for_epsilon(target_epsilon=eps, sample_rate=q, steps=t, delta=d, accountant="rdp", tol=tol)
        if hi <= lower:
            return lower
        eps_at = lambda s: _epsilon_coarse(q, s, t, d)  # noqa: E731
        while eps_at(hi) > eps:
            hi *= 1.5
        lo = hi / 2
        while lo > lower and eps_at(lo) <= eps:
            lo /= 2
        if lo <= lower:
            return lower
        bracket = dp_accounting.ExplicitBracketInterval(lo, hi)
        fresh = lambda: make_accountant("pld", coarse=True)  # noqa: E731
    else:
        if dp_sgd_epsilon(sample_rate=q, noise_multiplier=lower, steps=t, delta=d, accountant=accountant) <= eps:
            return lower  # even very little noise meets this (loose) budget
        bracket = dp_accounting.LowerEndpointAndGuess(lower, 1.0)
        fresh = lambda: make_accountant(accountant)  # noqa: E731
    try:
        with _quiet_absl():
            sigma = dp_accounting.calibrate_dp_mechanism(
                fresh,
                lambda s: dp_sgd_event(sample_rate=q, noise_multiplier=s, steps=t),
                eps,
                d,
                bracket,
                tol=tol,
            )
    except dp_accounting.mechanism_calibration.NoBracketIntervalFoundError as err:
        raise ValueError(f"no noise multiplier reaches ε = {eps:g} at δ = {d:g}: {err}") from None
    # Brent's root lies within tol of the exact σ; step up until the default accountant confirms it.
    while dp_sgd_epsilon(sample_rate=q, noise_multiplier=sigma, steps=t, delta=d, accountant=accountant) > eps:
        sigma += tol
    return float(sigma)


# ---------------------------------------------------------------- evaluation of checkpoints


def accuracy_by_class(model, xs: Float[Array, "N D"], ys, n_classes: int,
                      predict_fn: Callable | None = None) -> tuple[float, np.ndarray]:
    """Test accuracy of a classifier and its accuracy on each class.

    **Arguments** `model`: `model(x) -> logits (K,)`, or params with `predict_fn(params, x) -> logits (K,)` (a
    served model, `gradlab.own`); `xs (N, D)`; `ys (N,)` int labels; `n_classes` K.

    **Returns** `(accuracy in [0, 1], (K,) per-class accuracy; NaN for a class absent from ys)`.
    """
    forward = model if predict_fn is None else (lambda x: predict_fn(model, x))
    pred = np.asarray(jnp.argmax(jax.vmap(forward)(jnp.asarray(xs)), axis=-1))
    ys = np.asarray(ys)
    correct = pred == ys
    per = np.array([correct[ys == k].mean() if np.any(ys == k) else np.nan for k in range(n_classes)])
    return float(correct.mean()), per
