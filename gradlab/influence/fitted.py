"""Attribution for one `gradlab.experiment.Fitted`: what the Influence page calls (no Streamlit).

One θ̂: `optimum` converges the objective the page names, mean ℓ + λ/2‖θ‖², warm-started from the
trained model; the influence-function ranking, its self-influence and the retraining check all use
that same `Minimum`. Gradient dot, cosine and TRAK explain the trained model(s); TracIn explains a run.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp
import numpy as np

from gradlab import engine, experiment, own
from gradlab.influence import evaluation, scores
from gradlab.influence.solvers import InfluenceError, InverseHVP, Method, Minimum, minimize

#: TRAK's defaults on the page: projection dimension k (None: k = P, the exact kernel, solved matrix-free) and
#: ensemble size.
TRAK_PROJ_DIM = None
TRAK_MODELS = 5


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


def arrays(fitted):
    """(train_xs, train_ys) of a fitted experiment as jnp arrays."""
    return jnp.asarray(fitted.data.x_train), jnp.asarray(fitted.data.y_train)


def test_point(fitted, index: int):
    """(x, y) of test point `index`. **Raises** `ValueError` when it does not exist."""
    d = fitted.data
    if not 0 <= int(index) < len(d.y_test):
        raise ValueError(f"test point {index} does not exist: there are {len(d.y_test)} test points (0 to {len(d.y_test) - 1})")
    return jnp.asarray(d.x_test[int(index)]), jnp.asarray(d.y_test[int(index)])


def optimum(fitted, l2: float, *, tol: float | None = None, max_iter: int = 2000) -> Minimum:
    """θ̂: mean ℓ + λ/2‖θ‖² converged from the trained model (`solvers.minimize`) to ‖∇‖ < tol
    (1e-6 in float32) or `max_iter` L-BFGS iterations; read `Minimum.grad_norm`."""
    xs, ys = arrays(fitted)
    return minimize(fitted.loss_fn, fitted.model, xs, ys, l2=l2, tol=tol, max_iter=max_iter)


def tracin_run(fitted, fit: Callable | None = None):
    """The run TracIn follows: the experiment's own run under SGD, else the same experiment trained
    with SGD (TracIn is derived for SGD steps; Adam preconditions them). Returns `(TrainResult, note)`."""
    exp = fitted.experiment
    if exp.source.brings_model:  # a served model: the checkpoints its module lists (its own run), or nothing to follow
        if len(fitted.run.checkpoints) < 2:
            raise ValueError("TracIn follows the checkpoints of a training run: list `checkpoints` (params at earlier "
                             "steps, ending with the trained ones) and `learning_rates` in your model's module")
        return fitted.run, "TracIn follows the checkpoints and learning rates your module lists."
    if exp.optimizer == "sgd":
        return fitted.run, None
    sgd = (fit or experiment.fit)(exp.replace(optimizer="sgd"), data=fitted.data)
    return sgd.run, (f"TracIn is derived for SGD steps; this experiment trains with {exp.optimizer}. TracIn here "
                     f"follows the same experiment trained with SGD (momentum 0.9, learning rate {exp.lr:g}).")


def trak_models(fitted, n_models: int = TRAK_MODELS, fit: Callable | None = None, *, base: Minimum | None = None,
                max_iter: int = 500) -> list:
    """TRAK's ensemble: the trained model and `n_models − 1` more trained on the same data with seeds seed+1, …
    (new initialization and minibatches, the experiment's recipe).

    With `base` (θ̂ of the trained model, `optimum`) each model is instead its own converged θ̂ of the same
    objective mean ℓ + λ/2‖θ‖² (λ = `base.l2`, L-BFGS warm-started from it, `max_iter`): the first is `base`
    itself, the others converge from the extra seeds' trained weights. TRAK then explains the same
    regularized optimum the influence function does, averaged over seeds.

    A served model without `init_fn` (`fitted.trainable` false) cannot be trained again: its ensemble is instead
    its module's last `n_models` checkpoints, newest first (TRAK over the checkpoints of one run, Park et al.
    2023, §5.3).
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


@dataclasses.dataclass(frozen=True, eq=False)
class PointScores:
    """Every method's scores for one test point: `scores {method: (N,)}` (keys of `METHODS`; a failed
    method is missing), `ihvp` (the influence function's solver report) and `errors {method: message}`."""

    scores: dict
    ihvp: InverseHVP | None
    errors: dict


def score_test_point(fitted, base: Minimum, test_index: int, *, damping: float, solver: Method = "auto",
                     tracin: tuple | None = None, **solver_args) -> PointScores:
    """The single-model methods for test point `test_index`: grad dot / cosine at the trained model, TracIn over
    `tracin = (checkpoints, lrs)`, the influence function at θ̂ = `base` (λ = base.l2, damping δ); TRAK, which
    trains an ensemble, is `trak_scores`. A method that fails is reported in `errors`, the others still computed.

    **Raises** `ValueError` for a test index out of range.
    """
    xs, ys = arrays(fitted)
    x, y = test_point(fitted, test_index)
    f, model = fitted.loss_fn, fitted.model
    out = {"grad_dot": np.asarray(scores.grad_dot(f, model, xs, ys, x, y)),
           "grad_cosine": np.asarray(scores.grad_cosine(f, model, xs, ys, x, y))}
    errors, info = {}, None
    if tracin is not None:
        out["tracin"] = np.asarray(scores.tracin(f, *tracin, xs, ys, x, y))
    try:
        s, info = scores.influence_scores(f, base.params, xs, ys, x[None], y[None], l2=base.l2, damping=damping,
                                          method=solver, **solver_args)
        out["influence"] = np.asarray(s[0])
    except InfluenceError as err:
        errors["influence"] = str(err)
    return PointScores({m: out[m] for m in scores.METHODS if m in out}, info, errors)


