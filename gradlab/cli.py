"""`python -m gradlab`: the engine without the app, for runs too big for a page.

Subcommands (each trains the model first, as the app does, unless `--train-steps 0`):

    python -m gradlab devices
    python -m gradlab serve     my_model.py        # the explorer on your own model (docs/own-model.md)
    python -m gradlab norms     --data digits --out norms.parquet
    python -m gradlab influence --data my.csv --label target --test-index 0 3 --out influence.csv
    python -m gradlab dp-sgd    --data my.npz --clip-norm 1 --noise-multiplier 1.1 --sample-rate 0.01 --out dp.csv

`--data` is a dataset name (`gradlab.sources`: `gradlab.data.DATASETS`, wine), a CSV with a header row (numeric
features, one `--label` column) or an NPZ with arrays `x (N, D)` and `y (N,)`. Results are one
table, one row per example (per step for `dp-sgd`), written as CSV, NPZ or Parquet by the
extension of `--out`: the same layout as the app's downloads. Before the work starts the command
prints a memory estimate (XLA's buffer assignment for one block of examples, per device, plus
the host arrays); `--estimate-only` stops there. With several devices the engine splits the
examples over all of them (`gradlab.sharding`); with `--distributed` it first calls
`jax.distributed.initialize()` (one process per host, each given the same data; process 0
writes the file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from tqdm import tqdm

from gradlab import data, engine, export, influence, losses, models, own, serve, sharding, train
from gradlab.experiment import Experiment, fit, init_model, load_data
from gradlab.sources import SOURCES, source_of

#: The result formats, by file extension: `gradlab.export`'s encodings.
WRITERS = {".csv": export.to_csv, ".npz": export.to_npz, ".parquet": export.to_parquet}


class CLIError(ValueError):
    """A bad argument or input file; the message says what to change."""


# ------------------------------------------------------------------------------ progress


def progress_bar(label: str, total: int, stream=None) -> Callable[..., None]:
    """A `tqdm` bar on stderr (or `stream`) driven as the train functions report: `progress(done, total)`.

    **Returns** `progress(done, total=None)`: moves the bar to `done` of `total` units; closes it at the end.
    """
    bar = tqdm(total=max(int(total), 1), desc=label, file=stream or sys.stderr, dynamic_ncols=True)

    def progress(done: int, total: int | None = None) -> None:
        if total is not None and max(int(total), 1) != bar.total:
            bar.total = max(int(total), 1)
        bar.update(min(int(done), bar.total) - bar.n)
        if bar.n >= bar.total:
            bar.close()

    return progress


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if b < 1000:
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1000
    return f"{b:.1f} TB"


# ---------------------------------------------------------------------------------- data


def _named_sources() -> list[str]:
    """The data sources a command loads by name alone: neither a session's upload nor a served model."""
    return [n for n in SOURCES if not (source_of(n).needs_upload or source_of(n).brings_model)]


def data_from_spec(spec: str, *, label: str | None, task: str, seed: int, label_noise: float, test_fraction: float):
    """A `gradlab.data.Dataset` from a data source's name (`gradlab.sources`: a bundled set, wine, …), a CSV path
    or an NPZ path (x, y arrays).

    **Raises** `CLIError` for a missing file or an unknown name, `DataError` for bad contents.
    """
    common = dict(seed=seed, label_noise=label_noise, test_fraction=test_fraction)
    if spec in _named_sources():
        return load_data(Experiment(dataset=spec, **common))
    path = Path(spec)
    if path.suffix.lower() not in (".csv", ".npz"):
        raise CLIError(f"--data {spec!r} is neither a bundled dataset ({', '.join(_named_sources())}) "
                       "nor a .csv or .npz file")
    if not path.is_file():
        raise CLIError(f"--data: no file {spec!r}")
    if path.suffix.lower() == ".csv":
        if label is None:
            raise CLIError("a CSV needs --label COLUMN: the column that holds the labels or targets")
        # the command is for big runs: no upload limits on rows or features
        return data.load_csv(str(path), label, task, max_rows=10**9, max_features=10**6, name=path.stem, **common)
    with np.load(path, allow_pickle=False) as z:
        missing = {"x", "y"} - set(z.files)
        if missing:
            raise CLIError(f"{spec}: an NPZ needs arrays 'x' (N, D) and 'y' (N,); it has {', '.join(z.files) or 'none'}")
        x, y = z["x"], z["y"]
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
        raise CLIError(f"{spec}: x must be (N, D) and y (N,) with the same N; got x {x.shape}, y {y.shape}")
    return data.make_dataset(path.stem, x.astype(np.float64), y, task, **common)


