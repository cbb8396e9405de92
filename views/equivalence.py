"""Equivalence: vmap(grad(f)).sum() against grad(sum(vmap(f))), per parameter leaf, float32 vs float64,
mean vs sum, and the seeds' pitfalls run live."""

import numpy as np
import pandas as pd
import streamlit as st

from gradlab import equivalence, memory, ui
from gradlab.ui.figures import plots

st.title("Equivalence")
ui.intro(
    "Two ways to get the gradient of a batch's total loss: **(a)** per-example gradients "
    "`vmap(grad(f))` summed over the examples, or **(b)** one gradient of the summed loss "
    "`grad(lambda θ: vmap(f)(θ, xs, ys).sum())`. Differentiation is linear, so they are the same vector.",
    "On a computer they agree up to **rounding**: float32 sums in another order differ in the last digits, "
    "while the float64 reference agrees to about 1e-16. Below, per parameter leaf, for the current experiment "
    "or the seeds' scalar example, then the mean-vs-sum trap and the seeds' pitfalls, executed live."
)

EXAMPLES = {"experiment": "the current experiment (sidebar)", "scalar": "the seeds' (w·x)², w = 1, x = [1, 2]"}
with ui.point_controls("equivalence"):  # beside its figure where a lecture step moved it (gradlab.ui.points.controls)
    c1, c2 = st.columns([3, 2])
    with c1:
        example = ui.choice(st.radio, "Example", EXAMPLES, "eq_example", horizontal=True)
    with c2:
        reduction = ui.control(st.radio, "Reduction", ["sum", "mean"], horizontal=True, key="eq_reduction",
                               help="sum: seed 002's Σᵢ gᵢ vs ∇ Σᵢ ℓᵢ. mean: (1/N) Σᵢ gᵢ vs ∇ mean ℓᵢ.")

exp = ui.experiment()


@ui.shared(label="Computing both ways in float32 and float64")
def comparison(exp, example, n, _fitted=None):
    """Both reductions at once (one pass of each way per precision): the Reduction radio is then a cache hit.
    `n`: how many training examples (`ui.equivalence_plan`; all, or a fixed random subset)."""
    if example == "scalar":
        loss, w, xs, ys = equivalence.scalar_example()
        return *equivalence.compare_all(loss, w, xs, ys), None
    f = _fitted
    xs, ys = equivalence.take(f.data.x_train, f.data.y_train, n)
    return (*equivalence.compare_all(f.loss_fn, f.model, xs, ys, between=memory.release_memory),
            equivalence.shapes(f.loss_fn, f.model, xs, ys))


@ui.shared(label="Running the pitfalls")
def pitfalls():
    return equivalence.run_pitfalls()


def subset_note(plan) -> str:
    """Which examples a reduced comparison takes, how they were chosen and why (gradlab's Markdown, no user text)."""
    if plan.why == "memory":
        why = (f"way (b), one gradient of the summed float64 loss, keeps about {memory.mb(plan.bytes_per_example)} per "
               f"example for its backward pass, and {plan.n:,} examples fill this server's "
               f"{memory.mb(plan.budget_bytes)} per computation (all {plan.total:,}: "
               f"{memory.mb(plan.bytes_per_example * plan.total)})")
    else:
        why = (f"all {plan.total:,} in float64 would take about {plan.seconds_all:,.0f} CPU-seconds, more than the "
               f"{plan.seconds_left:.0f} a link may spend on this comparison")
    return (f"**Compared on {plan.n:,} of the {plan.total:,} training examples**, drawn at random (seed "
            f"{equivalence.SUBSET_SEED}: the same examples for every visitor): {why}. The two ways agree on any set "
            "of examples, so the check is the same; `equivalence.compare_all` takes every example in a notebook or "
            "script.")


fitted = result = plan = None
with ui.guard("The two ways could not be compared"):
    if example == "experiment":
        fitted = ui.fitted(exp)  # a model too large to train from a link asks for its button here
        plan = ui.equivalence_plan(exp, fitted)
    with st.spinner("Computing both ways in float32 and float64…"):
        by_reduction, scaling, shape_rows = comparison(exp if example == "experiment" else None, example,
                                                       plan.n if plan else None, fitted)
    result = cmp = by_reduction[reduction]

