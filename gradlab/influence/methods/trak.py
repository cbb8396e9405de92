"""TRAK (Park et al. 2023): projected per-example gradients of an ensemble of models, each at its own θ̂, with the
Gauss–Newton after-kernel (classification) or Algorithm 1's (regression), averaged over the models."""

from __future__ import annotations

from typing import Callable

import numpy as np

from gradlab import costs, engine, experiment, memory, own
from gradlab.influence import scores
from gradlab.influence.protocol import Context, Control, Method, Scored, arrays
from gradlab.influence.solvers import Minimum, minimize

#: TRAK's defaults on the page: projection dimension k (None: k = P, the exact kernel, solved matrix-free) and
#: ensemble size.
TRAK_PROJ_DIM = None
TRAK_MODELS = 5
#: The projection dimensions the page offers, and the exact kernel (no projection).
PROJ_DIMS = (64, 128, 256, 512, 1024, 2048, 4096)
EXACT = "P (exact)"


def trak_scores(fitted, models: list, l2: float, test_xs, test_ys, *, proj_dim: int | None = TRAK_PROJ_DIM):
    """`scores.trak` for a fitted experiment: the Gauss–Newton kernel of mean ℓ + λ/2‖θ‖² (λ = `l2`, the
    objective every model of `models` converged) for classification, Algorithm 1 for regression; `proj_dim`
    None is k = P. `(T, N)`."""
    xs, ys = arrays(fitted)
    task = fitted.data.task
    proj_dim = engine.num_params(fitted.model) if proj_dim is None else proj_dim
    return scores.trak(fitted.loss_fn, models, xs, ys, test_xs, test_ys, proj_dim=proj_dim, task=task,
                       kernel="gauss_newton" if task == "classification" else "algorithm1", l2=l2,
                       n_classes=fitted.data.n_classes if task == "classification" else None)


def trak_models(fitted, n_models: int = TRAK_MODELS, fit: Callable | None = None, *, base: Minimum | None = None,
                max_iter: int = 500) -> list:
    """TRAK's ensemble: the trained model and `n_models − 1` more trained on the same data with seeds seed+1, …
    (new initialization and minibatches, the experiment's recipe).

    With `base` (θ̂ of the trained model, `fitted.optimum`) each model is instead its own converged θ̂ of the same
    objective mean ℓ + λ/2‖θ‖² (λ = `base.l2`, L-BFGS warm-started from it, `max_iter`): the first is `base`
    itself, the others converge from the extra seeds' trained weights. TRAK then explains the same
    regularized optimum the influence function does, averaged over seeds.

    A served model without `init_fn` (`fitted.trainable` false) cannot be trained again: its ensemble is instead
    its module's last `n_models` checkpoints, newest first (TRAK over the checkpoints of one run, Park et al.
    2023, §5.3). **Raises** `ValueError` when the run lists too few checkpoints.
    """
    fit = fit or experiment.fit
    exp = fitted.experiment
    if fitted.trainable:
        trained = [fit(exp.replace(seed=exp.seed + s), data=fitted.data).model for s in range(1, n_models)]
    elif n_models <= len(fitted.run.checkpoints):
        trained = list(fitted.run.checkpoints[-2::-1][: n_models - 1])
    else:
        raise ValueError(f"TRAK's ensemble of {n_models} models trains more with gradlab's loop, or takes the last "
                         f"checkpoints of your run: your module lists {len(fitted.run.checkpoints)}. Set 'Models in "
                         f"the ensemble' to {len(fitted.run.checkpoints)} or fewer, or {own.NEEDS_INIT}")
    if base is None:
        return [fitted.model] + trained
    xs, ys = arrays(fitted)
    return [base.params] + [minimize(fitted.loss_fn, m, xs, ys, l2=base.l2, tol=base.tol, max_iter=max_iter).params
                            for m in trained]


def proj_dim(settings, num_params: int) -> int:
    """The projection dimension k a setting names: P for `EXACT`."""
    return int(num_params) if settings["proj_dim"] == EXACT else int(settings["proj_dim"])


class Trak(Method):
    """Representation: each model's projected gradient φ = Rᵀ∇ℓ (k ≥ P: unprojected), the test example's through the
    inverse after-kernel. Prepared state: the ensemble (`trak_models`, each model at its own θ̂). It trains
    `n_models − 1` models, so the page prepares it only when it is picked (`on_demand`)."""

    name, label, short = "trak", "TRAK (Gauss–Newton after-kernel, ensemble)", "TRAK"
    on_demand = True
    needs_optimum = True
    controls = (
        Control("n_models", "infl_trak_models", "Models in the ensemble", TRAK_MODELS, "number", min_value=1,
                max_value=10, help="θ̂ (as the influence function) plus models trained with seeds seed+1, … on the "
                "same data, each converged to its own θ̂ of the same objective at λ."),
        Control("proj_dim", "infl_trak_k", "Projection dimension k", EXACT, "slider",
                (*map(str, PROJ_DIMS), EXACT), help="Per-example gradients are projected to k dimensions by a "
                "Gaussian matrix. P (exact): no projection; the Gauss–Newton kernel is solved by conjugate gradient."),
    )
    prepare_reads = ("l2", "n_models")
    reads = ("l2", "n_models", "proj_dim")

    def cost_seconds(self, work, settings) -> float:
        p, n, extra = work.num_params, work.n, int(settings["n_models"]) - 1
        ensemble = extra * (costs.optimum_seconds(p, n) + costs.training_seconds(p, work.steps, work.batch_size,
                                                                                   work.macs))
        return ensemble + work.pass_seconds() + costs.inverse_hvp_seconds(p, n)  # its kernel: about one solve's work

    def held_bytes(self, work, settings) -> int:
        p, k = int(work.num_params), proj_dim(settings, work.num_params)
        trak = p * k + 3 * k * k if k < p else 5 * p * memory.TRAK_CG_BLOCK
        return 4 * (trak + p * int(settings["n_models"]))

    def fix(self, work, settings) -> str:
        return memory.influence_fix(work.num_params, PROJ_DIMS, int(settings["n_models"]), work.n_checkpoints)

    def prepare(self, ctx: Context):
        try:
            return trak_models(ctx.fitted, int(ctx.settings["n_models"]), base=ctx.optimum(),
                               max_iter=costs.OPTIMUM_ITERS)
        except ValueError as err:
            raise ValueError(f"training its ensemble failed: {err}") from err

    def every_test_point(self, ctx: Context) -> bool:
        p = engine.num_params(ctx.fitted.model)
        return proj_dim(ctx.settings, p) < p  # a projected kernel is built once per model

    def scores(self, ctx: Context, state, test_xs, test_ys) -> Scored:
        k = proj_dim(ctx.settings, engine.num_params(ctx.fitted.model))
        return Scored(np.asarray(trak_scores(ctx.fitted, state, float(ctx.settings["l2"]), test_xs, test_ys,
                                             proj_dim=k)))


METHOD = Trak()