def write_table(columns: dict[str, np.ndarray], out: str) -> Path:
    """Write equally long columns as CSV, NPZ or Parquet (by the extension of `out`), as the app's downloads
    (`gradlab.export`: CSV cells that a spreadsheet would run as formulas are defused).

    **Raises** `CLIError` for another extension.
    """
    path = Path(out)
    encode = WRITERS.get(path.suffix.lower())
    if encode is None:
        raise CLIError(f"--out {out!r}: use a .csv, .npz or .parquet file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(columns))
    return path


def to_host(a) -> np.ndarray:
    """A (possibly sharded, possibly multi-host) array as one NumPy array on this host."""
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(a, tiled=True))
    return np.asarray(a)


# ------------------------------------------------------------------------ model, training


def _experiment(args, ds) -> Experiment:
    """The command line's model and training settings as an `Experiment` on the data `ds`."""
    steps = getattr(args, "train_steps", 0)
    return Experiment(dataset=ds.name, model=args.model, width=args.width, depth=args.depth, activation=args.activation,
                      optimizer=args.optimizer, lr=args.lr, steps=steps, batch_size=args.batch_size, l2=args.l2,
                      label_noise=args.label_noise, seed=args.seed, checkpoint_every=max(1, steps // 20),
                      test_fraction=args.test_fraction)


def _model_and_loss(exp: Experiment, ds):
    """The untrained model and the loss of one example for the experiment's task."""
    return init_model(exp, ds), losses.loss_for(ds.task)


def _train(exp: Experiment, ds, log):
    """The model `experiment.fit` trains (the app's training), or the initial one for 0 steps."""
    if exp.steps == 0:
        return init_model(exp, ds)
    fitted = fit(exp, data=ds, progress=progress_bar(f"training ({exp.steps} {exp.optimizer} steps)", exp.steps))
    log(f"trained: final minibatch loss {float(fitted.run.losses[-1]):.4f}")
    return fitted.model


def _blocks(n: int, block: int, devices: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of `block` examples (a multiple of the device count), the last shorter."""
    block = max(devices, (max(1, block) // devices) * devices)
    return [(s, min(s + block, n)) for s in range(0, n, block)]


def _padded(a: np.ndarray, size: int) -> np.ndarray:
    """The last block padded (with its last row) to the block size: one compiled shape for all."""
    return a if len(a) == size else np.concatenate([a, np.repeat(a[-1:], size - len(a), axis=0)])


def _streamed(fn: Callable, xs, ys, block: int, label: str) -> list:
    """Call `fn(x_block, y_block)` over blocks of examples with a progress bar; rows trimmed."""
    spans = _blocks(len(xs), block, jax.device_count())
    size = spans[0][1] - spans[0][0]
    bar, outs = progress_bar(label, len(xs)), []
    for start, stop in spans:
        out = fn(_padded(xs[start:stop], size), _padded(ys[start:stop], size))
        outs.append(jax.tree.map(lambda a: to_host(a)[: stop - start], out))
        bar(stop)
    return outs


def _estimate(args, log, parts: dict[str, int]) -> None:
    """Print the memory estimate (one line per part and the total)."""
    log("memory estimate: " + ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in parts.items())
        + f"; total ≈ {_fmt_bytes(sum(parts.values()))}")


def _device_block_memory(engine_fn, loss_fn, params, xs, ys, block: int, *extra, **kw) -> int:
    """Per-device bytes XLA allocates for one block (arguments + outputs + temporaries)."""
    size = _blocks(len(xs), block, jax.device_count())[0]
    n = size[1] - size[0]
    return sharding.memory_analysis(engine_fn, loss_fn, params, _padded(xs[:n], n), _padded(ys[:n], n),
                                    *extra, **kw)["peak"]


# --------------------------------------------------------------------------- subcommands


def cmd_devices(args, log) -> int:
    """The devices JAX sees: kind, count, processes."""
    log(f"devices: {sharding.describe_devices()}")
    log(f"process {jax.process_index()} of {jax.process_count()}; local devices: {jax.local_device_count()}")
    for d in jax.devices():
        log(f"  {d.id}: {d.device_kind} (process {d.process_index})")
    return 0


def cmd_norms(args, log) -> int:
    """Per-example gradient norms (global and per layer) and losses of every training example."""
    ds = _dataset(args)
    exp = _experiment(args, ds)
    model, loss_fn = _model_and_loss(exp, ds)
    xs, ys = ds.x_train, ds.y_train
    p = engine.num_params(model)
    log(f"norms: {ds.name}, N = {len(xs):,} training examples, {args.model} with P = {p:,} parameters")
    _estimate(args, log, {
        "per device (XLA, one block)": _device_block_memory(engine.per_example_layer_norms, loss_fn, model, xs, ys,
                                                            args.block, chunk_size=args.chunk_size),
        "host data": xs.nbytes + ys.nbytes,
        "host results": len(xs) * 4 * (len(engine.leaf_names(model)) + 3),
    })
    if args.estimate_only:
        return 0
    params = _train(exp, ds, log)

    def block(x, y):
        layers = engine.per_example_layer_norms(loss_fn, params, x, y, chunk_size=args.chunk_size)
        return layers, losses.per_example_losses(loss_fn, params, jnp.asarray(x), jnp.asarray(y))

    outs = _streamed(block, xs, ys, args.block, "per-example norms")
    layers = {k: np.concatenate([o[0][k] for o in outs]) for k in outs[0][0]}
    total = np.sqrt(sum(np.square(v.astype(np.float64)) for v in layers.values())).astype(np.float32)
    columns = {"example": np.arange(len(xs)), "label": ys, "loss": np.concatenate([o[1] for o in outs]),
               "grad_norm": total, **{f"grad_norm{k}": v for k, v in layers.items()}}
    if ds.flipped.any():
        columns["label_flipped"] = ds.flipped
    _finish(args, log, columns, f"grad_norm median {np.median(total):.4g}, max {total.max():.4g} "
                                f"(example {int(total.argmax())})")
    return 0


def cmd_influence(args, log) -> int:
    """Predicted leave-one-out change of chosen test losses, and self-influence, per training example."""
    ds = _dataset(args)
    exp = _experiment(args, ds)
    model, loss_fn = _model_and_loss(exp, ds)
    xs, ys = ds.x_train, ds.y_train
    bad = [i for i in args.test_index if not 0 <= i < len(ds.x_test)]
    if bad:
        raise CLIError(f"--test-index {bad[0]} is out of range: the test split has {len(ds.x_test)} examples")
    p = engine.num_params(model)
    exact_max = influence.EXACT_MAX_PARAMS
    log(f"influence: {ds.name}, N = {len(xs):,} training examples, P = {p:,}, test points {args.test_index}")
    _estimate(args, log, {
        "per device (XLA, scores of one block)": _device_block_memory(
            engine.per_example_dots, loss_fn, model, xs, ys, args.block,
            engine.batch_grad(loss_fn, model, xs[:1], ys[:1]), chunk_size=args.chunk_size),
        "inverse HVP (exact P×P Hessian)" if p <= exact_max else "inverse HVP (conjugate gradient, a few P)":
            4 * (p * p if p <= exact_max else 8 * p),
        "host data": xs.nbytes + ys.nbytes,
        "host results": len(xs) * 4 * (len(args.test_index) + 2),
    })
    if args.estimate_only:
        return 0
    params = _train(exp, ds, log)
    columns = {"example": np.arange(len(xs)), "label": ys}
    bar = progress_bar("influence (one inverse HVP per test point)", len(args.test_index) + 1)
    for k, i in enumerate(args.test_index):
        scores = influence.predicted_loo_change(loss_fn, params, xs, ys, ds.x_test[i], ds.y_test[i],
                                                damping=args.damping, chunk_size=args.chunk_size)
        columns[f"loo_change_test{i}"] = to_host(scores)
        bar(k + 1)
    columns["self_influence"] = to_host(influence.self_influence(loss_fn, params, xs, ys, chunk_size=args.chunk_size))
    bar(len(args.test_index) + 1)
    if ds.flipped.any():
        columns["label_flipped"] = ds.flipped
    top = int(np.argmax(columns["self_influence"]))
    _finish(args, log, columns, f"highest self-influence: example {top}")
    return 0


def cmd_dp_sgd(args, log) -> int:
    """A DP-SGD run (`gradlab.train.train_dp_sgd`): one row per step, ε at each checkpoint."""
    ds = _dataset(args)
    model, loss_fn = _model_and_loss(_experiment(args, ds), ds)
    n, p = len(ds.x_train), engine.num_params(model)
    if not 0 < args.sample_rate <= 1:
        raise CLIError(f"--sample-rate q must be in (0, 1], got {args.sample_rate}")
    m = train.dp_buffer_size(n, args.sample_rate)
    log(f"dp-sgd: {ds.name}, N = {n:,}, P = {p:,}, q = {args.sample_rate:g} (buffer {m} examples), "
        f"σ = {args.noise_multiplier:g}, C = {args.clip_norm:g}, {args.steps} steps")
    _estimate(args, log, {
        "per-example gradients of one batch buffer (M×P×4)": m * p * 4,
        "parameters, optimizer state and checkpoints": p * 4 * (3 + args.steps // args.checkpoint_every + 1),
        "data": ds.x_train.nbytes + ds.y_train.nbytes,
    })
    if args.estimate_only:
        return 0
    bar = progress_bar(f"DP-SGD ({args.steps} steps)", args.steps)
    res = train.train_dp_sgd(model, loss_fn, ds.x_train, ds.y_train, sample_rate=args.sample_rate,
                             noise_multiplier=args.noise_multiplier, clip_norm=args.clip_norm,
                             optimizer=args.optimizer, lr=args.lr, steps=args.steps, seed=args.seed,
                             checkpoint_every=args.checkpoint_every, delta=args.delta, progress=bar)
    eps = np.full(len(res.losses), np.nan)
    for step, e in zip(res.steps[1:], res.epsilons[1:]):
        eps[step - 1] = e
    columns = {"step": np.arange(1, len(res.losses) + 1), "loss": res.losses, "batch_size": res.batch_sizes,
               "clipped_fraction": res.clipped_fraction, "epsilon": eps}
    pred = np.asarray(losses.predict(res.final, ds.x_test, ds.task))
    quality = (f"test accuracy {np.mean(pred == ds.y_test):.3f}" if ds.task == "classification"
               else f"test MSE {np.mean((pred - ds.y_test) ** 2):.4g}")
    _finish(args, log, columns, f"ε = {res.epsilons[-1]:.3g} at δ = {args.delta:g} ({res.accountant}); {quality}")
    return 0


def _dataset(args):
    return data_from_spec(args.data, label=args.label, task=args.task, seed=args.seed, label_noise=args.label_noise,
                     test_fraction=args.test_fraction)


def _finish(args, log, columns, summary: str) -> None:
    if jax.process_index() == 0:
        path = write_table(columns, args.out)
        log(f"wrote {path} ({len(next(iter(columns.values()))):,} rows, {len(columns)} columns); {summary}")


# ---------------------------------------------------------------------------------- parser


#: How a served model's data without a test split of its own is split (`own.as_dataset`): said in `serve --help`.
SERVE_SPLIT = (f"Data given as (x, y), a dict with x and y, or a CSV/NPZ without x_test and y_test is split once: "
               f"sklearn's train_test_split(x, y, test_size={own.TEST_FRACTION}, random_state=0), i.e. "
               f"{1 - own.TEST_FRACTION:.0%} training examples (what the pages compute on) and "
               f"{own.TEST_FRACTION:.0%} test points (whose predictions Influence explains), the same on every run. "
               "Give x_train, y_train, x_test and y_test to choose the split yourself.")


def _true_false(text: str) -> bool:
    """`true`/`false` (any case, or 1/0, yes/no) as Streamlit's boolean flags take them. **Raises** argparse's error."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(str(text).lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m gradlab", description=__doc__.split("\n")[0])
    ap.add_argument("--distributed", action="store_true",
                    help="call jax.distributed.initialize() first: one process per host (under SLURM, "
                         "Open MPI or on a TPU pod the three settings below are detected)")
    ap.add_argument("--coordinator", help="HOST:PORT of process 0 (with --distributed)")
    ap.add_argument("--num-processes", type=int, help="how many processes in all (with --distributed)")
    ap.add_argument("--process-id", type=int, help="this process's rank, 0 … num-processes − 1 (with --distributed)")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("devices", help="the devices JAX sees (kind, count, processes)")
    p = sub.add_parser("serve", help="open the explorer on your own model (a .py file defining loss_fn, params, data)",
                       description="Open the explorer on your own model (docs/own-model.md).", epilog=SERVE_SPLIT)
    p.add_argument("module", help="your model's Python file (docs/own-model.md)")
    # Streamlit's own spelling too (`--server.port 8502`): a researcher who knows `streamlit run` types it
    p.add_argument("--port", "--server.port", dest="port", type=int,
                   help="the server's port (default: the first free one from 8501)")
    p.add_argument("--address", "--server.address", dest="address", default="127.0.0.1",
                   help="the interface to listen on (default: this machine only; 0.0.0.0 lets others in)")
    p.add_argument("--headless", action="store_true", help="do not open a browser")
    p.add_argument("--server.headless", dest="headless", type=_true_false, nargs="?", const=True,
                   help="Streamlit's spelling of --headless (true or false)")

    def common(p, out):
        p.add_argument("--data", default="digits",
                       help="dataset name (bundled, wine), or a .csv (header row) / .npz (arrays x, y) file")
        p.add_argument("--label", help="label column of a CSV")
        p.add_argument("--task", choices=["classification", "regression"], default="classification",
                       help="for a CSV or NPZ file (bundled datasets know their task)")
        p.add_argument("--label-noise", type=float, default=0.0, help="fraction of training labels flipped")
        p.add_argument("--test-fraction", type=float, default=0.2)
        p.add_argument("--model", choices=list(models.MODELS), default="mlp")
        p.add_argument("--width", type=int, default=64)
        p.add_argument("--depth", type=int, default=1)
        p.add_argument("--activation", default="relu")
        p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
        p.add_argument("--lr", type=float, default=0.01)
        p.add_argument("--l2", type=float, default=1e-4)
        p.add_argument("--batch-size", type=int, default=128)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--chunk-size", type=int, default=256, help="examples per vmap chunk within a device")
        p.add_argument("--block", type=int, default=16384, help="examples per engine call (the progress unit)")
        p.add_argument("--out", default=out, help="result file: .csv, .npz or .parquet")
        p.add_argument("--estimate-only", action="store_true", help="print the memory estimate and stop")

    p = sub.add_parser("norms", help="per-example gradient norms (global and per layer) and losses")
    common(p, "gradlab_norms.csv")
    p.add_argument("--train-steps", type=int, default=300, help="training steps before the norms (0: at init)")
    p = sub.add_parser("influence", help="predicted leave-one-out change of test losses, self-influence")
    common(p, "gradlab_influence.csv")
    p.add_argument("--train-steps", type=int, default=300)
    p.add_argument("--test-index", type=int, nargs="+", default=[0], help="test-split example(s) to explain")
    p.add_argument("--damping", type=float, default=0.01, help="damping δ, added to the Hessian only: (H + δI)⁻¹ at the trained model (λ = 0 in the "
                   "influence objective; --l2 is the training regularization)")
    p = sub.add_parser("dp-sgd", help="train with DP-SGD; per-step loss, clipped fraction, ε")
    common(p, "gradlab_dp_sgd.csv")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--sample-rate", type=float, default=0.01, help="Poisson sampling rate q")
    p.add_argument("--noise-multiplier", type=float, default=1.1, help="σ")
    p.add_argument("--clip-norm", type=float, default=1.0, help="clipping norm C")
    p.add_argument("--delta", type=float, default=1e-5, help="δ for the reported ε")
    p.add_argument("--checkpoint-every", type=int, default=50)
    return ap


def cmd_serve(args, log) -> int:
    return serve.main(args.module, port=args.port, address=args.address, headless=args.headless)


COMMANDS = {"devices": cmd_devices, "serve": cmd_serve, "norms": cmd_norms, "influence": cmd_influence, "dp-sgd": cmd_dp_sgd}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` and run the subcommand. **Returns** the exit status (2 on a bad input, with the reason)."""
    args = parser().parse_args(argv)
    if args.distributed:  # before any computation: importing gradlab starts no JAX backend
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)

    def log(msg: str) -> None:
        if jax.process_index() == 0:
            print(msg, flush=True)

    try:
        if getattr(args, "out", None) and Path(args.out).suffix.lower() not in WRITERS:
            raise CLIError(f"--out {args.out!r}: use a .csv, .npz or .parquet file name")
        return COMMANDS[args.command](args, log)
    except (CLIError, data.DataError, ValueError) as err:
        print(f"gradlab {args.command}: error: {err}", file=sys.stderr)
        return 2
