"""The record of a training example (issue 43): what one subset ensemble says about every example, measured.

    python -m benchmarks.record                 # digits MLP (the default Experiment) with 10% label noise, M = 32:
                                                # memorization finds the flipped labels, LiRA vs the loss attack,
                                                # memorization vs self-influence, DP-SGD at ε = 3; CPU-s and peak RSS
    python -m benchmarks.record --loo           # + memorization against brute-force leave-one-out retraining
    python -m benchmarks.record --cost          # CPU-s of each ensemble in a fresh process per M, beside
                                                # costs.record_seconds' estimate (calibrates gradlab/costs.py)

CPU-seconds are this process's CPU time (`time.process_time`, all of XLA's threads); peak RSS is
`resource.getrusage(RUSAGE_SELF).ru_maxrss`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from gradlab import costs, engine, ensemble, experiment, metrics, record

#: The leave-one-out oracle's setting: breast cancer (455 training examples, 30 features) with 10% of its labels
#: flipped, an MLP of 16 units trained for 150 Adam steps at 0.03: a small model that memorizes (flipped labels:
#: memorization ≈ 0.8), so the comparison is not between zeros.
LOO_EXPERIMENT = experiment.Experiment(dataset="breast_cancer", label_noise=0.1, width=16, steps=150, lr=0.03)


def leave_one_out_memorization(fitted, indices, *, pairs: int = 16, seed: int = 123):
    """Brute-force memorization of each example in `indices` (the oracle of Feldman & Zhang 2020's estimator): for each
    example i and each of `pairs` draws, a random set R of H − 1 other examples (H = ⌊N/2⌋, the ensemble's halves) and
    one more example j ∉ R ∪ {i}; train on R ∪ {i} and on R ∪ {j} with the experiment's recipe from its initialization
    and the same minibatch seed, and record whether each model classifies i as labelled. mem(i) is the mean paired
    difference, its standard error the paired differences' sd / √pairs. R ∪ {i} is a uniform random half that holds
    i, R ∪ {j} one that does not: the IN and OUT models of the definition, retrained example by example.

    **Returns** `(mem (K,), se (K,))`."""
    n = len(fitted.data.y_train)
    h = n // 2
    xs, ys = jnp.asarray(fitted.data.x_train), jnp.asarray(fitted.data.y_train)
    rng = np.random.default_rng(seed)
    ins, outs = [], []
    for i in indices:
        others = np.delete(np.arange(n), i)
        for _ in range(pairs):
            perm = rng.permutation(others)
            ins.append(np.sort(np.append(perm[:h - 1], i)))
            outs.append(np.sort(np.append(perm[:h - 1], perm[h - 1])))
    r, init = fitted.recipe, fitted.run.checkpoints[0]
    static = eqx.partition(init, eqx.is_inexact_array)[1]
    k = len(indices)
    right = []
    for subs in (ins, outs):
        # pair p of example i: model i·pairs + p in both calls, so both draw their minibatches from one seed
        stacked = ensemble.train_stacked(init, fitted.loss_fn, xs, ys, np.stack(subs), optimizer=r["optimizer"],
                                         lr=r["lr"], steps=r["steps"], batch_size=r["batch_size"], l2=r["l2"],
                                         seed=seed)
        models = ensemble.Ensemble(np.zeros((len(subs), n), bool), stacked, static)
        pred = models.outputs(lambda m: jnp.argmax(jax.vmap(m)(xs[np.asarray(indices)]), -1)).reshape(k, pairs, k)
        right.append(np.stack([pred[a, :, a] == np.asarray(ys)[indices[a]] for a in range(k)]))
    diff = right[0].astype(np.float64) - right[1]
    return diff.mean(1), diff.std(1, ddof=1) / np.sqrt(pairs)


def loo_indices(fitted, k: int = 20) -> np.ndarray:
    """K examples chosen without looking at any ensemble: the first K/2 flipped labels and the K/2 other examples the
    trained model is least sure of (smallest gap between its two largest logits)."""
    logits = np.asarray(jax.vmap(fitted.model)(jnp.asarray(fitted.data.x_train)))
    top = np.sort(logits, 1)
    flipped = np.flatnonzero(fitted.data.flipped)[: k // 2]
    border = [i for i in np.argsort(top[:, -1] - top[:, -2]) if i not in flipped][: k - len(flipped)]
    return np.concatenate([flipped, border]).astype(int)


def loo_rows(models: int = 64, pairs: int = 16) -> dict:
    f = experiment.fit(LOO_EXPERIMENT)
    idx = loo_indices(f)
    start = time.process_time()
    out = record.ensemble_for(f, models)
    mem = record.memorization(out.correct, out.masks)
    ens_s = time.process_time() - start
    start = time.process_time()
    mo, so = leave_one_out_memorization(f, idx, pairs=pairs)
    z = (mem.value[idx] - mo) / np.sqrt(mem.se[idx] ** 2 + so ** 2 + 1e-12)
    return {"ensemble_cpu_s": ens_s, "oracle_cpu_s": time.process_time() - start, "indices": idx.tolist(),
            "ensemble": mem.value[idx].tolist(), "ensemble_se": mem.se[idx].tolist(), "oracle": mo.tolist(),
            "oracle_se": so.tolist(), "z": z.tolist()}


def digits_rows(models: int = record.DEFAULT_MODELS) -> dict:
    exp = experiment.Experiment(label_noise=0.1)
    f = experiment.fit(exp)
    p, n = engine.num_params(f.model), len(f.data.y_train)
    res = {"P": p, "N": n, "M": models}
    t = time.process_time()
    out = record.ensemble_for(f, models)
    res["ensemble_cpu_s"] = time.process_time() - t
    t = time.process_time()
    dp = record.ensemble_for(f, models, private=True)
    res["dp_ensemble_cpu_s"] = time.process_time() - t
    t = time.process_time()
    table = record.per_example_table(f, out, dp=dp)
    res["table_cpu_s"] = time.process_time() - t
    t = time.process_time()
    record.record_of(f, int(np.flatnonzero(f.data.flipped)[0]), table)
    res["record_cpu_s"] = time.process_time() - t
    res["estimate_cpu_s"] = costs.record_seconds(p, n, models=models, steps=exp.steps, batch_size=exp.batch_size,
                                                 private=True)
    flipped = f.data.flipped
    r = metrics.roc(table["memorization"].to_numpy(), flipped)
    res["flipped_auc"] = r.auc
    res["flipped_in_top_decile"] = metrics.fraction_in_top(table["memorization"].to_numpy(), flipped, 0.1)
    for name, o in (("recipe", out), ("dp", dp)):
        res[f"{name}_mean_memorization"] = float(record.memorization(o.correct, o.masks).value.mean())
        res[f"{name}_test_accuracy"] = float(o.test_accuracy.mean())
        res[f"{name}_epsilon"] = o.epsilon
        res[f"{name}_sigma"] = o.noise_multiplier
        for attack, roc in record.attack_rocs(o).items():
            res[f"{name}_{attack}"] = {"auc": roc.auc, **{f"tpr@{fpr:g}": roc.tpr_at(fpr) for fpr in record.FPRS}}
    c = record.rank_correlations(table)
    row = c[(c["a"] == "memorization") & (c["b"] == "self_influence")].iloc[0]
    res["spearman_mem_self_influence"] = [float(row["rho"]), float(row["low"]), float(row["high"])]
    rel = record.strongest_relation(c)
    res["strongest_relation"] = None if rel is None else rel.text
    res["outputs_bytes"] = out.nbytes + dp.nbytes
    res["table_bytes"] = int(table.memory_usage(deep=True).sum())
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return res


def one_cost(models: int, private: bool) -> dict:
    """CPU-s of one ensemble in this (fresh) process, the experiment's fit excluded."""
    exp = experiment.Experiment(label_noise=0.1)
    f = experiment.fit(exp)
    t = time.process_time()
    record.ensemble_for(f, models, private=private)
    measured = time.process_time() - t
    p, n = engine.num_params(f.model), len(f.data.y_train)
    return {"models": models, "private": private, "measured": measured,
            "estimate": costs.record_ensemble_seconds(p, n, models=models, steps=exp.steps,
                                                      batch_size=exp.batch_size, private=private)}


def main(argv=None) -> None:
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--loo", action="store_true", help="also the leave-one-out oracle")
    a.add_argument("--cost", action="store_true", help="only the cost calibration, a fresh process per ensemble")
    a.add_argument("--models", type=int, nargs="*", default=[8, 16, 32, 64])
    a.add_argument("--one", nargs=2, metavar=("M", "PRIVATE"), help=argparse.SUPPRESS)
    args = a.parse_args(argv)
    if args.one:
        print(json.dumps(one_cost(int(args.one[0]), args.one[1] == "1")))
        return
    if args.cost:
        print("| ensemble | M | measured CPU-s | estimated CPU-s | estimate / measured |\n|---|---:|---:|---:|---:|")
        for private in (False, True):
            for m in args.models:
                got = subprocess.run([sys.executable, "-m", "benchmarks.record", "--one", str(m), str(int(private))],
                                     capture_output=True, text=True, check=True)
                r = json.loads(got.stdout.strip().splitlines()[-1])
                print(f"| {'DP-SGD' if private else 'recipe'} | {m} | {r['measured']:.1f} | {r['estimate']:.1f} | "
                      f"{r['estimate'] / r['measured']:.2f} |", flush=True)
        return
    print(json.dumps(digits_rows(), indent=1, default=float))
    if args.loo:
        print(json.dumps(loo_rows(), indent=1, default=float))


if __name__ == "__main__":
    main()
