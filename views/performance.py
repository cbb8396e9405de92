"""Performance: Python loop of jax.grad vs vmap(grad) vs one batch gradient vs streamed norms, timed live."""

import time

import pandas as pd
import streamlit as st

from gradlab import bench, costs, engine, memory, ui
from gradlab.experiment import fit, init_model, load_data
from gradlab.losses import loss_for
from gradlab.ui.figures import plots

st.title("Performance")
ui.intro(
    "Seed 003 times per-example gradients with a Python loop against `vmap(grad)`. Here the same race runs "
    "live on this machine, with two more contenders: **one batch gradient** (the cost floor: what training "
    "pays anyway) and **streamed per-example norms** (what DP clipping and outlier detection actually need).",
    "Each approach is timed at several batch sizes N; the first call (tracing + XLA compilation for that "
    "shape) is reported apart from the steady-state run time. Timings are wall-clock on a shared CPU: "
    "read the ratios, not the last digit."
)
MACHINE = bench.machine()
st.caption(f"Runs on {MACHINE}; with several devices the engine splits the examples over all of them.")

WORKLOADS = {"experiment": "Current experiment's model (sidebar, untrained weights)",
             "digits_mlp": "Benchmark: digits, MLP 64-256-256-10"}
SIZES = [4, 16, 64, 256, 1024]
DEFAULT_APPROACHES = ["loop", "vmap", "batch", "norms"]

figure = st.container()  # figure first: the timings above the controls that set them
c1, c2 = st.columns([3, 2])
with c1:
    workload = ui.choice(st.radio, "Workload", WORKLOADS, "perf_workload", horizontal=True)
    approaches = ui.control(st.multiselect, "Approaches", list(bench.APPROACHES), default=DEFAULT_APPROACHES,
                            format_func=bench.APPROACHES.get, key="perf_approaches")
with c2:
    sizes = ui.control(st.multiselect, "Batch sizes N", SIZES, default=[16, 64, 256], key="perf_sizes")
    repeats = ui.control(st.slider, "Timed runs per cell (median)", 1, 7, 2, key="perf_repeats")
    loop_max = ui.control(st.select_slider, "Run the Python loop up to N", options=[16, 64, 256, 1024], value=256,
                          key="perf_loop_max",
                          help="The loop is slow by design: skip it above this batch size.")

exp = ui.experiment()


@ui.shared(gated=False, persist=False)
def problem(workload, exp, _data=None):
    """(loss_fn, params, xs, ys) for the workload. Timing does not depend on trained weights.
    `_data`: an upload's dataset (its hash is in `exp.dataset`)."""
    if workload == "digits_mlp":
        return bench.digits_mlp()
    if exp.source.brings_model:  # a served model: its own loss and params (timing does not depend on the weights)
        f = fit(exp)
        return f.loss_fn, f.model, f.data.x_train, f.data.y_train
    data = _data if _data is not None else load_data(exp)
    return loss_for(data.task), init_model(exp, data), data.x_train, data.y_train


@ui.shared(gated=False)
def example_size(workload, exp, _problem) -> int:
    """Bytes one example's forward pass keeps for the backward (`memory.example_bytes`, traced, not run)."""
    return memory.example_bytes(*_problem)


loss_fn = params = xs = ys = None
with ui.guard("The workload could not be built", stop=True):
    upload_data = ui.data(exp) if workload == "experiment" else None  # loaded once per data key (an upload: its bytes)
    loss_fn, params, xs, ys = problem(workload, exp if workload == "experiment" else None, upload_data)
n_avail = int(xs.shape[0])
P = engine.num_params(params)
sizes = sorted({min(int(s), n_avail) for s in sizes})
path = engine.resolve_method("auto", loss_fn, params, xs, ys)
st.caption(f"{n_avail:,} examples available · P = {P:,} parameters · engine path for norms: "
           f"**{path}** ({'per-layer rules: ‖δᵢ‖·‖aᵢ‖' if path == 'ghost' else 'chunked vmap'})")

if not approaches or not sizes:
    st.info("Pick at least one approach and one batch size.")
    st.stop()

# Memory and time: each cell (an approach at one N) is checked against the memory budget per computation (N × P
# floats of per-example gradients, a convolution's activations), an approach that fits none of the chosen N runs at the
# largest N that fits (timed for every approach: common ratios), and the largest N go until a link's sweep fits the work
# budget (its compiling counted). `bench.plan_sweep` decides; this page says what it left out.
example_bytes = example_size(workload, exp if workload == "experiment" else None, (loss_fn, params, xs, ys))
forward = ui.macs(exp) if workload == "experiment" else 0  # the benchmark MLP: its P
link_seconds = costs.WORK_BUDGET_SECONDS - costs.PAGE_SECONDS
plan = bench.plan_sweep(approaches, sizes, P, n_available=n_avail, repeats=repeats, loop_max=loop_max,
                        example_bytes=example_bytes, macs=forward, seconds=link_seconds)
