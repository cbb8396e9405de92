"""A zoo of user-written losses: every engine function against a Python loop of `jax.grad`.

Each model is written the way people write JAX (dict params, `lax` calls, Equinox, Python floats): convolutions,
embeddings, tied weights, an LSTM and a GRU by `lax.scan`, BatchNorm in inference mode, dropout with a PRNG key per
example, `lax.cond` / `switch` / `while_loop` / `fori_loop`, a `custom_vjp` activation, `jax.checkpoint`, a
one-block GPT (position embeddings, packed QKV, a tied head), and Flax models as linen and NNX users write them
(MLP, CNN, attention, a GPT with a tied head). N = 6 with chunks of 4: the last chunk is padded.
The oracle is a per-example loop of `jax.grad`, reduced with NumPy (float64); the engine's default
path (per-layer rules read from the traced loss, exact fallback for every other leaf) must agree
within a max relative error of 1e-4 in float32. Each model also names which leaves must take a
rule, so a silent fallback to `vmap(grad)` everywhere would fail the test.
"""

from __future__ import annotations

import functools
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from jax import lax

from gradlab import engine, losses, models
from testdata import filled, normal, randint

N = 6
KEYS = jax.random.split(jax.random.key(7), 16)


def _normal(i, shape, scale=0.5):
    return normal(i, shape, scale)


def layer_norm(h, g, b):
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return (h - mu) / jnp.sqrt(var + 1e-5) * g + b


# ------------------------------------------------------------------ the zoo


