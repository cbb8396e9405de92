"""The engine on code people write: hand-written losses, dict params, no registration.

    python -m benchmarks.user_code            # all models, one run, ratios printed

For each model: one batch gradient (the cost floor), `per_example_norms`, `clipped_grad_sum`
(ghost clipping), and the chunked `vmap(grad)` norms for contrast, each as the median of
`--repeats` steady-state runs after a compiling call; ratios are to the batch gradient measured in
the same run. Then a DP-SGD step (a Poisson batch as `gradlab.train` draws it, `gradlab.privacy.dp_sgd_gradient`,
optax) against the same step without privacy (same Poisson batch, plain mean gradient).

Models (all losses hand-written, `-log_softmax(logits)[y]`):
- digits MLP 64-256-256-10, N=1797, as `eqx.nn.MLP` and as a dict of arrays with `x @ w + b`;
- the app's CNN (`gradlab.models.CNN`) on digits, N=1797;
- a token model on dict params: Embedding 1000×64 → LayerNorm → Linear on every token → mean pool
  → Linear, 16 tokens, N=512, random ids and labels.
"""

from __future__ import annotations

import argparse
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gradlab import engine, models, privacy, train


def nll(logits, y):
    return -jax.nn.log_softmax(logits)[y]


def eqx_loss(model, x, y):
    return nll(model(x), y)


def dict_mlp_loss(p, x, y):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    h = jax.nn.relu(h @ p["w2"] + p["b2"])
    return nll(h @ p["w3"] + p["b3"], y)


def token_loss(p, ids, y):
    h = p["emb"][ids]                                           # (16, 64)
    mu = h.mean(-1, keepdims=True)
    h = (h - mu) / jnp.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * p["ln_g"] + p["ln_b"]
    h = jax.nn.relu(h @ p["w"] + p["b"])                        # a Linear on every token
    return nll(h.mean(0) @ p["head"] + p["head_b"], y)


def _digits():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x - x.mean(0)) / np.maximum(x.std(0), 1e-8)
    return jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32)


def workloads(seed: int = 0):
    """`{name: (loss_fn, params, xs, ys)}` for the four models of the module docstring."""
    xs, ys = _digits()
    k = jax.random.split(jax.random.key(seed), 8)
    mlp = eqx.nn.MLP(64, 10, 256, 2, activation=jax.nn.relu, key=k[0])
    init = lambda key, i, o: jax.random.normal(key, (i, o)) * jnp.sqrt(2.0 / i)  # noqa: E731
    dict_mlp = {"w1": init(k[1], 64, 256), "b1": jnp.zeros(256), "w2": init(k[2], 256, 256), "b2": jnp.zeros(256),
                "w3": init(k[3], 256, 10), "b3": jnp.zeros(10)}
    cnn = models.CNN((8, 8), 10, key=k[4])
    tok = {"emb": jax.random.normal(k[5], (1000, 64)), "ln_g": jnp.ones(64), "ln_b": jnp.zeros(64),
           "w": init(k[6], 64, 64), "b": jnp.zeros(64), "head": init(k[7], 64, 10), "head_b": jnp.zeros(10)}
    ids = jax.random.randint(jax.random.key(seed + 1), (512, 16), 0, 1000)
    labels = jax.random.randint(jax.random.key(seed + 2), (512,), 0, 10)
    return {
        "digits MLP 64-256-256-10, Equinox (N=1797)": (eqx_loss, mlp, xs, ys),
        "digits MLP 64-256-256-10, dict params (N=1797)": (dict_mlp_loss, dict_mlp, xs, ys),
        "app CNN on digits, Equinox (N=1797)": (eqx_loss, cnn, xs, ys),
        "token model 1000x64 emb, 16 tokens, dict (N=512)": (token_loss, tok, ids, labels),
    }


