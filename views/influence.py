"""Influence: which training examples helped or hurt one test prediction (proponents and opponents),
five attribution methods side by side, self-influence as a mislabel detector, a live check against
actual leave-one-out retraining (Koh & Liang 2017, Fig. 2) and the linear datamodeling score (LDS)."""

import numpy as np
import pandas as pd
import streamlit as st

from gradlab import influence as inf
from gradlab import costs, engine, export, losses, memory, ui
from gradlab.influence import fitted as ifit
from gradlab.metrics import detection_roc, fraction_in_top
from gradlab.ui.figures import plots

st.title("Influence")
st.markdown(
    "Pick a test point. Every training example gets a **score**: how much it helped (**proponent**, positive) or "
    "hurt (**opponent**, negative) that prediction, by the gradient dot product, **TracIn**, the **influence "
    "function** or **TRAK**. Scores alone can mean nothing: the bottom of the page **retrains** without the top "
    "examples and scores every method by the **linear datamodeling score**."
)

ui.terms("influence function", "proponents and opponents", "L-BFGS", "H⁻¹v", "TracIn", "TRAK", "LDS", "self-influence")
exp = ui.experiment()


def check_work(P: int, n: int, trak_models: int = 0) -> None:
    """Refuse influence scores over the work budget, naming the largest model that fits (ValueError)."""
    work = lambda p_: costs.influence_page_seconds(p_, n, steps=exp.steps, batch_size=exp.batch_size,  # noqa: E731
                                                   trak_models=trak_models)
    p_fits = costs.largest([2**i * 1000 for i in range(12)], work)
    costs.check_work(work(P), f"Influence scores for P = {P:,} parameters", f"Use a model with at most "
                     f"{p_fits:,} parameters (a smaller width or fewer layers)." if p_fits else "Use a smaller model.")


if not exp.source.brings_model:  # before training: a model this page refuses whatever it scores is not trained for it
    with ui.guard("The influence scores do not fit this server", stop=True):
        check_work(ui.num_params(exp), ui.num_examples(exp))
fitted = ui.fitted(exp)
data = fitted.data
classify = data.task == "classification"
n_test = len(data.y_test)
pixels = (lambda rows: data.raw(rows))  # digits are drawn in raw pixels, never standardized ones


@ui.shared(label="Scoring the test set")
def test_summary(exp, _fitted):
    """Test losses and predictions at the trained model."""
    d = _fitted.data
    loss = np.asarray(losses.per_example_losses(_fitted.loss_fn, _fitted.model, d.x_test, d.y_test))
    return loss, np.asarray(_fitted.predict(_fitted.model, d.x_test))


@ui.shared(label="Converging to θ̂ (L-BFGS)")
def optimum(data_key, l2, _fitted):
    """θ̂ for (experiment, λ): converged once, shared by the ranking, self-influence and the check."""
    return ifit.optimum(_fitted, l2, max_iter=OPTIMUM_ITERS)


@ui.shared(label="Training the SGD run TracIn follows")
def tracin_run(data_key, _fitted):
    """((checkpoints, lrs), note), or (None, why) when there is no SGD run to follow (no steps, diverged)."""
    try:
        run, note = ifit.tracin_run(_fitted)
        return inf.tracin_checkpoints(run), note
    except ValueError as err:
        return None, f"TracIn is unavailable: {ui.inert(err)}"


@ui.shared(label="Training TRAK's ensemble")
def trak_models(data_key, n_models, l2, _fitted):
    """TRAK's ensemble (each model's own θ̂ at λ), or None when one of its extra models cannot be trained (the
    message is shown)."""
    try:
        return ifit.trak_models(_fitted, n_models, base=optimum(data_key, l2, _fitted), max_iter=OPTIMUM_ITERS), None
    except ValueError as err:
        return None, f"TRAK is unavailable: training its ensemble failed: {err}"


@ui.shared(label="Scoring with TRAK")
def trak_rows(data_key, n_models, l2, proj_dim, rows, _fitted):
    """TRAK's scores for the test points `rows` (a tuple), `(len(rows), N)`: `(scores, None)` or `(None, why)`.
    A projected kernel is built once per model, so the page asks for every test point at once; the exact
    kernel (k ≥ P) is solved per test point."""
    models, why = trak_models(data_key, n_models, l2, _fitted)
    if models is None:
        return None, why
    idx = np.asarray(rows)
    try:
        return np.asarray(ifit.trak_scores(_fitted, models, l2, _fitted.data.x_test[idx], _fitted.data.y_test[idx],
                                           proj_dim=proj_dim)), None
    except inf.InfluenceError as err:
        return None, str(err)


