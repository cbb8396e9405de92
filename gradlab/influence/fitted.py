"""Attribution for one `gradlab.experiment.Fitted`: what the Influence page, the LDS and the exports call (no
Streamlit), looping over the registry `gradlab.influence.methods.METHODS`.

One θ̂: `optimum` converges the objective the page names, mean ℓ + λ/2‖θ‖², warm-started from the trained model;
every method that needs it (`Method.needs_optimum`: the influence function, TRAK, their self-influence and the
retraining check) gets that same `Minimum` through its `Context`, converged on first use only. Each method is
prepared once (`prepare`: a TracIn run, a TRAK ensemble, projected training features) and then scores any test
points. `gate` says of each method whether its own first answer (θ̂ included where it needs it) fits the server.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from gradlab import costs, engine, ensemble, experiment, memory
from gradlab.influence import evaluation
from gradlab.influence.methods import DEFAULT, FALLBACKS, METHODS, defaults
from gradlab.influence.methods.tracin import tracin_run
from gradlab.influence.methods.trak import TRAK_MODELS, TRAK_PROJ_DIM, trak_models, trak_scores
from gradlab.influence.protocol import UNAVAILABLE, Context, Method, Work, arrays
from gradlab.influence.solvers import Method as Solver
from gradlab.influence.solvers import Minimum, minimize, split

__all__ = ["TRAK_MODELS", "TRAK_PROJ_DIM", "arrays", "test_point", "optimum", "tracin_run", "trak_models",
           "trak_scores", "context", "available", "work", "first_seconds", "CLICK_SECONDS", "Gate", "gate", "prepare", "PointScores", "score_test_points",
           "self_influence_scores", "retraining_check", "LDSTable", "lds_table"]


def _check_test_rows(fitted, rows) -> np.ndarray:
    """`rows` as a 1-D int array of test-set indices. **Raises** `ValueError` naming the first that does not exist."""
    n, idx = len(fitted.data.y_test), np.asarray(rows, dtype=int).reshape(-1)
    missing = idx[(idx < 0) | (idx >= n)]
    if missing.size:
        raise ValueError(f"test point {missing[0]} does not exist: there are {n} test points (0 to {n - 1})")
    return idx


def test_point(fitted, index: int):
    """(x, y) of test point `index`. **Raises** `ValueError` when it does not exist."""
    i = int(_check_test_rows(fitted, [index])[0])
    return jnp.asarray(fitted.data.x_test[i]), jnp.asarray(fitted.data.y_test[i])


def optimum(fitted, l2: float, *, tol: float | None = None, max_iter: int = 2000) -> Minimum:
    """θ̂: mean ℓ + λ/2‖θ‖² converged from the trained model (`solvers.minimize`) to ‖∇‖ < tol
    (1e-6 in float32) or `max_iter` L-BFGS iterations; read `Minimum.grad_norm`."""
    xs, ys = arrays(fitted)
    return minimize(fitted.loss_fn, fitted.model, xs, ys, l2=l2, tol=tol, max_iter=max_iter)


def context(fitted, settings: Mapping | None = None, *, base: Minimum | Callable[[], Minimum] | None = None,
            max_iter: int = 2000, between: Callable[[], None] | None = None) -> Context:
    """A `Context` for `fitted`: `settings` over every control's default (`methods.defaults`), θ̂ = `base` (a
    `Minimum`, or a function returning the page's cached one), else converged on first use (`optimum`, `max_iter`),
    and `between()` called between a method's large steps (default: nothing)."""
    opts = {**defaults(), **(settings or {})}
    if isinstance(base, Minimum):
        get = lambda: base  # noqa: E731
    elif base is not None:
        get = base
    else:
        get = functools.cache(lambda: optimum(fitted, float(opts["l2"]), max_iter=max_iter))
    return Context(fitted, opts, get, between or (lambda: None))


def available(fitted) -> tuple[dict[str, Method], dict[str, str]]:
    """The methods that apply to `fitted` (`Method.applies`), in registry order, and `{name: why}` for the others."""
    why = {name: m.applies(fitted) for name, m in METHODS.items()}
    return {n: m for n, m in METHODS.items() if why[n] is None}, {n: w for n, w in why.items() if w is not None}