def conv_zoo():
    """Convs with stride, padding, dilation and groups (NCHW and NHWC), reduce_window max-pool, NLL."""
    p = {
        "c1": _normal(0, (4, 2, 3, 3)), "b1": _normal(1, (4,)),
        "c2": _normal(2, (6, 2, 3, 3)),                       # groups=2: 4 -> 6 channels
        "c3": _normal(3, (2, 2, 6, 4)),                       # HWIO, stride 2, dilation handled below
        "w": _normal(4, (4 * 2 * 2, 3)),
    }

    def loss(p, x, y):
        z = lax.conv_general_dilated(x[None], p["c1"], (1, 1), ((1, 1), (1, 1)))
        z = jax.nn.relu(z + p["b1"][None, :, None, None])
        z = lax.conv_general_dilated(z, p["c2"], (1, 1), ((2, 2), (2, 2)), rhs_dilation=(2, 2),
                                     feature_group_count=2)
        z = jnp.tanh(z)
        z = jnp.transpose(z, (0, 2, 3, 1))  # NHWC
        z = lax.conv_general_dilated(z, p["c3"], (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        z = lax.reduce_window(z, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        logits = z.reshape(-1) @ p["w"]
        return -jax.nn.log_softmax(logits)[y]

    xs = _normal(5, (N, 2, 8, 8), 1.0)
    ys = jnp.arange(N) % 3
    return loss, p, xs, ys, {"['c1']", "['b1']", "['c2']", "['c3']", "['w']"}


def token_zoo():
    """Embedding table[ids] -> LayerNorm -> Linear on every token -> mean pool -> Linear (a Python-float temperature)."""
    p = {
        "emb": _normal(0, (50, 8)), "ln_g": jnp.ones(8), "ln_b": jnp.zeros(8),
        "w1": _normal(1, (8, 16)), "b1": _normal(2, (16,)), "head": _normal(3, (16, 4)), "temp": 1.5,
    }

    def loss(p, ids, y):
        h = layer_norm(p["emb"][ids], p["ln_g"], p["ln_b"])
        h = jax.nn.gelu(h @ p["w1"] + p["b1"])
        logits = h.mean(0) @ p["head"] / p["temp"]
        return jax.nn.logsumexp(logits) - logits[y]

    ids = randint(4, (N, 5), 50, 3, 7)  # repeated ids within and across examples
    ids = ids.at[:, 4].set(ids[:, 0])
    return loss, p, ids, jnp.arange(N) % 4, {"['emb']", "['ln_g']", "['ln_b']", "['w1']", "['b1']", "['head']"}


def tied_zoo():
    """Tied weights (the table also projects back to the vocabulary) and an L2 term inside the loss (a gradient
    the same for every example, added to the dense rule's)."""
    p = {"emb": _normal(0, (20, 6)), "w": _normal(1, (6, 6)), "v": _normal(2, (6, 6))}

    def loss(p, ids, y):
        h = jnp.tanh(p["emb"][ids] @ p["w"])                   # emb: used twice (a lookup and a dense layer)
        h = h @ p["v"]
        logits = h.mean(0) @ p["emb"].T
        return jax.nn.logsumexp(logits) - logits[y] + 0.01 * jnp.sum(p["v"] ** 2)   # v: dense + a data-free penalty

    ids = randint(3, (N, 4), 20)
    return loss, p, ids, jnp.arange(N) % 20, {"['emb']", "['w']", "['v']"}


def floats_zoo():
    """The seeds' Python floats `w, b = 1.0, 0.0` next to a weight matrix (einsum, batch of positions)."""
    p = (1.0, 0.0, _normal(0, (3, 4)))

    def loss(p, x, y):
        w, b, m = p
        z = jnp.einsum("ti,io->to", x, m)
        return (w * z.sum() + b - y) ** 2

    return loss, p, _normal(1, (N, 5, 3), 1.0), _normal(2, (N,), 1.0), {"[0]", "[1]", "[2]"}


def transposed_conv_zoo():
    """lhs_dilation (a transposed convolution: the conv rule on the dilated input's patches) and a weight passed
    through relu (the dense rule for relu(u), then relu's VJP at u)."""
    p = {"k": _normal(0, (2, 1, 3, 3)), "u": _normal(1, (4, 3)), "r": _normal(2, (2 * 9 * 9, 2))}

    def loss(p, x, y):
        z = lax.conv_general_dilated(x[None], p["k"], (1, 1), ((1, 1), (1, 1)), lhs_dilation=(2, 2))
        q = x.reshape(-1)[:4] @ jax.nn.relu(p["u"])
        return jnp.sum((z.reshape(-1) @ p["r"] - y) ** 2) + jnp.sum(q ** 2)

    return loss, p, _normal(3, (N, 1, 5, 5), 1.0), _normal(4, (N, 2), 1.0), {"['k']", "['r']", "['u']"}


def equinox_cnn_zoo():
    """gradlab's Equinox CNN with a hand-written loss (no registration)."""
    m = filled(eqx.filter_eval_shape(models.CNN, (8, 8), 5, key=KEYS[0]), 0)

    def loss(model, x, y):
        return -jax.nn.log_softmax(model(x))[y]

    names = {".conv1.weight", ".conv1.bias", ".conv2.weight", ".conv2.bias", ".head.weight", ".head.bias"}
    return loss, m, _normal(1, (N, 64), 1.0), jnp.arange(N) % 5, names


def simple_cnn_zoo():
    """Seed 003's SimpleCNN (its convolutions as matrix products over patches) on 12×12 images, the seed's NLL."""
    m = models.SimpleCNN((12, 12), 4, key=KEYS[2])

    def loss(model, x, y):
        return -model(x)[y]

    names = {f".{layer}.{leaf}" for layer in ("conv1", "conv2", "fc1", "fc2") for leaf in ("weight", "bias")}
    return loss, m, _normal(3, (N, 144), 1.0), jnp.arange(N) % 4, names


def equinox_tokens_zoo():
    """eqx.nn.Embedding and eqx.nn.Linear applied per token with vmap, eqx.nn.LayerNorm, the library's MSE."""

    class Net(eqx.Module):
        emb: eqx.nn.Embedding
        norm: eqx.nn.LayerNorm
        lin: eqx.nn.Linear
        out: eqx.nn.Linear

        def __call__(self, ids):
            h = jax.vmap(self.emb)(ids)
            h = jax.vmap(self.norm)(h)
            h = jax.vmap(self.lin)(h)
            return self.out(jax.nn.relu(h).mean(0))

    def init(k):
        return Net(eqx.nn.Embedding(30, 8, key=k[0]), eqx.nn.LayerNorm(8), eqx.nn.Linear(8, 8, key=k[1]),
                   eqx.nn.Linear(8, "scalar", key=k[2]))

    net = filled(eqx.filter_eval_shape(lambda: init(jax.random.split(KEYS[5], 3))), 1)
    ids = randint(6, (N, 6), 30, 1, 3)
    ruled = {".emb.weight", ".norm.weight", ".norm.bias", ".lin.weight", ".lin.bias", ".out.weight", ".out.bias"}
    return losses.mse, net, ids, _normal(7, (N,), 1.0), ruled


def _lstm_cell(p, carry, x_proj):
    """One LSTM step (gates i, f, g, o) given the input's projection."""
    h, c = carry
    i, f, g, o = jnp.split(x_proj + h @ p["w_hh"] + p["b"], 4)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h


def lstm_loss(p, x, y):
    """An LSTM over the steps of `x (T, d)` by `lax.scan`, the input weight inside the step (as most users write
    it), then a classifier on the last hidden state. Shared with benchmarks/rule_coverage.py."""
    hd = p["w_hh"].shape[0]
    step = lambda carry, xt: _lstm_cell(p, carry, xt @ p["w_ih"])  # noqa: E731
    (h, _), _ = lax.scan(step, (jnp.zeros(hd), jnp.zeros(hd)), x)
    return -jax.nn.log_softmax(h @ p["head"])[y]


def gru_loss(p, x, y):
    """A GRU over the steps of `x (T, d)` by `lax.scan`, the input projection hoisted out of the loop (a dense
    layer on every step), then a regression head on the mean hidden state. Shared with benchmarks/rule_coverage.py."""
    hd = p["w_hh"].shape[0]

    def step(h, xp):
        r, z, n = jnp.split(xp + p["b"], 3)
        hr, hz, hn = jnp.split(h @ p["w_hh"], 3)
        r, z = jax.nn.sigmoid(r + hr), jax.nn.sigmoid(z + hz)
        h = (1 - z) * jnp.tanh(n + r * hn) + z * h
        return h, h

    _, hs = lax.scan(step, jnp.zeros(hd), x @ p["w_ih"])
    return (hs.mean(0) @ p["head"] - y) ** 2


def lstm_zoo():
    """An LSTM over 5 steps (`lstm_loss`): every weight, the gate bias included, is used on every step."""
    d, hd = 3, 4
    p = {"w_ih": _normal(0, (d, 4 * hd)), "w_hh": _normal(1, (hd, 4 * hd)), "b": _normal(2, (4 * hd,)),
         "head": _normal(3, (hd, 2))}
    return lstm_loss, p, _normal(4, (N, 5, d), 1.0), jnp.arange(N) % 2, set(engine.leaf_names(p))


def gru_zoo():
    """A GRU over 5 steps (`gru_loss`), the input projection hoisted out of the loop."""
    d, hd = 3, 4
    p = {"w_ih": _normal(5, (d, 3 * hd)), "w_hh": _normal(6, (hd, 3 * hd)), "b": _normal(7, (3 * hd,)),
         "head": _normal(8, (hd,))}
    return gru_loss, p, _normal(9, (N, 5, d), 1.0), _normal(10, (N,), 1.0), set(engine.leaf_names(p))


def batchnorm_inference_zoo():
    """Conv -> BatchNorm in inference mode (running statistics are constants, γ and β are learned) -> head."""
    mean, var = _normal(11, (3,)), 1.0 + jnp.abs(_normal(12, (3,)))  # a trained model's running statistics
    p = {"k": _normal(0, (3, 1, 3, 3)), "gamma": 1.0 + _normal(1, (3,), 0.1), "beta": _normal(2, (3,), 0.1),
         "w": _normal(3, (3 * 16, 2))}

    def loss(p, x, y):
        z = lax.conv_general_dilated(x[None, None], p["k"], (1, 1), "SAME")[0]
        z = (z - mean[:, None, None]) / jnp.sqrt(var[:, None, None] + 1e-5)
        z = jax.nn.relu(z * p["gamma"][:, None, None] + p["beta"][:, None, None])
        return -jax.nn.log_softmax(z.reshape(-1) @ p["w"])[y]

    return loss, p, _normal(4, (N, 4, 4), 1.0), jnp.arange(N) % 2, {"['k']", "['gamma']", "['beta']", "['w']"}


def dropout_zoo():
    """Dropout with a typed PRNG key per example, carried in xs next to the input (a pytree of inputs)."""
    p = {"w1": _normal(0, (4, 8)), "b1": _normal(1, (8,)), "w2": _normal(2, (8, 3))}

    def loss(p, x, y):
        key, v = x
        h = jax.nn.relu(v @ p["w1"] + p["b1"])
        h = h * jax.random.bernoulli(key, 0.75, h.shape) / 0.75
        return -jax.nn.log_softmax(h @ p["w2"])[y]

    xs = (jax.random.split(KEYS[13], N), _normal(14, (N, 4), 1.0))
    return loss, p, xs, jnp.arange(N) % 3, {"['w1']", "['b1']", "['w2']"}


def control_flow_zoo():
    """`lax.cond` on the input, `lax.switch` on the label, a `while_loop` on the input only (not
    differentiable in the params), and a `fori_loop` with static bounds (a scan) that applies a weight 3 times."""
    p = {"w": _normal(0, (4, 4)), "a": _normal(1, (4, 2)), "b": _normal(2, (4, 2)),
         "heads": _normal(3, (3, 2)), "r": _normal(4, (4, 4), 0.3)}

    def loss(p, x, y):
        def halve(v):  # rescale the input until it is short: data-dependent trip count, no parameters inside
            return lax.while_loop(lambda v: jnp.sum(v * v) > 1.0, lambda v: v / 2, v)

        h = jnp.tanh(halve(x) @ p["w"])
        h = lax.fori_loop(0, 3, lambda _, h: jnp.tanh(h @ p["r"]), h)
        z = lax.cond(x[0] > 0, lambda h: h @ p["a"], lambda h: jnp.sin(h @ p["b"]), h)
        branches = [lambda z, k=k: z * p["heads"][k] for k in range(3)]
        return jnp.sum(lax.switch(y, branches, z) ** 2)

    return loss, p, _normal(5, (N, 4), 2.0), jnp.arange(N) % 3, set(engine.leaf_names(p))


@jax.custom_vjp
def _clip_relu(z):
    return jnp.maximum(z, 0.0)


def _clip_relu_fwd(z):
    return _clip_relu(z), z


def _clip_relu_bwd(z, g):  # a straight-through gradient, clipped: not the derivative of the forward
    return (jnp.clip(g, -0.5, 0.5) * (z > -1.0),)


_clip_relu.defvjp(_clip_relu_fwd, _clip_relu_bwd)


def custom_vjp_checkpoint_zoo():
    """A `custom_vjp` activation with its own backward rule, and a `jax.checkpoint`ed (rematerialized) block."""
    p = {"w1": _normal(0, (5, 6)), "w2": _normal(1, (6, 6)), "b2": _normal(2, (6,)), "w3": _normal(3, (6, 2))}

    @jax.checkpoint
    def block(p, h):
        return jnp.tanh(h @ p["w2"] + p["b2"])

    def loss(p, x, y):
        h = _clip_relu(x @ p["w1"])
        return jnp.sum((block(p, h) @ p["w3"] - y) ** 2)

    return loss, p, _normal(4, (N, 5), 1.0), _normal(5, (N, 2), 1.0), {"['w1']", "['w2']", "['b2']", "['w3']"}


def gpt_block_loss(p, ids, target, *, t, d):
    """One GPT block's next-token loss for ONE sequence `ids (t,)`; the head is `p["head"]`, or tied to `p["wte"]`
    (used twice) when `p` has none. Shared with benchmarks/rule_coverage.py."""
    h = p["wte"][ids] + p["wpe"][:t]
    q, k, val = jnp.split(layer_norm(h, p["ln1_g"], p["ln1_b"]) @ p["w_qkv"], 3, axis=-1)
    att = jnp.where(jnp.tril(jnp.ones((t, t), bool)), q @ k.T / jnp.sqrt(d), -1e9)
    h = h + jax.nn.softmax(att, -1) @ val @ p["w_o"]
    h = h + jax.nn.gelu(layer_norm(h, p["ln2_g"], p["ln2_b"]) @ p["w_fc"] + p["b_fc"]) @ p["w_proj"]
    logits = h @ (p["head"] if "head" in p else p["wte"].T)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, target[:, None], 1)[:, 0])


def gpt_zoo():
    """A one-block GPT in plain JAX: token and position embeddings (`wpe[:T]` added), pre-LayerNorm, causal
    attention from a packed QKV weight, an MLP, and a head tied to the token embedding (used twice)."""
    v, t, d = 12, 4, 8
    p = {"wte": _normal(0, (v, d)), "wpe": _normal(1, (6, d), 0.1), "ln1_g": 1.0 + _normal(2, (d,), 0.1),
         "ln1_b": _normal(3, (d,), 0.1), "w_qkv": _normal(4, (d, 3 * d)), "w_o": _normal(5, (d, d)),
         "ln2_g": 1.0 + _normal(6, (d,), 0.1), "ln2_b": _normal(7, (d,), 0.1), "w_fc": _normal(8, (d, 2 * d)),
         "b_fc": _normal(9, (2 * d,), 0.1), "w_proj": _normal(10, (2 * d, d))}

    ids = randint(11, (N, t + 1), v)
    ruled = set(engine.leaf_names(p))
    return functools.partial(gpt_block_loss, t=t, d=d), p, ids[:, :-1], ids[:, 1:], ruled


# ------------------------------------------------------------------ Flax (linen and NNX), as their users write them


def xent(logits, y):
    return jax.nn.logsumexp(logits) - logits[y]


def token_xent(logits, target):
    return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, target[:, None], 1)[:, 0])


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.LayerNorm()(nn.relu(nn.Dense(16)(x))))


