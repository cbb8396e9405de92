"""Rule coverage: which leaves of user-written models take a per-layer rule, and why the others fall back.

    python -m benchmarks.rule_coverage            # one row per model, then the total and the fallback reasons
    python -m benchmarks.rule_coverage --timing   # also: norms and clipped sum / one batch gradient on a GPT block
                                                  # (with and without the bias and scale rules), an LSTM and a GRU
    python -m benchmarks.rule_coverage --runs lstm                  # the LSTM of --timing in 5 runs
    python -m benchmarks.rule_coverage --zoo-timing lstm_zoo gru_zoo   # per zoo model (N = 256 by repeating its
                                                  # examples): norms and clipped sum / one batch gradient
    python -m benchmarks.rule_coverage --zoo-timing users   # the same over the users' model set (all: every model)

The models are the engine's test zoo (tests/test_engine_zoo.py: dict params, lax calls, Equinox, an LSTM and a
GRU by lax.scan, BatchNorm, dropout, cond/switch, custom_vjp, checkpoint, Flax linen and NNX models), its
low-precision models (tests/test_engine_precision.py) and the users' model set (tests/user_models.py: Flax linen
and NNX, Equinox, Haiku, plain JAX and optax losses, the rest of Opacus' per-layer matrix; issue 25). A
*weight-like* leaf is a differentiable leaf with at least one axis (Python floats and 0-d scalars excluded).
Only tracing runs (`engine.explain`), nothing is compiled.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

from gradlab import engine, rules

TESTS = pathlib.Path(__file__).resolve().parent.parent / "tests"


def _module(name: str):
    """A test module by path (tests/ is not a package)."""
    if str(TESTS) not in sys.path:  # as pytest puts it there: the zoo imports tests/testdata.py
        sys.path.insert(0, str(TESTS))
    spec = importlib.util.spec_from_file_location(name, TESTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def zoo() -> list:
    """`(name, make)` for every model of the three test files; `make()` returns (loss, params, xs, ys, …)."""
    return [(f.__name__, f) for f in _module("test_engine_zoo").ZOO + _module("test_engine_precision").MODELS
            + users()]


def users() -> list:
    """The users' model set alone (tests/user_models.py)."""
    return _module("user_models").USER_MODELS


def coverage(models) -> tuple[list, collections.Counter]:
    """Per model `(name, ruled, weight-like)`, and a count of the fallback reasons over all models."""
    rows, reasons = [], collections.Counter()
    for name, make in models:
        loss, params, xs, ys = make()[:4]
        weight_like = [r for r in engine.explain(loss, params, xs, ys) if len(r["shape"]) >= 1]
        ruled = [r for r in weight_like if r["path"] == "rule"]
        for r in weight_like:
            if r["path"] != "rule":
                reasons[r["why"].split(":")[0].split(" (")[0]] += 1
        rows.append((name, len(ruled), len(weight_like)))
    return rows, reasons


def gpt_block(n=256, v=64, t=16, d=32):
    """A one-block GPT (position embedding added, LayerNorms, packed QKV, MLP with a bias), N sequences."""
    k = jax.random.split(jax.random.key(0), 12)
    w = lambda i, s, sc=0.3: sc * jax.random.normal(k[i], s)  # noqa: E731
    p = {"wte": w(0, (v, d)), "wpe": w(1, (t, d), 0.1), "ln1_g": 1 + w(2, (d,), .1), "ln1_b": w(3, (d,), .1),
         "w_qkv": w(4, (d, 3 * d)), "w_o": w(5, (d, d)), "ln2_g": 1 + w(6, (d,), .1), "ln2_b": w(7, (d,), .1),
         "w_fc": w(8, (d, 4 * d)), "b_fc": w(9, (4 * d,), .1), "w_proj": w(10, (4 * d, d)), "head": w(11, (d, v))}
    ids = jax.random.randint(k[0], (n, t + 1), 0, v)
    loss = functools.partial(_module("test_engine_zoo").gpt_block_loss, t=t, d=d)
    return loss, p, ids[:, :-1], ids[:, 1:]


def _best(fns, rounds=20) -> list:
    """The best time of each function, measured in interleaved rounds (one call of each per round), so that a
    shared machine's changing load falls on all of them alike."""
    for f in fns:
        jax.block_until_ready(f())
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for j, f in enumerate(fns):
            start = time.perf_counter()
            jax.block_until_ready(f())
            best[j] = min(best[j], time.perf_counter() - start)
    return best


def rnn(cell: str, n=256, t=16, d=16, hd=32):
    """The zoo's LSTM or GRU (`lstm_loss`, `gru_loss`) at a working size: N sequences of t steps."""
    zoo_mod = _module("test_engine_zoo")
    k = jax.random.split(jax.random.key(1), 6)
    g = 4 if cell == "lstm" else 3
    p = {"w_ih": 0.3 * jax.random.normal(k[0], (d, g * hd)), "w_hh": 0.3 * jax.random.normal(k[1], (hd, g * hd)),
         "b": 0.1 * jax.random.normal(k[2], (g * hd,)),
         "head": 0.3 * jax.random.normal(k[3], (hd, 2) if cell == "lstm" else (hd,))}
    xs = jax.random.normal(k[4], (n, t, d))
    if cell == "lstm":
        return zoo_mod.lstm_loss, p, xs, jnp.arange(n) % 2
    return zoo_mod.gru_loss, p, xs, jax.random.normal(k[5], (n,))


