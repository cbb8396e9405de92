"""Every use of JAX's jaxpr data structures in gradlab, in one place, through public names only.

`gradlab.rules` reads a traced loss (equations, their operands, nested calls) to find per-layer rules, and
the engine asks which dtypes a loss computes in. Both go through this module, which imports only
`jax.make_jaxpr` and `jax.extend.core` (the names JAX keeps for tools that read jaxprs), plus
`jax.core.Tracer` (one of the few names `jax.core` keeps public). JAX 0.11 drops
the internals re-exported by `jax.core` and merges `ClosedJaxpr` into `Jaxpr` (a jaxpr then carries its
own constants): `body` and `is_closed` below accept either form, so only this file changes with JAX. JAX 0.11
replaces a scan's `num_consts`/`num_carry` by a flat tree of its operands: `scan_counts` reads either.

JAX's `jax_remat3` and `jax_custom_vjp3` flags (off by default through JAX 0.12, announced as the future) trace
`checkpoint` and `custom_vjp` as one primitive, `call_hi_primitive`, whose `_prim` parameter carries the call
(`RematTraced`, `CustomVJPTraced`). `call_name` names such an equation by its call (`remat3`, `custom_vjp3`),
`sub_jaxpr` finds a checkpoint's body there, and `walk_jaxprs` descends into both, so readers of a jaxpr see the
same bodies whichever form JAX traced (tests/test_engine_zoo.py runs the zoo with both flags on).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Iterator

import jax
from jax.extend import core as jcore

__all__ = ["Const", "Eqn", "Graph", "flatten", "graph_of", "loop_bodies", "make", "body", "is_literal", "literal_value",
           "sub_jaxpr", "call_name", "scan_counts", "bind", "walk_jaxprs", "primitive_names", "dtypes", "is_tracer",
           "tracing", "value_count"]


@dataclasses.dataclass(frozen=True)
class Const:
    """A constant operand of an equation (a literal or a closed-over array)."""

    val: Any


@dataclasses.dataclass
class Eqn:
    """One equation of a flattened jaxpr: `outs = prim.bind(*ins, **params)`; ins are int refs or `Const`s."""

    prim: Any
    params: dict
    ins: list
    outs: list
    out_avals: list


@dataclasses.dataclass
class Graph:
    """A traced function as a flat list of equations over integer refs (`avals`: ref -> abstract value)."""

    eqns: list
    inputs: list
    outputs: list
    avals: dict


def make(fn: Callable, *args) -> Any:
    """`jax.make_jaxpr(fn)(*args)`: the closed jaxpr of `fn` at these arguments (arrays or ShapeDtypeStructs)."""
    return jax.make_jaxpr(fn)(*args)


def body(j: Any) -> tuple[Any, list]:
    """`(open jaxpr, its constants)` of a closed jaxpr, or of an open one (no constants).

    Today `ClosedJaxpr` wraps `.jaxpr` and `.consts`; after the merge a `Jaxpr` may hold `.consts` itself.
    """
    if isinstance(j, jcore.ClosedJaxpr):
        return j.jaxpr, list(j.consts)
    return j, list(getattr(j, "consts", ()) or ())


def is_literal(atom: Any) -> bool:
    """Whether an equation operand is a literal constant (`jax.extend.core.Literal`) rather than a variable."""
    return isinstance(atom, jcore.Literal)


def literal_value(atom: Any) -> Any:
    """The value of a literal operand."""
    return atom.val


#: `call_hi_primitive`'s calls by the class name of its `_prim` parameter (JAX's `jax_remat3`, `jax_custom_vjp3`).
HI_CALLS = {"RematTraced": "remat3", "CustomVJPTraced": "custom_vjp3"}


def _hi(params: dict) -> Any:
    """The call object of a `call_hi_primitive` equation's parameters, or None for any other equation."""
    return params.get("_prim") if "_prim" in params and not isinstance(params["_prim"], str) else None


def call_name(eqn: Any) -> str:
    """An equation's primitive name (a JAX `JaxprEqn` or an `Eqn`), except for `call_hi_primitive`: the name of
    the call it carries, `remat3` (a `checkpoint` under `jax_remat3`) or `custom_vjp3` (a `custom_vjp` under
    `jax_custom_vjp3`); another `call_hi_primitive` keeps its primitive's name."""
    prim = getattr(eqn, "primitive", None) or eqn.prim
    hi = _hi(eqn.params)
    if prim.name == "call_hi_primitive" and hi is not None:
        return HI_CALLS.get(type(hi).__name__, prim.name)
    return prim.name


def sub_jaxpr(eqn: Any) -> Any:
    """The body of a call-like equation (`jit`, `closed_call`, `checkpoint`): its `jaxpr` or `call_jaxpr`; for
    a `remat3` call (`call_name`) the body its `_prim` carries."""
    hi = _hi(eqn.params)
    if hi is not None and getattr(hi, "params", None) and "jaxpr" in hi.params:
        return hi.params["jaxpr"]
    return eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))


def _hi_bodies(eqn: Any) -> list:
    """The jaxprs a `call_hi_primitive` equation carries (a checkpoint's body, a custom_vjp's primal), else []."""
    hi = _hi(eqn.params)
    if hi is None:
        return []
    if "jaxpr" in getattr(hi, "params", {}):
        return [hi.params["jaxpr"]]
    traced = getattr(hi, "traced", None)  # CustomVJPTraced: the primal function, traced (`jax.stages.Traced`)
    return [traced.jaxpr] if getattr(traced, "jaxpr", None) is not None else []


def bind(prim: Any, params: dict, vals: list) -> list:
    """Evaluate one equation again: `prim.bind(*vals, **params)` as a list of outputs."""
    out = prim.bind(*vals, **prim.get_bind_params(params))
    return list(out) if prim.multiple_results else [out]


