"""Measure the privacy audit's goals: sound on correct DP-SGD, tight enough, catches every planted bug,
and membership inference falls from the non-private to the DP-SGD model.

    python -m benchmarks.audit                 # everything (a few minutes on a 2-core CPU)
    python -m benchmarks.audit --only tight    # one part: sound | tight | bugs | coverage | peer | membership

All audits are `gradlab.audit.audit_dp_sgd` (gradient canary, full batch unless said), run through the real
`gradlab.train.train_dp_sgd`; ε claimed is dp-accounting's PLD ε at δ = 1e-5. Times are wall-clock on
whatever machine runs this (ours was shared: compare them only within one run). Every audit reports three
95% lower bounds: CP (Clopper–Pearson, one threshold), GDP (Gaussian-DP fit of μ, Nasr et al. 2023) and f-DP (one
run, Mahloujifar et al. 2024); `peer` compares the last two with jax_privacy.auditing (pip install jax-privacy).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from gradlab import audit, losses, membership, privacy
from gradlab.experiment import Experiment, init_model, load_data


def timed(**kw):
    t = time.perf_counter()
    r = audit.audit_dp_sgd(**kw)
    return r, time.perf_counter() - t


def bounds(r):
    """Each estimator's bound and its share of the claimed ε, as table cells."""
    return "  ".join(f"{e:6.3f} {e / r.epsilon_claimed:4.0%}" for e in r.estimates.values())


HEAD = "  ".join(f"{n.split(' ')[0]:>11}" for n in audit.ESTIMATORS)  # CP, GDP, f-DP: ε and ε/claimed


def sound(trials=65_536):
    print(f"\n## Sound: correct DP-SGD, full batch, {trials:,} trials each")
    print(f"σ  T  ε claimed  {HEAD}  seconds")
    worst = dict.fromkeys(audit.ESTIMATORS, 0.0)
    for sigma in (1.0, 2.0):
        for steps in (1, 2, 3, 4):
            r, s = timed(noise_multiplier=sigma, steps=steps, trials=trials, seed=steps)
            worst = {n: max(w, r.estimates[n] / r.epsilon_claimed) for n, w in worst.items()}
            print(f"{sigma:.0f}  {steps}  {r.epsilon_claimed:9.3f}  {bounds(r)}  {s:7.1f}")
    print("largest lower/claimed: " + ", ".join(f"{n} {w:.0%}" for n, w in worst.items()) + " (sound iff ≤ 100%)")
    r, s = timed(noise_multiplier=1.0, steps=4, sample_rate=0.5, trials=trials, seed=9)
    print(f"q = 0.5 (not Gaussian: GDP and f-DP are estimates), σ = 1, T = 4: claimed {r.epsilon_claimed:.3f}, {bounds(r)}")


def tight(trials=(16_384, 65_536, 131_072, 262_144), seeds=(0, 1, 2)):
    print("\n## Tight: σ = 2, one step, full batch (claimed ε ≈ 1.99; μ = 0.5)")
    print(f"trials   seed  {HEAD}  μ lower  seconds")
    for n in trials:
        for seed in seeds:
            r, s = timed(noise_multiplier=2.0, steps=1, trials=n, seed=seed)
            print(f"{n:7,}  {seed:4}  {bounds(r)}  {r.mu_lower:7.3f}  {s:7.1f}")
    r, s = timed(noise_multiplier=2.0, steps=1, trials=65_536, canary="input")
    print(f"input canary, 65,536 trials: {bounds(r)}, {s:.1f} s")


def bugs():
    print("\n## Catches bugs: σ = 1, one step, full batch (claimed ε ≈ 4.38)")
    print(f"bug                                      C     trials  {HEAD}  caught by  seconds")
    for name in audit.BUGS:
        for c, n in ((1.0, 16_384), (10.0, 16_384), (1.0, 131_072)):
            if n > 16_384 and name != "sum clipped per microbatch":
                continue
            r, s = timed(noise_multiplier=1.0, steps=1, clip_norm=c, bug=name, trials=n)
            print(f"{name:40} {c:4.0f}  {n:8,}  {bounds(r)}  {', '.join(r.caught) or '-':9}  {s:7.1f}")


