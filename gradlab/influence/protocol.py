"""The attribution protocol: what one method declares, so that the Influence page, the LDS and the exports loop
over `gradlab.influence.methods.METHODS` and never compare a method's name.

A method (dattri's `BaseInnerProductAttributor`, LIT's `Interpreter`) says:

- who it is: `name` (the registry key and the URL code, e.g. `?infl_method=grad_dot`), `label`, `short` (tables,
  metrics, charts);
- how it represents a test example (`test_features`, `(T, F)`) and scores every training example against it
  (`train_scores`, `(T, N)`; together `scores`), high = proponent (removing it would raise the test loss);
- its self-influence (`self_influence`, `(N,)`, high = suspicious) with `self_label` / `self_short`, or none
  (`self_label = None`);
- its controls (`controls`, drawn by the page, bound to the URL) and which settings its results depend on
  (`prepare_reads`, `reads`: the cache keys);
- when it applies (`applies(fitted)`: None, or why not) and what its first answer costs (`cost_seconds`: its
  preparation and scoring; `click_seconds`: each further test point; `held_bytes`), described by a `Work`, so the
  page gates each method on its own cost and offers what fits;
- whether it needs θ̂, the re-converged optimum (`needs_optimum`): only then is θ̂ converged, and its L-BFGS
  (`costs.optimum_seconds`) is part of that method's cost (`fitted.first_seconds`); methods at the trained checkpoint
  (gradient dot products, TracIn, projected gradients) answer at any size;
- what it needs trained or converged first (`prepare`: a TracIn run, a TRAK ensemble, θ̂, projected training
  features), done once per fitted model and settings; `on_demand` methods (an ensemble to train) are prepared only
  when picked;
- `predicts_retraining`: its scores are what the leave-one-out retraining check compares with.

No Streamlit here. A method raises `ValueError` or `InfluenceError` (both `UNAVAILABLE`) with a message a visitor
can act on when it cannot run; the page shows it and keeps the other methods.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from gradlab import costs
from gradlab.influence.solvers import InfluenceError, Minimum

#: What a method raises when it cannot run here (the page shows the message; the other methods go on).
UNAVAILABLE = (ValueError, InfluenceError)


@dataclasses.dataclass(frozen=True)
class Control:
    """One control a method reads, drawn by the page and bound to the URL.

    `name`: the setting's name in `Context.settings`; `key`: the URL key (declared in `gradlab.ui.pages`);
    `widget`: `"select"` (a selectbox over `options`), `"slider"` (a select slider over `options`) or `"number"`
    (a number input from `min_value` to `max_value`); `default`; `help`; `fmt`: how an option is shown;
    `when = (setting, value)`: drawn only while another setting has that value (else the default is used).
    """

    name: str
    key: str
    label: str
    default: Any
    widget: str = "select"
    options: tuple = ()
    min_value: float | None = None
    max_value: float | None = None
    step: float | None = None
    help: str = ""
    fmt: Callable[[Any], str] | None = None
    when: tuple[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Work:
    """What the cost of a method depends on: `num_params` P, `n` training examples, `n_test` test points, the
    training recipe (`steps`, `batch_size`), `macs` (multiply-adds of one forward pass: convolutions), the run's
    `n_checkpoints`, whether it trains with SGD (`sgd`: TracIn follows it, else it trains an SGD run) and the
    differentiable leaves' `shapes`."""

    num_params: int
    n: int
    n_test: int = 0
    steps: int = 0
    batch_size: int = 0
    macs: int = 0
    n_checkpoints: int = 1
    sgd: bool = True
    #: the differentiable leaves' shapes (a method that projects per layer counts its features from them)
    shapes: tuple = ()

    def pass_seconds(self, n: int | None = None, *, setup: bool = True) -> float:
        """One streamed per-example pass over `n` examples (default: the training set), `costs.pass_seconds`
        (`setup`: its compiling, once per process; a further click's pass has none)."""
        return costs.pass_seconds(self.num_params, self.n if n is None else n, self.macs, setup=setup)


@dataclasses.dataclass(frozen=True, eq=False)
class Context:
    """Where a method computes: `fitted` (a `gradlab.experiment.Fitted`), `settings` (every control's value by
    name: the page's `l2` λ and `damping` δ and each method's own), `optimum()`, θ̂ of mean ℓ + λ/2‖θ‖² at
    λ = `settings["l2"]` (converged once and shared: the page passes its cached one), and `between()`, which a
    method calls between its large steps (the page returns memory there: `memory.release_memory`)."""

    fitted: Any
    settings: Mapping[str, Any]
    optimum: Callable[[], Minimum]
    between: Callable[[], None] = lambda: None

    def arrays(self):
        """(train_xs, train_ys) as jnp arrays."""
        return arrays(self.fitted)


