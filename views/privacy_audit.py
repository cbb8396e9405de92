"""Privacy audit: what ε means. Membership inference against a non-private and a DP-SGD model, and an
audit of gradlab's own DP-SGD with canaries (and planted bugs to catch)."""

import numpy as np
import pandas as pd
import streamlit as st

from gradlab import audit, costs, engine, export, membership, privacy, ui
from gradlab.experiment import init_model
from gradlab.train import OPTIMIZERS
from gradlab.ui import audit as audit_ui
from gradlab.ui.figures import audit_plots, plots

st.title("Privacy audit: what ε means")
ui.intro(
    "An accountant says DP-SGD spent **ε**. What does that protect against? A **membership-inference** attack "
    "guesses whether an example was in the training set; (ε, δ)-DP promises that *no* attack does better than "
    "TPR ≤ e^ε·FPR + δ.",
    "The top half attacks a model trained without privacy and one trained with DP-SGD, on the same "
    "small pool of data, with the loss-threshold attack (Yeom et al. 2018) and offline LiRA (Carlini et al. 2022). "
    "The bottom half turns the question around: it **audits gradlab's own DP-SGD** with canaries, measuring a "
    "lower bound on the ε the code really spends (Nasr et al. 2021, 2023) — and catches planted bugs."
)

ui.terms("ε and δ", "noise multiplier σ", "sampling rate q", "RDP", "PLD", "LiRA", "canary")
exp = ui.experiment()
fitted = ui.fitted(exp)
data = fitted.data

# ------------------------------------------------------------------ membership inference
st.header("Membership inference: non-private vs DP-SGD")
if not fitted.trainable:  # a served model without init_fn: the attack trains its target and shadows from one
    ui.needs_training_loop("Membership inference")
