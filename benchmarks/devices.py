"""Per-device memory of the engine on 1 device vs all devices (XLA's memory analysis).

Compiles (does not run) each engine function's sharded program for a one-device mesh and for a
mesh over all D devices, and prints the bytes XLA's buffer assignment gives one device:
arguments (the device's examples and the replicated parameters), outputs and temporaries. Peak
per device = arguments + outputs + temporaries. Two sizes N give the part per example (the
slope) and the fixed part (the intercept: parameters and one chunk's intermediates; on the
`vmap` path a chunk of per-example gradients, chunk × P × 4 bytes), so the largest N that fits a
device's memory follows for 1 and for D devices, and how many times it grows.

`chunk_size` is per device (`gradlab.sharding`): by default each of the D devices streams its
N/D examples in chunks of `--chunk`, as one device streams N. `--split-chunk` gives each device
`--chunk // D` instead (the same total in flight as one device): a smaller fixed part, D times
as many chunks per device.

Without a GPU, force several host (CPU) devices; the flag must be set before JAX starts, which
`--force-host-devices` does:

    python -m benchmarks.devices --force-host-devices 4                     # ghost (rules) path
    python -m benchmarks.devices --force-host-devices 4 --method vmap       # chunk × P held
    python -m benchmarks.devices --force-host-devices 4 --split-chunk       # chunk / D per device
    python -m benchmarks.devices                      # on a machine with several GPUs
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--force-host-devices", type=int, default=0, help="XLA host (CPU) devices to force")
    ap.add_argument("--chunk", type=int, default=256, help="chunk_size (per device unless --split-chunk)")
    ap.add_argument("--split-chunk", action="store_true", help="give each of D devices chunk // D")
    ap.add_argument("--method", choices=("auto", "ghost", "vmap"), default="auto",
                    help="engine method of the streamed functions (batch_grad has none)")
    ap.add_argument("--sizes", type=int, nargs=2, default=[14336, 57344], help="two N (multiples of the devices)")
    ap.add_argument("--budget-gb", type=float, default=16.0, help="device memory for the 'largest N' column")
    args = ap.parse_args(argv)
    if args.force_host_devices:
        if "jax" in sys.modules:
            raise SystemExit("--force-host-devices must be set before jax is imported")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.force_host_devices}").strip()
    print(report(args.chunk, args.sizes, args.budget_gb, method=args.method, split_chunk=args.split_chunk))


def report(chunk: int, sizes, budget_gb: float, method: str = "auto", split_chunk: bool = False) -> str:
    """The per-device memory table (text) of 1 device vs all devices.

    **Arguments** `chunk`: chunk_size on one device (and per device, unless `split_chunk`: then
    `max(1, chunk // D)` on D devices); `sizes`: two N, multiples of the device count; `budget_gb`:
    device memory (GB, 1e9 bytes) for the largest-N column; `method`: the streamed functions'
    engine method.

    **Returns** the lines of the table; MB = 1e6 bytes, per example in bytes.
    """
    import jax
    import numpy as np

    from gradlab import bench, engine, sharding

    loss, model, xs, ys = bench.digits_mlp()
    d = jax.device_count()
    p = engine.num_params(model)
    v = engine.batch_grad(loss, model, xs[:1], ys[:1])
    fns = {
        "per_example_norms": (engine.per_example_norms, ()),
        "per_example_dots": (engine.per_example_dots, (v,)),
        "clipped_grad_sum": (engine.clipped_grad_sum, (1.0,)),
        "batch_grad": (engine.batch_grad, ()),
    }
    meshes = {1: sharding.example_mesh(jax.devices()[:1]), d: sharding.example_mesh()}
    chunks = {1: chunk, d: max(1, chunk // d) if split_chunk else chunk}
    lines = [
        f"devices: {sharding.describe_devices()}; jax {jax.__version__}",
        f"workload: digits tiled to N examples, MLP 64-256-256-10 (P = {p:,}), method {method}, "
        f"chunk_size {chunks[1]} on 1 device, {chunks[d]} per device on {d} "
        f"(a chunk of per-example gradients, held on the vmap path: {chunks[1] * p * 4 / 1e6:.0f} / {chunks[d] * p * 4 / 1e6:.0f} MB)",
        "per-device bytes from XLA's memory analysis (compiled, not run): arguments + outputs + temporaries",
        f"{'function':18s} {'N':>7s} {'1 device MB':>12s} {f'{d} devices MB':>13s} {'ratio':>6s} "
        f"{'per example B (1 / ' + str(d) + ')':>22s} {'fixed MB (1 / ' + str(d) + ')':>18s} "
        f"{f'largest N in {budget_gb:g} GB (1 / {d})':>30s} {'growth':>6s}",
    ]
    reps = -(-max(sizes) // len(xs))
    big_x, big_y = np.tile(np.asarray(xs), (reps, 1)), np.tile(np.asarray(ys), reps)
    for name, (fn, extra) in fns.items():
        peak = {}
        for n in sizes:
            for k, mesh in meshes.items():
                kw = {} if name == "batch_grad" else {"chunk_size": chunks[k], "method": method}
                peak[n, k] = sharding.memory_analysis(fn, loss, model, big_x[:n], big_y[:n], *extra, mesh=mesh,
                                                      **kw)["peak"]
        lo, hi = sizes
        slope = {k: (peak[hi, k] - peak[lo, k]) / (hi - lo) for k in meshes}
        fixed = {k: peak[lo, k] - slope[k] * lo for k in meshes}
        fits = {k: int((budget_gb * 1e9 - fixed[k]) / slope[k]) if slope[k] > 0 else float("inf") for k in meshes}
        for n in sizes:
            tail = (f"{slope[1]:10.1f} / {slope[d]:9.1f} {fixed[1] / 1e6:8.2f} / {fixed[d] / 1e6:7.2f} "
                    f"{fits[1]:>14,} / {fits[d]:>13,} {fits[d] / fits[1]:5.2f}x" if n == hi else "")
            lines.append(f"{name:18s} {n:7d} {peak[n, 1] / 1e6:12.1f} {peak[n, d] / 1e6:13.1f} "
                         f"{peak[n, d] / peak[n, 1]:6.2f} {tail}")
    lines.append(f"per-example bytes per device scale as 1/{d}; the fixed part (parameters, one chunk) does not, "
                 f"so the peak ratio tends to 1/{d} as N grows and the largest N that fits grows about {d}x.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