cells = plan.cells
skipped = []
for a in approaches:
    if over := {n for m, n in plan.over_memory if m == a}:
        within = [n for n in sizes if n not in over]
        skipped.append(f"{bench.APPROACHES[a]} above N = {max(within)}" if within
                       else f"{bench.APPROACHES[a]} at every chosen N")
if skipped:
    reduced = (f" So that every approach is on the figure, all of them are also timed at **N = {plan.reduced:,}**, the "
               f"largest N at which {', '.join(bench.APPROACHES[a] for a, ns in cells if ns == (plan.reduced,))} fits."
               if plan.reduced else "")
    st.warning(f"Over this server's {memory.mb(memory.BUDGET_BYTES)} memory budget per computation (P = {P:,} "
               f"parameters, {memory.mb(example_bytes)} of intermediates per example), these cells are skipped: {'; '.join(skipped)}.{reduced}", icon="⚠️")
if plan.over_time:
    st.info(f"N = {', '.join(f'{n:,}' for n in plan.over_time)} left out: with "
            f"{'it' if len(plan.over_time) == 1 else 'them'} the sweep would take more than the "
            f"{link_seconds:.2g} CPU-seconds a link may spend on it on this shared server (compiling each approach for "
            f"each N included; this one, about {plan.seconds:.2g}). Pick fewer approaches or batch sizes to time "
            f"{'it' if len(plan.over_time) == 1 else 'them'}.", icon=":material/timer:")