def work(fitted, macs: int | None = None) -> Work:
    """The `Work` a method's cost is estimated from, for a fitted experiment (its recipe, checkpoints, forward
    multiply-adds `macs`, by default `experiment.forward_macs`, and optimizer)."""
    exp, r = fitted.experiment, fitted.recipe
    return Work(num_params=engine.num_params(fitted.model), n=len(fitted.data.y_train), n_test=len(fitted.data.y_test),
                steps=int(r["steps"]), batch_size=int(r["batch_size"]),
                macs=int(experiment.forward_macs(exp, fitted.data) if macs is None else macs), n_checkpoints=len(fitted.run.checkpoints),
                sgd=exp.optimizer == "sgd" or exp.source.brings_model,
                shapes=tuple(tuple(a.shape) for a in jax.tree.leaves(split(engine.as_params(fitted.model))[0])))


def first_seconds(method: Method, w: Work, settings: Mapping, *, optimum_stored: bool = False) -> float:
    """Estimated CPU-seconds of `method`'s first answer: its own `cost_seconds` plus, for a method that
    `needs_optimum` while θ̂ is not yet stored, θ̂'s L-BFGS (`costs.optimum_seconds`). The page gates each method on
    this, alone."""
    share = costs.optimum_seconds(w.num_params, w.n) if method.needs_optimum and not optimum_stored else 0.0
    return float(method.cost_seconds(w, settings)) + share


#: A method other than the one picked joins the page's first view (its agreement table, self-influence) only when
#: each further test point costs it at most this many CPU-seconds: on a large model a click never repeats a pass
#: over the training set for a method nobody picked.
CLICK_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class Gate:
    """Each method gated on its own cost: `first {name: CPU-s}` (`first_seconds`), `click {name: CPU-s}`
    (`Method.click_seconds`), `held {name: bytes}` (θ̂'s L-BFGS vectors included for a method that needs it), `why
    {name: why it does not fit}` (a fitting method is absent), and θ̂'s own `optimum_seconds`, `optimum_bytes` and
    `optimum_why` (None when θ̂ fits: the θ̂ metrics, the retraining check)."""

    first: dict
    click: dict
    held: dict
    why: dict
    optimum_seconds: float
    optimum_bytes: int
    optimum_why: str | None

    def fits(self, name: str) -> bool:
        return name in self.first and name not in self.why

    def default(self, names) -> str:
        """The method the page opens on among `names`: `methods.DEFAULT` when it fits, else the first of
        `methods.FALLBACKS` that fits, else the first that fits, else the first."""
        names = list(names)
        for n in (DEFAULT, *FALLBACKS, *names):
            if n in names and self.fits(n):
                return n
        return DEFAULT if DEFAULT in names else names[0]

    def joins(self, name: str, method: Method) -> bool:
        """Whether a method that was not picked is computed too: it fits, is not `on_demand` and each further test
        point costs it at most `CLICK_SECONDS`."""
        return self.fits(name) and not method.on_demand and self.click[name] <= CLICK_SECONDS


