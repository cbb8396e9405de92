"""Per-layer rules found in the traced loss: per-example gradients at the cost of one backward pass.

A package: `core` (the walker that finds each leaf's uses in the jaxpr, evaluation with probes, norms, dots and
projections from (a, δ)), `base` (`Site`, the `RuleKind` base class), one file per layer kind (`dense`, `conv`,
`embedding`, `elementwise`: added and scale), `structured` (closed-form norms of weights computed from parameters) and
`registry` (`KINDS`, the one table of kinds; `register`; `STRUCTURES`).
See `core`'s docstring for the rules themselves and docs/extending.md for adding a kind.
"""

from gradlab.rules import registry
from gradlab.rules.base import INLINE, SHAPE_OPS, SMALL_DOT, SPREAD_OPS, NoRule, RuleKind, Site, acc_dtype
from gradlab.rules.core import (FIXED_VJP, Composite, FixedUse, Plan, Rule, RulesUnsupported, apply_rule, factor_bytes,
                                by_vjp, composite_bytes, composite_dots, composite_grads, composite_sq_norms, composite_sums, fixed_grads, loop_bytes, plan, project, real_vdot, run, saved_bytes, small_outer,
                                trace, weight_dot, weight_grad, weight_sq_norm, zero_probes)
from gradlab.rules.registry import KINDS, register, unregister

__all__ = ["FIXED_VJP", "Composite", "composite_bytes", "by_vjp", "composite_dots", "composite_grads", "composite_sq_norms", "composite_sums", "INLINE", "KINDS", "SHAPE_OPS", "SMALL_DOT", "SPREAD_OPS", "FixedUse", "NoRule", "Plan",
           "Rule", "RuleKind", "RulesUnsupported", "Site", "acc_dtype", "apply_rule", "factor_bytes", "fixed_grads",
           "loop_bytes", "plan", "project", "real_vdot", "registry", "register", "run", "saved_bytes", "small_outer",
           "trace", "unregister", "weight_dot", "weight_grad", "weight_sq_norm", "zero_probes"]
