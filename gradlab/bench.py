"""Timing harness: Python loop vs `vmap(grad)` vs one batch gradient vs streamed norms.

Seed 003's comparison made honest: every approach is timed on the same model and data, the first
call (trace + XLA compile + run) is kept apart from the steady-state run time (median of
repeats), and memory is reported two ways: what the approach must hold by construction
(N × P × 4 bytes for materialized per-example gradients, chunk × P × 4 streamed) and what XLA's
buffer assignment actually allocated for the compiled program (temporaries + outputs).

    python -m gradlab.bench            # digits (N=1797), MLP 64-256-256-10, one run

Approaches (keys of `APPROACHES`):

- `loop`: `engine.loop_per_example_grads`, a Python loop of a jitted `jax.grad`, then stacked.
- `vmap`: `engine.per_example_grads(method="vmap")`, `vmap(grad)`, the N × P result materialized.
- `rules`: `engine.per_example_grads(method="ghost")`, the same N × P result from per-layer rules.
- `batch`: `engine.batch_grad`, one gradient of the summed loss (the cost floor).
- `norms_vmap`: `engine.per_example_norms(method="vmap")`, chunked `vmap(grad)` reduced to norms.
- `norms`: `engine.per_example_norms()` (method "auto": per-layer rules read from the traced loss).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from typing import Any, Callable, Iterable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_digits

from gradlab import costs, engine, losses, memory
from gradlab import sharding

APPROACHES = {
    "loop": "Python loop of jax.grad",
    "vmap": "vmap(grad): N×P per-example grads",
    "rules": "per-example grads from layer rules",
    "batch": "one batch gradient grad(sum)",
    "norms_vmap": "streamed norms, chunked vmap(grad)",
    "norms": "streamed norms (engine default)",
}

#: Materialize N × P (per-example gradients); the others hold at most chunk × P.
MATERIALIZED = ("loop", "vmap", "rules")


@dataclasses.dataclass(frozen=True)
class Timing:
    """One approach at one batch size N. Seconds; `compile_s` = first call − steady run."""

    approach: str
    n: int
    first_s: float
    run_s: float
    repeats: int

    @property
    def compile_s(self) -> float:
        return max(self.first_s - self.run_s, 0.0)


def _block(tree):
    return jax.block_until_ready(tree)


def runner(approach: str, loss_fn: Callable, params: Any, xs: Any, ys: Any, *,
           chunk_size: int | None = None) -> Callable[[], Any]:
    """A zero-argument function that runs `approach` once and waits for the result.

    **Raises** `ValueError` for an unknown approach, or `method="ghost"` on a model without rules.
    """
    e = engine
    table = {
        "loop": lambda: e.loop_per_example_grads(loss_fn, params, xs, ys),
        "vmap": lambda: e.per_example_grads(loss_fn, params, xs, ys, method="vmap"),
        "rules": lambda: e.per_example_grads(loss_fn, params, xs, ys, method="ghost"),
        "batch": lambda: e.batch_grad(loss_fn, params, xs, ys),
        "norms_vmap": lambda: e.per_example_norms(loss_fn, params, xs, ys, chunk_size=chunk_size, method="vmap"),
        "norms": lambda: e.per_example_norms(loss_fn, params, xs, ys, chunk_size=chunk_size),
    }
    if approach not in table:
        raise ValueError(f"unknown approach {approach!r}; choose from {', '.join(APPROACHES)}")
    fn = table[approach]
    return lambda: _block(fn())


def time_approach(approach: str, loss_fn: Callable, params: Any, xs: Any, ys: Any, *,
                  repeats: int = 3, chunk_size: int | None = None) -> Timing:
    """Time `approach` on (xs, ys): the first call, then the median of `repeats` more calls.

    **Arguments** `loss_fn`, `params`, `xs`, `ys` as the engine (N examples, axis 0 first);
    `repeats` ≥ 1 steady-state runs; `chunk_size` for the streamed approaches.

    **Returns** a `Timing` (seconds). The first call includes tracing and XLA compilation for this
    shape; the loop compiles its single-example gradient once, at its first N.

    **Raises** `ValueError` for an unknown approach or repeats < 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be ≥ 1, got {repeats}")
    fn = runner(approach, loss_fn, params, xs, ys, chunk_size=chunk_size)
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return Timing(approach, int(jax.tree.leaves(xs)[0].shape[0]), first, statistics.median(runs), repeats)


