"""What a heavy computation costs in CPU-seconds, estimated before it runs, and the budget a shared link gets.

A shared server must not compute for minutes because someone opened a link, so every heavy computation
(training, the membership attack, the canary audit, retraining checks, the LDS) has an estimate here:
a fixed part (compiling, set-up) plus work divided by a rate. The rates were measured with
`python -m benchmarks.costs` on the 2-core CPU this project is built on (process CPU time, both cores);
that benchmark prints estimate / measured for each computation, so a slower host can re-calibrate.
Estimates aim at the right order of magnitude (within about 2×), not at exact timing.
"""

from __future__ import annotations

import math
import os

from gradlab import escape

#: CPU-seconds one visitor's settings may cost before a button is pressed (environment: GRADLAB_WORK_BUDGET_S).
WORK_BUDGET_SECONDS = float(os.environ.get("GRADLAB_WORK_BUDGET_S", "30"))

#: Training throughput, (steps × batch × parameters) per CPU-second, one batch gradient per step
#: (MLP 512×4 on digits, batch 2048: 5.1e10 per wall second on both cores).
TRAIN_RATE = 2.5e10
#: Convolutions reuse each weight at every position, so their work is the multiply-adds of a forward pass,
#: not P: CPU-seconds per (steps × batch × multiply-adds beyond P) at this rate (seed 003's SimpleCNN on
#: Fashion-MNIST, 1.2 M parameters and 12.0 M multiply-adds, channels-last: 500 steps of 16 in 21 CPU-s from a
#: cold process, its compiling included, i.e. 2.4 CPU-ms per example and step; its recipe since, 300 steps of 32, in
#: 23 CPU-s against 25 estimated; warm, a step costs ~1.7 CPU-ms per example at batch 16 to 64 alike).
CONV_TRAIN_RATE = 4.6e9
#: DP-SGD throughput with per-example gradients, (steps × expected batch × parameters) per CPU-second
#: (membership attack on the digits MLP: 18 models, 600 steps of 359 examples, 10.7 CPU-s).
DP_SGD_RATE = 2.6e9
#: DP-SGD's convolution work: CPU-seconds per (steps × expected batch × multiply-adds beyond P) at this rate, as
#: `CONV_TRAIN_RATE` for training (seed 003's SimpleCNN on Fashion-MNIST, qN = 256: 5.4 CPU-ms per expected
#: example and step; the padded Poisson buffer, the norms pass and the clipped backward pass included).
DP_SGD_CONV_RATE = 2.2e9
#: A training estimated above this many CPU-s (half the work budget: the page's own first view needs the rest) starts
#: from a button unless stored, so a link to a large model (seed 003's SimpleCNN, ~23 CPU-s) starts nothing heavy.
TRAIN_BUTTON_SECONDS = WORK_BUDGET_SECONDS / 2
#: What a cold page computes beside its gated computations (loading the data, tracing shapes, building figures and
#: tables): Gradient norms on seed 003's SimpleCNN, ~4 CPU-s. A link's work before a button is this plus theirs.
PAGE_SECONDS = 4.0
#: The norm summary's pass per example against a training step's (`summary_seconds`), and its compiling: 1 s plus
#: 1 s per 6 M multiply-adds of the forward pass (seed 003's SimpleCNN, 12 M: the fused pass, its predictions read
#: from the same forward pass, at 1.8 CPU-ms per example against a training step's 2.4 estimated; 250 examples in
#: 3.2 CPU-s from a cold process, 6,000 in 13.8; the digits MLP in ~1.1: `python -m benchmarks.costs --only norms`).
SUMMARY_FACTOR = 0.8
SUMMARY_SETUP_SECONDS = 1.0
SUMMARY_COMPILE_MACS = 6e6
#: Set-up per trained model in a membership attack (tracing a training scan, evaluating it).
MODEL_SETUP_SECONDS = 0.3
#: Canary audit: CPU-seconds per (run × step) for each canary; 2,048 gradient-canary trials share a run,
#: 256 input-canary trials share one.
AUDIT_STEP_SECONDS = {"gradient": 0.004, "input": 0.005}
AUDIT_TRIALS_PER_RUN = {"gradient": 2048, "input": 256}
#: L-BFGS on the whole training set: CPU-seconds per (iteration × example × parameter), and iterations a
#: retraining takes from the warm start (at most its cap).
LBFGS_RATE = 1.4e9
RETRAIN_ITERS = 100


