"""Measure the influence goals (issues 5 and 12) and print tables.

    python -m benchmarks.influence_goals            # float32, as the app runs
    python -m benchmarks.influence_goals --x64      # the same in float64
    python -m benchmarks.influence_goals --quick    # fewer test points

1. Predicted vs actual leave-one-out change of one test loss at one converged θ̂, over the 8 most
   positive and 8 most negative predictions (Koh & Liang 2017, Fig. 2), as the page's check: the
   app's default digits MLP (goal Pearson ≥ 0.9) and L2 logistic / softmax regression (≥ 0.95).
2. Self-influence as a detector of flipped labels (digits, 10% label noise): softmax regression
   (goal AUC ≥ 0.98), and an MLP trained until it memorizes the flipped labels, where the last
   checkpoint's gradient norm falls (≈ 0.96) while TracIn over checkpoints stays ≥ 0.98.
"""

from __future__ import annotations

import argparse
import time

import jax


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--x64", action="store_true", help="run in float64")
    ap.add_argument("--quick", action="store_true", help="2 test points per dataset instead of 5")
    args = ap.parse_args()
    if args.x64:
        jax.config.update("jax_enable_x64", True)

    import jax.numpy as jnp
    import numpy as np

    from gradlab import engine
    from gradlab import influence as inf
    from gradlab import losses
    from gradlab.experiment import Experiment, fit
    from gradlab.metrics import detection_roc

    dtype = jnp.float64 if args.x64 else jnp.float32
    cast = lambda a: jnp.asarray(a, dtype) if np.issubdtype(np.asarray(a).dtype, np.floating) else jnp.asarray(a)

    print(f"# 1. predicted vs actual leave-one-out change ({'float64' if args.x64 else 'float32'})")
    print("One θ̂: mean loss + λ/2‖θ‖² converged from the trained model (L-BFGS, ≤ 500 iterations); the 8 most positive")
    print("and 8 most negative influence-function predictions at θ̂ (damping δ on H only), each retrained from θ̂")
    print("without the example (≤ 300 L-BFGS iterations), as the page's check does.")
    print("| dataset | model | λ | δ | ‖∇F(θ̂)‖ | test point | P | solver | Pearson | Spearman | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    n_points = 2 if args.quick else 5
    cases = [
        (Experiment(), 1e-2, 1e-2, "MLP 64 relu (app default)"),
        (Experiment(dataset="breast_cancer", model="linear"), 1e-2, 0.0, "logistic regression"),
        (Experiment(dataset="digits", model="linear"), 1e-2, 0.0, "softmax regression"),
    ]
    for exp, lam, delta, label in cases:
        f = fit(exp)
        d = f.data
        params = jax.tree.map(lambda a: cast(a) if eqx_is_float(a) else a, f.model)
        xs, ys = cast(d.x_train), jnp.asarray(d.y_train)
        base = inf.minimize(f.loss_fn, params, xs, ys, l2=lam, max_iter=500)
        for t in range(n_points):  # the page opens on test point 0
            t0 = time.perf_counter()
            chk = inf.check_against_retraining(f.loss_fn, base, xs, ys, cast(d.x_test[t]), jnp.asarray(d.y_test[t]),
                                               damping=delta, k=8, max_iter=300)
            dt = time.perf_counter() - t0
            print(f"| {exp.dataset} | {label} | {lam:g} | {delta:g} | {base.grad_norm:.1e} | #{t} | "
                  f"{engine.num_params(params)} | {chk.ihvp.method} | {chk.pearson:.3f} | {chk.spearman:.3f} | {dt:.1f} |",
                  flush=True)

    print("\n# 2. self-influence as a detector of flipped labels (digits, 10% label noise): ROC AUC")
    print("| model | steps | λ | seed | train acc. on flipped | ‖g‖² last ckpt | TracIn self-infl. | influence fn. self-infl. |")
    print("|---|---|---|---|---|---|---|---|")
    runs = [Experiment(model="linear", label_noise=0.1)]
    runs += [Experiment(model="mlp", label_noise=0.1, steps=2000, l2=0.0, checkpoint_every=100, seed=s) for s in (0, 1, 2)]
    runs += [Experiment(model="mlp", label_noise=0.1, steps=2000, l2=1e-4, checkpoint_every=100)]
    for exp in runs:
        f = fit(exp)
        d = f.data
        xs, ys = jnp.asarray(d.x_train), jnp.asarray(d.y_train)
        pred = np.asarray(losses.predict(f.model, xs, d.task))
        fit_flipped = float(np.mean(pred[d.flipped] == d.y_train[d.flipped]))
        gn = detection_roc(np.asarray(inf.self_influence(f.loss_fn, f.model, xs, ys, method="grad_norm")), d.flipped).auc
        ckpts, lrs = inf.tracin_checkpoints(f.run)
        tr = detection_roc(np.asarray(inf.self_influence(f.loss_fn, f.model, xs, ys, method="tracin",
                                                         checkpoints=ckpts, lrs=lrs)), d.flipped).auc
        try:
            ifs = detection_roc(np.asarray(inf.self_influence(f.loss_fn, f.model, xs, ys, method="influence",
                                                              l2=max(exp.l2, 1e-4))), d.flipped).auc
            ifs = f"{ifs:.3f}"
        except inf.InfluenceError:
            ifs = "n/a (P too large)"
        name = "softmax regression" if exp.model == "linear" else f"MLP {exp.width}"
        print(f"| {name} | {exp.steps} | {exp.l2:g} | {exp.seed} | {fit_flipped:.0%} | {gn:.3f} | {tr:.3f} | {ifs} |", flush=True)


def eqx_is_float(a) -> bool:
    import equinox as eqx

    return eqx.is_inexact_array(a)


if __name__ == "__main__":
    main()
