"""Your own Equinox model in gradlab's explorer: `python -m gradlab serve examples/own_model_equinox.py`.

The file defines what the explorer needs (docs/own-model.md): `loss_fn(params, x, y)`, the loss of ONE example;
`params`, the trained model (here an Equinox module); `data`; and optionally `checkpoints` with their `steps`
and `learning_rates` (the Influence page's TracIn follows them), `class_names` and `image_shape`. Without a
`predict_fn` a classifier predicts the class whose label gives the lowest loss. It trains an `eqx.nn.MLP` on
scikit-learn's bundled digits (nothing downloaded) with plain SGD when it is loaded: about a second on a CPU.

Its training recipe (`init_fn`, `optimizer`, `train_steps`, `batch_size`) lets gradlab's own loop train the same
model from an initialization: DP-SGD on the DP clipping page, the privacy audit's membership attack, the LDS and
TRAK's ensemble on the Influence page. Full-batch SGD here, so gradlab's loop with this recipe at seed 0 gives
back `params` (tests/test_own_model.py checks it).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def loss_fn(model, x, y):
    """Cross-entropy of one example: x (64,), y an int class id."""
    logits = model(x)
    return jax.nn.logsumexp(logits) - logits[y]


digits = load_digits()
x_train, x_test, y_train, y_test = train_test_split(digits.data / 16.0, digits.target, test_size=0.2, random_state=0)
data = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
class_names = [str(d) for d in range(10)]
image_shape = (8, 8)


def init_fn(key):
    """A fresh, untrained model from a JAX PRNG key: gradlab's loop starts here (seed s: `jax.random.key(s)`)."""
    return eqx.nn.MLP(64, 10, width_size=32, depth=1, activation=jax.nn.relu, key=key)


optimizer = optax.sgd(0.1)  # the recipe gradlab's loop follows: this optax optimizer, ...
train_steps = 200  # ... this many steps ...
batch_size = len(x_train)  # ... of this many examples (here the full batch, as train() below)


def train(steps=train_steps, every=50):
    """Full-batch SGD; the model every `every` steps (step 0 included) is a checkpoint."""
    model = init_fn(jax.random.key(0))
    opt = optimizer
    state = opt.init(eqx.filter(model, eqx.is_array))
    xs, ys = jnp.asarray(x_train, jnp.float32), jnp.asarray(y_train)

    @eqx.filter_jit
    def step(model, state):
        grads = eqx.filter_grad(lambda m: jax.vmap(loss_fn, (None, 0, 0))(m, xs, ys).mean())(model)
        updates, state = opt.update(grads, state)
        return eqx.apply_updates(model, updates), state

    kept, at = [model], [0]
    for t in range(1, steps + 1):
        model, state = step(model, state)
        if t % every == 0:
            kept.append(model)
            at.append(t)
    return kept, at, [0.1] * len(kept)


checkpoints, steps, learning_rates = train()
params = checkpoints[-1]
