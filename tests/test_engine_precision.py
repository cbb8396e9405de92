"""The engine under low precision: bfloat16 parameters, and float32 parameters with bfloat16 compute.

Oracle: a Python loop of `jax.grad` on the same model, reduced in float64. bfloat16 forward and backward
passes are only defined to a rounding (XLA may keep a fused intermediate in float32 in one program and not in
another), so agreement is asked to one bfloat16 ulp (2⁻⁸); what must hold exactly is DP-SGD's bound: each
example's clipped contribution has norm ≤ C (1 + 1e-6), which a norm or sum formed in bfloat16 breaks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradlab import engine
from testdata import normal, randint

N, CHUNK = 10, 4  # N not a multiple of the chunk
BF16_ULP = 2.0**-8
bf16 = jnp.bfloat16


def _cast(tree, dtype):
    return jax.tree.map(lambda a: a.astype(dtype), tree)


def _mlp():
    p = {"w1": normal(0, (8, 16)), "b1": normal(1, (16,), 0.1), "w2": normal(2, (16, 3), 0.3)}
    xs, ys = normal(3, (N, 8)), normal(4, (N, 3))
    return p, xs, ys


def _mlp_loss(p, x, y):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return jnp.sum((h @ p["w2"] - y) ** 2)


def bf16_params():
    """The whole model in bfloat16: params, inputs, compute."""
    p, xs, ys = _mlp()
    return _mlp_loss, _cast(p, bf16), xs.astype(bf16), ys.astype(bf16), {"['w1']", "['b1']", "['w2']"}


def _mixed_loss(p, x, y):
    h = _cast(p, bf16)
    return _mlp_loss(h, x.astype(bf16), y.astype(bf16)).astype(jnp.float32)


def mixed_precision():
    """float32 params (the optimizer's master copy), cast to bfloat16 for the forward pass."""
    p, xs, ys = _mlp()
    return _mixed_loss, p, xs, ys, {"['w1']", "['b1']", "['w2']"}


def _tokens_loss(p, ids, y):
    h = jnp.tanh(p["emb"][ids] @ p["w"])  # (T, 16): a dense layer over tokens (the ghost norm)
    logits = h.mean(0) @ p["head"]
    return (jax.nn.logsumexp(logits) - logits[y]).astype(jnp.float32)


def bf16_tokens():
    """Embedding + a dense layer on every token, bfloat16: the gram (ghost) and embedding rules."""
    p = {"emb": normal(5, (30, 16)), "w": normal(6, (16, 16), 0.3), "head": normal(7, (16, 4), 0.3)}
    ids = randint(0, (N, 6), 30, 2, 5)
    return _tokens_loss, _cast(p, bf16), ids, jnp.arange(N) % 4, {"['emb']", "['w']", "['head']"}


def _conv_loss(p, x, y):
    z = jax.lax.conv_general_dilated(x[None].astype(bf16), p["k"].astype(bf16), (1, 1), "SAME")
    return jnp.sum((jax.nn.relu(z).reshape(-1) @ p["w"].astype(bf16) - y) ** 2).astype(jnp.float32)


def mixed_conv():
    """A convolution (patches rule) with float32 params and bfloat16 compute."""
    p = {"k": normal(11, (3, 2, 3, 3), 0.5), "w": normal(12, (3 * 25, 2), 0.2)}
    xs, ys = normal(13, (N, 2, 5, 5)), normal(14, (N, 2))
    return _conv_loss, p, xs, ys, {"['k']", "['w']"}


MODELS = [bf16_params, mixed_precision, bf16_tokens, mixed_conv]
SLOW = (bf16_tokens, mixed_conv)  # > 10 s each on 2 busy cores; the MLPs pin the dense rule quickly


def _loop(loss, params, xs, ys):
    """Per-example gradients by a Python loop of jax.grad, as float64 (N, *shape) arrays in tree order."""
    g = jax.jit(jax.grad(loss))
    rows = [jax.tree.leaves(g(params, xs[i], ys[i])) for i in range(N)]
    return [np.stack([np.asarray(r[k], np.float64) for r in rows]) for k in range(len(rows[0]))]


def _rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.max(np.abs(got - want)) / np.max(np.abs(want))


def _per_example(leaves):
    """(N, P): per-example gradients (a list of (N, …) leaves) as rows."""
    return np.concatenate([np.reshape(a, (N, -1)) for a in leaves], 1)


def _assert_sum(got, per_example, scale, what):
    """Σᵢ scaleᵢ·gᵢ with each gᵢ known to one ulp of its largest entry (as the per-example gradients are
    checked): |got − want| ≤ ulp · Σᵢ |scaleᵢ|·max|gᵢ| (a sum's cancellation can make its error large
    relative to itself, never to its terms)."""
    err = np.max(np.abs(np.asarray(got, np.float64) - np.tensordot(scale, per_example, axes=1)))
    bound = BF16_ULP * np.sum(np.abs(scale) * np.abs(_per_example([per_example])).max(1))
    assert err <= bound, f"{what}: error {err:.1e} > {bound:.1e}"


@pytest.mark.parametrize("method", ["auto", "vmap"])
@pytest.mark.parametrize("make", [pytest.param(f, id=f.__name__, marks=[pytest.mark.slow] if f in SLOW else [])
                                  for f in MODELS])
def test_low_precision_matches_the_loop_and_clipped_norms_stay_below_c(make, method):
    loss, params, xs, ys, ruled = make()
    if method == "auto":  # the rules are what is being tested
        assert {r["leaf"] for r in engine.explain(loss, params, xs, ys) if r["path"] == "rule"} == ruled
    want = _loop(loss, params, xs, ys)
    names = engine.leaf_names(params)
    sq = np.stack([np.sum(w.reshape(N, -1) ** 2, 1) for w in want], 1)
    norms = np.sqrt(sq.sum(1))

    grads = jax.tree.leaves(engine.per_example_grads(loss, params, xs, ys, chunk_size=CHUNK, method=method))
    for name, g, w in zip(names, grads, want):
        assert g.dtype == jax.tree.leaves(params)[names.index(name)].dtype, name  # the loop's dtype
        assert _rel(g, w) <= BF16_ULP, f"grads {name}: {_rel(g, w):.1e}"
    got = engine.per_example_norms(loss, params, xs, ys, chunk_size=CHUNK, method=method)
    assert got.dtype == jnp.float32
    assert np.max(np.abs(np.asarray(got, np.float64) / norms - 1)) <= BF16_ULP
    layer = engine.per_example_layer_norms(loss, params, xs, ys, chunk_size=CHUNK, method=method)
    for j, name in enumerate(names):
        assert np.max(np.abs(np.asarray(layer[name], np.float64) / np.sqrt(sq[:, j]) - 1)) <= BF16_ULP, name

    v = [np.asarray(normal(20 + j, w.shape[1:])) for j, w in enumerate(want)]
    vt = jax.tree.unflatten(jax.tree.structure(params), [jnp.asarray(a, jnp.float32) for a in v])
    dots = np.asarray(engine.per_example_dots(loss, params, xs, ys, vt, chunk_size=CHUNK, method=method), np.float64)
    g, vec = _per_example(want), np.concatenate([a.ravel() for a in v])
    assert np.all(np.abs(dots - g @ vec) <= BF16_ULP * np.abs(g).max(1) * np.abs(vec).sum()), "dots"

    c = float(np.median(norms))
    weights = np.linspace(0.5, 1.5, N).astype(np.float32)
    total = engine.clipped_grad_sum(loss, params, xs, ys, c, weights=weights, chunk_size=CHUNK, method=method)
    scale = np.minimum(1.0, c / norms) * weights
    for name, g, w in zip(names, jax.tree.leaves(total), want):
        assert g.dtype == jnp.float32, name  # accumulated in float32, never rounded back to bfloat16
        _assert_sum(g, w, scale, f"clipped sum {name}")

    # the sensitivity bound, example by example: weights e_i leave example i's clipped gradient alone
    c = float(np.min(norms)) / 2  # every example is clipped
    for i in range(N):
        alone = engine.clipped_grad_sum(loss, params, xs, ys, c, weights=np.eye(N, dtype=np.float32)[i],
                                        chunk_size=CHUNK, method=method)
        norm = np.sqrt(sum(np.sum(np.asarray(a, np.float64) ** 2) for a in jax.tree.leaves(alone)))
        assert norm <= c * (1 + 1e-6), f"example {i}: clipped norm {norm} > C = {c}"
        assert norm >= c * (1 - BF16_ULP)