@ui.shared(label="Scoring every training example")
def point_scores(exp, test_index, l2, damping, solver, lissa_scale, _fitted):
    base = optimum(exp, l2, _fitted)
    extra = {"lissa_scale": lissa_scale} if lissa_scale > 0 else {}
    return ifit.score_test_point(_fitted, base, test_index, damping=damping, solver=solver, **extra,
                                 tracin=tracin_run(exp, _fitted)[0])


@ui.shared(label="Computing self-influence")
def self_scores(exp, l2, damping, _fitted):
    base = optimum(exp, l2, _fitted)
    return ifit.self_influence_scores(_fitted, base, damping=damping, tracin=tracin_run(exp, _fitted)[0])


OPTIMUM_ITERS = costs.OPTIMUM_ITERS
PROJ_DIMS = [64, 128, 256, 512, 1024, 2048, 4096]
EXACT = "P (exact)"
test_loss, test_pred = test_summary(exp, fitted)
correct = (test_pred == data.y_test) if classify else (np.abs(test_pred - data.y_test) < 0.5)

# A click on the test-point chart (previous run) sets the index before its widget is drawn.
PICK, INDEX = "infl_pick", "infl_test"
picked = ui.picked_index(st.session_state.get(PICK), n_test)
if picked is not None and st.session_state.get("_infl_last_pick") != picked:
    st.session_state[INDEX] = picked
    st.session_state["_infl_last_pick"] = picked

# ------------------------------------------------------------------ the test point
st.subheader("The test point")
left, right = st.columns([1, 2])
name = (lambda c: data.class_names[int(c)]) if classify else (lambda v: f"{float(v):.2f}")
with left:
    test_index = ui.control(st.number_input, "Test point (index)", min_value=0, max_value=n_test - 1, value=0, key=INDEX,
                            help="Or click a point in the chart.")
    test_index = int(min(max(int(test_index), 0), n_test - 1))
    if data.image_shape is not None:
        ui.chart(plots.image_grid(pixels(data.x_test[[test_index]]), [f"test #{data.row(test_index, 'test')}"], cols=1,
                                  image_shape=data.image_shape), width="stretch")
    m = st.columns(2)  # two per row: the left third of a 1024 px projector is too narrow for three
    m[0].metric("Label", ui.inert(name(data.y_test[test_index])))  # a metric's value is Markdown: a class name is text
    m[1].metric("Prediction", ui.inert(name(test_pred[test_index])), delta="correct" if correct[test_index] else "wrong",
                delta_color="normal" if correct[test_index] else "inverse")
    st.metric("Test loss", f"{test_loss[test_index]:.3g}")
with right:
    if data.n_features == 2:
        xy, axes = data.x_test, data.feature_names
    else:
        xy, axes = np.stack([np.arange(n_test), test_loss], 1), ("test point index", "test loss at the trained model")
    test_ids = {**export.example_columns(data, np.arange(n_test), split="test"), "label": [name(v) for v in data.y_test]}
    ui.chart(plots.point_picker(xy, correct, test_index, axis_names=axes, ids=test_ids), width="stretch",
             on_select="rerun", selection_mode="points", key=PICK)

# ------------------------------------------------------------------ controls
SHORT = {"grad_dot": "grad dot", "grad_cosine": "grad cosine", "tracin": "TracIn", "influence": "influence function",
         "trak": "TRAK"}
SHORT = {m_: SHORT.get(m_, m_) for m_ in inf.METHODS}  # the library's list; short names go into the URL
c1, c2, c3, c4, c5 = st.columns([2, 1, 1, 1, 1])
with c1:
    method = ui.choice(st.selectbox, "Scoring method", inf.METHODS, "infl_method", index=list(inf.METHODS).index("influence"))