class LinenCNN(nn.Module):
    @nn.compact
    def __call__(self, x):  # one (H, W, C) image: flax convolutions take unbatched inputs
        x = nn.avg_pool(nn.relu(nn.Conv(4, (3, 3))(x)), (2, 2), (2, 2))
        x = nn.relu(nn.Conv(6, (3, 3), strides=(2, 2))(x))
        return nn.Dense(3)(x.reshape(-1))


class LinenAttention(nn.Module):
    @nn.compact
    def __call__(self, x):  # (T, d) tokens
        h = x + nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)(nn.LayerNorm()(x))
        return nn.Dense(3)(h.mean(0))


class LinenGPT(nn.Module):
    """A one-block GPT: nn.Embed tokens, a learned position table, causal attention, an MLP, and the head tied to
    the token embedding (`wte.attend`: the table is used twice)."""

    vocab: int = 12
    d: int = 8

    @nn.compact
    def __call__(self, ids):
        wte = nn.Embed(self.vocab, self.d)
        wpe = self.param("wpe", nn.initializers.normal(0.1), (6, self.d))
        h = wte(ids) + wpe[: ids.shape[0]]
        h = h + nn.MultiHeadDotProductAttention(num_heads=2)(nn.LayerNorm()(h), mask=nn.make_causal_mask(ids))
        h = h + nn.Dense(self.d)(nn.gelu(nn.Dense(2 * self.d)(nn.LayerNorm()(h))))
        return wte.attend(nn.LayerNorm()(h))


