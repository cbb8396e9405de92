"""The users' model set (issue 25): models written the way Flax (linen and NNX), Equinox, Haiku and plain-JAX users
write them, and the layers of Opacus' per-sample-gradient tests the zoo lacked.

Each maker returns the zoo's 5-tuple `(loss, params, xs, ys, ruled)`: the loss of ONE example, its params, N = 6
examples, and the leaf names that must take a rule. tests/test_user_models.py checks every engine function on
each against a loop of `jax.grad` (tests/test_engine_zoo.py's check); benchmarks/rule_coverage.py counts and times
them with the zoo. Small on purpose (a batch gradient of 0.1–9 ms at N = 256): the point is the ways people write
models, not their size.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import nnx
from jax import lax

from gradlab import engine
from test_engine_zoo import KEYS, N, linen_case, nnx_case, token_xent, xent
from testdata import filled, normal, randint

try:  # a test-only dependency (requirements-dev.txt); its models are left out where it is missing
    import haiku as hk
except ImportError:  # pragma: no cover
    hk = None


def _all(params) -> set:
    return set(engine.leaf_names(params))


def _labels(k):
    return jnp.arange(N) % k


# ------------------------------------------------------------------ Flax linen


class _LinenMLP(nn.Module):
    act: callable = nn.relu
    use_bias: bool = True

    @nn.compact
    def __call__(self, x):
        for width in (16, 12):
            x = self.act(nn.Dense(width, use_bias=self.use_bias)(x))
        return nn.Dense(3)(x)


def linen_mlp_gelu_nobias():
    """linen Dense(use_bias=False) -> gelu, twice, then a Dense head with a bias."""
    return linen_case(_LinenMLP(nn.gelu, False), normal(30, (N, 6)), _labels(3))


def linen_mlp_silu():
    """linen MLP with silu."""
    return linen_case(_LinenMLP(nn.silu), normal(31, (N, 6)), _labels(3))


def linen_mlp_tanh():
    """linen MLP with tanh."""
    return linen_case(_LinenMLP(nn.tanh), normal(32, (N, 6)), _labels(3))


class _LinenDropout(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dropout(0.25, deterministic=False)(nn.relu(nn.Dense(16)(x)))
        return nn.Dense(3)(x)


def linen_dropout():
    """linen Dropout (training mode), its "dropout" rng from a typed PRNG key per example carried in xs."""
    model = _LinenDropout()
    params = filled(jax.eval_shape(model.init, KEYS[0], jnp.zeros(6))["params"], 3)

    def loss(p, x, y):
        key, v = x
        return xent(model.apply({"params": p}, v, rngs={"dropout": key}), y)

    xs = (jax.random.split(jax.random.key(40), N), normal(33, (N, 6)))
    return loss, params, xs, _labels(3), _all(params)


class _LinenBN(nn.Module):
    @nn.compact
    def __call__(self, x):  # (H, W, C)
        x = nn.Conv(4, (3, 3))(x)
        x = nn.relu(nn.BatchNorm(use_running_average=True)(x))
        return nn.Dense(3)(x.mean((0, 1)))


def linen_batchnorm_inference():
    """linen Conv -> BatchNorm(use_running_average=True) with trained `batch_stats` held fixed -> Dense."""
    model = _LinenBN()
    shapes = jax.eval_shape(model.init, KEYS[1], jnp.zeros((6, 6, 2)))
    params = filled(shapes["params"], 4)
    stats = jax.tree.map(lambda s: 0.5 + jnp.abs(normal(5, s.shape)), shapes["batch_stats"])

    def loss(p, x, y):
        return xent(model.apply({"params": p, "batch_stats": stats}, x), y)

    return loss, params, normal(34, (N, 6, 6, 2)), _labels(3), _all(params)


class _LinenNorms(nn.Module):
    @nn.compact
    def __call__(self, x):  # (T, d)
        x = nn.RMSNorm()(nn.gelu(nn.Dense(8)(x)))
        x = nn.GroupNorm(num_groups=2)(nn.Dense(8)(x))
        return nn.Dense(3)(nn.LayerNorm(use_bias=False)(x).mean(0))


def linen_norms():
    """linen RMSNorm, GroupNorm (2 groups over the token's features) and a bias-free LayerNorm on tokens."""
    return linen_case(_LinenNorms(), normal(35, (N, 4, 5)), _labels(3))


class _LinenConv1D(nn.Module):
    @nn.compact
    def __call__(self, x):  # (L, C)
        x = nn.relu(nn.Conv(4, (3,), strides=(2,), padding="VALID")(x))
        x = nn.relu(nn.Conv(4, (3,), padding="SAME", feature_group_count=4)(x))  # depthwise
        x = nn.Conv(6, (1,), kernel_dilation=1)(x)                           # pointwise
        return nn.Dense(2)(x.max(0))


def linen_conv1d_depthwise():
    """linen 1-D Conv (VALID, stride 2), a depthwise conv (feature_group_count = channels, SAME), a pointwise one."""
    return linen_case(_LinenConv1D(), normal(36, (N, 15, 3)), _labels(2))


class _LinenConvT(nn.Module):
    @nn.compact
    def __call__(self, x):  # (H, W, C)
        x = nn.relu(nn.ConvTranspose(3, (3, 3), strides=(2, 2), padding="SAME")(x))
        x = nn.Conv(2, (3, 3), padding="VALID", use_bias=False)(x)
        return x.reshape(-1)


def linen_conv_transpose():
    """linen ConvTranspose (stride 2, SAME) -> VALID Conv without bias, a squared error on the decoded image."""
    model = _LinenConvT()
    params = filled(jax.eval_shape(model.init, KEYS[2], jnp.zeros((3, 3, 2)))["params"], 6)

    def loss(p, x, y):
        return jnp.sum((model.apply({"params": p}, x) - y) ** 2)

    return loss, params, normal(37, (N, 3, 3, 2)), normal(38, (N, 4 * 4 * 2)), _all(params)


class _LinenRNN(nn.Module):
    cell: str = "lstm"

    @nn.compact
    def __call__(self, x):  # (T, d): nn.RNN scans the time axis
        cell = nn.LSTMCell(6) if self.cell == "lstm" else nn.GRUCell(6)
        h = nn.RNN(cell)(x[None])[0]
        return nn.Dense(2)(h[-1])


def linen_lstm():
    """linen `nn.RNN(nn.LSTMCell)` over 5 steps, the last output to a Dense head."""
    return linen_case(_LinenRNN("lstm"), normal(39, (N, 5, 3)), _labels(2))


def linen_gru():
    """linen `nn.RNN(nn.GRUCell)` over 5 steps."""
    return linen_case(_LinenRNN("gru"), normal(40, (N, 5, 3)), _labels(2))


class _Block(nn.Module):
    @nn.compact
    def __call__(self, h, _):
        return h + nn.Dense(8)(nn.gelu(nn.Dense(8)(nn.LayerNorm()(h)))), None


class _LinenScan(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(8)(x)
        blocks = nn.scan(_Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
        h, _ = blocks()(h, None)
        return nn.Dense(3)(h)


def linen_scan_layers():
    """linen `nn.scan` over 3 residual blocks (params stacked on a layer axis): scan over layers."""
    loss, params, xs, ys, _ = linen_case(_LinenScan(), normal(41, (N, 6)), _labels(3))
    return loss, params, xs, ys, {n for n in _all(params) if "Scan_Block" not in n}  # stacked weights: no rule yet


class _LinenRemat(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(8)(x)
        for _ in range(2):
            h, _ = nn.remat(_Block)()(h, None)
        return nn.Dense(3)(h)


def linen_remat():
    """linen `nn.remat` around two residual blocks (rematerialized in the backward pass)."""
    return linen_case(_LinenRemat(), normal(42, (N, 6)), _labels(3))


class _LinenShared(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(8)(x)
        block = nn.Dense(8)  # one module called three times: its kernel and bias are shared
        for _ in range(3):
            h = h + nn.tanh(block(h))
        return nn.Dense(3)(h)


def linen_shared_block():
    """linen: one Dense applied three times (weights shared across blocks)."""
    return linen_case(_LinenShared(), normal(43, (N, 6)), _labels(3))


class _LinenGPT2(nn.Module):
    """Two GPT blocks, an untied head (Dense without bias), learned positions from nn.Embed."""

    @nn.compact
    def __call__(self, ids):
        t = ids.shape[0]
        h = nn.Embed(12, 8)(ids) + nn.Embed(6, 8)(jnp.arange(t))
        for _ in range(2):
            # self-attention (flax 0.12.12 deprecates nn.SelfAttention for this call)
            h = h + nn.MultiHeadDotProductAttention(num_heads=2)(nn.LayerNorm()(h), mask=nn.make_causal_mask(ids))
            h = h + nn.Dense(8)(nn.gelu(nn.Dense(16)(nn.LayerNorm()(h))))
        return nn.Dense(12, use_bias=False)(nn.LayerNorm()(h))


def linen_gpt_untied():
    """A two-block linen GPT: nn.Embed positions over `arange(T)`, self-attention, an untied head."""
    ids = randint(44, (N, 5), 12)
    return linen_case(_LinenGPT2(), ids[:, :-1], ids[:, 1:], per_token=True)


class _LinenEmbedAttn(nn.Module):
    @nn.compact
    def __call__(self, ids):
        h = nn.Embed(20, 8)(ids)
        h = nn.MultiHeadDotProductAttention(num_heads=4, use_bias=False)(h, h)
        return nn.Dense(3)(h.mean(0))


def linen_embed_attention():
    """linen Embed -> MultiHeadDotProductAttention (4 heads, no biases) -> mean -> Dense: a text classifier."""
    return linen_case(_LinenEmbedAttn(), randint(45, (N, 5), 20), _labels(3))


# ------------------------------------------------------------------ Flax NNX


class _NNXDropout(nnx.Module):
    def __init__(self, rngs):
        self.l1, self.l2 = nnx.Linear(6, 16, rngs=rngs), nnx.Linear(16, 3, rngs=rngs)
        self.drop = nnx.Dropout(0.25)

    def __call__(self, x, key):
        return self.l2(self.drop(jax.nn.relu(self.l1(x)), deterministic=False, rngs=key))


def nnx_dropout():
    """nnx.Dropout in training mode with a per-example key passed as `rngs=` (a typed key in xs)."""
    graphdef, state = nnx.split(_NNXDropout(nnx.Rngs(4)))

    def loss(st, x, y):
        key, v = x
        return xent(nnx.merge(graphdef, st)(v, key), y)

    xs = (jax.random.split(jax.random.key(41), N), normal(46, (N, 6)))
    return loss, state, xs, _labels(3), _all(state)


class _NNXBN(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(2, 4, (3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(4, use_running_average=True, rngs=rngs)
        self.head = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        return self.head(jax.nn.relu(self.bn(self.conv(x))).mean((0, 1)))


def nnx_batchnorm_inference():
    """nnx.BatchNorm(use_running_average=True): `nnx.split(model, nnx.Param, ...)`, the BatchStat state fixed."""
    model = _NNXBN(nnx.Rngs(5))
    model.bn.mean[...] = normal(47, (4,), 0.3)  # flax 0.12.12 deprecates the `.value` setter
    model.bn.var[...] = 0.5 + jnp.abs(normal(48, (4,)))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p, x, y):
        return xent(nnx.merge(graphdef, p, rest)(x), y)

    return loss, params, normal(49, (N, 6, 6, 2)), _labels(3), _all(params)


class _NNXNorms(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(5, 8, use_bias=False, rngs=rngs)
        self.rms = nnx.RMSNorm(8, rngs=rngs)
        self.gn = nnx.GroupNorm(8, num_groups=2, rngs=rngs)
        self.head = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):  # (T, 5)
        return self.head(self.gn(self.rms(jax.nn.gelu(self.l1(x)))).mean(0))


def nnx_norms():
    """nnx Linear(use_bias=False) -> gelu -> RMSNorm -> GroupNorm (2 groups of 4) -> mean over tokens -> Linear."""
    return nnx_case(_NNXNorms(nnx.Rngs(6)), normal(50, (N, 4, 5)), _labels(3))


class _NNXConv1D(nnx.Module):
    def __init__(self, rngs):
        self.c1 = nnx.Conv(3, 6, (5,), strides=(2,), padding="VALID", rngs=rngs)
        self.dw = nnx.Conv(6, 6, (3,), feature_group_count=6, rngs=rngs)
        self.head = nnx.Linear(6, 2, rngs=rngs)

    def __call__(self, x):  # (L, C)
        return self.head(jax.nn.silu(self.dw(jax.nn.silu(self.c1(x)))).mean(0))


def nnx_conv1d_depthwise():
    """nnx 1-D Conv (VALID, stride 2) and a depthwise Conv (feature_group_count = 6)."""
    return nnx_case(_NNXConv1D(nnx.Rngs(7)), normal(51, (N, 16, 3)), _labels(2))


class _NNXConvT(nnx.Module):
    def __init__(self, rngs):
        self.up = nnx.ConvTranspose(2, 3, (2, 2), strides=(2, 2), rngs=rngs)
        self.head = nnx.Linear(3 * 16, 2, rngs=rngs)

    def __call__(self, x):
        return self.head(jax.nn.relu(self.up(x)).reshape(-1))


def nnx_conv_transpose():
    """nnx.ConvTranspose (kernel 2, stride 2: an upsampling decoder layer) -> Linear."""
    return nnx_case(_NNXConvT(nnx.Rngs(8)), normal(52, (N, 2, 2, 2)), _labels(2))


class _NNXEmbedAttn(nnx.Module):
    def __init__(self, rngs):
        self.emb = nnx.Embed(20, 8, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=8, decode=False, rngs=rngs)
        self.head = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, ids):
        h = self.emb(ids)
        return self.head((h + self.attn(h)).max(0))


def nnx_embed_attention():
    """nnx.Embed -> MultiHeadAttention (self-attention) with a residual -> max pool -> Linear."""
    return nnx_case(_NNXEmbedAttn(nnx.Rngs(9)), randint(53, (N, 5), 20), _labels(3))


class _NNXRNN(nnx.Module):
    def __init__(self, cell, rngs):
        self.rnn = nnx.RNN(cell(3, 6, rngs=rngs))
        self.head = nnx.Linear(6, 2, rngs=rngs)

    def __call__(self, x):  # (T, d): nnx.RNN wants a batch axis
        return self.head(self.rnn(x[None])[0, -1])


def nnx_lstm():
    """nnx.RNN(nnx.LSTMCell) over 5 steps, the last output to a Linear head."""
    return nnx_case(_NNXRNN(nnx.LSTMCell, nnx.Rngs(10)), normal(54, (N, 5, 3)), _labels(2))


def nnx_gru():
    """nnx.RNN(nnx.GRUCell) over 5 steps."""
    return nnx_case(_NNXRNN(nnx.GRUCell, nnx.Rngs(11)), normal(55, (N, 5, 3)), _labels(2))


class _NNXShared(nnx.Module):
    def __init__(self, rngs):
        self.inp, self.block = nnx.Linear(6, 8, rngs=rngs), nnx.Linear(8, 8, rngs=rngs)
        self.head = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        h = self.inp(x)
        for _ in range(3):  # one block applied three times
            h = h + jax.nn.tanh(self.block(h))
        return self.head(h)


def nnx_shared_block():
    """nnx: one Linear applied three times (weights shared across blocks)."""
    return nnx_case(_NNXShared(nnx.Rngs(12)), normal(56, (N, 6)), _labels(3))


# ------------------------------------------------------------------ Equinox


def _eqx(net, xs, ys, loss=None):
    """An Equinox model filled with seeded values (no jax.random init), the loss calls it on one example."""
    net = filled(net, 7)
    loss = loss or (lambda model, x, y: xent(model(x), y))
    return loss, net, xs, ys, _all(net)


def eqx_mlp():
    """eqx.nn.MLP (depth 2, relu)."""
    net = eqx.filter_eval_shape(eqx.nn.MLP, 6, 3, 16, 2, key=KEYS[3])
    return _eqx(net, normal(57, (N, 6)), _labels(3))


def eqx_mlp_tanh_nobias():
    """eqx.nn.MLP (depth 3, tanh, use_bias=False but a final bias), a squared error to a scalar target."""
    net = eqx.filter_eval_shape(eqx.nn.MLP, 6, "scalar", 8, 3, jnp.tanh, use_bias=False, use_final_bias=True,
                                key=KEYS[4])
    return _eqx(net, normal(58, (N, 6)), normal(59, (N,)), lambda m, x, y: (m(x) - y) ** 2)


class _EqxConv1d(eqx.Module):
    conv: eqx.nn.Conv1d
    pool: eqx.nn.MaxPool1d
    head: eqx.nn.Linear

    def __init__(self, key):
        k = jax.random.split(key)
        self.conv = eqx.nn.Conv1d(2, 4, 3, stride=1, padding=1, key=k[0])
        self.pool = eqx.nn.MaxPool1d(2, 2)
        self.head = eqx.nn.Linear(4 * 6, 2, key=k[1])

    def __call__(self, x):
        return self.head(self.pool(jax.nn.relu(self.conv(x))).reshape(-1))


def eqx_conv1d():
    """eqx.nn.Conv1d (padding 1) -> MaxPool1d -> Linear on (C, L) signals."""
    return _eqx(eqx.filter_eval_shape(_EqxConv1d, KEYS[5]), normal(60, (N, 2, 12)), _labels(2))


class _EqxConv2d(eqx.Module):
    c1: eqx.nn.Conv2d
    c2: eqx.nn.Conv2d
    norm: eqx.nn.GroupNorm
    head: eqx.nn.Linear

    def __init__(self, key):
        k = jax.random.split(key, 3)
        self.c1 = eqx.nn.Conv2d(2, 4, 3, stride=2, padding="SAME", key=k[0])
        self.c2 = eqx.nn.Conv2d(4, 4, 3, padding=1, groups=2, use_bias=False, key=k[1])
        self.norm = eqx.nn.GroupNorm(2, 4)
        self.head = eqx.nn.Linear(4, 3, key=k[2])

    def __call__(self, x):
        h = jax.nn.relu(self.norm(self.c2(jax.nn.relu(self.c1(x)))))
        return self.head(h.mean((1, 2)))


def eqx_conv2d_groupnorm():
    """eqx.nn.Conv2d (stride 2, SAME), a grouped Conv2d (groups=2, no bias), GroupNorm, global mean, Linear."""
    return _eqx(eqx.filter_eval_shape(_EqxConv2d, KEYS[6]), normal(61, (N, 2, 8, 8)), _labels(3))


class _EqxConv3d(eqx.Module):
    conv: eqx.nn.Conv3d
    head: eqx.nn.Linear

    def __init__(self, key):
        k = jax.random.split(key)
        self.conv = eqx.nn.Conv3d(1, 3, 2, stride=2, key=k[0])
        self.head = eqx.nn.Linear(3 * 8, 2, key=k[1])

    def __call__(self, x):
        return self.head(jax.nn.elu(self.conv(x)).reshape(-1))


def eqx_conv3d():
    """eqx.nn.Conv3d (kernel 2, stride 2) on (1, 4, 4, 4) volumes -> elu -> Linear."""
    return _eqx(eqx.filter_eval_shape(_EqxConv3d, KEYS[7]), normal(62, (N, 1, 4, 4, 4)), _labels(2))


class _EqxConvT(eqx.Module):
    up: eqx.nn.ConvTranspose2d
    out: eqx.nn.Conv2d

    def __init__(self, key):
        k = jax.random.split(key)
        self.up = eqx.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1, key=k[0])
        self.out = eqx.nn.Conv2d(2, 1, 1, key=k[1])

    def __call__(self, x):
        return self.out(jax.nn.relu(self.up(x)))


def eqx_conv_transpose2d():
    """eqx.nn.ConvTranspose2d (stride 2, padding 1, output_padding 1: 3×3 -> 6×6) -> 1×1 Conv2d, squared error."""
    net = eqx.filter_eval_shape(_EqxConvT, KEYS[8])
    return _eqx(net, normal(63, (N, 3, 3, 3)), normal(64, (N, 1, 6, 6)), lambda m, x, y: jnp.sum((m(x) - y) ** 2))


class _EqxRNN(eqx.Module):
    cell: eqx.Module
    head: eqx.nn.Linear

    def __call__(self, x):
        if isinstance(self.cell, eqx.nn.LSTMCell):
            init = (jnp.zeros(6), jnp.zeros(6))
            (h, _), _ = lax.scan(lambda hc, xt: (self.cell(xt, hc), None), init, x)
        else:
            h, _ = lax.scan(lambda h, xt: (self.cell(xt, h), None), jnp.zeros(6), x)
        return self.head(h)


def eqx_lstm():
    """eqx.nn.LSTMCell under lax.scan (5 steps), the last hidden state to a Linear head."""
    net = eqx.filter_eval_shape(lambda k: _EqxRNN(eqx.nn.LSTMCell(3, 6, key=k), eqx.nn.Linear(6, 2, key=k)),
                                KEYS[9])
    return _eqx(net, normal(65, (N, 5, 3)), _labels(2))


def eqx_gru():
    """eqx.nn.GRUCell under lax.scan (5 steps)."""
    net = eqx.filter_eval_shape(lambda k: _EqxRNN(eqx.nn.GRUCell(3, 6, key=k), eqx.nn.Linear(6, 2, key=k)),
                                KEYS[10])
    return _eqx(net, normal(66, (N, 5, 3)), _labels(2))


class _EqxNorms(eqx.Module):
    lin: eqx.nn.Linear
    ln: eqx.nn.LayerNorm
    rms: eqx.nn.RMSNorm
    head: eqx.nn.Linear

    def __init__(self, key):
        k = jax.random.split(key)
        self.lin, self.head = eqx.nn.Linear(5, 8, key=k[0]), eqx.nn.Linear(8, 3, key=k[1])
        self.ln, self.rms = eqx.nn.LayerNorm(8), eqx.nn.RMSNorm(8)

    def __call__(self, x):  # (T, 5): per token by vmap
        h = jax.vmap(lambda t: self.rms(jax.nn.gelu(self.ln(self.lin(t)))))(x)
        return self.head(h.mean(0))


def eqx_norms():
    """eqx.nn.Linear -> LayerNorm -> gelu -> RMSNorm on every token (jax.vmap), mean pool, Linear."""
    return _eqx(eqx.filter_eval_shape(_EqxNorms, KEYS[11]), normal(67, (N, 4, 5)), _labels(3))


class _EqxBN(eqx.Module):
    conv: eqx.nn.Conv2d
    bn: eqx.nn.BatchNorm
    head: eqx.nn.Linear

    def __init__(self, key):
        k = jax.random.split(key)
        self.conv = eqx.nn.Conv2d(2, 4, 3, padding=1, key=k[0])
        self.bn = eqx.nn.BatchNorm(4, axis_name="batch", mode="ema")
        self.head = eqx.nn.Linear(4, 3, key=k[1])

    def __call__(self, x, state):
        h, state = self.bn(self.conv(x), state)
        return self.head(jax.nn.relu(h).mean((1, 2))), state


def eqx_batchnorm_inference():
    """eqx.nn.BatchNorm in inference mode (`eqx.nn.make_with_state`, `eqx.nn.inference_mode`): the running
    statistics live in an `eqx.nn.State` the loss closes over."""
    model, state = eqx.nn.make_with_state(_EqxBN)(KEYS[12])
    model = eqx.nn.inference_mode(filled(model, 8))
    state = state.set(model.bn.ema_state_index, (normal(68, (4,), 0.3), 0.5 + jnp.abs(normal(69, (4,)))))

    def loss(m, x, y):
        return xent(m(x, state)[0], y)

    return loss, model, normal(70, (N, 2, 6, 6)), _labels(3), _all(model)


class _EqxAttn(eqx.Module):
    emb: eqx.nn.Embedding
    pos: jax.Array
    attn: eqx.nn.MultiheadAttention
    head: eqx.nn.Linear

    def __init__(self, key):
        k = jax.random.split(key, 3)
        self.emb = eqx.nn.Embedding(20, 8, key=k[0])
        self.pos = jnp.zeros((5, 8))
        self.attn = eqx.nn.MultiheadAttention(2, 8, key=k[1])
        self.head = eqx.nn.Linear(8, 20, key=k[2])

    def __call__(self, ids):
        h = jax.vmap(self.emb)(ids) + self.pos[: ids.shape[0]]
        mask = jnp.tril(jnp.ones((ids.shape[0], ids.shape[0]), bool))
        h = h + self.attn(h, h, h, mask=mask)
        return jax.vmap(self.head)(h)


def eqx_embedding_attention():
    """eqx.nn.Embedding + a learned position array added + causal eqx.nn.MultiheadAttention + a per-token head:
    a next-token model as Equinox users write it."""
    ids = randint(71, (N, 5), 20)
    net = eqx.filter_eval_shape(_EqxAttn, KEYS[13])
    return _eqx(net, ids[:, :-1], ids[:, 1:], lambda m, x, y: token_xent(m(x), y))


class _EqxDropout(eqx.Module):
    l1: eqx.nn.Linear
    drop: eqx.nn.Dropout
    l2: eqx.nn.Linear

    def __init__(self, key):
        k = jax.random.split(key)
        self.l1, self.l2 = eqx.nn.Linear(6, 16, key=k[0]), eqx.nn.Linear(16, 3, key=k[1])
        self.drop = eqx.nn.Dropout(0.3)

    def __call__(self, x, key):
        return self.l2(self.drop(jax.nn.relu(self.l1(x)), key=key))


def eqx_dropout():
    """eqx.nn.Dropout with a per-example key (a raw uint32 key from `jax.random.split(PRNGKey)` in xs)."""
    net = eqx.filter_eval_shape(_EqxDropout, KEYS[14])
    xs = (jax.random.split(jax.random.PRNGKey(42), N), normal(72, (N, 6)))
    return _eqx(net, xs, _labels(3), lambda m, x, y: xent(m(x[1], x[0]), y))


class _EqxSeqPReLU(eqx.Module):
    body: eqx.nn.Sequential
    act: eqx.nn.PReLU
    head: eqx.nn.Linear

    def __init__(self, key):
        k = jax.random.split(key, 3)
        self.body = eqx.nn.Sequential([eqx.nn.Linear(6, 8, key=k[0]), eqx.nn.Lambda(jnp.tanh),
                                       eqx.nn.Linear(8, 8, key=k[1])])
        self.act, self.head = eqx.nn.PReLU(), eqx.nn.Linear(8, 3, key=k[2])

    def __call__(self, x):  # PReLU takes no `key`, so it cannot sit inside a Sequential
        return self.head(self.act(self.body(x)))


def eqx_sequential_prelu():
    """eqx.nn.Sequential([Linear, Lambda(tanh), Linear]) -> eqx.nn.PReLU (a learned slope) -> Linear."""
    return _eqx(eqx.filter_eval_shape(_EqxSeqPReLU, KEYS[15]), normal(73, (N, 6)), _labels(3))


# ------------------------------------------------------------------ Haiku


def _haiku(forward, xs, ys, with_state=False, loss=None, init_forward=None):
    """A Haiku `hk.transform` (or `transform_with_state`) model, params from an eval_shape of `init` filled with
    seeded values; the loss calls `apply` as Haiku users write it."""
    x0 = jax.tree.map(lambda a: a[0], xs)
    loss_out = loss or xent
    if with_state:
        t = hk.without_apply_rng(hk.transform_with_state(forward))
        p_shapes, s_shapes = jax.eval_shape(hk.transform_with_state(init_forward).init, KEYS[0], x0)
        state = jax.tree.map(lambda s: (0.5 + jnp.abs(normal(9, s.shape))).astype(s.dtype), s_shapes)

        def loss_fn(p, x, y):
            return loss_out(t.apply(p, state, x)[0], y)
    else:
        t = hk.without_apply_rng(hk.transform(forward))
        p_shapes = jax.eval_shape(t.init, KEYS[0], x0)

        def loss_fn(p, x, y):
            return loss_out(t.apply(p, x), y)
    params = filled(p_shapes, 10)
    return loss_fn, params, xs, ys, _all(params)


def haiku_mlp():
    """hk.nets.MLP([16, 16, 3]) (relu)."""
    return _haiku(lambda x: hk.nets.MLP([16, 16, 3])(x), normal(74, (N, 6)), _labels(3))


def haiku_conv_layernorm():
    """hk.Conv2D (NHWC, SAME; stride 2) -> hk.LayerNorm over channels -> flatten -> hk.Linear."""
    def forward(x):
        h = jax.nn.relu(hk.Conv2D(4, 3)(x))
        h = hk.LayerNorm(-1, create_scale=True, create_offset=True)(hk.Conv2D(4, 3, stride=2)(h))
        return hk.Linear(3)(jax.nn.relu(h).reshape(-1))
    return _haiku(forward, normal(75, (N, 6, 6, 2)), _labels(3))


def haiku_lstm():
    """hk.LSTM under hk.dynamic_unroll (time-major, 5 steps), the last output to hk.Linear."""
    def forward(x):
        core = hk.LSTM(6)
        out, _ = hk.dynamic_unroll(core, x, core.initial_state(None))
        return hk.Linear(2)(out[-1])
    return _haiku(forward, normal(76, (N, 5, 3)), _labels(2))


def haiku_embed_attention():
    """hk.Embed -> hk.MultiHeadAttention (2 heads, key size 4) -> mean -> hk.Linear."""
    def forward(ids):
        h = hk.Embed(20, 8)(ids)
        h = h + hk.MultiHeadAttention(2, 4, w_init=hk.initializers.VarianceScaling(1.0))(h, h, h)
        return hk.Linear(3)(h.mean(0))
    return _haiku(forward, randint(77, (N, 5), 20), _labels(3))


def haiku_batchnorm_inference():
    """hk.BatchNorm(is_training=False) with its moving averages in Haiku state (`transform_with_state`)."""
    def forward(x, is_training=False):
        h = hk.Conv2D(4, 3)(x)
        h = hk.BatchNorm(True, True, 0.9)(h, is_training=is_training)
        return hk.Linear(3)(jax.nn.relu(h).mean((0, 1)))
    return _haiku(forward, normal(78, (N, 6, 6, 2)), _labels(3), with_state=True,
                  init_forward=functools.partial(forward, is_training=True))  # init creates the moving averages


# ------------------------------------------------------------------ plain JAX


def jax_tuple_mlp():
    """Params as a list of (W, b) tuples, the loop over layers in Python (the JAX tutorial's MLP)."""
    sizes = [6, 16, 12, 3]
    params = [(normal(80 + i, (m, n), 0.4), normal(90 + i, (n,), 0.1))
              for i, (m, n) in enumerate(zip(sizes, sizes[1:]))]

    def loss(params, x, y):
        for w, b in params[:-1]:
            x = jax.nn.relu(x @ w + b)
        w, b = params[-1]
        return xent(x @ w + b, y)

    return loss, params, normal(79, (N, 6)), _labels(3), _all(params)


def jax_cond_switch_weights():
    """`lax.switch` on the input picking one of three weight matrices, a `lax.cond` between two biases."""
    p = {"w": normal(100, (3, 5, 4), 0.5), "b_pos": normal(101, (4,)), "b_neg": normal(102, (4,)),
         "head": normal(103, (4, 2), 0.5)}

    def loss(p, x, y):
        k = jnp.clip(jnp.floor(x[0] + 1.5), 0, 2).astype(jnp.int32)
        h = lax.switch(k, [lambda v, j=j: jnp.tanh(v @ p["w"][j]) for j in range(3)], x)
        h = lax.cond(x[1] > 0, lambda h: h + p["b_pos"], lambda h: h - p["b_neg"], h)
        return xent(h @ p["head"], y)

    return loss, p, normal(104, (N, 5), 1.5), _labels(2), _all(p) - {"['w']"}  # a static slice w[j]: no rule yet


def jax_fori_stacked():
    """`lax.fori_loop` over a stack of layer weights `w[i]` (a scan over layers indexed by the loop counter)."""
    p = {"w": normal(105, (3, 6, 6), 0.4), "b": normal(106, (3, 6), 0.1), "head": normal(107, (6, 3), 0.5)}

    def loss(p, x, y):
        h = lax.fori_loop(0, 3, lambda i, h: h + jnp.tanh(h @ p["w"][i] + p["b"][i]), x)
        return xent(h @ p["head"], y)

    return loss, p, normal(108, (N, 6)), _labels(3), {"['head']"}  # w[i] by the loop counter: no rule yet


def jax_scan_layers():
    """Scan over layers: `lax.scan` with the stacked weights as its xs (each step a layer's (W, b))."""
    p = {"w": normal(109, (4, 6, 6), 0.4), "b": normal(110, (4, 6), 0.1), "head": normal(111, (6,), 0.5)}

    def loss(p, x, y):
        h, _ = lax.scan(lambda h, wb: (jax.nn.gelu(h @ wb[0] + wb[1]), None), x, (p["w"], p["b"]))
        return (h @ p["head"] - y) ** 2

    return loss, p, normal(112, (N, 6)), normal(113, (N,)), {"['head']"}  # weights as the scan's xs: no rule yet


def jax_checkpoint_policy():
    """`jax.checkpoint` with `policy=checkpoint_policies.dots_with_no_batch_dims_saveable` around each block."""
    p = {"w1": normal(114, (6, 12), 0.4), "w2": normal(115, (12, 6), 0.4), "w3": normal(116, (6, 3), 0.4)}

    @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    def block(w1, w2, h):
        return h + jax.nn.gelu(h @ w1) @ w2

    def loss(p, x, y):
        return xent(block(p["w1"], p["w2"], block(p["w1"], p["w2"], x)) @ p["w3"], y)

    return loss, p, normal(117, (N, 6)), _labels(3), _all(p)


@jax.custom_vjp
def _ste_round(z):
    return jnp.round(z * 4) / 4


_ste_round.defvjp(lambda z: (_ste_round(z), None), lambda _, g: (g,))  # straight-through estimator


def jax_custom_vjp_quantize():
    """A `custom_vjp` straight-through quantizer on activations (round forward, identity backward)."""
    p = {"w1": normal(118, (6, 8), 0.5), "b1": normal(119, (8,), 0.1), "w2": normal(120, (8, 3), 0.5)}

    def loss(p, x, y):
        return xent(_ste_round(jnp.tanh(x @ p["w1"] + p["b1"])) @ p["w2"], y)

    return loss, p, normal(121, (N, 6)), _labels(3), _all(p)


def jax_einsum_attention():
    """Multi-head attention by `jnp.einsum`, a packed QKV weight cut three ways by slicing (`w[:, :d]` …), a learned
    position embedding added to the activations, a residual and a mean-pooled head."""
    t, d, heads = 4, 8, 2
    p = {"wqkv": normal(122, (d, 3 * d), 0.4), "wo": normal(123, (d, d), 0.4), "pos": normal(124, (t, d), 0.1),
         "head": normal(125, (d, 3), 0.4)}

    def loss(p, x, y):
        h = x + p["pos"]
        qkv = h @ p["wqkv"]
        q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(t, heads, d // heads) for i in range(3))
        att = jax.nn.softmax(jnp.einsum("qhc,khc->hqk", q, k) / jnp.sqrt(d // heads), -1)
        o = jnp.einsum("hqk,khc->qhc", att, v).reshape(t, d) @ p["wo"]
        return xent((h + o).mean(0) @ p["head"], y)

    return loss, p, normal(126, (N, t, d)), _labels(3), _all(p)


def jax_dot_product_attention():
    """`jax.nn.dot_product_attention` (causal) on projections of shape (T, heads, head_dim) from three weights."""
    t, d = 4, 8
    p = {k: normal(127 + i, (d, 2, 4), 0.4) for i, k in enumerate(("wq", "wk", "wv"))}
    p["wo"] = normal(130, (2, 4, d), 0.4)

    def loss(p, x, y):
        q, k, v = (jnp.einsum("td,dhc->thc", x, p[n]) for n in ("wq", "wk", "wv"))
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return jnp.sum((jnp.einsum("thc,hcd->td", o, p["wo"]) - y) ** 2)

    return loss, p, normal(131, (N, t, d)), normal(132, (N, t, d)), _all(p)


def jax_weight_decay_in_loss():
    """An L2 penalty over every param inside the loss (`sum(jax.tree.map(...))`), as users write weight decay."""
    p = {"w1": normal(133, (6, 8), 0.5), "b1": normal(134, (8,), 0.1), "w2": normal(135, (8, 3), 0.5)}

    def loss(p, x, y):
        l2 = sum(jnp.sum(a ** 2) for a in jax.tree.leaves(p))
        return xent(jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"], y) + 1e-3 * l2

    return loss, p, normal(136, (N, 6)), _labels(3), _all(p)


def jax_vmap_tokens_standardize():
    """A per-token MLP by `jax.vmap` inside the loss, `jax.nn.standardize` as a LayerNorm with a learned scale."""
    p = {"w": normal(137, (5, 8), 0.5), "g": 1 + normal(138, (8,), 0.1), "head": normal(139, (8, 2), 0.5)}

    def loss(p, x, y):
        tok = jax.vmap(lambda t: jax.nn.standardize(jax.nn.relu(t @ p["w"])) * p["g"])(x)
        return xent(tok.mean(0) @ p["head"], y)

    return loss, p, normal(140, (N, 4, 5)), _labels(2), _all(p)


def jax_moe_top1():
    """A mixture of experts with top-1 routing: a router picks one expert's weights `experts[argmax]` per token."""
    p = {"router": normal(141, (6, 3), 0.5), "experts": normal(142, (3, 6, 6), 0.4), "head": normal(143, (6, 2), 0.5)}

    def loss(p, x, y):
        gate = jax.nn.softmax(x @ p["router"], -1)                     # (T, E)
        e = jnp.argmax(gate, -1)
        h = jnp.einsum("td,tdo->to", x, p["experts"][e]) * jnp.max(gate, -1, keepdims=True)
        return xent(jax.nn.relu(h).mean(0) @ p["head"], y)

    return loss, p, normal(144, (N, 4, 6)), _labels(2), _all(p)


def optax_integer_xent():
    """A linear model trained with `optax.softmax_cross_entropy_with_integer_labels`."""
    p = {"w": normal(145, (6, 4), 0.5), "b": normal(146, (4,), 0.1)}

    def loss(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(x @ p["w"] + p["b"], y)

    return loss, p, normal(147, (N, 6)), _labels(4), _all(p)


def optax_sigmoid_multilabel():
    """Multi-label classification: `optax.sigmoid_binary_cross_entropy` summed over 4 labels."""
    p = {"w1": normal(148, (6, 8), 0.5), "b1": normal(149, (8,), 0.1), "w2": normal(150, (8, 4), 0.5)}

    def loss(p, x, y):
        return optax.sigmoid_binary_cross_entropy(jax.nn.swish(x @ p["w1"] + p["b1"]) @ p["w2"], y).sum()

    ys = (normal(151, (N, 4)) > 0).astype(jnp.float32)
    return loss, p, normal(152, (N, 6)), ys, _all(p)


def optax_huber():
    """Robust regression: `optax.huber_loss` (delta 0.5) on a two-layer net."""
    p = {"w1": normal(153, (6, 8), 0.5), "b1": normal(154, (8,), 0.1), "w2": normal(155, (8, 2), 0.5)}

    def loss(p, x, y):
        return optax.huber_loss(jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"], y, delta=0.5).sum()

    return loss, p, normal(156, (N, 6)), normal(157, (N, 2), 2.0), _all(p)


def optax_ctc_conv1d():
    """Speech-like: a 1-D conv (NWC) over 10 frames, a per-frame classifier over 5 symbols (0 = blank), and
    `optax.ctc_loss` against a 3-symbol label sequence (padding masks as the API takes them)."""
    p = {"k": normal(158, (3, 4, 8), 0.4), "b": normal(159, (8,), 0.1), "w": normal(160, (8, 5), 0.5)}

    def loss(p, x, y):
        h = lax.conv_general_dilated(x[None], p["k"], (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"))
        logits = jax.nn.relu(h[0] + p["b"]) @ p["w"]
        return optax.ctc_loss(logits[None], jnp.zeros((1, 10)), y[None], jnp.zeros((1, 3)))[0]

    ys = 1 + randint(161, (N, 3), 4)
    return loss, p, normal(162, (N, 10, 4)), ys, _all(p)


# ------------------------------------------------------------------ Opacus' per-layer matrix: what the zoo lacked


def _instance_norm(z, g, b, axes):
    mu = z.mean(axes, keepdims=True)
    z = (z - mu) / jnp.sqrt(((z - mu) ** 2).mean(axes, keepdims=True) + 1e-5)
    shape = (-1,) + (1,) * len(axes)
    return z * g.reshape(shape) + b.reshape(shape)


def opacus_instance_norm_1d():
    """torch.nn.InstanceNorm1d(affine=True) after a Conv1d on (C, L) signals."""
    p = {"k": normal(163, (3, 2, 3), 0.5), "g": 1 + normal(164, (3,), 0.1), "b": normal(165, (3,), 0.1),
         "w": normal(166, (3 * 8, 2), 0.3)}

    def loss(p, x, y):
        z = lax.conv_general_dilated(x[None], p["k"], (1,), "SAME")[0]
        return xent(jax.nn.relu(_instance_norm(z, p["g"], p["b"], (1,))).reshape(-1) @ p["w"], y)

    return loss, p, normal(167, (N, 2, 8)), _labels(2), _all(p)


def opacus_instance_norm_3d():
    """torch.nn.InstanceNorm3d(affine=True) after a Conv3d on (C, D, H, W) volumes."""
    p = {"k": normal(168, (2, 1, 2, 2, 2), 0.5), "g": 1 + normal(169, (2,), 0.1), "b": normal(170, (2,), 0.1),
         "w": normal(171, (2, 2), 0.5)}

    def loss(p, x, y):
        z = lax.conv_general_dilated(x[None], p["k"], (1, 1, 1), "SAME")[0]
        z = _instance_norm(z, p["g"], p["b"], (1, 2, 3))
        return xent(jax.nn.relu(z).mean((1, 2, 3)) @ p["w"], y)

    return loss, p, normal(172, (N, 1, 3, 3, 3)), _labels(2), _all(p)


def _lstm_layer(p, xs):
    """A torch.nn.LSTM layer (gates i, f, g, o; bias_ih and bias_hh) over `xs (T, d)`: the hidden states (T, hd)."""
    hd = p["w_hh"].shape[1]

    def step(carry, xt):
        h, c = carry
        i, f, g, o = jnp.split(p["w_ih"] @ xt + p["b_ih"] + p["w_hh"] @ h + p["b_hh"], 4)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    return lax.scan(step, (jnp.zeros(hd), jnp.zeros(hd)), xs)[1]


def opacus_lstm_two_layers():
    """torch.nn.LSTM(num_layers=2) in PyTorch's layout (W_ih (4h, d) @ x, two biases per layer), a linear head."""
    d, hd = 3, 4

    def layer(i, d_in):
        return {"w_ih": normal(173 + 4 * i, (4 * hd, d_in), 0.5), "w_hh": normal(174 + 4 * i, (4 * hd, hd), 0.5),
                "b_ih": normal(175 + 4 * i, (4 * hd,), 0.1), "b_hh": normal(176 + 4 * i, (4 * hd,), 0.1)}

    p = {"l0": layer(0, d), "l1": layer(1, hd), "head": normal(181, (hd, 2), 0.5)}

    def loss(p, x, y):
        return xent(_lstm_layer(p["l1"], _lstm_layer(p["l0"], x))[-1] @ p["head"], y)

    return loss, p, normal(182, (N, 5, d)), _labels(2), _all(p)


def opacus_bidirectional_gru():
    """torch.nn.GRU(bidirectional=True): one GRU forward, one over the reversed steps, outputs concatenated."""
    d, hd = 3, 4

    def direction(i):
        return {"w_ih": normal(183 + 3 * i, (d, 3 * hd), 0.5), "w_hh": normal(184 + 3 * i, (hd, 3 * hd), 0.5),
                "b": normal(185 + 3 * i, (3 * hd,), 0.1)}

    def gru(p, xs):
        def step(h, xt):
            r, z, n = jnp.split(xt @ p["w_ih"] + p["b"], 3)
            hr, hz, hn = jnp.split(h @ p["w_hh"], 3)
            r, z = jax.nn.sigmoid(r + hr), jax.nn.sigmoid(z + hz)
            h = (1 - z) * jnp.tanh(n + r * hn) + z * h
            return h, h
        return lax.scan(step, jnp.zeros(hd), xs)[1]

    p = {"fwd": direction(0), "bwd": direction(1), "head": normal(189, (2 * hd, 2), 0.5)}

    def loss(p, x, y):
        hs = jnp.concatenate([gru(p["fwd"], x), gru(p["bwd"], x[::-1])[::-1]], -1)
        return xent(hs.mean(0) @ p["head"], y)

    return loss, p, normal(190, (N, 5, d)), _labels(2), _all(p)


def opacus_embedding_bag_sum():
    """torch.nn.EmbeddingBag(mode="sum") over a fixed-size bag with per-id weights (`per_sample_weights`)."""
    p = {"emb": normal(191, (25, 6), 0.5), "w": normal(192, (6, 3), 0.5)}

    def loss(p, x, y):
        ids, weights = x
        return xent((p["emb"][ids] * weights[:, None]).sum(0) @ p["w"], y)

    xs = (randint(193, (N, 4), 25, 1, 3), jnp.abs(normal(194, (N, 4))))
    return loss, p, xs, _labels(3), _all(p)


LINEN = [linen_mlp_gelu_nobias, linen_mlp_silu, linen_mlp_tanh, linen_dropout, linen_batchnorm_inference, linen_norms,
         linen_conv1d_depthwise, linen_conv_transpose, linen_lstm, linen_gru, linen_scan_layers, linen_remat,
         linen_shared_block, linen_gpt_untied, linen_embed_attention]
NNX = [nnx_dropout, nnx_batchnorm_inference, nnx_norms, nnx_conv1d_depthwise, nnx_conv_transpose, nnx_embed_attention,
       nnx_lstm, nnx_gru, nnx_shared_block]
EQUINOX = [eqx_mlp, eqx_mlp_tanh_nobias, eqx_conv1d, eqx_conv2d_groupnorm, eqx_conv3d, eqx_conv_transpose2d, eqx_lstm,
           eqx_gru, eqx_norms, eqx_batchnorm_inference, eqx_embedding_attention, eqx_dropout, eqx_sequential_prelu]
HAIKU = [haiku_mlp, haiku_conv_layernorm, haiku_lstm, haiku_embed_attention, haiku_batchnorm_inference] if hk else []
PLAIN_JAX = [jax_tuple_mlp, jax_cond_switch_weights, jax_fori_stacked, jax_scan_layers, jax_checkpoint_policy,
             jax_custom_vjp_quantize, jax_einsum_attention, jax_dot_product_attention, jax_weight_decay_in_loss,
             jax_vmap_tokens_standardize, jax_moe_top1, optax_integer_xent, optax_sigmoid_multilabel, optax_huber,
             optax_ctc_conv1d]
OPACUS = [opacus_instance_norm_1d, opacus_instance_norm_3d, opacus_lstm_two_layers, opacus_bidirectional_gru,
          opacus_embedding_bag_sum]

USER_MODELS = [*LINEN, *NNX, *EQUINOX, *HAIKU, *PLAIN_JAX, *OPACUS]