else:
    with st.expander("How the attack works"):
        st.markdown(
            "A pool of training examples is split at random: the **target** model trains on one half (the members), the "
            "other half are non-members. Shadow models train on other random halves with the same procedure; for each "
            "example, the shadows that left it out say how confident a model is on it *without* having seen it, and LiRA "
            "scores how far the target sits above that. Both models use the sidebar's model, the same batches and optimizer "
            "(the DP clipping page's DP-SGD settings); a small pool and many steps make the non-private model memorize."
        )
    controls, promise = st.columns([3, 2])  # the promise (what ε allows) beside the settings that spend it
    with controls:
        left, right = st.columns(2)
    with left:
        pool = ui.control(st.number_input, "Pool size (members + non-members)", value=int(min(256, len(data.y_train))), min_value=8,
                          max_value=int(len(data.y_train)), step=64, key="mia_pool",
                          help="The first examples of the training split; half of them train the target.")
        shadows = ui.control(st.number_input, "Shadow models per procedure", value=4, min_value=2, max_value=16, step=2, key="mia_shadows",
                             help="More shadows calibrate LiRA better and take longer.")
    with right:
        q = ui.control(st.number_input, "Sampling rate q", value=0.5, min_value=0.01, max_value=1.0, step=0.05, format="%.3f", key="mia_q")
        steps = ui.control(st.number_input, "Training steps T", value=200, min_value=1, max_value=2000, step=50, key="mia_steps")
    with left:
        c_dp = ui.control(st.number_input, "Clipping norm C", value=1.0, format="%.4g", step=0.1, key="mia_c")
        eps_target = ui.control(st.number_input, "Target ε (σ calibrated, RDP)", value=4.0, min_value=0.1, step=0.5, key="mia_eps",
                                help="σ is chosen so the whole DP-SGD run spends this ε at δ.")
    with right:
        optimizer = ui.choice(st.selectbox, "Optimizer (optax)", OPTIMIZERS, "mia_opt")
        lr = ui.control(st.select_slider, "Learning rate", options=[0.001, 0.003, 0.01, 0.03, 0.1, 0.3], value=0.01, key="mia_lr")
    delta = 1e-5


    @ui.shared(gated=False)
    def calibrated_sigma(eps, q, steps, delta):
        return privacy.noise_multiplier_for_epsilon(target_epsilon=eps, sample_rate=q, steps=steps, delta=delta)


    def attack_cost(exp, pool, q, steps, c, sigma, optimizer, lr, shadows, _fitted):
        return costs.attack_seconds(engine.num_params(_fitted.model), pool=pool, sample_rate=q, steps=steps, shadows=shadows)


    @ui.shared(label="Training target and shadow models", cost=attack_cost)
    def attack(exp, pool, q, steps, c, sigma, optimizer, lr, shadows, _fitted, progress):
        """Membership inference on both procedures, shared by sessions (keyed on every setting)."""
        d = _fitted.data
        return membership.private_vs_nonprivate(
            init_model(exp, d), _fitted.loss_fn, d.x_train[:pool], d.y_train[:pool], sample_rate=q, noise_multiplier=sigma,
            clip_norm=c, optimizer=optimizer, lr=lr, steps=steps, n_shadows=shadows, seed=exp.seed,
            progress=lambda f: progress(f, f"{f:.0%}"), predict_fn=_fitted.predict_fn)


    results = None
    with ui.guard("Membership inference could not run with these settings"):
        if data.task != "classification":
            raise ValueError("membership inference here scores class confidences: choose a classification dataset in the sidebar")
        q = privacy.check_sample_rate(q)
        c_dp = privacy.check_clip_norm(c_dp)
        with st.spinner("Calibrating σ with dp-accounting…"):
            sigma = calibrated_sigma(float(eps_target), q, int(steps), delta)
        eps = privacy.dp_sgd_epsilon(sample_rate=q, noise_multiplier=sigma, steps=int(steps), delta=delta)
        with promise, ui.half_column():
            ui.chart(audit_plots.roc_loglog({}, epsilon=eps, delta=delta, floor=1 / (int(pool) - int(pool) // 2), height=360,
                                            title=f"What ε = {eps:.2f} allows any membership attack",
                                            axes=("FPR: non-members called members", "TPR: members found")))
        st.caption(f"σ = **{sigma:.3f}** · members = **{int(pool) // 2}** · expected batch **{q * int(pool) / 2:.0f}** · "
                   f"{2 * (int(shadows) + 1)} models to train · DP-SGD spends ε = **{eps:.2f}** at δ = {delta:g} (RDP).")
        args = (exp, int(pool), q, int(steps), c_dp, float(sigma), optimizer, float(lr), int(shadows), fitted)
        fits = costs.largest(range(50, int(steps) + 1, 50), lambda t: attack_cost(*args[:3], t, *args[4:]))
        results = ui.on_request(attack, *args, name="mia", button="Run the membership attack",
                                fix=f"Use at most {fits} training steps, fewer shadow models or a smaller pool." if fits
                                else "Use fewer shadow models or a smaller pool.")

    if results is not None:
        pub, priv = results["non-private"], results["DP-SGD"]
        m = st.columns(5)
        m[0].metric("LiRA AUC, non-private", f"{pub.rocs['lira'].auc:.3f}")
        m[1].metric("LiRA AUC, DP-SGD", f"{priv.rocs['lira'].auc:.3f}", delta=f"{priv.rocs['lira'].auc - pub.rocs['lira'].auc:+.3f}",
                    delta_color="inverse", help="0.5 is a coin flip.")
        m[2].metric("TPR at 1% FPR, non-private", f"{pub.rocs['lira'].tpr_at_1:.1%}")
        m[3].metric("TPR at 1% FPR, DP-SGD", f"{priv.rocs['lira'].tpr_at_1:.1%}",
                    delta=f"{(priv.rocs['lira'].tpr_at_1 - pub.rocs['lira'].tpr_at_1) * 100:+.1f} pts", delta_color="inverse",
                    help=f"The DP bound allows at most {membership.dp_roc_bound(0.01, eps, delta):.1%} at ε = {eps:.2f}.")
        m[4].metric("Accuracy gap (pts)", f"{(pub.train_accuracy - pub.test_accuracy) * 100:.0f} → "
                    f"{(priv.train_accuracy - priv.test_accuracy) * 100:.0f}",
                    help="Train minus test accuracy, non-private → DP-SGD: how much each model memorized.")
        curves = {f"{name}, {membership.ATTACKS[k].split(' (')[0]}": (r.rocs[k].fpr, r.rocs[k].tpr, r.rocs[k].auc)
                  for name, r in results.items() for k in ("lira", "loss")}
        n_out = int((~pub.is_member).sum())
        ui.chart(audit_plots.roc_loglog(curves, epsilon=eps, delta=delta, floor=1 / n_out))
        st.caption(f"With {n_out} non-members the smallest FPR that can be measured is 1/{n_out} = {1 / n_out:.1%}: the axis "
                   "starts there (an FPR of 0 is drawn at it). The black line bounds every attack on the DP-SGD model.")
        table = pd.DataFrame([dict(model=name, attack=membership.ATTACKS[k], AUC=r.rocs[k].auc, **{"TPR at 1% FPR": r.rocs[k].tpr_at_1,
                              "TPR at 0.1% FPR": r.rocs[k].tpr_at_01, "train accuracy": r.train_accuracy,
                              "test accuracy": r.test_accuracy}) for name, r in results.items() for k in membership.ATTACKS])
        st.dataframe(table, hide_index=True, width="stretch")
        ui.download("membership_inference", table, key="mia_download")

        st.subheader("The most exposed members")
        top = np.argsort(-np.where(pub.is_member, pub.scores["lira"], -np.inf))[:8]
        titles = [f"#{data.row(i)} LiRA {pub.scores['lira'][i]:.1f} → {priv.scores['lira'][i]:.1f}" for i in top]
        if data.image_shape is not None:
            ui.chart(plots.image_grid(data.raw(data.x_train[top]), titles, cols=8, image_shape=data.image_shape),
                     filename="most exposed members")
        exposed = ui.dataframe(pd.DataFrame({**export.example_columns(data, top), "label": [data.class_names[int(data.y_train[i])] for i in top],
                                   "LiRA score, non-private": pub.scores["lira"][top], "LiRA score, DP-SGD": priv.scores["lira"][top],
                                   "loss, non-private": pub.losses[top], "loss, DP-SGD": priv.losses[top]}), hide_index=True,
                               on_select="rerun", selection_mode="single-row", key="mia_card_pick")
        st.caption("Members the non-private model is most confident on compared with shadow models that never saw them: "
                   "the examples it memorized. Their LiRA score under DP-SGD (after →) shows what the noise hides. "
                   "Select one to open its record card.")
        if (exposed_row := ui.selected_row(exposed)) is not None:
            ui.open_card(top[exposed_row])

# ------------------------------------------------------------------ the audit
st.header("Auditing gradlab's DP-SGD")
st.markdown(
    "A **canary** is an example planted in the training set. Each trial flips a coin to put it in or leave it out, "
    "trains with gradlab's real `train_dp_sgd`, and the auditor looks at the trained parameters. The **gradient "
    "canary** (white box) has a loss whose gradient points at one parameter only, with norm above C: clipping cuts "
    "it to exactly C, so the parameter moves by C plus Gaussian noise with std σ·C — the worst case the accountant "
    "assumes. The **input canary** is a mislabeled outlier seen through the model's output. Over many trials a "
    "threshold test gets a false positive and a true positive rate; with Clopper–Pearson intervals they give an ε "
    "that the code *must* spend with 95% confidence. Above the accountant's ε means a bug. Two more estimators read "
    "the whole trade-off between the two rates against the **Gaussian** curve full-batch DP-SGD follows: a "
    "**Gaussian-DP** fit of μ (Nasr et al. 2023) and a one-run **f-DP** test (Mahloujifar et al. 2024)."
)
a1, a2, a3, a4 = st.columns(4)
with a1:
    sigma_a = ui.control(st.number_input, "Noise multiplier σ", **audit_ui.CONTROLS["audit_sigma"], step=0.5,
                         key="audit_sigma")
    steps_a = ui.control(st.number_input, "Steps T", **audit_ui.CONTROLS["audit_steps"], key="audit_steps")
with a2:
    q_a = ui.control(st.number_input, "Sampling rate q", **audit_ui.CONTROLS["audit_q"], step=0.1, format="%.2f",
                     key="audit_q", help="1 = full batch (the tightest audit).")
    c_a = ui.control(st.number_input, "Clipping norm C", **audit_ui.CONTROLS["audit_c"], step=0.5, format="%.3g",
                     key="audit_c", help="'Noise not scaled by C' only shows for C > 1.")
with a3:
    trials = ui.control(st.select_slider, "Trials", **audit_ui.CONTROLS["audit_trials"], key="audit_trials",
                        help="Each trial is one training run's worth of canary; 2048 run at once.")
    canary = ui.choice(st.radio, "Canary", audit.CANARIES, "audit_canary", horizontal=True)
with a4:
    bug = ui.control(st.selectbox, "Spot the bug: plant one", [audit_ui.NO_BUG] + list(audit.BUGS), key="audit_bug",
                     help="A mistake real DP-SGD code has shipped, planted in the DP-SGD step.")
bug = None if bug == audit_ui.NO_BUG else bug
if bug:
    st.info(f"**Planted bug: {bug}.** {audit.BUGS[bug].description}")


res = None
with ui.guard("The audit could not run with these settings"):
    audit_args = audit_ui.arguments(sigma_a, steps_a, q_a, c_a, trials, canary, bug)
    res = audit_ui.result(audit_args)  # the same shared computation the canary's record card opens
if res is not None:
    m = st.columns(len(res.estimates) + 2)
    m[0].metric("Accountant's ε (PLD)", f"{res.epsilon_claimed:.2f}", help=f"dp-accounting, δ = {res.delta:g}")
    for col, (name, e) in zip(m[1:], res.estimates.items()):
        col.metric(f"ε lower bound, {name} ({res.confidence:.0%})", f"{e:.2f}", help=audit.ESTIMATORS[name].reference,
                   delta=f"{e / res.epsilon_claimed:.0%} of claimed", delta_color="off", delta_arrow="off")
    m[-1].metric("Trials", f"{res.trials:,}")
    best = res.tightest
    st.markdown(f"**{best}** is the tightest here ({res.estimates[best]:.2f}, {res.estimates[best] / res.epsilon_claimed:.0%} "
                f"of the claimed {res.epsilon_claimed:.2f}): {audit.ESTIMATORS[best].why}.")
    if not res.gaussian:
        st.caption("With q < 1 the trade-off of subsampled DP-SGD is not Gaussian: the Gaussian-DP and f-DP numbers are "
                   "estimates, not bounds, and they do not decide the verdict below.")
    if res.caught:
        st.error(f"**The audit caught a bug:** with 95% confidence this code spends ε ≥ {max(res.estimates[n] for n in res.caught):.2f} "
                 f"({', '.join(res.caught)}), more than the {res.epsilon_claimed:.2f} the accountant reports.",
                 icon=":material/bug_report:")
    else:
        st.success(f"No violation: every lower bound stays below the claimed {res.epsilon_claimed:.2f}."
                   + ("" if bug else " (An audit can only show a bug, never prove there is none.)"))
    st.dataframe(pd.DataFrame([dict(estimator=name, **{"ε lower bound": res.estimates[name],
                                                      "of claimed ε": res.estimates[name] / res.epsilon_claimed,
                                                      "confidence": res.confidence, "holds if": e.assumes,
                                                      "paper": e.reference}) for name, e in audit.ESTIMATORS.items()]),
                 hide_index=True, width="stretch", column_config={"of claimed ε": st.column_config.NumberColumn(format="percent")})
    left, right = st.columns(2)
    with left, ui.half_column():
        ui.chart(audit_plots.epsilon_vs_trials(res.trials_curve, res.curves, res.epsilon_claimed, confidence=res.confidence))
    with right, ui.half_column():
        ui.chart(audit_plots.observation_histogram(res.scores, res.is_in, res.threshold,
                                                   xlabel=audit_plots.OBSERVATION[res.canary]))
    st.caption("Each point of the left curve is a 95% bound on its own. Clopper–Pearson: a quarter of the trials picks "
               "the threshold, the other three quarters measure FPR and TPR, so the bound is honest about the choice. "
               f"Gaussian DP: μ ≥ {res.mu_lower:.3f} at 95% (full batch, μ = √T/σ = "
               f"{np.sqrt(res.steps) / res.noise_multiplier:.3f}), Bonferroni over the thresholds of the ROC's hull.")

    # the canary opens its record card as members open theirs: the link carries the audit's settings
    ui.canary_link(audit_ui.link(audit_args))
    few = np.sort(np.r_[np.flatnonzero(res.is_in)[:4], np.flatnonzero(~res.is_in)[:4]])  # a few trials of each world
    guessed = res.guesses[few]
    picked = st.dataframe(pd.DataFrame({"trial": few, "canary": np.where(res.is_in[few], "in", "out"),
                                        "observation": res.scores[few], "test guessed": np.where(guessed, "in", "out"),
                                        "right?": np.where(guessed == res.is_in[few], "yes", "no")}),
                          hide_index=True, on_select="rerun", selection_mode="single-row", key="audit_card_pick")
    st.caption("A few trials: whether the coin put the canary in, what the auditor observed and what the threshold test "
               "guessed. Select one to open the canary's record at that trial.")
    if (trial_row := ui.selected_row(picked)) is not None and 0 <= trial_row < len(few):
        ui.open_canary(int(few[trial_row]))

ui.code_panel(
    """
import jax, jax.numpy as jnp, numpy as np, optax, sklearn.metrics
from scipy import optimize, stats
from gradlab.audit import roc_hull
from gradlab.train import train_dp_sgd

# R trials in one run: parameter θ[r] belongs to trial r; the canary's loss 10·C·θ[r] has a Dirac gradient
def loss(params, x, y):                       # x = [block r], y = 10·C (canary), 0 (canary left out), −2·C (anchor)
    return y * params["theta"][x[0].astype(jnp.int32)]

xs = jnp.repeat(jnp.arange(R, dtype=jnp.float32), 2)[:, None]                  # examples 2r, 2r+1 in block r
ys = jnp.stack([jnp.where(is_in, 10.0 * C, 0.0), jnp.full(R, -2.0 * C)], 1).ravel()
N = len(ys)
run = train_dp_sgd({"theta": jnp.zeros(R)}, loss, xs, ys, sample_rate=q, noise_multiplier=sigma, clip_norm=C,
                   optimizer=optax.sgd(1.0), steps=T, checkpoint_every=T, seed=seed)  # the real DP-SGD step
score = -np.asarray(run.final["theta"]) * q * N / C   # ~ N(0, Tσ²) with the canary, N(−T, Tσ²) without (q = 1)

# a quarter of the trials picks the threshold t and its direction; on the rest, Clopper–Pearson at 97.5% each:
test = np.arange(R) % 4 != 0
guess, member = direction * score[test] >= direction * t, is_in[test]
fp, n_out = np.sum(guess & ~member), np.sum(~member)
tp, n_in = np.sum(guess & member), np.sum(member)
fpr_hi = stats.beta.ppf(0.975, fp + 1, n_out - fp)
tpr_lo = stats.beta.ppf(0.025, tp, n_in - tp + 1)
eps_lower = max(0.0, np.log((tpr_lo - delta) / fpr_hi), np.log((1 - fpr_hi - delta) / (1 - tpr_lo)))

# Gaussian DP (Nasr et al. 2023): μ-GDP means FNR ≥ Φ(Φ⁻¹(1 − FPR) − μ) for every test, so Clopper–Pearson upper
# bounds on FPR and FNR at the thresholds of the ROC's concave hull (Bonferroni over them) force μ ≥ …
_, fn, tn = roc_hull(score, is_in)                        # false negatives and true negatives per hull threshold
n_in, n_out = is_in.sum(), (~is_in).sum()
a = 0.05 / (2 * len(fn))
fnr_hi = stats.beta.ppf(1 - a, fn + 1, n_in - fn)         # nan where a rate is 1: that threshold says nothing
fpr_hi = stats.beta.ppf(1 - a, n_out - tn + 1, tn)
mu_lower = max(0.0, np.nanmax(stats.norm.isf(fpr_hi) - stats.norm.ppf(fnr_hi)))
# … and μ-GDP gives (ε, δ) with δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) (Dong, Roth & Su 2019, Cor. 2.13)
gdp_delta = lambda e: stats.norm.cdf(-e / mu_lower + mu_lower / 2) - np.exp(e) * stats.norm.cdf(-e / mu_lower - mu_lower / 2)
eps_gdp = optimize.brentq(lambda e: gdp_delta(e) - delta, 0.0, 100.0)

# membership inference (offline LiRA, Carlini et al. 2022): φ = log p_y − log(1 − p_y) of each pool example
# under the target model and under S shadow models; μ_out: its mean over the shadows trained without it
def phi(logits, y):                                                          # (N, K), (N,) -> (N,)
    own = jnp.take_along_axis(logits, y[:, None], 1)[:, 0]
    return own - jax.nn.logsumexp(jnp.where(jax.nn.one_hot(y, logits.shape[1]) > 0, -jnp.inf, logits), axis=1)

out = ~shadow_in                                                             # (S, N)
phi_out = np.asarray(jax.vmap(phi, (0, None))(shadow_logits, labels))        # (S, N)
mu_out = (phi_out * out).sum(0) / out.sum(0)
s = np.sqrt(np.sum(((phi_out - mu_out) * out) ** 2) / (out.sum() - 1))      # one pooled std
lira = (np.asarray(phi(target_logits, labels)) - mu_out) / s                 # high: member
loss_attack = -target_losses                                                 # Yeom et al. 2018: low loss, member
fpr, tpr, _ = sklearn.metrics.roc_curve(is_member, lira)
bound = np.clip(np.minimum(np.exp(eps) * fpr + delta, 1 - np.exp(-eps) * (1 - delta - fpr)), 0, 1)  # no attack beats it
"""
)
