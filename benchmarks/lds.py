"""The linear datamodeling score (LDS) of every attribution method, on the app's own experiments.

    python -m benchmarks.lds                 # digits MLP (the app's default) and breast-cancer logistic regression
    python -m benchmarks.lds --m 100 --t 64  # more subset models / test points
    python -m benchmarks.lds --only mlp

For each experiment: M models trained on random half-subsets with the experiment's own recipe (one vmapped,
jitted scan), each test point's output −ℓ (ranked like the margin), and per method the mean over test points
of the Spearman correlation between predicted Σ_{i∈S} τ_i and actual outputs (Park et al. 2023, eq. 4), ± its
standard error over test points. All methods on the same subsets. The influence function uses θ̂ converged from
the trained model (λ, damping δ as on the page). TRAK, as on the page: an ensemble of 5 models, each converged to
its own θ̂ of the same objective (seeds 0–4), the softmax Gauss–Newton kernel with the objective's λ, k = P (no
projection; the kernel solved matrix-free by conjugate gradient). Two more TRAK columns on the same 5 models: a
Gaussian projection to k = 1024, and Park et al.'s Algorithm 1 (margin gradients, ΦᵀΦ, Q = 1 − p; k = 512, no
damping). "TRAK − IF" is the paired difference of per-test-point LDS (the page's TRAK) ± its standard error.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np



def cell(per_test, signed: bool = False) -> str:
    """Mean ± standard error over the test points with a defined correlation."""
    v = per_test[np.isfinite(per_test)]
    se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
    return f"{v.mean():{'+' if signed else ''}.3f} ± {se:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=50, help="subset models M")
    ap.add_argument("--t", type=int, default=32, help="test points")
    ap.add_argument("--only", choices=["mlp", "logreg"], default=None)
    args = ap.parse_args()

    from gradlab import engine
    from gradlab import influence as inf
    from gradlab.experiment import Experiment, fit
    from gradlab.influence import fitted as ifit

    cases = {
        "mlp": ("digits MLP (default Experiment)", Experiment(), 1e-2, 1e-2),
        "logreg": ("breast-cancer L2 logistic regression", Experiment(dataset="breast_cancer", model="linear"), 1e-2, 0.0),
    }
    print(f"# LDS, M = {args.m} half-subset models, {args.t} test points (2-core machine)")
    print("| experiment | " + " | ".join(m.label for m in inf.METHODS.values())
          + " | TRAK (k = 1024) | TRAK (Algorithm 1, k = 512) | TRAK − IF | seconds |")
    print("|---|" + "---|" * (len(inf.METHODS) + 4))
    for key, (label, exp, l2, damping) in cases.items():
        if args.only and key != args.only:
            continue
        t0 = time.time()
        f = fit(exp)
        base = ifit.optimum(f, l2, max_iter=500)
        trak = ifit.trak_models(f, ifit.TRAK_MODELS, base=base)
        ctx = ifit.context(f, {"l2": l2, "damping": damping}, base=base)
        table = ifit.lds_table(ctx, m=args.m, n_test=args.t, states={"trak": trak},
                               progress=lambda frac, what: print(f"  [{time.time() - t0:6.1f}s] {what}", file=sys.stderr))
        xs, ys = ifit.arrays(f)
        txs, tys = f.data.x_test[table.test_indices], f.data.y_test[table.test_indices]
        p = engine.num_params(f.model)
        extra = {
            "k1024": ifit.trak_scores(f, trak, l2, txs, tys, proj_dim=1024),
            "alg1": inf.trak(f.loss_fn, trak, xs, ys, txs, tys, proj_dim=512, task=f.data.task, kernel="algorithm1"),
        }
        results = dict(table.results, **{k: inf.lds(np.asarray(v), table.subsets, table.outputs) for k, v in extra.items()})
        cells = [cell(results[m].per_test) if m in results else "—" for m in [*inf.METHODS, "k1024", "alg1"]]
        if "influence" in results and "trak" in results:  # a benchmark's own column, not a page's dispatch
            cells.append(cell(results["trak"].per_test - results["influence"].per_test, signed=True))
        else:
            cells.append("—")
        print(f"| {label} (P = {p:,}; λ = {l2:g}, δ = {damping:g}, ‖∇F(θ̂)‖ = {base.grad_norm:.1e}) | " + " | ".join(cells)
              + f" | {time.time() - t0:.0f} |", flush=True)
        for m, err in table.errors.items():
            print(f"  {m}: {err}")


if __name__ == "__main__":
    main()
