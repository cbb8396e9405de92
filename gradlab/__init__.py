"""gradlab: per-example gradients in JAX, made visible. The library holds no Streamlit."""

from gradlab import engine, influence, privacy  # noqa: F401  (gradlab.privacy.dp_sgd_epsilon etc.)
from gradlab.engine import (
    batch_grad,
    clipped_grad_sum,
    loop_per_example_grads,
    per_example_dots,
    per_example_grads,
    per_example_layer_norms,
    per_example_norms,
)

__all__ = [
    "batch_grad",
    "clipped_grad_sum",
    "loop_per_example_grads",
    "per_example_dots",
    "per_example_grads",
    "per_example_layer_norms",
    "per_example_norms",
]
