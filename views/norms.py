"""Gradient norms: the distribution of per-example gradient norms, per class and per layer, the
examples that pull hardest, and how well the norm finds mislabeled examples."""

import numpy as np
import pandas as pd
import streamlit as st

from gradlab import export, ui
from gradlab.metrics import detection_roc
from gradlab.summary import norm_summary
from gradlab.ui.figures import plots

st.title("Gradient norms")
st.markdown(
    "Each training example has its own gradient ∇θ ℓ(xᵢ, yᵢ): the direction it pulls the parameters. "
    "Its **norm** says how hard it pulls. Most examples the model already fits pull weakly; the long "
    "right tail holds hard, ambiguous or **mislabeled** examples. Computed live, streamed over chunks of "
    "examples with `vmap(grad)` (the N × P matrix is never built)."
)

ui.terms("per-example gradient", "B_simple")
exp = ui.experiment()
fitted = ui.fitted(exp)
data = fitted.data


@ui.shared(label="Computing per-example gradients", cost=lambda exp, checkpoint, size, _fitted: ui.summary_seconds(exp, size))
def summary(exp, checkpoint, size, _fitted):
    return norm_summary(_fitted, checkpoint, size=size)


with ui.point_controls("norms_top"):  # beside its figure where a lecture step moved it (gradlab.ui.points.controls)
    c1, c3 = st.columns([4, 1])
    with c1:
        ckpt = ui.checkpoint_picker(fitted)
    with c3:
        k = ui.control(st.number_input, "Top-k examples", min_value=1, max_value=48, value=16, key="topk")

n_train = len(data.y_train)
with st.spinner("Computing per-example gradients…"):
    s = summary(exp, ckpt, ui.summary_size(exp, fitted), fitted)
if s.is_subset:  # a shared link may not start more work than the budget: the rest from a button
    st.info(f"**{len(s.index):,} of the {n_train:,} training examples** (a fixed random subset): all of them would "
            "take longer than a shared link may compute before a button is pressed. Every figure and number below is "
            "about these examples.", icon=":material/filter_alt:")
    s = ui.on_request(summary, exp, ckpt, n_train, fitted, name="norms_all", button=f"All {n_train:,} examples",
                      fix="Lower **Training steps** or pick a smaller model to see them all.") or s

idx = s.index  # the training rows summarized
y = data.y_train[idx]
flipped = data.flipped[idx]
noisy = bool(flipped.any())
det = detection_roc(s.norms, flipped) if noisy else None
@ui.fragment
def histograms():
    """The log-scale toggle reruns only these figures (st.fragment), not the whole page."""
    log = ui.control(st.toggle, "Log scale", value=True, key="log")
    # one figure per row: side by side, a laptop's 1024 px with the sidebar open left each ~250 px, too narrow for
    # the histogram's title and axis
    bars = ui.chart(plots.norm_histogram(s.norms, log=log, flipped=flipped if noisy else None), width="stretch",
                    on_select="rerun", selection_mode="points", key="norms_hist_pick")
    bar = ui.picked_index(bars, 10**6)  # a click on a bar: its bin (customdata), whose examples open as a list
    if bar is not None:
        members = plots.norm_bin_members(s.norms, bar, log=log)
        with st.container(border=True, key="norms_bin_list"):
            st.markdown(f"**{len(members)} example{'s' * (len(members) != 1)} in this bar** (by norm; the first 24): "
                        "open one's record card.")
            with st.container(horizontal=True):
                for j in members[:24]:
                    ui.card_link(idx[j], f"#{data.row(idx[j])} ‖g‖={s.norms[j]:.2g}")
    ui.chart(plots.layer_share(s.layer_norms), width="stretch")
    if data.task == "classification":
        ui.chart(plots.norm_histogram_by_class(s.norms, y, data.class_names, log=log), width="stretch")


histograms()

# the numbers under the figures: on a projector the histogram comes first
m = st.columns(5)
m[0].metric("Training examples N", f"{len(s.norms):,}" + (f" of {n_train:,}" if s.is_subset else ""),
            help=f"P = {s.num_params:,} parameters")
m[1].metric("Median norm", f"{np.median(s.norms):.3g}")
m[2].metric("Max / median", f"{s.norms.max() / max(np.median(s.norms), 1e-30):.1f}×", help="How far the largest example sticks out.")
m[3].metric("Noise scale B_simple", f"{s.noise_scale:,.0f}" if np.isfinite(s.noise_scale) else "∞",
            help="tr(Σ)/‖G‖² (McCandlish et al. 2018): the batch size at which gradient noise and signal are comparable. "
                 "Larger means bigger batches still help.")
if det is not None:
    m[4].metric("Mislabel detection AUC", f"{det.auc:.3f}", help="ROC AUC of the norm as a detector of the flipped labels.")
elif data.task == "classification":
    m[4].metric("Training accuracy", f"{np.mean(s.predictions == y):.1%}")

top = np.argsort(-s.norms)[:k]


def label(i):  # i: a position in the summary
    if data.task != "classification":
        return f"#{data.row(idx[i])} y={y[i]:.2f}"
    name = data.class_names
    return f"#{data.row(idx[i])} y={name[y[i]]} ŷ={name[int(s.predictions[i])]}"


