"""Example record: one training example from every page's side at once (its card, with its own link), every
example's quantities against each other (the whole picture), and what DP-SGD does to them (issue 43)."""

import numpy as np
import pandas as pd
import streamlit as st

from gradlab import audit, card, export, geometry, record, ui
from gradlab.ui import audit as audit_ui
from gradlab.ui.geometry import removal
from gradlab.ui.figures import audit_plots, plots

st.title("Example record")
ui.intro(
    "Every page looks at the training examples from one side: norms, clipping, influence, privacy. Here they are "
    "**one story**: one example's **card** (click an example on any page), and every example's quantities **against "
    "each other**.",
    "The card's gradient norm is the engine's at each checkpoint of the run; clipping is min(1, C/‖gᵢ‖) at C; "
    "**TracIn self-influence** is Σₜ‖gᵢ(θₜ)‖² over the checkpoints (Pruthi et al. 2020); the test points it helps "
    "or hurts are those whose gradient agrees or disagrees most with its own (grad-dot). **Memorization** "
    "(Feldman & Zhang 2020) and the **LiRA** score (Carlini et al. 2022) need models trained without the example: an "
    "ensemble on random halves of the training set, from one button, for the model as trained and for DP-SGD at ε.",
)
ui.terms("per-example gradient", "self-influence", "LiRA", "ε and δ")

SETS = {"training": "the experiment's training set (the sidebar's)",
        **{k: f"Geometry page: {v}" for k, v in geometry.PROBLEMS.items() if k != "scalar"},
        "canary": "Privacy audit: its canary (the audit of the settings in the link)"}
# one row of controls above the card: which examples, which one, C and ε
controls = st.columns([1.1, 1.7, 1, 1])
with controls[0]:
    which = ui.choice(st.selectbox, "Examples of", SETS, "rec_set")


@ui.shared(label="Following SGD's path")
def geometry_path(problem):
    p = geometry.problem(problem)
    path = geometry.trajectory(p, "sgd", lr=p.lr, steps=GEO_STEPS, batch_size=min(p.batch_size, p.n))
    return path, geometry.norms_along(p, path)


GEO_STEPS = 20  # the Geometry page's default path


def geometry_record(problem: str) -> None:
    """The card of one of the Geometry page's examples: a two-parameter model, so its input is a point, its
    gradient an arrow; no test set and no ensemble (the removal itself says what it does to the optimum)."""
    p = geometry.problem(problem)
    with controls[1]:
        example = ui.control(st.number_input, f"Example (0 to {p.n - 1})", min_value=0, max_value=p.n - 1, value=None,
                             step=1, key="example", placeholder="none: click a point on the Geometry page")
    if example is None:
        st.info("Pick an example, or click a training point on the Geometry page and follow its link.")
        return
    i = int(example)
    path, norms = geometry_path(problem)
    c = float(np.median(norms[-1]))
    st.subheader(f"The card of example {i} ({problem})")
    left, right = st.columns([1, 2])
    with left:
        x = np.atleast_1d(p.xs[i])
        st.metric("Input x", ", ".join(f"{v:.2f}" for v in x))
        st.metric("Target" if problem == "line" else "Label", f"{p.ys[i]:g}",
                  delta=p.marked_name if p.marked[i] else None, delta_color="inverse", delta_arrow="off")
    with right:
        ui.chart(plots.norm_over_training(np.arange(len(path)), norms[:, i], norms, clip_norm=c, name=f"example {i}"))
    g = float(norms[-1, i])
    mt = st.columns(3)
    mt[0].metric("Gradient norm ‖gᵢ‖", f"{g:.3g}", help=f"At θ after {GEO_STEPS} SGD steps (the Geometry page's path).")
    kept = float(card.clip_factor([g], c)[0])
    mt[1].metric(f"Clipped at C = {c:.3g}?", "no" if kept >= 1 else f"yes: ×{kept:.2f}", help="C: the median ‖gᵢ‖.")
    with ui.guard("This example cannot be removed"):
        removed = removal(problem, i)
        mt[2].metric("Removing it moves the optimum by", f"{np.linalg.norm(removed.retrained - removed.optimum):.3g}",
                     help=f"Retrained without it; the influence function predicts within {removed.error:.0%}.")


