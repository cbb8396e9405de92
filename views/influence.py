"""Influence: which training examples helped or hurt one test prediction (proponents and opponents),
every registered attribution method side by side (`gradlab.influence.METHODS`), self-influence as a mislabel
detector, a live check against actual leave-one-out retraining (Koh & Liang 2017, Fig. 2) and the linear
datamodeling score (LDS). The page loops over the registry: it names no method."""

import numpy as np
import pandas as pd
import streamlit as st

from gradlab import influence as inf
from gradlab import costs, engine, export, memory, ui
from gradlab.influence import fitted as ifit
from gradlab.influence import methods as registry
from gradlab.metrics import detection_roc, fraction_in_top
from gradlab.ui.figures import plots

METHODS = inf.METHODS
st.title("Influence")
st.markdown(
    "Pick a test point. Every training example gets a **score**: how much it helped (**proponent**, positive) or "
    "hurt (**opponent**, negative) that prediction, by the gradient dot product, **TracIn**, the **influence "
    "function**, **TRAK**, the last layer's gradients or **projected gradients** at the trained model. Scores alone "
    "can mean nothing: the bottom of the page **retrains** without the top examples and scores every method by the "
    "**linear datamodeling score**. Each method runs where its own cost fits this server: on a large model, those "
    "that need no re-converged optimum θ̂."
)

ui.terms("influence function", "proponents and opponents", "L-BFGS", "H⁻¹v", "TracIn", "TRAK", "LDS", "self-influence")
exp = ui.experiment()
OPTIMUM_ITERS = costs.OPTIMUM_ITERS


def check_work(w) -> None:
    """Refuse the page when no method fits this server (`escape.Refusal`): each method is gated on its own cost."""
    g = ifit.gate(METHODS, w, registry.defaults())
    if not any(g.fits(n_) for n_ in METHODS):
        cheapest = min(g.first, key=g.first.get)
        costs.check_work(g.first[cheapest], f"Influence scores for P = {w.num_params:,} parameters (by the cheapest "
                         f"method, {METHODS[cheapest].label.lower()})", "Use a smaller model.")


if not exp.source.brings_model:  # before training: a model this page refuses whatever it scores is not trained for it
    with ui.guard("The influence scores do not fit this server", stop=True):
        n_train = ui.num_examples(exp)
        check_work(inf.Work(num_params=ui.num_params(exp), n=n_train, steps=exp.steps, batch_size=exp.batch_size,
                            macs=ui.macs(exp)))
fitted = ui.fitted(exp)
data = fitted.data
classify = data.task == "classification"
n_test = len(data.y_test)
pixels = (lambda rows: data.raw(rows))  # digits are drawn in raw pixels, never standardized ones


# Every shared computation is keyed on the fitted model (its first argument) and the settings it reads.
@ui.shared(label="Scoring the test set")
def test_summary(fitted):
    """Test losses and predictions at the trained model."""
    d = fitted.data
    return fitted.losses_and_predictions(fitted.model, d.x_test, d.y_test)


@ui.shared(label="Converging to θ̂ (L-BFGS)")
def optimum(fitted, l2):
    """θ̂ for (experiment, λ): converged once, shared by every method, self-influence and the check."""
    return ifit.optimum(fitted, l2, max_iter=OPTIMUM_ITERS)


def context(fitted, settings):
    """The methods' `Context`: `settings` ((name, value) pairs) and the cached θ̂ at their λ."""
    opts = dict(settings)
    return ifit.context(fitted, opts, base=lambda: optimum(fitted, float(opts.get("l2", registry.defaults()["l2"]))),
                        between=lambda: memory.release_memory(full=False))


@ui.shared(label="Preparing the method")
def prepared(fitted, name, settings):
    """`(state, None)` of method `name` prepared at `settings` (its `prepare_reads`), or `(None, why)`."""
    return ifit.prepare(context(fitted, settings), METHODS[name])