def flatten(fn: Callable, *args, inline: frozenset = frozenset()) -> Graph:
    """Trace `fn(*args)` (arrays or ShapeDtypeStructs, flattened in order) into a `Graph`: one flat list of
    equations, the bodies of call primitives named in `inline` (`jit`, `checkpoint`, ...) inlined."""
    return graph_of(make(fn, *args), inline)


def graph_of(closed: Any, inline: frozenset = frozenset()) -> Graph:
    """A closed (or open) jaxpr as a flat `Graph`, the bodies of call primitives named in `inline` inlined."""
    counter = itertools.count()
    eqns, avals = [], {}

    def fresh(aval):
        r = next(counter)
        avals[r] = aval
        return r

    def walk(jaxpr, consts, inputs):
        env = dict(zip(jaxpr.constvars, (Const(c) for c in consts)))
        env.update(zip(jaxpr.invars, inputs))
        read = lambda v: Const(literal_value(v)) if is_literal(v) else env[v]  # noqa: E731
        for e in jaxpr.eqns:
            ins = [read(v) for v in e.invars]
            if call_name(e) in inline:
                outs = walk(*body(sub_jaxpr(e)), ins)
            else:
                outs = [fresh(v.aval) for v in e.outvars]
                eqns.append(Eqn(e.primitive, dict(e.params), ins, outs, [v.aval for v in e.outvars]))
            env.update(zip(e.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    top, consts = body(closed)
    inputs = [fresh(v.aval) for v in top.invars]
    return Graph(eqns, inputs, walk(top, consts, inputs), avals)


def scan_counts(params: dict) -> tuple[int, int]:
    """`(consts, carry)`: how many of a `scan` equation's operands are loop constants and how many the carry (the
    rest are the scanned xs). JAX 0.10 names the counts (`num_consts`, `num_carry`); JAX 0.11 and 0.12 group the
    operands in a flat tree instead (`ft_in`: constants, carry, xs)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


def loop_bodies(eqn: Eqn, inline: frozenset = frozenset()) -> list[Graph]:
    """The bodies of a `scan` (one: inputs consts, carry, xs; outputs carry, ys) or of a `cond` (one per branch:
    inputs the operands after the index) as `Graph`s; [] for any other equation."""
    if eqn.prim.name == "scan":
        return [graph_of(eqn.params["jaxpr"], inline)]
    if eqn.prim.name == "cond":
        return [graph_of(b, inline) for b in eqn.params["branches"]]
    return []


def walk_jaxprs(j: Any) -> Iterator[Any]:
    """Every open jaxpr inside `j` (closed or open), `j`'s own first, nested bodies (scan, cond, while, jit) after."""
    jaxpr, _ = body(j)
    yield jaxpr
    for sub in jcore.subjaxprs(jaxpr):
        yield from walk_jaxprs(sub)
    for e in jaxpr.eqns:  # checkpoint and custom_vjp under jax_remat3 / jax_custom_vjp3 (subjaxprs skips them)
        for sub in _hi_bodies(e):
            yield from walk_jaxprs(sub)


def primitive_names(j: Any) -> set:
    """The names of the primitives `j` (closed or open) binds, nested bodies included."""
    return {e.primitive.name for jaxpr in walk_jaxprs(j) for e in jaxpr.eqns}


def dtypes(fn: Callable, *args) -> set:
    """The dtypes of every value `fn(*args)` computes, nested bodies included (traced, not run)."""
    out = set()
    for jaxpr in walk_jaxprs(make(fn, *args)):
        for v in list(jaxpr.invars) + [o for e in jaxpr.eqns for o in e.outvars]:
            dtype = getattr(v.aval, "dtype", None)
            if dtype is not None:
                out.add(dtype)
    return out


#: Equations that only call a body (their outputs are values of the body): `value_count` counts the body's.
_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
                    "custom_vjp_call_jaxpr", "checkpoint", "remat", "remat3", "custom_vjp3"})


#: Equations XLA fuses into their users rather than keeping (a reshape, a slice of a value that is kept anyway).
_VIEWS = frozenset({"reshape", "slice", "squeeze", "expand_dims", "broadcast_in_dim", "copy", "copy_p",
                    "convert_element_type"})


def value_count(fn: Callable, *args) -> int:
    """How many numbers `fn(*args)` computes: the sizes of every equation's outputs, nested bodies included (a loop's
    body counted once, as one iteration keeps it), except a call's (its body's are counted) and views XLA fuses into
    their users (`_VIEWS`: reshapes, slices, broadcasts, casts). Traced, not run. What a gradient of `fn` keeps for its backward
    pass is about this many (`gradlab.memory.example_bytes`)."""
    total = 0
    for jaxpr in walk_jaxprs(make(fn, *args)):
        for e in jaxpr.eqns:
            if call_name(e) in _CALLS or call_name(e) in _VIEWS:  # counted in the body / fused into their users
                continue
            for o in e.outvars:
                shape = getattr(o.aval, "shape", None)
                if shape is not None:
                    size = 1
                    for d in shape:
                        size *= int(d)
                    total += size
    return total


def is_tracer(a: Any) -> bool:
    """Whether `a` is being traced (the engine called inside the caller's own `jit`), not a concrete array."""
    return isinstance(a, jax.core.Tracer)


def tracing() -> bool:
    """Whether a transformation (`jit`, `vmap`, `grad`) is tracing the current Python call, even one whose own
    arguments are concrete (closed over by the traced function): JAX's current trace is then not its eager one."""
    return type(jcore.find_top_trace(())).__name__ != "EvalTrace"
