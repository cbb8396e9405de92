"""Influence: which training examples helped or hurt one test prediction (proponents and opponents),
how four methods agree, self-influence as a mislabel detector, and a live check against actual
leave-one-out retraining (Koh & Liang 2017, Fig. 2)."""

import numpy as np
import pandas as pd
import streamlit as st

from gradlab import influence as inf
from gradlab import losses, plots, ui
from gradlab.metrics import detection_roc, fraction_in_top

st.title("Influence")
st.markdown(
    "Pick a test point. Every training example gets a **score**: how much it helped (**proponent**, "
    "positive) or hurt (**opponent**, negative) that prediction. The gradient dot product ⟨∇ℓ(zᵢ), ∇ℓ(z)⟩ "
    "says how a gradient step on zᵢ moves the test loss; **TracIn** sums it over the saved checkpoints "
    "(Pruthi et al. 2020); the **influence function** predicts the change of the test loss if zᵢ were "
    "removed and the model retrained (Koh & Liang 2017). Scores alone can mean nothing, so the bottom of "
    "the page **retrains without the top examples** and plots predicted against actual change. "
    "All dot products are streamed over chunks of examples: the N × P matrix is never built."
)

exp = ui.experiment()
fitted = ui.fitted(exp)
data = fitted.data
classify = data.task == "classification"
n_test = len(data.y_test)


@ui.cached
def test_summary(exp, _fitted):
    """Test losses and predictions at the last checkpoint."""
    d = _fitted.data
    loss = np.asarray(losses.per_example_losses(_fitted.loss_fn, _fitted.model, d.x_test, d.y_test))
    pred = np.asarray(losses.predict(_fitted.model, d.x_test, d.task))
    return loss, pred


@ui.cached(max_entries=32)
def point_scores(exp, test_index, damping, solver, lissa_scale, _fitted):
    extra = {"lissa_scale": lissa_scale} if (solver == "lissa" and lissa_scale > 0) else {}
    return inf.score_test_point(_fitted, test_index, damping=damping, method=solver, **extra)


@ui.cached
def self_scores(exp, damping, _fitted):
    return inf.self_influence_all(_fitted, damping=damping)


test_loss, test_pred = test_summary(exp, fitted)
correct = (test_pred == data.y_test) if classify else (np.abs(test_pred - data.y_test) < 0.5)

# A click on the test-point chart (previous run) sets the index before its widget is drawn.
PICK, INDEX = "infl_pick", "infl_test"
event = st.session_state.get(PICK)
points = (event or {}).get("selection", {}).get("points", []) if event else []
if points:
    p = points[0]
    picked = p.get("customdata", p.get("point_index"))
    picked = int(picked[0] if isinstance(picked, (list, tuple)) else picked)
    if 0 <= picked < n_test and st.session_state.get("_infl_last_pick") != picked:
        st.session_state[INDEX] = picked
        st.session_state["_infl_last_pick"] = picked

# ------------------------------------------------------------------ controls
SHORT = {"grad_dot": "grad dot", "grad_cosine": "grad cosine", "tracin": "TracIn", "influence": "influence function"}
c1, c2, c3, c4 = st.columns([2, 2, 1, 1])
with c1:
    # options are the short names themselves: a bound selectbox writes the shown text into the URL
    picked_method = st.selectbox("Scoring method", list(SHORT.values()), key="infl_method", bind="query-params",
                                 index=3, help="\n".join(f"- **{SHORT[m_]}**: {label}" for m_, label in inf.METHODS.items()))
    method = {v: k for k, v in SHORT.items()}[picked_method]
with c2:
    damping = st.select_slider(
        "Damping λ (influence function, retraining)", options=[1e-4, 1e-3, 1e-2, 1e-1, 1.0], value=1e-2,
        format_func=lambda v: f"{v:g}", key="infl_damping", bind="query-params",
        help="The objective is mean loss + λ/2‖θ‖²: λ is added to the Hessian (H + λI) and used when retraining. "
             "Raise it when a non-convex model makes the Hessian indefinite.")
with c3:
    solver = st.selectbox("H⁻¹v solver", ["auto", "exact", "cg", "lissa"], key="infl_solver", bind="query-params",
                          help=f"auto: the exact Hessian up to {inf.EXACT_MAX_PARAMS:,} parameters, conjugate gradient above. "
                               "LiSSA: a stochastic Neumann series on Hessian-vector products.")
with c4:
    k = st.number_input("Top-k", min_value=1, max_value=24, value=8, key="infl_k", bind="query-params")
lissa_scale = 0.0
if solver == "lissa":
    lissa_scale = st.number_input("LiSSA scale (0 = 2 × the largest Hessian eigenvalue, by power iteration)",
                                  min_value=0.0, value=0.0, step=1.0, key="infl_lissa_scale", bind="query-params")

