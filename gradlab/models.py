"""Equinox models for one example: `model(x) -> outputs`, x of shape (D,) (flattened features).

- `linear`: one affine map. With MSE it is linear regression, with cross-entropy softmax
  (multinomial logistic) regression.
- `mlp`: `eqx.nn.MLP` with a chosen width, depth and activation.
- `cnn`: a small CNN for single-channel images (digits, Fashion-MNIST).
- `simple_cnn`: seed 003's SimpleCNN (conv 32, conv 64, max-pool, fc 128, fc 10, log-softmax) for
  1×28×28 images (Fashion-MNIST).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp

from gradlab.data import DataError

def identity(x):
    return x


def relu(x):
    return jax.nn.relu(x)


def tanh(x):
    return jnp.tanh(x)


def gelu(x):
    return jax.nn.gelu(x)


def softplus(x):
    return jax.nn.softplus(x)


# Plain module-level functions (not jax.nn's wrapped ones) so that a trained model pickles by reference
# and the results store can keep it on disk.
ACTIVATIONS = {"relu": relu, "tanh": tanh, "gelu": gelu, "softplus": softplus}
MODELS = {"linear": "Linear / softmax regression", "mlp": "MLP", "cnn": "Small CNN (images)",
          "simple_cnn": "SimpleCNN of seed 003 (conv 32, conv 64, max-pool, fc 128, fc 10; 28×28 images)"}


class Linear(eqx.Module):
    """Linear (regression) or softmax (classification) model: `W x + b`."""

    layer: eqx.nn.Linear

    def __init__(self, in_size: int, out_size: int, *, key):
        self.layer = eqx.nn.Linear(in_size, out_size, key=key)

    def __call__(self, x):
        return self.layer(x)


class MLP(eqx.Module):
    """Multi-layer perceptron: `depth` hidden layers of `width` units."""

    mlp: eqx.nn.MLP

    def __init__(self, in_size: int, out_size: int, width: int, depth: int, activation: str, *, key):
        self.mlp = eqx.nn.MLP(in_size, out_size, width, depth, activation=ACTIVATIONS[activation],
                               final_activation=identity, key=key)

    def __call__(self, x):
        return self.mlp(x)


class CNN(eqx.Module):
    """conv 3×3 (1→8) → act → conv 3×3 (8→16) → act → 2×2 max-pool → linear → outputs."""

    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    head: eqx.nn.Linear
    image_shape: tuple[int, int] = eqx.field(static=True)
    activation: str = eqx.field(static=True)

    def __init__(self, image_shape: tuple[int, int], out_size: int, activation: str = "relu", *, key):
        k1, k2, k3 = jax.random.split(key, 3)
        h, w = image_shape
        self.image_shape = tuple(image_shape)
        self.activation = activation
        self.conv1 = eqx.nn.Conv2d(1, 8, 3, padding=1, key=k1)
        self.conv2 = eqx.nn.Conv2d(8, 16, 3, padding=1, key=k2)
        self.head = eqx.nn.Linear(16 * (h // 2) * (w // 2), out_size, key=k3)

    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        z = x.reshape((1,) + self.image_shape)
        z = act(self.conv1(z))
        z = act(self.conv2(z))
        c, h, w = z.shape
        z = z[:, : h // 2 * 2, : w // 2 * 2].reshape(c, h // 2, 2, w // 2, 2).max(axis=(2, 4))
        return self.head(z.reshape(-1))


def _conv3x3(conv: eqx.nn.Conv2d, z):
    """`conv(z)` for a 3×3, stride-1, unpadded `conv` on channels-last `z (H, W, C)`, as patches (H'·W', 9·C) @
    weight (9·C, O): under `vmap` one matrix product over every position of every example (B·H'·W' rows)."""
    h, w = z.shape[0] - 2, z.shape[1] - 2
    patches = jnp.concatenate([z[i: i + h, j: j + w] for i in range(3) for j in range(3)], axis=-1)
    weight = jnp.transpose(conv.weight, (2, 3, 1, 0)).reshape(-1, conv.weight.shape[0])  # (kh, kw, C) × O
    return (patches.reshape(h * w, -1) @ weight).reshape(h, w, -1) + conv.bias.reshape(-1)


@functools.partial(jax.jit, static_argnums=1)
def _uniform_layers(key, shapes):
    """Weights and biases U(−1/√fan_in, 1/√fan_in), `eqx.nn`'s (and PyTorch's) default, for layers whose weight
    and bias have `shapes` ((O, fan_in…), (O, …)), from ONE uniform draw: one compiled program where each layer's
    own draws compile eight (about 2 CPU-s of a cold start)."""
    u = jax.random.uniform(key, (sum(math.prod(w) + math.prod(b) for w, b in shapes),), minval=-1.0, maxval=1.0)
    out, at = [], 0
    for w, b in shapes:
        scale = 1.0 / math.sqrt(math.prod(w[1:]))
        weight = u[at: at + math.prod(w)].reshape(w) * scale
        at += math.prod(w)
        out.append((weight, u[at: at + math.prod(b)].reshape(b) * scale))
        at += math.prod(b)
    return out


class SimpleCNN(eqx.Module):
    """Seed 003's `SimpleCNN`, the PyTorch per-sample-gradients tutorial's network, in Equinox:
    conv 3×3 (1→32) → ReLU → conv 3×3 (32→64) → ReLU → 2×2 max-pool → fc (9,216→128) → ReLU → fc (128→K)
    → log-softmax. Unpadded convolutions as in the seed (`nn.Conv2d(1, 32, 3, 1)`), so a 28×28 image
    reaches fc1 as 64 × 12 × 12 = 9,216 features (1,199,882 parameters for K = 10).

    It returns log-probabilities; gradlab's `losses.cross_entropy` of them is the seed's NLL loss
    (`logsumexp` of log-probabilities is 0). Input: a flattened image `(H·W,)`, H, W ≥ 6.

    The convolutions keep `eqx.nn.Conv2d`'s parameters and initialization but run as a matrix product over
    3×3 patches (im2col, the same sums): XLA:CPU runs a convolution's backward pass inside a loop (the
    training scan, DP-SGD, the engine's chunks) about 13× slower than outside (jax-ml/jax#12868); the
    matrix product runs at full speed there. Activations are channels-last, so under `vmap` each convolution
    is one matrix product over all positions of all examples (measured ~20% faster per training step than
    channels-first, benchmarks/RESULTS.md).
    """

    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear
    image_shape: tuple[int, int] = eqx.field(static=True)

    def __init__(self, image_shape: tuple[int, int], out_size: int, *, key):
        h, w = image_shape
        self.image_shape = tuple(image_shape)
        layers = eqx.filter_eval_shape(lambda: (  # shapes only: the draws are `_uniform_layers`' one program
            eqx.nn.Conv2d(1, 32, 3, key=jax.random.key(0)), eqx.nn.Conv2d(32, 64, 3, key=jax.random.key(0)),
            eqx.nn.Linear(64 * ((h - 4) // 2) * ((w - 4) // 2), 128, key=jax.random.key(0)),
            eqx.nn.Linear(128, out_size, key=jax.random.key(0))))
        shapes = tuple((layer.weight.shape, layer.bias.shape) for layer in layers)
        self.conv1, self.conv2, self.fc1, self.fc2 = (
            eqx.tree_at(lambda m: (m.weight, m.bias), layer, wb) for layer, wb in zip(layers, _uniform_layers(key, shapes)))

    def __call__(self, x):
        z = jax.nn.relu(_conv3x3(self.conv1, x.reshape(self.image_shape + (1,))))
        z = jax.nn.relu(_conv3x3(self.conv2, z))
        h, w, c = z.shape
        z = z[: h // 2 * 2, : w // 2 * 2].reshape(h // 2, 2, w // 2, 2, c).max(axis=(1, 3))
        z = jnp.transpose(z, (2, 0, 1))  # fc1 reads the seed's (C, H, W) order
        return jax.nn.log_softmax(self.fc2(jax.nn.relu(self.fc1(z.reshape(-1)))))


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What to build: `kind` in MODELS, MLP width/depth, activation name."""

    kind: str = "mlp"
    width: int = 64
    depth: int = 1
    activation: str = "relu"


