"""Geometry: a model with two parameters, so parameter space is the screen and every example's
gradient is an arrow; their mean, the clipping ball, DP noise, trajectories, removing an example."""

import time

import numpy as np
import streamlit as st

from gradlab import geometry, ui
from gradlab.ui.geometry import removal
from gradlab.ui.figures import plots

st.title("Geometry of per-example gradients")
st.markdown(
    "A model with **two parameters**, so the parameter space is the screen. The contours are the mean "
    "training loss; at the current point θ every training example's gradient gᵢ is an arrow (computed by "
    "`vmap(grad)`, the engine), and the **black** arrow is their mean, the batch gradient. Outliers and "
    "flipped labels (red) pull hardest. Turn on **clipping** to see each arrow cut to the ball of radius C "
    "and the clipped mean drift from the true one (bias); **DP noise** shows the cloud of steps DP-SGD "
    "might take (std σ·C/B). Step or play SGD, clipped SGD and DP-SGD from the same start, and click a "
    "training example to remove it: the optimum moves, next to the influence function's prediction."
)

# figure first: the field on the left, every control beside it
field_col, side = st.columns([5, 2], gap="medium")


def _problem_changed() -> None:
    """A new problem brings its own learning rate and batch size: the sliders kept the old problem's, which the
    link (it omits a default, and the defaults are the new problem's) did not reproduce."""
    q = geometry.problem(st.session_state["geo_problem"])
    st.session_state["geo_lr"], st.session_state["geo_batch"] = q.lr, min(q.batch_size, q.n)


with side:
    name = ui.control(st.radio, "Model and data", list(geometry.PROBLEMS), key="geo_problem", index=1,
                      horizontal=True, on_change=_problem_changed)  # short names: a bound radio writes them
    st.caption(geometry.PROBLEMS[name])
    p = geometry.problem(name)
    clip_on = ui.control(st.toggle, "Clip each gᵢ at C", value=False, key="geo_clip")
    noise_on = ui.control(st.toggle, "DP noise cloud", value=False, key="geo_noise")
    paths_on = ui.control(st.toggle, "Trajectories", value=False, key="geo_paths",
                          help="SGD, clipped SGD and DP-SGD from the same start with the same minibatches.")
    c_in = ui.control(st.number_input, "Clipping norm C", value=None, min_value=0.0, format="%.3g", key="geo_c",
                      placeholder="median ‖gᵢ‖", help="Empty: the median per-example norm at θ.")
    sigma = ui.control(st.number_input, "Noise multiplier σ", value=1.0, min_value=0.0, step=0.5, key="geo_sigma")
    if int(st.session_state.get("geo_batch") or 1) > p.n:  # kept from a problem with more examples
        st.session_state["geo_batch"] = p.n
    batch = int(ui.control(st.number_input, "Batch size B", value=min(p.batch_size, p.n), min_value=1, max_value=p.n, key="geo_batch"))
    steps = int(ui.control(st.select_slider, "Steps", options=[0, 5, 10, 20, 40, 80], value=20, key="geo_steps"))
    lr = float(ui.control(st.select_slider, "Learning rate η", options=[0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0], value=p.lr,
                          key="geo_lr"))
    at = ui.control(st.slider, "Arrows drawn at step t of the SGD path", 0, max(steps, 1), key="geo_t",
                    disabled=steps == 0)
    buttons = st.container(horizontal=True)  # wraps instead of cutting a label in a narrow column


def _step(delta: int) -> None:
    st.session_state["geo_t"] = min(max(int(st.session_state.get("geo_t", 0)) + delta, 0), max(steps, 1))


buttons.button("Step", on_click=_step, args=(1,), key="geo_step_btn")
play = buttons.button("Play", key="geo_play_btn")
buttons.button("Reset", on_click=_step, args=(-10_000,), key="geo_reset_btn")


@ui.shared(label="Following every method's path")
def paths(name, lr, steps, batch, clip_norm, sigma):
    pr = geometry.problem(name)
    return {m: geometry.trajectory(pr, m, lr=lr, steps=steps, batch_size=min(batch, pr.n), clip_norm=clip_norm,
                                   noise_multiplier=sigma) for m in geometry.METHODS}