def training_seconds(num_params: int, steps: int, batch_size: float, macs: int = 0) -> float:
    """Estimated CPU-seconds to train `num_params` parameters for `steps` minibatches of `batch_size`:
    2 s of compiling and set-up plus `steps · batch_size · num_params / TRAIN_RATE`, plus for a model whose
    forward pass takes `macs` multiply-adds (more than P: convolutions) `steps · batch_size · (macs − P) /
    CONV_TRAIN_RATE`."""
    per_example = num_params / TRAIN_RATE + max(int(macs) - int(num_params), 0) / CONV_TRAIN_RATE
    return 2.0 + steps * batch_size * per_example


def summary_seconds(num_params: int, n: int, macs: int = 0) -> float:
    """Estimated CPU-seconds of the Gradient norms page's summary (`summary.norm_summary`) over `n` examples:
    compiling (`SUMMARY_SETUP_SECONDS` plus `macs / SUMMARY_COMPILE_MACS`) plus per example `SUMMARY_FACTOR` times a
    training step's work (`training_seconds`' rates: the fused pass is a forward, a backward and the norms; the
    predictions come from its forward)."""
    per_example = num_params / TRAIN_RATE + max(int(macs) - int(num_params), 0) / CONV_TRAIN_RATE
    return SUMMARY_SETUP_SECONDS + int(macs) / SUMMARY_COMPILE_MACS + SUMMARY_FACTOR * n * per_example


def dp_sgd_seconds(num_params: int, steps: int, batch_size: float, macs: int = 0) -> float:
    """Estimated CPU-seconds of one DP-SGD run (per-example gradients, clipped): `MODEL_SETUP_SECONDS` plus
    `steps · batch_size · num_params / DP_SGD_RATE`, plus for a model whose forward pass takes `macs`
    multiply-adds (more than P: convolutions) `steps · batch_size · (macs − P) / DP_SGD_CONV_RATE`.
    `batch_size` is the expected batch `q · N`."""
    per_example = num_params / DP_SGD_RATE + max(int(macs) - int(num_params), 0) / DP_SGD_CONV_RATE
    return MODEL_SETUP_SECONDS + steps * batch_size * per_example


def clipping_seconds(num_params: int, n: int, passes: int, macs: int = 0) -> float:
    """Estimated CPU-seconds of the DP clipping page's analysis (`clipping.clipping_analysis`): `passes` weighted
    backward passes (`clipping.analysis_passes`) over all `n` examples, each example at DP-SGD's per-example rates
    (`dp_sgd_seconds`)."""
    return dp_sgd_seconds(num_params, int(passes), n, macs)


def attack_seconds(num_params: int, *, pool: int, sample_rate: float, steps: int, shadows: int) -> float:
    """Estimated CPU-seconds of `membership.private_vs_nonprivate`: two procedures, each training a target and
    `shadows` shadow models on half of `pool` examples with expected batch `q · pool / 2` (1 s of set-up)."""
    return 1.0 + 2 * (shadows + 1) * dp_sgd_seconds(num_params, steps, sample_rate * pool / 2)


def audit_seconds(*, trials: int, steps: int, canary: str) -> float:
    """Estimated CPU-seconds of `audit.audit_dp_sgd`: 1.5 s of set-up plus `AUDIT_STEP_SECONDS[canary]` per
    step of each run (`ceil(trials / AUDIT_TRIALS_PER_RUN[canary])` runs)."""
    runs = math.ceil(trials / AUDIT_TRIALS_PER_RUN[canary])
    return 1.5 + runs * steps * AUDIT_STEP_SECONDS[canary]


def retraining_seconds(num_params: int, n: int, *, k: int) -> float:
    """Estimated CPU-seconds of a retraining check: `2k` L-BFGS retrainings on `n` examples, each about
    `RETRAIN_ITERS` iterations over every example (0.3 s of set-up each)."""
    return 2 * k * (0.3 + RETRAIN_ITERS * n * num_params / LBFGS_RATE)