def gate(methods: Mapping[str, Method], w: Work, settings: Mapping, *, optimum_stored: bool = False,
         seconds: float | None = None, budget_bytes: int | None = None) -> Gate:
    """Gate every method of `methods` on its own first answer (`first_seconds`, against `seconds`, default
    `costs.WORK_BUDGET_SECONDS`) and bytes (`Method.held_bytes` plus θ̂'s L-BFGS vectors,
    `memory.influence_bytes(P, 0, 0, 0)`, for a method that `needs_optimum`; against `budget_bytes`, default
    `memory.BUDGET_BYTES`). θ̂ itself counts as stored (free) with `optimum_stored`."""
    seconds = costs.WORK_BUDGET_SECONDS if seconds is None else seconds
    budget_bytes = memory.BUDGET_BYTES if budget_bytes is None else budget_bytes
    opt_s = 0.0 if optimum_stored else costs.optimum_seconds(w.num_params, w.n)
    opt_b = memory.influence_bytes(w.num_params, 0, 0, 0)
    opt_why = None
    if opt_s > seconds:
        opt_why = (f"converging θ̂ (L-BFGS over {w.n:,} examples and {w.num_params:,} parameters, up to "
                   f"{costs.OPTIMUM_ITERS} iterations) would take about {opt_s:,.0f} CPU-seconds, over the "
                   f"{seconds:.0f} this shared server allows")
    elif opt_b > budget_bytes:
        opt_why = (f"θ̂'s L-BFGS would hold about {memory.mb(opt_b)}, over this server's {memory.mb(budget_bytes)} "
                   "per computation")
    first, click, held, why = {}, {}, {}, {}
    for name, m in methods.items():
        first[name] = first_seconds(m, w, settings, optimum_stored=optimum_stored)
        click[name] = float(m.click_seconds(w, settings))
        held[name] = int(m.held_bytes(w, settings)) + (opt_b if m.needs_optimum else 0)
        if m.needs_optimum and opt_why:
            why[name] = f"it needs θ̂, and {opt_why}"
        elif first[name] > seconds:
            why[name] = f"it would take about {first[name]:,.0f} CPU-seconds, over the {seconds:.0f} this server allows"
        elif held[name] > budget_bytes:
            why[name] = (f"it would hold about {memory.mb(held[name])}, over this server's {memory.mb(budget_bytes)}. "
                         f"{m.fix(w, settings)}")
    return Gate(first, click, held, why, opt_s, opt_b, opt_why)


def prepare(ctx: Context, method: Method):
    """`(state, None)` of `method.prepare(ctx)`, or `(None, why)` when it cannot run here."""
    try:
        return method.prepare(ctx), None
    except UNAVAILABLE as err:
        return None, str(err)


@dataclasses.dataclass(frozen=True, eq=False)
class PointScores:
    """Every method's scores for T test points: `scores {method: (T, N)}` (registry order; a method that failed is
    missing), `scored {method: Scored}` (with its note and caption) and `errors {method: message}`."""

    scores: dict
    scored: dict
    errors: dict


def score_test_points(ctx: Context, rows, *, names=None, states: Mapping | None = None) -> PointScores:
    """Score test points `rows` (indices into the test set) with every method in `names` (default: those that apply
    and are not `on_demand`), each prepared from `states {name: state}` or now. A method that cannot prepare or
    score is reported in `errors`; the others are still computed. **Raises** `ValueError` for a row out of range."""
    d, idx = ctx.fitted.data, _check_test_rows(ctx.fitted, rows)
    # gathered on the host and sent once (`jnp.stack` of 1,000 points compiled a 1,000-operand program)
    txs, tys = jnp.asarray(d.x_test[idx]), jnp.asarray(d.y_test[idx])
    use = available(ctx.fitted)[0]
    names = [n for n, m in use.items() if not m.on_demand] if names is None else [n for n in names if n in use]
    out, scored, errors = {}, {}, {}
    for name in names:
        m = METHODS[name]
        state, why = (states[name], None) if states and name in states else prepare(ctx, m)
        if why is not None:
            errors[name] = why
            continue
        try:
            scored[name] = m.scores(ctx, state, txs, tys)
            out[name] = np.asarray(scored[name].values)
        except UNAVAILABLE as err:
            errors[name] = str(err)
    return PointScores(out, scored, errors)


def self_influence_scores(ctx: Context, *, names=None, states: Mapping | None = None) -> tuple[dict, dict]:
    """Self-influence of every training example by each method in `names` (default: every method that applies and
    is not `on_demand`) that has one (`Method.self_label`): `({name: (N,)}, {name: why it is missing})`."""
    out, errors = {}, {}
    use = available(ctx.fitted)[0]
    for name, m in use.items():
        if m.self_label is None or (m.on_demand if names is None else name not in names):
            continue
        state, why = (states[name], None) if states and name in states else prepare(ctx, m)
        try:
            if why is not None:
                raise ValueError(why)
            out[name] = np.asarray(m.self_influence(ctx, state))
        except UNAVAILABLE as err:
            errors[name] = str(err)
    return out, errors


