"""The Performance preset's claim, measured: a Python loop of `jax.grad` against one `vmap(grad)` call at N = 256
("over 10× slower", gradlab/ui/presets.py). Moved here from tests/test_presets.py, where a timing ratio asserted in
a test failed under load (issue 42); the test now checks what load cannot move.

    python -m benchmarks.loop_vs_vmap               # 5 rounds: loop and vmap alternate, the ratio per round
    python -m benchmarks.loop_vs_vmap --rounds 11

Each round times the loop once and vmap's median of 5 steady-state calls (`gradlab.bench.time_approach`, compiles
excluded), on the preset's digits MLP; the median round's ratio is the line to quote, with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)

    from gradlab import bench
    from gradlab.experiment import init_model, load_data
    from gradlab.losses import loss_for
    from gradlab.ui.presets import BY_NAME

    preset = BY_NAME["Per-example gradients cost about one gradient"]
    data = load_data(preset.config)
    n = max(preset.widgets["perf_sizes"])
    loss, model = loss_for(data.task), init_model(preset.config, data)
    xs, ys = data.x_train[:n], data.y_train[:n]
    for approach in ("loop", "vmap"):  # compile both before the first round
        bench.runner(approach, loss, model, xs, ys)()
    ratios = []
    for r in range(a.rounds):
        loop = bench.time_approach("loop", loss, model, xs, ys, repeats=1).run_s
        vmap = bench.time_approach("vmap", loss, model, xs, ys, repeats=5).run_s
        ratios.append(loop / vmap)
        print(f"round {r + 1}: loop {loop * 1e3:.1f} ms, vmap {vmap * 1e3:.2f} ms, ratio {loop / vmap:.1f}")
    load = os.getloadavg()[0]
    print(f"N = {n}, {a.rounds} rounds: ratio median {statistics.median(ratios):.1f} (min {min(ratios):.1f}, "
          f"max {max(ratios):.1f}); load average {load:.1f} at the end")
    return float(np.median(ratios))


if __name__ == "__main__":
    main()