def lds_seconds(num_params: int, *, models: int, steps: int, batch_size: int, n_test: int, n: int) -> float:
    """Estimated CPU-seconds of `influence.fitted.lds_table`: `models` trainings of the experiment's recipe
    (one vmapped scan, 0.15 s of set-up per model) plus every method scoring `n_test` test points against `n`
    training examples (3 s of set-up)."""
    return (3.0 + models * (0.15 + steps * batch_size * num_params / TRAIN_RATE)
            + n_test * n * num_params / DP_SGD_RATE)


#: L-BFGS iterations the Influence page allows for θ̂ (the optimum every method shares).
OPTIMUM_ITERS = 500


def optimum_seconds(num_params: int, n: int) -> float:
    """Estimated CPU-seconds of θ̂: L-BFGS on mean ℓ + λ/2‖θ‖² over `n` examples, `OPTIMUM_ITERS` iterations. Only the methods that need θ̂ (`Method.needs_optimum`) pay it."""
    return OPTIMUM_ITERS * n * num_params / LBFGS_RATE


def inverse_hvp_seconds(num_params: int, n: int) -> float:
    """Estimated CPU-seconds of one batch of inverse-HVP solves (H + δI)⁻¹v at θ̂: about 200 Hessian-vector
    products over `n` examples."""
    return 200 * n * num_params / LBFGS_RATE


#: A streamed pass over the examples (dot products, norms, projected gradients) against a training step's work per
#: example, and its set-up (tracing, compiling): measured on seed 003's SimpleCNN over the Fashion subset
#: (`python -m benchmarks.influence_scale`).
PASS_FACTOR = 0.8
PASS_SETUP_SECONDS = 2.0


def pass_seconds(num_params: int, n: int, macs: int = 0, *, setup: bool = True) -> float:
    """Estimated CPU-seconds of one streamed per-example pass over `n` examples (`engine.per_example_dots`,
    `per_example_norms`, `per_example_projections`): `PASS_SETUP_SECONDS` (with `setup`: compiling, once per process
    and shape) plus per example `PASS_FACTOR` times a training step's work (`training_seconds`' rates; convolutions
    by their multiply-adds `macs`)."""
    per_example = num_params / TRAIN_RATE + max(int(macs) - int(num_params), 0) / CONV_TRAIN_RATE
    return PASS_SETUP_SECONDS * setup + PASS_FACTOR * n * per_example


#: Compiling one cell of the Performance page's sweep (one approach at one N: a new shape compiles again), CPU-seconds:
#: `CELL_COMPILE_SECONDS` plus the forward's multiply-adds over `CELL_COMPILE_MACS`, times `CELL_COMPILE_FACTOR` for
#: the approach (the loop compiles its one-example gradient once per sweep). Measured from cold processes with
#: `python -m benchmarks.simple_cnn_pages all` (benchmarks/RESULTS.md, "Performance on SimpleCNN"): seed 003's SimpleCNN
#: (12.0 M multiply-adds) compiles a batch gradient in 1.6–2.1 CPU-s, `vmap(grad)` in 2.3–2.5, the loop's gradient in
#: 1.6–1.8 and the streamed norms in 2.4 (N ≤ 6) to 7.6 (N = 256, the engine's one-off timing of rules against vmap
#: included; a page's whole sweep at N = 6, 16, 64, 256 measured 28.8 CPU-s with its page against 23 estimated at 2.5 ×,
#: hence 3.5 ×); the digits MLP (4,810) in 0.4, 0.5 and 1.2. The old estimate, 0.5 s per cell, was 4–15× short there.
CELL_COMPILE_SECONDS = 0.3
CELL_COMPILE_MACS = 8e6
CELL_COMPILE_FACTOR = {"loop": 1.0, "vmap": 1.4, "rules": 3.5, "batch": 1.0, "norms_vmap": 1.4, "norms": 3.5}
#: The Python loop's convolution work per example (`jax.grad` of one example at a time: no batching), multiply-adds
#: beyond P per CPU-second (SimpleCNN: 14 CPU-ms per example and call, its 2 ms of dispatch included).
LOOP_CONV_RATE = 1e9


def cell_compile_seconds(approach: str, macs: int = 0) -> float:
    """Estimated CPU-seconds to compile one Performance cell of `approach` for a model whose forward pass takes `macs`
    multiply-adds (`CELL_COMPILE_SECONDS`, `CELL_COMPILE_MACS`, `CELL_COMPILE_FACTOR`)."""
    return CELL_COMPILE_FACTOR.get(approach, 3.5) * (CELL_COMPILE_SECONDS + int(macs) / CELL_COMPILE_MACS)


