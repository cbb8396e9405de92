"""gradlab.jaxprs: the one module that touches jaxpr structures, through public JAX names only."""

import pathlib
import re

import jax
import jax.numpy as jnp
import pytest

from gradlab import jaxprs

ROOT = pathlib.Path(__file__).resolve().parent.parent
# JAX's modules and the fields of its jaxprs and equations (gradlab's own Graph has `.eqns`, not these)
INTERNALS = re.compile(r"jax\._src|jax\.core\b|jax\.extend|make_jaxpr|ClosedJaxpr"
                       r"|\.(invars|outvars|constvars|primitive)\b")


def test_only_jaxprs_py_touches_jaxpr_internals():
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "gradlab").rglob("*.py"))
                 if p.name != "jaxprs.py" and INTERNALS.search(p.read_text())]
    assert offenders == []
    source = (ROOT / "gradlab" / "jaxprs.py").read_text()
    assert "jax._src" not in source
    assert set(re.findall(r"jax\.core\.(\w+)", source)) <= {"Tracer"}  # names jax.core keeps public


def test_dtypes_look_inside_nested_bodies():
    def f(w, x):
        step = lambda h, xt: (jnp.tanh(h @ w.astype(jnp.bfloat16) + xt), None)  # noqa: E731
        h, _ = jax.lax.scan(step, jnp.zeros(3, jnp.bfloat16), x)
        return h.astype(jnp.float32).sum()

    found = jaxprs.dtypes(f, jnp.ones((3, 3)), jnp.ones((4, 3), jnp.bfloat16))
    assert jnp.dtype(jnp.bfloat16) in found and jnp.dtype(jnp.float32) in found
    assert jaxprs.dtypes(lambda w: (w * 2).sum(), jnp.ones(3)) == {jnp.dtype(jnp.float32)}


def test_body_opens_closed_and_open_jaxprs():
    closed = jaxprs.make(lambda x: x * jnp.arange(3.0), jnp.ones(3))
    jaxpr, consts = jaxprs.body(closed)
    assert jaxprs.body(jaxpr)[0] is jaxpr
    assert len(jaxpr.invars) == 1 and len(consts) == len(jaxpr.constvars)
    out = jaxpr.eqns[-1]
    assert jaxprs.bind(out.primitive, out.params, [jnp.ones(3), jnp.arange(3.0)])[0].tolist() == [0.0, 1.0, 2.0]


@pytest.fixture
def future_forms():
    """JAX's `jax_remat3` and `jax_custom_vjp3` on for one test (both exist from JAX 0.10.2 through 0.12.0.1), then
    the previous settings back."""
    old = {f: getattr(jax.config, f) for f in ("jax_remat3", "jax_custom_vjp3")}
    for f in old:
        jax.config.update(f, True)
    yield
    for f, v in old.items():
        jax.config.update(f, v)


def _checkpointed(w, v, x):
    @jax.custom_vjp
    def clip(z):
        return jnp.maximum(z, 0.0)

    clip.defvjp(lambda z: (clip(z), z), lambda z, g: (jnp.clip(g, -0.5, 0.5),))

    @jax.checkpoint
    def block(h):
        return jnp.tanh((h @ w).astype(jnp.bfloat16)).astype(jnp.float32)

    return (clip(block(x)) @ v).sum()


def test_checkpoint_and_custom_vjp_under_the_future_flags_are_read_like_today(future_forms):
    """Under `jax_remat3` / `jax_custom_vjp3` a checkpoint and a custom_vjp are `call_hi_primitive`s: `call_name`
    names them, `graph_of` inlines the checkpoint (rules.INLINE), `walk_jaxprs` sees both bodies."""
    from gradlab import rules

    args = (jnp.ones((3, 3)), jnp.ones((3, 2)), jnp.ones((4, 3)))
    closed = jaxprs.make(_checkpointed, *args)
    top = jaxprs.body(closed)[0]
    assert [jaxprs.call_name(e) for e in top.eqns][:2] == ["remat3", "custom_vjp3"]
    graph = rules.trace(_checkpointed, *args)
    assert "remat3" not in {jaxprs.call_name(e) for e in graph.eqns}  # the checkpoint's body is inlined
    assert {"dot_general", "tanh"} <= {e.prim.name for e in graph.eqns}
    assert jnp.dtype(jnp.bfloat16) in jaxprs.dtypes(_checkpointed, *args)  # inside the checkpoint
    assert "max" in jaxprs.primitive_names(closed)  # inside the custom_vjp


def test_scan_counts_read_the_constants_and_the_carry():
    def f(w, v, xs):
        def step(c, x):
            h, k = c
            return (jnp.tanh(h @ w + x), k + (v * x).sum()), h.sum()
        return jax.lax.scan(step, (jnp.zeros(3), 0.0), xs)[0][0].sum()

    closed = jaxprs.make(f, jnp.ones((3, 3)), jnp.ones(3), jnp.ones((4, 3)))
    (scan,) = [e for e in jaxprs.body(closed)[0].eqns if jaxprs.call_name(e) == "scan"]
    assert jaxprs.scan_counts(scan.params) == (2, 2)