@ui.shared(label="Scoring every training example")
def method_scores(fitted, name, settings, rows):
    """Method `name`'s `Scored` for the test points `rows` (a tuple), `(len(rows), N)`: `(scored, None)` or
    `(None, why)`."""
    m = METHODS[name]
    state, why = prepared(fitted, name, m.key(dict(settings), m.prepare_reads))
    if why is not None:
        return None, why
    got = ifit.score_test_points(context(fitted, settings), rows, names=[name], states={name: state})
    return got.scored.get(name), got.errors.get(name)


@ui.shared(label="Computing self-influence")
def self_scores(fitted, name, settings):
    """Method `name`'s self-influence `(N,)`: `(values, None)` or `(None, why)` (None, None when it is not prepared)."""
    m = METHODS[name]
    state, why = prepared(fitted, name, m.key(dict(settings), m.prepare_reads))
    if why is not None:
        return None, None  # the page already says why the method is unavailable
    got, errors = ifit.self_influence_scores(context(fitted, settings), states={name: state}, names=[name])
    return got.get(name), errors.get(name)


def draw(control, settings):
    """A method's `Control` as its widget, bound to the URL; its default while its `when` does not hold."""
    if control.when is not None and settings.get(control.when[0]) != control.when[1]:
        return control.default
    shown = {"help": control.help or None, **({"format_func": control.fmt} if control.fmt else {})}
    if control.widget == "number":
        return ui.control(st.number_input, control.label, min_value=control.min_value, max_value=control.max_value,
                          value=control.default, key=control.key, help=control.help or None,
                          **({"step": control.step} if control.step is not None else {}))
    if control.widget == "slider":
        return ui.control(st.select_slider, control.label, options=list(control.options), value=control.default,
                          key=control.key, **shown)
    return ui.control(st.selectbox, control.label, list(control.options), key=control.key,
                      index=list(control.options).index(control.default), **shown)


test_loss, test_pred = test_summary(fitted)
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
    with ui.point_controls("influence_proponents"):  # beside its figure where a lecture step moved it (gradlab.ui.points.controls)
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
use, not_here = ifit.available(fitted)  # the registry's methods that apply to this model, in its order
work = ifit.work(fitted, macs=ui.macs(exp))
opened_on = ifit.gate(use, work, registry.defaults()).default(use)  # the default, or the first fallback that fits
settings = {}
c1, c2, c3, c4 = st.columns([2, 1, 1, 1])
with c1:
    method = ui.choice(st.selectbox, "Scoring method", {n_: m_.label for n_, m_ in use.items()}, "infl_method",
                       index=list(use).index(opened_on))
for col, control in zip((c2, c3), registry.SETTINGS):
    with col:
        settings[control.name] = draw(control, settings)
with c4:
    with ui.point_controls("influence_proponents"):  # beside its figure where a lecture step moved it (gradlab.ui.points.controls)
        k = ui.control(st.number_input, "Top-k", min_value=1, max_value=24, value=8, key="infl_k")
for m_ in use.values():  # each method's own controls, in its expander
    if m_.controls:
        with st.expander(f"{m_.short[:1].upper()}{m_.short[1:]} settings"):
            for control in m_.controls:
                settings[control.name] = draw(control, settings)
settings = {**registry.defaults(), **settings}  # a method that does not apply here keeps its defaults
if not_here:
    st.caption("Not offered for this model: " + "; ".join(f"**{METHODS[n_].label}**: {ui.inert(w_)}"
                                                          for n_, w_ in not_here.items()) + ".")
l2, damping = float(settings["l2"]), float(settings["damping"])
P = engine.num_params(fitted.model)
chosen = METHODS[method] if method in use else next(iter(use.values()))

# ------------------------------------------------------------------ each method gated on its own cost, before it runs
gate = ifit.gate(use, work, settings, optimum_stored=optimum.stored(fitted, l2))
if not gate.fits(chosen.name):
    fallback = gate.default(use)
    st.warning(f"**{chosen.label}** does not fit this server: {ui.inert(gate.why[chosen.name])}. "
               + (f"Showing **{METHODS[fallback].label}** instead, which does." if gate.fits(fallback) else ""),
               icon=":material/hourglass_disabled:")
    chosen = METHODS[fallback]
    method = chosen.name
