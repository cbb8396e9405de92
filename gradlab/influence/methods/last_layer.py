"""Last-layer gradient dot product: ⟨∇_W ℓ(θ, zᵢ), ∇_W ℓ(θ, z)⟩ over the parameters W of the model's last layer only,
at the trained model; self-influence ‖∇_W ℓ(θ, zᵢ)‖².

For a dense output layer under softmax cross-entropy ∇_W ℓ = (p − e_y) ⊗ [a; 1] (a: the penultimate features), so the
score is (p_i − e_{y_i})·(p − e_y) × (a_i·a + 1): representer-point selection's kernel (Yeh et al. 2018, Thm 3.1,
with the loss gradient in place of α_i) and dattri's `RPSAttributor` idea, without its fine-tuning of the last layer.
It is the cheap, well-conditioned end of the gradient methods: the last layer's gradient is what a model's
penultimate "representation" says about an example, and it avoids the earlier layers' large, noisy gradients.

"The last layer" is the last parameter group in the pytree's order: the leaves that share the last leaf's parent
path (an Equinox model's final `Linear`, a Flax model's last `Dense_k` for fewer than 10 layers). For a model of one
group (softmax regression) it would be the gradient dot product itself, so it does not apply there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from gradlab import engine
from gradlab.influence import scores
from gradlab.influence.protocol import Context, Method
from gradlab.influence.solvers import split


def last_layer(params) -> tuple[str, ...]:
    """Names (`jax.tree_util.keystr` of each path, as `engine.per_example_layer_norms` names them) of the last
    parameter group's leaves: those sharing the last differentiable leaf's parent path. **Raises** `ValueError`
    for a model with no differentiable leaf."""
    leaves = jax.tree_util.tree_flatten_with_path(split(engine.as_params(params))[0])[0]
    if not leaves:
        raise ValueError("the model has no differentiable parameters")
    parent = leaves[-1][0][:-1]
    return tuple(jax.tree_util.keystr(p) or "params" for p, _ in leaves
                 if len(p) == len(parent) + 1 and p[:-1] == parent)


def last_layer_mask(params) -> jax.Array:
    """`(P,)` float: 1 on the last layer's parameters (`last_layer`), 0 elsewhere, in `ravel_pytree` order."""
    names = set(last_layer(params))
    diff = split(engine.as_params(params))[0]
    paths, tree = jax.tree_util.tree_flatten_with_path(diff)
    ones = [jnp.full(jnp.shape(v), (jax.tree_util.keystr(p) or "params") in names, jnp.result_type(v))
            for p, v in paths]
    return ravel_pytree(jax.tree_util.tree_unflatten(tree, ones))[0]


class LastLayer(Method):
    """Representation: a test example by its gradient restricted to the last layer, `(T, P)` with zeros elsewhere;
    a training example by its full gradient at the trained model (streamed), so only the last layer's part counts."""

    name, label, short = "last_layer", "Last-layer gradient dot product (representer kernel)", "last layer"
    self_label, self_short = "‖∇_W ℓᵢ‖² over the last layer W", "last layer"

    def applies(self, fitted) -> str | None:
        diff = split(engine.as_params(fitted.model))[0]
        if len(last_layer(fitted.model)) == len(jax.tree.leaves(diff)):
            return "the model has one layer, so its last layer's gradient dot product is the gradient dot product"
        return None

    def test_features(self, ctx: Context, state, test_xs, test_ys):
        model = ctx.fitted.model
        return scores.flat_gradients(ctx.fitted.loss_fn, model, test_xs, test_ys) * last_layer_mask(model)[None]

    def train_scores(self, ctx: Context, state, features):
        xs, ys = ctx.arrays()
        return scores.streamed_dots(ctx.fitted.loss_fn, ctx.fitted.model, xs, ys, features)

    def self_influence(self, ctx: Context, state) -> np.ndarray:
        xs, ys = ctx.arrays()
        norms = engine.per_example_layer_norms(ctx.fitted.loss_fn, ctx.fitted.model, xs, ys)
        return np.asarray(sum(jnp.square(norms[n]) for n in last_layer(ctx.fitted.model)))


METHOD = LastLayer()
