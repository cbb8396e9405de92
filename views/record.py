"""Example record: one training example from every page's side at once (its card, with its own link), every
example's quantities against each other (the whole picture), and what DP-SGD does to them (issue 43)."""

import numpy as np
import pandas as pd
import streamlit as st

from gradlab import card, export, geometry, ui
from gradlab.ui.figures import plots

st.title("Example record")
ui.intro(
    "Every page looks at the same training examples from one side: their gradient norms, how clipping treats them, "
    "whom they influence, whether an attacker can tell they were trained on. Here they are **one story**: pick an "
    "example (or click one on any page) for its **card**, and see every example's quantities **against each other**.",
    "The card's gradient norm is the engine's at each checkpoint of the run; clipping is min(1, C/‖gᵢ‖) at C; "
    "**TracIn self-influence** is Σₜ‖gᵢ(θₜ)‖² over the checkpoints (Pruthi et al. 2020); the test points it helps "
    "or hurts are those whose gradient agrees or disagrees most with its own (grad-dot). **Memorization** "
    "(Feldman & Zhang 2020) and the **LiRA** score (Carlini et al. 2022) need models trained without the example: an "
    "ensemble on random halves of the training set, from one button, for the model as trained and for DP-SGD at ε.",
)
ui.terms("per-example gradient", "self-influence", "LiRA", "ε and δ")

SETS = {"training": "the experiment's training set (the sidebar's)",
        **{k: f"Geometry page: {v}" for k, v in geometry.PROBLEMS.items() if k != "scalar"}}
with st.columns([1, 2])[0]:
    which = ui.choice(st.selectbox, "Examples of", SETS, "rec_set")


@ui.shared(label="Following SGD's path")
def geometry_path(problem):
    p = geometry.problem(problem)
    path = geometry.trajectory(p, "sgd", lr=p.lr, steps=GEO_STEPS, batch_size=min(p.batch_size, p.n))
    return path, geometry.norms_along(p, path)


@ui.shared(label="Retraining without the example")
def geometry_removal(problem, index):
    return geometry.remove_example(geometry.problem(problem), index)


GEO_STEPS = 20  # the Geometry page's default path


def geometry_record(problem: str) -> None:
    """The card of one of the Geometry page's examples: a two-parameter model, so its input is a point, its
    gradient an arrow; no test set and no ensemble (the removal itself says what it does to the optimum)."""
    p = geometry.problem(problem)
    example = ui.control(st.number_input, f"Example (0 to {p.n - 1})", min_value=0, max_value=p.n - 1, value=None,
                         step=1, key="example", placeholder="none: click an arrow's point on the Geometry page")
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
        removed = geometry_removal(problem, i)
        mt[2].metric("Removing it moves the optimum by", f"{np.linalg.norm(removed.retrained - removed.optimum):.3g}",
                     help=f"Retrained without it; the influence function predicts within {removed.error:.0%}.")


if which != "training":
    geometry_record(which)
