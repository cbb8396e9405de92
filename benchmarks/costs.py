"""Calibrate gradlab/costs.py: each heavy computation's CPU-seconds, measured beside its estimate.

    python -m benchmarks.costs            # prints one row per computation and setting: measured, estimated, ratio
    python -m benchmarks.costs --only norms   # the Gradient norms page's training and summary (digits MLP, SimpleCNN)

CPU-seconds are this process's CPU time (`time.process_time`, all of XLA's threads), so a busy machine
changes wall time more than these numbers. Estimates aim at the right order (ratio within about 0.5–2).
"""

from __future__ import annotations

import argparse
import time

from gradlab import audit, costs, engine, membership, summary
from gradlab.experiment import Experiment, count_params, fit, forward_macs, init_model, load_data
from gradlab.influence import fitted as ifit


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def norms_rows() -> list:
    """The Gradient norms page from a cold process: training (compiling included) and the summary at the sizes the
    page takes, for the digits MLP and seed 003's SimpleCNN on Fashion-MNIST."""
    rows = []
    for exp in (Experiment(), Experiment.for_model("simple_cnn").replace(dataset="fashion")):
        d = load_data(exp)
        p, m, n = count_params(exp, d), forward_macs(exp, d), len(d.y_train)
        out = {}
        measured = cpu_seconds(lambda: out.setdefault("f", fit(exp, d)))
        train = costs.training_seconds(p, exp.steps, exp.batch_size, m)
        rows.append((f"training {exp.model} {exp.steps}×{exp.batch_size} (cold)", measured, train))
        for size in sorted({summary.summary_size(n, p, m, train), min(n, 1000), n}):
            measured = cpu_seconds(lambda: summary.norm_summary(out["f"], size=size))
            rows.append((f"norm summary {exp.model}, {size:,} of {n:,}", measured, costs.summary_seconds(p, size, m)))
    return rows


def main(argv=None) -> None:
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--only", choices=["norms"], help="only the Gradient norms page's computations")
    if a.parse_args(argv).only == "norms":
        return table(norms_rows())
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
    measured = cpu_seconds(lambda: ifit.lds_table(ifit.context(f, {"l2": exp.l2, "damping": 0.01}, base=base), m=50,
                                                  n_test=32, names=[n for n, m in ifit.METHODS.items() if not m.on_demand]))
    rows.append(("LDS M=50, 32 test points", measured,
                 costs.lds_seconds(P, models=50, steps=exp.steps, batch_size=exp.batch_size, n_test=32, n=N)))
    table(rows + norms_rows())


def table(rows) -> None:
    print("| computation | measured CPU-s | estimated CPU-s | estimate / measured |\n|---|---:|---:|---:|")
    for name, measured, estimate in rows:
        print(f"| {name} | {measured:.1f} | {estimate:.1f} | {estimate / measured:.2f} |")


if __name__ == "__main__":
    main()
