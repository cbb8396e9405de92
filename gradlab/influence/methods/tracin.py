"""TracInCP (Pruthi et al. 2020, eq. 3): Σ_c η_c ⟨∇θℓ(θ_c, zᵢ), ∇θℓ(θ_c, z)⟩ over the checkpoints of an SGD run,
each weighted by the learning rate used there. Self-influence Σ_c η_c ‖∇θℓ(θ_c, zᵢ)‖² (§4.1)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from gradlab import costs, experiment
from gradlab.influence import scores
from gradlab.influence.protocol import Context, Method, Scored


def tracin_run(fitted, fit: Callable | None = None):
    """The run TracIn follows: the experiment's own run under SGD, else the same experiment trained
    with SGD (TracIn is derived for SGD steps; Adam preconditions them). Returns `(TrainResult, note)`.
    **Raises** `ValueError` for a served model whose module lists fewer than 2 checkpoints."""
    exp = fitted.experiment
    if exp.source.brings_model:  # a served model: the checkpoints its module lists (its own run)
        if len(fitted.run.checkpoints) < 2:
            raise ValueError("TracIn follows the checkpoints of a training run: list `checkpoints` (params at earlier "
                             "steps, ending with the trained ones) and `learning_rates` in your model's module")
        return fitted.run, "TracIn follows the checkpoints and learning rates your module lists."
    if exp.optimizer == "sgd":
        return fitted.run, None
    sgd = (fit or experiment.fit)(exp.replace(optimizer="sgd"), data=fitted.data)
    return sgd.run, (f"TracIn is derived for SGD steps; this experiment trains with {exp.optimizer}. TracIn here "
                     f"follows the same experiment trained with SGD (momentum 0.9, learning rate {exp.lr:g}).")


class TracIn(Method):
    """Prepared state: `(checkpoints, lrs, note)` of the SGD run it follows (`tracin_run`)."""

    name, label, short = "tracin", "TracIn (checkpoints × learning rate used)", "TracIn"
    self_label, self_short = scores.SELF_INFLUENCE["tracin"], "TracIn"

    def cost_seconds(self, work, settings) -> float:
        run = 0.0 if work.sgd else costs.training_seconds(work.num_params, work.steps, work.batch_size, work.macs)
        # scores and self-influence: a pass per checkpoint each, one compile each
        return run + 2 * (work.pass_seconds() - work.pass_seconds(setup=False)) + 2 * self.click_seconds(work, settings)

    def click_seconds(self, work, settings) -> float:
        return max(int(work.n_checkpoints) - 1, 1) * work.pass_seconds(setup=False)

    def held_bytes(self, work, settings) -> int:
        return 4 * int(work.num_params) * int(work.n_checkpoints)

    def prepare(self, ctx: Context):
        run, note = tracin_run(ctx.fitted)
        return (*scores.tracin_checkpoints(run), note)

    def note(self, state):
        return state[2]

    def scores(self, ctx: Context, state, test_xs, test_ys) -> Scored:
        xs, ys = ctx.arrays()
        f = ctx.fitted.loss_fn
        total = sum(lr * scores.streamed_dots(f, c, xs, ys, scores.flat_gradients(f, c, test_xs, test_ys))
                    for c, lr in zip(state[0], state[1]))
        return Scored(np.asarray(total))

    def self_influence(self, ctx: Context, state) -> np.ndarray:
        xs, ys = ctx.arrays()
        return np.asarray(scores.tracin_self_influence(ctx.fitted.loss_fn, state[0], state[1], xs, ys))


METHOD = TracIn()