PICK = "rec_pick"
M = card.ENSEMBLE_MODELS


def trajectory_cost(exp, size, _fitted):
    return card.trajectory_seconds(ui.num_params(exp), size, len(_fitted.run.checkpoints), ui.macs(exp))


@ui.shared(label="Gradient norms at every checkpoint", cost=trajectory_cost)
def trajectory(exp, size, _fitted):
    return card.trajectory(_fitted, size=size)


@ui.shared(label="Its gradient norm at every checkpoint")
def norms_over_training(exp, i, _fitted):
    return card.norms_over_training(_fitted, i)


@ui.shared(label="Scoring the test points against its gradient")
def test_dots(exp, i, _fitted):
    return record.dots_with_test_points(_fitted, i)


def ensemble_cost(exp, m, _fitted, private: bool | None):
    r = _fitted.recipe
    return card.ensembles_seconds(ui.num_params(exp), len(_fitted.data.y_train), model=exp.model, steps=r["steps"],
                                  batch_size=r["batch_size"], m=m, macs=ui.macs(exp), private=private)


@ui.shared(label="Training the ensemble as trained", cost=lambda exp, m, _fitted: ensemble_cost(exp, m, _fitted, False))
def public_ensemble(exp, m, _fitted):
    return record.ensemble_for(_fitted, m)


@ui.shared(label="Training the DP-SGD ensemble", cost=lambda exp, m, eps, c, _fitted: ensemble_cost(exp, m, _fitted, True))
def private_ensemble(exp, m, eps, c, _fitted, progress):
    return record.ensemble_for(_fitted, m, private=True, epsilon=eps, clip_norm=c,
                               progress=lambda done, total: progress(done / total, f"model {done} of {total}"))


@ui.shared(gated=False, cost=lambda exp, m, eps, c, _fitted: ensemble_cost(exp, m, _fitted, None))  # the table too
def ensembles(exp, m, eps, c, _fitted):
    """One button's work: the ensemble as trained, then DP-SGD's at (ε, C), each its own run through the gate (the
    server drops compiled programs between them: 519 MB at the peak in one process, against 613 in one run)."""
    return public_ensemble(exp, m, _fitted), private_ensemble(exp, m, eps, c, _fitted)



@ui.shared(label="Attacking every model of both ensembles")
def attacks(exp, m, eps, c, _outputs, _dp):
    """Each attack's AUC and TPR at FPR 0.1% and 1% on each ensemble (leave one model out), as trained and DP-SGD."""
    return record.attack_summary(record.attack_rocs(_outputs)), record.attack_summary(record.attack_rocs(_dp))


@ui.shared(label="Every example's record")
def whole_table(exp, size, clip_norm, m, eps, _fitted, _t, _outputs, _dp):
    """`card.table` with the ensembles (their settings in the key: `m`, ε and C say which ones they are)."""
    return card.table(_fitted, _t, clip_norm=clip_norm, outputs=_outputs, dp=_dp)


