"""Measure the privacy audit's goals: sound on correct DP-SGD, tight enough, catches every planted bug,
and membership inference falls from the non-private to the DP-SGD model.

    python -m benchmarks.audit                 # everything (a few minutes on a 2-core CPU)
    python -m benchmarks.audit --only tight    # one part: sound | tight | bugs | membership

All audits are `gradlab.audit.audit_dp_sgd` (gradient canary, full batch unless said), run through the real
`gradlab.train.train_dp_sgd`; ε claimed is dp-accounting's PLD ε at δ = 1e-5. Times are wall-clock on
whatever machine runs this (ours was shared: compare them only within one run).
"""

from __future__ import annotations

import argparse
import math
import time

from gradlab import audit, losses, membership, privacy
from gradlab.experiment import Experiment, init_model, load_data


def timed(**kw):
    t = time.perf_counter()
    r = audit.audit_dp_sgd(**kw)
    return r, time.perf_counter() - t


def sound(trials=65_536):
    print(f"\n## Sound: correct DP-SGD, full batch, {trials:,} trials each")
    print("σ  T  ε claimed  ε lower  lower/claimed  seconds")
    worst = 0.0
    for sigma in (1.0, 2.0):
        for steps in (1, 2, 3, 4):
            r, s = timed(noise_multiplier=sigma, steps=steps, trials=trials, seed=steps)
            worst = max(worst, r.epsilon_lower / r.epsilon_claimed)
            print(f"{sigma:.0f}  {steps}  {r.epsilon_claimed:9.3f}  {r.epsilon_lower:7.3f}  {r.epsilon_lower / r.epsilon_claimed:13.0%}  {s:7.1f}")
    print(f"largest lower/claimed: {worst:.0%} (sound iff ≤ 100%)")


def tight(trials=(65_536, 131_072, 262_144, 524_288), seeds=(0, 1, 2)):
    print("\n## Tight: σ = 2, one step, full batch (claimed ε ≈ 2.0)")
    print("trials   seed  ε lower  lower/claimed  seconds")
    for n in trials:
        for seed in seeds:
            r, s = timed(noise_multiplier=2.0, steps=1, trials=n, seed=seed)
            print(f"{n:7,}  {seed:4}  {r.epsilon_lower:7.3f}  {r.epsilon_lower / r.epsilon_claimed:13.0%}  {s:7.1f}")
    r, s = timed(noise_multiplier=2.0, steps=1, trials=65_536, canary="input")
    print(f"input canary, 65,536 trials: ε lower {r.epsilon_lower:.3f} ({r.epsilon_lower / r.epsilon_claimed:.0%}), {s:.1f} s")


def bugs():
    print("\n## Catches bugs: σ = 1, one step, full batch (claimed ε ≈ 4.38)")
    print("bug                                      C     trials  ε lower  caught  seconds")
    for name in audit.BUGS:
        for c, n in ((1.0, 16_384), (10.0, 16_384), (1.0, 131_072)):
            if n > 16_384 and name != "sum clipped per microbatch":
                continue
            r, s = timed(noise_multiplier=1.0, steps=1, clip_norm=c, bug=name, trials=n)
            print(f"{name:40} {c:4.0f}  {n:8,}  {r.epsilon_lower:7.3f}  {str(r.epsilon_lower > r.epsilon_claimed):6}  {s:7.1f}")


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
    parser.add_argument("--only", choices=["sound", "tight", "bugs", "membership"])
    args = parser.parse_args()
    parts = dict(sound=sound, tight=tight, bugs=bugs, membership=membership_goal)
    for name, fn in parts.items():
        if args.only in (None, name):
            fn()
