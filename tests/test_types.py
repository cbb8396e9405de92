"""The jaxtyping annotations of the public functions hold: each annotated function runs under
`jaxtyped(typechecker=beartype)` on real inputs, and a wrong shape is caught."""

from __future__ import annotations

import importlib
import inspect

import beartype
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest

from gradlab import engine, metrics, privacy
from gradlab.influence import scores, solvers

MODULES = ("gradlab.engine", "gradlab.privacy", "gradlab.metrics", "gradlab.influence.scores",
           "gradlab.influence.solvers")
CONF = beartype.BeartypeConf(is_pep484_tower=True)  # an int where a float is annotated is fine (PEP 484)


def checked(fn):
    """`fn` (the one-device function under the engine's device wrapper) with its annotations checked."""
    return jaxtyping.jaxtyped(typechecker=beartype.beartype(conf=CONF))(getattr(fn, "one_device", fn))


def annotated_with_jaxtyping():
    """Every public function of MODULES that has a jaxtyping annotation, as 'module.name'."""
    found = set()
    for name in MODULES:
        mod = importlib.import_module(name)
        for attr, fn in vars(mod).items():
            fn = getattr(fn, "one_device", fn)
            if attr.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != name:
                continue
            if any(("Float[" in str(a) or "Bool[" in str(a) or "Real[" in str(a)) for a in fn.__annotations__.values()):
                found.add(f"{name.split('.')[-1]}.{attr}")
    return found


def mlp(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return -jax.nn.log_softmax(h @ params["w2"])[y]


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.normal(size=(12, 3)), jnp.float32)
    ys = jnp.asarray(rng.integers(0, 2, 12))
    params = {"w1": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), "b1": jnp.zeros(4),
              "w2": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)}
    return params, xs, ys


@pytest.mark.slow  # the checker itself: test_a_wrong_shape_is_caught
def test_every_annotated_function_is_checked_here(problem):
    params, xs, ys = problem
    n, p = xs.shape[0], engine.num_params(params)
    key = jax.random.key(0)
    mask = jnp.ones(n, jnp.float32)
    calls = {
        "engine.per_example_norms": lambda f: f(mlp, params, xs, ys),
        "engine.per_example_layer_norms": lambda f: f(mlp, params, xs, ys),
        "engine.layer_norms_and_grad_sum": lambda f: f(mlp, params, xs, ys),
        "engine.per_example_dots": lambda f: f(mlp, params, xs, ys, engine.batch_grad(mlp, params, xs, ys)),
        "engine.flatten_per_example": lambda f: f(engine.per_example_grads(mlp, params, xs, ys)),
        "engine.per_example_projections": lambda f: f(mlp, params, xs, ys,
                                                      engine.projections(mlp, params, xs, ys, k_in=2, k_out=2)),
        "privacy.noisy_clipped_sum": lambda f: f(mlp, params, xs, ys, key, clip_norm=1.0, noise_multiplier=1.0,
                                                 weights=mask),
        "privacy.dp_sgd_gradient": lambda f: f(mlp, params, xs, ys, key, clip_norm=1.0, noise_multiplier=1.0,
                                               batch_size=n, weights=mask),
        "privacy.accuracy_by_class": lambda f: f(lambda x: x[:2], xs, ys, 2),
        "metrics.roc": lambda f: f(np.asarray(xs[:, 0]), np.asarray(ys) == 1),
        "metrics.detection_roc": lambda f: f(np.asarray(xs[:, 0]), np.asarray(ys) == 1),
        "solvers.hessian": lambda f: f(mlp, params, xs, ys, l2=0.1),
        "solvers.conjugate_gradient": lambda f: f(lambda v: 2.0 * v, jnp.ones(p), 1e-6, 50),
        "solvers.inverse_hvp_batch": lambda f: f(mlp, params, xs, ys, jnp.ones((2, p)), l2=10.0, method="cg"),
        "scores.flat_gradients": lambda f: f(mlp, params, xs[:2], ys[:2]),
        "scores.project": lambda f: f(mlp, params, xs, ys, jnp.ones((p, 3))),
        "scores.grad_dot": lambda f: f(mlp, params, xs, ys, xs[0], ys[0]),
        "scores.grad_cosine": lambda f: f(mlp, params, xs, ys, xs[0], ys[0]),
        "scores.tracin": lambda f: f(mlp, [params, params], [0.1, 0.1], xs, ys, xs[0], ys[0]),
        "scores.influence_scores": lambda f: f(mlp, params, xs, ys, xs[:2], ys[:2], l2=0.1),
        "scores.predicted_loo_change": lambda f: f(mlp, params, xs, ys, xs[0], ys[0], l2=0.1),
        "scores.random_projection": lambda f: f(key, p, 3, jnp.float32),
        "scores.class_probabilities": lambda f: f(mlp, params, xs, 2),
        "scores.gauss_newton_kernel": lambda f: f(mlp, params, xs, 2, jnp.ones((p, 3))),
        "scores.trak": lambda f: f(mlp, [params], xs, ys, xs[:2], ys[:2], proj_dim=4, l2=0.1, n_classes=2),
        "scores.self_influence": lambda f: f(mlp, params, xs, ys),
        "scores.streamed_dots": lambda f: f(mlp, params, xs, ys, jnp.ones((2, p))),
        "scores.grad_norm_self_influence": lambda f: f(mlp, params, xs, ys),
        "scores.tracin_self_influence": lambda f: f(mlp, [params, params], [0.1, 0.1], xs, ys),
        "scores.influence_self_influence": lambda f: f(mlp, params, xs, ys, l2=0.1),
    }
    assert annotated_with_jaxtyping() == set(calls), "a jaxtyping-annotated function without a call here (or gone)"
    modules = {"engine": engine, "privacy": privacy, "metrics": metrics, "solvers": solvers, "scores": scores}
    for name, call in calls.items():
        module, attr = name.split(".")
        call(checked(getattr(modules[module], attr)))


def test_a_wrong_shape_is_caught():
    roc = checked(metrics.roc)
    flagged = np.array([True, False, True, False])
    assert roc(np.arange(4.0), flagged).auc == 0.25  # one of four (flagged, clean) pairs ranked right
    with pytest.raises(jaxtyping.TypeCheckError):
        roc(np.arange(6.0), flagged)  # N = 6 scores, N = 4 flags
    with pytest.raises(jaxtyping.TypeCheckError):
        roc(np.ones((4, 2)), flagged)  # scores must be (N,)
    cg = checked(solvers.conjugate_gradient)
    with pytest.raises(jaxtyping.TypeCheckError):
        cg(lambda v: 2.0 * v, jnp.ones((3, 1)), 1e-6, 10)  # b must be (P,)
    with pytest.raises(jaxtyping.TypeCheckError):
        cg(lambda v: 2.0 * v, jnp.ones(3, jnp.int32), 1e-6, 10)  # and floating
