"""Calibrate gradlab/costs.py: each heavy computation's CPU-seconds, measured beside its estimate.

    python -m benchmarks.costs            # prints one row per computation and setting: measured, estimated, ratio

CPU-seconds are this process's CPU time (`time.process_time`, all of XLA's threads), so a busy machine
changes wall time more than these numbers. Estimates aim at the right order (ratio within about 0.5–2).
"""

from __future__ import annotations

import time

from gradlab import audit, costs, engine, membership
from gradlab.experiment import Experiment, fit, init_model
from gradlab.influence import fitted as ifit


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    exp = Experiment()
    f = fit(exp)
    d, P, N = f.data, engine.num_params(f.model), len(f.data.y_train)
    print(f"default experiment: digits MLP, P = {P:,}, N = {N:,}\n")
    rows = []
    for pool, steps, shadows in [(256, 200, 4), (1437, 600, 8)]:
        measured = cpu_seconds(lambda: membership.private_vs_nonprivate(
            init_model(exp, d), f.loss_fn, d.x_train[:pool], d.y_train[:pool], sample_rate=0.5, noise_multiplier=1.0,
            clip_norm=1.0, steps=steps, n_shadows=shadows))
        rows.append((f"membership attack pool={pool} T={steps} shadows={shadows}", measured,
                     costs.attack_seconds(P, pool=pool, sample_rate=0.5, steps=steps, shadows=shadows)))
    for trials, steps, canary in [(16384, 1, "gradient"), (262144, 16, "gradient"), (16384, 4, "input")]:
        measured = cpu_seconds(lambda: audit.audit_dp_sgd(noise_multiplier=2.0, steps=steps, sample_rate=1.0,
                                                           clip_norm=1.0, trials=trials, canary=canary))
        rows.append((f"audit {canary} trials={trials} T={steps}", measured,
                     costs.audit_seconds(trials=trials, steps=steps, canary=canary)))
    base = ifit.optimum(f, exp.l2, max_iter=500)
    measured = cpu_seconds(lambda: ifit.retraining_check(f, base, 0, damping=0.01, k=8, max_iter=300))
    rows.append(("retraining check k=8", measured, costs.retraining_seconds(P, N, k=8)))
    measured = cpu_seconds(lambda: ifit.lds_table(f, base, m=50, n_test=32, damping=0.01))
    rows.append(("LDS M=50, 32 test points", measured,
                 costs.lds_seconds(P, models=50, steps=exp.steps, batch_size=exp.batch_size, n_test=32, n=N)))
    print("| computation | measured CPU-s | estimated CPU-s | estimate / measured |\n|---|---:|---:|---:|")
    for name, measured, estimate in rows:
        print(f"| {name} | {measured:.1f} | {estimate:.1f} | {estimate / measured:.2f} |")


if __name__ == "__main__":
    main()
