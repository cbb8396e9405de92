"""The users' model set (issue 25, tests/user_models.py): every engine function against a Python loop of `jax.grad`
on models written as Flax (linen and NNX), Equinox, Haiku and plain-JAX users write them, and the layers of
Opacus' per-sample-gradient tests the zoo lacked. N = 6 with chunks of 4 (the last chunk padded).

Compiling every engine function for a model takes 6–64 s on the loaded 2-core machine: the whole set runs with
GRADLAB_ZOO=all (as the zoo's COVERAGE_ONLY models do); the whole suite runs two cheap ones that pin what the zoo
does not: Haiku's params (the only Haiku model there), and a `fori_loop` indexing a stack of layer weights by its
counter (those fall back next to a ruled head).
"""

import os

import pytest

from test_engine_zoo import check_default_chunks_at_n_256, check_every_engine_function
from user_models import USER_MODELS, haiku_mlp, jax_fori_stacked

IN_SUITE = tuple(f for f in (haiku_mlp, jax_fori_stacked) if f in USER_MODELS)  # haiku_mlp needs Haiku
ALL = os.environ.get("GRADLAB_ZOO") == "all"
MODELS = USER_MODELS if ALL else IN_SUITE


@pytest.mark.slow
@pytest.mark.parametrize("make", MODELS, ids=lambda f: f.__name__)
def test_every_engine_function_matches_a_loop_of_grad(make):
    check_every_engine_function(*make())


@pytest.mark.slow
@pytest.mark.parametrize("make", USER_MODELS if ALL else [], ids=lambda f: f.__name__)  # empty: one skip
def test_the_default_chunks_at_n_256_match_a_loop_of_grad(make):
    """N = 256 with the engine's own chunking, as the issue measured and `rule_coverage --zoo-timing` times it."""
    check_default_chunks_at_n_256(*make()[:4])
