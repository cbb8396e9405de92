"""How gradlab compiles the programs that run the engine's rules: `jit`, `eqx.filter_jit` with XLA options.

XLA:CPU in jaxlib 0.10 hands fused reductions and fused dots to YNNPACK, whose parallel partial reductions race when
an operand's trailing dimensions are broadcasts (google/XNNPACK#11243, tensorflow/tensorflow#126812; unfixed in
jaxlib 0.10.2). The rules meet that case whenever a layer's δ is one number per example broadcast over tokens and
outputs (a loss of a sum over tokens): the ghost norm Σₜ,ₛ (aₜ·aₛ)(δₜ·δₛ) then came out NaN or wrong by 10¹³ at
N = 256 (exact at N = 6; tests/test_engine_broadcast.py). Keeping YNNPACK to single dots and convolutions (their
operands are materialised buffers, never broadcasts) makes every such program exact; large matmuls and convolutions
keep their YNNPACK kernels (benchmarks/RESULTS.md, issue 25).

The options apply to the programs these functions compile. A caller who wraps an engine function in their own
`jax.jit` compiles it with that jit's options: set the same flag for the process, before JAX starts
(`XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION`).
"""

from __future__ import annotations

import equinox as eqx
import jaxlib

#: YNNPACK fusion types gradlab's engine programs allow: a dot or a convolution on its own, no fused reductions.
YNN_TYPES = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"


def _known_jaxlib() -> bool:
    """Whether this jaxlib has the option (0.10: the range requirements.txt allows); elsewhere none is passed,
    since XLA rejects an option it does not know."""
    return tuple(int(p) for p in jaxlib.__version__.split(".")[:2]) == (0, 10)


#: XLA compile options for every program that runs the engine's rules (empty where the jaxlib is not 0.10).
OPTIONS: dict = {"xla_cpu_experimental_ynn_fusion_type": YNN_TYPES} if _known_jaxlib() else {}


def jit(fn=None, **kwargs):
    """`eqx.filter_jit` with `OPTIONS`: the decorator for programs that run the engine's rules.

    **Arguments** as `eqx.filter_jit` (usable bare, `@jit`, or with arguments, `@jit(donate="none")`).

    **Returns** the jitted function.
    """
    if fn is None:
        return lambda f: jit(f, **kwargs)
    return eqx.filter_jit(fn, compiler_options=OPTIONS or None, **kwargs)
