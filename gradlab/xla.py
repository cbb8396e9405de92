"""How gradlab compiles the programs that run the engine's rules: `jit`, `eqx.filter_jit` with XLA options.

XLA:CPU hands fused reductions and fused dots to YNNPACK, whose parallel partial reductions race when an operand's
trailing dimensions are broadcasts (google/XNNPACK#11243, tensorflow/tensorflow#126812; unfixed through the newest
jaxlib measured: 0.10.2, 0.11.2 and 0.12.0.1, 2026-11-27). The rules meet that case whenever a layer's δ is one number
per example broadcast over tokens and outputs (a loss of a sum over tokens): the ghost norm Σₜ,ₛ (aₜ·aₛ)(δₜ·δₛ) then
came out NaN or wrong by 10¹³ at N = 256 (exact at N = 6; tests/test_engine_broadcast.py). Keeping YNNPACK to single
dots and convolutions (their operands are materialised buffers, never broadcasts) makes every such program exact;
large matmuls and convolutions keep their YNNPACK kernels (benchmarks/RESULTS.md, issue 25).

Whether the installed XLA knows the option is probed, not read from jaxlib's version: `accepted` compiles a trivial
program with `OPTIONS` once; XLA answers an option (or a value) it does not know with `INVALID_ARGUMENT: No such
compile option`, and then no option is passed (with a warning on the CPU: the guard is gone there).

The options apply to the programs `jit` compiles as the outermost jit. Inside a caller's own `jax.jit` they do not
(that jit's options hold): `jit` then traces without `fused_reductions`, so the rules keep their dots, which the
race can still hit (the ghost norm above); a caller who jits engine functions sets the flag for the process before
JAX starts (`XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION`).
"""

from __future__ import annotations

import contextvars
import functools
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxlib

from gradlab import jaxprs

#: YNNPACK fusion types gradlab's engine programs allow: a dot or a convolution on its own, no fused reductions.
YNN_TYPES = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"

#: The XLA compile options gradlab asks for on every program that runs the engine's rules on CPU (`options()`: where
#: the installed XLA accepts them).
OPTIONS: dict = {"xla_cpu_experimental_ynn_fusion_type": YNN_TYPES}

_ACCEPTED: dict = {}


def accepted(opts: dict) -> bool:
    """Whether the default backend's compiler accepts the compile options `opts`: a trivial program is compiled
    with them, once per set of options in a process. XLA rejects an option or a value it does not know with
    `INVALID_ARGUMENT` ("No such compile option", "is not a valid enum value"): False; any other error is raised."""
    key = tuple(sorted(opts.items()))
    if key not in _ACCEPTED:
        try:
            jax.jit(lambda x: x + 1, compiler_options=dict(opts)).lower(jax.ShapeDtypeStruct((), jnp.float32)).compile()
            _ACCEPTED[key] = True
        except Exception as e:  # jax.errors.JaxRuntimeError (XlaRuntimeError in older jaxlibs)
            if "INVALID_ARGUMENT" not in str(e) and "No such compile option" not in str(e):
                raise
            _ACCEPTED[key] = False
    return _ACCEPTED[key]


@functools.cache
def options() -> dict:
    """`OPTIONS` where JAX's default backend is the CPU and its XLA accepts them (`accepted`), else none (other
    backends have no YNNPACK, and the rules keep their dots there: the fused forms were measured on CPU only)."""
    if jax.default_backend() != "cpu":
        return {}
    if not accepted(OPTIONS):
        warnings.warn(f"this jaxlib's XLA:CPU ({jaxlib.__version__}) does not accept {sorted(OPTIONS)}: engine "
                      "programs compile without gradlab's guard against YNNPACK's reduction race "
                      "(google/XNNPACK#11243); tests/test_engine_broadcast.py checks whether this XLA still has it",
                      RuntimeWarning, stacklevel=2)
        return {}
    return OPTIONS


#: True while tracing a program that compiles with `options()` (the outermost `jit`); read by `fused_reductions`.
_FUSED = contextvars.ContextVar("gradlab_fused_reductions", default=False)


def fused_reductions() -> bool:
    """Whether the program being traced compiles with `options()`, so a reduction of a broadcast product is exact
    (the rules then write small per-example contractions that way, `rules.SMALL_DOT`)."""
    return _FUSED.get()


def _flagged(fn, value: bool):
    @functools.wraps(fn)
    def traced(*args, **kwargs):
        token = _FUSED.set(value)
        try:
            return fn(*args, **kwargs)
        finally:
            _FUSED.reset(token)

    return traced


def jit(fn=None, **kwargs):
    """`eqx.filter_jit` with `options()`: the decorator for programs that run the engine's rules.

    Called eagerly it compiles with `options()` and traces with `fused_reductions()` true. Called while another
    transformation traces (a jit, vmap or grad, whether or not its inputs are tracers) it inherits that trace's
    `fused_reductions()`: true inside a `jit` program (which compiles with `options()`), false inside a caller's own
    `jax.jit`. Each case keeps its own cache, so a program traced for one is never compiled under another's options.

    **Arguments** as `eqx.filter_jit` (usable bare, `@jit`, or with arguments, `@jit(donate="none")`).

    **Returns** the jitted function.
    """
    if fn is None:
        return lambda f: jit(f, **kwargs)
    nested = {flag: eqx.filter_jit(_flagged(fn, flag), **kwargs) for flag in (False, True)}

    @functools.cache
    def outer():  # built at the first call: the backend decides the options
        return eqx.filter_jit(_flagged(fn, bool(options())), compiler_options=options() or None, **kwargs)

    @functools.wraps(fn)
    def call(*args, **kw):
        if _FUSED.get() or jaxprs.tracing():  # inside a `jit` program, or inside another transformation
            return nested[_FUSED.get()](*args, **kw)
        return outer()(*args, **kw)

    call.lower = lambda *args, **kw: outer().lower(*args, **kw)  # what a concrete call compiles (sharding)
    return call


def map_chunks(f, xs, chunk: int):
    """`jax.lax.map(f, xs, batch_size=chunk)` with ONE compiled body: `xs` (example axis first) padded to a multiple
    of `chunk` with real examples repeated from the start (`f` sees no zeros), the outputs cut back to N rows.

    `lax.map` runs N mod `chunk` leftover examples through a second, separate `vmap` of `f`, so XLA compiled the
    per-example program twice; SimpleCNN's projection pass over 7,000 examples in chunks of 6 (4 left over): see
    benchmarks/RESULTS.md (issue 40, session 42). Same values per example; at most `chunk` − 1 extra examples run.
    Fewer than `chunk` examples are one chunk of N (`lax.map` would trace an empty loop's body and the vmap).

    **Arguments** `f`: one example's pytree in, a pytree out; `xs`: a pytree of `(N, …)` arrays; `chunk` ≥ 1.
    **Returns** `f`'s outputs stacked, `(N, …)` each."""
    n = jax.tree.leaves(xs)[0].shape[0]
    chunk = min(chunk, n) or chunk
    pad = (-n) % chunk
    if not pad:
        return jax.lax.map(f, xs, batch_size=chunk)
    index = jnp.arange(n + pad) % n
    out = jax.lax.map(f, jax.tree.map(lambda a: a[index], xs), batch_size=chunk)
    return jax.tree.map(lambda a: a[:n], out)