def sweep(loss_fn: Callable, params: Any, xs: Any, ys: Any, sizes: Sequence[int],
          approaches: Iterable[str] = ("loop", "vmap", "batch", "norms"), *, repeats: int = 3,
          chunk_size: int | None = None, loop_max: int | None = None,
          progress: Callable[[float, str], None] | None = None,
          between: Callable[[], None] | None = None) -> list[Timing]:
    """Time every approach at every batch size N (the first N examples of xs, ys).

    **Arguments** as `time_approach`, plus `sizes` (each 1 ≤ N ≤ len(xs)), `loop_max` (skip the
    slow loop above this N; None = never skip), `progress(fraction, text)` called after each cell, `between()`
    called between two cells (the Performance page returns memory there: `memory.release_memory`; every cell's shape
    compiles anew, so a large model's programs need not pile up).

    **Returns** a list of `Timing`, in order of sizes then approaches.

    **Raises** `ValueError` for a size outside [1, len(xs)] or an unknown approach.
    """
    n_max = int(jax.tree.leaves(xs)[0].shape[0])
    approaches = list(approaches)
    for a in approaches:
        if a not in APPROACHES:
            raise ValueError(f"unknown approach {a!r}; choose from {', '.join(APPROACHES)}")
    sizes = [int(s) for s in sizes]
    bad = [s for s in sizes if not 1 <= s <= n_max]
    if bad:
        raise ValueError(f"batch sizes must be between 1 and {n_max} (the examples available), got {bad}")
    cells = [(n, a) for n in sizes for a in approaches if not (a == "loop" and loop_max and n > loop_max)]
    out = []
    for i, (n, a) in enumerate(cells):
        sub = jax.tree.map(lambda v: v[:n], (xs, ys))
        if progress:
            progress(i / len(cells), f"{APPROACHES[a]} at N = {n}")
        if between is not None and i:
            between()
        out.append(time_approach(a, loss_fn, params, *sub, repeats=1 if a == "loop" else repeats,
                                 chunk_size=chunk_size))
    if progress:
        progress(1.0, "done")
    return out


def machine() -> str:
    """This machine's hardware in one line (CPU model, core count, JAX devices), e.g.
    `"AMD EPYC 7B13 · 2 cores · 1 × cpu (backend cpu, 1 process)"`.

    Timings are facts about a machine: the Performance page keys its stored sweeps on this line, so a
    restarted server on the same hardware shows the sweep it measured before, and other hardware never does.
    """
    cpu = platform.machine()  # not `platform.processor()`: it runs `uname -p` in a child process of the server
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu} · {os.cpu_count()} cores · {sharding.describe_devices()}"


#: Reference timings of the Performance page's default view, measured on a quiet machine by
#: `python -m benchmarks.reference_timings` (the lecture's step 4 shows them beside the live ones).
REFERENCE_PATH = os.path.join(os.path.dirname(__file__), "data", "reference_timings.json")


def reference_timings(path: str = REFERENCE_PATH) -> dict | None:
    """The stored reference timings (`machine`, `measured`, `load`, `sweeps`, `workload`, `rows`: one per approach and
    N with `min_s`, `median_s`, `max_s` over the sweeps), or None when there are none."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def reference_ratio(ref: dict, num: str, den: str, n: int) -> tuple[float, float, float] | None:
    """`num`'s time over `den`'s at N = `n` in the reference: (from the fastest runs, lowest, highest over the sweeps;
    the extremes pair one approach's slowest sweep with the other's fastest). None when a cell is missing."""
    cell = {(r["approach"], r["n"]): r for r in ref.get("rows", [])}
    a, b = cell.get((num, n)), cell.get((den, n))
    if a is None or b is None:
        return None
    return a["min_s"] / b["min_s"], a["min_s"] / b["max_s"], a["max_s"] / b["min_s"]


def load_per_core() -> float:
    """The 1-minute load average per core (over 1: processes wait for a core, and live timings are noise)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