def dp_effect(exp, m, eps, clip_norm, outputs, dp, full) -> None:
    """What DP-SGD does to the whole training set: mean memorization and the attacks' TPR at a low FPR, side by side."""
    with ui.guard("The attacks could not be evaluated"):
        public, private = attacks(exp, m, eps, clip_norm, outputs, dp)
        st.markdown(f"**What DP-SGD at ε = {dp.epsilon:.3g} does to the whole training set** (each of the {m} models "
                    "in turn the target, the others its shadows: Carlini et al. 2022's evaluation)")
        cols = st.columns(4)
        for col, (what, mem) in zip(cols[:2], (("as trained", "memorization"), ("under DP-SGD", "memorization_dp"))):
            v = full[mem].to_numpy(np.float64)
            col.metric(f"Mean memorization {what}", f"{np.nanmean(v):+.3f}",
                       help=f"± {np.nanstd(v) / np.sqrt(np.isfinite(v).sum()):.3f} (standard error of the mean over "
                            "examples). Feldman & Zhang 2020: P(correct | trained on it) − P(correct | not).")
        lira = {k: t.set_index("attack").loc["lira_online"] for k, t in (("as trained", public), ("under DP-SGD", private))}
        for col, (what, row) in zip(cols[2:], lira.items()):
            col.metric(f"LiRA TPR at 0.1% FPR {what}", f"{row['tpr@0.001']:.1%}",
                       help=f"Online LiRA (Carlini et al. 2022): AUC {row['auc']:.3f}, TPR at 1% FPR "
                            f"{row['tpr@0.01']:.1%}. The loss-threshold attack's TPR at 0.1%: "
                            + ", ".join(f"{t.set_index('attack').loc['loss', 'tpr@0.001']:.1%} {k}"
                                        for k, t in (("as trained", public), ("under DP-SGD", private))) + ".")
        table = pd.concat([public.assign(model="as trained"), private.assign(model=f"DP-SGD ε = {dp.epsilon:.3g}")])
        ui.dataframe(table[["model", "label", "auc", "tpr@0.001", "tpr@0.01"]].rename(
            columns={"label": "attack", "auc": "ROC AUC", "tpr@0.001": "TPR at 0.1% FPR", "tpr@0.01": "TPR at 1% FPR"}),
            hide_index=True, width="stretch")
        ui.download(f"gradlab_attacks_{exp.dataset}", table, label="Attacks on both ensembles", key="record_attacks_download")


