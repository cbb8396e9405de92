"""The engine on every device: the example axis sharded over a `jax.sharding.Mesh`.

Per-example gradients are independent across examples, so several devices (GPUs, TPU cores, hosts
under `jax.distributed.initialize`) need no new math: `over_examples(kind)` runs the one-device
engine function on each device's slice of the examples with `shard_map` (chunking within each
device, `chunk_size` per device). Per-example outputs come back sharded over the example axis;
reductions are summed with `psum` and come back replicated. `gradlab.engine` wraps its public
functions this way (they take `mesh=`); with one device and no `mesh=` the function is called
directly. N not divisible by the device count is padded with copies of the last example (dropped
from per-example outputs, weighted 0 in sums); such outputs come back replicated, because JAX
cannot shard an array unevenly (details, memory per device: docs/scale-out.md). Programs are
compiled once per (function, `loss_fn` object, mesh, shapes).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gradlab import jaxprs, xla
from gradlab.params import as_params

PyTree = Any
Kind = Literal["per_example", "sum"]

#: Name of the mesh axis the examples are split over.
AXIS = "examples"


def example_mesh(devices=None) -> Mesh:
    """A one-axis mesh (axis `"examples"`) over `devices` (default: `jax.devices()`, all hosts).

    **Arguments**
    - `devices`: a sequence of `jax.Device`, e.g. `jax.devices()[:2]`; None for every device.

    **Returns** a `jax.sharding.Mesh` to pass as `mesh=` to the engine's functions.

    **Raises** `ValueError` if `devices` is empty.
    """
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("example_mesh needs at least one device")
    return Mesh(np.array(devices), (AXIS,))


@functools.cache
def _default_mesh(devices: tuple) -> Mesh:
    return example_mesh(devices)


def default_mesh() -> Mesh | None:
    """The mesh the engine uses when no `mesh=` is given: all devices if more than one, else None."""
    if jax.device_count() < 2:
        return None
    return _default_mesh(tuple(jax.devices()))


def describe_devices(devices=None) -> str:
    """One line naming the devices, e.g. `"4 × cpu (backend cpu, 1 process)"` or `"1 × NVIDIA H100 (backend gpu …)"`.

    Printed by the benchmarks and shown on the Performance page, so every timing names its hardware.
    """
    devices = list(jax.devices() if devices is None else devices)
    kinds: dict[str, int] = {}
    for d in devices:
        kinds[d.device_kind] = kinds.get(d.device_kind, 0) + 1
    what = ", ".join(f"{n} × {k}" for k, n in kinds.items())
    procs = jax.process_count()
    return f"{what} (backend {jax.default_backend()}, {procs} process{'es' if procs > 1 else ''})"


def _axes(mesh: Mesh):
    """Shard the example axis over every axis of the mesh (a one-axis mesh: just that axis)."""
    names = tuple(mesh.axis_names)
    return names[0] if len(names) == 1 else names



def _num_examples(xs, ys) -> int | None:
    """N if xs and ys agree and are non-empty, else None (the engine then raises its own error)."""
    lx, ly = jax.tree.leaves(xs), jax.tree.leaves(ys)
    if not lx or not ly or not all(hasattr(a, "shape") and a.ndim for a in lx + ly):
        return None
    n = lx[0].shape[0]
    if n == 0 or any(a.shape[0] != n for a in lx + ly):
        return None
    return n


def _pad_rows(a, pad: int):
    """Append `pad` copies of the last row (a valid example, so the loss stays finite)."""
    widths = [(0, pad)] + [(0, 0)] * (a.ndim - 1)
    if isinstance(a, np.ndarray):
        return np.pad(a, widths, mode="edge")
    return jnp.pad(jnp.asarray(a), widths, mode="edge")


_WEIGHTED: dict = {}


def weighted_loss(loss_fn: Callable) -> Callable:
    """`(params, (x, w), y) -> w · loss_fn(params, x, y)`: the loss with a 0/1 padding weight.

    One object per `loss_fn` (cached), so the engine's compiled programs are reused across calls.
    The engine finds its per-layer rules in the weighted loss as in the original: scaling a loss by
    a constant changes no layer's use of its weights.
    """
    try:
        return _WEIGHTED[loss_fn]
    except (KeyError, TypeError):
        pass

    def loss_w(params, xw, y):
        x, w = xw
        return w * loss_fn(params, x, y)

    try:
        _WEIGHTED[loss_fn] = loss_w
    except TypeError:  # unhashable loss: works, but re-traces each call
        pass
    return loss_w


def _place(tree: PyTree, sharding: NamedSharding) -> PyTree:
    """Put the array leaves on `sharding` before the call (each device receives only its rows).

    Leaves being traced (the engine called inside the caller's own `jit`) are left to `shard_map`.
    """
    def put(a):
        if jaxprs.is_tracer(a) or not isinstance(a, (np.ndarray, jax.Array)):
            return a
        if sharding.is_fully_addressable:
            return jax.device_put(a, sharding)
        # several processes (jax.distributed): every process holds the same host data and
        # hands over only the rows of its own devices
        a = np.asarray(a)
        return jax.make_array_from_callback(a.shape, sharding, lambda index: a[index])

    return jax.tree.map(put, tree)


@xla.jit
def _run(fn, kind, mesh, n, kw, loss_fn, rep, xs, ys, ws):
    """The jitted SPMD program: `fn` on each device's rows, then per-example rows or a psum."""
    axes = _axes(mesh)
    dyn, static = eqx.partition(rep, eqx.is_array)

    keys = []  # a dict's key order (jit would sort it): filled while tracing, returned static

    def body(dyn, xs, ys, ws):
        params, args = eqx.combine(dyn, static)
        kws = dict(kw) if ws is None else {**dict(kw), "weights": ws}
        out = fn(loss_fn, params, xs, ys, *args, **kws)
        if isinstance(out, dict):
            keys.extend(out)
            out = list(out.values())
        if kind == "sum":
            out = jax.tree.map(lambda a: jax.lax.psum(a, axes), out)
        return out

    spec_ex, spec_rep = PartitionSpec(axes), PartitionSpec()
    out = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(spec_rep, spec_ex, spec_ex, spec_ex),
        out_specs=spec_ex if kind == "per_example" else spec_rep,
        check_vma=False,  # the engine's scans carry device-local sums; psum happens once at the end
    )(dyn, xs, ys, ws)
    if kind == "per_example":
        out = jax.tree.map(lambda a: a[:n], out)
    return tuple(keys), out


