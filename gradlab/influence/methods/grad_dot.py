"""Gradient dot product: τ(z)ᵢ = ⟨∇θℓ(θ, zᵢ), ∇θℓ(θ, z)⟩ at the trained model (one SGD step of size η on zᵢ changes
the test loss by ≈ −η·τ). Self-influence ‖∇θℓ(θ, zᵢ)‖². Streamed (`engine.per_example_dots`), never N × P."""

from __future__ import annotations

import numpy as np

from gradlab.influence import scores
from gradlab.influence.protocol import Context, Method


class GradDot(Method):
    """Representation: a training example by its loss gradient at the trained model (streamed), a test example by
    its flat gradient `(T, P)`; score their dot product (loss² per parameter²)."""

    name, label, short = "grad_dot", "Gradient dot product", "grad dot"
    self_label, self_short = scores.SELF_INFLUENCE["grad_norm"], "gradient norm"

    def test_features(self, ctx: Context, state, test_xs, test_ys):
        return scores.flat_gradients(ctx.fitted.loss_fn, ctx.fitted.model, test_xs, test_ys)

    def train_scores(self, ctx: Context, state, features):
        xs, ys = ctx.arrays()
        return scores.streamed_dots(ctx.fitted.loss_fn, ctx.fitted.model, xs, ys, features)

    def self_influence(self, ctx: Context, state) -> np.ndarray:
        xs, ys = ctx.arrays()
        return np.asarray(scores.grad_norm_self_influence(ctx.fitted.loss_fn, ctx.fitted.model, xs, ys))


METHOD = GradDot()
