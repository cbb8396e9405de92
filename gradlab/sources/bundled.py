"""The bundled and generated datasets (`gradlab.data.DATASETS`): shipped with scikit-learn or gradlab, or made
from the seed. Named by their bare name (`dataset="digits"`)."""

from __future__ import annotations

from gradlab import data as data_mod
from gradlab.sources.base import Source


class Bundled(Source):
    """A dataset of `gradlab.data.DATASETS`, loaded by `data.load_dataset` (an unknown name raises there)."""

    @property
    def label(self) -> str:
        return data_mod.DATASETS.get(self.name, self.name)

    def load(self, exp, upload=None):
        return data_mod.load_dataset(self.name, seed=exp.seed, label_noise=exp.label_noise,
                                     test_fraction=exp.test_fraction)
