"""Training-data attribution: which training examples helped or hurt one prediction, and how to tell
which method to trust.

- `solvers`: the one optimum θ̂ (`minimize`) and inverse Hessian-vector products at it.
- `scores`: grad-dot, cosine, TracIn, influence functions, TRAK, self-influence (`METHODS`).
- `evaluation`: leave-one-out retraining (`check_against_retraining`) and the linear datamodeling
  score (`lds`, `train_on_subsets`).
- `experiment`: the same for a `gradlab.experiment.Fitted` (what the Influence page calls).
"""

from gradlab.influence.evaluation import (  # noqa: F401
    LDS, RetrainingCheck, check_against_retraining, correlations, extreme_indices, lds, lds_of_predictions,
    loo_retrain, method_agreement, point_loss, random_subsets, subset_masks, subset_outputs, train_on_subsets,
)
from gradlab.influence.scores import (  # noqa: F401
    METHODS, SELF_INFLUENCE, TRAK_KERNELS, class_probabilities, flat_gradients, gauss_newton_kernel, grad_cosine,
    grad_dot, influence_scores, margin, point_gradient, predicted_loo_change, project, self_influence, tracin, tracin_checkpoints, trak,
)
from gradlab.influence.solvers import (  # noqa: F401
    EXACT_MAX_PARAMS, SOLVERS, InfluenceError, InverseHVP, Minimum, default_tol, hessian, hvp, inverse_hvp,
    inverse_hvp_batch, minimize, resolve_method,
)
from gradlab.influence import fitted  # noqa: F401,E402