def linen_case(model, xs, ys, per_token=False):
    """A linen model's `params` and the loss users write with `model.apply`."""
    params = filled(jax.eval_shape(model.init, KEYS[15], jax.tree.map(lambda a: a[0], xs))["params"], 2)

    def loss(p, x, y):
        logits = model.apply({"params": p}, x)
        return token_xent(logits, y) if per_token else xent(logits, y)

    return loss, params, xs, ys, set(engine.leaf_names(params))


def linen_mlp_zoo():
    """flax.linen Dense -> relu -> LayerNorm -> Dense, cross-entropy."""
    return linen_case(LinenMLP(), _normal(0, (N, 6), 1.0), jnp.arange(N) % 3)


def linen_cnn_zoo():
    """flax.linen Conv (SAME, then stride 2), avg_pool, Dense on one NHWC image."""
    return linen_case(LinenCNN(), _normal(1, (N, 8, 8, 2), 1.0), jnp.arange(N) % 3)


def linen_attention_zoo():
    """flax.linen MultiHeadDotProductAttention (DenseGeneral q, k, v, out) with a pre-LayerNorm and a residual."""
    return linen_case(LinenAttention(), _normal(2, (N, 4, 8), 1.0), jnp.arange(N) % 3)


def linen_gpt_zoo():
    """A flax.linen GPT block with a tied head (`nn.Embed.attend`), next-token loss."""
    ids = randint(12, (N, 5), 12)
    return linen_case(LinenGPT(), ids[:, :-1], ids[:, 1:], per_token=True)