def timing_seconds(num_params: int, cells, *, repeats: int, macs: int = 0) -> float:
    """Estimated CPU-seconds of the Performance page's sweep: for each `(approach, n)` cell, its compiling
    (`cell_compile_seconds`; the Python loop's once per sweep) plus `repeats + 1` runs (the Python loop: 2 ms of
    dispatch per example, and its convolution work at `LOOP_CONV_RATE`, one run; per-example approaches at
    `DP_SGD_RATE` and `DP_SGD_CONV_RATE`; one batch gradient at `TRAIN_RATE` and `CONV_TRAIN_RATE`). `macs`: the
    forward's multiply-adds (0: count P)."""
    conv = max(int(macs) - int(num_params), 0)

    def run(approach, n):
        if approach == "loop":
            return n * (2e-3 + num_params / TRAIN_RATE + conv / LOOP_CONV_RATE)
        if approach == "batch":
            return n * (num_params / TRAIN_RATE + conv / CONV_TRAIN_RATE)
        return n * (num_params / DP_SGD_RATE + conv / DP_SGD_CONV_RATE)

    total = 0.0
    for a, ns in cells:
        ns = list(ns)
        if not ns:
            continue
        compiles = 1 if a == "loop" else len(ns)
        total += compiles * cell_compile_seconds(a, macs or num_params)
        total += sum((2 if a == "loop" else repeats + 1) * run(a, n) for n in ns)
    return total


#: The Equivalence page's comparison (`equivalence.compare_all`: way (a) and way (b), both reductions, in float32 and
#: float64): `EQ_SETUP_SECONDS` plus the forward's multiply-adds over `EQ_COMPILE_MACS` of compiling (eight programs),
#: and per example `EQ_EXAMPLE_SECONDS` plus P / `EQ_RATE` plus the convolution work beyond P at `EQ_CONV_RATE` (float64
#: convolutions on XLA:CPU, chunks of `equivalence.FLOAT64_CHUNK`). Measured from cold processes
#: (`python -m benchmarks.simple_cnn_pages equiv N`, benchmarks/RESULTS.md "Equivalence on SimpleCNN"): the digits MLP
#: (P = 4,810) 3.4 CPU-s at N = 64 and 4.3 at all 1,437; the 256×2 MLP (85,002) 4.6 and 7.7; seed 003's SimpleCNN
#: 13.8 at N = 4, 14.0 at 16, 16.2 at 48 (about 55 CPU-ms per example).
EQ_SETUP_SECONDS = 3.0
EQ_COMPILE_MACS = 1.0e6
EQ_EXAMPLE_SECONDS = 2e-4
EQ_RATE = 4e7
EQ_CONV_RATE = 4.3e8


def equivalence_seconds(num_params: int, n: int, macs: int = 0) -> float:
    """Estimated CPU-seconds of the Equivalence page's comparison over `n` examples (`EQ_*` above); `macs`: the
    forward's multiply-adds (0: count P)."""
    macs = int(macs) or int(num_params)
    per_example = EQ_EXAMPLE_SECONDS + num_params / EQ_RATE + max(macs - int(num_params), 0) / EQ_CONV_RATE
    return EQ_SETUP_SECONDS + macs / EQ_COMPILE_MACS + int(n) * per_example


def check_work(seconds: float, what: str, fix: str) -> None:
    """Refuse work over `WORK_BUDGET_SECONDS`. **Raises** `escape.Refusal` (a ValueError) naming `what`, the estimate
    and `fix` (gradlab's Markdown: say a control as **Training steps**; no user text)."""
    if seconds > WORK_BUDGET_SECONDS:
        raise escape.Refusal(f"{what} would take about {seconds:,.0f} CPU-seconds on this shared server (the limit is "
                         f"{WORK_BUDGET_SECONDS:.0f}). {fix}")


def largest(options, seconds) -> object | None:
    """The largest of `options` (ascending) whose `seconds(option)` fits `WORK_BUDGET_SECONDS`, else None."""
    fits = [o for o in options if seconds(o) <= WORK_BUDGET_SECONDS]
    return fits[-1] if fits else None


#: One Practice Run or Check of a problem (a sandboxed child: JAX's import when no warm spare waits, tracing the
#: student's function for the seed's and the hidden inputs' shapes): CPU-seconds, measured on the 2-core machine.
PRACTICE_SECONDS = 3.0