def self_influence_scores(fitted, base: Minimum, *, damping: float, tracin: tuple | None = None) -> tuple[dict, str | None]:
    """Self-influence by each available method (`scores.SELF_INFLUENCE`): gradient norm at the trained
    model, TracIn over `tracin`, the influence function at θ̂ (exact Hessian only). Returns
    `(scores, note)`, `note` saying why a method is missing."""
    xs, ys = arrays(fitted)
    f = fitted.loss_fn
    out = {"grad_norm": np.asarray(scores.self_influence(f, fitted.model, xs, ys, method="grad_norm"))}
    if tracin is not None:
        out["tracin"] = np.asarray(scores.self_influence(f, None, xs, ys, method="tracin", checkpoints=tracin[0],
                                                         lrs=tracin[1]))
    note = None
    try:
        out["influence"] = np.asarray(scores.self_influence(f, base.params, xs, ys, method="influence", l2=base.l2,
                                                            damping=damping))
    except InfluenceError as err:
        note = str(err)
    return out, note


def retraining_check(fitted, base: Minimum, test_index: int, *, damping: float, k: int = 8, solver: Method = "auto",
                     max_iter: int = 2000, progress=None, **solver_args) -> evaluation.RetrainingCheck:
    """`evaluation.check_against_retraining` for one test point, at the same θ̂ the ranking used."""
    xs, ys = arrays(fitted)
    x, y = test_point(fitted, test_index)
    return evaluation.check_against_retraining(fitted.loss_fn, base, xs, ys, x, y, damping=damping, k=k, method=solver,
                                               max_iter=max_iter, progress=progress, **solver_args)


@dataclasses.dataclass(frozen=True, eq=False)
class LDSTable:
    """LDS of every method on one set of subsets: `results {method: LDS}`, `errors {method: message}`,
    `m` subsets, `test_indices (T,)`, `outputs (M, T)`, `subsets (M, H)`."""

    results: dict
    errors: dict
    m: int
    test_indices: np.ndarray
    outputs: np.ndarray
    subsets: np.ndarray


def lds_table(fitted, base: Minimum, *, m: int = 50, n_test: int = 32, damping: float, solver: Method = "auto",
              tracin: tuple | None = None, trak: list | None = None, proj_dim: int | None = TRAK_PROJ_DIM, seed: int = 0,
              progress: Callable[[float, str], None] | None = None) -> LDSTable:
    """The linear datamodeling score of every method (Park et al. 2023) on the first `n_test` test points.

    Trains M models on random half-subsets with the experiment's recipe (`evaluation.train_on_subsets`,
    one vmapped scan), records −ℓ on each test point, and scores each method's (T, N) scores with
    `evaluation.lds` on the same subsets. `progress(fraction, what)` between stages.
    """
    say = progress or (lambda *_: None)
    exp = fitted.experiment
    xs, ys = arrays(fitted)
    f, n = fitted.loss_fn, len(ys)
    t_idx = np.arange(min(n_test, len(fitted.data.y_test)))
    txs, tys = jnp.asarray(fitted.data.x_test[t_idx]), jnp.asarray(fitted.data.y_test[t_idx])
    say(0.0, f"Training {m} models on random halves of the training set…")
    subsets = evaluation.random_subsets(n, m, seed=seed)
    # a served model's listed run need not start at an initialization: its module's init_fn gives one
    init = experiment.init_model(exp, fitted.data) if exp.source.brings_model else fitted.run.checkpoints[0]
    r = fitted.recipe
    stacked = evaluation.train_on_subsets(init, f, xs, ys, subsets, optimizer=r["optimizer"], lr=r["lr"], steps=r["steps"],
                                          batch_size=r["batch_size"], l2=r["l2"], seed=seed + 1)
    outputs = evaluation.subset_outputs(f, init, stacked, txs, tys)
    model = fitted.model
    stages = {
        "grad_dot": lambda: _dots(f, model, xs, ys, txs, tys),
        "grad_cosine": lambda: _cosines(f, model, xs, ys, txs, tys),
        "tracin": (lambda: sum(lr * _dots(f, c, xs, ys, txs, tys) for c, lr in zip(*tracin))) if tracin else None,
        "influence": lambda: scores.influence_scores(f, base.params, xs, ys, txs, tys, l2=base.l2, damping=damping,
                                                     method=solver)[0],
        "trak": (lambda: trak_scores(fitted, trak, base.l2, txs, tys, proj_dim=proj_dim)) if trak else None,
    }
    results, errors = {}, {}
    for j, (name, run) in enumerate(stages.items()):
        if run is None:
            continue
        say(0.3 + 0.7 * j / len(stages), f"Scoring with {scores.METHODS[name]}…")
        try:
            results[name] = evaluation.lds(np.asarray(run()), subsets, outputs)
        except InfluenceError as err:
            errors[name] = str(err)
    say(1.0, "Done")
    return LDSTable(results, errors, m, t_idx, outputs, subsets)


def _dots(f, params, xs, ys, txs, tys):
    """(T, N) gradient dot products, streamed (one pass for all T test points)."""
    return scores.project(f, params, xs, ys, scores.flat_gradients(f, params, txs, tys).T).T


def _cosines(f, params, xs, ys, txs, tys):
    g = scores.flat_gradients(f, params, txs, tys)
    norms = engine.per_example_norms(f, params, xs, ys)
    return _dots(f, params, xs, ys, txs, tys) / jnp.maximum(jnp.linalg.norm(g, axis=1)[:, None] * norms[None], 1e-30)
