"""gradlab: per-example gradients in JAX, made visible. The library holds no Streamlit.

The engine's contract is re-exported here (`gradlab.per_example_grads`, …); the rest lives in its
modules: `gradlab.privacy` (DP-SGD's clipping, noise and accounting), `gradlab.influence`
(training-data attribution), `gradlab.sharding` (the engine over every device), and so on.
"""

from gradlab import engine, influence, privacy
from gradlab.serve import explore
from gradlab.engine import (
    batch_grad,
    clipped_grad_sum,
    explain,
    loop_per_example_grads,
    per_example_dots,
    per_example_grads,
    per_example_layer_norms,
    per_example_norms,
)

__all__ = [
    "batch_grad",
    "clipped_grad_sum",
    "explain",
    "loop_per_example_grads",
    "per_example_dots",
    "per_example_grads",
    "per_example_layer_norms",
    "per_example_norms",
    "engine",
    "explore",
    "influence",
    "privacy",
]