# ------------------------------------------------------------------ the test point
st.subheader("The test point")
left, right = st.columns([1, 2])
with left:
    test_index = st.number_input("Test point (index)", min_value=0, max_value=n_test - 1, value=0, key=INDEX,
                                 bind="query-params", help="Or click a point in the chart.")
    test_index = int(min(max(int(test_index), 0), n_test - 1))
    name = (lambda c: data.class_names[int(c)]) if classify else (lambda v: f"{float(v):.2f}")
    if data.image_shape is not None:
        ui.chart(plots.image_grid(data.x_test[[test_index]], [f"test #{test_index}"], cols=1,
                                         image_shape=data.image_shape), width="stretch")
    m = st.columns(3)
    m[0].metric("Label", name(data.y_test[test_index]))
    m[1].metric("Prediction", name(test_pred[test_index]), delta="correct" if correct[test_index] else "wrong",
                delta_color="normal" if correct[test_index] else "inverse")
    m[2].metric("Test loss", f"{test_loss[test_index]:.3g}")
with right:
    if data.n_features == 2:
        xy, axes = data.x_test, data.feature_names
    else:
        xy, axes = np.stack([np.arange(n_test), test_loss], 1), ("test point index", "test loss at the last checkpoint")
    ui.chart(plots.point_picker(xy, correct, test_index, axis_names=axes), width="stretch",
                    on_select="rerun", selection_mode="points", key=PICK)

with st.spinner("Scoring every training example…"):
    res = None
    with ui.guard("Could not score the training examples"):
        res = point_scores(exp, test_index, float(damping), solver, float(lissa_scale), fitted)
if res is None:
    st.stop()
if res.error:
    st.error(f"**Influence function unavailable.** {res.error}", icon="⚠️")
elif res.ihvp is not None:
    if res.ihvp.note:
        st.info(res.ihvp.note, icon="ℹ️")
    st.caption(f"H⁻¹∇L_test solved by **{res.ihvp.method}**"
               + (f" in {res.ihvp.iterations} iterations" if res.ihvp.iterations else "")
               + f"; relative residual ‖(H+λI)x − ∇L_test‖/‖∇L_test‖ = {res.ihvp.residual:.1e}.")
scores = res.scores
if method not in scores:
    st.warning(f"{inf.METHODS[method]} is not available here; showing the gradient dot product.")
    method = "grad_dot"
