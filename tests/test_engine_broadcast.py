"""The rules on a δ that XLA sees as a broadcast, at the chunk sizes where XLA:CPU parallelises.

A loss `(w·Σₜ (xₜ m) + b − y)²` gives the dense layer `m` the same δ on every token and output (2r·w, one scalar per
example, broadcast): its ghost norm Σₜ,ₛ (aₜ·aₛ)(δₜ·δₛ) is a reduction whose operands are broadcasts. XLA:CPU
(jaxlib 0.10.2 through 0.12.0.1, the newest measured) hands such reductions to YNNPACK, whose parallel partial
reductions race when trailing dimensions are broadcasts (google/XNNPACK#11243, tensorflow/tensorflow#126812): norms came
out NaN or wrong by 10¹³ at N = 256 while exact at 6 examples (benchmarks/RESULTS.md, issues 25 and 42) unless
`gradlab.xla` compiles with its options, which it probes (`xla.accepted`). The oracle is the closed form in float64 NumPy: with
r = w·S + b − y, S = Σₜ Σ_o (xₜ m)_o, the gradients are 2r·S (w), 2r (b) and 2r·w·(Σₜ xₜ) ⊗ 1 (m).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradlab import engine, xla


def loss(p, x, y):
    w, b, m = p
    z = jnp.einsum("ti,io->to", x, m)
    return (w * z.sum() + b - y) ** 2


def oracle(p, xs, ys):
    """Per-example gradients (w, b, m) in float64 from the closed form."""
    w, b, m = (np.asarray(v, np.float64) for v in p)
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    xsum = xs.sum(1)                                  # (N, I)
    s = xsum @ m.sum(1)                               # (N,)
    r2 = 2 * (w * s + b - ys)
    gm = (r2 * w)[:, None, None] * np.broadcast_to(xsum[:, :, None], xsum.shape + (m.shape[1],))
    return r2 * s, r2, gm


def problem(t, i, o, n=256, seed=0):
    r = np.random.default_rng(seed)
    p = (1.0, 0.0, jnp.asarray(r.normal(size=(i, o)) * 0.5, jnp.float32))
    return p, jnp.asarray(r.normal(size=(n, t, i)), jnp.float32), jnp.asarray(r.normal(size=n), jnp.float32)


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


# (tokens, inputs, outputs): a ghost norm (4 x 16 x 16, the shape main got NaN on), an outer product (8 x 3 x 4).
@pytest.mark.parametrize("shape", [(4, 16, 16), (8, 3, 4)], ids=lambda s: "x".join(map(str, s)))
def test_a_broadcast_delta_gives_exact_norms_and_clipped_sums_at_every_chunk(shape):
    p, xs, ys = problem(*shape)
    gw, gb, gm = oracle(p, xs, ys)
    norms = np.sqrt(gw ** 2 + gb ** 2 + np.sum(gm.reshape(len(gw), -1) ** 2, 1))
    c = float(np.median(norms))
    f = np.minimum(1.0, c / norms)
    for chunk in (None, 128, 100, 7):
        for _ in range(2):  # the race varies between runs
            got = engine.per_example_norms(loss, p, xs, ys, chunk_size=chunk, method="ghost")
            assert rel(got, norms) <= 1e-4, f"norms, chunk {chunk}: {rel(got, norms):.2e}"
    total = engine.clipped_grad_sum(loss, p, xs, ys, c, method="ghost")
    for name, g, want in zip(("w", "b", "m"), jax.tree.leaves(total), (f @ gw, f @ gb, np.tensordot(f, gm, 1))):
        assert rel(g, want) <= 1e-4, f"clipped sum {name}: {rel(g, want):.2e}"


#: Why the option may be missing: the race it guards against is unfixed through the newest jaxlib measured.
NO_OPTION = ("no YNNPACK option here (not the CPU, or an XLA that rejects it: xla.accepted); the race it guards against "
             "is unfixed through the newest jaxlib measured (0.12.0.1, 2026-11-27)")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the options are XLA:CPU's")
def test_the_options_are_probed_by_compiling_with_them():
    """`xla.accepted` compiles with the options: XLA's INVALID_ARGUMENT for an unknown option or value is False;
    jaxlib 0.10.2, 0.11.2 and 0.12.0.1 all accept gradlab's."""
    assert not xla.accepted({"xla_cpu_no_such_option_gradlab": "1"})
    assert not xla.accepted({"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_NO_SUCH_TYPE"})
    assert xla.accepted(xla.OPTIONS) and xla.options() == xla.OPTIONS, NO_OPTION


@pytest.mark.skipif(not xla.options(), reason=NO_OPTION)
def test_fused_forms_are_traced_only_where_the_options_compile_them():
    """`xla.jit` on concrete arrays compiles with the options, so the rules may fuse; inside a caller's jit it does
    not, so they must not; nested in another `xla.jit` program it inherits that program's options."""
    seen = []

    @xla.jit
    def f(x):
        seen.append(xla.fused_reductions())
        return 2 * x

    @xla.jit
    def g(x):
        return f(x) + 1

    f(jnp.ones(3))
    jax.jit(f)(jnp.ones(3))
    g(jnp.ones(4))
    assert seen == [True, False, True]