def memory_bytes(approach: str, n: int, num_params: int, chunk_size: int | None = None,
                 bytes_per_float: int = 4, example_bytes: int = 0) -> int:
    """What `approach` must hold by construction, in bytes.

    Materialized per-example gradients (loop, vmap, rules): N × P × 4. Chunked vmap norms:
    min(chunk, N) × P × 4 (one chunk of per-example gradients; XLA may fuse even that away); with
    chunk None the engine sizes chunks by `engine.CHUNK_BYTES`, so at most that much.
    Batch gradient and rule-based norms: P × 4 (one gradient / no per-example gradient at all).
    With `example_bytes` (`memory.example_bytes`: what one example's forward keeps for the backward pass), the
    passes over the whole batch at once (`vmap(grad)`, the batch gradient) add N × that: a convolution's
    activations (seed 003's SimpleCNN: 1.47 MB per example, 375 MB for the batch gradient at N = 256).
    """
    whole = n * int(example_bytes) if approach in ("vmap", "batch") else 0
    if approach in MATERIALIZED:
        return n * num_params * bytes_per_float + whole
    if approach == "norms_vmap":
        if chunk_size is None:
            return min(n * num_params * bytes_per_float, max(engine.CHUNK_BYTES, num_params * bytes_per_float))
        return min(chunk_size, n) * num_params * bytes_per_float
    return num_params * bytes_per_float + whole


def cell_bytes(approach: str, n: int, num_params: int, example_bytes: int = 0) -> int:
    """What the Performance page checks against `memory.BUDGET_BYTES` for one cell: what `approach` holds by
    construction (`memory_bytes`) times `memory.XLA_COPIES` (XLA's working copies of per-example gradients), plus the
    whole batch's intermediates for `vmap(grad)` and the batch gradient (N × `example_bytes`, kept once)."""
    whole = n * int(example_bytes) if approach in ("vmap", "batch") else 0
    return memory.XLA_COPIES * memory_bytes(approach, n, num_params) + whole


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """The Performance page's sweep, planned before it runs (`plan_sweep`).

    `cells`: `(approach, (N, ...))` to time; `reduced`: the N added for approaches that fit none of the chosen sizes
    (None: none added); `over_memory`: `(approach, N)` left out for memory; `over_time`: the sizes N left out (every
    approach) so that the sweep fits `seconds`; `seconds`: the estimate of what runs (`costs.timing_seconds`)."""

    cells: tuple
    reduced: int | None
    over_memory: tuple
    over_time: tuple
    seconds: float


def plan_sweep(approaches: Sequence[str], sizes: Sequence[int], num_params: int, *, n_available: int,
               repeats: int, loop_max: int, example_bytes: int = 0, macs: int = 0,
               budget_bytes: int = memory.BUDGET_BYTES, seconds: float = float("inf")) -> SweepPlan:
    """Which cells of the sweep run: every chosen `(approach, N)` whose memory (`cell_bytes`) fits `budget_bytes`;
    for an approach that fits none of the chosen sizes, the largest N ≤ `n_available` that fits it (`reduced`),
    timed for every approach, so its ratios have a common N (seed 003's SimpleCNN: `vmap(grad)` and the loop at
    N = 6); then, while the estimate (`costs.timing_seconds`, compiling included) passes `seconds`, the largest
    chosen N goes, for every approach (never the reduced N). **Returns** a `SweepPlan`."""
    p = int(num_params)
    fits = lambda a, n: cell_bytes(a, n, p, example_bytes) <= budget_bytes  # noqa: E731
    sizes = sorted({min(int(n), int(n_available)) for n in sizes})
    over_memory = tuple((a, n) for a in approaches for n in sizes if not fits(a, n))
    lost = [a for a in approaches if not any(fits(a, n) for n in sizes)]
    reduced = None
    if lost:
        top = min(int(n_available), max(sizes) if sizes else 1)
        reduced = next((n for n in range(top, 0, -1) if all(fits(a, n) for a in lost)), None)
    with_reduced = sorted(set(sizes) | ({reduced} if reduced else set()))

    def cells(drop=()):
        return tuple((a, tuple(n for n in with_reduced if fits(a, n) and n not in drop)) for a in approaches)

    def estimate(c):
        return costs.timing_seconds(p, [(a, [n for n in ns if a != "loop" or n <= loop_max]) for a, ns in c],
                                    repeats=repeats, macs=macs)

    dropped = []
    while estimate(cells(dropped)) > seconds:
        left = [n for n in sizes if n not in dropped and n != reduced]
        if not left:
            break
        dropped.append(max(left))
    c = cells(dropped)
    return SweepPlan(c, reduced, over_memory, tuple(sorted(dropped)), estimate(c))


