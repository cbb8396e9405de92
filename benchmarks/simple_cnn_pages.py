"""Equivalence's and Performance's computations on seed 003's SimpleCNN, each in a fresh process (cold: no XLA cache).

    python -m benchmarks.simple_cnn_pages equiv 16          # compare_all on 16 examples: CPU-s and peak RSS
    python -m benchmarks.simple_cnn_pages cell vmap 6       # one Performance cell (first call + 2 runs)
    python -m benchmarks.simple_cnn_pages all               # every row below, each in its own process

CPU-s: `time.process_time()` (all of XLA's threads), so a busy machine moves wall time more than these numbers.
Peak: VmHWM after the computation minus VmRSS before it (the model and data loaded, JAX imported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def _setup(model: str):
    from gradlab.experiment import Experiment, init_model, load_data
    from gradlab.losses import loss_for

    exp = (Experiment.for_model("simple_cnn").replace(dataset="fashion") if model == "simple_cnn" else Experiment())
    d = load_data(exp)
    return loss_for(d.task), init_model(exp, d), d.x_train, d.y_train


def one(what: str, *args, model: str = "simple_cnn") -> dict:
    import jax

    from gradlab import bench, equivalence, memory

    loss_fn, params, xs, ys = _setup(model)
    jax.block_until_ready(jax.tree.leaves(params))
    base = memory.rss_mb()
    memory.peak_rss_mb(reset=True)
    t0, w0 = time.process_time(), time.perf_counter()
    if what == "equiv":
        n = int(args[0])
        sub = jax.tree.map(lambda v: v[:n], (xs, ys))
        equivalence.compare_all(loss_fn, params, *sub)
        out = dict(n=n)
    else:
        approach, n = args[0], int(args[1])
        sub = jax.tree.map(lambda v: v[:n], (xs, ys))
        fn = bench.runner(approach, loss_fn, params, *sub)
        fn()
        first = time.process_time() - t0
        runs = []
        for _ in range(2):
            r0 = time.process_time()
            fn()
            runs.append(time.process_time() - r0)
        out = dict(approach=approach, n=n, first_cpu=first, run_cpu=min(runs), compile_cpu=first - min(runs))
    out.update(cpu=time.process_time() - t0, wall=time.perf_counter() - w0, base_mb=base,
               peak_over_mb=memory.peak_rss_mb() - base, peak_mb=memory.peak_rss_mb(), model=model, what=what)
    return out


def spawn(*argv) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    r = subprocess.run([sys.executable, "-m", "benchmarks.simple_cnn_pages", *map(str, argv)], capture_output=True,
                       text=True, env=env)
    if r.returncode:
        return dict(error=r.stderr[-500:], argv=argv)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv) -> None:
    model = "simple_cnn"
    if argv and argv[0] == "--model":
        model, argv = argv[1], argv[2:]
    if argv[0] != "all":
        print(json.dumps(one(*argv, model=model)))
        return
    rows = [("equiv", n) for n in (4, 16, 48)] + [("cell", a, n) for a in ("loop", "vmap", "batch", "norms")
                                                  for n in (2, 6)] + [("cell", a, n) for a in ("batch", "norms")
                                                                      for n in (16, 64, 256)]
    print(f"load {os.getloadavg()}", flush=True)
    for row in rows:
        print(json.dumps(spawn("--model", model, *row)), flush=True)
    print(f"load {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