class NNXMLP(nnx.Module):
    def __init__(self, rngs):
        self.l1, self.norm, self.l2 = nnx.Linear(6, 16, rngs=rngs), nnx.LayerNorm(16, rngs=rngs), nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(self.norm(jax.nn.relu(self.l1(x))))


class NNXCNN(nnx.Module):
    def __init__(self, rngs):
        self.c1 = nnx.Conv(2, 4, (3, 3), rngs=rngs)
        self.c2 = nnx.Conv(4, 6, (3, 3), strides=(2, 2), rngs=rngs)
        self.head = nnx.Linear(6 * 2 * 2, 3, rngs=rngs)

    def __call__(self, x):
        x = nnx.avg_pool(jax.nn.relu(self.c1(x)), (2, 2), (2, 2))
        return self.head(jax.nn.relu(self.c2(x)).reshape(-1))


class NNXAttention(nnx.Module):
    def __init__(self, rngs):
        self.norm = nnx.LayerNorm(8, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=8, qkv_features=8, decode=False, rngs=rngs)
        self.head = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        return self.head((x + self.attn(self.norm(x))).mean(0))


class NNXGPT(nnx.Module):
    """The same GPT block in NNX: nnx.Embed with `attend` as the tied head, an nnx.Param position table."""

    def __init__(self, rngs, vocab=12, d=8):
        self.wte = nnx.Embed(vocab, d, rngs=rngs)
        self.wpe = nnx.Param(0.1 * jax.random.normal(rngs.params(), (6, d)))
        self.ln1, self.ln2, self.lnf = (nnx.LayerNorm(d, rngs=rngs) for _ in range(3))
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=d, decode=False, rngs=rngs)
        self.fc, self.proj = nnx.Linear(d, 2 * d, rngs=rngs), nnx.Linear(2 * d, d, rngs=rngs)

    def __call__(self, ids):
        h = self.wte(ids) + self.wpe[: ids.shape[0]]
        h = h + self.attn(self.ln1(h), mask=nnx.make_causal_mask(ids))
        h = h + self.proj(jax.nn.gelu(self.fc(self.ln2(h))))
        return self.wte.attend(self.lnf(h))


def nnx_case(module, xs, ys, per_token=False):
    """An NNX module split into (graphdef, state); the loss merges them, as `nnx.split` users write it."""
    graphdef, state = nnx.split(module)

    def loss(st, x, y):
        logits = nnx.merge(graphdef, st)(x)
        return token_xent(logits, y) if per_token else xent(logits, y)

    return loss, state, xs, ys, set(engine.leaf_names(state))


def nnx_mlp_zoo():
    """flax.nnx Linear -> relu -> LayerNorm -> Linear."""
    return nnx_case(NNXMLP(nnx.Rngs(0)), _normal(3, (N, 6), 1.0), jnp.arange(N) % 3)


def nnx_cnn_zoo():
    """flax.nnx Conv (SAME, then stride 2) and Linear on one NHWC image."""
    return nnx_case(NNXCNN(nnx.Rngs(1)), _normal(4, (N, 8, 8, 2), 1.0), jnp.arange(N) % 3)


def nnx_attention_zoo():
    """flax.nnx MultiHeadAttention (LinearGeneral q, k, v, out) with a pre-LayerNorm and a residual."""
    return nnx_case(NNXAttention(nnx.Rngs(2)), _normal(5, (N, 4, 8), 1.0), jnp.arange(N) % 3)


def nnx_gpt_zoo():
    """A flax.nnx GPT block with a tied head (`nnx.Embed.attend`), next-token loss."""
    ids = randint(13, (N, 5), 12)
    return nnx_case(NNXGPT(nnx.Rngs(3)), ids[:, :-1], ids[:, 1:], per_token=True)


# ------------------------------------------------------------------ Opacus' per-layer matrix, written in JAX
# (opacus/tests/grad_samples: conv 1-D/2-D/3-D, linear, embedding, embedding bag, LayerNorm, GroupNorm,
# InstanceNorm, RNN/LSTM/GRU, multi-head attention); the layers not written elsewhere in the zoo.


def conv1d_zoo():
    """A 1-D convolution (NCL, stride 2, padding 1) and a dilated one, then a linear head: audio-like sequences."""
    p = {"k1": _normal(0, (4, 2, 3)), "b1": _normal(1, (4,)), "k2": _normal(2, (3, 4, 3)), "w": _normal(3, (3 * 4, 2))}

    def loss(p, x, y):
        z = lax.conv_general_dilated(x[None], p["k1"], (2,), ((1, 1),))
        z = jnp.tanh(z + p["b1"][None, :, None])
        z = lax.conv_general_dilated(z, p["k2"], (1,), "VALID", rhs_dilation=(2,))
        return -jax.nn.log_softmax(z.reshape(-1) @ p["w"])[y]

    return loss, p, _normal(4, (N, 2, 16), 1.0), jnp.arange(N) % 2, {"['k1']", "['b1']", "['k2']", "['w']"}


