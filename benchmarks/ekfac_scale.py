"""EK-FAC at seed 003's scale: SimpleCNN (conv 1→32, conv 32→64, fc 9,216→128, fc 128→10; 1.2 M parameters) on the
bundled Fashion-MNIST subset (6,000 training images), trained with its recipe, then the `ekfac` method's two costs:

- **prepare**: the layers' layout, the factors pass, the eigendecompositions and (EK-FAC) the correction pass;
- **score**: one test point, cold (its gradient, the preconditioning, compiling the streamed dots) and warm (another);
- **self-influence**: one more streamed pass.

Each stage prints process CPU-seconds (both cores), wall seconds and the rise of peak RSS (VmHWM, reset by
`/proc/self/clear_refs` after `malloc_trim` before each stage) over the RSS before it, and the held bytes the method
declares (`curvature.Layout.held_bytes`) against the exact (unprojected) factors'.

    python -m benchmarks.ekfac_scale                   # the method's defaults: k = 512, EK-FAC, sampled labels,
                                                       # the curvature on 1,000 examples
    python -m benchmarks.ekfac_scale --examples all --warm   # all 6,000, and once more compiled
    python -m benchmarks.ekfac_scale --k 256 --kfac    # another projection, K-FAC (no correction pass)
    python -m benchmarks.ekfac_scale --dataset digits --model mlp   # the digits MLP, every layer exact
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import time

from gradlab import memory
from gradlab.experiment import Experiment, fit
from gradlab.influence import METHODS, curvature
from gradlab.influence import fitted as ifit
from gradlab.influence.methods import ekfac


def _status() -> dict:
    return {line.split(":")[0]: int(line.split()[1]) / 1024 for line in open("/proc/self/status")
            if line.startswith(("VmRSS", "VmHWM"))}


class Stage:
    """CPU-seconds, wall seconds and the peak RSS rise of the block it wraps."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        self.rss = _status()["VmRSS"]
        self.cpu, self.wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        cpu, wall = time.process_time() - self.cpu, time.perf_counter() - self.wall
        s = _status()
        print(f"{self.name:<34} {cpu:7.1f} CPU-s {wall:7.1f} s wall   peak RSS +{s['VmHWM'] - self.rss:6.0f} MB "
              f"(process peak {s['VmHWM']:.0f} MB)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="fashion")
    ap.add_argument("--model", default="simple_cnn")
    ap.add_argument("--k", default="512", help="projection k per layer side, or 'none' (exact factors)")
    ap.add_argument("--examples", default=ekfac.DEFAULT_EXAMPLES, help="examples the curvature is estimated on, or 'all'")
    ap.add_argument("--kfac", action="store_true", help="K-FAC: no eigenvalue correction pass")
    ap.add_argument("--warm", action="store_true", help="prepare a second time (compiled: the computation alone)")
    ap.add_argument("--empirical", action="store_true", help="the dataset's labels instead of sampled ones")
    args = ap.parse_args()
    print(f"load (uptime): {os.getloadavg()}")
    exp = Experiment.for_model(args.model).replace(dataset=args.dataset)
    t = time.process_time()
    f = fit(exp)
    print(f"{exp.model} on {exp.dataset}: N = {len(f.data.y_train):,}, trained in {time.process_time() - t:.1f} CPU-s")
    method = METHODS["ekfac"]
    settings = {"ekfac_k": "none (exact)" if args.k == "none" else args.k,
                "ekfac_kind": "kfac" if args.kfac else "ekfac",
                "ekfac_fisher": "empirical" if args.empirical else "sampled",
                "ekfac_examples": args.examples}
    ctx = ifit.context(f, settings)
    xs, ys = ctx.arrays()
    exact = curvature.layout(f.loss_fn, f.model, xs[0], ys[0])
    print("layers (I × O, tokens T; k_in × k_out):")
    lay = curvature.layout(f.loss_fn, f.model, xs[0], ys[0], proj_dim=None if args.k == "none" else int(args.k))
    for s in lay.sites:
        print(f"  leaf {s.leaf}: {s.inputs} × {s.outputs}, T = {s.tokens}; {s.k_in} × {s.k_out}")
    diag = sum(math.prod(lay.leaf_shapes[j]) for j in lay.diagonal)
    print(f"  diagonal: {len(lay.diagonal)} leaves ({diag:,} parameters)")
    print(f"held: {memory.mb(lay.held_bytes())} at k = {args.k}; exact factors would hold "
          f"{memory.mb(exact.held_bytes())} "
          f"(budget {memory.mb(memory.BUDGET_BYTES)})")
    print(f"settings: {settings}")
    with Stage("prepare (factors + correction)"):
        state = method.prepare(ctx)
    if args.warm:
        with Stage("prepare again (compiled)"):
            state = method.prepare(ctx)
    w = ifit.work(f)
    print(f"  (the method's estimate of its first answer, preparing + a cold test point + self-influence: "
          f"{method.cost_seconds(w, ctx.settings):.1f} CPU-s; held: {memory.mb(method.held_bytes(w, ctx.settings))}; "
          f"note: {method.note(state)})")
    pts = [ifit.test_point(f, r) for r in (0, 1)]
    for r, name in ((0, "score one test point (cold)"), (1, "score one test point (warm)")):
        with Stage(name):
            method.scores(ctx, state, pts[r][0][None], pts[r][1][None])  # numpy values: computed on return
    with Stage("self-influence (every example)"):
        method.self_influence(ctx, state)


if __name__ == "__main__":
    main()