def run_sharded(fn: Callable, kind: Kind, mesh: Mesh, loss_fn, params, xs, ys, *args, **kw):
    """Run engine function `fn` with the example axis of `xs, ys` split over `mesh`.

    **Arguments**
    - `fn`: a one-device engine function `fn(loss_fn, params, xs, ys, *args, **kw)`.
    - `kind`: `"per_example"` (outputs have the example axis first, returned sharded over it;
      replicated if N is not a multiple of `mesh.size`, see the module docstring) or
      `"sum"` (outputs are sums over examples, returned replicated). A `reduction="mean"` keyword
      is computed as the sum divided by N.
    - `mesh`: the devices (see `example_mesh`); params and `args` are replicated on all of them.

    **Returns** what `fn` returns, equal to the one-device result up to float rounding of the
    cross-device sum.

    **Raises** what `fn` raises for bad inputs (checked by `fn` itself).
    """
    n = _num_examples(xs, ys)
    if n is None or np.shape(kw.get("weights", np.ones(n or 0))) != (n,):  # let the engine say what is wrong
        return fn(loss_fn, params, xs, ys, *args, **kw)
    call, mean = _prepare(fn, kind, mesh, n, loss_fn, params, xs, ys, args, kw)
    keys, out = _run(*call)
    if keys:
        out = dict(zip(keys, out))
    if mean:
        out = jax.tree.map(lambda a: a / n, out)
    return out