@ui.shared(gated=False)
def at_point(name, theta):
    pr = geometry.problem(name)
    return geometry.arrows(pr, np.asarray(theta, np.float32)), geometry.mean_arrow(pr, np.asarray(theta, np.float32))


@ui.shared(gated=False)
def surface(name):
    return geometry.loss_surface(geometry.problem(name))


# click a training example (in the data chart) to remove it
PICK = "geo_pick"
picked = ui.picked_index(st.session_state.get(PICK), p.n)
if picked is not None:
    if st.session_state.get("_geo_last_pick") != (name, picked):
        st.session_state["geo_remove"] = picked
        st.session_state["_geo_last_pick"] = (name, picked)


def draw(t: int, slot, metrics_slot) -> None:
    """The field figure and the numbers at step t of the SGD path."""
    sgd = traj["sgd"] if traj else np.asarray([p.start])
    theta = sgd[min(t, len(sgd) - 1)]
    grads, mean = at_point(name, tuple(float(v) for v in theta))
    norms = np.linalg.norm(grads, axis=1)
    clip_norm = float(np.median(norms)) if c_in is None else float(c_in)
    clipped = geometry.clip(grads, clip_norm) if clip_on and clip_norm > 0 else None
    clipped_mean = clipped.mean(0) if clipped is not None else None
    cloud = (geometry.noise_cloud(clipped_mean if clipped_mean is not None else geometry.clip(grads, clip_norm).mean(0),
                                  clip_norm, sigma, batch) if noise_on and clip_norm > 0 else None)
    width = p.window[0][1] - p.window[0][0]
    shown = np.linalg.norm(clipped, axis=1) if clipped is not None else norms
    scale = 0.35 * width / max(float(shown.max()), float(np.linalg.norm(mean)), clip_norm if clip_on else 0.0, 1e-9)
    fig = plots.gradient_field(surf, theta, grads, mean, scale=scale, labels=p.labels, marked=p.marked,
                               marked_name=p.marked_name, param_names=p.param_names,
                               clip_norm=clip_norm if clip_on else None, clipped=clipped, clipped_mean=clipped_mean,
                               cloud=cloud, removal=removed,  # no DP path before clipping or noise is on
                               trajectories=(traj if clip_on or noise_on else {"sgd": traj["sgd"]}) if paths_on and traj else None)
    with slot.container():
        ui.chart(fig, key=f"geo_field_{t}" if playing else None)
    with metrics_slot.container():
        m = st.columns(4)
        m[0].metric(f"θ = ({p.param_names[0]}, {p.param_names[1]})", f"({theta[0]:.2f}, {theta[1]:.2f})")
        m[1].metric("‖mean gᵢ‖", f"{np.linalg.norm(mean):.3g}", help="The batch gradient (engine.batch_grad, mean).")
        m[2].metric("Largest ‖gᵢ‖", f"{norms.max():.3g}", help=f"Example #{int(norms.argmax())}.")
        if clipped is not None:
            cos = float(np.dot(clipped_mean, mean) / max(np.linalg.norm(clipped_mean) * np.linalg.norm(mean), 1e-30))
            m[3].metric("cos∠(clipped mean, mean)", f"{cos:.3f}",
                        help=f"C = {clip_norm:.3g}; {np.mean(norms > clip_norm):.0%} of the arrows are clipped.")
        else:
            m[3].metric("Σᵢ gᵢ", f"({grads[:, 0].sum():.3g}, {grads[:, 1].sum():.3g})",
                        help="The gradient of the summed loss: N × the black arrow.")


traj = None
removed = None
with ui.guard("The trajectories could not be computed"):
    c_traj = float(c_in) if c_in else float(np.median(np.linalg.norm(at_point(name, tuple(map(float, p.start)))[0], axis=1)))
    traj = paths(name, lr, steps, batch, c_traj, float(sigma))
surf = surface(name)

remove = st.session_state.get("geo_remove")
if remove is not None and name != "scalar":
    with ui.guard("This example cannot be removed"):
        removed = removal(name, int(remove))

with field_col:
    slot = st.empty()
    metrics_slot = st.empty()