if not gate.fits(chosen.name):
    st.error(f"**No attribution method fits this server for P = {P:,} parameters.** "
             f"{ui.inert(gate.why[chosen.name])}. Use a smaller model.", icon="⚠️")
    st.stop()
if opened_on != registry.DEFAULT and method == opened_on and registry.DEFAULT in use:
    st.info(f"Opened on **{chosen.label}**: the {METHODS[registry.DEFAULT].label.lower()} does not fit this server "
            f"here ({ui.inert(gate.why.get(registry.DEFAULT, ''))}).", icon=":material/speed:")
run_now = {n_: m_ for n_, m_ in use.items() if m_ is chosen or gate.joins(n_, m_)}  # ensembles train when picked
left_out = [n_ for n_, m_ in use.items() if n_ not in run_now and not m_.on_demand]
if left_out:
    st.caption("Not computed beside the picked method (pick one to run it): " + "; ".join(
        f"**{METHODS[n_].short}**: " + (ui.inert(gate.why[n_]) if n_ in gate.why else
                                        f"about {gate.click[n_]:,.0f} CPU-seconds per test point")
        for n_ in left_out) + ".")

# ------------------------------------------------------------------ the one optimum, only for a method that needs it
base = None
if any(m_.needs_optimum for m_ in run_now.values()):
    with st.spinner(f"Converging mean loss + λ/2‖θ‖² from the trained model (L-BFGS, up to {OPTIMUM_ITERS} "
                    "iterations)…"):
        with ui.guard("Could not converge the objective"):
            base = optimum(fitted, l2)
    if base is None:
        run_now = {n_: m_ for n_, m_ in run_now.items() if not m_.needs_optimum}
verdict = st.container()  # filled below, once the retraining check is known: the evidence comes first

# ------------------------------------------------------------------ every method: prepared once, then scored
states, errors, scored = {}, {}, {}
for n_, m_ in run_now.items():
    with st.spinner(f"Preparing {m_.label} (once)…"):
        states[n_], why = prepared(fitted, n_, m_.key(settings, m_.prepare_reads))
    if why is not None:
        st.warning(f"{m_.short[:1].upper()}{m_.short[1:]} is unavailable: {ui.inert(why)}", icon="⚠️")
        del states[n_]
ctx = context(fitted, tuple(sorted(settings.items())))
with st.spinner("Scoring every training example with every method…"):
    for n_ in states:
        m_ = METHODS[n_]
        rows = tuple(range(n_test)) if m_.every_test_point(ctx) else (test_index,)
        got, why = None, None
        with ui.guard(f"Could not score the training examples with {m_.label}"):
            got, why = method_scores(fitted, n_, m_.key(settings), rows)
            if got is not None:
                scored[n_] = (got, rows.index(test_index))
        if why is not None:
            errors[n_] = why
scores = {n_: got.values[row] for n_, (got, row) in scored.items()}
for m_, err in errors.items():
    st.error(f"**{METHODS[m_].label} unavailable.** {ui.inert(err)}", icon="⚠️")
for got, _ in scored.values():
    if got.note:
        st.info(got.note, icon="ℹ️")
    if got.caption:
        st.caption(got.caption)
if chosen.name in states and chosen.note(states[chosen.name]):
    st.info(chosen.note(states[chosen.name]), icon="ℹ️")
if not scores:
    st.error("No attribution method could score this model.", icon="⚠️")
    st.stop()
if method not in scores:
    method = next(iter(scores))  # the registry's first that worked
    st.warning(f"{chosen.label} is not available here; showing the {METHODS[method].label.lower()}.")
s = scores[method]
order = np.argsort(-s, kind="stable")
kk = int(min(k, len(s) // 2))
props, opps = order[:kk], order[::-1][:kk]

# ------------------------------------------------------------------ proponents and opponents
with ui.point("influence_proponents"):  # a lecture step opens on this block (gradlab.ui.points; issue 41)
    st.subheader(f"Proponents and opponents: {METHODS[method].label}")
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
                                            title=f"Training set coloured by {METHODS[method].label.lower()} "
                                                  "(blue helps, red hurts)"), width="stretch")
    elif data.n_features == 1:
        ui.chart(plots.scatter_1d(data.x_train, data.y_train, s, color_label="score", highlight=np.concatenate([props, opps]), ids=train_ids,
                                  axis_names=(data.feature_names[0], "target (standardized)"),
                                  title="Training set coloured by score (top proponents and opponents circled)"),
                 width="stretch")