def retraining_check(fitted, base: Minimum, test_index: int, *, damping: float, k: int = 8, solver: Solver = "auto",
                     max_iter: int = 2000, progress=None, **solver_args) -> evaluation.RetrainingCheck:
    """`evaluation.check_against_retraining` for one test point, at the same θ̂ the ranking used."""
    xs, ys = arrays(fitted)
    x, y = test_point(fitted, test_index)
    return evaluation.check_against_retraining(fitted.loss_fn, base, xs, ys, x, y, damping=damping, k=k, method=solver,
                                               max_iter=max_iter, progress=progress, **solver_args)


@dataclasses.dataclass(frozen=True, eq=False)
class LDSTable:
    """LDS of every method on one ensemble: `results {method: LDS}`, `errors {method: message}`, `m` models,
    `test_indices (T,)`, `outputs (M, T)`, `subsets (M, H)` and the `ensemble` itself (masks `(M, N)`)."""

    results: dict
    errors: dict
    m: int
    test_indices: np.ndarray
    outputs: np.ndarray
    subsets: np.ndarray
    ensemble: ensemble.Ensemble | None = None


def subset_models(fitted, m: int, *, seed: int = 0) -> ensemble.Ensemble:
    """The LDS's ensemble: `m` models on random halves of the training set with the experiment's recipe
    (`ensemble.subset_ensemble` with `ensemble.by_recipe`, one vmapped scan; masks from `seed`, minibatches from
    `seed + 1`), each from the experiment's initialization."""
    xs, ys = arrays(fitted)
    exp = fitted.experiment
    # a served model's listed run need not start at an initialization: its module's init_fn gives one
    init = experiment.init_model(exp, fitted.data) if exp.source.brings_model else fitted.run.checkpoints[0]
    r = fitted.recipe
    trainer = ensemble.by_recipe(init, fitted.loss_fn, xs, ys, optimizer=r["optimizer"], lr=r["lr"], steps=r["steps"],
                                 batch_size=r["batch_size"], l2=r["l2"], seed=seed + 1)
    return ensemble.subset_ensemble(trainer, len(ys), m, seed=seed)


def lds_table(ctx: Context, *, m: int = 50, n_test: int = 32, seed: int = 0, names=None, states: Mapping | None = None,
              progress: Callable[[float, str], None] | None = None) -> LDSTable:
    """The linear datamodeling score (Park et al. 2023) of every method in `names` (default: every method that
    applies, `on_demand` ones included) on the first `n_test` test points.

    Trains M models on random halves with the experiment's recipe (`subset_models`), records −ℓ on each test point,
    and scores each method's (T, N) scores with `evaluation.lds` on the same subsets. Methods are prepared from
    `states {name: state}` or now. `progress(fraction, what)` between stages.
    """
    say = progress or (lambda *_: None)
    fitted = ctx.fitted
    t_idx = np.arange(min(n_test, len(fitted.data.y_test)))
    say(0.0, f"Training {m} models on random halves of the training set…")
    models = subset_models(fitted, m, seed=seed)
    outputs = evaluation.ensemble_outputs(fitted.loss_fn, models, fitted.data.x_test[t_idx], fitted.data.y_test[t_idx])
    subsets = models.subsets
    use = available(fitted)[0]
    names = list(use) if names is None else [n for n in names if n in use]
    results, errors = {}, {}
    for j, name in enumerate(names):
        say(0.3 + 0.7 * j / len(names), f"Scoring with {METHODS[name].label}…")
        ctx.between()  # each method compiles programs of its own: the one before returns them first (+340 MB without)
        got = score_test_points(ctx, t_idx, names=[name], states=states)
        if name in got.errors:
            errors[name] = got.errors[name]
        else:
            results[name] = evaluation.lds(got.scores[name], subsets, outputs)
    say(1.0, "Done")
    return LDSTable(results, errors, m, t_idx, outputs, subsets, models)