# ---------------------------------------------------------------- the standard workload


def digits_mlp(seed: int = 0, width: int = 256, depth: int = 2):
    """The benchmark workload: all 1797 digits (standardized 8×8 → 64 features), MLP 64-256-256-10.

    **Returns** `(loss_fn, model, xs (1797, 64) float32, ys (1797,) int32)`.
    """
    x, y = load_digits(return_X_y=True)
    x = (x - x.mean(0)) / np.maximum(x.std(0), 1e-8)
    model = eqx.nn.MLP(64, 10, width, depth, activation=jax.nn.relu, key=jax.random.key(seed))
    return losses.cross_entropy, model, jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32)


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if b < 1000 or unit == "GB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1000
    return f"{b:.1f} GB"


def run_benchmark(*, repeats: int = 5, sizes: Sequence[int] = (16, 64, 256, 1024),
                  chunk_size: int | None = None, seed: int = 0) -> str:
    """Run the full benchmark on `digits_mlp()` and return the printed report.

    Headline at N = 1797: every approach's steady time, ratio to one batch gradient, first-call
    (compile) time, and memory (by construction and XLA's allocation); then the scaling sweep.
    """
    loss_fn, model, xs, ys = digits_mlp(seed)
    n = int(xs.shape[0])
    p = engine.num_params(model)
    lines = [
        f"gradlab.bench: digits N={n}, MLP 64-256-256-10 (P={p:,}), chunk={chunk_size or 'by bytes'}, "
        f"{sharding.describe_devices()}, jax {jax.__version__}; "
        f"median of {repeats} runs after a first (compiling) call",
        f"{'approach':38s} {'run ms':>9s} {'/ batch':>8s} {'first call ms':>14s} "
        f"{'needs (N×P×4 or chunk×P×4)':>27s} {'XLA temp+out':>13s}",
    ]
    timings = {a: time_approach(a, loss_fn, model, xs, ys, repeats=1 if a == "loop" else repeats,
                                chunk_size=chunk_size) for a in APPROACHES}
    base = timings["batch"].run_s
    for a, t in timings.items():
        mem = engine.xla_memory(a, loss_fn, model, xs, ys, chunk_size=chunk_size)
        xla = "-" if mem is None else _fmt_bytes(mem["temp"] + mem["output"])
        lines.append(f"{APPROACHES[a]:38s} {t.run_s * 1e3:9.1f} {t.run_s / base:7.2f}x {t.first_s * 1e3:14.0f} "
                     f"{_fmt_bytes(memory_bytes(a, n, p, chunk_size)):>27s} {xla:>13s}")
    lines.append(
        f"streamed norms / batch gradient: {timings['norms'].run_s / base:.2f}x (target ≤ 2x); "
        f"chunked vmap norms / batch gradient: {timings['norms_vmap'].run_s / base:.2f}x; "
        f"vmap / loop speed-up: {timings['loop'].run_s / timings['vmap'].run_s:.0f}x"
    )
    lines.append("")
    lines.append("Scaling sweep (ms; compile = first call − run):")
    sweep_approaches = ["loop", "vmap", "batch", "norms"]
    rows = sweep(loss_fn, model, xs, ys, sizes, sweep_approaches, repeats=max(1, repeats // 2),
                 chunk_size=chunk_size)
    lines.append(f"{'N':>6s} " + " ".join(f"{a + ' run':>12s} {a + ' compile':>14s}" for a in sweep_approaches))
    for size in sizes:
        cells = {t.approach: t for t in rows if t.n == size}
        lines.append(f"{size:6d} " + " ".join(
            f"{cells[a].run_s * 1e3:12.2f} {cells[a].compile_s * 1e3:14.0f}" for a in sweep_approaches))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="gradlab benchmark: loop vs vmap(grad) vs batch gradient vs streamed norms")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=None, help="examples per chunk (default: sized by bytes)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256, 1024])
    args = ap.parse_args(argv)
    print(run_benchmark(repeats=args.repeats, sizes=args.sizes, chunk_size=args.chunk))


if __name__ == "__main__":
    main()