with c2:
    l2 = ui.control(st.select_slider,
        "Regularization λ", options=[1e-4, 1e-3, 1e-2, 1e-1], value=1e-2, format_func=lambda v: f"{v:g}",
        key="infl_l2",
        help="Part of the objective F(θ) = mean loss + λ/2‖θ‖² that θ̂ minimizes: it moves θ̂ and what retraining "
             "converges to. The influence function, its self-influence and the retraining check all use this θ̂.")
with c3:
    damping = ui.control(st.select_slider,
        "Damping δ", options=[0.0, 1e-3, 1e-2, 1e-1, 1.0], value=1e-2, format_func=lambda v: f"{v:g}",
        key="infl_damping",
        help="Added to the Hessian only: (H + δI)⁻¹. A network's Hessian has negative eigenvalues where θ̂ is not an "
             "exact minimum; δ > 0 makes H + δI positive definite. It does not change θ̂.")
with c4:
    solver = ui.control(st.selectbox, "H⁻¹v solver", list(inf.SOLVERS), key="infl_solver",
                        help="\n".join(f"- **{k_}**: {v_}" for k_, v_ in inf.SOLVERS.items()))
with c5:
    k = ui.control(st.number_input, "Top-k", min_value=1, max_value=24, value=8, key="infl_k")
lissa_scale = 0.0
if solver == "lissa":
    lissa_scale = ui.control(st.number_input, "LiSSA scale (0 = 2 × the largest Hessian eigenvalue, by power iteration)",
                             min_value=0.0, value=0.0, step=1.0, key="infl_lissa_scale")
with st.expander("TRAK settings"):
    t1, t2 = st.columns(2)
    n_models = int(ui.control(t1.number_input, "Models in the ensemble", min_value=1, max_value=10, value=ifit.TRAK_MODELS,
                              key="infl_trak_models",
                              help="θ̂ (as the influence function) plus models trained with seeds seed+1, … on the same data, each "
                                        "converged to its own θ̂ of the same objective at λ."))
    k_pick = ui.control(t2.select_slider, "Projection dimension k", options=[*map(str, PROJ_DIMS), EXACT], value=EXACT,
                        key="infl_trak_k",
                        help="Per-example gradients are projected to k dimensions by a Gaussian matrix. "
                                   "P (exact): no projection; the Gauss–Newton kernel is solved by conjugate gradient.")
    P = engine.num_params(fitted.model)
    proj_dim = P if k_pick == EXACT else int(k_pick)

# ------------------------------------------------------------------ what it will hold, before it runs
with ui.guard("The influence scores do not fit this server", stop=True):
    n_ckpt = len(fitted.run.checkpoints)
    memory.check(f"Influence scores for a model of P = {P:,} parameters with TRAK's k = {proj_dim}",
                 memory.influence_bytes(P, proj_dim, n_models, n_ckpt),
                 memory.influence_fix(P, PROJ_DIMS, n_models, n_ckpt))
    if not optimum.stored(exp, float(l2), fitted):
        check_work(P, len(data.y_train), trak_models=(n_models - 1) * (method == "trak"))

# ------------------------------------------------------------------ the one optimum
with st.spinner(f"Converging mean loss + λ/2‖θ‖² from the trained model (L-BFGS, up to {OPTIMUM_ITERS} iterations)…"):
    base = None
    with ui.guard("Could not converge the objective"):
        base = optimum(exp, float(l2), fitted)
if base is None:
    st.stop()
verdict = st.container()  # filled below, once the retraining check is known: the evidence comes first
with st.spinner("Training the SGD run TracIn follows…"):
    tr_ckpts, tr_note = tracin_run(exp, fitted)
if tr_ckpts is None:
    st.warning(tr_note, icon="⚠️")

with st.spinner("Scoring every training example with every method…"):
    res = None
    with ui.guard("Could not score the training examples"):
        res = point_scores(exp, test_index, float(l2), float(damping), solver, float(lissa_scale), fitted)
if res is None:
    st.stop()
scores, errors = dict(res.scores), dict(res.errors)
if method == "trak":  # TRAK trains its ensemble only when asked for; a projected kernel serves every test point
    exact = proj_dim >= P
    rows = (test_index,) if exact else tuple(range(n_test))
    with st.spinner(f"TRAK: training {n_models - 1} more models (once), converging each to its θ̂ and solving its "
                    "Gauss–Newton kernel" + (" for this test point…" if exact else f" at k = {proj_dim} for every test point…")):
        trak_scores, trak_error = trak_rows(exp, n_models, float(l2), proj_dim, rows, fitted)
    if trak_scores is None:
        errors["trak"] = trak_error
    else:
        scores = {m_: (trak_scores[rows.index(test_index)] if m_ == "trak" else scores[m_]) for m_ in inf.METHODS
                  if m_ in scores or m_ == "trak"}
