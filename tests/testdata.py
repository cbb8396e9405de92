"""Seeded test inputs and initial values from NumPy.

`jax.random` compiles a program for every shape it draws (about a second each on two busy cores, and a cold
compile cache in CI), and a model's eager init one per initializer: the engine tests need values, not JAX's
random streams, so they draw them here.
"""

import jax
import jax.numpy as jnp
import numpy as np


def normal(seed: int, shape, scale: float = 1.0, dtype=jnp.float32) -> jax.Array:
    """`scale` × standard normal values of `shape`, seeded."""
    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), dtype)


def randint(seed: int, shape, high: int, column: int | None = None, value: int | None = None) -> jax.Array:
    """int32 ids in [0, high) of `shape`, seeded; `column` of every row set to `value` (a repeated id)."""
    ids = np.random.default_rng(100 + seed).integers(0, high, shape).astype(np.int32)
    if column is not None:
        ids[:, column] = value
    return jnp.asarray(ids)


def filled(shapes, seed: int, scale: float = 0.3):
    """`shapes` (a pytree or module whose arrays are `jax.ShapeDtypeStruct`s, from an `eval_shape` of a model's
    init) with seeded normal values."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: jnp.asarray(scale * rng.standard_normal(s.shape), s.dtype)
                        if isinstance(s, jax.ShapeDtypeStruct) else s, shapes)
