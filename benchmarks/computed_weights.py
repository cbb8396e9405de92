"""Per-example norms and clipped sums of weights computed from several parameters, as ratios to one batch gradient.

    python -m benchmarks.computed_weights          # N = 256 examples of 64 features, hidden 256

Models (tests/test_rule_kinds.py's, at a working size): weight normalization (w = g·v/‖v‖), spectral
normalization (w / σ, two power iterations), LoRA written merged `x @ (W0 + A·B)` beside LoRA written factored
`x @ W0 + (x @ A) @ B`, a hypernetwork's weight, and a complex64 Fourier layer. Each row: which leaves take a
rule (`engine.explain`), the batch gradient's time, and the norms' and clipped sum's (rules path,
`method="ghost"`) and vmap's norms as ratios to it, best of 10 interleaved rounds (benchmarks.rule_coverage._best).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks.rule_coverage import _best
from gradlab import engine

N, D, H, R = 256, 64, 256, 8


def _n(i, shape, scale=0.1):
    return scale * jax.random.normal(jax.random.key(i), shape)


def weight_norm(p, x, y):
    w = p["g"] * p["v"] / jnp.linalg.norm(p["v"], axis=0, keepdims=True)
    return jnp.sum((jnp.tanh(x @ w + p["b"]) @ p["head"] - y) ** 2)


def spectral_norm(p, x, y):
    u = jnp.ones(p["w"].shape[1]) / jnp.sqrt(p["w"].shape[1])
    for _ in range(2):
        v = p["w"] @ u
        v = v / jnp.linalg.norm(v)
        u = p["w"].T @ v
        u = u / jnp.linalg.norm(u)
    return jnp.sum((jnp.tanh(x @ (p["w"] / (v @ p["w"] @ u))) @ p["head"] - y) ** 2)


def lora_merged(p, x, y):
    return jnp.sum((jnp.tanh(x @ (p["w0"] + p["a"] @ p["b"])) @ p["head"] - y) ** 2)


def lora_factored(p, x, y):
    return jnp.sum((jnp.tanh(x @ p["w0"] + (x @ p["a"]) @ p["b"]) @ p["head"] - y) ** 2)


def hypernet(p, x, y):
    w = (jnp.tanh(p["z"] @ p["h1"]) @ p["h2"]).reshape(D, H)
    return jnp.sum((jnp.tanh(x @ w) @ p["head"] - y) ** 2)


def fourier(p, x, y):
    xf = jnp.fft.rfft(x)[: D // 2].astype(jnp.complex64)
    h = jnp.fft.irfft(xf @ p["w"], n=2 * H)
    return jnp.sum((jnp.tanh(h) @ p["head"] - y) ** 2)


def models():
    head = _n(9, (H, 2))
    lora = {"w0": _n(1, (D, H)), "a": _n(2, (D, R)), "b": _n(3, (R, H)), "head": head}
    wc = (_n(4, (D // 2, H)) + 1j * _n(5, (D // 2, H))).astype(jnp.complex64)
    return [
        ("weight normalization", weight_norm, {"g": 1 + _n(1, (1, H)), "v": _n(2, (D, H)), "b": _n(3, (H,)), "head": head}),
        ("spectral normalization", spectral_norm, {"w": _n(1, (D, H)), "head": head}),
        ("LoRA merged x @ (W0 + A B)", lora_merged, lora),
        ("LoRA factored x W0 + (x A) B", lora_factored, lora),
        ("hypernetwork", hypernet, {"z": _n(1, (8,), 1.0), "h1": _n(2, (8, 16)), "h2": _n(3, (16, D * H)),
                                    "head": head}),
        ("complex64 Fourier layer", fourier, {"w": wc, "head": _n(9, (2 * H, 2))}),
    ]


def main() -> None:
    xs, ys = _n(10, (N, D), 1.0), _n(11, (N, 2), 1.0)
    print(f"N = {N}, {D} features, hidden {H}, on {jax.devices()[0].device_kind}:")
    print(f"{'model':32s} {'ruled':>7s} {'batch grad':>10s} {'norms':>6s} {'clipped':>8s} {'vmap norms':>10s}")
    for label, loss, p in models():
        ruled = sum(r["path"] == "rule" for r in engine.explain(loss, p, xs, ys))
        method = "ghost" if ruled else "vmap"  # no rule at all: the rules path would raise
        tb, tn, tc, tv = _best([lambda: engine.batch_grad(loss, p, xs, ys),
                                lambda: engine.per_example_norms(loss, p, xs, ys, method=method),
                                lambda: engine.clipped_grad_sum(loss, p, xs, ys, 1.0, method=method),
                                lambda: engine.per_example_norms(loss, p, xs, ys, method="vmap")], rounds=10)
        print(f"{label:32s} {ruled:3d}/{len(p):<3d} {tb * 1e3:7.2f} ms {tn / tb:5.2f}x {tc / tb:7.2f}x {tv / tb:9.2f}x",
              flush=True)


if __name__ == "__main__":
    main()
