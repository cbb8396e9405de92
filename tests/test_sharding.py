"""The engine on several devices: equal to one device, outputs laid out over every device.

The multi-device tests need 4 devices. Without a GPU they run in a subprocess with
`XLA_FLAGS=--xla_force_host_platform_device_count=4` (the flag must be set before jax is
imported): `test_four_forced_host_devices` starts `pytest -k four` on this file that way, so
the plain `python -m pytest` (and .ci/run) covers them. On a machine with 4 real devices they
run directly.
"""

from __future__ import annotations

import os
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

from gradlab import engine, losses, sharding
from gradlab.data import load_dataset
from gradlab.models import ModelSpec, build_model

FOUR = jax.device_count() == 4
four_only = pytest.mark.skipif(not FOUR, reason="needs 4 devices (runs in the forced-host subprocess)")

RTOL = 1e-5  # the goal: every function equals the one-device numbers to 1e-5 relative


def dict_loss(p, x, y):
    """A hand-written loss on plain dict params with a Python float (the seeds' style)."""
    return (jnp.tanh(x @ p["w"] + p["b"]) - y) ** 2


def dict_case(n):
    diabetes = load_dataset("diabetes", seed=0)
    return {"w": jnp.linspace(-1, 1, 10), "b": 0.5}, diabetes.x_train[:n], diabetes.y_train[:n]


def mlp_case(n):
    digits = load_dataset("digits", seed=0)
    model = build_model(ModelSpec("mlp", width=8, depth=1), 64, 10, key=jax.random.key(0))
    return model, digits.x_train[:n], digits.y_train[:n]


def loop_grads(loss_fn, params, xs, ys):
    """The independent oracle: one jax.grad per example in float64 numpy, (N, P)."""
    diff, static = eqx.partition(engine.as_params(params), eqx.is_inexact_array)
    g = jax.jit(jax.grad(lambda d, x, y: loss_fn(eqx.combine(d, static), x, y)))
    rows = [jax.flatten_util.ravel_pytree(g(diff, xs[i], ys[i]))[0] for i in range(len(xs))]
    return np.asarray(rows, np.float64)


def flat(tree):
    return np.asarray(jax.flatten_util.ravel_pytree(tree)[0], np.float64)


