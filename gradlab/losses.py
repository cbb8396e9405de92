"""Single-example losses `(model, x, y) -> scalar`, the engine's `loss_fn` contract.

They are module-level functions on purpose: the engine compiles once per `loss_fn` object, so a
fresh lambda per call would re-trace.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from gradlab import xla


def _squared_error(out, y):
    return jnp.square(out - y)


def _nll(logits, y):
    return jax.nn.logsumexp(logits) - logits[y]


def mse(model, x, y):
    """Squared error `(model(x) - y)²` of one example; `y` a scalar target."""
    return _squared_error(model(x), y)


def cross_entropy(model, x, y):
    """Cross-entropy `-log softmax(model(x))[y]` of one example; `y` an int class id."""
    return _nll(model(x), y)


def smoothed_cross_entropy(model, x, y, smoothing):
    """Cross-entropy against the label-smoothed target `(1 − ε) onehot(y) + ε / K` (Szegedy et al. 2016,
    arXiv:1512.00567, section 7): `logsumexp(z) − (1 − ε) z_y − ε mean_k z_k` for logits `z = model(x) (K,)`; ε =
    `smoothing` in [0, 1), a scalar (ε = 0 is `cross_entropy`). A training objective only: the pages explore
    `cross_entropy`."""
    logits = model(x)
    return jax.nn.logsumexp(logits) - (1 - smoothing) * logits[y] - smoothing * jnp.mean(logits)


def loss_for(task: str):
    """The loss for a task: `cross_entropy` for classification, `mse` for regression."""
    return cross_entropy if task == "classification" else mse


def cross_entropy_and_prediction(model, x, y):
    """`(cross_entropy, predicted class id argmax model(x))` of one example from one forward pass."""
    logits = model(x)
    return _nll(logits, y), jnp.argmax(logits)


def mse_and_prediction(model, x, y):
    """`(mse, model(x))` of one example from one forward pass."""
    out = model(x)
    return _squared_error(out, y), out


def with_prediction(task: str):
    """`loss_for(task)` that also returns the prediction `predict` gives, `(loss, prediction)`: for an engine pass
    with `has_aux=True` that needs no second forward pass for the predictions. Each shares its loss's formula
    (`_nll`, `_squared_error`), so the two give the same value."""
    return cross_entropy_and_prediction if task == "classification" else mse_and_prediction


#: Examples per vmapped chunk of a forward pass over a whole set: a convolution's activations are about 1 MB
#: per example (seed 003's SimpleCNN on 28×28 images), so one vmap over 6,000 images would hold gigabytes.
FORWARD_CHUNK = 64


def _forward(f, *arrays):
    """`vmap(f)` over the example axis, `FORWARD_CHUNK` examples at a time (`xla.map_chunks`): same values, bounded
    memory."""
    return xla.map_chunks(lambda a: f(*a), arrays, FORWARD_CHUNK)


@eqx.filter_jit
def predict(model, xs, task: str, apply=None):
    """Predictions for a batch `xs (N, D)`: class ids `(N,)` or real values `(N,)` (in chunks of `FORWARD_CHUNK`).
    `apply(model, x)`: one example's output when `model` is not callable (a user's params); default `model(x)`."""
    return _prediction(_forward(model if apply is None else (lambda x: apply(model, x)), xs), task)


def _prediction(out, task: str):
    """The prediction of a model's output `out` (`(…, K)` logits or a real value): its class id or itself."""
    return jnp.argmax(out, axis=-1) if task == "classification" else out


@eqx.filter_jit
def losses_and_predictions(loss_fn, model, xs, ys, task: str, apply=None):
    """`(per_example_losses(loss_fn, model, xs, ys), predict(model, xs, task, apply))`, `(N,)` each, as ONE compiled
    program (in chunks of `FORWARD_CHUNK`): XLA computes the forward pass the two share once. Against the two calls on
    SimpleCNN's 1,000 test images: one compile instead of two, the forward run once (benchmarks/RESULTS.md, issue 40,
    session 42)."""
    def one(x, y):
        out = model(x) if apply is None else apply(model, x)
        return loss_fn(model, x, y), _prediction(out, task)

    return _forward(one, xs, ys)


@eqx.filter_jit
def probabilities(model, xs):
    """Class probabilities `(N, K)` for a batch (classification models; in chunks of `FORWARD_CHUNK`)."""
    return jax.nn.softmax(_forward(model, xs), axis=-1)


@eqx.filter_jit
def per_example_losses(loss_fn, model, xs, ys):
    """`(N,)` losses `loss_fn(model, x_i, y_i)` of a batch (vmapped in chunks of `FORWARD_CHUNK`)."""
    return _forward(lambda x, y: loss_fn(model, x, y), xs, ys)