#: The record's ensemble with the experiment's recipe (`memorization.ensemble_for`: M models in one vmapped scan, then
#: every model's outputs on every training example): set-up and compiling in CPU-s, and throughput in
#: (models × steps × batch × parameters) per CPU-s: small vmapped batches run well below `TRAIN_RATE`. Digits MLP
#: (P = 4,810, N = 1,437, 300 steps of 128), a fresh process per M (`python -m benchmarks.record --cost`, load ~25):
#: M = 8, 16, 32, 64 in 4.5, 5.1, 6.9, 9.7 CPU-s, i.e. 3.8 s plus 0.093 s per model.
ENSEMBLE_SETUP_SECONDS = 3.8
ENSEMBLE_RATE = 2.0e9
#: The DP-SGD ensemble (`ensemble_for(…, private=True)`: one DP-SGD run per model, one compiled step): set-up (σ's
#: calibration, compiling, the outputs) and each model's own set-up beside its work at `DP_SGD_RATE`. Digits MLP, 200
#: steps of an expected 256 of 718: M = 8, 16, 32, 64 in 9.4, 11.0, 12.6, 17.7 CPU-s, i.e. 8.2 s plus 0.148 s per model
#: (0.095 s of it the work at `DP_SGD_RATE`).
DP_ENSEMBLE_SETUP_SECONDS = 8.2
DP_ENSEMBLE_MODEL_SECONDS = 0.05
#: The record's table (`record.per_example_table`): compiling the norm pass and the forward, the LiRA fits (fixed), and
#: the per-example pass at `SUMMARY_FACTOR` times a training step's work.
RECORD_TABLE_SECONDS = 2.5


def record_ensemble_seconds(num_params: int, n: int, *, models: int, steps: int, batch_size: int, private: bool = False,
                            dp_steps: int = 200, dp_batch: float = 256, macs: int = 0) -> float:
    """Estimated CPU-seconds of one `memorization.ensemble_for` of `models` models on halves of `n` examples: with the
    recipe, `ENSEMBLE_SETUP_SECONDS` plus `models · steps · batch_size · P / ENSEMBLE_RATE` (convolutions' extra
    multiply-adds at `CONV_TRAIN_RATE`); with DP-SGD (`private`), `DP_ENSEMBLE_SETUP_SECONDS` plus per model
    `DP_ENSEMBLE_MODEL_SECONDS` and `dp_steps` steps of an expected `min(dp_batch, n/2)` examples at `dp_sgd_seconds`'
    rates."""
    if private:
        work = dp_sgd_seconds(num_params, dp_steps, min(dp_batch, n / 2), macs) - MODEL_SETUP_SECONDS
        return DP_ENSEMBLE_SETUP_SECONDS + models * (DP_ENSEMBLE_MODEL_SECONDS + work)
    per = num_params / ENSEMBLE_RATE + max(int(macs) - int(num_params), 0) / CONV_TRAIN_RATE
    return ENSEMBLE_SETUP_SECONDS + models * steps * batch_size * per


def record_seconds(num_params: int, n: int, *, models: int, steps: int, batch_size: int, private: bool = True,
                   dp_steps: int = 200, dp_batch: float = 256, macs: int = 0) -> float:
    """Estimated CPU-seconds of the record's press: the recipe's ensemble, with `private` its DP-SGD twin
    (`record_ensemble_seconds`), and the table of all `n` examples (`RECORD_TABLE_SECONDS` plus a norm pass over them,
    as `summary_seconds`). The digits MLP's default (M = 32, both ensembles): ~22 CPU-s, within the 30 of
    `WORK_BUDGET_SECONDS`; M = 64 would not fit (docs/record.md)."""
    ens = record_ensemble_seconds(num_params, n, models=models, steps=steps, batch_size=batch_size, macs=macs)
    if private:
        ens += record_ensemble_seconds(num_params, n, models=models, steps=steps, batch_size=batch_size, private=True,
                                       dp_steps=dp_steps, dp_batch=dp_batch, macs=macs)
    per_example = num_params / TRAIN_RATE + max(int(macs) - int(num_params), 0) / CONV_TRAIN_RATE
    return ens + RECORD_TABLE_SECONDS + SUMMARY_FACTOR * n * per_example