def _ratios(label, loss, p, xs, ys) -> None:
    f = lambda p, x, y: loss(p, x, y)  # noqa: E731 - a fresh object: compiled afresh
    ruled = sum(r["path"] == "rule" for r in engine.explain(f, p, xs, ys))
    tb, tn, tc = _best([lambda: engine.batch_grad(f, p, xs, ys), lambda: engine.per_example_norms(f, p, xs, ys),
                        lambda: engine.clipped_grad_sum(f, p, xs, ys, 1.0)])
    print(f"{label:34s} ruled {ruled:2d}/{len(p)}  batch grad {tb * 1e3:6.1f} ms  "
          f"norms {tn / tb:4.2f}x  clipped sum {tc / tb:4.2f}x", flush=True)


def timing() -> None:
    loss, p, xs, ys = gpt_block()
    with rules.registry.without("added", "scale"):  # switches the family off for this comparison only
        _ratios("GPT block, dense/embedding only", loss, p, xs, ys)
    _ratios("GPT block, + bias and scale rules", loss, p, xs, ys)
    for cell in ("lstm", "gru"):
        _ratios(f"{cell.upper()}, 16 steps, hidden 32", *rnn(cell))


def rnn_runs(cell: str, runs: int = 5) -> None:
    """The LSTM or GRU of `timing` in `runs` separate measurements (best of 10 interleaved rounds each): how much
    its norms and clipped sum ratios move between runs."""
    loss, p, xs, ys = rnn(cell)
    print(f"{cell.upper()}, {xs.shape[1]} steps, N = {xs.shape[0]}:")
    for run in range(runs):
        tb, tn, tc = _best([lambda: engine.batch_grad(loss, p, xs, ys),
                            lambda: engine.per_example_norms(loss, p, xs, ys),
                            lambda: engine.clipped_grad_sum(loss, p, xs, ys, 1.0)], rounds=10)
        print(f"run {run + 1}: batch grad {tb * 1e3:6.1f} ms  norms {tn / tb:4.2f}x  clipped sum {tc / tb:4.2f}x",
              flush=True)


def zoo_timing(names, n=256) -> None:
    """Per zoo model: batch gradient time, and norms, clipped sum (C = median norm) and vmap's clipped sum as
    ratios to it; N examples by repeating the model's own (best of 20 interleaved rounds); and which path
    `method="auto"` kept for norms and the clipped sum (`engine.AUTO_CHOICES`: the rules or vmap, timed once)."""
    print(f"{'model':28s} {'batch grad':>10s} {'norms':>6s} {'clipped':>8s} {'vmap clipped':>12s}  auto took")
    mine = {f.__name__ for f in users()}
    for name, make in zoo():
        if names != ["all"] and name not in names and not (names == ["users"] and name in mine):
            continue
        loss, p, xs, ys = make()[:4]
        xs, ys = engine.pad_examples((xs, ys), n - jax.tree.leaves(xs)[0].shape[0])
        c = float(jnp.median(engine.per_example_norms(loss, p, xs, ys)))
        tb, tn, tc, tv = _best([lambda: engine.batch_grad(loss, p, xs, ys),
                                lambda: engine.per_example_norms(loss, p, xs, ys),
                                lambda: engine.clipped_grad_sum(loss, p, xs, ys, c),
                                lambda: engine.clipped_grad_sum(loss, p, xs, ys, c, method="vmap")])
        took = {k[0]: v for k, v in engine.AUTO_CHOICES.items() if k[1] is loss}  # the kept cost choices
        took = ", ".join(f"{k} {'rules' if v == 'auto' else v}" for k, v in took.items()) or "rules (untimed)"
        print(f"{name:28s} {tb * 1e3:7.1f} ms {tn / tb:5.2f}x {tc / tb:7.2f}x {tv / tb:11.2f}x  {took}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timing", action="store_true", help="also time a GPT block with and without bias rules")
    parser.add_argument("--runs", choices=["lstm", "gru"], help="the LSTM or GRU timed in 5 separate runs")
    parser.add_argument("--zoo-timing", nargs="+", metavar="MODEL",
                        help="time these zoo models ('all': every one, 'users': the users' model set)")
    args = parser.parse_args()
    if args.runs:
        rnn_runs(args.runs)
        return
    if args.zoo_timing:
        print(f"N = 256, on {jax.devices()[0].device_kind}:")
        zoo_timing(args.zoo_timing)
        return
    rows, reasons = coverage(zoo())
    print(f"{'model':28s} {'ruled':>5s} / {'weight-like':<11s}")
    for name, ruled, total in rows:
        print(f"{name:28s} {ruled:5d} / {total:<11d}")
    ruled, total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"\ncoverage: {ruled} of {total} weight-like leaves take a rule ({100 * ruled / total:.1f}%)")
    mine = {f.__name__ for f in users()}
    ruled, total = sum(r[1] for r in rows if r[0] in mine), sum(r[2] for r in rows if r[0] in mine)
    print(f"the users' model set ({len(mine)} models): {ruled} of {total} ({100 * ruled / total:.1f}%)")
    print("\nfallback reasons:")
    for why, count in reasons.most_common():
        print(f"  {count:3d}  {why}")
    if args.timing:
        print(f"\nN = 256 sequences of 16 tokens or steps, on {jax.devices()[0].device_kind}:")
        timing()


if __name__ == "__main__":
    main()
