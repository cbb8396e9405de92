"""Training-data attribution: which training examples helped or hurt one prediction, and how to tell
which method to trust.

- `solvers`: the one optimum θ̂ (`minimize`) and inverse Hessian-vector products at it.
- `scores`: grad-dot, cosine, TracIn, influence functions, TRAK, self-influence (`METHODS`).
- `evaluation`: leave-one-out retraining (`check_against_retraining`) and the linear datamodeling
  score (`lds`, `train_on_subsets`).
- `fitted` (imported on its own): the same for a `gradlab.experiment.Fitted` (what the Influence page calls).
"""

from gradlab.influence.evaluation import (
    LDS, RetrainingCheck, check_against_retraining, correlations, extreme_indices, lds, lds_of_predictions,
    method_agreement, random_subsets, subset_masks, subset_outputs, train_on_subsets,
)
from gradlab.influence.scores import (
    METHODS, SELF_INFLUENCE, TRAK_KERNELS, gauss_newton_kernel, grad_cosine, grad_dot, influence_scores,
    predicted_loo_change, self_influence, tracin, tracin_checkpoints, trak,
)
from gradlab.influence.solvers import (
    EXACT_MAX_PARAMS, SOLVERS, InfluenceError, InverseHVP, Minimum, conjugate_gradient, hessian, hvp, inverse_hvp,
    inverse_hvp_batch, minimize, resolve_method,
)

__all__ = [
    # scores
    "METHODS", "SELF_INFLUENCE", "TRAK_KERNELS", "grad_dot", "grad_cosine", "tracin", "tracin_checkpoints",
    "influence_scores", "predicted_loo_change", "trak", "gauss_newton_kernel", "self_influence",
    # solvers
    "SOLVERS", "EXACT_MAX_PARAMS", "InfluenceError", "InverseHVP", "Minimum", "minimize", "hessian", "hvp",
    "inverse_hvp", "inverse_hvp_batch", "conjugate_gradient", "resolve_method",
    # evaluation
    "LDS", "RetrainingCheck", "check_against_retraining", "lds", "lds_of_predictions", "correlations",
    "method_agreement", "extreme_indices", "random_subsets", "subset_masks", "subset_outputs", "train_on_subsets",
]