@ui.shared(label="Timing")
def timings(workload, exp, approach, ns, repeats, loop_max, attempt, machine, _problem, progress):
    """One approach's rows of the sweep, shared by sessions (one entry per approach, so adding or removing
    another approach reuses these); `attempt` > 0 measures again ("Run the sweep again"). Kept on disk under
    this machine's hardware (`bench.machine()`), so a restarted server shows what it measured before, with when."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return [dict(approach=t.approach, n=t.n, run_s=t.run_s, compile_s=t.compile_s, first_s=t.first_s, measured=when)
            for t in bench.sweep(*_problem, ns, [approach], repeats=repeats, loop_max=loop_max,
                                 progress=lambda f, text: progress(f, f"{bench.APPROACHES[approach]}: {text}"),
                                 # each N compiles anew: a large model's programs must not pile up (the loop's one
                                 # gradient is compiled once and kept)
                                 between=None if approach == "loop" else memory.release_memory)]


with ui.guard("The sweep does not fit this server's work budget", stop=True):
    if not all(timings.stored(workload, exp if workload == "experiment" else None, a, ns, repeats, loop_max,
                              st.session_state.get("_perf_attempt", 0), MACHINE, None) for a, ns in cells if ns):
        costs.check_work(plan.seconds, "This sweep",  # only when even the smallest sizes left do not fit
                         "Pick fewer approaches, batch sizes or timed runs, or run the Python loop only up to a smaller N.")

if st.button("Run the sweep again", help="Timings vary with the machine's load; measure again."):
    st.session_state["_perf_attempt"] = st.session_state.get("_perf_attempt", 0) + 1
rows = []
with ui.guard("The sweep failed"):
    for a, ns in cells:
        if ns:
            rows += timings(workload, exp if workload == "experiment" else None, a, ns, repeats, loop_max,
                            st.session_state.get("_perf_attempt", 0), MACHINE, (loss_fn, params, xs, ys))
if not rows:
    st.stop()
when = sorted({r["measured"] for r in rows})
st.caption(f"Timed on this machine at {when[0]}" + (f" to {when[-1]}" if len(when) > 1 else "") +
           " (kept for this hardware, also across restarts). **Run the sweep again** to time it now.")

labels = {a: bench.APPROACHES[a] for a in approaches}
n_top = max(r["n"] for r in rows)
at_top = {r["approach"]: r for r in rows if r["n"] == n_top}
n_loop = max((r["n"] for r in rows if r["approach"] == "loop"), default=None)
at_loop = {r["approach"]: r for r in rows if r["n"] == n_loop}
cell = {(r["approach"], r["n"]): r for r in rows}


def common_n(a: str, b: str) -> int | None:
    """The largest N at which both approaches were timed (a model too large for `vmap(grad)` at the chosen sizes
    times it, and every approach, at a reduced N too)."""
    both = [n for (x, n) in cell if x == a and (b, n) in cell]
    return max(both, default=None)

REFERENCE = bench.reference_timings()


def reference_rows() -> list[dict] | None:
    """The stored reference timings when this is the view they were measured on (the default experiment's workload)."""
    if REFERENCE is None or workload != "experiment" or exp != ui.DEFAULT:
        return None
    return REFERENCE["rows"]


def busy_note() -> None:
    """On a busy server, which timings are live and which are the reference."""
    busy = bench.load_per_core()
    if busy > 1 and reference_rows():
        st.warning(f"**This server is busy** (load {busy:.1f} per core): the **live** timings (solid lines, the first row "
                   "of numbers) wait for a core and can cross. The **reference** (dashed lines, the row marked "
                   "Reference) is the fastest of several whole sweeps: read the ratios there.", icon=":material/speed:")


def reference_row(at_loop: dict, n_loop: int | None, n_top: int) -> None:
    """Beside the live ratios, the same ratios from the stored reference timings (`bench.reference_timings`),
    for the view they were measured on: the default experiment's workload. On a busy server, which is which."""
    if not reference_rows():
        return
    ratios = [("vmap speed-up over loop", "loop", "vmap", n_loop, "×", "{:.0f}"),
              ("vmap / batch gradient", "vmap", "batch", n_top, "×", "{:.1f}"),
              ("streamed norms / batch gradient", "norms", "batch", n_top, "×", "{:.2f}")]
    shown = [(label, n, bench.reference_ratio(REFERENCE, a, b, n), unit, fmt) for label, a, b, n, unit, fmt in ratios
             if n is not None]
    shown = [row for row in shown if row[2] is not None]
    if not shown:
        return
    r = st.columns(4)
    for col, (label, n, (best, low, high), unit, fmt) in zip(r, shown):
        col.metric(f"Reference: {label}", fmt.format(best) + unit,
                   help=f"At N = {n}, from the fastest of {REFERENCE['sweeps']} whole sweeps; over the "
                        f"sweeps {fmt.format(low)}–{fmt.format(high)}{unit}.")
    quiet = max(REFERENCE["load"][0], REFERENCE["load"][3]) / REFERENCE.get("cores", 1)  # 1-minute, before and after
    r[3].caption(f"**Reference** (not live): {ui.inert(REFERENCE['machine'])}, {REFERENCE['measured']}, fastest of "
                 f"{REFERENCE['sweeps']} sweeps at load {quiet:.1f} per core (`python -m benchmarks.reference_timings`). "
                 "**Live**: the row above, timed on this server now.")


with figure:
    busy_note()
    left, right = st.columns(2)
    with left, ui.half_column():
        ui.chart(plots.timing_vs_n(rows, labels, reference=reference_rows()), width="stretch")
    with right, ui.half_column():
        if any(r["approach"] == "loop" for r in rows):
            ui.chart(plots.speedup_vs_loop(rows, labels), width="stretch")
        else:
            st.info("Add the Python loop to see speed-ups over it.")
    m = st.columns(4)
    if (n := common_n("loop", "vmap")) is not None:
        m[0].metric("vmap speed-up over loop", help=f"Loop time / vmap(grad) time at N = {n}.", value=
                    f"{cell['loop', n]['run_s'] / cell['vmap', n]['run_s']:.0f}×")
    if (n := common_n("vmap", "batch")) is not None:
        m[1].metric("vmap / batch gradient", f"{cell['vmap', n]['run_s'] / cell['batch', n]['run_s']:.1f}×",
                    help=f"At N = {n}: what materializing N×P per-example gradients costs on top of one gradient.")
    if (n := common_n("norms", "batch")) is not None:
        m[2].metric("streamed norms / batch gradient", f"{cell['norms', n]['run_s'] / cell['batch', n]['run_s']:.2f}×",
                    help=f"At N = {n}.")
    if (n := max((k for a, k in cell if a == "vmap"), default=None)) is not None:
        m[3].metric("vmap compile time", f"{cell['vmap', n]['compile_s'] * 1e3:.0f} ms",
                    help=f"At N = {n}: first call minus steady run: tracing + XLA compilation, paid once per shape.")
    reference_row(at_loop, n_loop, n_top)

table = pd.DataFrame(rows).drop(columns="measured").assign(approach=lambda d: d["approach"].map(bench.APPROACHES))
table["run ms"] = table.pop("run_s") * 1e3
table["compile ms (first − run)"] = table.pop("compile_s") * 1e3
table["first call ms"] = table.pop("first_s") * 1e3
st.dataframe(table.rename(columns={"n": "N"}), hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.2f") for c in ("run ms", "compile ms (first − run)", "first call ms")})

st.subheader(f"Memory at N = {n_top:,}")
mem_labels = [bench.APPROACHES[a] for a in approaches]
needed = [bench.memory_bytes(a, n_top, P) for a in approaches]
ui.chart(plots.memory_bars(mem_labels, needed), width="stretch")
st.markdown(
    f"Materialized per-example gradients hold **N × P × 4 bytes** = {n_top:,} × {P:,} × 4 = "
    f"**{n_top * P * 4 / 1e6:,.1f} MB** (all 1797 digits with the benchmark MLP: 611 MB). Streaming holds one chunk: "
    f"the engine sizes chunks to about {engine.CHUNK_BYTES / 2**20:.0f} MB of per-example gradients (at most "
    f"{engine.MAX_CHUNK} examples), here **{bench.memory_bytes('norms_vmap', n_top, P) / 1e6:,.1f} MB**, "
    "and the per-layer rules need no per-example gradient at all for dense, convolution and embedding weights."
)

with st.expander("Why vmap(grad) costs about one batch gradient plus the materialization", expanded=True):
    st.markdown(
        """
`vmap` does not run N programs. It rewrites `grad(loss)` for one example into one program for the whole
batch: every matrix-vector product of the forward and backward pass becomes a matrix-matrix product, exactly
the products of `grad(sum of losses)`. The one difference is at the end: the batch gradient *sums* the
weight gradients over examples inside one matmul (`δᵀ a`, P numbers out), while `vmap(grad)` must write
each example's outer product `δᵢ ⊗ aᵢ` separately: **N × P numbers**. So its cost is one batch gradient
plus writing N × P floats to memory, and for large N · P that write (and the memory it needs) dominates.

The Python loop instead pays a dispatch and many small matrix-vector products per example: no batching at all.

Norms need less: for a Linear layer ‖δᵢ ⊗ aᵢ‖ = ‖δᵢ‖ · ‖aᵢ‖ (Goodfellow 2015), so the streamed norms only need
δᵢ and aᵢ, which one backward pass already has: about the cost of one batch gradient, and no N × P anywhere.
"""
    )

ui.code_panel(
    """
import time, jax, jax.numpy as jnp, equinox as eqx
from gradlab import engine

params, static = eqx.partition(model, eqx.is_array)   # the model's arrays (differentiated) and the rest

def loss(params, x, y):                      # the loss of ONE example
    logits = eqx.combine(params, static)(x)
    return jax.nn.logsumexp(logits) - logits[y]

N = len(xs)
grad_one = jax.jit(jax.grad(loss))                                   # the loop's single-example gradient
loop    = lambda: [grad_one(params, xs[i], ys[i]) for i in range(N)]  # N calls from Python
vmapped = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))     # N x P per-example gradients
batch   = jax.jit(jax.grad(lambda p: jax.vmap(loss, (None, 0, 0))(p, xs, ys).sum()))

def timed(f, *args):
    t0 = time.perf_counter(); jax.block_until_ready(f(*args)); first = time.perf_counter() - t0   # trace + compile + run
    t0 = time.perf_counter(); jax.block_until_ready(f(*args)); run = time.perf_counter() - t0     # run only
    return first - run, run                                                                       # (compile, run)

compile_s, run_s = timed(vmapped, params, xs, ys)

# streamed norms with the per-layer rules (gradlab.rules): zero probes on each layer's output give δ_i
#   ‖∂ℓᵢ/∂W‖² = ‖δᵢ‖² ‖aᵢ‖²,  ‖∂ℓᵢ/∂b‖² = ‖δᵢ‖²
norms = engine.per_example_norms(loss, params, xs, ys)      # method="auto"
"""
)

# ---- Which path each parameter leaf takes (engine.explain; issue 10) ----
st.subheader("Which path each parameter takes")
st.markdown(
    "The engine reads the traced loss (its jaxpr) and gives every weight used once by a dense layer, a "
    "convolution or an embedding its **per-layer rule** (norms from the layer's input and output gradient, "
    "no per-example weight gradient); a bias or a scale used once on the activations gets one too (its output "
    "gradient summed over the broadcast axes). Every other leaf (tied weights, a penalty term, a weight inside "
    "a scan or a cond) **falls back**: it is differentiated per example, exactly, at the cost of its own size."
)
with ui.guard("The loss could not be traced to explain its paths"):
    ui.dataframe(pd.DataFrame(engine.explain(loss_fn, params, xs, ys)).astype({"shape": str}),  # a served model's leaves
                 hide_index=True, width="stretch")
