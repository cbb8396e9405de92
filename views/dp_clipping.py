"""DP clipping: what per-example clipping does to the real per-example gradients of the current
model (norms, bias, per class, noise), and DP-SGD training with ε from Google's dp-accounting."""

import dataclasses
import math

import numpy as np
import pandas as pd
import streamlit as st

from gradlab import clipping, costs, engine, memory, privacy, ui
from gradlab.experiment import DP_SGD_DEFAULTS, init_model
from gradlab.summary import subset
from gradlab.train import OPTIMIZERS, dp_buffer_size, train_dp_sgd
from gradlab.ui.figures import plots

st.title("DP clipping")
ui.intro(
    "**DP-SGD** (Abadi et al. 2016) makes training differentially private in three moves: clip every "
    "per-example gradient gᵢ to norm at most **C**, add Gaussian noise of std **σ·C** to their sum, and "
    "count the privacy spent with an accountant.",
    "The top half shows what clipping does to *this* model's "
    "real per-example gradients at a checkpoint: how many are clipped, how far the clipped mean gradient $\\bar G_C$ "
    "drifts from the true mean G (the **bias**), which classes pay most (Bagdasaryan et al. 2019), and how "
    "the noise compares with the signal. The bottom half trains a private and a non-private model side by "
    "side, with ε from Google's `dp-accounting`."
)

ui.terms("per-example gradient", "clipping norm C", "noise multiplier σ", "sampling rate q", "ε and δ", "RDP", "PLD")
exp = ui.experiment()
fitted = ui.fitted(exp)
data = fitted.data
classify = data.task == "classification"
n_train = len(data.y_train)


@ui.shared(label="Computing per-example gradient norms")
def norms_at(exp, checkpoint, size, _fitted):
    """The norms of `size` training examples (the Gradient norms page's subset when all would pass the budget)."""
    model, d = _fitted.run.checkpoints[checkpoint], _fitted.data
    rows = subset(len(d.y_train), size)
    return np.asarray(engine.per_example_norms(_fitted.loss_fn, model, d.x_train[rows], d.y_train[rows]))


@ui.shared(label="Clipping every example")
def analysis_at(exp, checkpoint, clip_norm, _fitted):
    d = _fitted.data
    labels = d.y_train if d.task == "classification" else None
    return clipping.clipping_analysis(_fitted.loss_fn, _fitted.run.checkpoints[checkpoint], d.x_train, d.y_train,
                                      clip_norm, labels=labels, n_classes=d.n_classes if labels is not None else None)


# ------------------------------------------------------------------ clipping at a checkpoint
st.header("Clipping at a checkpoint")
with ui.point_controls("dp_per_class"):  # beside its figure where a lecture step moved it (gradlab.ui.points.controls)
    c1, c2, c3, c4 = st.columns([3, 1.3, 1.3, 1.3])
    with c1:
        ckpt = ui.checkpoint_picker(fitted, key="dp_clip_checkpoint")
    norms = norms_at(exp, ckpt, ui.summary_size(exp, fitted), fitted)
    median = float(np.median(norms))
    if len(norms) < n_train:
        st.caption(f"The median norm is that of {len(norms):,} of the {n_train:,} training examples (a fixed random "
                   "subset, as on Gradient norms): all of them would pass what a shared link may compute.")
    with c2:
        c_in = ui.control(st.number_input,
            "Clipping norm C", value=None, min_value=1e-12, format="%.4g", placeholder=f"{median:.2g}", key="dp_clip_c",  # a number fits
            help=f"Empty: the median per-example gradient norm at this checkpoint, {median:.4g} (Abadi et al. 2016's advice).")
    with c3:
        sigma_a = ui.control(st.number_input, "Noise multiplier σ", value=1.0, step=0.1, format="%.3g", key="dp_clip_sigma",
                             help="The noise added to the clipped sum has std σ·C.")
    with c4:
        batch_a = ui.control(st.number_input, "Batch size B", value=int(min(256, n_train)), step=32, key="dp_clip_batch",
                             help="The noise on the averaged gradient has std σ·C/B per coordinate.")
    log = ui.control(st.toggle, "Log-scale norms", value=True, key="dp_clip_log",
                     help="Per-example norms of a trained model are heavy-tailed: log₁₀ shows both the bulk and the tail.")
