"""The attribution methods: one file each (`gradlab.influence.protocol.Method`), one line each in `METHODS`.

Adding a method is one new file here plus one line below (`docs/extending.md`): the Influence page, the LDS, the
exports and the self-influence section loop over this table, in its order (the first is the page's fallback).
"""

from __future__ import annotations

from gradlab.influence.methods import ekfac, grad_cosine, grad_dot, influence, last_layer, logra, trak, tracin
from gradlab.influence.protocol import Control, Method

#: The registry: name (the URL code) -> method, in the page's order.
METHODS: dict[str, Method] = {m.name: m for m in (
    grad_dot.METHOD,
    grad_cosine.METHOD,
    tracin.METHOD,
    influence.METHOD,
    ekfac.METHOD,
    trak.METHOD,
    last_layer.METHOD,
    logra.METHOD,
)}

#: The method the page opens on.
DEFAULT = influence.METHOD.name
#: Where the default does not fit the server (a large model: θ̂'s L-BFGS alone would take minutes), the page opens on
#: the first of these that fits: projected gradients at the trained checkpoint, then the gradient dot product.
FALLBACKS = (logra.METHOD.name, grad_dot.METHOD.name)

#: The settings every method shares: θ̂'s objective λ and the Hessian's damping δ (the page draws them first).
SETTINGS = (
    Control("l2", "infl_l2", "Regularization λ", 1e-2, "slider", (1e-4, 1e-3, 1e-2, 1e-1), fmt=lambda v: f"{v:g}",
            help="Part of the objective F(θ) = mean loss + λ/2‖θ‖² that θ̂ minimizes: it moves θ̂ and what retraining "
                 "converges to. The influence function, its self-influence and the retraining check all use this θ̂."),
    Control("damping", "infl_damping", "Damping δ", 1e-2, "slider", (0.0, 1e-3, 1e-2, 1e-1, 1.0), fmt=lambda v: f"{v:g}",
            help="Added to the Hessian only: (H + δI)⁻¹. A network's Hessian has negative eigenvalues where θ̂ is not an "
                 "exact minimum; δ > 0 makes H + δI positive definite. It does not change θ̂."),
)


def controls() -> tuple[Control, ...]:
    """Every control: the shared `SETTINGS`, then each method's own, in registry order."""
    return (*SETTINGS, *(c for m in METHODS.values() for c in m.controls))


def defaults() -> dict:
    """Every setting's default value by name."""
    return {c.name: c.default for c in controls()}


def labels() -> dict[str, str]:
    """name -> label of every method (what the page's method list shows beside the codes)."""
    return {name: m.label for name, m in METHODS.items()}


__all__ = ["METHODS", "DEFAULT", "FALLBACKS", "SETTINGS", "controls", "defaults", "labels"]
