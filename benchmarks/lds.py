"""The linear datamodeling score (LDS) of every attribution method, on the app's own experiments.

    python benchmarks/lds.py                 # digits MLP (the app's default) and breast-cancer logistic regression
    python benchmarks/lds.py --m 100 --t 64  # more subset models / test points
    python benchmarks/lds.py --only mlp

For each experiment: M models trained on random half-subsets with the experiment's own recipe (one vmapped,
jitted scan), each test point's output −ℓ (ranked like the margin), and per method the mean over test points
of the Spearman correlation between predicted Σ_{i∈S} τ_i and actual outputs (Park et al. 2023, eq. 4). All
methods on the same subsets. The influence function uses θ̂ converged from the trained model (λ, damping δ as
on the page); TRAK an ensemble of 5 models with k = 512.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=50, help="subset models M")
    ap.add_argument("--t", type=int, default=32, help="test points")
    ap.add_argument("--only", choices=["mlp", "logreg"], default=None)
    args = ap.parse_args()

    from gradlab import influence as inf
    from gradlab.experiment import Experiment, fit
    from gradlab.influence import fitted as ifit

    cases = {
        "mlp": ("digits MLP (default Experiment)", Experiment(), 1e-2, 1e-2),
        "logreg": ("breast-cancer L2 logistic regression", Experiment(dataset="breast_cancer", model="linear"), 1e-2, 0.0),
    }
    print(f"# LDS, M = {args.m} half-subset models, {args.t} test points (shared 2-core machine)")
    print("| experiment | " + " | ".join(inf.METHODS[m] for m in inf.METHODS) + " | seconds |")
    print("|---|" + "---|" * (len(inf.METHODS) + 1))
    for key, (label, exp, l2, damping) in cases.items():
        if args.only and key != args.only:
            continue
        t0 = time.time()
        f = fit(exp)
        base = ifit.optimum(f, l2, max_iter=500)
        tracin = inf.tracin_checkpoints(ifit.tracin_run(f)[0])
        trak = ifit.trak_models(f, ifit.TRAK_MODELS)
        table = ifit.lds_table(f, base, m=args.m, n_test=args.t, damping=damping, tracin=tracin, trak=trak,
                               progress=lambda frac, what: print(f"  [{time.time() - t0:6.1f}s] {what}", file=sys.stderr))
        cells = [f"{table.results[m].mean:.3f}" if m in table.results else "—" for m in inf.METHODS]
        print(f"| {label} (λ = {l2:g}, δ = {damping:g}, ‖∇F(θ̂)‖ = {base.grad_norm:.1e}) | " + " | ".join(cells)
              + f" | {time.time() - t0:.0f} |", flush=True)
        for m, err in table.errors.items():
            print(f"  {m}: {err}")


if __name__ == "__main__":
    main()
