"""gradlab.jaxprs: the one module that touches jaxpr structures, through public JAX names only."""

import pathlib
import re

import jax
import jax.numpy as jnp

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
