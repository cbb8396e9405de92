"""Training-data attribution: which training examples helped or hurt one prediction, and how to tell
which method to trust.

- `solvers`: the one optimum θ̂ (`minimize`) and inverse Hessian-vector products at it.
- `protocol`: what an attribution method declares (`Method`, `Control`, `Context`, `Scored`) and what its cost
  depends on (`Work`).
- `methods`: one file per method; `METHODS` is the registry the page, the LDS and the exports loop over.
- `scores`: the math: grad-dot, cosine, TracIn, influence functions, TRAK, self-influence.
- `evaluation`: leave-one-out retraining (`check_against_retraining`) and the linear datamodeling
  score (`lds`, `train_on_subsets`; `stored_lds`: tables a benchmark measured offline).
- `fitted` (imported on its own): the same for a `gradlab.experiment.Fitted` (what the Influence page calls).
"""

from gradlab.influence.evaluation import (
    LDS, RetrainingCheck, check_against_retraining, correlations, extreme_indices, lds, lds_of_predictions,
    method_agreement, random_subsets, stored_lds, subset_masks, subset_outputs, train_on_subsets,
)
from gradlab.influence.methods import METHODS, SETTINGS
from gradlab.influence.protocol import UNAVAILABLE, Context, Control, Method, Scored, Work
from gradlab.influence.scores import (
    SELF_INFLUENCE, TRAK_KERNELS, gauss_newton_kernel, grad_cosine, grad_dot, grad_norm_self_influence,
    influence_scores, influence_self_influence, predicted_loo_change, self_influence, streamed_dots, tracin,
    tracin_checkpoints, tracin_self_influence, trak,
)
from gradlab.influence.solvers import (
    EXACT_MAX_PARAMS, SOLVERS, InfluenceError, InverseHVP, Minimum, conjugate_gradient, hessian, hvp, inverse_hvp,
    inverse_hvp_batch, minimize, resolve_method,
)

__all__ = [
    # the protocol and its registry
    "METHODS", "SETTINGS", "Method", "Control", "Context", "Scored", "Work", "UNAVAILABLE",
    # scores
    "SELF_INFLUENCE", "TRAK_KERNELS", "grad_dot", "grad_cosine", "tracin", "tracin_checkpoints",
    "influence_scores", "predicted_loo_change", "trak", "gauss_newton_kernel", "self_influence", "streamed_dots",
    "grad_norm_self_influence", "tracin_self_influence", "influence_self_influence",
    # solvers
    "SOLVERS", "EXACT_MAX_PARAMS", "InfluenceError", "InverseHVP", "Minimum", "minimize", "hessian", "hvp",
    "inverse_hvp", "inverse_hvp_batch", "conjugate_gradient", "resolve_method",
    # evaluation
    "LDS", "RetrainingCheck", "check_against_retraining", "lds", "lds_of_predictions", "correlations",
    "method_agreement", "extreme_indices", "random_subsets", "subset_masks", "subset_outputs", "train_on_subsets",
    "stored_lds",
]