def training_set_record() -> None:
    """The card and the whole picture of the experiment's training set."""
    exp = ui.experiment()
    fitted = ui.fitted(exp)
    data = fitted.data
    n = len(data.y_train)
    classify = data.task == "classification"
    name = (lambda c: data.class_names[int(c)]) if classify else (lambda v: f"{float(v):.2f}")
    k_ckpt = len(fitted.run.checkpoints)

    # a click on the whole picture (previous run) picks the example before its control is drawn
    picked = ui.picked_index(st.session_state.get(PICK), n)
    if picked is not None and st.session_state.get("_rec_last_pick") != picked:
        st.session_state["example"] = picked
        st.session_state["_rec_last_pick"] = picked

    size = n if exp.source.brings_model else card.trajectory_size(n, ui.num_params(exp), k_ckpt, ui.macs(exp))
    t = trajectory(exp, size, fitted)
    _, c1, c2, c3 = controls
    with c1:
        example = ui.control(st.number_input, f"Training example (0 to {n - 1})", min_value=0, max_value=n - 1,
                             value=None, step=1, key="example", placeholder="none: click a point below",
                             help="Its position in the training set (the card names its row in the source too). Every "
                                  "page opens this card: a norms histogram bar, a top-k row, a proponent, an exposed "
                                  "member, a Geometry point.")
    with c2:
        clip_norm = float(ui.control(st.number_input, "Clipping norm C", value=record.DP_CLIP_NORM, min_value=1e-6,
                                     format="%.4g", step=0.1, key="rec_c",
                                     help="Whether and how much each gradient is clipped, and the DP-SGD ensemble's C."))
    with c3:
        eps = float(ui.control(st.number_input, "DP-SGD ε", value=record.DP_EPSILON, min_value=0.1,
                               max_value=100.0, step=0.5, key="rec_eps",
                               help="The DP-SGD ensemble's privacy budget at δ = 1e-5: σ calibrated for its runs."))

    # the ensembles: one button with its estimate, shared by the room once trained (never a link's work)
    outputs = dp = None
    if classify and fitted.trainable:
        with ui.guard("The ensembles could not be trained"):
            both = ui.on_request(ensembles, exp, M, eps, clip_norm, fitted, name="record_ensembles",
                                 button=f"Memorization and LiRA: train {M} + {M} DP-SGD models",
                                 help=f"Two ensembles on random halves of the training set: the recipe as trained and "
                                      f"DP-SGD at ε = {eps:g}, C = {clip_norm:g}. Everyone on this server shares them.",
                                 fix="Pick a smaller model or fewer training steps.")
            outputs, dp = both if both is not None else (None, None)
    elif not classify:
        st.caption("Memorization and LiRA read a class label: they need a classification dataset.")
    else:
        ui.needs_training_loop("Memorization and LiRA")
    full = (card.table(fitted, t, clip_norm=clip_norm) if outputs is None
            else whole_table(exp, size, clip_norm, M, eps, fitted, t, outputs, dp))
    rows = full.set_index("index", drop=False)

    if example is not None:
        i = int(example)
        row = rows.loc[i] if i in rows.index else None
        row_label, row_ids = fitted.source.row_ids(data)
        st.subheader(f"The card of example {i} ({row_label} {row_ids[i]} in the source)")
        left, right = st.columns([1, 2])
        with left:
            if data.image_shape is not None:
                ui.chart(plots.image_grid(data.raw(data.x_train[[i]]), [f"#{row_ids[i]}"], cols=1,
                                          image_shape=data.image_shape), filename=f"example {i}")
            else:
                feats = export.example_columns(data, [i])
                ui.dataframe(pd.DataFrame({"value": [v[0] for v in feats.values()]}, index=list(feats)), width="stretch")
            mm = st.columns(2)
            mm[0].metric("Label", ui.inert(name(data.y_train[i])),
                         delta="flipped (planted)" if data.flipped[i] else None, delta_color="inverse", delta_arrow="off")
            if row is not None and np.isfinite(float(row["prediction"])):
                good = classify and int(row["prediction"]) == int(data.y_train[i])
                mm[1].metric("Prediction", ui.inert(name(row["prediction"])),
                             delta=("correct" if good else "wrong") if classify else None,
                             delta_color="normal" if good else "inverse", delta_arrow="off")
        own = None
        with right, ui.guard("Its gradient norm over training could not be computed"):
            own = norms_over_training(exp, i, fitted)
            ui.chart(plots.norm_over_training(t.steps, own, t.norms, clip_norm=clip_norm, name=f"example {i}"))
        if own is not None:
            g = float(own[-1])
            kept = float(card.clip_factor([g], clip_norm)[0])
            tracin = float(np.sum(np.square(own.astype(np.float64))))
            mt = st.columns(4)
            mt[0].metric("Gradient norm ‖gᵢ‖", f"{g:.3g}",
                         help=f"At the final model; larger than {np.mean(t.norms[-1] <= g):.0%} of the examples'.")
            mt[1].metric(f"Clipped at C = {clip_norm:.3g}?", "no" if kept >= 1 else f"yes: ×{kept:.2f}",
                         help="min(1, C/‖gᵢ‖): the share of its gradient DP-SGD keeps.")
            mt[2].metric("TracIn self-influence", f"{tracin:.3g}", help=f"Σₜ‖gᵢ(θₜ)‖² over {k_ckpt} checkpoints; larger "
                         f"than {np.mean(t.tracin <= tracin):.0%} of the examples'.")
            mt[3].metric("Loss", f"{float(row['loss']):.3g}" if row is not None else "–")

        if outputs is not None:
            st.markdown("**As trained and under DP-SGD**: how much it is remembered, and how well an attacker tells "
                        "it was trained on.")
            cols = st.columns(2)
            sides = ((cols[0], "As trained", "memorization", "lira_member"),
                     (cols[1], f"DP-SGD at ε = {dp.epsilon:.3g} (σ = {dp.noise_multiplier:.2f}, C = {dp.clip_norm:g})",
                      "memorization_dp", "lira_member_dp"))
            for col, title, mem, lira in sides:
                with col.container(border=True):
                    st.markdown(f"**{title}**")
                    em = st.columns(2)
                    em[0].metric("Memorization", f"{row[mem]:+.2f}", help=f"± {row[mem + '_se']:.2f} (standard error): "
                                 "P(correct | trained on it) − P(correct | not), over the ensemble's models.")
                    em[1].metric("LiRA score as a member", f"{row[lira]:+.2f}",
                                 help="Online LiRA's log likelihood ratio when it was trained on (Carlini et al. 2022), "
                                      f"mean over the models that had it: above {np.mean(full[lira] <= row[lira]):.0%} "
                                      "of the examples'. Higher: an attacker tells more surely.")
        elif classify:
            st.caption("Memorization and LiRA need models trained without it: the button above.")

        st.markdown("**The test points it helps and hurts most** (⟨gᵢ, g_test⟩ at the final model: a step on it "
                    "lowers the loss of those it helps)")
        with ui.guard("Its test points could not be scored"):
            dots = test_dots(exp, i, fitted)
            order = np.argsort(-dots, kind="stable")
            k = min(5, len(dots) // 2)
            shown = np.concatenate([order[:k], order[::-1][:k]])
            if data.image_shape is not None:
                titles = [(f"{'helps' if r < k else 'hurts'} #{data.row(o, 'test')}", f"{dots[o]:+.2g}")
                          for r, o in enumerate(shown)]
                ui.chart(plots.image_grid(data.raw(data.x_test[shown]), titles, cols=2 * k, image_shape=data.image_shape),
                         filename=f"example {i} helps and hurts")
            ui.dataframe(pd.DataFrame({"": ["helps"] * k + ["hurts"] * k,
                                       **export.example_columns(data, shown, split="test", features=4),
                                       "label": [name(data.y_test[o]) for o in shown], "⟨gᵢ, g_test⟩": dots[shown]}),
                         hide_index=True, width="stretch")
        if row is not None:
            ui.download(f"gradlab_record_{exp.dataset}_example{i}", full[full["index"] == i], label="This card",
                        key="record_card_download")

    # ------------------------------------------------------------------ the whole picture
    st.header("The whole picture")
    if outputs is not None:
        dp_effect(exp, M, eps, clip_norm, outputs, dp, full)
    available = [q for q in card.QUANTITIES if q in full and np.isfinite(full[q].to_numpy(np.float64)).sum() > 3]
    corr = record.rank_correlations(full, available)
    best = card.strongest_across(corr)
    pair = (best.a, best.b) if best is not None else (available[0], available[-1])
    # the pair follows the strongest relation (it changes when the ensembles arrive) until a visitor picks another
    shown = st.session_state.get("_rec_pair")
    if shown is not None and shown != pair and (st.session_state.get("rec_x"), st.session_state.get("rec_y")) == shown:
        st.session_state["rec_x"], st.session_state["rec_y"] = pair
    st.session_state["_rec_pair"] = pair
    figure = st.container()  # the figure first, its x and y pickers under it: at 1024×768 it starts on the first screen
    p1, p2 = st.columns(2)
    with p1:
        x_q = ui.choice(st.selectbox, "x", {q: card.QUANTITIES[q] for q in available}, "rec_x",
                          index=available.index(pair[0]))
    with p2:
        y_q = ui.choice(st.selectbox, "y", {q: card.QUANTITIES[q] for q in available}, "rec_y",
                          index=available.index(pair[1]))
    sel = (full.index[full["index"] == int(example)][0] if example is not None and (full["index"] == int(example)).any()
           else None)
    ids = {**export.example_columns(data, full["index"].to_numpy(), features=0),
           "label": [name(v) for v in full["label"]]}
    one = corr[((corr.a == x_q) & (corr.b == y_q)) | ((corr.a == y_q) & (corr.b == x_q))]
    title = f"{card.SHORT[y_q]} against {card.SHORT[x_q]}" + (f": Spearman ρ = {one.rho.iloc[0]:+.2f}" if len(one) and np.isfinite(one.rho.iloc[0]) else "")
    with figure:
        ui.chart(plots.quantity_scatter(full[x_q].to_numpy(), full[y_q].to_numpy(), x_label=card.QUANTITIES[x_q],
                                        y_label=card.QUANTITIES[y_q], flipped=full["flipped"].to_numpy(), ids=ids,
                                        selected=sel, title=title),
                 on_select="rerun", selection_mode="points", key=PICK)
    # under the figure too, for the same first screen (the chart's title holds its ρ)
    if best is not None:
        st.markdown(f"**The strongest relation across sources:** {card.SHORT[best.a]} and {card.SHORT[best.b]} rank "
                    f"{'alike' if best.rho > 0 else 'in opposite orders'}, Spearman ρ = {best.rho:+.2f} (95% CI "
                    f"{best.low:+.2f} to {best.high:+.2f}, {best.n:,} examples).")
    else:
        st.markdown("**No relation across sources yet:** the cheap quantities all come from one training run; "
                    "memorization and LiRA (the button above) come from other models.")
    st.caption(f"Every training example{'' if len(t.index) == n else f' (TracIn: a fixed random {len(t.index):,} of {n:,})'}; "
               "click one to open its card. Red: the labels flipped on purpose (sidebar: label noise)."
               + ("" if outputs is not None or not classify else " Memorization and LiRA join once the ensembles are trained."))
    st.dataframe(corr.drop(columns=["p"]).assign(a=corr.a.map(card.SHORT), b=corr.b.map(card.SHORT))
                 .sort_values("rho", key=abs, ascending=False)
                 .rename(columns={"a": "x", "b": "y", "rho": "Spearman ρ", "low": "95% CI low", "high": "95% CI high"}),
                 hide_index=True, width="stretch",
                 column_config={c: st.column_config.NumberColumn(format="%.2f") for c in ("Spearman ρ", "95% CI low", "95% CI high")})
    ui.download(f"gradlab_record_{exp.dataset}_all", full, label="Every example's quantities", key="record_all_download")


@ui.shared(gated=False)
def canary_of(settings, trial, _result):
    """`audit.canary_record` of the audit of `settings` (its result `_result`) at `trial`."""
    return audit.canary_record(_result, trial)


def canary_record() -> None:
    """The card of the Privacy audit's canary: its input, what clipping does to its gradient, and what the audit's
    trials say about its membership. The audit is the Privacy audit page's own shared result for the settings in
    the link (a stored one opens at once), else its button."""
    settings = None
    with ui.guard("This link's audit settings cannot be used"):
        settings = audit_ui.card_settings(st.query_params)
    if settings is None:
        return
    audit_ui.show_in_url(settings)
    sigma, steps, q, c, trials, kind, bug = settings
    st.caption(f"The audit of the Privacy audit page with the {audit.CANARIES[kind]}, noise multiplier σ = {sigma:g}, "
               f"T = {steps} step{'s' * (steps != 1)}, sampling rate q = {q:g}, clipping norm C = {c:g}, {trials:,} trials, "
               + (f"planted bug: {bug}." if bug else "correct DP-SGD."))
    links = st.columns(2)
    with links[0]:
        st.page_link("views/privacy_audit.py", label="Change them on the Privacy audit page", icon=":material/policy:",
                     query_params=audit_ui.link(settings))
    with links[1]:  # the card's own address, whatever the address bar shows
        ui.canary_link(audit_ui.link(settings), label="Link to this card")
    res = None
    with ui.guard("The audit could not run with these settings"):
        res = audit_ui.result(settings)
    if res is None:
        st.info("The canary's card reads the audit's trials: it shows here once the audit has run (above, or on the "
                "Privacy audit page).")
        return
    with controls[1]:
        trial = ui.control(st.number_input, f"Trial (0 to {res.trials - 1})", min_value=0, max_value=res.trials - 1,
                           value=None, step=1, key="rec_trial", placeholder="none: select one on the Privacy audit page",
                           help="One trial: one training run in which a coin put the canary in or left it out.")
    rec = None
    with ui.guard("The canary could not be described"):
        rec = canary_of(settings, None if trial is None else int(trial), res)
    if rec is None:
        return
    st.subheader(f"The card of the canary ({kind})" + ("" if rec.trial is None else f" at trial {rec.trial}"))
    left, right = st.columns([1, 2])
    with left:
        if rec.features is not None:
            st.dataframe(pd.DataFrame({"its input": rec.features}, index=[f"x{i + 1}" for i in range(len(rec.features))]),
                         width="stretch")
            st.metric("Label it was planted with", f"{rec.label:+g}", delta="mislabeled outlier", delta_color="off",
                      delta_arrow="off", help="The trials' two blobs say nothing about this point: a model only gets "
                      "it right by remembering it, which is what membership reveals.")
        else:
            st.metric("Input", "none: a loss only", help="The white-box canary is not an input: it is a loss whose "
                      "gradient points at its trial's own parameter (Nasr et al. 2023).")
        st.markdown(f"**Its loss:** {rec.loss}.")
    with right:
        ui.chart(audit_plots.observation_histogram(res.scores, res.is_in, res.threshold,
                                                   xlabel=audit_plots.OBSERVATION[kind], title="Its trials, in and out",
                                                   marked=rec.observation, marked_name=f"trial {rec.trial}"))
    mt = st.columns(4)
    mt[0].metric("Gradient norm ‖g‖", f"{rec.grad_norm:.3g}",
                 help="The engine's per-example gradient norm of its own loss where the audit starts (θ = 0)."
                      + (" Its loss is linear: the same at every θ." if kind == "gradient" else ""))
    mt[1].metric(f"Clipped at C = {c:g}?", "no" if rec.clip_factor >= 1 else f"yes: ×{rec.clip_factor:.2f}",
                 help="min(1, C/‖g‖): the share of its gradient correct DP-SGD keeps."
                      + (f" The planted bug ({bug}) changes what the code really keeps." if bug else ""))
    if kind == "gradient":
        mt[2].metric("Clipped norm min(‖g‖, C)", f"{min(rec.grad_norm, c):.3g}",
                     help=f"What it adds to a step of correct DP-SGD, under noise of std σ·C = {sigma * c:.3g}.")
    elif rec.grad_norm_trained is not None:
        mt[2].metric(f"‖g‖ at trial {rec.trial}'s trained model", f"{rec.grad_norm_trained:.3g}",
                     delta=f"clip ×{rec.clip_factor_trained:.2f}" if rec.clip_factor_trained < 1 else "not clipped",
                     delta_color="off", delta_arrow="off",
                     help="Exact from its observation: the logistic loss's gradient depends on the trained model only "
                          "through its margin on the canary.")
    mt[3].metric("The test: TPR at its FPR", f"{rec.tpr:.1%} at {rec.fpr:.1%}",
                 help=f"Guess “in” when the observation is {'≥' if rec.direction > 0 else '≤'} {rec.threshold:.3g} "
                      f"(the threshold the audit's bound uses), over all {res.trials:,} trials.")
    if rec.trial is not None:
        mr = st.columns(3)
        mr[0].metric(f"Trial {rec.trial}'s observation", f"{rec.observation:.3g}")
        mr[1].metric("The canary was", "in" if rec.trial_in else "out", help="The trial's coin: in its training set or not.")
        mr[2].metric("The test guessed", "in" if rec.guessed_in else "out", delta="right" if rec.correct else "wrong",
                     delta_color="normal" if rec.correct else "inverse", delta_arrow="off")
    else:
        st.caption("Pick a trial above (or select one on the Privacy audit page) to mark it and see whether the test "
                   "guessed it right.")


if which == "canary":
    canary_record()
elif which != "training":
    geometry_record(which)
else:
    training_set_record()

ui.code_panel(
    """
import jax, jax.numpy as jnp

# loss(params, x, y): the loss of ONE example; checkpoints: the run's parameters, final the last of them

def norm_of(params, x, y):                    # one example's gradient norm
    g = jax.grad(loss)(params, x, y)
    return jnp.sqrt(sum(jnp.sum(a ** 2) for a in jax.tree.leaves(g)))

# example i at every checkpoint of the run (the engine streams all N at once, never N x P)
norms_i = jnp.stack([norm_of(params, xs[i], ys[i]) for params in checkpoints])     # (K,)
kept = jnp.minimum(1.0, C / norms_i[-1])      # clipping at C keeps this share of its gradient (1: not clipped)
tracin_self = jnp.sum(norms_i ** 2)           # TracIn self-influence (Pruthi et al. 2020)

# the test points it helps and hurts: <g_i, g_test> at the final model (a step on i lowers the loss where > 0)
g_i = jax.grad(loss)(final, xs[i], ys[i])
g_test = jax.vmap(jax.grad(loss), (None, 0, 0))(final, x_test, y_test)
dots = sum(jnp.tensordot(a, b, b.ndim) for a, b in zip(jax.tree.leaves(g_test), jax.tree.leaves(g_i)))
helps, hurts = jnp.argsort(-dots)[:5], jnp.argsort(dots)[:5]

# memorization (Feldman & Zhang 2020) from M models on random halves: masks (M, N) which examples each model trained
# on, correct (M, N) whether it gets each right; LiRA compares the trained model's confidence with the OUT models'
p_in = (correct * masks).sum(0) / masks.sum(0)
p_out = (correct * ~masks).sum(0) / (~masks).sum(0)
memorization = p_in - p_out
"""
)