table = pd.DataFrame({**export.example_columns(data, np.arange(len(s))), "label": [name(v) for v in data.y_train], "flipped label": flipped,
                      **{METHODS[m_].short: v for m_, v in scores.items()}})
shown = np.concatenate([props, opps])
card_row = ui.selected_row(ui.dataframe(table.iloc[shown], hide_index=True, width="stretch", on_select="rerun",
                                        selection_mode="single-row", key="infl_card_pick"))
st.caption("Select a proponent or opponent to open its record card.")
if card_row is not None:
    ui.open_card(shown[card_row])
ui.download(f"gradlab_influence_{exp.dataset}_test{test_index}", table, label="Scores of every training example")

# ------------------------------------------------------------------ the optimum the scores use
st.markdown("**The optimum θ̂** the influence function, self-influence and the retraining check use (L-BFGS on "
            f"F(θ) = mean loss + {l2:g}/2‖θ‖², from the trained model)")
if base is None:
    st.info("θ̂ is not converged here: "
            + (f"{ui.inert(gate.optimum_why)}. " if gate.optimum_why else
               "no method on this view needs it (pick the influence function to converge it). ")
            + "The methods shown score at the trained model itself: "
            + ", ".join(METHODS[n_].short for n_ in run_now) + ".", icon=":material/info:")
else:
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
    ui.chart(plots.agreement_heatmap(rho, [METHODS[m_].short for m_ in scores],
                                     title="Spearman rank correlation over all training examples"), width="stretch")
with b:
    st.markdown("Rank correlations (`scipy.stats.spearmanr`) between the methods' scores for this test point. "
                "Cosine discounts large-gradient examples; TracIn adds earlier checkpoints of an SGD run; the influence "
                "function reweights directions by the inverse Hessian at θ̂; TRAK by the inverse Gauss–Newton matrix, "
                "averaged over models; the last layer keeps only the output layer's gradients. A method that trains its "
                "own ensemble joins this table when it is the scoring method. "
                "Agreement is not correctness: the LDS below measures that.")
    me = list(scores).index(method)
    for j, m_ in enumerate(scores):
        if j != me:
            st.metric(f"ρ({METHODS[method].short}, {METHODS[m_].short})", f"{rho[me, j]:.2f}")

# ------------------------------------------------------------------ self-influence
with ui.point("influence_self"):  # a lecture step opens on this block (gradlab.ui.points; issue 41)
    st.subheader("Self-influence: which training examples look suspicious")
    selfs, self_notes = {}, []
    with st.spinner("Computing self-influence…"):
        for n_ in states:
            if METHODS[n_].self_label is None or METHODS[n_].on_demand:
                continue
            with ui.guard(f"Could not compute {METHODS[n_].label}'s self-influence"):
                v_, why = self_scores(fitted, n_, METHODS[n_].key(settings))
                if v_ is not None:
                    selfs[n_] = v_
                elif why:
                    self_notes.append(why)
    self_note = " ".join(self_notes) or None
    if selfs:
        SELF_SHORT = {m_: METHODS[m_].self_short for m_ in selfs}
        st.markdown(
            "An example that supports mostly itself (large gradient, or large effect of removing it on its own loss) is "
            "often mislabeled or atypical. The trained model's gradient norm forgets examples it has **memorized**; "
            "TracIn sums over the checkpoints and remembers how hard they were to fit."
        )
        c1, c2 = st.columns([2, 1])
        with c1:
            picked_self = ui.control(st.selectbox, "Rank by", [SELF_SHORT[m_] for m_ in selfs], key="infl_self",
                                     help="\n".join(f"- **{SELF_SHORT[m_]}**: {METHODS[m_].self_label}" for m_ in selfs))
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
                               help=f"ROC AUC of {METHODS[m_].self_label} as a detector of the flipped labels.")
                row2[j].metric(f"Flipped in top {top_pct}% · {SELF_SHORT[m_]}",
                               f"{fraction_in_top(selfs[m_], flipped, top_pct / 100):.0%}",
                               help=f"Of the {int(flipped.sum())} flipped labels, the share among the top {top_pct}%.")
            ui.chart(plots.roc_figure({METHODS[m_].self_label: (d.fpr, d.tpr, d.auc) for m_, d in dets.items()},
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
                                   "flipped label": flipped[top], **{METHODS[m_].self_label: selfs[m_][top] for m_ in selfs}}),
                     hide_index=True, width="stretch", height=240)
        ui.download(f"gradlab_self_influence_{exp.dataset}",
                    {**export.example_columns(data, np.arange(len(flipped))), "flipped label": flipped,
                     **{METHODS[m_].self_label: v_ for m_, v_ in selfs.items()}},
                    label="Self-influence of every training example")