s = scores[method]
order = np.argsort(-s, kind="stable")
kk = int(min(k, len(s) // 2))
props, opps = order[:kk], order[::-1][:kk]

# ------------------------------------------------------------------ proponents and opponents
st.subheader(f"Proponents and opponents: {inf.METHODS[method]}")
flipped = data.flipped


def tag(i):
    lab = f"y={name(data.y_train[i])}" + (" (flipped)" if flipped[i] else "")
    return f"#{i} {lab}"


if data.image_shape is not None:
    st.markdown(f"**Top {kk} proponents** (removing or down-weighting them would hurt this prediction)")
    ui.chart(plots.image_grid(data.x_train[props], [f"{tag(i)}<br>{s[i]:.2g}" for i in props],
                                     image_shape=data.image_shape), width="stretch")
    st.markdown(f"**Top {kk} opponents** (they pull this prediction the wrong way)")
    ui.chart(plots.image_grid(data.x_train[opps], [f"{tag(i)}<br>{s[i]:.2g}" for i in opps],
                                     image_shape=data.image_shape), width="stretch")
elif data.n_features == 2:
    ui.chart(plots.influence_scatter_2d(data.x_train, s, props, opps, data.x_test[test_index],
                                               score_label="score", axis_names=data.feature_names,
                                               title=f"Training set coloured by {inf.METHODS[method].lower()} "
                                                     "(blue helps, red hurts)"), width="stretch")
elif data.n_features == 1:
    ui.chart(plots.scatter_1d(data.x_train, data.y_train, s, color_label="score",
                                     highlight=np.concatenate([props, opps]),
                                     axis_names=(data.feature_names[0], "target (standardized)"),
                                     title="Training set coloured by score (top proponents and opponents circled)"),
                    width="stretch")
table = pd.DataFrame({"example": np.arange(len(s)),
                      "label": [name(v) for v in data.y_train],
                      "flipped label": flipped,
                      **{SHORT[m_]: v for m_, v in scores.items()}})
st.dataframe(table.iloc[np.concatenate([props, opps])], hide_index=True, width="stretch")
ui.download(f"gradlab_influence_{exp.dataset}_test{test_index}", table, label="Scores of every training example")

# ------------------------------------------------------------------ agreement between methods
st.subheader("Do the methods agree?")
names = [inf.METHODS[m_] for m_ in scores]
rho = inf.method_agreement(scores)
a, b = st.columns([3, 2])
with a:
    short = [m_.replace("_", " ") for m_ in scores]
    ui.chart(plots.agreement_heatmap(rho, short, title="Spearman rank correlation over all training examples"),
                    width="stretch")
with b:
    st.markdown("Rank correlations (`scipy.stats.spearmanr`) between the methods' scores for this test point. "
                "Cosine discounts large-gradient examples; TracIn adds early checkpoints; the influence function "
                "reweights directions by the inverse Hessian.")
    me = list(scores).index(method)
    for j, m_ in enumerate(scores):
        if j != me:
            st.metric(f"ρ({method.replace('_', ' ')}, {m_.replace('_', ' ')})", f"{rho[me, j]:.2f}")

# ------------------------------------------------------------------ self-influence
st.subheader("Self-influence: which training examples look suspicious")
with st.spinner("Computing self-influence…"):
    selfs = None
    with ui.guard("Could not compute self-influence"):
        selfs, self_note = self_scores(exp, float(damping), fitted)
if selfs is not None:
    SELF = {"grad_norm": "‖∇ℓᵢ‖² at the last checkpoint", "tracin": "TracIn self-influence Σ_c η_c‖∇ℓᵢ(θ_c)‖²",
            "influence": "influence function ∇ℓᵢᵀH⁻¹∇ℓᵢ / N"}
    st.markdown(
        "An example that supports mostly itself (large gradient, or large effect of removing it on its own loss) is "
        "often mislabeled or atypical. The last checkpoint's gradient norm forgets examples the model has "
        "**memorized**; TracIn sums over the checkpoints and remembers how hard they were to fit."
    )
    c1, c2 = st.columns([2, 1])
    with c1:
        SELF_SHORT = {"grad_norm": "gradient norm", "tracin": "TracIn", "influence": "influence function"}
        picked_self = st.selectbox("Rank by", [SELF_SHORT[m_] for m_ in selfs], key="infl_self", bind="query-params",
                                   help="\n".join(f"- **{SELF_SHORT[m_]}**: {SELF[m_]}" for m_ in selfs))
        self_method = {v: k for k, v in SELF_SHORT.items()}[picked_self]
    with c2:
        top_pct = st.slider("Top x% to inspect", 1, 50, 10, key="infl_top_pct", bind="query-params")
    if self_note:
        st.caption(self_note)
    v = selfs[self_method]
    top = np.argsort(-v, kind="stable")[: max(1, int(round(top_pct / 100 * len(v))))]
    noisy = bool(flipped.any())
    if noisy:
        dets = {m_: detection_roc(selfs[m_], flipped) for m_ in selfs}
        row1, row2 = st.columns(len(selfs)), st.columns(len(selfs))
        for j, m_ in enumerate(selfs):
            row1[j].metric(f"AUC · {m_.replace('_', ' ')}", f"{dets[m_].auc:.3f}",
                           help=f"ROC AUC of {SELF[m_]} as a detector of the flipped labels.")
            row2[j].metric(f"Flipped in top {top_pct}% · {m_.replace('_', ' ')}",
                           f"{fraction_in_top(selfs[m_], flipped, top_pct / 100):.0%}",
                           help=f"Of the {int(flipped.sum())} flipped labels, the share among the top {top_pct}% "
                                "by this score.")
        ui.chart(plots.roc_figure({SELF[m_]: (d.fpr, d.tpr, d.auc) for m_, d in dets.items()},
                                         "Self-influence as a detector of flipped labels"), width="stretch")
    else:
        st.caption("Turn on label noise in the sidebar to see how many flipped labels each self-influence finds.")
    shown = top[:24]
    if data.image_shape is not None:
        ui.chart(plots.image_grid(data.x_train[shown], [f"{tag(i)}<br>{v[i]:.2g}" for i in shown],
                                         image_shape=data.image_shape), width="stretch")
    elif data.n_features == 2:
        ui.chart(plots.scatter_2d(data.x_train, v, color_label="self-influence", highlight=top,
                                         axis_names=data.feature_names,
                                         title=f"Training set coloured by self-influence (top {top_pct}% circled)"),
                        width="stretch")
    st.dataframe(pd.DataFrame({"example": top, "label": [name(data.y_train[i]) for i in top],
                               "flipped label": flipped[top], **{SELF[m_]: selfs[m_][top] for m_ in selfs}}),
                 hide_index=True, width="stretch", height=240)
    ui.download(f"gradlab_self_influence_{exp.dataset}",
                {"example": np.arange(len(flipped)), "flipped label": flipped, **{SELF[m_]: v for m_, v in selfs.items()}},
                label="Self-influence of every training example")

# ------------------------------------------------------------------ check against retraining
st.subheader("Check against retraining")
st.markdown(
    "First converge the objective mean loss + λ/2‖θ‖² from the trained model (full-batch L-BFGS), then for each "
    "of the k most positive and k most negative influence-function predictions **retrain without that example** "
    "(warm-started) and measure the actual change of this test loss. Points on the diagonal mean the "
    "prediction is right. Koh & Liang (2017, Fig. 2) report Pearson 0.86 for a CNN and 0.95 for a smooth SVM."
)
c1, c2 = st.columns([1, 3])
with c1:
    rk = st.number_input("k (retrains 2k models)", min_value=2, max_value=25, value=8, key="infl_retrain_k",
                         bind="query-params")
    go = st.button("Check against retraining", type="primary", key="infl_retrain")
ck = (test_index, float(damping), solver, float(lissa_scale), int(rk))


@st.cache_resource(max_entries=4, show_spinner=False, hash_funcs=ui.HASH_FUNCS)
def retraining(fitted, test_index, damping, solver, lissa_scale, k):
    """The leave-one-out retraining check, shared by sessions (keyed on the complete experiment)."""
    extra = {"lissa_scale": lissa_scale} if (solver == "lissa" and lissa_scale > 0) else {}
    with ui.progress_bar("Retraining models without one example") as progress:
        return inf.retraining_check(fitted, test_index, damping=damping, k=k, method=solver,
                                    progress=progress, **extra)


chk = None
if ui.requested("infl_retrain", (exp, *ck), go, kept=1):
    with ui.guard("The retraining check failed"):
        chk = retraining(fitted, *ck)
if chk is None:
    st.caption("Press the button to retrain (a few seconds for linear models, longer for an MLP).")
else:
    m = st.columns(4)
    m[0].metric("Pearson r", f"{chk.pearson:.3f}", help="Linear agreement of predicted and actual change.")
    m[1].metric("Spearman ρ", f"{chk.spearman:.3f}", help="Rank agreement.")
    m[2].metric("Models retrained", f"{len(chk.indices)}",
                help=f"L-BFGS iterations: median {int(np.median([r.iterations for r in chk.retrained]))}; "
                     f"final gradient norm ≤ {max(r.grad_norm for r in chk.retrained):.1e}.")
    if method != "influence" and method in scores:
        _, rho_m = inf.correlations(scores[method][chk.indices], chk.actual)
        m[3].metric(f"Spearman ρ({method.replace('_', ' ')}, actual)", f"{rho_m:.3f}",
                    help="How well the chosen method's scores (at the trained model) rank the actual changes.")
    else:
        m[3].metric("Full-objective gradient norm", f"{chk.base.grad_norm:.1e}", help="How well θ̂ was converged.")
    ui.chart(plots.loo_scatter(chk.predicted, chk.actual, chk.indices, pearson=chk.pearson,
                                      spearman=chk.spearman, n_top=len(chk.indices) // 2), width="stretch")

ui.code_panel(
    """
import jax, jax.numpy as jnp
from jax.flatten_util import ravel_pytree

def loss(model, x, y):                                  # the loss of ONE example
    logits = model(x)
    return jax.nn.logsumexp(logits) - logits[y]

g_test = jax.grad(loss)(model, x_test, y_test)           # ∇ℓ(z_test), a pytree like the model

# gradient dot product with every training example, streamed in chunks (never N x P)
def dot(xy):
    g = jax.grad(loss)(model, *xy)
    return sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_test)))
grad_dot = jax.lax.map(dot, (xs, ys), batch_size=256)                       # (N,)

# TracIn (Pruthi et al. 2020): the same at every checkpoint, weighted by the learning rate
tracin = sum(lr * grad_dot_at(ckpt) for ckpt, lr in zip(checkpoints, lrs))

# influence function (Koh & Liang 2017): s = (H + λI)⁻¹ ∇L_test with Hessian-vector products
flat, unravel = ravel_pytree(model)
F = lambda th: jax.vmap(loss, (None, 0, 0))(unravel(th), xs, ys).mean() + lam / 2 * th @ th
hvp = lambda v: jax.jvp(jax.grad(F), (flat,), (v,))[1]    # forward-over-reverse
s, _ = jax.scipy.sparse.linalg.cg(hvp, ravel_pytree(g_test)[0])   # or jnp.linalg.solve(jax.hessian(F)(flat), ...)
# removing z_i from the mean over N moves θ by ≈ +(1/N) H⁻¹∇ℓ_i, so
predicted = (jax.lax.map(dot_with(unravel(s)), (xs, ys), batch_size=256) + lam * flat @ s) / N

# self-influence: ‖∇ℓ_i‖² at the last checkpoint, or summed over checkpoints (TracIn)
self_tracin = sum(lr * per_example_norms(ckpt) ** 2 for ckpt, lr in zip(checkpoints, lrs))
"""
)