def rel_err(a, b):
    """Largest difference relative to the largest magnitude. Element by element, float32 rounding
    differs with the batch shape XLA compiles for (N/4 rows per device vs N): an example whose
    gradient comes from a cancellation (tanh near saturation) differs by ~3e-5 of itself, the
    same on one device run on N/4 examples."""
    a, b = flat(a), flat(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def calls(loss_fn, params, xs, ys):
    """Every sharded engine function with its arguments: name -> (function, args, kwargs)."""
    v = engine.batch_grad.one_device(loss_fn, params, xs[:3], ys[:3])
    return {
        "per_example_grads": (engine.per_example_grads, (), {}),
        "per_example_norms": (engine.per_example_norms, (), {"chunk_size": 4}),
        "per_example_layer_norms": (engine.per_example_layer_norms, (), {"chunk_size": 4}),
        "per_example_dots": (engine.per_example_dots, (v,), {"chunk_size": 4}),
        "clipped_grad_sum": (engine.clipped_grad_sum, (0.5,), {"chunk_size": 4}),
        "batch_grad": (engine.batch_grad, (), {"reduction": "mean"}),
    }


PER_EXAMPLE = {"per_example_grads", "per_example_norms", "per_example_layer_norms", "per_example_dots"}


# ------------------------------------------------------------------------ one device (always)


def test_one_device_is_a_plain_call():
    if jax.device_count() != 1:
        pytest.skip("one-device behaviour")
    assert sharding.default_mesh() is None
    params, xs, ys = dict_case(9)
    out = engine.per_example_norms(dict_loss, params, xs, ys)
    assert not isinstance(out.sharding, NamedSharding)  # no mesh, no shard_map
    np.testing.assert_array_equal(out, engine.per_example_norms.one_device(dict_loss, params, xs, ys))


def test_weighted_loss_zero_weight_is_zero_gradient():
    params, xs, ys = dict_case(3)
    loss_w = sharding.weighted_loss(dict_loss)
    assert sharding.weighted_loss(dict_loss) is loss_w  # cached: the engine reuses its compiles
    g0 = jax.grad(loss_w)(params, (xs[0], 0.0), ys[0])
    g1 = jax.grad(loss_w)(params, (xs[0], 1.0), ys[0])
    assert flat(g0).tolist() == [0.0] * 11
    np.testing.assert_allclose(flat(g1), flat(jax.grad(dict_loss)(params, xs[0], ys[0])), rtol=1e-6)


def test_describe_devices_names_kind_and_count():
    text = sharding.describe_devices()
    assert text.startswith(f"{jax.device_count()} × {jax.devices()[0].device_kind}")
    assert jax.default_backend() in text


@pytest.mark.slow  # a subprocess with 4 forced host devices (~35 s)
def test_four_forced_host_devices():
    """Runs this file's `four` tests on 4 forced host CPU devices in a fresh interpreter."""
    if FOUR:
        pytest.skip("already on 4 devices")
    flags = f"--xla_force_host_platform_device_count=4 {os.environ.get('XLA_FLAGS', '')}"  # and conftest's
    env = {**os.environ, "XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--durations=3", __file__, "-k", "four"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout.replace("1 skipped", ""), r.stdout[-2000:]


# ---------------------------------------------------------------- four devices (subprocess)


@four_only
@pytest.mark.parametrize("case,n", [("mlp", 24), ("dict", 23)])
def test_four_devices_equal_one_device(case, n):
    """Every engine function: 4 devices = 1 device (≤ 1e-5 rel), N divisible by 4 or not."""
    loss_fn = losses.cross_entropy if case == "mlp" else dict_loss
    params, xs, ys = (mlp_case if case == "mlp" else dict_case)(n)
    for name, (fn, args, kw) in calls(loss_fn, params, xs, ys).items():
        four = fn(loss_fn, params, xs, ys, *args, **kw)
        one = fn.one_device(loss_fn, params, xs, ys, *args, **kw)
        assert jax.tree.structure(four) == jax.tree.structure(one), name
        if isinstance(one, dict):
            assert list(four) == list(one), name  # layer names keep tree order
        assert rel_err(four, one) <= RTOL, (name, rel_err(four, one))
        leaf = jax.tree.leaves(four)[0]
        assert len(leaf.sharding.device_set) == 4, name
        if name in PER_EXAMPLE and n % 4 == 0:  # sharded over the example axis, 6 rows per device
            assert leaf.sharding.spec[0] == sharding.AXIS, (name, leaf.sharding)
            assert [s.data.shape[0] for s in leaf.addressable_shards] == [n // 4] * 4, name
        else:  # reductions, and per-example outputs for N not divisible by 4 (no uneven
            # shardings in JAX: test_four_jax_has_no_uneven_shardings): replicated, whole on each
            assert leaf.sharding.is_fully_replicated, (name, leaf.sharding)
            assert [s.data.shape for s in leaf.addressable_shards] == [leaf.shape] * 4, name


@four_only
def test_four_jax_has_no_uneven_shardings():
    """Why per-example outputs of N = 57 on 4 devices come back replicated: JAX (0.10.2) cannot
    hold a (57,) array sharded 15/15/15/12, neither placed nor as a jit output. If this test
    fails, JAX has learnt uneven shardings: return those outputs sharded (gradlab/sharding.py)."""
    mesh = sharding.example_mesh()
    spec = NamedSharding(mesh, jax.sharding.PartitionSpec(sharding.AXIS))
    padded = jax.device_put(np.arange(60, dtype=np.float32), spec)
    routes = {
        "device_put": lambda: jax.device_put(np.arange(57, dtype=np.float32), spec),
        "jit out_shardings": lambda: jax.jit(lambda a: a[:57], out_shardings=spec)(padded),
        "make_array_from_callback": lambda: jax.make_array_from_callback((57,), spec, lambda i: np.zeros(57)[i]),
    }
    for name, route in routes.items():
        with pytest.raises(ValueError, match="evenly divide"):
            route()
    # inside a jit the constraint is accepted but silently dropped: the output is replicated
    inside = jax.jit(lambda a: jax.lax.with_sharding_constraint(a[:57], spec))(padded)
    assert inside.sharding.is_fully_replicated


@four_only
def test_four_devices_match_python_loop():
    """Against the independent oracle: a loop of jax.grad, clipped and summed in float64 numpy."""
    n = 23  # not a multiple of 4: padded rows must not leak into any number
    params, xs, ys = dict_case(n)
    per = loop_grads(dict_loss, params, xs, ys)
    grads = engine.flatten_per_example(engine.per_example_grads(dict_loss, params, xs, ys))
    # float32 engine vs a float32 loop: rounding differs per element, hence 1e-4 (as test_engine)
    np.testing.assert_allclose(grads, per, rtol=1e-4, atol=1e-6)
    norms = np.linalg.norm(per, axis=1)
    np.testing.assert_allclose(engine.per_example_norms(dict_loss, params, xs, ys, chunk_size=4), norms, rtol=1e-4)
    clipped = (per * np.minimum(1.0, 0.5 / norms)[:, None]).sum(0)
    np.testing.assert_allclose(flat(engine.clipped_grad_sum(dict_loss, params, xs, ys, 0.5, chunk_size=4)), clipped,
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(flat(engine.batch_grad(dict_loss, params, xs, ys, reduction="mean")), per.mean(0),
                               rtol=1e-4, atol=1e-6)
    mask = (np.arange(n) % 3 != 0).astype(np.float32)  # a Poisson batch's 0/1 mask, split with the examples
    np.testing.assert_allclose(
        flat(engine.clipped_grad_sum(dict_loss, params, xs, ys, 0.5, weights=mask, chunk_size=4)),
        (mask[:, None] * per * np.minimum(1.0, 0.5 / norms)[:, None]).sum(0), rtol=1e-4, atol=1e-6)


@four_only
def test_four_mesh_argument_overrides_and_no_retrace():
    params, xs, ys = dict_case(24)
    two = sharding.example_mesh(jax.devices()[:2])
    out = engine.per_example_norms(dict_loss, params, xs, ys, mesh=two)
    assert len(out.sharding.device_set) == 2
    before = dict(engine.TRACES)
    again = engine.per_example_norms(dict_loss, params, xs, ys, mesh=two)
    assert dict(engine.TRACES) == before  # same loss_fn object, same shapes: nothing re-traced
    np.testing.assert_array_equal(out, again)


@four_only
def test_four_devices_inside_callers_jit():
    """Called from the caller's own jit (traced inputs), it still splits the examples."""
    params, xs, ys = dict_case(24)
    params = engine.as_params(params)
    inside = jax.jit(lambda p, x, y: engine.per_example_norms(dict_loss, p, x, y))(params, xs, ys)
    one = engine.per_example_norms.one_device(dict_loss, params, xs, ys)
    assert rel_err(inside, one) <= RTOL
    assert len(inside.sharding.device_set) == 4


@four_only
@pytest.mark.parametrize("name", ["per_example_norms", "clipped_grad_sum"])
def test_four_memory_per_device(name):
    """XLA's memory analysis: on 4 devices each device's program is the one-device program on
    N/4 examples (`chunk_size` is per device), so the bytes that grow with N are 1/4 per device
    and the temporaries (one chunk's) are those of one device on its N/4 examples."""
    fn, extra = {"per_example_norms": (engine.per_example_norms, ()),
                 "clipped_grad_sum": (engine.clipped_grad_sum, (1.0,))}[name]
    params, xs, ys = mlp_case(64)
    xs, ys = np.tile(np.asarray(xs), (16, 1)), np.tile(np.asarray(ys), 16)  # N = 1024
    one_mesh = sharding.example_mesh(jax.devices()[:1])
    kw = {"chunk_size": 16, "method": "vmap"}

    def memory(xs, ys, mesh=None):
        return sharding.memory_analysis(fn, losses.cross_entropy, params, xs, ys, *extra, mesh=mesh, **kw)

    four, one_quarter, one = memory(xs, ys), memory(xs[:256], ys[:256], one_mesh), memory(xs, ys, one_mesh)
    assert (four["argument"], four["output"]) == (one_quarter["argument"], one_quarter["output"])
    assert abs(four["temp"] - one_quarter["temp"]) <= 0.05 * one_quarter["temp"]
    p_bytes = 4 * engine.num_params(params)
    assert abs((four["argument"] - p_bytes) - (one["argument"] - p_bytes) / 4) <= 64  # examples: 1/4
    assert four["peak"] < one["peak"]