def conv3d_zoo():
    """A 3-D convolution (NCDHW, SAME padding) with a bias, a mean over space, a linear head: small volumes."""
    p = {"k": _normal(0, (3, 1, 3, 3, 3)), "b": _normal(1, (3,)), "w": _normal(2, (3, 2))}

    def loss(p, x, y):
        z = lax.conv_general_dilated(x[None, None], p["k"], (1, 1, 1), "SAME")[0]
        z = jax.nn.gelu(z + p["b"][:, None, None, None]).mean((1, 2, 3))
        return -jax.nn.log_softmax(z @ p["w"])[y]

    return loss, p, _normal(3, (N, 4, 4, 4), 1.0), jnp.arange(N) % 2, {"['k']", "['b']", "['w']"}


def embedding_bag_zoo():
    """An embedding bag with mean pooling over a variable-length bag (ids padded, a 0/1 mask per id; bags of 1
    to 5 ids, repeated ids), then a linear classifier: `torch.nn.EmbeddingBag(mode="mean")` per example."""
    p = {"emb": _normal(0, (30, 6)), "w": _normal(1, (6, 3)), "b": _normal(2, (3,))}

    def loss(p, x, y):
        ids, mask = x
        bag = (p["emb"][ids] * mask[:, None]).sum(0) / mask.sum()
        return xent(bag @ p["w"] + p["b"], y)

    ids = randint(3, (N, 5), 30, 2, 4)
    mask = (jnp.arange(5)[None, :] <= jnp.arange(N)[:, None] % 5).astype(jnp.float32)
    return loss, p, (ids, mask), jnp.arange(N) % 3, {"['emb']", "['w']", "['b']"}


def group_instance_norm_zoo():
    """Conv -> GroupNorm (2 groups of 2 channels, affine) -> conv -> InstanceNorm (affine) -> linear head."""
    p = {"k1": _normal(0, (4, 1, 3, 3)), "gn_g": 1.0 + _normal(1, (4,), 0.1), "gn_b": _normal(2, (4,), 0.1),
         "k2": _normal(3, (2, 4, 3, 3)), "in_g": 1.0 + _normal(4, (2,), 0.1), "in_b": _normal(5, (2,), 0.1),
         "w": _normal(6, (2 * 16, 2))}

    def normalize(z, axes):
        mu = z.mean(axes, keepdims=True)
        return (z - mu) / jnp.sqrt(((z - mu) ** 2).mean(axes, keepdims=True) + 1e-5)

    def loss(p, x, y):
        z = lax.conv_general_dilated(x[None, None], p["k1"], (1, 1), "SAME")[0]  # (4, H, W)
        z = normalize(z.reshape(2, 2, 4, 4), (1, 2, 3)).reshape(4, 4, 4)
        z = jax.nn.relu(z * p["gn_g"][:, None, None] + p["gn_b"][:, None, None])
        z = lax.conv_general_dilated(z[None], p["k2"], (1, 1), "SAME")[0]  # (2, H, W)
        z = jax.nn.relu(normalize(z, (1, 2)) * p["in_g"][:, None, None] + p["in_b"][:, None, None])
        return -jax.nn.log_softmax(z.reshape(-1) @ p["w"])[y]

    return loss, p, _normal(7, (N, 4, 4), 1.0), jnp.arange(N) % 2, set(engine.leaf_names(p))


def rnn_zoo():
    """An Elman RNN (`torch.nn.RNN`, tanh) over 6 steps by `lax.scan`, both weights and biases inside the step,
    a linear head on the last hidden state."""
    d, hd = 3, 5
    p = {"w_ih": _normal(0, (d, hd)), "b_ih": _normal(1, (hd,)), "w_hh": _normal(2, (hd, hd)), "b_hh": _normal(3, (hd,)),
         "head": _normal(4, (hd, 2))}

    def loss(p, x, y):
        step = lambda h, xt: (jnp.tanh(xt @ p["w_ih"] + p["b_ih"] + h @ p["w_hh"] + p["b_hh"]),) * 2  # noqa: E731
        h, _ = lax.scan(step, jnp.zeros(hd), x)
        return -jax.nn.log_softmax(h @ p["head"])[y]

    return loss, p, _normal(5, (N, 6, d), 1.0), jnp.arange(N) % 2, set(engine.leaf_names(p))