# each example by its row in the source and its input (hovers, the table, the export)
who = {**export.example_columns(data, idx), "label": [data.class_names[c] for c in y] if data.task == "classification" else y}
with ui.point("norms_top"):  # a lecture step opens on this block (gradlab.ui.points)
    st.subheader(f"The {k} examples with the largest gradient norm")
    if data.image_shape is not None:
        # two short lines: 8 tiles share a 1024 px projector
        titles = [(label(i), f"{'flipped · ' if flipped[i] else ''}‖g‖={s.norms[i]:.2g}") for i in top]  # lines
        ui.chart(plots.image_grid(data.raw(data.x_train[idx[top]]), titles, image_shape=data.image_shape), width="stretch")
        st.caption(f"#: the example's {data.row_label} (the table's `{data.row_label}` column).")
    elif data.n_features == 2:
        ui.chart(plots.scatter_2d(data.x_train[idx], s.norms, color_label="‖g‖", highlight=top, ids=who,
                                         axis_names=data.feature_names, title="Training set coloured by gradient norm (top-k circled)"),
                        width="stretch")
    elif data.n_features == 1:
        ui.chart(plots.scatter_1d(data.x_train[idx], y, s.norms, color_label="‖g‖", highlight=top, ids=who,
                                         axis_names=(data.feature_names[0], "target (standardized)"),
                                         title="Training set coloured by gradient norm (top-k circled)"), width="stretch")

if data.task == "classification":
    predicted = {"prediction": [data.class_names[int(c)] for c in s.predictions]}
else:  # a served regression model without a predict_fn has none (NaN)
    predicted = {} if np.isnan(s.predictions).all() else {"prediction": s.predictions}
table = pd.DataFrame({**who, **predicted, "loss": s.losses, "gradient norm": s.norms,
                      **({"flipped label": flipped} if noisy else {})})  # no flips, no column of empty boxes
picked_row = ui.selected_row(ui.dataframe(table.iloc[top], hide_index=True, width="stretch", on_select="rerun",
                                          selection_mode="single-row", key="norms_topk_pick"))
st.caption("Select a row to open that example's record card (its gradient norm over training, clipping, influence, "
           "memorization).")
if picked_row is not None:
    ui.open_card(idx[top[picked_row]])

if det is not None:
    loss_det = detection_roc(s.losses, flipped)
    st.subheader("Finding the flipped labels")
    st.markdown(
        f"{int(flipped.sum())} training labels were flipped to a wrong class. Rank the examples by gradient norm "
        "and read off how many flipped labels sit at the top: the ROC curve (the per-example loss for comparison)."
    )
    ui.chart(plots.roc_figure({"gradient norm": (det.fpr, det.tpr, det.auc),
                                      "per-example loss": (loss_det.fpr, loss_det.tpr, loss_det.auc)},
                                     "Gradient norm as a mislabel detector"), width="stretch")

if len(fitted.run.losses):  # a served model brings no training losses
    with st.expander("Training curve"):
        ui.chart(plots.training_curve(fitted.run.losses, fitted.run.steps, s.step), width="stretch")

ui.download(f"gradlab_norms_{exp.dataset}_step{s.step}", table, label="Per-example norms and losses")
ui.download_gradients(f"gradlab_grads_{exp.dataset}_step{s.step}", fitted, ckpt)

ui.code_panel(
    """
import jax, jax.numpy as jnp, equinox as eqx

params, static = eqx.partition(model, eqx.is_array)   # the model's arrays (differentiated) and the rest

def loss(params, x, y):                      # the loss of ONE example
    logits = eqx.combine(params, static)(x)
    return jax.nn.logsumexp(logits) - logits[y]

# On gradlab's models the engine takes a shortcut with the same numbers (tests check it): for a Linear
# layer z = W a + b one example's weight gradient is the outer product δᵢ ⊗ aᵢ, so
# ‖∂ℓᵢ/∂W‖² = ‖δᵢ‖²·‖aᵢ‖² and ‖∂ℓᵢ/∂b‖² = ‖δᵢ‖², with δᵢ = ∂ℓᵢ/∂z read off the gradient with respect to
# a zero probe added to z (gradlab/rules.py, Goodfellow 2015). The plain form, used for any other model:

# per-example squared norms per parameter leaf, streamed in chunks of at most 256 examples
def sq_norms(x, y):
    g = jax.grad(loss)(params, x, y)          # one example's gradient (a pytree like params)
    return jax.tree.map(lambda a: jnp.sum(a ** 2), g)

layer_sq = jax.lax.map(lambda xy: sq_norms(*xy), (xs, ys), batch_size=256)   # vmap inside each chunk
norms = jnp.sqrt(sum(jax.tree.leaves(layer_sq)))                              # (N,)

# gradient noise scale B_simple = tr(Σ) / |G|²  (McCandlish et al. 2018)
N = len(xs)
G = jax.grad(lambda p: jax.vmap(loss, (None, 0, 0))(p, xs, ys).mean())(params)
G2 = sum(jnp.sum(a ** 2) for a in jax.tree.leaves(G))
B_simple = (jnp.sum(norms ** 2) - N * G2) / (N - 1) / G2
"""
)
