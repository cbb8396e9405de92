"""Lecture scenarios: one click sets the experiment and a page's controls, and says what to look at.

A `Preset` is plain data (no Streamlit): a name, a short "what to look at" text, the page it opens,
the sidebar's experiment fields it sets (every other field goes back to its default, so a preset
always shows the same view), and the page's own widget values (by widget key, which is also the URL
query parameter). `gradlab.ui.preset_picker` applies one; `Preset.query()` is its shareable link.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

from gradlab.experiment import Experiment

#: The sidebar widget keys: the `Experiment` fields a user can set (test_fraction is not a control).
SIDEBAR_KEYS = (
    "dataset", "model", "width", "depth", "activation", "steps", "lr", "label_noise", "seed",
    "optimizer", "batch_size", "l2", "checkpoint_every",
)


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
        clash = set(self.widgets) & set(SIDEBAR_KEYS)
        if clash:
            raise ValueError(f"preset {self.name!r}: page widget keys {sorted(clash)} collide with the sidebar's")

    @property
    def config(self) -> Experiment:
        """The `Experiment` this preset trains (defaults plus its overrides)."""
        return Experiment().replace(**self.experiment)

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


PRESETS: tuple[Preset, ...] = (
    Preset(
        "Mislabeled digits stand out",
        "10% of the digit labels were flipped. Look at the red bars in the right tail of the norm "
        "histogram, the detection AUC, and the top-k grid: most of the largest per-example gradients "
        "belong to flipped labels.",
        "views/norms.py",
        {"dataset": "digits", "label_noise": 0.1},
    ),
    Preset(
        "Outliers pull hardest in regression",
        "A line fit with 5% of the targets shifted far off the line. The circled points with the largest "
        "per-example gradient norm are exactly those outliers: squared loss lets them dominate.",
        "views/norms.py",
        {"dataset": "line_outliers", "model": "linear", "lr": 0.1, "steps": 200},
    ),
    Preset(
        "Clipping bias hits a rare class",
        "Breast cancer has a minority class. With a small clipping norm C almost every example is clipped, "
        "and the clipped mean gradient no longer points where the true one does: compare the fraction "
        "clipped and the bias per class.",
        "views/dp_clipping.py",
        {"dataset": "breast_cancer", "model": "linear", "steps": 200},
    ),
    Preset(
        "The seeds' scalar example",
        "The tutorial's own example, w, b = 1.0, 0.0 with a squared loss: the per-example gradients from "
        "vmap(grad) summed are the gradient of the summed loss, exactly in float64 and to rounding in float32.",
        "views/equivalence.py",
    ),
    Preset(
        "Per-example gradients cost about one gradient",
        "A Python loop of jax.grad against one vmap(grad) call and one batch gradient, timed live: the loop "
        "grows with the batch, vmap(grad) stays close to the batch gradient.",
        "views/performance.py",
    ),
    Preset(
        "Who influenced this prediction?",
        "Two moons with 10% flipped labels. Pick a test point: its proponents (training examples whose "
        "gradient agrees with its own) and opponents, and the most self-influential, often mislabeled, examples.",
        "views/influence.py",
        {"dataset": "moons", "label_noise": 0.1, "steps": 300},
    ),
    Preset(
        "A learning rate of 100 diverges",
        "Training with lr = 100: the loss blows up. The app says so instead of crashing; lower the "
        "learning rate in the sidebar to recover.",
        "views/norms.py",
        {"dataset": "moons", "lr": 100.0, "optimizer": "sgd"},
    ),
)

BY_NAME: dict[str, Preset] = {p.name: p for p in PRESETS}
