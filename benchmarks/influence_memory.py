"""What the Influence page's first computations cost in memory, and how θ̂ compares with optax's L-BFGS.

Each measurement runs in a fresh process (a compile's memory depends on what the process compiled before): the
experiment is trained, its heap trimmed (`malloc_trim`) and the peak reset (`/proc/self/clear_refs`), then one
stage runs and the rise of VmHWM over the RSS before it is printed.

- `theta`: θ̂ by `influence.solvers.minimize` (SciPy's L-BFGS-B around one jitted value-and-gradient program);
- `theta-optax`: θ̂ by optax's L-BFGS (zoom line search) inside one `lax.while_loop`, as gradlab did before;
- `scores`: `influence.fitted.score_test_points` at θ̂ (every registered method that needs no ensemble).

`--compare` instead converges θ̂ both ways on four experiments (warm: the second call of each) and prints the
iterations, ‖∇F(θ̂)‖, F(θ̂), the wall time and ‖θ̂ − θ̂_optax‖ / ‖θ̂_optax‖.

    python -m benchmarks.influence_memory              # the memory table (about 1 min on 2 cores)
    python -m benchmarks.influence_memory --compare
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import subprocess
import sys
import time

EXPERIMENTS = {  # name: (Experiment fields, λ)
    "digits MLP (the page's default)": (dict(), 1e-2),
    "digits softmax, 10% flipped (the page test's)": (dict(model="linear", label_noise=0.1, steps=50,
                                                          checkpoint_every=25), 1e-2),
    "digits softmax, λ = 1e-4": (dict(model="linear"), 1e-4),
    "moons MLP, width 256": (dict(dataset="moons", width=256, steps=50, checkpoint_every=25), 1e-2),
}


def _status() -> dict:
    return {line.split(":")[0]: int(line.split()[1]) // 1024 for line in open("/proc/self/status")
            if line.startswith(("VmRSS", "VmHWM"))}


def optax_minimum(loss_fn, params, xs, ys, l2: float, tol: float = 1e-6, max_iter: int = 500):
    """θ̂ as gradlab converged it before: optax.lbfgs (zoom line search) in one jitted `lax.while_loop`.
    Returns (params, iterations, ‖∇F‖)."""
    import jax.numpy as jnp

    p, k, g = _optax_program()(loss_fn, params, xs, ys, jnp.asarray(l2, jnp.float32), jnp.asarray(tol, jnp.float32),
                               jnp.asarray(max_iter))
    return p, int(k), float(g)


def _optax_program():
    """The jitted program of `optax_minimum`, built once (a second call with the same shapes runs compiled)."""
    if _OPTAX:
        return _OPTAX[0]
    import equinox as eqx
    import jax
    import optax
    import optax.tree_utils as otu

    from gradlab.train import objective

    @eqx.filter_jit
    def run(loss_fn, params, xs, ys, l2, tol, max_iter):
        diff, static = eqx.partition(params, eqx.is_inexact_array)
        f = lambda d: objective(loss_fn, eqx.combine(d, static), xs, ys, l2)  # noqa: E731
        opt = optax.lbfgs()
        value_and_grad = optax.value_and_grad_from_state(f)

        def step(carry):
            d, s = carry
            value, g = value_and_grad(d, state=s)
            updates, s = opt.update(g, s, d, value=value, grad=g, value_fn=f)
            return optax.apply_updates(d, updates), s

        def cond(carry):
            k = otu.tree_get(carry[1], "count")
            return (k == 0) | ((k < max_iter) & (otu.tree_norm(otu.tree_get(carry[1], "grad")) >= tol))

        d, s = jax.lax.while_loop(cond, step, (diff, opt.init(diff)))
        return eqx.combine(d, static), otu.tree_get(s, "count"), otu.tree_norm(jax.grad(f)(d))

    _OPTAX.append(run)
    return run


_OPTAX: list = []


def _stage(name: str) -> dict:
    """One stage in this (fresh) process: the VmHWM rise, seconds, and θ̂'s iterations and ‖∇F‖."""
    from gradlab.experiment import Experiment, fit
    from gradlab.influence import fitted as ifit

    f = fit(Experiment())
    xs, ys = ifit.arrays(f)
    base = ifit.optimum(f, 1e-2, max_iter=500) if name == "scores" else None
    ctx = ifit.context(f, {"l2": 1e-2, "damping": 1e-2}, base=base) if name == "scores" else None
    states = ({n: m.prepare(ctx) for n, m in ifit.METHODS.items() if not m.on_demand} if name == "scores" else None)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    open("/proc/self/clear_refs", "w").write("5")
    before = _status()["VmRSS"]
    started = time.perf_counter()
    out = {}
    if name == "theta":
        m = ifit.optimum(f, 1e-2, max_iter=500)
        out = dict(iterations=m.iterations, grad_norm=m.grad_norm)
    elif name == "theta-optax":
        _, k, g = optax_minimum(f.loss_fn, f.model, xs, ys, 1e-2)
        out = dict(iterations=k, grad_norm=g)
    else:
        ifit.score_test_points(ctx, (0,), states=states)
    return dict(out, rise=_status()["VmHWM"] - before, before=before, seconds=time.perf_counter() - started)


