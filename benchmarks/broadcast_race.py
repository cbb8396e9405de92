"""How often XLA:CPU's YNNPACK reduction race (google/XNNPACK#11243) reaches the engine, with and without gradlab's
XLA options, on the installed jaxlib (issue 42): the broadcast-δ problem of tests/test_engine_broadcast.py at N = 256,
`per_example_norms(method="ghost")`, `--calls` calls each way, counting calls with a NaN norm or a norm off by more
than 1e-4 relative against the float64 closed form.

    python -m benchmarks.broadcast_race            # 60 calls with the options (gradlab's default), 60 without

"With" is `gradlab.xla.options()` (the probe's answer on this jaxlib); "without" clears the probe and passes no option.
Each way runs in a fresh process (the options are read once per process), so the script starts itself twice.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def _one(way: str, calls: int, shape: tuple) -> dict:
    import jax
    import jaxlib
    import numpy as np

    from gradlab import engine, xla

    if way == "without":
        xla.OPTIONS = {}  # options() then returns {} and xla.jit compiles with no option (read once, at first use)
        xla.options.cache_clear()
    sys.path.insert(0, "tests")
    from test_engine_broadcast import loss, oracle, problem, rel  # its skipif reads xla.options()
    p, xs, ys = problem(*shape)
    gw, gb, gm = oracle(p, xs, ys)
    want = np.sqrt(gw ** 2 + gb ** 2 + np.sum(gm.reshape(len(gw), -1) ** 2, 1))
    nan = wrong = 0
    worst = None
    for _ in range(calls):
        got = np.asarray(engine.per_example_norms(loss, p, xs, ys, method="ghost"))
        if np.isnan(got).any():
            nan += 1
        else:
            err = rel(got, want)
            worst = err if worst is None else max(worst, err)
            wrong += err > 1e-4
    return dict(way=way, jax=jax.__version__, jaxlib=jaxlib.__version__, options=xla.options(), calls=calls,
                nan_calls=nan, wrong_calls=int(wrong), worst_finite_rel=worst, shape=shape)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--shape", type=int, nargs=3, default=(4, 16, 16), help="tokens, inputs, outputs")
    ap.add_argument("--way", choices=("with", "without"), help="one way in this process (used by the script itself)")
    a = ap.parse_args(argv)
    if a.way:
        print(json.dumps(_one(a.way, a.calls, tuple(a.shape))))
        return
    for way in ("with", "without"):
        out = subprocess.run([sys.executable, "-m", "benchmarks.broadcast_race", "--way", way, "--calls", str(a.calls),
                              "--shape", *map(str, a.shape)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"jax {r['jax']} / jaxlib {r['jaxlib']}, options {'on' if r['options'] else 'off'}: {r['nan_calls']} of "
              f"{r['calls']} calls with a NaN norm, {r['wrong_calls']} more wrong > 1e-4; worst finite relative error "
              f"{'–' if r['worst_finite_rel'] is None else format(r['worst_finite_rel'], '.1e')} "
              f"(N = 256, {'x'.join(map(str, r['shape']))})")


if __name__ == "__main__":
    main()