clip_norm = median if c_in is None else float(c_in)

with ui.guard("The clipping analysis could not be computed"):
    privacy.check_clip_norm(clip_norm)
    refused = None  # the work budget's refusal (a model too large for the analysis), said as a warning, not an error
    if not analysis_at.stored(exp, ckpt, clip_norm, None):
        passes = clipping.analysis_passes(fitted.model, n_train, data.n_classes if classify else 0)
        macs = ui.macs(exp)  # 0 for a served model: its forward is the user's own, run locally
        try:
            costs.check_work(costs.clipping_seconds(engine.num_params(fitted.model), n_train, passes, macs),
                             f"clipping all {n_train:,} examples at {passes} weighted backward passes",
                             "Pick a smaller model in the sidebar for this analysis; DP-SGD training below works on this one.")
        except ValueError as err:
            refused = str(err)
    if refused is not None:
        st.warning(f"**Not computed for this model**: {refused}", icon=":material/hourglass_disabled:")
    else:
        with st.spinner("Streaming per-example gradients for every C on the grid…"):
            a = analysis_at(exp, ckpt, clip_norm, fitted)
        i = a.index
        left, right = st.columns(2)
        with left, ui.half_column():
            ui.chart(plots.clipping_histograms(a.norms, a.clipped_norms, clip_norm, log=log), width="stretch")
        with right, ui.half_column():
            ui.chart(plots.clipping_bias_curve(a.grid, a.cosine, a.norm_ratio, clip_norm, cosine_layer=a.cosine_layer,
                                                      norm_ratio_layer=a.norm_ratio_layer, fraction_clipped=a.fraction_clipped),
                            width="stretch")
        m = st.columns(5)
        m[0].metric("Clipping norm C", f"{clip_norm:.3g}", help="Median per-example norm" if c_in is None else "Set by hand")
        m[1].metric("Fraction clipped", f"{a.fraction_clipped[i]:.1%}", help="Share of examples with ‖gᵢ‖ > C.")
        m[2].metric("cos∠(clipped mean, mean)", f"{a.cosine[i]:.3f}", help="1: clipping keeps the direction of the mean gradient.")
        m[3].metric("‖clipped mean‖ / ‖mean‖", f"{a.norm_ratio[i]:.3f}", help="How much clipping shrinks the mean gradient.")
        m[4].metric("Per-layer: cos, fraction", f"{a.cosine_layer[i]:.3f}, {a.fraction_clipped_layer[i]:.0%}",
                    help="Per-layer clipping: each of the L parameter leaves clipped to C/√L (McMahan et al. 2017).")
        st.caption(
            "Flat clipping (solid) scales the whole gradient of an example; per-layer clipping (dashed) clips each of the "
            f"{len(a.layer_norms)} parameter leaves to C/√{len(a.layer_norms)} separately: same total sensitivity C, "
            "same noise, but a different bias."
        )

        if classify:
            with ui.point("dp_per_class"):  # a lecture step opens on this block (gradlab.ui.points)
                st.subheader("Per class: clipping hits rare and hard classes hardest")
                ui.chart(plots.per_class_clipping(data.class_names, a.class_fraction_clipped, a.class_cosine,
                                                         a.class_norm_ratio, clip_norm), width="stretch")
                worst = int(np.nanargmin(a.class_norm_ratio))
                st.markdown(f"Class **{ui.inert(data.class_names[worst])}** loses most: its clipped mean gradient keeps "
                            f"{a.class_norm_ratio[worst]:.0%} of its norm ({a.class_fraction_clipped[worst]:.0%} of its examples clipped).")

        st.subheader("Noise against signal")
        with ui.guard("The signal-to-noise comparison could not be computed"):
            snr = clipping.signal_to_noise(a, sigma_a, batch_a)
            grid_noise = privacy.check_noise_multiplier(sigma_a) * a.grid / batch_a
            s = st.columns(4)
            s[0].metric("Noise std per coordinate σC/B", f"{snr.noise_std:.3g}")
            s[1].metric("Noise norm σC√P/B", f"{snr.noise_norm:.3g}", help=f"P = {a.num_params:,} parameters.")
            s[2].metric("Signal ‖clipped mean‖", f"{snr.signal_norm:.3g}")
            s[3].metric("Signal / noise", f"{snr.ratio:.2f}" if np.isfinite(snr.ratio) else "∞",
                        help="Below 1 a single step is mostly noise; only averaging over many steps recovers the signal.")
            ui.chart(plots.signal_noise_curve(a.grid, a.norm_ratio * a.mean_norm, grid_noise * math.sqrt(a.num_params),
                                                     clip_norm, noise_std=grid_noise), width="stretch")
            st.caption("Raising C lets more signal through, but the noise grows in proportion to C: the best C balances "
                       "the clipping bias against the noise.")

