"""Equinox models for one example: `model(x) -> outputs`, x of shape (D,) (flattened features).

- `linear`: one affine map. With MSE it is linear regression, with cross-entropy softmax
  (multinomial logistic) regression.
- `mlp`: `eqx.nn.MLP` with a chosen width, depth and activation.
- `cnn`: a small CNN for 8×8 single-channel images (digits).
"""

from __future__ import annotations

import dataclasses

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
MODELS = {"linear": "Linear / softmax regression", "mlp": "MLP", "cnn": "Small CNN (8×8 images)"}


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
            raise DataError("the CNN needs image data: choose the digits dataset, or an MLP")
        if out_size == 1:
            raise DataError("the CNN is built for classification: choose a classification dataset")
        return CNN(image_shape, out_size, spec.activation, key=key)
    raise DataError(f"unknown model {spec.kind!r}; choose one of {', '.join(MODELS)}")
