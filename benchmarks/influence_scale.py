"""Influence at the trained checkpoint at seed 003's scale (issue 40): SimpleCNN over the shipped Fashion-MNIST subset
(1,199,882 parameters, 6,000 training and 1,000 test images), what the Influence page computes for its default
method there (projected gradients at the checkpoint, `gradlab/influence/methods/logra.py`), from a cold store, in one
process, at the library level.

Stages (process CPU time from `resource.getrusage`, both cores, and wall time; the peak RSS is the process's VmHWM,
reset after training, once its garbage is collected and the heap trimmed, as `benchmarks.influence_memory` does;
freed memory is returned between the page's computations, as the page's gate does):

1. `train`: the model by its recipe (the page's separate training button; not part of the influence goal);
2. `first view`: what the page computes after training for its default view: test losses and predictions, the
   method's preparation (the projected training features Φ and the after-kernel's Cholesky factor, its
   self-influence) and the scores of every test point (one pass over the test set, one matrix product), then the
   proponents and opponents of test image 0. Goal: ≤ 30 CPU-s, ≤ 690 MB peak RSS;
3. `click`: each further test point: the page's lookup in the stored scores (its top-k), and, for comparison, a
   test point scored from the stored features (one projected gradient and one matrix-vector product). Goal: ≤ 0.2 s
   server time;
4. for reference, one streamed pass of `engine.per_example_dots` (what the gradient dot product repeats per click)
   and the page's own estimates (`influence.fitted.gate`).

    python -m benchmarks.influence_scale            # ~1 min of CPU on 2 cores
    python -m benchmarks.influence_scale --k 32     # another projection per side
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import resource
import time


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _peak_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _rss_mb(field: str = "VmRSS") -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


class Stage:
    """CPU and wall seconds of a `with` block."""

    def __enter__(self):
        self.cpu, self.wall = _cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.cpu, self.wall = _cpu() - self.cpu, time.perf_counter() - self.wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=None, help="projection per side (default: the method's)")
    ap.add_argument("--kernel", default=None, choices=("after", "inner"), help="default: the method's")
    ap.add_argument("--clicks", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from gradlab import memory

    memory.lean_compiles()  # as the app's server does, before the first computation
    memory.trim_after_compiles()
    import jax.numpy as jnp
    import numpy as np
    from scipy.stats import spearmanr

    from gradlab import engine
    from gradlab.experiment import Experiment, fit
    from gradlab.influence import METHODS
    from gradlab.influence import fitted as ifit
    from gradlab.influence.methods import defaults, logra
    from gradlab.memory import release_memory

    out = {"uptime": os.popen("uptime").read().strip(), "rss_after_import_mb": round(_rss_mb())}
    exp = Experiment.for_model("simple_cnn").replace(dataset="fashion")
    with Stage() as train:
        f = fit(exp)
    out["model"] = f"{exp.model} on {exp.dataset}: P = {engine.num_params(f.model):,}, N = {len(f.data.y_train):,}, " \
                   f"{len(f.data.y_test):,} test"
    out["train"] = {"cpu_s": round(train.cpu, 1), "wall_s": round(train.wall, 1), "peak_mb": round(_peak_mb())}

    settings = {**defaults(), **({"logra_kernel": args.kernel} if args.kernel else {}),
                **({"logra_k": args.k} if args.k else {})}
    out["settings"] = {k: settings[k] for k in ("logra_k", "logra_layers", "logra_kernel")}
    m = METHODS["logra"]
    ctx = ifit.context(f, settings, between=lambda: release_memory(full=False))  # as the page does
    d = f.data
    k_top = 8
    out["rss_after_train_mb"] = round(_rss_mb())
    gc.collect()  # as a server between two requests: the training's garbage freed, the peak counted from here
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current RSS
    out["rss_before_first_view_mb"] = round(_rss_mb())
    with Stage() as first:
        # the page's computations, each returning freed memory after it as the page's gate does (`ui.cache`:
        # `memory.release_memory` after every shared computation): the test summary, the method's preparation,
        # the scores of every test point
        loss, pred = f.losses_and_predictions(f.model, d.x_test, d.y_test)  # the page's test summary
        release_memory()
        with Stage() as prep:
            state = m.prepare(ctx)
        release_memory()
        rows = tuple(range(len(d.y_test))) if m.every_test_point(ctx) else (0,)
        got = ifit.score_test_points(ctx, rows, names=["logra"], states={"logra": state})
        release_memory()
        all_scores = got.scores["logra"]
        s = all_scores[0]
        order = np.argsort(-s, kind="stable")
        props, opps = order[:k_top], order[::-1][:k_top]
        selfs = m.self_influence(ctx, state)
    out["first_view"] = {"cpu_s": round(first.cpu, 1), "wall_s": round(first.wall, 1), "peak_mb": round(_peak_mb()),
                         "prepare_cpu_s": round(prep.cpu, 1), "rss_anon_mb": round(_rss_mb("RssAnon")),
                         "features": int(state.phi.shape[1]), "every_test_point": len(rows) > 1,
                         "scores_shape": list(all_scores.shape), "test_loss_0": float(loss[0]),
                         "proponents": props.tolist(), "opponents": opps.tolist(),
                         "self_influence_range": [float(selfs.min()), float(selfs.max())],
                         "accuracy": float(np.mean(pred == d.y_test))}

    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(d.y_test), args.clicks)
    lookups, matvecs = [], []
    for i in picks:  # the page: a stored (T, N) lookup and its top-k
        with Stage() as c:
            s = all_scores[int(i)]
            order = np.argsort(-s, kind="stable")
            _ = order[:k_top], order[::-1][:k_top]
        lookups.append(c.wall)
    x, y = jnp.asarray(d.x_test), jnp.asarray(d.y_test)
    m.scores(ctx, state, x[:1], y[:1])  # compiles the one-point program (once per process)
    for i in picks:  # without the stored scores: features of one test point, then a matvec with Φ
        with Stage() as c:
            v = m.scores(ctx, state, x[int(i):int(i) + 1], y[int(i):int(i) + 1]).values[0]
            order = np.argsort(-v, kind="stable")
        matvecs.append((c.wall, c.cpu))
        np.testing.assert_allclose(v, all_scores[int(i)], rtol=1e-3, atol=1e-4 * np.abs(v).max())
    out["click"] = {"lookup_wall_s_max": round(max(lookups), 4),
                    "matvec_wall_s_median": round(float(np.median([w for w, _ in matvecs])), 4),
                    "matvec_wall_s_max": round(max(w for w, _ in matvecs), 4),
                    "matvec_cpu_s_median": round(float(np.median([c for _, c in matvecs])), 4)}

    # for reference: one streamed gradient dot product pass (what grad dot repeats per click), its agreement
    xs, ys = ctx.arrays()
    g = engine.per_example_grads(f.loss_fn, f.model, x[:1], y[:1])
    import jax
    vec = jax.tree.map(lambda a: a[0], g)
    with Stage() as dots:
        gd = np.asarray(engine.per_example_dots(f.loss_fn, f.model, xs, ys, vec))
    out["grad_dot_pass"] = {"cpu_s": round(dots.cpu, 1), "wall_s": round(dots.wall, 1),
                            "spearman_vs_projected_test0": round(float(spearmanr(gd, all_scores[0])[0]), 3)}
    w = ifit.work(f)
    gate = ifit.gate(ifit.available(f)[0], w, settings)
    out["estimates"] = {n: {"first_cpu_s": round(gate.first[n], 1), "click_cpu_s": round(gate.click[n], 3),
                            "fits": gate.fits(n)} for n in gate.first}
    out["peak_mb"] = round(_peak_mb())
    out["projection"] = [(p.name, p.how, p.features) for p in state.projection]
    out["ridge"] = state.ridge
    del logra
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(out["uptime"])
    print(out["model"], out["settings"])
    print(f"train (the training button, not counted): {out['train']['cpu_s']} CPU-s, {out['train']['wall_s']} s wall")
    fv = out["first_view"]
    print(f"first view (cold store): {fv['cpu_s']} CPU-s, {fv['wall_s']} s wall; peak RSS {fv['peak_mb']} MB; "
          f"{fv['features']} features per example; scores {fv['scores_shape']}; of which the features and kernel "
          f"{fv['prepare_cpu_s']} CPU-s; RSS after training {out['rss_after_train_mb']} MB, trimmed "
          f"{out['rss_before_first_view_mb']} MB, anonymous after "
          f"{fv['rss_anon_mb']} MB")
    c = out["click"]
    print(f"each further test point: lookup {c['lookup_wall_s_max'] * 1e3:.1f} ms (max of {args.clicks}); from the "
          f"stored features {c['matvec_wall_s_median'] * 1e3:.0f} ms median, {c['matvec_wall_s_max'] * 1e3:.0f} ms max "
          f"wall ({c['matvec_cpu_s_median'] * 1e3:.0f} ms CPU)")
    gp = out["grad_dot_pass"]
    print(f"one grad-dot pass over the training set: {gp['cpu_s']} CPU-s ({gp['wall_s']} s wall); Spearman with the "
          f"projected scores on test 0: {gp['spearman_vs_projected_test0']}")
    print("estimates (CPU-s first / per click, fits):",
          {n: (e["first_cpu_s"], e["click_cpu_s"], e["fits"]) for n, e in out["estimates"].items()})
    print(f"process peak RSS {out['peak_mb']} MB")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