def _prepare(fn, kind, mesh, n, loss_fn, params, xs, ys, args, kw):
    """Pad, weight and place the inputs: the arguments of `_run`, and whether to divide by N."""
    d = mesh.size
    pad = (-n) % d
    mean = kind == "sum" and kw.get("reduction") == "mean"
    if mean:
        kw = {**kw, "reduction": "sum"}
    ws = kw.pop("weights", None)  # per-example weights (clipped_grad_sum): split with the examples
    if ws is not None:
        ws = jnp.asarray(ws, jnp.float32)
    if pad:
        xs, ys = (jax.tree.map(lambda a: _pad_rows(a, pad), t) for t in (xs, ys))
        if ws is not None:
            ws = jnp.concatenate([ws, jnp.zeros(pad, jnp.float32)])
        elif kind == "sum":
            w = np.r_[np.ones(n, np.float32), np.zeros(pad, np.float32)]
            xs, loss_fn = (xs, w), weighted_loss(loss_fn)
    axes = _axes(mesh)
    xs, ys, ws = _place((xs, ys, ws), NamedSharding(mesh, PartitionSpec(axes)))
    rep = _place((as_params(params), args), NamedSharding(mesh, PartitionSpec()))
    return (fn, kind, mesh, n, tuple(sorted(kw.items())), loss_fn, rep, xs, ys, ws), mean


def memory_analysis(engine_fn: Callable, loss_fn, params, xs, ys, *args, mesh: Mesh | None = None, **kw) -> dict:
    """Bytes per device that XLA's buffer assignment gives the sharded program of one engine call.

    Compiles the program ahead of time (nothing runs). The compiled SPMD program is the same on
    every device, so these are per-device numbers.

    **Arguments** `engine_fn`: a wrapped engine function (e.g. `gradlab.engine.per_example_norms`);
    the rest as that function; `mesh` defaults to all devices (a one-device mesh if only one).

    **Returns** `{"argument", "output", "temp", "peak"}` in bytes; peak = argument + output + temp
    (an upper bound: XLA may alias outputs with temporaries).

    **Raises** `ValueError` if `engine_fn` is not wrapped by `over_examples` or xs, ys are invalid.
    """
    kind = getattr(engine_fn, "example_kind", None)
    if kind is None:
        raise ValueError("memory_analysis needs an engine function wrapped by sharding.over_examples")
    n = _num_examples(xs, ys)
    if n is None:
        raise ValueError("xs and ys need the same, non-zero number of examples on their first axis")
    mesh = mesh or default_mesh() or example_mesh()
    call, _ = _prepare(engine_fn.one_device, kind, mesh, n, loss_fn, params, xs, ys, args, kw)
    m = _run.lower(*call).compile().compiled.memory_analysis()
    sizes = {"argument": int(m.argument_size_in_bytes), "output": int(m.output_size_in_bytes),
             "temp": int(m.temp_size_in_bytes)}
    return {**sizes, "peak": sum(sizes.values())}


def over_examples(kind: Kind) -> Callable[[Callable], Callable]:
    """Decorator: the engine function runs over every device when more than one is visible.

    The wrapped function gains a keyword `mesh`: None (default) uses all devices when there are
    several (`default_mesh`) and otherwise calls the function unchanged; a `jax.sharding.Mesh`
    shards the example axis over all of that mesh's devices.

    **Arguments** `kind`: `"per_example"` or `"sum"`, as in `run_sharded`.
    """
    if kind not in ("per_example", "sum"):
        raise ValueError(f"kind must be 'per_example' or 'sum', got {kind!r}")

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(loss_fn, params, xs, ys, *args, mesh: Mesh | None = None, **kw):
            mesh = default_mesh() if mesh is None else mesh
            if mesh is None:
                return fn(loss_fn, params, xs, ys, *args, **kw)
            return run_sharded(fn, kind, mesh, loss_fn, params, xs, ys, *args, **kw)

        wrapper.__doc__ = (fn.__doc__ or "") + _MESH_DOC[kind]
        wrapper.one_device = fn
        wrapper.example_kind = kind
        return wrapper

    return wrap


_MESH_DOC = {
    "per_example": """
    **Devices**: with more than one device visible (or `mesh=` a `jax.sharding.Mesh`) the
    example axis is split over all devices (`gradlab.sharding`); the outputs come back sharded
    over the example axis (replicated if N is not a multiple of the device count: JAX arrays
    cannot be sharded unevenly). `chunk_size` is per device.
    """,
    "sum": """
    **Devices**: with more than one device visible (or `mesh=` a `jax.sharding.Mesh`) the
    example axis is split over all devices (`gradlab.sharding`), each device sums its examples
    and the device sums are added (`psum`); the result is replicated on every device.
    `chunk_size` is per device.
    """,
}
