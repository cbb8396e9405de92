"""The engine on inputs where padding used to leak: a loss undefined at a zero input, and typed PRNG keys per
example, with N not a multiple of the chunk. Oracle: a Python loop of `jax.grad`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradlab import engine, influence


def _direction_loss(w, x, y):
    """Undefined (NaN) at x = 0, as a mean-pooled empty bag or a normalized input is."""
    return (jnp.dot(w, x / jnp.linalg.norm(x)) - y) ** 2


def _dropout_loss(w, x, y):
    key, v = x
    keep = jax.random.bernoulli(key, 0.7, v.shape)
    return (jnp.dot(w, v * keep / 0.7) - y) ** 2


def _loop_clipped_sum(loss, w, xs, ys, c, weights):
    n = len(ys)
    total = 0.0
    for i in range(n):
        x = jax.tree.map(lambda a: a[i], xs)
        g = jax.grad(loss)(w, x, ys[i])
        total = total + weights[i] * g * jnp.minimum(1.0, c / jnp.linalg.norm(g))
    return np.asarray(total)


CASES = {
    "undefined at zero": (_direction_loss, lambda: jax.random.normal(jax.random.key(0), (10, 3))),
    "typed keys per example": (_dropout_loss, lambda: (jax.random.split(jax.random.key(1), 10),
                                                       jax.random.normal(jax.random.key(2), (10, 3)))),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("method", ["vmap", "auto"])
def test_weighted_clipped_sum_with_an_incomplete_last_chunk_matches_the_loop(case, method):
    loss, make = CASES[case]
    xs, ys, w = make(), jnp.linspace(-1, 1, 10), jnp.array([0.5, -1.0, 2.0])
    weights = jnp.linspace(0.5, 1.5, 10)
    got = np.asarray(engine.clipped_grad_sum(loss, w, xs, ys, 1.0, weights=weights, chunk_size=4, method=method))
    want = _loop_clipped_sum(loss, w, xs, ys, 1.0, weights)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    norms = np.asarray(engine.per_example_norms(loss, w, xs, ys, chunk_size=4))
    loop = [np.linalg.norm(jax.grad(loss)(w, jax.tree.map(lambda a: a[i], xs), ys[i])) for i in range(10)]
    np.testing.assert_allclose(norms, loop, rtol=1e-4)


def test_hessian_with_an_incomplete_last_chunk_stays_finite_on_a_loss_undefined_at_zero():
    """influence.hessian pads its last chunk like the engine (copies of real examples, weight 0)."""
    xs, ys, w = CASES["undefined at zero"][1](), jnp.linspace(-1, 1, 10), jnp.array([0.5, -1.0, 2.0])
    got = np.asarray(influence.hessian(_direction_loss, w, xs, ys, chunk_size=4))
    want = sum(np.asarray(jax.hessian(_direction_loss)(w, xs[i], ys[i]), np.float64) for i in range(10)) / 10
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
