"""Plain words for the field's terms: one sentence each, shown where a page first uses them (`ui.terms`)."""

from __future__ import annotations

TERMS: dict[str, str] = {
    "per-example gradient": "The gradient of one training example's loss with respect to the parameters: "
                            "a vector as long as the model, one per example.",
    "B_simple": "The gradient noise scale (McCandlish et al. 2018): tr(Σ)/|G|², how large a batch must be before "
                "the noise between per-example gradients stops dominating their mean.",
    "clipping norm C": "DP-SGD scales every per-example gradient longer than C down to length C, so no single "
                       "example can move the model by more than C.",
    "noise multiplier σ": "DP-SGD adds Gaussian noise with standard deviation σ·C to the sum of clipped gradients.",
    "sampling rate q": "Each step, every example joins the batch independently with probability q (Poisson sampling).",
    "ε and δ": "The privacy guarantee: no attack on the trained model can tell whether one example was in the "
               "training set with odds better than e^ε, except with probability δ.",
    "RDP": "Rényi differential privacy, the moments accountant (Mironov 2017): turns σ, q and the number of steps "
           "into ε; simple and slightly loose.",
    "PLD": "Privacy loss distributions (dp-accounting): the tightest accountant here, computing ε numerically "
           "from the distribution of the privacy loss.",
    "LiRA": "The likelihood-ratio attack (Carlini et al. 2022): compares the target model's confidence on an "
            "example with shadow models trained without it.",
    "canary": "An example planted to test privacy: if the trained model reveals whether it was there more "
              "often than ε allows, the DP-SGD code has a bug.",
    "L-BFGS": "A quasi-Newton optimizer that converges to the minimum θ̂ in few steps, using the last gradients "
              "to approximate curvature.",
    "H⁻¹v": "The inverse Hessian times a vector, the expensive part of an influence function: solved here "
            "by conjugate gradient or LiSSA without ever forming H.",
    "influence function": "Predicts how the test loss changes if one training example is removed, from its "
                          "gradient and the inverse Hessian (Koh & Liang 2017).",
    "TracIn": "Sums the dot products of a training and a test gradient over the checkpoints of training, "
              "weighted by the learning rate (Pruthi et al. 2020).",
    "TRAK": "Projects per-example gradients to a few dimensions and solves a kernel regression, averaged over "
            "an ensemble of models (Park et al. 2023).",
    "LDS": "The linear datamodeling score: how well a method's scores predict what models trained on random "
           "halves of the data output (Spearman correlation; 1 is perfect, 0 is chance).",
    "proponents and opponents": "Training examples whose removal would most raise (proponents) or lower "
                                "(opponents) the test point's loss.",
    "self-influence": "A training example's influence on its own loss: large for mislabeled or atypical examples.",
}


def explain(term: str) -> str:
    """The one-sentence explanation of `term`. **Raises** KeyError for a term not in `TERMS`."""
    return TERMS[term]