def coverage(seeds=1000, n=16_384, mu=0.5, delta=1e-5):
    """How often each estimator's 95% bound exceeds the true ε on exactly μ-GDP scores (should be ≤ 5%)."""
    true = audit.gdp_epsilon(mu, delta)
    print(f"\n## Coverage: {seeds} seeds of {n:,} scores, N(−1, 2²) out vs N(0, 2²) in (μ = {mu}, true ε = {true:.3f})")
    print("estimator         above true ε  median ε/true  5th–95th percentile  seconds")
    for name, e in audit.ESTIMATORS.items():
        t = time.perf_counter()
        vals = []
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            is_in = rng.random(n) < 0.5
            vals.append(e.bound(2.0 * rng.standard_normal(n) - 1.0 + is_in, is_in, delta=delta, confidence=0.95))
        v = np.array(vals) / true
        print(f"{name:16}  {np.mean(v > 1):12.1%}  {np.median(v):13.0%}  {np.percentile(v, 5):8.0%}–{np.percentile(v, 95):.0%}"
              f"  {time.perf_counter() - t:7.1f}")


def peer(seeds=(0, 1, 2)):
    """gradlab's GDP and f-DP bounds against jax_privacy.auditing's on the same audit scores."""
    from jax_privacy import auditing  # benchmark-only peer: requirements-bench.txt

    print("\n## Peer: jax_privacy.auditing on the same canary scores (σ = 2, one step, full batch)")
    print("trials   seed  GDP gradlab  GDP jax-privacy  f-DP gradlab  f-DP jax-privacy  |Δ f-DP|")
    for n in (4096, 16_384, 131_072):
        for seed in seeds:
            r = audit.audit_dp_sgd(noise_multiplier=2.0, steps=1, trials=n, seed=seed)
            a = auditing.CanaryScoreAuditor(r.scores[r.is_in], r.scores[~r.is_in])
            g, f = a.epsilon_from_gdp(0.05, r.delta), a.epsilon_one_run_fdp(0.05, r.delta)
            ours_g, ours_f = r.estimates["Gaussian DP"], r.estimates["f-DP (one run)"]
            flag = "  (jax-privacy above the claimed ε)" if g > r.epsilon_claimed else ""
            print(f"{n:7,}  {seed:4}  {ours_g:11.4f}  {g:15.4f}  {ours_f:12.4f}  {f:16.4f}  {abs(ours_f - f):8.1e}{flag}")


def membership_goal(eps_targets=(8.0, 4.0, 2.0), pool=256, steps=200, q=0.5, shadows=4):
    exp = Experiment()
    data = load_data(exp)
    print(f"\n## Membership inference: the page's defaults (digits, MLP 64, pool {pool}, T = {steps}, q = {q}, "
          f"Adam 0.01, C = 1, {shadows} shadows)")
    print("model        ε       LiRA AUC  TPR@1%   TPR@0.1%  loss AUC  train acc  test acc  seconds")
    first = True
    for eps in eps_targets:
        sigma = privacy.noise_multiplier_for_epsilon(target_epsilon=eps, sample_rate=q, steps=steps, delta=1e-5)
        t = time.perf_counter()
        res = membership.private_vs_nonprivate(init_model(exp, data), losses.loss_for(data.task), data.x_train[:pool],
                                               data.y_train[:pool], sample_rate=q, noise_multiplier=sigma, clip_norm=1.0,
                                               steps=steps, n_shadows=shadows)
        s = time.perf_counter() - t
        for name, r in res.items():
            if name == "non-private" and not first:
                continue
            e = math.inf if name == "non-private" else eps
            lira, loss = r.rocs["lira"], r.rocs["loss"]
            print(f"{name:11}  {e:5.1f}  {lira.auc:9.3f}  {lira.tpr_at_1:6.1%}  {lira.tpr_at_01:8.1%}  {loss.auc:8.3f}  "
                  f"{r.train_accuracy:9.1%}  {r.test_accuracy:8.1%}  {s:7.1f}")
        first = False


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["sound", "tight", "bugs", "coverage", "peer", "membership"])
    args = parser.parse_args()
    parts = dict(sound=sound, tight=tight, bugs=bugs, coverage=coverage, peer=peer, membership=membership_goal)
    for name, fn in parts.items():
        if args.only in (None, name):
            fn()
