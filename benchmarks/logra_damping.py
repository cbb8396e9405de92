"""The damping λ of the projected gradients' after-kernel (`gradlab/influence/methods/logra.py`, `RIDGE`), chosen on
held-out test points and reported on others (docs/influence.md).

    python -m benchmarks.logra_damping            # SimpleCNN, Fashion subset (benchmarks.lds_cnn's cached protocol)
    python -m benchmarks.logra_damping --mlp      # the digits MLP (benchmarks.lds's protocol)

SimpleCNN: `benchmarks.lds_cnn`'s protocol and cache (2,000 training images, 50 retrains on random halves; the first
run trains them, ~450 CPU-s); the features Φ at k per side once, then for each relative damping r the after-kernel
φ(z)ᵀ(ΦᵀΦ + r·tr(ΦᵀΦ)/k·I)⁻¹φᵢ, its LDS on the selection test images 100–199 and on the reported 0–99.
The digits MLP: `influence.fitted.lds_table` (M = 50) on test points 0–31, the method as the page runs it.
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.linalg

GRID = (1e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0, 10.0)


def cnn(sides) -> None:
    from benchmarks import lds_cnn as L
    from gradlab import influence as inf
    from gradlab.influence import fitted as ifit
    from gradlab.influence.methods import METHODS

    data, exp = L.dataset(2000), L.experiment(2000)
    fitted, _ = L.attributed("/tmp/gradlab-lds-cnn", data, exp)
    subsets, truth, _ = L.ground_truth("/tmp/gradlab-lds-cnn", data, exp, 50, lambda s: None)

    def lds(scores, lo, hi):
        m, se = L.mean_se(inf.lds(scores[lo:hi], subsets, truth[:, lo:hi]).per_test)
        return f"{m:.3f} ± {se:.3f}"

    for side in sides:
        ctx = ifit.context(fitted, {"logra_k": side, "logra_kernel": "inner"}, base=L._refuse_optimum)
        state = METHODS["logra"].prepare(ctx)
        phi, test = np.asarray(state.phi, np.float64), np.asarray(state.test_phi[:200], np.float64)
        gram = phi.T @ phi
        mean_eig = np.trace(gram) / len(gram)
        print(f"SimpleCNN, k = {side} per side ({phi.shape[1]:,} features): inner product "
              f"{lds(test @ phi.T, 100, 200)} (selection), {lds(test @ phi.T, 0, 100)} (reported)", flush=True)
        for r in GRID:
            c = scipy.linalg.cho_factor(gram + r * mean_eig * np.eye(len(gram)))
            s = scipy.linalg.cho_solve(c, test.T).T @ phi.T
            print(f"  λ = {r:g} × mean eigenvalue: {lds(s, 100, 200)} (selection, test 100–199), "
                  f"{lds(s, 0, 100)} (reported, test 0–99)", flush=True)


def mlp(sides) -> None:
    from gradlab.experiment import Experiment, fit
    from gradlab.influence import fitted as ifit
    from gradlab.influence.methods import logra

    f = fit(Experiment())
    for side in sides:
        for kernel, grid in (("inner", (None,)), ("after", GRID)):
            for r in grid:
                if r is not None:
                    logra.RIDGE = r
                ctx = ifit.context(f, {"logra_k": side, "logra_kernel": kernel}, base=lambda: None)
                v = ifit.lds_table(ctx, m=50, n_test=32, names=["logra"]).results["logra"].per_test
                v = v[np.isfinite(v)]
                print(f"digits MLP, k = {side}, {kernel}{'' if r is None else f', λ = {r:g} × mean eigenvalue'}: "
                      f"{v.mean():.3f} ± {v.std(ddof=1) / np.sqrt(len(v)):.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mlp", action="store_true", help="the digits MLP instead of SimpleCNN")
    ap.add_argument("--k", type=int, nargs="+", default=[16, 32], help="projection per side")
    a = ap.parse_args()
    (mlp if a.mlp else cnn)(a.k)


if __name__ == "__main__":
    main()