def build_model(spec: ModelSpec, in_size: int, out_size: int, *, key, image_shape=None) -> eqx.Module:
    """Build the Equinox model for `spec` with inputs of size D=`in_size` and K=`out_size` outputs.

    `out_size=1` makes a scalar-output model (regression). **Raises** `DataError` for an unknown
    kind or activation, a CNN without image data, or a non-positive width/depth.
    """
    if spec.activation not in ACTIVATIONS:
        raise DataError(f"unknown activation {spec.activation!r}; choose one of {', '.join(ACTIVATIONS)}")
    out = "scalar" if out_size == 1 else out_size
    if spec.kind == "linear":
        return Linear(in_size, out, key=key)
    if spec.kind == "mlp":
        if spec.width < 1 or spec.depth < 1:
            raise DataError(f"MLP width and depth must be ≥ 1, got width {spec.width}, depth {spec.depth}")
        return MLP(in_size, out, spec.width, spec.depth, spec.activation, key=key)
    if spec.kind == "cnn":
        if image_shape is None:
            raise DataError("the CNN needs image data: choose digits or Fashion-MNIST, or an MLP")
        if out_size == 1:
            raise DataError("the CNN is built for classification: choose a classification dataset")
        return CNN(image_shape, out_size, spec.activation, key=key)
    if spec.kind == "simple_cnn":
        if image_shape is None or min(image_shape) < 6:
            raise DataError("SimpleCNN needs images (it was written for 28×28): choose Fashion-MNIST or digits")
        if out_size == 1:
            raise DataError("SimpleCNN is a classifier: choose a classification dataset")
        return SimpleCNN(image_shape, out_size, key=key)
    raise DataError(f"unknown model {spec.kind!r}; choose one of {', '.join(MODELS)}")