if result is not None:
    with ui.point("equivalence"):  # a lecture step opens on this block (gradlab.ui.points)
        if example == "scalar":  # the seeds' numbers as a figure: [2, 8] per example, 10 both ways
            ui.chart(plots.scalar_gradients(*ui.shared(gated=False)(equivalence.scalar_gradients)()))
        m = st.columns(4)
        m[0].metric("N examples", f"{cmp.n:,}" + (f" of {plan.total:,}" if plan and plan.reduced else ""),
                    help=f"P = {cmp.num_params:,} parameters")
        m[1].metric("float32: max rel. |a − b|", f"{cmp.max_rel32:.1e}",
                    help="Largest over leaves of max|a − b| / max|b|: float32 rounding, about N·ε₃₂ at worst.")
        m[2].metric("float64: max rel. |a − b|", f"{cmp.max_rel64:.1e}", help="The same in float64: ~1e-16.")
        m[3].metric("float32 ε", f"{np.finfo(np.float32).eps:.1e}", help="Spacing of float32 numbers near 1.")
        if example == "scalar":
            a, b = cmp.way_a["params"], cmp.way_b["params"]
            st.markdown(f"Way (a) = **{float(a):g}**, way (b) = **{float(b):g}** "
                        f"(the seeds: per-example gradients `[2., 8.]`, summed 10).")

        if plan and plan.reduced:
            st.info(subset_note(plan), icon=":material/filter_alt:")
        names = [l.name for l in cmp.leaves]
        ui.chart(plots.equivalence_bars(names, [l.rel32 for l in cmp.leaves], [l.rel64 for l in cmp.leaves], reduction=reduction),
                        width="stretch")
    table = pd.DataFrame({
        "leaf": names,
        "shape": [str(l.shape) for l in cmp.leaves],
        "max |∇| (float64)": [l.scale for l in cmp.leaves],
        "max |a − b| float32": [l.abs32 for l in cmp.leaves],
        "relative float32": [l.rel32 for l in cmp.leaves],
        "max |a − b| float64": [l.abs64 for l in cmp.leaves],
        "relative float64": [l.rel64 for l in cmp.leaves],
        "max |a₃₂ − ref₆₄|": [l.err_a32 for l in cmp.leaves],
        "max |b₃₂ − ref₆₄|": [l.err_b32 for l in cmp.leaves],
    })
    ui.dataframe(table, hide_index=True, width="stretch",  # leaf names: a served model's own
                 column_config={c: st.column_config.NumberColumn(format="%.2e") for c in table.columns[2:]})
    st.caption(
        "Both float32 ways are about equally far from the float64 reference (last two columns): neither is "
        "'the right one'. They add the same N numbers in a different order, and float32 keeps ~7 digits. "
        "The float64 reference runs inside `jax.enable_x64(True)`, which is thread-local: other sessions "
        "of this app keep float32."
    )

    st.subheader("Mean vs sum: the scaling trap")
    s = scaling
    mm = st.columns(3)
    mm[0].metric("mean gᵢ vs ∇ mean ℓ", f"{s.mean_vs_mean:.1e}", help="Max absolute difference: rounding only.")
    mm[1].metric("Σ gᵢ vs ∇ mean ℓ", f"{s.sum_vs_mean:.3g}", help="Mixing sum and mean: wrong by a factor N.")
    mm[2].metric("‖Σ gᵢ‖ / ‖∇ mean ℓ‖", f"{s.ratio:,.1f}", help=f"Equals N = {s.n:,}.")
    st.markdown(
        f"The mean of the per-example gradients **is** the gradient of the mean loss. Compare a per-example "
        f"*sum* with a *mean* loss (a common slip when checking DP-SGD code or porting a training loop) and "
        f"they differ by exactly N = {s.n:,}: every learning rate and clipping norm C is then off by that factor."
    )

    if shape_rows:
        st.subheader("Shapes: (N, ...) per example vs (...) summed")
        st.dataframe(pd.DataFrame(shape_rows), hide_index=True, width="stretch")

st.subheader("The seeds' pitfalls, run live")
with ui.guard("The pitfalls could not be run"):
    for p in pitfalls():
        st.markdown(f"**{p.title}.** {p.explanation}")
        st.code(p.code, language="python")
        if p.raised:  # the pitfall working as intended: JAX refuses the slip, with this message
            st.code(p.output, language="text")
            st.caption("Expected: this is the error JAX gives for this slip, the lesson of the pitfall.")
        else:
            st.code(p.output, language="text")

ui.code_panel(
    """
import jax, jax.numpy as jnp, equinox as eqx

params, static = eqx.partition(model, eqx.is_array)   # the model's arrays (differentiated) and the rest

def per_example_loss(params, x, y):          # ONE example
    logits = eqx.combine(params, static)(x)
    return jax.nn.logsumexp(logits) - logits[y]

def both_ways(params, xs, ys):
    # way (a): per-example gradients, then sum over the example axis
    per_grads = jax.vmap(jax.grad(per_example_loss), in_axes=(None, 0, 0))(params, xs, ys)
    way_a = jax.tree.map(lambda g: g.sum(0), per_grads)          # .mean(0) for the mean
    # way (b): vectorized forward, sum, ONE gradient
    way_b = jax.grad(lambda p: jax.vmap(per_example_loss, in_axes=(None, 0, 0))(p, xs, ys).sum())(params)
    return way_a, way_b

way_a, way_b = both_ways(params, xs, ys)
diff = jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)), way_a, way_b)

# float64 reference without touching other threads: enable_x64 is a thread-local context
with jax.enable_x64(True):
    to64 = lambda tree: jax.tree.map(lambda v: jnp.asarray(v, jnp.float64), tree)
    way_a64, way_b64 = both_ways(to64(params), to64(xs), ys)   # the same two ways on float64 copies
"""
)