for m_, err in errors.items():
    st.error(f"**{inf.METHODS[m_]} unavailable.** {ui.inert(err)}", icon="⚠️")
if res.ihvp is not None:
    if res.ihvp.note:
        st.info(res.ihvp.note, icon="ℹ️")
    st.caption(f"Influence function at θ̂: (H + δI)⁻¹∇L_test solved by **{res.ihvp.method}**"
               + (f" in {res.ihvp.iterations} iterations" if res.ihvp.iterations else "")
               + f"; relative residual {res.ihvp.residual:.1e}; λ = {l2:g}, δ = {damping:g}.")
if method == "tracin" and tr_ckpts is not None and tr_note:
    st.info(tr_note, icon="ℹ️")
if method not in scores:
    st.warning(f"{inf.METHODS[method]} is not available here; showing the gradient dot product.")
    method = "grad_dot"
s = scores[method]
order = np.argsort(-s, kind="stable")
kk = int(min(k, len(s) // 2))
props, opps = order[:kk], order[::-1][:kk]

# ------------------------------------------------------------------ proponents and opponents
with ui.point("influence_proponents"):  # a lecture step opens on this block (gradlab.ui.points; issue 41)
    st.subheader(f"Proponents and opponents: {inf.METHODS[method]}")
    flipped = data.flipped


    def tag(i):
        return f"#{data.row(i)} y={name(data.y_train[i])}" + (" (flipped)" if flipped[i] else "")


    # each training example by its row in the source and its input (hovers; the tables below)
    train_ids = {**export.example_columns(data, np.arange(len(data.y_train))), "label": [name(v) for v in data.y_train]}


    if data.image_shape is not None:
        st.markdown(f"**Top {kk} proponents** (removing or down-weighting them would hurt this prediction)")
        ui.chart(plots.image_grid(pixels(data.x_train[props]), [(tag(i), f"{s[i]:.2g}") for i in props],
                                  image_shape=data.image_shape), width="stretch")
        st.markdown(f"**Top {kk} opponents** (they pull this prediction the wrong way)")
        ui.chart(plots.image_grid(pixels(data.x_train[opps]), [(tag(i), f"{s[i]:.2g}") for i in opps],
                                  image_shape=data.image_shape), width="stretch")
    elif data.n_features == 2:
        ui.chart(plots.influence_scatter_2d(data.x_train, s, props, opps, data.x_test[test_index], score_label="score", ids=train_ids,
                                            axis_names=data.feature_names,
                                            title=f"Training set coloured by {inf.METHODS[method].lower()} "
                                                  "(blue helps, red hurts)"), width="stretch")
    elif data.n_features == 1:
        ui.chart(plots.scatter_1d(data.x_train, data.y_train, s, color_label="score", highlight=np.concatenate([props, opps]), ids=train_ids,
                                  axis_names=(data.feature_names[0], "target (standardized)"),
                                  title="Training set coloured by score (top proponents and opponents circled)"),
                 width="stretch")
table = pd.DataFrame({**export.example_columns(data, np.arange(len(s))), "label": [name(v) for v in data.y_train], "flipped label": flipped,
                      **{SHORT[m_]: v for m_, v in scores.items()}})
ui.dataframe(table.iloc[np.concatenate([props, opps])], hide_index=True, width="stretch")
ui.download(f"gradlab_influence_{exp.dataset}_test{test_index}", table, label="Scores of every training example")

# ------------------------------------------------------------------ the optimum the scores use
st.markdown("**The optimum θ̂** the influence function, self-influence and the retraining check use (L-BFGS on "
            f"F(θ) = mean loss + {l2:g}/2‖θ‖², from the trained model)")
o = st.columns(3)
o[0].metric("‖∇F(θ̂)‖ at the point used", f"{base.grad_norm:.1e}",
            help=f"Gradient norm of F(θ) = mean loss + {l2:g}/2‖θ‖² at θ̂; the target is {base.tol:.0e}.")
o[1].metric("L-BFGS iterations", f"{base.iterations}")
o[2].metric("θ̂", "minimum" if base.converged else "near-minimum",
            help="Whether ‖∇F‖ reached the target. A ReLU network's F has kinks, where L-BFGS stalls near 1e-3: "
                 "θ̂ is then a near-minimum, and the damping δ absorbs the Hessian's negative directions. The "
                 "retraining check below measures whether the rankings still hold.")
if not base.converged:
    st.caption(f"θ̂ stopped at ‖∇F‖ = {base.grad_norm:.1e} after {base.iterations} iterations (target {base.tol:.0e})"
               + (f": {exp.activation} has kinks where the gradient jumps; tanh or softplus converge."
                  if exp.model != "linear" and exp.activation == "relu" else "."))


# ------------------------------------------------------------------ agreement between methods
st.subheader("Do the methods agree?")
rho = inf.method_agreement(scores)
a, b = st.columns([3, 2])
with a:
    ui.chart(plots.agreement_heatmap(rho, [SHORT[m_] for m_ in scores],
                                     title="Spearman rank correlation over all training examples"), width="stretch")
with b:
    st.markdown("Rank correlations (`scipy.stats.spearmanr`) between the methods' scores for this test point. "
                "Cosine discounts large-gradient examples; TracIn adds earlier checkpoints of an SGD run; the influence "
                "function reweights directions by the inverse Hessian at θ̂; TRAK by the inverse Gauss–Newton matrix, "
                "averaged over models (it joins this table when it is the scoring method: it trains its own ensemble). "
                "Agreement is not correctness: the LDS below measures that.")
    me = list(scores).index(method)
    for j, m_ in enumerate(scores):
        if j != me:
            st.metric(f"ρ({SHORT[method]}, {SHORT[m_]})", f"{rho[me, j]:.2f}")

# ------------------------------------------------------------------ self-influence
with ui.point("influence_self"):  # a lecture step opens on this block (gradlab.ui.points; issue 41)
    st.subheader("Self-influence: which training examples look suspicious")
    with st.spinner("Computing self-influence…"):
        selfs = None
        with ui.guard("Could not compute self-influence"):
            selfs, self_note = self_scores(exp, float(l2), float(damping), fitted)
    if selfs is not None:
        SELF_SHORT = {"grad_norm": "gradient norm", "tracin": "TracIn", "influence": "influence function"}
        st.markdown(
            "An example that supports mostly itself (large gradient, or large effect of removing it on its own loss) is "
            "often mislabeled or atypical. The trained model's gradient norm forgets examples it has **memorized**; "
            "TracIn sums over the checkpoints and remembers how hard they were to fit."
        )
        c1, c2 = st.columns([2, 1])
        with c1:
            picked_self = ui.control(st.selectbox, "Rank by", [SELF_SHORT[m_] for m_ in selfs], key="infl_self",
                                     help="\n".join(f"- **{SELF_SHORT[m_]}**: {inf.SELF_INFLUENCE[m_]}" for m_ in selfs))
            self_method = {v: k_ for k_, v in SELF_SHORT.items()}[picked_self]
        with c2:
            top_pct = ui.control(st.slider, "Top x% to inspect", 1, 50, 10, key="infl_top_pct")
        if self_note:
            st.caption(ui.inert(self_note))  # an exception's message: text
        v = selfs[self_method]
        top = np.argsort(-v, kind="stable")[: max(1, int(round(top_pct / 100 * len(v))))]
        if flipped.any():
            dets = {m_: detection_roc(selfs[m_], flipped) for m_ in selfs}
            row1, row2 = st.columns(len(selfs)), st.columns(len(selfs))
            for j, m_ in enumerate(selfs):
                row1[j].metric(f"AUC · {SELF_SHORT[m_]}", f"{dets[m_].auc:.3f}",
                               help=f"ROC AUC of {inf.SELF_INFLUENCE[m_]} as a detector of the flipped labels.")
                row2[j].metric(f"Flipped in top {top_pct}% · {SELF_SHORT[m_]}",
                               f"{fraction_in_top(selfs[m_], flipped, top_pct / 100):.0%}",
                               help=f"Of the {int(flipped.sum())} flipped labels, the share among the top {top_pct}%.")
            ui.chart(plots.roc_figure({inf.SELF_INFLUENCE[m_]: (d.fpr, d.tpr, d.auc) for m_, d in dets.items()},
                                      "Self-influence as a detector of flipped labels"), width="stretch")
        else:
            st.caption("Turn on label noise in the sidebar to see how many flipped labels each self-influence finds.")
        shown = top[:24]
        if data.image_shape is not None:
            ui.chart(plots.image_grid(pixels(data.x_train[shown]), [(tag(i), f"{v[i]:.2g}") for i in shown],
                                      image_shape=data.image_shape), width="stretch")
        elif data.n_features == 2:
            ui.chart(plots.scatter_2d(data.x_train, v, color_label="self-influence", highlight=top, ids=train_ids,
                                      axis_names=data.feature_names,
                                      title=f"Training set coloured by self-influence (top {top_pct}% circled)"),
                     width="stretch")
        ui.dataframe(pd.DataFrame({**export.example_columns(data, top), "label": [name(data.y_train[i]) for i in top],
                                   "flipped label": flipped[top], **{inf.SELF_INFLUENCE[m_]: selfs[m_][top] for m_ in selfs}}),
                     hide_index=True, width="stretch", height=240)
        ui.download(f"gradlab_self_influence_{exp.dataset}",
                    {**export.example_columns(data, np.arange(len(flipped))), "flipped label": flipped,
                     **{inf.SELF_INFLUENCE[m_]: v_ for m_, v_ in selfs.items()}},
                    label="Self-influence of every training example")

# ------------------------------------------------------------------ check against retraining
RETRAIN_ITERS = 300
st.subheader("Check against retraining")
st.markdown(
    f"At the same θ̂ the ranking above used (‖∇F‖ = {base.grad_norm:.1e}), take the k most positive and k most "
    "negative influence-function predictions, **retrain without each example** (L-BFGS warm-started from θ̂, same λ, "
    f"up to {RETRAIN_ITERS} iterations) and measure the actual change of this test loss. Points on the diagonal mean "
    "the prediction is right. Koh & Liang (2017, Fig. 2) report Pearson 0.86 for a CNN and 0.95 for a smooth SVM."
)


def retraining_cost(data_key, test_index, l2, damping, solver, lissa_scale, k, _fitted):
    return costs.retraining_seconds(engine.num_params(_fitted.model), len(_fitted.data.y_train), k=k)


@ui.shared(label="Retraining", cost=retraining_cost)
def retraining(data_key, test_index, l2, damping, solver, lissa_scale, k, _fitted, progress):
    base_ = optimum(data_key, l2, _fitted)
    extra = {"lissa_scale": lissa_scale} if lissa_scale > 0 else {}
    return ifit.retraining_check(
        _fitted, base_, test_index, damping=damping, k=k, solver=solver, max_iter=RETRAIN_ITERS, **extra,
        progress=lambda i, n: progress(i / n, f"retrained {i} of {n} models without one example"))


c1, c2 = st.columns([1, 3])
with c1:
    rk = ui.control(st.number_input, "k (retrains 2k models)", min_value=2, max_value=25, value=8, key="infl_retrain_k")
check_args = (exp, test_index, float(l2), float(damping), solver, float(lissa_scale), int(rk), fitted)
chk = None
with c1, ui.guard("The retraining check failed"):
    fits = costs.largest(range(2, int(rk) + 1), lambda k_: retraining_cost(*check_args[:6], k_, fitted))
    chk = ui.on_request(retraining, *check_args, name="infl_retrain", button="Check against retraining",
                        fix=f"Use k ≤ {fits}." if fits else "Use a smaller model.")
if chk is None:
    st.caption("Press the button to retrain (a few seconds for linear models, longer for an MLP).")
    verdict.info("**Does the ranking hold?** Press **Check against retraining** (further down): it retrains without "
                 "the top-ranked examples and compares the predicted with the actual change of this test loss.",
                 icon=":material/help:")
else:
    verdict.success(f"**The ranking holds against actual retraining:** for test point #{test_index}, the influence "
                    f"function's predicted changes agree with {len(chk.indices)} retrained models with Pearson "
                    f"r = {chk.pearson:.3f} (Koh & Liang 2017 report 0.86 for a CNN)."
                    + ("" if base.converged else " θ̂ is a near-minimum (a ReLU network's loss has kinks), and "
                       "the rankings still track retraining."), icon=":material/verified:")

    m = st.columns(4)
    m[0].metric("Pearson r", f"{chk.pearson:.3f}", help="Linear agreement of predicted and actual change.")
    m[1].metric("Spearman ρ", f"{chk.spearman:.3f}", help="Rank agreement.")
    m[2].metric("Models retrained", f"{len(chk.indices)}",
                help=f"L-BFGS iterations: median {int(np.median([r.iterations for r in chk.retrained]))}; "
                     f"final gradient norm ≤ {max(r.grad_norm for r in chk.retrained):.1e}.")
    if method != "influence" and method in scores:
        _, rho_m = inf.correlations(scores[method][chk.indices], chk.actual)
        m[3].metric(f"Spearman ρ({SHORT[method]}, actual)", f"{rho_m:.3f}",
                    help="How well the chosen method's scores rank the actual changes of these examples.")
    else:
        m[3].metric("‖∇F(θ̂)‖", f"{chk.base.grad_norm:.1e}", help="The gradient norm at the θ̂ both used.")
    ui.chart(plots.loo_scatter(chk.predicted, chk.actual, chk.indices, pearson=chk.pearson, spearman=chk.spearman,
                               n_top=len(chk.indices) // 2, ids={k_: np.asarray(v_)[chk.indices] for k_, v_ in train_ids.items()}),
             width="stretch")

# ------------------------------------------------------------------ the linear datamodeling score
if fitted.trainable:  # the LDS retrains from the initialization with gradlab's loop
    st.subheader("Which method ranks training data best? The linear datamodeling score")
    st.markdown(
        "Train **M models on random halves** of the training set with this experiment's own recipe (all M at once: "
        "`vmap` over subsets of one jitted training scan), record each test point's output −ℓ (ranked like the margin), "
        "and ask each method to predict it as the sum of its scores over the half kept. The **LDS** is the Spearman "
        "correlation between predicted and actual outputs over the M models, averaged over test points "
        "(Ilyas et al. 2022; Park et al. 2023). Every method is scored on the same subsets; 1 is perfect, 0 is chance."
    )


    def lds_cost(data_key, m, n_test_, l2, damping, solver, n_models_, proj_dim_, _fitted):
        r = _fitted.recipe
        return costs.lds_seconds(engine.num_params(_fitted.model), models=m, steps=r["steps"], batch_size=r["batch_size"],
                                 n_test=n_test_, n=len(_fitted.data.y_train))


    @ui.shared(label="Computing the LDS", cost=lds_cost)
    def lds_results(data_key, m, n_test_, l2, damping, solver, n_models_, proj_dim_, _fitted, progress):
        base_ = optimum(data_key, l2, _fitted)
        table_ = ifit.lds_table(_fitted, base_, m=m, n_test=n_test_, damping=damping, solver=solver,
                                tracin=tracin_run(data_key, _fitted)[0], trak=trak_models(data_key, n_models_, l2, _fitted)[0],
                                proj_dim=proj_dim_, progress=progress)
        return {k_: (v_.mean, v_.per_test) for k_, v_ in table_.results.items()}, table_.errors


    c1, c2, c3 = st.columns([1, 1, 2])
    lds_m = int(ui.control(c1.select_slider, "Models M", options=[20, 50, 100], value=50, key="infl_lds_m"))
    lds_t = int(ui.control(c2.select_slider, "Test points", options=[16, 32, 64], value=32, key="infl_lds_t"))
    lds_args = (exp, lds_m, lds_t, float(l2), float(damping), solver, n_models, proj_dim, fitted)
    lds_out = None
    with c3, ui.guard("The LDS could not be computed"):
        fits = costs.largest([20, 50, 100], lambda m_: lds_cost(exp, m_, *lds_args[2:]))
        lds_out = ui.on_request(lds_results, *lds_args, name="infl_lds", button="Compute the LDS of every method",
                                fix=f"Use M ≤ {fits} models." if fits else "Use fewer test points or a smaller model.")
    if lds_out is None:
        st.caption(f"Press the button: {lds_m} models train in one vmapped scan, then every method scores "
                   f"{lds_t} test points (tens of seconds on a laptop for the digits MLP).")
    else:
        res_lds, errs = lds_out
        for m_, err in errs.items():
            st.error(f"**{inf.METHODS[m_]}: no LDS.** {ui.inert(err)}", icon="⚠️")
        names = list(res_lds)
        ui.chart(plots.lds_bars([SHORT[m_] for m_ in names], [res_lds[m_][0] for m_ in names],
                                [res_lds[m_][1] for m_ in names], m=lds_m), width="stretch")
        cols = st.columns(len(names))
        best = max(names, key=lambda m_: res_lds[m_][0])
        for j, m_ in enumerate(names):
            cols[j].metric(f"LDS · {SHORT[m_]}", f"{res_lds[m_][0]:.3f}", delta="best" if m_ == best else None,
                           delta_color="off")
        lds_table_ = pd.DataFrame({"method": [inf.METHODS[m_] for m_ in names],
                                   "LDS": [res_lds[m_][0] for m_ in names],
                                   "std over test points": [float(np.nanstd(res_lds[m_][1])) for m_ in names]})
        ui.download(f"gradlab_lds_{exp.dataset}", lds_table_, label="LDS table")
else:
    ui.needs_training_loop("The linear datamodeling score")


ui.code_panel(
    """
import jax, jax.numpy as jnp, equinox as eqx
from jax.flatten_util import ravel_pytree
from gradlab import engine, influence as inf

params, static = eqx.partition(model, eqx.is_array)   # the model's arrays (differentiated) and the rest

def loss(params, x, y):                                  # the loss of ONE example
    logits = eqx.combine(params, static)(x)
    return jax.nn.logsumexp(logits) - logits[y]

N = len(xs)
# one optimum: converge F(θ) = mean loss + λ/2‖θ‖² from the trained model (L-BFGS), used everywhere
base = inf.minimize(loss, params, xs, ys, l2=lam, max_iter=500)      # base.grad_norm: ‖∇F(θ̂)‖

# gradient dot product with every training example, streamed in chunks (never N x P)
g_test = jax.grad(loss)(params, x_test, y_test)
grad_dot = engine.per_example_dots(loss, params, xs, ys, g_test)           # (N,)

# TracIn (Pruthi et al. 2020): checkpoints after SGD steps, each weighted by the learning rate used there
ckpts, lrs = inf.tracin_checkpoints(sgd_run)                               # the initialization is not one
ckpts = [eqx.partition(c, eqx.is_array)[0] for c in ckpts]
tracin = sum(lr * engine.per_example_dots(loss, c, xs, ys, jax.grad(loss)(c, x_test, y_test)) for c, lr in zip(ckpts, lrs))

# influence function (Koh & Liang 2017) at θ̂: s = (H + δI)⁻¹ ∇L_test by CG on jvp-of-grad HVPs
# (for P ≤ 1,000 the page builds H = jax.hessian(F)(flat) and solves with jnp.linalg.solve)
flat, unravel = ravel_pytree(base.params)
F = lambda th: jax.vmap(loss, (None, 0, 0))(unravel(th), xs, ys).mean() + lam / 2 * th @ th
hvp = lambda v: jax.jvp(jax.grad(F), (flat,), (v,))[1] + delta * v
s, _ = jax.scipy.sparse.linalg.cg(hvp, ravel_pytree(jax.grad(loss)(base.params, x_test, y_test))[0], tol=1e-6)
predicted = (engine.per_example_dots(loss, base.params, xs, ys, unravel(s)) + lam * flat @ s) / N

# TRAK (Park et al. 2023): per model (each its own θ̂ at λ), Φ = ∇ℓ R (R: P x k Gaussian, streamed) and the
# after-kernel of the softmax Gauss-Newton matrix G: τ = φ(z)ᵀ(RᵀGR + λRᵀR)⁻¹Φᵀ / N, averaged over the models
P = flat.size                                                              # k = P: no projection
trak = inf.trak(loss, models, xs, ys, x_tests, y_tests, proj_dim=P, l2=lam, n_classes=K)   # (T, N)

# LDS: M models on random halves, trained at once with vmap over the subsets
subsets = inf.random_subsets(N, M)
outputs = inf.subset_outputs(loss, params, inf.train_on_subsets(init, loss, xs, ys, subsets), x_tests, y_tests)
lds = inf.lds(trak, subsets, outputs).mean
"""
)