def equinox_attention_zoo():
    """`eqx.nn.MultiheadAttention` (2 heads, q/k/v/out projections with biases) as self-attention on (T, d) tokens,
    a residual and a mean-pooled linear head: multi-head attention as Equinox users write it."""
    k = jax.random.split(KEYS[9], 2)

    class Net(eqx.Module):
        attn: eqx.nn.MultiheadAttention
        head: eqx.nn.Linear

        def __call__(self, x):
            return self.head((x + self.attn(x, x, x)).mean(0))

    net = Net(eqx.nn.MultiheadAttention(2, 8, use_query_bias=True, use_key_bias=True, use_value_bias=True,
                                        use_output_bias=True, key=k[0]), eqx.nn.Linear(8, 3, key=k[1]))

    def loss(model, x, y):
        return xent(model(x), y)

    return loss, net, _normal(10, (N, 4, 8), 1.0), jnp.arange(N) % 3, set(engine.leaf_names(net))


OPACUS_ZOO = [conv1d_zoo, conv3d_zoo, embedding_bag_zoo, group_instance_norm_zoo, rnn_zoo, equinox_attention_zoo]


FLAX_ZOO = [linen_mlp_zoo, linen_cnn_zoo, linen_attention_zoo, linen_gpt_zoo,
            nnx_mlp_zoo, nnx_cnn_zoo, nnx_attention_zoo, nnx_gpt_zoo]


ZOO = [conv_zoo, token_zoo, tied_zoo, floats_zoo, transposed_conv_zoo, equinox_cnn_zoo, equinox_tokens_zoo,
       lstm_zoo, gru_zoo, batchnorm_inference_zoo, dropout_zoo, control_flow_zoo, custom_vjp_checkpoint_zoo,
       gpt_zoo, simple_cnn_zoo, *FLAX_ZOO, *OPACUS_ZOO]


# ------------------------------------------------------------------ the oracle and the check


def loop_grads(loss, params, xs, ys):
    """Per-example gradients by a Python loop of jax.grad, as float64 NumPy leaves (N, *shape)."""
    params = engine.as_params(params)
    diff, static = eqx.partition(params, eqx.is_inexact_array)
    g = jax.jit(jax.grad(lambda d, x, y: loss(eqx.combine(d, static), x, y)))
    rows = [g(diff, *jax.tree.map(lambda a: a[i], (xs, ys))) for i in range(N)]
    return [np.stack([np.asarray(r, np.float64) for r in leaf]) for leaf in zip(*map(jax.tree.leaves, rows))]