def _compare() -> None:
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    from gradlab.experiment import Experiment, fit
    from gradlab.influence import fitted as ifit
    from gradlab.influence import solvers
    from gradlab.train import objective

    print("| experiment, λ | L-BFGS | iterations | ‖∇F(θ̂)‖ | F(θ̂) | s (warm) | ‖θ̂ − θ̂_optax‖ / ‖θ̂_optax‖ |")
    print("|---|---|---|---|---|---|---|")
    flat = lambda p: ravel_pytree(solvers.split(p)[0])[0]  # noqa: E731
    for name, (fields, l2) in EXPERIMENTS.items():
        f = fit(Experiment(**fields))
        xs, ys = ifit.arrays(f)
        rows = {}
        for how in ("optax", "SciPy L-BFGS-B"):
            for _ in range(2):  # the second call is warm: compiled
                started = time.perf_counter()
                if how == "optax":
                    p, k, g = optax_minimum(f.loss_fn, f.model, xs, ys, l2)
                else:
                    m = solvers.minimize(f.loss_fn, f.model, xs, ys, l2=l2, max_iter=500)
                    p, k, g = m.params, m.iterations, m.grad_norm
                seconds = time.perf_counter() - started
            rows[how] = (p, k, g, float(objective(f.loss_fn, p, xs, ys, l2)), seconds)
        ref = flat(rows["optax"][0])
        for how, (p, k, g, value, seconds) in rows.items():
            shift = float(jnp.linalg.norm(flat(p) - ref) / jnp.linalg.norm(ref))
            print(f"| {name}, {l2:g} | {how} | {k} | {g:.1e} | {value:.7f} | {seconds:.2f} | {shift:.1e} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--compare", action="store_true", help="θ̂ by optax and by L-BFGS-B on four experiments")
    ap.add_argument("--repeats", type=int, default=2, help="fresh processes per stage")
    args = ap.parse_args()
    if args.stage:
        print(json.dumps(_stage(args.stage)))
        return
    if args.compare:
        _compare()
        return
    print("| stage (fresh process) | VmHWM rise MB | RSS before MB | s | θ̂ iterations, ‖∇F‖ |")
    print("|---|---|---|---|---|")
    for stage in ("theta-optax", "theta", "scores"):
        for _ in range(args.repeats):
            run = subprocess.run([sys.executable, "-m", "benchmarks.influence_memory", "--stage", stage],
                                 capture_output=True, text=True, check=True)
            r = json.loads(run.stdout.strip().splitlines()[-1])
            theta = f"{r['iterations']}, {r['grad_norm']:.1e}" if "iterations" in r else "–"
            print(f"| {stage} | +{r['rise']} | {r['before']} | {r['seconds']:.1f} | {theta} |", flush=True)


if __name__ == "__main__":
    main()