def _time(fn, repeats: int) -> float:
    jax.block_until_ready(fn())
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def engine_ratios(loss, params, xs, ys, repeats: int) -> dict:
    """Seconds and ratios to one batch gradient for norms, clipped sum and vmap norms."""
    c = float(np.median(np.asarray(engine.per_example_norms(loss, params, xs, ys))))
    t = {
        "batch": _time(lambda: engine.batch_grad(loss, params, xs, ys), repeats),
        "norms": _time(lambda: engine.per_example_norms(loss, params, xs, ys), repeats),
        "clipped": _time(lambda: engine.clipped_grad_sum(loss, params, xs, ys, c), repeats),
        "norms_vmap": _time(lambda: engine.per_example_norms(loss, params, xs, ys, method="vmap"), repeats),
    }
    return t


@eqx.filter_jit
def _segment(loss_fn, params, opt_state, update, xs, ys, keys, q, buffer_size, private):
    """len(keys) steps on Poisson batches: DP-SGD's step (`privacy.dp_sgd_gradient`, σ = 1, C = 1) if
    `private`, else the step it is compared with (the same batch's mean gradient); then optax."""
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    n = xs.shape[0]

    def step(carry, key):
        d, s = carry
        idx, mask, _ = train.poisson_sample(key[0], n, q, buffer_size)
        w, p = mask.astype(jnp.float32), eqx.combine(d, static)
        if private:
            g, _, _ = privacy.dp_sgd_gradient(loss_fn, p, xs[idx], ys[idx], key[1], clip_norm=1.0, noise_multiplier=1.0,
                                              batch_size=q * n, weights=w)
        else:
            g = jax.tree.map(lambda a: a / (q * n), engine.weighted_grad(loss_fn, p, xs[idx], ys[idx], w))
        updates, s = update(g, s, d)
        return (optax.apply_updates(d, updates), s), None

    (diff, opt_state), _ = jax.lax.scan(step, (diff, opt_state), keys)
    return eqx.combine(diff, static), opt_state


def dp_step_ratio(loss, params, xs, ys, repeats: int, steps: int = 10, q: float = 256 / 1797) -> tuple[float, float]:
    """Seconds per step of DP-SGD (σ=1, C=1) and of the plain step, same sampling, same optimizer."""
    params = engine.as_params(params)
    opt = optax.sgd(0.1)
    state = opt.init(eqx.filter(params, eqx.is_inexact_array))
    n = xs.shape[0]
    m = train.dp_buffer_size(n, q)
    keys = jax.vmap(lambda k: jax.random.split(k, 2))(jax.random.split(jax.random.key(0), steps))  # (sampling, noise)
    dp = lambda: _segment(loss, params, state, opt.update, xs, ys, keys, q, m, True)  # noqa: E731
    plain = lambda: _segment(loss, params, state, opt.update, xs, ys, keys, q, m, False)  # noqa: E731
    return _time(dp, repeats) / steps, _time(plain, repeats) / steps


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"benchmarks.user_code: {jax.devices()[0].platform.upper()} x{len(jax.devices())}, jax {jax.__version__}, "
          f"median of {args.repeats} runs after a compiling call; ratios to one batch gradient of the same run")
    print(f"{'model':50s} {'batch ms':>9s} {'norms':>14s} {'clipped sum':>14s} {'vmap norms':>14s} "
          f"{'DP step / plain step':>24s}")
    for name, (loss, params, xs, ys) in workloads().items():
        t = engine_ratios(loss, params, xs, ys, args.repeats)
        dp, plain = dp_step_ratio(loss, params, xs, ys, args.repeats)
        b = t["batch"]
        cell = lambda s: f"{s * 1e3:7.1f} {s / b:5.2f}x"  # noqa: E731
        print(f"{name:50s} {b * 1e3:9.1f} {cell(t['norms']):>14s} {cell(t['clipped']):>14s} "
              f"{cell(t['norms_vmap']):>14s} {dp * 1e3:8.1f}/{plain * 1e3:.1f} ms {dp / plain:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