def assert_rel(got, want, what, scale=0.0):
    """Max relative error ≤ 1e-4; `scale` floors the denominator for a leaf whose exact gradient is zero (an
    attention key bias: softmax ignores a shift shared by all keys), which both sides only round."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), scale, 1e-12)
    assert err <= 1e-4, f"{what}: max relative error {err:.2e}"


# The slower twin of each rule family runs in the whole suite only: embeddings stay pinned by equinox_tokens_zoo,
# convolutions by conv_zoo and transposed_conv_zoo, scans by gru_zoo, typed keys in xs by test_engine_exact.py,
# elementwise scales (BatchNorm's γ, β) by the LayerNorm of equinox_tokens_zoo.
# Flax models: the NNX MLP runs in the quick subset, the NNX GPT in the whole suite, the rest with GRADLAB_ZOO=all.
# COVERAGE_ONLY models run only with GRADLAB_ZOO=all (each passed when added, 2026-11-25; 25-90 s each on the loaded
# 2-core machine, the suite's time): the linen MLP, CNN and attention (their Dense, Conv, DenseGeneral and LayerNorm
# pinned by the linen GPT and the NNX models), Opacus' conv 1-D and 3-D (the conv rule's spatial ranks; 2-D pinned
# by conv_zoo), GroupNorm/InstanceNorm (the scale rule pinned by BatchNorm and LayerNorm) and Equinox's
# MultiheadAttention (pinned by the NNX attention), the mean-pooled embedding bag (embeddings pinned by
# equinox_tokens_zoo, a loss undefined at a zero input by test_engine_exact.py) and the Elman RNN (scans: the GRU).
# Since 2026-11-26 also the linen GPT (the NNX GPT pins Flax's Embed, attention and tied head), the NNX attention
# (pinned by both GPTs), the NNX CNN (Flax's Conv: the conv rule, pinned by conv_zoo) and gradlab's CNN (pinned by
# test_engine_ghost.py's cnn case): 10-17 s each in a clean clone with an empty XLA cache.
# benchmarks/rule_coverage.py counts and times them all. The users' model set (tests/user_models.py, 62 more) runs
# through the same check in tests/test_user_models.py, also with GRADLAB_ZOO=all (two of it in the whole suite).
COVERAGE_ONLY = () if os.environ.get("GRADLAB_ZOO") == "all" else (
    linen_mlp_zoo, linen_cnn_zoo, linen_attention_zoo, conv1d_zoo, conv3d_zoo, group_instance_norm_zoo,
    equinox_attention_zoo, embedding_bag_zoo, rnn_zoo, linen_gpt_zoo, nnx_attention_zoo, nnx_cnn_zoo, equinox_cnn_zoo)
SLOW_ZOO = (token_zoo, equinox_cnn_zoo, lstm_zoo, batchnorm_inference_zoo, dropout_zoo, gpt_zoo, embedding_bag_zoo,
            rnn_zoo, *OPACUS_ZOO, *(f for f in FLAX_ZOO if f is not nnx_mlp_zoo))


@pytest.mark.parametrize("make", [pytest.param(f, marks=[pytest.mark.slow] if f in SLOW_ZOO else [], id=f.__name__)
                                  for f in ZOO if f not in COVERAGE_ONLY])
def test_every_engine_function_matches_a_loop_of_grad(make):
    check_every_engine_function(*make())


def check_every_engine_function(loss, params, xs, ys, ruled):
    """Every engine function on one model (N = 6 examples, chunks of 4: the last one padded) against
    `loop_grads`, and the leaves that take a rule are exactly `ruled`. Shared with tests/test_user_models.py."""
    rows = engine.explain(loss, params, xs, ys)
    assert {r["leaf"] for r in rows if r["path"] == "rule"} == ruled, rows
    want = loop_grads(loss, params, xs, ys)
    names = engine.leaf_names(params)

    floor = 1e-3 * max(np.max(np.abs(w)) for w in want)  # a thousandth of the largest gradient entry
    got = jax.tree.leaves(engine.per_example_grads(loss, params, xs, ys, chunk_size=4))
    for name, g, w in zip(names, got, want):
        assert g.shape == w.shape, name
        assert_rel(g, w, f"grads {name}", floor)

    sq = np.stack([np.sum(w.reshape(N, -1) ** 2, 1) for w in want], 1)  # (N, L)
    assert_rel(engine.per_example_norms(loss, params, xs, ys, chunk_size=4), np.sqrt(sq.sum(1)), "norms")
    layer = engine.per_example_layer_norms(loss, params, xs, ys, chunk_size=4)  # same compile as norms
    assert list(layer) == names
    for j, name in enumerate(names):
        assert_rel(layer[name], np.sqrt(sq[:, j]), f"layer norm {name}", 1e-3 * np.sqrt(sq.max()))

    diff = eqx.filter(engine.as_params(params), eqx.is_inexact_array)
    v = jax.tree.unflatten(jax.tree.structure(diff), [_normal(20 + j, a.shape, 1.0)
                                                       for j, a in enumerate(jax.tree.leaves(diff))])
    dots = sum(w.reshape(N, -1) @ np.asarray(vl, np.float64).ravel() for w, vl in zip(want, jax.tree.leaves(v)))
    assert_rel(engine.per_example_dots(loss, params, xs, ys, v, chunk_size=4), dots, "dots")

    norms = np.sqrt(sq.sum(1))
    c = float(np.median(norms))
    mask = (np.arange(N) % 3 != 1).astype(np.float32)  # a Poisson batch's padding mask as weights
    scale = np.minimum(1.0, c / np.maximum(norms, 1e-30)) * mask  # a zero gradient (dropout's) is not clipped
    total, got_norms = engine.clipped_grad_sum(loss, params, xs, ys, c, weights=mask, return_norms=True,
                                               chunk_size=4)
    assert_rel(got_norms, norms, "clipped_grad_sum norms")
    for name, g, w in zip(names, jax.tree.leaves(total), want):
        assert_rel(g, np.tensordot(scale, w, axes=1), f"clipped sum {name}", floor)
    for name, g, w in zip(names, jax.tree.leaves(engine.batch_grad(loss, params, xs, ys)), want):
        assert_rel(g, w.sum(0), f"batch grad {name}", N * floor)


@pytest.mark.parametrize("make", [floats_zoo, tied_zoo, transposed_conv_zoo], ids=lambda f: f.__name__)
def test_the_default_chunks_at_n_256_match_a_loop_of_grad(make):
    """N = 256 (the 6 examples repeated) with the engine's own chunking, as `benchmarks.rule_coverage --zoo-timing`
    times it: XLA:CPU compiles a chunk of 256 differently from the chunks of 4 above (a broadcast product tried for
    small contractions was exact at chunks of 4 and 7, and wrong in a YNNPACK fusion at 128 and 256)."""
    check_default_chunks_at_n_256(*make()[:4])


def check_default_chunks_at_n_256(loss, params, xs, ys):
    """Norms (rules and vmap) and the clipped sum at N = 256 (a model's 6 examples repeated, the engine's default
    chunks) against `loop_grads`. Shared with tests/test_user_models.py."""
    want = loop_grads(loss, params, xs, ys)
    xs, ys = engine.pad_examples((xs, ys), 256 - N)
    norms = np.sqrt(sum(np.sum(w.reshape(N, -1) ** 2, 1) for w in want))
    for method in ("ghost", "vmap"):
        got = engine.per_example_norms(loss, params, xs, ys, method=method)
        assert_rel(got, np.tile(norms, 43)[:256], f"norms ({method})")
    c = float(np.median(norms))
    counts = np.bincount(np.arange(256) % N, minlength=N)  # how often each example occurs
    total = engine.clipped_grad_sum(loss, params, xs, ys, c, method="ghost")
    scale = counts * np.minimum(1.0, c / norms)
    floor = 1e-3 * max(np.max(np.abs(np.tensordot(scale, w, axes=1))) for w in want)  # as in the check above
    for name, g, w in zip(engine.leaf_names(params), jax.tree.leaves(total), want):
        assert_rel(g, np.tensordot(scale, w, axes=1), f"clipped sum {name}", floor)