playing = False
if play and traj:
    playing = True
    for t in range(0, steps + 1):
        draw(t, slot, metrics_slot)
        time.sleep(0.12)
    playing = False
draw(int(at), slot, metrics_slot)

left, right = st.columns([3, 2])
with left:
    if name == "scalar":
        g = at_point(name, tuple(map(float, p.start)))[0]
        st.markdown(
            f"**The seeds' example.** At w, b = 1.0, 0.0 with x = [1, 2], y = [0, 0] and ℓ = (w·x + b − y)²: "
            f"the per-example gradients in w are **[{g[0, 0]:g}, {g[1, 0]:g}]**, summing to **{g[:, 0].sum():g}** "
            f"(∂ℓ/∂b: [{g[0, 1]:g}, {g[1, 1]:g}])."
        )
    else:
        kind = "line" if name == "line" else "logistic"
        sgd = traj["sgd"] if traj else np.asarray([p.start])
        theta = sgd[min(int(at), len(sgd) - 1)]
        ui.chart(plots.geometry_data(p.xs, p.ys, theta, labels=p.labels, marked=p.marked, marked_name=p.marked_name,
                                     removed=removed.index if removed else None, kind=kind),
                 on_select="rerun", selection_mode="points", key=PICK)
with right:
    with ui.point_controls("geo_removal"):  # beside its figure where a lecture step moved it (gradlab.ui.points.controls)
        ui.control(st.number_input, "Remove training example #", min_value=0, max_value=p.n - 1, value=None, key="geo_remove",
                   placeholder="none", disabled=name == "scalar",
                   help="Or click a point in the chart. Retrain without it (Newton's method) and compare with the influence function.")
    if remove is not None and name != "scalar":
        ui.card_link(int(remove), f"Open example {int(remove)}'s record card", rec_set=name)
    with ui.point("geo_removal"):  # a lecture step opens on this block (gradlab.ui.points; issue 41)
        if removed is not None:
            moved = np.linalg.norm(removed.retrained - removed.optimum)
            r = st.columns(2)
            r[0].metric("Optimum moved by", f"{moved:.3g}")
            r[1].metric("Influence error", f"{removed.error:.1%}",
                        help="‖predicted − retrained‖ / ‖retrained − θ*‖: the influence function "
                             "θ* + (1/N)·H⁻¹∇ℓᵢ(θ*) (Koh & Liang 2017) against actual retraining.")
            ui.chart(plots.removal_zoom(removed, p.param_names))

ui.code_panel(
    """
import jax, jax.numpy as jnp
from gradlab import engine

def loss(theta, x, y):                     # ONE example; theta = (w, b)
    return (theta[0] * x + theta[1] - y) ** 2

theta = jnp.array([-1.0, 4.0])
g = engine.per_example_grads(loss, theta, xs, ys)     # (N, 2): the arrows = vmap(grad(loss), (None, 0, 0))
G = engine.batch_grad(loss, theta, xs, ys, reduction="mean")   # the black arrow = g.mean(0)

norms = jnp.linalg.norm(g, axis=1)
clipped = g * jnp.minimum(1.0, C / norms)[:, None]    # each arrow cut to the ball of radius C
noisy = clipped.mean(0) + sigma * C / B * jax.random.normal(key, (2,))   # one DP-SGD step direction

# remove example i: retrain vs influence function (Koh & Liang 2017)
N = len(xs)
mean_loss = lambda t, w: jnp.sum(w * jax.vmap(loss, (None, 0, 0))(t, xs, ys)) / jnp.sum(w)   # w = 0 drops
newton = lambda t, w: t - jnp.linalg.solve(jax.hessian(mean_loss)(t, w), jax.grad(mean_loss)(t, w))
theta_star = newton(theta, jnp.ones(N))                        # one Newton step: the loss is quadratic
retrained = newton(theta_star, jnp.ones(N).at[i].set(0.0))     # the optimum without example i
H = jax.hessian(mean_loss)(theta_star, jnp.ones(N))
predicted = theta_star + jnp.linalg.solve(H, jax.grad(loss)(theta_star, xs[i], ys[i])) / N
"""
)
