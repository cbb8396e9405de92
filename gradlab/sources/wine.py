"""scikit-learn's bundled wine set (Forina et al.; UCI): 178 wines, 13 chemical measurements, 3 cultivars.

The example of docs/extending.md, "How to add a data source": this file plus one line in
`gradlab.sources.SOURCES`; tests/test_sources.py opens every page with it.
"""

from __future__ import annotations

from sklearn.datasets import load_wine

from gradlab.data import make_dataset
from gradlab.sources.base import Source


class Wine(Source):
    """Wine recognition: x (178, 13) standardized, y (178,) in {0, 1, 2}; rows named by their index in the set."""

    label = "Wine (13 features, 3 classes, scikit-learn)"

    def load(self, exp, upload=None):
        d = load_wine()
        return make_dataset("wine", d.data, d.target, "classification", seed=exp.seed, label_noise=exp.label_noise,
                            test_fraction=exp.test_fraction, feature_names=tuple(d.feature_names),
                            class_names=tuple(d.target_names))
