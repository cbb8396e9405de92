"""Memory a computation will need, stated before it runs, and a budget that refuses what does not fit.

A hosted gradlab is one Python process for every visitor (Streamlit Community Cloud: 690 MB in all).
Everything that holds N × P numbers, sweeps sizes or trains a large model asks here first; over the
budget it raises `OverBudget` (a `ValueError`, so the pages show it as a clear message) that names
the largest setting that fits. The estimates count the arrays the algorithm must hold by
construction (float32), with a factor for XLA's scratch copies measured on gradlab's models; they
are upper bounds for planning, not measurements.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import os
import sys
import threading
import time
from typing import Callable, Iterable, TypeVar

import jax

from gradlab import engine, escape, jaxprs
from gradlab.train import dp_buffer_size

log = logging.getLogger("gradlab")

MB = 2**20

#: Bytes one computation may hold (GRADLAB_COMPUTE_BUDGET_MB, default 96 MB): with the Python +
#: JAX + Streamlit baseline (~300 MB) and the caches this keeps a hosted server within 690 MB.
BUDGET_BYTES = int(float(os.environ.get("GRADLAB_COMPUTE_BUDGET_MB", "96")) * MB)

#: What XLA:CPU's compiler holds while it compiles one of the pages' larger programs, on top of the computation's
#: own bytes: measured on the Influence page's former L-BFGS for θ̂ (optax's zoom line search in one while loop:
#: 200–230 MB above the process, VmHWM; no XLA flag cut it). θ̂ now compiles at +33 MB; the largest rises measured
#: since are the first influence scores (+105 MB over their few programs) and a training scan (~+90 MB). The margin
#: is kept.
COMPILE_BYTES = 224 * MB

#: XLA keeps about two more copies of a materialized per-example gradient (the vmapped backward
#: pass's product and the output buffer) while it runs.
XLA_COPIES = 3

T = TypeVar("T")


class OverBudget(escape.Refusal):
    """A computation would need more memory than the budget. The message says what fits (gradlab's Markdown)."""


def mb(nbytes: float) -> str:
    """`nbytes` as a short string in MB (e.g. `"3,380 MB"`)."""
    return f"{nbytes / MB:,.0f} MB" if nbytes >= MB else f"{nbytes / MB:.2f} MB"


def per_example_grads_bytes(n: int, num_params: int, *, itemsize: int = 4) -> int:
    """Bytes to materialize N per-example gradients of P parameters with `vmap(grad)`:
    N × P × itemsize, times `XLA_COPIES` for XLA's working copies."""
    return int(n) * int(num_params) * itemsize * XLA_COPIES


def example_bytes(loss_fn: Callable, params, xs, ys, *, itemsize: int = 4) -> int:
    """Bytes one more example adds to a batched pass of `loss_fn` (one gradient of the summed loss keeps about this
    much per example for its backward pass): what `vmap(loss_fn)` computes at two examples minus at one
    (`jaxprs.value_count`: parameter-only values do not grow with the batch), times `itemsize`. Traced, not run.

    **Arguments** `loss_fn(params, x, y)`, `params`, `xs`, `ys` as the engine's (at least one example); `itemsize`:
    4 (float32) or 8 (float64). **Returns** bytes; seed 003's SimpleCNN: 366,504 values (1.47 MB in float32, the
    +1.3 MB per example its batch gradient's peak memory grows by; 2.9 MB in float64, measured +2.7 MB:
    benchmarks/RESULTS.md, "Equivalence on SimpleCNN"), the digits MLP 321."""
    def count(k):
        part = jax.tree.map(lambda v: v[:k], (xs, ys))
        return jaxprs.value_count(lambda x, y: jax.vmap(lambda a, b: loss_fn(params, a, b))(x, y), *part)

    n = int(jax.tree.leaves(xs)[0].shape[0])
    return int(itemsize) * (max(count(2) - count(1), 0) if n >= 2 else count(1))


def training_bytes(num_params: int, n_checkpoints: int) -> int:
    """Bytes to train a model of P parameters and keep its checkpoints: the checkpoints (P floats
    each) plus parameters, gradient and two optimizer moments (4 P floats)."""
    return (int(n_checkpoints) + 4) * int(num_params) * 4


def n_checkpoints(steps: int, every: int) -> int:
    """How many checkpoints training keeps: step 0, every `every` steps, and the last step."""
    steps, every = int(steps), max(int(every), 1)
    return steps // every + 1 + (1 if steps % every else 0)


def largest(candidates: Iterable[T], needed: Callable[[T], int], budget: int = BUDGET_BYTES) -> T | None:
    """The last of `candidates` (in increasing order) whose `needed(c)` fits the budget, else None."""
    best = None
    for c in candidates:
        if needed(c) <= budget:
            best = c
    return best


def check(what: str, needed: int, fix: str = "", budget: int = BUDGET_BYTES) -> None:
    """Raise `OverBudget` when `needed` bytes exceed `budget`.

    **Arguments** `what`: the computation ("Materializing 1024 per-example gradients"); `needed`:
    its estimated bytes; `fix`: the largest setting that fits, said as an instruction; `budget`.

    **Raises** `OverBudget` (a ValueError) whose message gives the need, the budget and `fix`.
    """
    if needed > budget:
        raise OverBudget(f"{what} would need about {mb(needed)}, over this server's {mb(budget)} budget per "
                         f"computation (one server serves everyone who opens the link). {fix}".strip())


#: Parameter-sized float32 vectors a DP-SGD step holds besides its chunks and checkpoints: the parameters, the
#: clipped sum, its noise, the update, Adam's two moments, and XLA's working copies of the sum and the update.
DP_SGD_VECTORS = 8


def dp_sgd_bytes(n: int, sample_rate: float, num_params: int, *, n_features: int = 0, checkpoints: int = 2) -> int:
    """Bytes of a DP-SGD run as `train.train_dp_sgd` runs it. The engine streams the padded Poisson batch
    buffer (`train.dp_buffer_size(N, q)` examples) in chunks of about `engine.CHUNK_BYTES` of intermediates (or
    one example's gradient, 4P bytes, when that is larger) and clips by norms it never materializes (ghost
    clipping): it holds `DP_SGD_VECTORS` + `checkpoints` P-vectors, one chunk (× `XLA_COPIES`), and the
    training set and the buffer's inputs (`n_features` floats each), never the buffer's per-example gradients.
    Checked against the peak resident memory of real runs in `benchmarks/RESULTS.md` ("DP-SGD's memory")."""
    p, m = int(num_params), dp_buffer_size(n, sample_rate)
    chunk = XLA_COPIES * max(engine.CHUNK_BYTES, 4 * p)
    return 4 * (DP_SGD_VECTORS + int(checkpoints)) * p + chunk + 4 * (int(n) + m) * int(n_features)


#: Parameter-sized float32 vectors each model of a vmapped ensemble holds while it trains: its parameters, gradient,
#: Adam's two moments and the update (`ensemble.train_stacked`).
ENSEMBLE_VECTORS = 5


def ensemble_bytes(num_params: int, models: int, n: int, n_classes: int, *, batch_size: int = 128,
                   width: int = 0) -> int:
    """Bytes of the record's ensemble (`memorization.ensemble_for`, the recipe's: M models trained at once): M ×
    `ENSEMBLE_VECTORS` P-vectors, each model's minibatch activations (`batch_size` × `width` floats, × `XLA_COPIES`),
    the M × N × K logits of its evaluation and the `(M, N)` outputs kept (losses, φ: 4 bytes; correct, mask: 1). A
    DP-SGD ensemble trains one model at a time (`dp_sgd_bytes`)."""
    m, p = int(models), int(num_params)
    return (4 * ENSEMBLE_VECTORS * m * p + 4 * XLA_COPIES * m * int(batch_size) * int(width)
            + 4 * m * int(n) * int(n_classes) + 10 * m * int(n))


def dp_checkpoint_every(n: int, sample_rate: float, num_params: int, steps: int, *, n_features: int = 0,
                        most: int = 10) -> int:
    """Steps between the checkpoints of a DP-SGD run (the points of its accuracy curve): about `most` intervals,
    fewer when their checkpoints would take the run past the budget (`dp_sgd_bytes`; seed 003's SimpleCNN on the
    Fashion subset keeps 2 intervals: 3 checkpoints of 4.6 MB), at least 1 interval (`steps`)."""
    steps = max(int(steps), 1)
    for k in range(min(most, steps), 0, -1):
        every = -(-steps // k)
        if dp_sgd_bytes(n, sample_rate, num_params, n_features=n_features,
                        checkpoints=n_checkpoints(steps, every)) <= BUDGET_BYTES:
            return every
    return steps


def largest_sample_rate(n: int, num_params: int, budget: int = BUDGET_BYTES, *, n_features: int = 0) -> float:
    """The largest sampling rate q (on a grid of 1/1000) whose DP-SGD step fits the budget (0 if none)."""
    rates = [k / 1000 for k in range(1, 1001)]
    return largest(rates, lambda q: dp_sgd_bytes(n, q, num_params, n_features=n_features), budget) or 0.0


def dp_sgd_fix(n: int, num_params: int, *, n_features: int = 0) -> str:
    """What to change when DP-SGD does not fit: the largest sampling rate that does, or a smaller model."""
    q = largest_sample_rate(n, num_params, n_features=n_features)
    return f"Use a sampling rate q ≤ {q:.3g} or a smaller model." if q else \
        f"Even q = 0.001 does not fit {num_params:,} parameters: use a smaller model."


#: θ̂'s L-BFGS-B keeps this many (s, y) pairs of P-vectors (SciPy's `maxcor`).
LBFGS_MEMORY = 10

#: float64 P-vectors θ̂'s L-BFGS-B holds at its peak, on the host: SciPy's workspace ((2·`LBFGS_MEMORY` + 5)·P)
#: and the copies of θ and ∇F that it and `influence.solvers.minimize` keep (42–43 measured with tracemalloc at
#: P = 20,000 and 40,962, the rest SciPy's fixed arrays).
LBFGS_VECTORS = 44

#: Test points TRAK's exact (k ≥ P) Gauss–Newton solve takes at once (`influence.scores.trak`).
TRAK_CG_BLOCK = 8

#: Right-hand sides an influence function's conjugate gradient vmaps together (`influence.solvers.inverse_hvp_batch`);
#: 1 solves them one after another in one compiled loop. On CPU one at a time is fastest: vmapped Hessian-vector
#: products hold block × N activations (16 × 5,000 × 128 floats ≈ 40 MB per hidden layer, out of cache), and the
#: MNIST-1D MLP's solves took 2–4× as long per point vmapped (`python -m benchmarks.cg_rows`, benchmarks/RESULTS.md).
IHVP_BLOCK = 1


def influence_bytes(num_params: int, proj_dim: int, n_models: int, n_checkpoints: int) -> int:
    """Bytes the influence scores hold at once for a model of P parameters (float32): TRAK's P × k
    Gaussian projection and its k × k kernel with two working copies (factorization, solve), or for
    k ≥ P the vectors of its matrix-free conjugate gradient (`TRAK_CG_BLOCK` test points at once), its
    ensemble of `n_models` models, TracIn's `n_checkpoints` checkpoints, θ̂'s L-BFGS-B (`LBFGS_VECTORS` float64
    P-vectors) and a few P-vectors of conjugate gradient.
    Per-example gradients are streamed in the engine's byte-sized chunks and not counted."""
    p, k = int(num_params), int(proj_dim)
    trak = p * k + 3 * k * k if k < p else 5 * p * TRAK_CG_BLOCK  # k ≥ P: conjugate gradient's 5 P-vectors per test point
    return 4 * (trak + p * (int(n_models) + int(n_checkpoints) + 2 * LBFGS_VECTORS + 6))


def influence_fix(num_params: int, proj_dims: Iterable[int], n_models: int, n_checkpoints: int) -> str:
    """What to change when the influence scores do not fit: the largest projection dimension k that
    does, or a smaller model (the largest P that fits with the smallest k)."""
    dims = sorted(proj_dims)
    k = largest(dims, lambda d: influence_bytes(num_params, d, n_models, n_checkpoints))
    if k:
        return f"Use a TRAK projection dimension k ≤ {k} (TRAK settings) or a smaller model."
    k = dims[0]  # the largest P with the smallest projected k: P·(k + models + checkpoints + …) + 3k² floats
    p_max = (BUDGET_BYTES // 4 - 3 * k * k) // (k + int(n_models) + int(n_checkpoints) + 2 * LBFGS_VECTORS + 6)
    return f"Use a model of at most {p_max:,} parameters (a smaller hidden width or fewer layers)."


# ---------------------------------------------------------------- hygiene on a small shared server


@functools.cache
def _libc():
    """glibc, loaded once: `ctypes.util.find_library` runs `ldconfig -p` in a subprocess, a fork of
    the whole server on every call, and memory is returned after every computation."""
    for name in ("libc.so.6", None):
        try:
            return ctypes.CDLL(name or ctypes.util.find_library("c"))
        except (OSError, TypeError):
            pass
    return None


def limit_malloc_arenas(arenas: int = 2, mmap_threshold: int = 1 << 20) -> None:
    """Cap glibc's malloc arenas (like `MALLOC_ARENA_MAX=2`): Streamlit runs each session's script in
    its own thread, and every thread arena keeps the memory its frees leave behind. And fix the mmap
    threshold (like `MALLOC_MMAP_THRESHOLD_`): glibc otherwise raises it to 32 MB after the first large
    free, so XLA's big temporary buffers land in the heap and its fragments stay resident; at a fixed
    1 MB they are mapped and unmapped, and a computation's peak leaves when it ends."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(-8, int(arenas))  # M_ARENA_MAX
        libc.mallopt(-3, int(mmap_threshold))  # M_MMAP_THRESHOLD


#: XLA:CPU flags that lower what compiling holds and costs, where the installed jaxlib has them: jaxlib 0.10's loop
#: emitters instead of its fusion emitters. Seed 003's SimpleCNN on JAX 0.10.2, rise of the peak RSS: training +258 MB
#: against +363, a norms pass +32 against +102, a projection pass +51 against +107; compiling takes 20–45% less CPU and
#: the compiled programs run in about the same time (benchmarks/RESULTS.md). The numbers are the same (the tests pass
#: with them on). jaxlib 0.11.2 and 0.12 have no such switch (fusion emitters only). GRADLAB_LEAN_XLA=0 keeps XLA's
#: defaults.
LEAN_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false",)


_LEAN_LOCK = threading.Lock()


def lean_compiles() -> bool:
    """Add `LEAN_XLA_FLAGS` to this process's `XLA_FLAGS` (children inherit them) when the installed jaxlib knows
    them. XLA reads the variable once, as its first backend starts: call this before the first computation (the
    app's server does, from app.py), or the flags reach only child processes. XLA aborts a process whose `XLA_FLAGS`
    holds a flag it does not know, so the flags are tried first in a child process (about a second, once per
    process, however many threads ask at once: a room's 30 first script runs started 30 such children, 2.4 GB, before
    this lock). Returns whether the flags are in `XLA_FLAGS` now."""
    with _LEAN_LOCK:
        return _lean_compiles()


@functools.cache
def _lean_compiles() -> bool:
    flags = os.environ.get("XLA_FLAGS", "")
    missing = [f for f in LEAN_XLA_FLAGS if f.split("=")[0] not in flags]
    if not missing:
        return all(f in flags for f in LEAN_XLA_FLAGS)
    if os.environ.get("GRADLAB_LEAN_XLA", "1") == "0":
        return False
    import subprocess

    env = {**os.environ, "XLA_FLAGS": " ".join(missing), "JAX_PLATFORMS": "cpu"}
    try:
        ok = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True,
                            timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    if ok:
        os.environ["XLA_FLAGS"] = " ".join([flags, *missing]).strip()
    log.info("lean XLA compiles (%s): %s", " ".join(missing), "on" if ok else "this jaxlib does not have them")
    return ok


lean_compiles.cache_clear = _lean_compiles.cache_clear  # the tests start again from a process that never asked


#: Above this resident size (MB) the compiled-function caches are dropped after a computation.
#: Compiled XLA executables are what fills a long-running server (~280 MB for one tour of all
#: pages); dropping them costs a recompile later, never a wrong result. Set
#: GRADLAB_MEMORY_BUDGET_MB=0 to disable (e.g. on a laptop with plenty of memory).
MEMORY_BUDGET_MB = float(os.environ.get("GRADLAB_MEMORY_BUDGET_MB", "400"))


def _status_mb(field: str) -> float:
    """A memory field of /proc/self/status (`VmRSS`, `VmHWM`) in MB; 0 where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def rss_mb() -> float:
    """This process's resident set size in MB (Linux /proc; 0 elsewhere)."""
    return _status_mb("VmRSS")


_FROZEN_MODULES = 0


def freeze_imported_heap() -> None:
    """Take the objects that modules hold out of the garbage collector's full passes (`gc.freeze()`),
    once after every new import.

    Streamlit runs `gc.collect(2)` after every script run, a follow-mode poll included
    (`runner.postScriptGC`). With JAX, SciPy and Plotly imported that walks ~300,000 long-lived objects:
    0.2–0.5 s under the GIL per run, half the server's time when 30 students follow a lecture (py-spy,
    `benchmarks/crowd.py` scenario 5). Frozen objects are still freed by reference counting; only a
    reference cycle among them would stay, and module-level objects live as long as the server anyway.
    Called at the end of every script run (app.py); it collects and freezes only when `sys.modules` grew (a
    page imported something new), so a session's own objects are frozen at most a few times per server.
    """
    global _FROZEN_MODULES
    if len(sys.modules) > _FROZEN_MODULES:
        _FROZEN_MODULES = len(sys.modules)
        collect_everything()
        gc.freeze()


#: Seconds between two of `release_memory`'s full collections (`collect_everything`), visitors waiting or not: each
#: holds the GIL for 0.3–0.5 s, which stalls every visitor's page and the server's sending. Before and after every
#: computation they took 9.4 s of a 47 s run of ten changes at once (py-spy, `benchmarks/crowd.py` scenario 2).
FULL_COLLECT_EVERY_S = float(os.environ.get("GRADLAB_FULL_COLLECT_EVERY_S", "60"))
_LAST_FULL = [float("-inf")]  # time.monotonic() of the last full collection


def collect_everything() -> None:
    """A full `gc.collect()` that also reaches the frozen objects, which stay frozen afterwards.

    `freeze_imported_heap` freezes whatever is alive at that moment, the sessions of a crowd included; what of
    theirs later becomes cyclic garbage would otherwise never be freed (26 MB after a cold crowd of 60,
    `benchmarks/crowd.py` scenario 1). Takes ~0.3–0.5 s under the GIL, so it runs only on a new import and, at
    most every `FULL_COLLECT_EVERY_S`, when the memory budget drops compiled programs (`release_memory`)."""
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    gc.collect()
    if frozen:
        gc.freeze()
    _LAST_FULL[0] = time.monotonic()


def peak_rss_mb(reset: bool = False) -> float:
    """This process's peak resident set size in MB since start or the last `reset=True` (Linux `VmHWM`;
    resetting writes 5 to /proc/self/clear_refs). 0 where /proc is missing. For per-computation peaks in logs."""
    if reset:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        return 0.0
    return _status_mb("VmHWM")


def _trim() -> None:
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


#: A compile of at least this many seconds returns its scratch memory at once (`trim_after_compiles`).
TRIM_AFTER_COMPILE_S = 0.25
#: JAX's event (`jax.monitoring`) for the duration of one XLA compile, recorded in the compiling thread.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@functools.cache
def trim_after_compiles() -> None:
    """Return an XLA compile's freed scratch memory to the OS as soon as the compile ends, before the program first
    runs (`malloc_trim(0)` from JAX's `backend_compile_duration` event, for compiles of `TRIM_AFTER_COMPILE_S` or
    more). `release_memory` trims after a computation, but a program's first call compiles and then runs at once,
    so its run's buffers came on top of the compile's leftovers: SimpleCNN's training segment on JAX 0.12 peaked
    +207 MB over the RSS before its first call, with this +125 (benchmarks/RESULTS.md, issue 40, session 42). Once
    per process (the app's server, `python -m gradlab.ui.warm`); a no-op without glibc."""
    import jax.monitoring

    def trim(event: str, duration_secs: float, **_) -> None:
        if event == COMPILE_EVENT and duration_secs >= TRIM_AFTER_COMPILE_S:
            _trim()

    jax.monitoring.register_event_duration_secs_listener(trim)


def release_memory(force: bool = False, *, full: bool | None = None) -> None:
    """After a computation: return freed heap pages to the OS (`malloc_trim(0)`: an XLA compile
    leaves ~70 MB of freed scratch memory behind) and, over `MEMORY_BUDGET_MB` (or with `force`), drop
    JAX's compiled functions (`jax.clear_caches()`), which other sessions simply recompile when they need them,
    and collect what that left as cyclic garbage: an ordinary collection (milliseconds: the imported heap is
    frozen), and a full one (`collect_everything`) when `full`, or (`full=None`) when none ran in the last
    `FULL_COLLECT_EVERY_S` (the gate's before and after every job, `ui.cache`)."""
    _trim()
    if force or (MEMORY_BUDGET_MB and rss_mb() > MEMORY_BUDGET_MB):
        before = rss_mb()
        jax.clear_caches()
        if full or (full is None and time.monotonic() - _LAST_FULL[0] >= FULL_COLLECT_EVERY_S):
            collect_everything()
        else:
            gc.collect()
        _trim()
        log.info("memory budget %.0f MB: dropped compiled functions, RSS %.0f -> %.0f MB",
                 MEMORY_BUDGET_MB, before, rss_mb())


limit_malloc_arenas()
