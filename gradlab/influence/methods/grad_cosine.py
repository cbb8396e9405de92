"""Gradient cosine: ⟨gᵢ, g⟩ / (‖gᵢ‖‖g‖) at the trained model, in [−1, 1] (0 where a gradient is 0). Keeps
large-gradient (often mislabeled) examples from dominating every test point. No self-influence (it is 1)."""

from __future__ import annotations

import jax.numpy as jnp

from gradlab import engine
from gradlab.influence import scores
from gradlab.influence.protocol import Context, Method


class GradCosine(Method):
    """Representation: a test example by its unit gradient `(T, P)`; a training example by its gradient divided by
    its norm (streamed)."""

    name, label, short = "grad_cosine", "Gradient cosine", "grad cosine"

    def cost_seconds(self, work, settings) -> float:
        return 2 * work.pass_seconds()  # the norms and the dot products

    def click_seconds(self, work, settings) -> float:
        return 2 * work.pass_seconds(setup=False)

    def test_features(self, ctx: Context, state, test_xs, test_ys):
        g = scores.flat_gradients(ctx.fitted.loss_fn, ctx.fitted.model, test_xs, test_ys)
        norm = jnp.linalg.norm(g, axis=1, keepdims=True)
        return jnp.where(norm > 0, g / jnp.maximum(norm, 1e-30), 0.0)

    def train_scores(self, ctx: Context, state, features):
        xs, ys = ctx.arrays()
        f, model = ctx.fitted.loss_fn, ctx.fitted.model
        norms = engine.per_example_norms(f, model, xs, ys)
        dots = scores.streamed_dots(f, model, xs, ys, features)
        return jnp.where(norms[None] > 0, dots / jnp.maximum(norms[None], 1e-30), 0.0)


METHOD = GradCosine()