# ------------------------------------------------------------------ DP-SGD
st.header("DP-SGD: a private and a non-private model side by side")
if fitted.trainable:  # a served model trains from its module's init_fn, or not at all
    st.markdown(
        f"Batches are drawn by **Poisson sampling**: each of the N = {n_train:,} training examples joins a batch "
        "independently with probability q, so the batch size varies around qN. This is the sampling the accountant "
        "assumes (shuffled fixed-size batches would need another analysis). The non-private run uses the same model, "
        "optimizer and sampled batches, without clipping or noise. Features were standardized with the training "
        "set's mean and std, which this demo does not count against the privacy budget."
    )

    PRESET = dict(dataset="digits", model="linear", dp_sgd_q=round(512 / 1437, 4), dp_sgd_steps=200, dp_sgd_c=0.5,
                  dp_sgd_opt="adam", dp_sgd_lr=0.02, dp_sgd_mode="epsilon", dp_sgd_eps=3.0, dp_sgd_delta=1e-5,
                  dp_sgd_accountant="rdp", dp_sgd_seed=0)
    LRS = [0.001, 0.003, 0.01, 0.02, 0.05, 0.1, 0.3, 1.0, 3.0]


    def _preset():
        st.session_state.update(PRESET)
        st.session_state["_dp_sgd_go"] = True


    st.button("Preset: ≥ 90% test accuracy on digits at ε ≤ 3 (δ = 1e-5)", on_click=_preset, key="dp_sgd_preset",
              help="Softmax regression, expected batch 512 (q = 512/N), 200 steps of Adam (lr 0.02), C = 0.5, σ calibrated "
                   "so the whole run spends ε = 3 (RDP accountant). Switches the sidebar to digits + linear.")
    dp = {"expected_batch": 256, "steps": 200, "lr": 0.02, **DP_SGD_DEFAULTS.get(exp.model, {})}  # this model's start
    NOISE_MODES = {"epsilon": "σ calibrated to spend the target ε", "sigma": "σ set by hand"}
    with ui.point_controls("dp_sgd"):  # beside its figure where a lecture step moved it (gradlab.ui.points.controls)
        d1, d2, d3, d4 = st.columns(4)
        with d1:
            q = ui.control(st.number_input, "Sampling rate q", value=round(min(1.0, dp["expected_batch"] / n_train), 4),
                           format="%.4f", step=0.01, key="dp_sgd_q", help="Probability that an example joins a batch: q ∈ (0, 1].")
            steps = ui.control(st.number_input, "Training steps T", value=dp["steps"], min_value=1, max_value=5000, step=50,
                               key="dp_sgd_steps")
        with d2:
            c_dp = ui.control(st.number_input, "Clipping norm C", value=1.0, format="%.4g", step=0.1, key="dp_sgd_c")
            optimizer = ui.choice(st.selectbox, "Optimizer (optax)", OPTIMIZERS, "dp_sgd_opt")
        with d3:
            mode = ui.choice(st.radio, "Noise", NOISE_MODES, "dp_sgd_mode", horizontal=True)
            if mode == "epsilon":
                eps_target = ui.control(st.number_input, "Target ε", value=3.0, step=0.5, key="dp_sgd_eps")
                sigma_in = None
            else:
                sigma_in = ui.control(st.number_input, "Noise multiplier σ", value=1.0, step=0.1, key="dp_sgd_sigma")
                eps_target = None
            lr = ui.control(st.select_slider, "Learning rate", options=LRS, value=dp["lr"], key="dp_sgd_lr")
        with d4:
            delta = ui.control(st.number_input, "δ", value=1e-5, format="%.1e", step=1e-6, key="dp_sgd_delta",
                               help=f"Default below 1/N = {1 / n_train:.1e}.")
            accountant = ui.choice(st.radio, "Accountant", privacy.ACCOUNTANTS, "dp_sgd_accountant", horizontal=True)
            seed = ui.control(st.number_input, "Seed", value=0, min_value=0, max_value=10_000, key="dp_sgd_seed")


    def dp_sgd_cost(fitted, q, steps, *_):
        return 2 * costs.dp_sgd_seconds(engine.num_params(fitted.model), steps, q * len(fitted.data.y_train),
                                        ui.macs(fitted.experiment))


    @ui.shared(label="Training the DP-SGD model, then the non-private one", cost=dp_sgd_cost)
    def dp_sgd_comparison(fitted, q, steps, c_dp, sigma, optimizer, lr, delta, accountant, seed, every, progress):
        """A DP-SGD run and its non-private twin, shared by sessions: keyed on the complete experiment
        (`fitted`, an upload by the hash of its bytes) and every setting of this section."""
        data = fitted.data
        n_train = len(data.y_train)
        model0 = init_model(fitted.experiment, data)
        p, d = engine.num_params(model0), data.n_features
        kept = memory.n_checkpoints(steps, every)  # one run's checkpoints at a time
        memory.check(f"DP-SGD with a batch buffer of {dp_buffer_size(n_train, q):,} examples",
                     memory.dp_sgd_bytes(n_train, q, p, n_features=d, checkpoints=kept),
                     memory.dp_sgd_fix(n_train, p, n_features=d))
        common = dict(sample_rate=q, optimizer=optimizer, lr=lr, steps=steps, seed=seed, checkpoint_every=every,
                      delta=delta, accountant=accountant)
        evals = {}

        def evaluated(name, run):
            """The run without its models once each checkpoint's test accuracy is taken: the next run has the memory."""
            evals[name] = [privacy.accuracy_by_class(cp, data.x_test, data.y_test, data.n_classes, fitted.predict_fn)
                           for cp in run.checkpoints]
            return dataclasses.replace(run, checkpoints=())

        private = evaluated("private", train_dp_sgd(
            model0, fitted.loss_fn, data.x_train, data.y_train, noise_multiplier=sigma, clip_norm=c_dp,
            progress=lambda s, t: progress(s / (2 * t), f"DP-SGD step {s} of {t}"), **common))
        public = evaluated("public", train_dp_sgd(
            model0, fitted.loss_fn, data.x_train, data.y_train, noise_multiplier=0.0, clip_norm=math.inf,
            progress=lambda s, t: progress((t + s) / (2 * t), f"non-private step {s} of {t}"), **common))
        return dict(private=private, public=public, evals=evals)


    @ui.shared(gated=False)
    def planned_epsilons(q, sigma, steps, delta, accountant):
        """ε after each of ~10 step counts up to `steps`: what the run will spend, known before it trains."""
        at = np.unique(np.linspace(0, steps, 11).round().astype(int))
        return at, privacy.dp_sgd_epsilons(sample_rate=q, noise_multiplier=sigma, steps=at.tolist(), delta=delta,
                                           accountant=accountant)


    @ui.shared(gated=False)
    def calibrated_sigma(eps, q, steps, delta, accountant):
        return privacy.noise_multiplier_for_epsilon(target_epsilon=eps, sample_rate=q, steps=steps, delta=delta,
                                                    accountant=accountant)


    settings_ok = False
    with ui.guard("These DP-SGD settings cannot work"):
        if not classify:
            raise ValueError("DP-SGD on this page reports test accuracy: choose a classification dataset in the sidebar")
        q = privacy.check_sample_rate(q)
        c_dp = privacy.check_clip_norm(c_dp)
        delta = privacy.check_delta(delta)
        if delta >= 1 / n_train:
            st.warning(f"δ = {delta:g} is not below 1/N = {1 / n_train:.1e}: a mechanism that publishes one random "
                       "example outright would meet it. Choose a smaller δ.")
        if sigma_in is not None:
            sigma = privacy.check_noise_multiplier(sigma_in)
        else:
            with st.spinner("Calibrating σ with dp-accounting…"):
                sigma = calibrated_sigma(float(eps_target), q, int(steps), delta, accountant)
        settings_ok = True

    if settings_ok:
        # about 10 checkpoints (the accuracy and ε curves), fewer where they would not fit the memory budget
        every = memory.dp_checkpoint_every(n_train, q, engine.num_params(fitted.model), int(steps), n_features=data.n_features)
        settings = (q, int(steps), c_dp, float(sigma), optimizer, float(lr), delta, accountant, int(seed), every)
        st.caption(f"σ = **{sigma:.3f}** · expected batch qN = **{q * n_train:.0f}** · **{int(steps) * q:.1f}** epochs · "
                   f"δ = **{delta:g}** · ε from **{privacy.ACCOUNTANTS[accountant]}**, assuming Poisson sampling.")
        with ui.point("dp_sgd"):  # a lecture step opens on this block (gradlab.ui.points; issue 41)
            planned = st.container()  # before the run, the ε it will spend stands above its button (step 11's point)
            res = None
            with ui.guard("DP-SGD training failed"):
                fits = costs.largest(sorted({10, 25, *range(50, int(steps) + 1, 50)} & set(range(1, int(steps) + 1))),
                                     lambda t: dp_sgd_cost(fitted, q, t, *settings[2:]))
                res = ui.on_request(dp_sgd_comparison, fitted, *settings, name="dp_sgd", button="Train private and non-private models",
                                    go=st.session_state.pop("_dp_sgd_go", False),
                                    fix=f"Use at most {fits} steps or a smaller sampling rate q." if fits else "Use a smaller q or model.")
            if res is not None:
                private, evals = res["private"], res["evals"]
                acc_p = np.array([e[0] for e in evals["private"]])
                acc_n = np.array([e[0] for e in evals["public"]])
                m = st.columns(5)
                m[0].metric("Test accuracy, DP-SGD", f"{acc_p[-1]:.1%}", delta=f"{(acc_p[-1] - acc_n[-1]) * 100:+.1f} pts",
                            help="Under the value: DP-SGD's test accuracy minus the non-private run's, in percentage points.")
                m[1].metric("Test accuracy, non-private", f"{acc_n[-1]:.1%}")
                m[2].metric(f"ε spent (δ = {delta:g})", f"{private.epsilons[-1]:.2f}", help=privacy.ACCOUNTANTS[accountant])
                m[3].metric("Noise multiplier σ", f"{sigma:.3f}")
                m[4].metric("Mean batch size", f"{private.batch_sizes.mean():.0f}",
                            help=f"Poisson sampling: expected qN = {q * n_train:.0f}; {private.clipped_fraction.mean():.0%} "
                                 "of per-example gradients were clipped on average.")
                left, right = st.columns(2)
                with left, ui.half_column():
                    ui.chart(plots.dp_accuracy_curves({f"DP-SGD (ε = {private.epsilons[-1]:.2g})": (private.steps, acc_p),
                                                              "non-private": (res["public"].steps, acc_n)}), width="stretch")
                with right, ui.half_column():
                    ui.chart(plots.epsilon_curve(np.array(private.steps), private.epsilons, delta=delta,
                                                        accountant=accountant.upper(), target=eps_target), width="stretch")
                ui.chart(plots.per_class_accuracy(data.class_names, evals["private"][-1][1], evals["public"][-1][1]),
                                width="stretch")
                table = pd.DataFrame({"step": private.steps, "ε": private.epsilons, "test accuracy (DP-SGD)": acc_p,
                                      "test accuracy (non-private)": acc_n})
                with st.expander("Numbers per checkpoint"):
                    st.dataframe(table, hide_index=True, width="stretch")
            else:
                st.info("Press **Train** (or the preset) to run DP-SGD with these settings; changing a setting cancels a run in progress. "
                        "The privacy it will spend (above) needs no training: the accountant sees only q, σ and the steps.")
                with planned, ui.guard("Could not compute ε"):
                    at, eps_at = planned_epsilons(q, float(sigma), int(steps), delta, accountant)
                    ui.chart(plots.epsilon_curve(at, eps_at, delta=delta, accountant=accountant.upper(),
                                                 target=eps_target), width="stretch")
