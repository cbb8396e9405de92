"""What the engine counts as a parameter: floating arrays, in any pytree.

The engine (`gradlab.engine`) and its multi-device wrapper (`gradlab.sharding`) both need this
definition, and the wrapper sits under the engine, so it lives apart from both.
"""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

PyTree = Any

__all__ = ["as_params", "split_params", "num_params", "leaf_names"]


def as_params(params: PyTree) -> PyTree:
    """Turn Python floats in `params` into float arrays so they are differentiable and traced.

    The seeds write `w, b = 1.0, 0.0`; `jax.grad` accepts floats, but `eqx.filter_jit` would
    treat them as static (recompiling for each value). Equinox modules are left as they are: by
    Equinox's convention a float field (a pooling layer's `-inf` init, say) is not a parameter.

    **Arguments** `params`: any pytree (floats, arrays, dicts, tuples, Equinox modules).

    **Returns** the same pytree, every Python float (outside Equinox modules) a 0-d float array.
    """
    return jax.tree.map(
        lambda v: jnp.asarray(v, dtype=jnp.result_type(float))
        if isinstance(v, float) and not isinstance(v, bool)
        else v,
        params,
        is_leaf=lambda v: isinstance(v, eqx.Module),
    )


def split_params(params: PyTree) -> tuple[PyTree, PyTree]:
    """`(differentiable part, static part)` of `params`: floating arrays vs everything else.

    `eqx.combine(diff, static)` gives `params` back (`eqx.partition` with `eqx.is_inexact_array`).
    """
    return eqx.partition(params, eqx.is_inexact_array)


def num_params(params: PyTree) -> int:
    """P: the number of differentiable scalars in `params`: its floating arrays, and its floating
    `jax.ShapeDtypeStruct` leaves (an initialization traced, never run: `eqx.filter_eval_shape`) by their shape."""
    return int(sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(as_params(params)) if _inexact(leaf)))


def _inexact(leaf) -> bool:
    return eqx.is_inexact_array(leaf) or (isinstance(leaf, jax.ShapeDtypeStruct) and jnp.issubdtype(leaf.dtype, jnp.inexact))


def leaf_names(params: PyTree) -> list[str]:
    """Names of the differentiable leaves, in tree order (as in `engine.per_example_layer_norms`)."""
    diff, _ = split_params(as_params(params))
    return [jax.tree_util.keystr(p) or "params" for p, _ in jax.tree_util.tree_flatten_with_path(diff)[0]]