# ------------------------------------------------------------------ check against retraining
RETRAIN_ITERS = 300
st.subheader("Check against retraining")
st.markdown(
    "At the same θ̂ the influence function uses"
    + (f" (‖∇F‖ = {base.grad_norm:.1e})" if base is not None else "") + ", take the k most positive and k most "
    "negative influence-function predictions, **retrain without each example** (L-BFGS warm-started from θ̂, same λ, "
    f"up to {RETRAIN_ITERS} iterations) and measure the actual change of this test loss. Points on the diagonal mean "
    "the prediction is right. Koh & Liang (2017, Fig. 2) report Pearson 0.86 for a CNN and 0.95 for a smooth SVM."
)


def retraining_cost(fitted, test_index, l2, damping, solver, lissa_scale, k):
    p_, n_ = engine.num_params(fitted.model), len(fitted.data.y_train)
    theta = 0.0 if optimum.stored(fitted, l2) else costs.optimum_seconds(p_, n_)  # θ̂ first, when not stored
    return costs.retraining_seconds(p_, n_, k=k) + theta


@ui.shared(label="Retraining", cost=retraining_cost)
def retraining(fitted, test_index, l2, damping, solver, lissa_scale, k, progress):
    base_ = optimum(fitted, l2)
    extra = {"lissa_scale": lissa_scale} if lissa_scale > 0 else {}
    return ifit.retraining_check(
        fitted, base_, test_index, damping=damping, k=k, solver=solver, max_iter=RETRAIN_ITERS, **extra,
        progress=lambda i, n: progress(i / n, f"retrained {i} of {n} models without one example"))


c1, c2 = st.columns([1, 3])
with c1:
    rk = ui.control(st.number_input, "k (retrains 2k models)", min_value=2, max_value=25, value=8, key="infl_retrain_k")
solver, lissa_scale = settings["solver"], float(settings["lissa_scale"]) if settings["solver"] == "lissa" else 0.0
check_args = (fitted, test_index, l2, damping, solver, lissa_scale, int(rk))
chk = None
fits = costs.largest(range(2, int(rk) + 1), lambda k_: retraining_cost(*check_args[:6], k_))
if gate.optimum_why or (fits is None and not retraining.stored(*check_args)):
    c2.info("**The retraining check does not fit this server here:** "
            + (f"{ui.inert(gate.optimum_why)}" if gate.optimum_why else
               f"retraining {2 * int(rk)} models would take about {retraining_cost(*check_args):,.0f} CPU-seconds, "
               f"over the {costs.WORK_BUDGET_SECONDS:.0f} allowed")
            + ". What fits: the rankings above, their agreement and self-influence; on a smaller model (the digits "
              "MLP) the check runs in seconds.", icon=":material/hourglass_disabled:")
else:
    with c1, ui.guard("The retraining check failed"):
        chk = ui.on_request(retraining, *check_args, name="infl_retrain", button="Check against retraining",
                            fix=f"Use k ≤ {fits}." if fits else "Use a smaller model.")
if chk is None and gate.optimum_why:
    verdict.info("**Does the ranking hold?** Retraining without the top-ranked examples does not fit this server "
                 "for this model (further down: why); the methods' agreement and self-influence below are what "
                 "fits.", icon=":material/help:")
