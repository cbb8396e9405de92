"""Truncated conjugate gradient for many test points: one after another vs vmapped together, in one run.

    python -m benchmarks.cg_rows                    # MNIST-1D MLP (dattri's, P = 14,154), N = 5,000, 16 test points
    python -m benchmarks.cg_rows --test 32 --blocks 1 4 32

`inverse_hvp_batch` solves its right-hand sides with `jax.lax.map` over `memory.IHVP_BLOCK` rows vmapped together
(1: one after another). This times 10 CG steps from 0 of the influence function's test gradients at each block
size (compiled first, then timed: best of `--repeats`), checks every block size gives the per-point solve (the
largest difference relative to the largest entry), and prints the time per solve and its ratio to block 1.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import lds_dattri as bench
from gradlab import memory
from gradlab.influence import inverse_hvp_batch
from gradlab.influence import scores as sc


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", type=int, default=5000)
    ap.add_argument("--test", type=int, default=16)
    ap.add_argument("--blocks", type=int, nargs="+", default=[1, 2, 4, 16])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    data = bench.load("mnist1d", args.train, 500)          # the benchmark's split; its first --test points
    recipe = bench.RECIPES["mlp"]
    p0 = jax.tree.map(lambda a: a[None], bench.init_params(jax.random.key(0), recipe, data.x.shape[1], data.n_classes))
    xs, ys = jnp.asarray(data.x), jnp.asarray(data.y)
    full, _ = bench.train(p0, xs, ys, np.arange(len(data.y))[None], jnp.stack([jax.random.key(10_000)]), recipe)
    params = jax.tree.map(lambda a: a[0], full)
    g = sc.flat_gradients(bench.loss, params, jnp.asarray(data.x_test[:args.test]),
                              jnp.asarray(data.y_test[:args.test]))
    print(f"# {args.steps} CG steps, δ = 0.1, MNIST-1D MLP (P = {g.shape[1]:,}), N = {args.train:,}, "
          f"{args.test} test points")
    print(f"| rows vmapped together | seconds (best of {args.repeats}) | per solve | / one at a time | max diff |")
    print("|---|---|---|---|---|")
    base, ref = None, None
    for block in args.blocks:
        memory.IHVP_BLOCK = block
        solve = lambda: inverse_hvp_batch(bench.loss, params, xs, ys, g, damping=0.1, method="cg",
                                          cg_steps=args.steps)[0]
        x = jax.block_until_ready(solve())                  # compile
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(solve())
            times.append(time.perf_counter() - t0)
        t = min(times)
        base = base or t
        ref = np.asarray(x) if ref is None else ref
        diff = float(np.abs(np.asarray(x) - ref).max() / np.abs(ref).max())
        print(f"| {block} | {t:.2f} | {t / args.test:.3f} | {t / base:.2f}× | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
