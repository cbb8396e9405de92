"""Your own Flax model in gradlab's explorer: `python -m gradlab serve examples/own_model_flax.py`.

The file defines what the explorer needs (docs/own-model.md): `loss_fn(params, x, y)`, the loss of ONE example;
`params`, the trained model (here Flax's variables dict); `data`; and optionally `predict_fn`, `class_names`
and `image_shape`. It trains a small Flax MLP on scikit-learn's bundled digits (8×8 images, nothing
downloaded) with optax when it is loaded: about a second on a CPU.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


class MLP(nn.Module):
    """64 pixels -> 32 ReLU units -> 10 logits."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(32)(x)))


model = MLP()


def predict_fn(params, x):
    """One example's logits (10,)."""
    return model.apply({"params": params}, x)


def loss_fn(params, x, y):
    """Cross-entropy of one example: x (64,), y an int class id."""
    logits = predict_fn(params, x)
    return jax.nn.logsumexp(logits) - logits[y]


digits = load_digits()
x_train, x_test, y_train, y_test = train_test_split(digits.data / 16.0, digits.target, test_size=0.2, random_state=0)
data = (x_train, y_train, x_test, y_test)
class_names = [str(d) for d in range(10)]
image_shape = (8, 8)


def train(steps=300, lr=0.01):
    params = model.init(jax.random.key(0), jnp.zeros(64))["params"]
    opt = optax.adam(lr)
    state = opt.init(params)
    xs, ys = jnp.asarray(x_train, jnp.float32), jnp.asarray(y_train)

    @jax.jit
    def step(params, state):
        grads = jax.grad(lambda p: jax.vmap(loss_fn, (None, 0, 0))(p, xs, ys).mean())(params)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state

    for _ in range(steps):
        params, state = step(params, state)
    return params


params = train()