elif chk is None:
    st.caption("Press the button to retrain (a few seconds for linear models, longer for an MLP).")
    verdict.info("**Does the ranking hold?** Press **Check against retraining** (further down): it retrains without "
                 "the top-ranked examples and compares the predicted with the actual change of this test loss.",
                 icon=":material/help:")
else:
    verdict.success(f"**The ranking holds against actual retraining:** for test point #{test_index}, the influence "
                    f"function's predicted changes agree with {len(chk.indices)} retrained models with Pearson "
                    f"r = {chk.pearson:.3f} (Koh & Liang 2017 report 0.86 for a CNN)."
                    + ("" if chk.base.converged else " θ̂ is a near-minimum (a ReLU network's loss has kinks), and "
                       "the rankings still track retraining."), icon=":material/verified:")

    m = st.columns(4)
    m[0].metric("Pearson r", f"{chk.pearson:.3f}", help="Linear agreement of predicted and actual change.")
    m[1].metric("Spearman ρ", f"{chk.spearman:.3f}", help="Rank agreement.")
    m[2].metric("Models retrained", f"{len(chk.indices)}",
                help=f"L-BFGS iterations: median {int(np.median([r.iterations for r in chk.retrained]))}; "
                     f"final gradient norm ≤ {max(r.grad_norm for r in chk.retrained):.1e}.")
    if method in scores and not METHODS[method].predicts_retraining:
        _, rho_m = inf.correlations(scores[method][chk.indices], chk.actual)
        m[3].metric(f"Spearman ρ({METHODS[method].short}, actual)", f"{rho_m:.3f}",
                    help="How well the chosen method's scores rank the actual changes of these examples.")
    else:
        m[3].metric("‖∇F(θ̂)‖", f"{chk.base.grad_norm:.1e}", help="The gradient norm at the θ̂ both used.")
    ui.chart(plots.loo_scatter(chk.predicted, chk.actual, chk.indices, pearson=chk.pearson, spearman=chk.spearman,
                               n_top=len(chk.indices) // 2, ids={k_: np.asarray(v_)[chk.indices] for k_, v_ in train_ids.items()}),
             width="stretch")

# ------------------------------------------------------------------ the linear datamodeling score
stored = inf.stored_lds(exp.dataset, exp.model)  # a larger model's LDS, measured offline (dattri's protocol)
if fitted.trainable:  # the LDS retrains from the initialization with gradlab's loop
    st.subheader("Which method ranks training data best? The linear datamodeling score")
    st.markdown(
        "Train **M models on random halves** of the training set with this experiment's own recipe (all M at once: "
        "`vmap` over subsets of one jitted training scan), record each test point's output −ℓ (ranked like the margin), "
        "and ask each method to predict it as the sum of its scores over the half kept. The **LDS** is the Spearman "
        "correlation between predicted and actual outputs over the M models, averaged over test points "
        "(Ilyas et al. 2022; Park et al. 2023). Every method is scored on the same subsets; 1 is perfect, 0 is chance."
    )


    def lds_cost(fitted, m, n_test_, settings_, names_=None):
        r = fitted.recipe
        return costs.lds_seconds(engine.num_params(fitted.model), models=m, steps=r["steps"], batch_size=r["batch_size"],
                                 n_test=n_test_, n=len(fitted.data.y_train))


    @ui.shared(label="Computing the LDS", cost=lds_cost)
    def lds_results(fitted, m, n_test_, settings_, progress, names_=None):
        """The LDS of every applicable method in `names_` (default: all) on one ensemble of half-data models (each
        method prepared once, shared with the scores above)."""
        opts, states_, errors_ = dict(settings_), {}, {}
        for n_, m_ in ifit.available(fitted)[0].items():
            if names_ is not None and n_ not in names_:
                continue
            states_[n_], why = prepared(fitted, n_, m_.key(opts, m_.prepare_reads))
            if why is not None:
                errors_[n_] = why
                del states_[n_]
        table_ = ifit.lds_table(context(fitted, settings_), m=m, n_test=n_test_, names=list(states_), states=states_,
                                progress=progress)
        return {k_: (v_.mean, v_.per_test) for k_, v_ in table_.results.items()}, {**errors_, **table_.errors}


    c1, c2, c3 = st.columns([1, 1, 2])
    lds_m = int(ui.control(c1.select_slider, "Models M", options=[20, 50, 100], value=50, key="infl_lds_m"))
    lds_t = int(ui.control(c2.select_slider, "Test points", options=[16, 32, 64], value=32, key="infl_lds_t"))
    fitting = tuple(n_ for n_ in use if gate.fits(n_))  # each method only where its own cost fits
    lds_args = (fitted, lds_m, lds_t, tuple(sorted(settings.items())))
    lds_kw = {} if len(fitting) == len(use) else {"names_": fitting}  # the digits MLP keeps its stored key
    lds_out = None
    with c3, ui.guard("The LDS could not be computed"):
        fits = costs.largest([20, 50, 100], lambda m_: lds_cost(fitted, m_, *lds_args[2:], **lds_kw))
        lds_out = ui.on_request(lds_results, *lds_args, **lds_kw, name="infl_lds", button="Compute the LDS of every method",
                                fix=f"Use M ≤ {fits} models." if fits else "Use fewer test points or a smaller model.")
    if lds_out is None:
        st.caption(f"Press the button: {lds_m} models train in one vmapped scan, then every method scores "
                   f"{lds_t} test points (tens of seconds on a laptop for the digits MLP).")
    else:
        res_lds, errs = lds_out
        for m_, err in errs.items():
            st.error(f"**{METHODS[m_].label}: no LDS.** {ui.inert(err)}", icon="⚠️")
        names = list(res_lds)
        ui.chart(plots.lds_bars([METHODS[m_].short for m_ in names], [res_lds[m_][0] for m_ in names],
                                [res_lds[m_][1] for m_ in names], m=lds_m), width="stretch")
        cols = st.columns(len(names))
        best = max(names, key=lambda m_: res_lds[m_][0])
        for j, m_ in enumerate(names):
            cols[j].metric(f"LDS · {METHODS[m_].short}", f"{res_lds[m_][0]:.3f}", delta="best" if m_ == best else None,
                           delta_color="off")
        lds_table_ = pd.DataFrame({"method": [METHODS[m_].label for m_ in names],
                                   "LDS": [res_lds[m_][0] for m_ in names],
                                   "std over test points": [float(np.nanstd(res_lds[m_][1])) for m_ in names]})
        ui.download(f"gradlab_lds_{exp.dataset}", lds_table_, label="LDS table")
else:
    ui.needs_training_loop("The linear datamodeling score")
if stored is not None:
    lds_stored, about = stored
    st.markdown(f"**The LDS on this model, measured offline** beside dattri's TRAK and EK-FAC on the same weights and "
                f"tensors (`{about['benchmark']}`, {about['measured']}; {about['machine']}). Each row's command "
                f"reproduces it; the table's: `{about['command']}`.")
    ui.dataframe(lds_stored, hide_index=True, width="stretch",
                 column_config={"LDS": st.column_config.NumberColumn(format="%.3f"),
                                "SE": st.column_config.NumberColumn(format="%.3f"),
                                "CPU-s": st.column_config.NumberColumn(format="%.0f")})


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

# projected gradients at the trained model, no θ̂ (LoGra, Choe et al. 2024): per layer (a Pa)ᵀ(δ Pd) from the rules'
# a and δ, never the gradient; the training features once, then each test point is one matrix-vector product
proj = engine.projections(loss, params, xs, ys, k_in=16, k_out=16)         # Gaussian Pa (I, 16), Pd (O, 16) per layer
Phi = engine.per_example_projections(loss, params, xs, ys, proj)            # (N, k), streamed
phi = engine.per_example_projections(loss, params, x_test[None], y_test[None], proj)[0]
# scored with TRAK's after-kernel (ΦᵀΦ + λI)⁻¹, damped by λ = 0.3 × its mean eigenvalue (the plain Φφ: ≈ grad_dot)
gram = Phi.T @ Phi
ridge = 0.3 * jnp.trace(gram) / gram.shape[0]
projected = Phi @ jnp.linalg.solve(gram + ridge * jnp.eye(gram.shape[0]), phi)   # (N,)

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
