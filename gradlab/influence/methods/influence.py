"""Influence functions (Koh & Liang 2017, eq. 2) at the converged θ̂ of mean ℓ + λ/2‖θ‖²: the predicted change of the
test loss when zᵢ is removed, (1/N) ∇L_testᵀ(H + δI)⁻¹(∇ℓᵢ + λθ̂). Self-influence (1/N) ∇ℓᵢᵀ(H + δI)⁻¹∇ℓᵢ (§5.4)."""

from __future__ import annotations

import numpy as np

from gradlab import costs
from gradlab.influence import scores
from gradlab.influence.protocol import Context, Control, Method, Scored
from gradlab.influence.solvers import SOLVERS


class InfluenceFunction(Method):
    """Representation: a test example by s = (H + δI)⁻¹∇L_test (an inverse HVP, `solvers.inverse_hvp_batch`), a
    training example by its gradient at θ̂ (streamed). Prepared state: θ̂ (`Context.optimum`)."""

    name, label, short = "influence", "Influence function (predicted leave-one-out change)", "influence function"
    self_label, self_short = scores.SELF_INFLUENCE["influence"], "influence function"
    controls = (
        Control("solver", "infl_solver", "H⁻¹v solver", "auto", "select", tuple(SOLVERS),
                help="\n".join(f"- **{k}**: {v}" for k, v in SOLVERS.items())),
        Control("lissa_scale", "infl_lissa_scale",
                "LiSSA scale (0 = 2 × the largest Hessian eigenvalue, by power iteration)", 0.0, "number",
                min_value=0.0, step=1.0, when=("solver", "lissa")),
    )
    predicts_retraining = True
    needs_optimum = True
    prepare_reads = ("l2",)
    reads = ("l2", "damping", "solver", "lissa_scale")

    def cost_seconds(self, work, settings) -> float:
        return self.click_seconds(work, settings) + 2 * work.pass_seconds()  # + compiling, its self-influence's pass

    def click_seconds(self, work, settings) -> float:
        return costs.inverse_hvp_seconds(work.num_params, work.n) + work.pass_seconds(setup=False)

    def prepare(self, ctx: Context):
        return ctx.optimum()

    def scores(self, ctx: Context, state, test_xs, test_ys) -> Scored:
        xs, ys = ctx.arrays()
        opts = ctx.settings
        extra = {"lissa_scale": float(opts["lissa_scale"])} if opts["solver"] == "lissa" and opts["lissa_scale"] > 0 else {}
        values, info = scores.influence_scores(ctx.fitted.loss_fn, state.params, xs, ys, test_xs, test_ys, l2=state.l2,
                                               damping=float(opts["damping"]), method=opts["solver"], **extra)
        caption = (f"Influence function at θ̂: (H + δI)⁻¹∇L_test solved by **{info.method}**"
                   + (f" in {info.iterations} iterations" if info.iterations else "")
                   + f"; relative residual {info.residual:.1e}; λ = {state.l2:g}, δ = {float(opts['damping']):g}.")
        return Scored(np.asarray(values), note=info.note or None, caption=caption)

    def self_influence(self, ctx: Context, state) -> np.ndarray:
        xs, ys = ctx.arrays()
        return np.asarray(scores.influence_self_influence(ctx.fitted.loss_fn, state.params, xs, ys, l2=state.l2,
                                                          damping=float(ctx.settings["damping"])))


METHOD = InfluenceFunction()