else:
    ui.needs_training_loop("DP-SGD")


ui.code_panel(
    """
import jax, jax.numpy as jnp, equinox as eqx, optax, dp_accounting
from gradlab import engine

params, static = eqx.partition(model, eqx.is_array)   # the model's arrays (differentiated) and the rest

def loss(params, x, y):                                  # the loss of ONE example
    logits = eqx.combine(params, static)(x)
    return jax.nn.logsumexp(logits) - logits[y]

N = len(xs)

# the top of the page: bias of clipping at C, streamed over chunks of examples (never N x P)
G_C = jax.tree.map(lambda a: a / N, engine.clipped_grad_sum(loss, params, xs, ys, C))  # (1/N) Σᵢ gᵢ·min(1, C/‖gᵢ‖)
G = engine.batch_grad(loss, params, xs, ys, reduction="mean")                          # (1/N) Σᵢ gᵢ
flat = lambda tree: jnp.concatenate([a.ravel() for a in jax.tree.leaves(tree)])
cos = flat(G_C) @ flat(G) / (jnp.linalg.norm(flat(G_C)) * jnp.linalg.norm(flat(G)))

def dp_sgd_step(params, opt_state, key, xs, ys, q, C, sigma, buffer):
    k_sample, k_noise = jax.random.split(key)
    chosen = jax.random.uniform(k_sample, (N,)) < q      # Poisson sampling: each example with probability q
    idx = jnp.nonzero(chosen, size=buffer)[0]            # fixed-size padded buffer: one compiled shape
    mask = jnp.arange(buffer) < chosen.sum()
    g = jax.vmap(jax.grad(loss), (None, 0, 0))(params, xs[idx], ys[idx])          # per-example gradients
    g = jax.tree.map(lambda a: a * mask.reshape((-1,) + (1,) * (a.ndim - 1)), g)
    leaves, tree = jax.tree.flatten(g)
    summed, _ = optax.per_example_global_norm_clip(leaves, C)  # Σ gᵢ·min(1, C/‖gᵢ‖)
    keys = jax.random.split(k_noise, len(summed))
    noisy = [(s + sigma * C * jax.random.normal(k, s.shape)) / (q * N) for s, k in zip(summed, keys)]
    updates, opt_state = optimizer.update(jax.tree.unflatten(tree, noisy), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

keys = jax.random.split(jax.random.key(seed), T)         # one key per step
opt_state = optimizer.init(params)
for t in range(T):
    params, opt_state = dp_sgd_step(params, opt_state, keys[t], xs, ys, q, C, sigma, buffer)

# privacy spent after T steps (Google's dp-accounting; RdpAccountant or pld.PLDAccountant)
acc = dp_accounting.rdp.RdpAccountant()
acc.compose(dp_accounting.SelfComposedDpEvent(
    dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), T))
epsilon = acc.get_epsilon(delta)
"""
)
