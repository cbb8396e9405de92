"""Reference timings for the Performance page's default view (the lecture's step 4): the default experiment's model
(untrained) at N = 4, 16, 64, 256, Python loop / vmap(grad) / batch gradient / streamed norms, timed in several whole
sweeps; each cell keeps its fastest, median and slowest run over the sweeps, with the machine, the date and the load.

    python -m benchmarks.reference_timings              # 7 sweeps; writes gradlab/data/reference_timings.json
    python -m benchmarks.reference_timings --sweeps 3 --out /tmp/ref.json

Run it on a quiet machine (nothing else running): the page shows these beside the live timings, which a busy server
makes cross. The fastest of several sweeps is the least disturbed measurement; the spread says how quiet it was.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from gradlab import bench
from gradlab.experiment import Experiment, init_model, load_data
from gradlab.losses import loss_for

SIZES = (4, 16, 64, 256)
APPROACHES = ("loop", "vmap", "batch", "norms")


def measure(sweeps: int = 7, repeats: int = 3, log=print) -> dict:
    exp = Experiment()
    data = load_data(exp)
    problem = loss_for(data.task), init_model(exp, data), data.x_train, data.y_train
    load_before = os.getloadavg()
    runs: dict = {}
    for i in range(sweeps):
        for t in bench.sweep(*problem, SIZES, APPROACHES, repeats=repeats, loop_max=max(SIZES)):
            runs.setdefault((t.approach, t.n), []).append(t.run_s)
        log(f"sweep {i + 1} of {sweeps} done (load {os.getloadavg()[0]:.1f})")
    rows = [{"approach": a, "n": n, "min_s": min(v), "median_s": statistics.median(v), "max_s": max(v)}
            for (a, n), v in runs.items()]
    return {"machine": bench.machine(), "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load": [round(x, 2) for x in (*load_before, *os.getloadavg())], "cores": os.cpu_count(), "sweeps": sweeps, "repeats": repeats,
            "workload": f"Performance page default: {exp.dataset}, {exp.model} (untrained), the experiment's examples",
            "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweeps", type=int, default=7)
    parser.add_argument("--out", default=bench.REFERENCE_PATH)
    args = parser.parse_args(argv)
    ref = measure(args.sweeps)
    with open(args.out, "w") as f:
        json.dump(ref, f, indent=1)
    for num, den in (("loop", "vmap"), ("vmap", "batch"), ("norms", "batch")):
        for n in SIZES:
            r = bench.reference_ratio(ref, num, den, n)
            print(f"{num}/{den} at N = {n:3d}: {r[0]:.2f} (range {r[1]:.2f}–{r[2]:.2f})" if r else f"{num}/{den} at {n}: -")
    print(f"wrote {args.out} ({ref['machine']}; load before/after {ref['load']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
