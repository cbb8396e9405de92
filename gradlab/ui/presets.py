"""Lecture scenarios: one click sets the experiment and a page's controls, and says what to look at.

A `Preset` is plain data (no Streamlit): a name, a short "what to look at" text, the page it opens,
the sidebar's experiment fields it sets (every other field goes back to its default, so a preset
always shows the same view), and the page's own widget values (by widget key, which is also the URL
query parameter, as declared in `gradlab.ui.pages`; every control it does not set goes back to the
page's default). `gradlab.ui.preset_picker` applies one; `Preset.query()` is its shareable link.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

from gradlab.experiment import CONTROLS, Experiment
from gradlab.ui import pages

#: The sidebar widget keys: the `Experiment` fields a user can set, listed once in `experiment.CONTROLS`.
SIDEBAR_KEYS = CONTROLS


@dataclasses.dataclass(frozen=True)
class Preset:
    """One lecture scenario.

    - `name`: the button label; `look_at`: one or two sentences on what the view shows.
    - `page`: the page file it opens, e.g. `"views/norms.py"`.
    - `experiment`: `{Experiment field: value}` overrides of the defaults.
    - `widgets`: `{page widget key: value}` for the page's own controls.
    """

    name: str
    look_at: str
    page: str
    experiment: types.MappingProxyType = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    widgets: types.MappingProxyType = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))

    def __post_init__(self):
        object.__setattr__(self, "experiment", types.MappingProxyType(dict(self.experiment)))
        object.__setattr__(self, "widgets", types.MappingProxyType(dict(self.widgets)))
        unknown = set(self.experiment) - set(SIDEBAR_KEYS)
        if unknown:
            raise ValueError(f"preset {self.name!r} sets unknown experiment fields {sorted(unknown)}")
        foreign = set(self.widgets) - set(pages.page(self.page).controls)
        if foreign:
            raise ValueError(f"preset {self.name!r} sets {sorted(foreign)}, which are not controls of {self.page} "
                             "(gradlab.ui.pages)")

    @property
    def config(self) -> Experiment:
        """The `Experiment` this preset trains (its model's defaults plus its overrides)."""
        return Experiment.for_model(self.experiment.get("model", Experiment().model)).replace(**self.experiment)

    def state(self) -> dict[str, Any]:
        """Every sidebar key (defaults included) and the page widget values: what to put in session state."""
        exp = self.config
        return {**{k: getattr(exp, k) for k in SIDEBAR_KEYS}, **self.widgets}

    def query(self) -> dict[str, str]:
        """The URL query parameters of this view (values that differ from the defaults, as strings)."""
        exp, default = self.config, Experiment()
        q = {k: _number(getattr(exp, k)) for k in SIDEBAR_KEYS if getattr(exp, k) != getattr(default, k)}
        for k, v in self.widgets.items():
            q[k] = str(v).lower() if isinstance(v, bool) else _number(v)
        return q


def _number(v: Any) -> str:
    """How Streamlit writes a bound widget's value into the URL (5.0 -> "5", 0.0001 -> "0.0001")."""
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


#: Experiments the lecture reuses (few, so a server's LRU of trained models holds them all).
NOISY_DIGITS = {"dataset": "digits", "label_noise": 0.1}
LINE = {"dataset": "line_outliers", "model": "linear", "lr": 0.1, "steps": 200}
CANCER = {"dataset": "breast_cancer", "model": "linear", "steps": 200}
NOISY_MOONS = {"dataset": "moons", "label_noise": 0.1, "steps": 300}

#: Line with outliers: 10 of its 200 targets are shifted; 10 of them land in the 160-example training split.
LINE_OUTLIERS_IN_TRAIN = 10

PRESETS: tuple[Preset, ...] = (
    Preset(
        "The seeds' scalar example",
        "The tutorial's own example, w, b = 1.0, 0.0 with a squared loss and x = [1, 2]: vmap(grad) gives the "
        "per-example gradients [2, 8], and their sum 10 is the gradient of the summed loss.",
        "views/equivalence.py",
        widgets={"eq_example": "scalar"},
    ),
    Preset(
        "Per-example gradients cost about one gradient",
        "A Python loop of jax.grad against one vmap(grad) call and one batch gradient, timed live from N = 4 to "
        "256: the loop grows with N (over 10× slower than vmap(grad) at N = 256), vmap(grad) stays near the batch gradient.",
        "views/performance.py",
        widgets={"perf_sizes": [4, 16, 64, 256], "perf_repeats": 1},
    ),
    Preset(
        "Outliers pull hardest in regression",
        f"A line fit where {LINE_OUTLIERS_IN_TRAIN} training targets sit far off the line. The "
        f"{LINE_OUTLIERS_IN_TRAIN} circled points with the largest per-example gradient norm are exactly those "
        "outliers: squared loss lets them dominate.",
        "views/norms.py",
        LINE,
        {"topk": LINE_OUTLIERS_IN_TRAIN},
    ),
    Preset(
        "Mislabeled digits stand out",
        "10% of the digit labels were flipped. On the log-scale norm histogram the red bars fill the right tail, "
        "and most of the top-16 per-example gradients (14 of 16) belong to flipped labels.",
        "views/norms.py",
        NOISY_DIGITS,
        {"log": True},
    ),
    Preset(
        "Clipping bias hits a rare class",
        "Breast cancer: malignant is the minority class (170 of 455). Its examples have larger gradients, so at "
        "C = 0.5 more of them are clipped than of the benign class (about 16% against 10%): clipping "
        "shrinks the rare class's pull most.",
        "views/dp_clipping.py",
        CANCER,
        {"dp_clip_c": 0.5},
    ),
    Preset(
        "Who influenced this prediction?",
        "Two moons with 10% flipped labels. Pick a test point: its proponents (training examples whose gradient "
        "agrees with its own) and opponents; the most self-influential training examples are mostly flipped labels.",
        "views/influence.py",
        NOISY_MOONS,
        {"infl_k": 12},
    ),
    Preset(
        "A learning rate of 100 diverges",
        "Training with lr = 100: the loss blows up. The app says so instead of crashing; lower the "
        "learning rate in the sidebar to recover.",
        "views/norms.py",
        {"dataset": "moons", "lr": 100.0, "optimizer": "sgd"},
        {"log": True},
    ),
)

BY_NAME: dict[str, Preset] = {p.name: p for p in PRESETS}


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the lecture: a full view (`preset`: page, experiment, page controls) and what to say.

    - `narration`: two or three sentences shown above the view.
    - `notes`: speaker notes (shown in an expander).
    - `practice`: the Practice problem (its slug, `gradlab.practice.BY_SLUG`) where students write this step's code.
    - `figure`: the step's point: the title (or a stable part of it) of the figure the narration is about.
    - `point`: the page's blocks (`gradlab.ui.points`, by name) that hold that figure and its metrics, drawn first,
      right under the narration; empty when the figure already opens the page.
    """

    title: str
    narration: str
    notes: str
    preset: Preset
    practice: str = ""
    figure: str = ""
    point: tuple[str, ...] = ()


def _step(title: str, narration: str, notes: str, page: str = "", experiment=None, widgets=None, *,
          preset: str | None = None, practice: str = "", figure: str, point: tuple[str, ...] = ()) -> Step:
    p = BY_NAME[preset] if preset else Preset(title, narration, page, experiment or {}, widgets or {})
    return Step(title, narration, notes, p, practice, figure, tuple(point))


#: The lecture: an ordered story through per-example gradients, one full view per step (`?step=1` … ).
LECTURE: tuple[Step, ...] = (
    _step("Per-example gradients of the seeds' example",
          "One loss, two examples: ℓ = (w·x)² at w = 1 with x = [1, 2]. vmap(grad) gives one gradient per "
          "example, [2, 8]; their sum, 10, is exactly the gradient of the summed loss.",
          "Write ℓᵢ = (w xᵢ)² on the board, dℓᵢ/dw = 2 w xᵢ² → 2 and 8. Point at way (a) = way (b) = 10 and at "
          "float64 agreeing to ~1e-16. Ask: what would the mean give? (5.)",
          preset="The seeds' scalar example", practice="per_example_grads",
          figure="Per-example gradients, their sum, and the gradient of the summed loss", point=("equivalence",)),
    _step("Every example is an arrow",
          "Give the model two parameters, w and b, and each example's gradient becomes an arrow in the plane. "
          "The two arrows (2, 2) and (8, 4) add up to (10, 6): the black arrow is their mean, the batch gradient.",
          "Same example as step 1 with an intercept b. The w-components are still 2 and 8. Note the arrows point "
          "uphill: a step goes the other way. Toggle the trajectories to show SGD sliding to the minimum.",
          "views/geometry.py", {}, {"geo_problem": "scalar", "geo_paths": True, "geo_steps": 10, "geo_lr": 0.1},
          figure="Per-example gradients gᵢ at θ"),
    _step("Sum or mean: the same vector, scaled",
          "On a real network (an MLP on digits) vmap(grad(f)).mean(0) and grad(mean(vmap(f))) agree to float32 "
          "rounding in every parameter leaf. Mixing a per-example sum with a mean loss is off by exactly N.",
          "Point at the float32 bars near 1e-7 and the float64 bars near 1e-16. Then the scaling trap: ‖Σgᵢ‖/‖∇mean‖ "
          "= N = 1,437. Every clipping norm C is meaningless if you get this wrong.",
          "views/equivalence.py", NOISY_DIGITS, {"eq_reduction": "mean"}, practice="fix_mean",
          figure="max relative difference per leaf", point=("equivalence",)),
    _step("What do N gradients cost?",
          "A Python loop calls jax.grad once per example; vmap(grad) does all of them in one call. The loop grows "
          "linearly with N, vmap(grad) stays within a small factor of the single batch gradient.",
          "Timings are live on this machine: read the ratios, not the digits. The first call includes compiling; "
          "it is shown apart. Streamed norms never build the N×P matrix.",
          preset="Per-example gradients cost about one gradient", practice="loop_vs_vmap",
          figure="Run time vs batch size"),
    _step("Outliers have the longest arrows",
          "A line fit y = w·x + b from a bad start, on data with a few outliers (red). Here, far from the fit, "
          "every arrow is long; step along the path and the clean arrows shrink while the red ones stay long and "
          "drag the mean towards them.",
          "Step through the SGD path (Step button): near the optimum the clean arrows shrink, the red ones do not. "
          "That is why the norm finds outliers.",
          "views/geometry.py", {}, {"geo_paths": True, "geo_t": 0}, figure="Per-example gradients gᵢ at θ"),
    _step("Outliers pull hardest in regression",
          "The same story on the full training set: the examples with the largest per-example gradient norm are "
          "the shifted targets. Squared loss lets a few points dominate the gradient.",
          "All 10 circled points are outliers. Ask: what would a robust (Huber) loss do to their arrows?",
          preset="Outliers pull hardest in regression", figure="Training set coloured by gradient norm",
          point=("norms_top",)),
    _step("Mislabeled digits stand out",
          "Flip 10% of the digit labels and train. The flipped examples sit in the right tail of the norm "
          "histogram (log scale), and the top of the ranking is almost all flipped labels.",
          "Point at the red tail, the AUC (~0.9) and the top-16 grid: 14 of 16 are flipped. The per-example loss "
          "finds them too: compare the two ROC curves.",
          preset="Mislabeled digits stand out", practice="exercise_256",
          figure="Distribution of per-example gradient norms"),
    _step("Clipping is a ball",
          "DP-SGD clips every arrow to length C: the dashed circle. Long arrows are cut, short ones kept, so the "
          "clipped mean (purple) no longer points where the true mean (black) does: clipping is biased.",
          "Near the optimum the outliers' arrows dominate the true mean; after clipping they count like anyone else. "
          "Read the cosine between the two means.",
          "views/geometry.py", {}, {"geo_clip": True, "geo_c": 2.0, "geo_t": 20}, practice="dp_sgd_step",
          figure="Per-example gradients gᵢ at θ"),
    _step("Clipping bias hits a rare class",
          "On breast cancer the minority class (malignant) has larger per-example gradients, so clipping at C cuts "
          "more of its gradients than the majority's. The model's pull towards the rare class shrinks most.",
          "Per-class bars: fraction clipped is higher for malignant. This is Bagdasaryan et al. 2019: DP hurts "
          "under-represented groups first.",
          preset="Clipping bias hits a rare class", figure="Per class at C", point=("dp_per_class",)),
    _step("DP noise is a cloud",
          "DP-SGD adds Gaussian noise of std σ·C to the clipped sum, σ·C/B to the mean: every step lands somewhere "
          "in the green cloud. The DP-SGD path wanders around the clipped SGD path.",
          "Raise σ and watch the cloud grow; raise B and it shrinks (more examples share the noise). Three paths "
          "from the same start, same minibatches.",
          "views/geometry.py", {}, {"geo_clip": True, "geo_noise": True, "geo_paths": True, "geo_c": 2.0,
                                    "geo_sigma": 2.0, "geo_t": 20},
          figure="Per-example gradients gᵢ at θ"),
    _step("DP-SGD and its ε",
          "The privacy cost ε of the whole run comes from an accountant (Google's dp-accounting), given the sampling "
          "rate q, the noise multiplier σ and the number of steps. Here σ is calibrated so 200 steps spend ε = 3.",
          "Press Train to compare a private and a non-private softmax regression on digits (≥ 90% at ε ≤ 3). "
          "Signal/noise at the top says why large batches help DP.",
          "views/dp_clipping.py", {"dataset": "digits", "model": "linear"},
          {"dp_sgd_c": 0.5, "dp_clip_sigma": 2.0}, figure="Privacy spent: ε after each step", point=("dp_sgd",)),
    _step("Who influenced this prediction?",
          "The dot product of a training example's gradient with a test point's says whether it helped or hurt "
          "that prediction. Proponents agree, opponents disagree; the most self-influential examples are mostly "
          "flipped labels.",
          "Click a misclassified test point: its opponents are often flipped neighbours. Then scroll to the "
          "check against actual leave-one-out retraining.",
          preset="Who influenced this prediction?", practice="influence_score",
          figure="(blue helps, red hurts)", point=("influence_proponents", "influence_self")),
    _step("Remove one example: influence vs retraining",
          "Logistic regression with two weights: removing one flipped label moves the optimum (star to cross). "
          "The influence function predicts where (diamond) from one gradient and the Hessian, without retraining.",
          "Click other training points in the right chart to remove them. The influence error stays small here "
          "because the loss is nearly quadratic near the optimum.",
          "views/geometry.py", {}, {"geo_problem": "logistic", "geo_remove": 2},
          figure="Close-up: the optimum moves", point=("geo_removal",)),
)