def arrays(fitted):
    """(train_xs, train_ys) of a fitted experiment as jnp arrays."""
    return jnp.asarray(fitted.data.x_train), jnp.asarray(fitted.data.y_train)


@dataclasses.dataclass(frozen=True, eq=False)
class Scored:
    """A method's scores for T test points: `values (T, N)` (high = proponent), and what to say beside them:
    `note` (an info box) and `caption` (how they were computed), or None."""

    values: np.ndarray
    note: str | None = None
    caption: str | None = None


class Method:
    """The attribution protocol (see the module's docstring). Subclass it in one file under
    `gradlab/influence/methods/` and add one line to `METHODS` there; `docs/extending.md` has the example the tests
    run (`methods/last_layer.py`).

    Override `test_features` and `train_scores` (an inner-product method: τ(z)ᵢ = ⟨train representation of zᵢ,
    `test_features(z)`⟩), or `scores` as a whole; `self_influence` when `self_label` is set.
    """

    name: str = ""
    label: str = ""
    short: str = ""
    self_label: str | None = None
    self_short: str | None = None
    controls: tuple[Control, ...] = ()
    prepare_reads: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    on_demand: bool = False
    #: Its scores are the predictions the retraining check plots (the influence function's leave-one-out change).
    predicts_retraining: bool = False
    #: It needs θ̂, the optimum re-converged from the trained model (`Context.optimum`): the influence function, TRAK
    #: at θ̂. θ̂ is converged only for such a method, and its cost counts toward that method's.
    needs_optimum: bool = False

    # ---------------------------------------------------------------- when it applies and what it costs
    def applies(self, fitted) -> str | None:
        """None when the method applies to `fitted`'s model and task, else why not (shown on the page)."""
        return None

    def cost_seconds(self, work: Work, settings: Mapping) -> float:
        """Estimated CPU-seconds of the method's first answer on the page: preparing it and scoring one test point
        (all of them when `every_test_point`), and its self-influence; θ̂'s L-BFGS is not included (the page adds
        `costs.optimum_seconds` once for a method that `needs_optimum`, `fitted.first_seconds`). Default: one
        streamed pass to score, one more for the self-influence when it has one."""
        return work.pass_seconds() * (1 + (self.self_label is not None))

    def click_seconds(self, work: Work, settings: Mapping) -> float:
        """Estimated CPU-seconds of each further test point once prepared and compiled. Default: one streamed
        pass."""
        return work.pass_seconds(setup=False)

    def held_bytes(self, work: Work, settings: Mapping) -> int:
        """Bytes held at once beyond θ̂'s L-BFGS vectors (per-example gradients are streamed and not counted)."""
        return 0

    def fix(self, work: Work, settings: Mapping) -> str:
        """What to change when `held_bytes` does not fit."""
        return "Use a smaller model."

    # ---------------------------------------------------------------- computing
    def key(self, settings: Mapping, reads: tuple[str, ...] | None = None) -> tuple:
        """The settings its results depend on, as a hashable cache-key part: `((name, value), ...)`."""
        return tuple((r, settings[r]) for r in (self.reads if reads is None else reads))

    def prepare(self, ctx: Context) -> Any:
        """What the method needs before scoring (a run's checkpoints, an ensemble, θ̂); None by default.
        **Raises** `UNAVAILABLE` with a message when it cannot run here."""
        return None

    def note(self, state: Any) -> str | None:
        """A remark about the prepared state, shown when the method is picked (e.g. which run TracIn follows)."""
        return None

    def every_test_point(self, ctx: Context) -> bool:
        """Whether scoring all test points at once costs about as much as one (a kernel built once): the page then
        asks for all of them, and every later click is a lookup."""
        return False

    def test_features(self, ctx: Context, state: Any, test_xs, test_ys):
        """The representation of T test points, `(T, F)`."""
        raise NotImplementedError

    def train_scores(self, ctx: Context, state: Any, features) -> Any:
        """τ for every training example against each row of `features (T, F)`: `(T, N)`."""
        raise NotImplementedError

    def scores(self, ctx: Context, state: Any, test_xs, test_ys) -> Scored:
        """Scores of every training example for T test points `test_xs (T, ...)`, `test_ys (T,)`."""
        return Scored(np.asarray(self.train_scores(ctx, state, self.test_features(ctx, state, test_xs, test_ys))))

    def self_influence(self, ctx: Context, state: Any) -> np.ndarray:
        """Each training example's support for itself, `(N,)` ≥ 0 (high = mislabeled, atypical, memorized)."""
        raise NotImplementedError(f"{self.label} has no self-influence")