else:
    exp = ui.experiment()
    fitted = ui.fitted(exp)
    data = fitted.data
    n = len(data.y_train)
    classify = data.task == "classification"
    name = (lambda c: data.class_names[int(c)]) if classify else (lambda v: f"{float(v):.2f}")
    K = len(fitted.run.checkpoints)


    def trajectory_cost(exp, size, _fitted):
        return card.trajectory_seconds(ui.num_params(exp), size, K, ui.macs(exp))


    @ui.shared(label="Gradient norms at every checkpoint", cost=trajectory_cost)
    def trajectory(exp, size, _fitted):
        return card.trajectory(_fitted, size=size)


    @ui.shared(label="Its gradient norm at every checkpoint")
    def norms_over_training(exp, i, _fitted):
        return card.norms_over_training(_fitted, i)


    @ui.shared(label="Scoring the test points against its gradient")
    def helps_and_hurts(exp, i, _fitted):
        return card.helps_and_hurts(_fitted, i)


    def ensemble_cost(exp, m, eps, c, _fitted):
        p, mac = ui.num_params(exp), ui.macs(exp)
        r = _fitted.recipe
        return sum(card.exposure_seconds(p, n, steps=r["steps"], batch_size=r["batch_size"], m=m, private=private, macs=mac)
                   for private in (False, True))


    @ui.shared(label="Training the ensembles", cost=ensemble_cost)
    def ensembles(exp, m, eps, c, _fitted, progress):
        """Memorization and LiRA for the model as trained and for DP-SGD at ε: two ensembles of `m` models."""
        public = card.exposure(_fitted, m, progress=lambda f, t: progress(f / 2, "as trained: " + t))
        private = card.exposure(_fitted, m, private=True, epsilon=eps, clip_norm=c,
                                progress=lambda f, t: progress(0.5 + f / 2, "DP-SGD: " + t))
        return public, private


    # ------------------------------------------------------------------ the controls (a click below picks the example)
    PICK = "rec_pick"
    picked = ui.picked_index(st.session_state.get(PICK), n)
    if picked is not None and st.session_state.get("_rec_last_pick") != picked:
        st.session_state["example"] = picked
        st.session_state["_rec_last_pick"] = picked

    size = card.trajectory_size(n, ui.num_params(exp), K, ui.macs(exp)) if not exp.source.brings_model else n
    t = trajectory(exp, size, fitted)
    median_c = float(np.median(t.norms[-1]))
    c1, c2, c3 = st.columns([2, 1, 1])
    with c1:
        example = ui.control(st.number_input, f"Training example (0 to {n - 1})", min_value=0, max_value=n - 1, value=None,
                             step=1, key="example", placeholder="none: click a point in the whole picture below",
                             help="Its position in the training set; the card names its row in the source too. Every page "
                                  "opens this card: a histogram bar, a top-k row, a proponent, an exposed member.")
    with c2:
        c_in = ui.control(st.number_input, "Clipping norm C", value=None, min_value=1e-12, format="%.4g", key="rec_c",
                          placeholder=f"{median_c:.3g} (median ‖gᵢ‖)", help="Empty: the median per-example norm.")
    clip_norm = median_c if c_in is None else float(c_in)
    with c3:
        eps = ui.control(st.number_input, "DP-SGD ε (δ = 1e-5)", value=4.0, min_value=0.1, max_value=100.0, step=0.5,
                         key="rec_eps", help="The DP-SGD ensemble's privacy budget: σ calibrated over the run's steps.")

    # ------------------------------------------------------------------ the ensembles: one button (never a link's work)
    m = card.ENSEMBLE_MODELS
    exposure = None
    ens_slot = st.container()

    # ------------------------------------------------------------------ the card
    position = {int(v): j for j, v in enumerate(t.index)}  # example → its row in the trajectory (a subset for large sets)
    with ens_slot:
        if classify and fitted.trainable:
            with ui.guard("The ensembles could not be trained"):
                exposure = ui.on_request(ensembles, exp, m, float(eps), clip_norm, fitted, name="record_ensembles",
                                         button=f"Memorization and LiRA: train {m} + {m + 1} DP-SGD models",
                                         help="Two ensembles on random halves of the training set: the recipe as trained "
                                              "and DP-SGD at ε. Shared by everyone on this server once trained.",
                                         fix="Pick a smaller model or fewer training steps.")
    public, private = exposure if exposure is not None else (None, None)
    full = card.table(fitted, t, clip_norm=clip_norm, exposure=public)

    if example is not None:
        i = int(example)
        row_name, rows = fitted.source.row_ids(data)
        st.subheader(f"The card of example {i} ({row_name} {rows[i]})")
        left, right = st.columns([1, 2])
        correct = None
        with left:
            if data.image_shape is not None:
                ui.chart(plots.image_grid(data.raw(data.x_train[[i]]), [f"#{rows[i]}"], cols=1, image_shape=data.image_shape),
                         filename=f"example {i}")
            else:
                feats = export.example_columns(data, [i])
                st.dataframe(pd.DataFrame({k: [v[0]] for k, v in feats.items()}).T.rename(columns={0: "value"}),
                             width="stretch")
            mm = st.columns(2)
            mm[0].metric("Label", ui.inert(name(data.y_train[i])),
                         delta="flipped (planted)" if data.flipped[i] else None, delta_color="inverse", delta_arrow="off")
            j = position.get(i)
            if j is not None and np.isfinite(np.asarray(t.predictions, np.float64)[j]):
                pred = t.predictions[j]
                correct = (pred == data.y_train[i]) if classify else None
                mm[1].metric("Prediction", ui.inert(name(pred)), delta=None if correct is None else ("correct" if correct else "wrong"),
                             delta_color="normal" if correct else "inverse", delta_arrow="off")
        with right:
            with ui.guard("Its gradient norm over training could not be computed"):
                own = norms_over_training(exp, i, fitted)
                ui.chart(plots.norm_over_training(t.steps, own, t.norms, clip_norm=clip_norm, name=f"example {i}"))
        with ui.guard("Its gradient norm over training could not be computed"):
            g = float(own[-1])
            kept = float(card.clip_factor([g], clip_norm)[0])
            rank = float(np.mean(t.norms[-1] <= g))
            tracin = float(np.sum(np.square(own.astype(np.float64))))
            mt = st.columns(4)
            mt[0].metric("Gradient norm ‖gᵢ‖", f"{g:.3g}", help=f"Larger than {rank:.0%} of the examples' (final model).")
            mt[1].metric(f"Clipped at C = {clip_norm:.3g}?", "no" if kept >= 1 else f"yes: ×{kept:.2f}",
                         help="min(1, C/‖gᵢ‖): the share of its gradient DP-SGD keeps.")
            mt[2].metric("TracIn self-influence", f"{tracin:.3g}",
                         help=f"Σₜ‖gᵢ(θₜ)‖² over {K} checkpoints; larger than {np.mean(t.tracin <= tracin):.0%} of the examples'.")
            mt[3].metric("Loss", f"{t.losses[j]:.3g}" if j is not None else "–")

        st.markdown("**As trained vs DP-SGD**: memorization and LiRA need models trained without it (the button above).")
        if exposure is not None:
            dp_cols = st.columns(2)
            for col, e, title in ((dp_cols[0], public, "As trained"),
                                  (dp_cols[1], private, f"DP-SGD at ε = {private.epsilon:g} (σ = {private.noise_multiplier:.2f}, C = {private.clip_norm:.3g})")):
                with col.container(border=True):
                    st.markdown(f"**{title}**")
                    em = st.columns(3)
                    em[0].metric("Memorization", f"{e.memorization[i]:+.2f}",
                                 help="P(correct | trained on it) − P(correct | not): 1 means only remembering gets it right.")
                    em[1].metric("LiRA score", f"{e.lira[i]:+.2f}",
                                 help=f"Higher: an attacker tells it was trained on. Above {np.mean(e.lira <= e.lira[i]):.0%} of the examples'.")
                    em[2].metric("Target model", "correct" if e.target_correct[i] else "wrong")

        st.markdown("**The test points it helps and hurts most** (grad-dot: ⟨∇ℓᵢ, ∇ℓ_test⟩ at the final model; a step on it "
                    "lowers the loss of those it helps)")
        with ui.guard("Its test points could not be scored"):
            order, scores = helps_and_hurts(exp, i, fitted)
            k = len(order) // 2
            if data.image_shape is not None:
                titles = [(f"{'helps' if r < k else 'hurts'} #{data.row(o, 'test')}", f"y={name(data.y_test[o])} {scores[o]:+.2g}")
                          for r, o in enumerate(order)]
                ui.chart(plots.image_grid(data.raw(data.x_test[order]), titles, cols=2 * k, image_shape=data.image_shape),
                         filename=f"example {i} helps and hurts")
            st.dataframe(pd.DataFrame({"": ["helps"] * k + ["hurts"] * k,
                                       **export.example_columns(data, order, split="test", features=4),
                                       "label": [name(data.y_test[o]) for o in order], "grad-dot": scores[order]}),
                         hide_index=True, width="stretch")

        one = full[full["example"] == i]
        if private is not None:
            one = one.assign(**{"memorization, DP-SGD": private.memorization[i], "LiRA score, DP-SGD": private.lira[i]})
        ui.download(f"gradlab_record_{exp.dataset}_example{i}", one, label="This card", key="record_card_download")

    # ------------------------------------------------------------------ the whole picture
    st.header("The whole picture")
    available = [q for q in card.QUANTITIES if q in full]
    corr = card.rank_correlations(full, available)
    strongest = card.strongest_relation(corr) or (available[0], available[-1])
    p1, p2 = st.columns(2)
    with p1:
        x_q = ui.control(st.selectbox, "x", available, index=available.index(strongest[0]), key="rec_x")
    with p2:
        y_q = ui.control(st.selectbox, "y", available, index=available.index(strongest[1]), key="rec_y")
    if exposure is None and classify:
        st.caption("Memorization and LiRA join the picture once the ensembles are trained (the button above).")
    sel = position.get(int(example)) if example is not None else None
    ids = {**export.example_columns(data, t.index, features=0), "label": full["label"].tolist()}
    rho = corr[((corr.x == x_q) & (corr.y == y_q)) | ((corr.x == y_q) & (corr.y == x_q))]
    title = f"{y_q} against {x_q}" + (f": Spearman ρ = {rho.ρ.iloc[0]:+.2f}" if len(rho) else "")
    ui.chart(plots.quantity_scatter(full[x_q].to_numpy(), full[y_q].to_numpy(), x_label=card.QUANTITIES[x_q],
                                    y_label=card.QUANTITIES[y_q], flipped=full["flipped label"].to_numpy(), ids=ids,
                                    selected=sel, title=title),
             on_select="rerun", selection_mode="points", key=PICK)
    st.caption(f"Every training example{'' if len(t.index) == n else f' of a fixed random {len(t.index):,} of {n:,}'}; "
               "click one to open its card. Red: the labels flipped on purpose (sidebar: label noise).")
    st.dataframe(corr.rename(columns={"ρ": "Spearman ρ", "low": "95% CI low", "high": "95% CI high"}), hide_index=True,
                 width="stretch", column_config={c: st.column_config.NumberColumn(format="%.2f")
                                                 for c in ("Spearman ρ", "95% CI low", "95% CI high")})
    ui.download(f"gradlab_record_{exp.dataset}_all", full, label="Every example's quantities", key="record_all_download")
