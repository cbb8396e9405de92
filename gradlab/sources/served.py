"""The model the server was started with (`python -m gradlab serve my_model.py`, `gradlab.own`):
`dataset="own:<fingerprint>"`. It brings its own loss, trained params, checkpoints and data; gradlab's model and
training controls do not apply (`canonical` sets them to their defaults), and its results stay in memory."""

from __future__ import annotations

from gradlab import own
from gradlab.sources.base import Source


class Served(Source):
    """The served model (`own.for_name(name)`, loaded once per process by `gradlab.own`)."""

    label = "Your own model (served with python -m gradlab serve)"
    persist = False
    brings_model = True

    @classmethod
    def choices(cls, prefix: str) -> tuple[str, ...]:
        """Offered (first) only on a server started with a model (`own.configured`)."""
        return (prefix,) if own.configured() else ()

    @property
    def model(self) -> own.OwnModel:
        """**Raises** `OwnModelError` when the server serves none, or another version (`own.for_name`)."""
        return own.for_name(self.name)

    def load(self, exp, upload=None):
        return self.model.data

    def init_model(self, exp, data):
        """Its module's `init_fn(jax.random.key(exp.seed))`. **Raises** `OwnModelError` saying what to add
        when the module has none."""
        return self.model.init(exp.seed)

    def shapes(self, exp, data):
        return self.model.params

    def forward_macs(self, exp, data) -> int:
        """0: its forward is the user's own code, run on the user's machine (estimates count its P)."""
        return 0

    def loss_fn(self, data):
        return self.model.loss_fn

    def predict_fn(self):
        return self.model.predict_fn

    def trained(self, exp, data):
        """Its module's checkpoints at seed 0 on its own data; elsewhere (a subset, another seed) gradlab's loop
        trains it from `init_fn` with its recipe."""
        m = self.model
        return m.run if exp.seed == 0 and data is m.data else None

    @property
    def trainable(self) -> bool:
        """Whether its module defines `init_fn` (`own.OwnModel.trainable`)."""
        return self.model.trainable

    def recipe(self, exp) -> dict:
        return self.model.recipe()

    def canonical(self, exp):
        """Every field but `dataset` at its default: nothing in the sidebar changes the user's trained model."""
        return type(exp)(dataset=exp.dataset)
