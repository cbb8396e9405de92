"""Two-parameter models: parameter space is the screen, every example's gradient is an arrow.

No Streamlit. A `Problem` is a per-example loss of a 2-vector θ = (θ₀, θ₁) and a small dataset:

- `"scalar"`: the seeds' example, ℓ(θ; x, y) = (w·x + b − y)² with w, b = 1.0, 0.0, x = [1, 2],
  y = [0, 0]; the w-components of the per-example gradients are [2, 8], summing to 10 (seed 002).
- `"line"`: the same squared loss on 60 points of the line-with-outliers data (y = 2x + 1 + noise,
  5% of the targets shifted 8-12 off the line).
- `"logistic"`: logistic regression with two weights (no bias) on two 2-D blobs, 10% flipped labels,
  ℓ = softplus(−s·θ·x) + λ/2‖θ‖² with s = ±1 and λ = 0.05 (so the optimum is finite).

Per-example gradients come from `gradlab.engine.per_example_grads`, their mean from
`gradlab.engine.batch_grad`; the trajectories take DP-SGD's own step (`gradlab.privacy.dp_sgd_gradient`).
Everything returns NumPy.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import make_blobs

from gradlab import engine, privacy
from gradlab.data import flip_labels

PROBLEMS = {
    "scalar": "The seeds' scalar example: (w·x + b)², w, b = 1, 0, x = [1, 2]",
    "line": "Line fit y = w·x + b on the line with outliers",
    "logistic": "Logistic regression, two weights, 2-D blobs with flipped labels",
}
METHODS = {"sgd": "SGD", "clipped": "Clipped SGD", "dp": "DP-SGD"}
L2_LOGISTIC = 0.05


def squared_loss(theta, x, y):
    """(θ₀·x + θ₁ − y)²: a line fit with slope w = θ₀ and intercept b = θ₁ (one example, x scalar)."""
    return (theta[0] * x + theta[1] - y) ** 2


def logistic_loss(theta, x, y):
    """softplus(−s·θ·x) + λ/2‖θ‖², s = 2y − 1 ∈ {−1, +1}: logistic loss of one example, x of shape (2,)."""
    s = 2.0 * y - 1.0
    return jax.nn.softplus(-s * jnp.dot(theta, x)) + 0.5 * L2_LOGISTIC * jnp.sum(theta**2)


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
    """A two-parameter model and its data.

    - `loss_fn(theta (2,), x, y) -> scalar`: the loss of one example.
    - `xs (N,)` or `(N, 2)`, `ys (N,)` float32; `start (2,)`: the point the arrows and trajectories start at.
    - `labels (N,)` int class for colour (0 for regression); `marked (N,) bool`: outliers or flipped labels.
    - `param_names`: axis names of θ; `window`: `((θ₀ min, max), (θ₁ min, max))` of the loss surface.
    - `lr`: a learning rate that converges; `batch_size`: SGD's default B.
    """

    name: str
    loss_fn: Callable
    xs: np.ndarray
    ys: np.ndarray
    start: np.ndarray
    labels: np.ndarray
    marked: np.ndarray
    marked_name: str
    param_names: tuple[str, str]
    window: tuple[tuple[float, float], tuple[float, float]]
    lr: float
    batch_size: int

    @property
    def n(self) -> int:
        return int(self.ys.shape[0])


@functools.lru_cache(maxsize=8)
def problem(name: str, seed: int = 0) -> Problem:
    """The two-parameter `Problem` called `name` (a key of `PROBLEMS`).

    **Raises** `ValueError` for an unknown name.
    """
    rng = np.random.default_rng(seed)
    if name == "scalar":
        xs, ys = np.array([1.0, 2.0], np.float32), np.zeros(2, np.float32)
        return Problem(name, squared_loss, xs, ys, np.array([1.0, 0.0], np.float32), np.zeros(2, int),
                       np.zeros(2, bool), "", ("w", "b"), ((-1.5, 1.5), (-1.5, 1.5)), 0.1, 2)
    if name == "line":
        n = 60
        x = rng.uniform(-3, 3, n)
        y = 2 * x + 1 + rng.normal(0, 0.5, n)
        out = rng.choice(n, size=n // 20, replace=False)
        y[out] += rng.choice([-1, 1], out.size) * rng.uniform(8, 12, out.size)
        marked = np.zeros(n, bool)
        marked[out] = True
        return Problem(name, squared_loss, x.astype(np.float32), y.astype(np.float32),
                       np.array([-1.0, 4.0], np.float32), np.zeros(n, int), marked, "outlier", ("w", "b"),
                       ((-2.0, 5.0), (-2.0, 5.0)), 0.05, 8)
    if name == "logistic":
        n = 60
        x, y = make_blobs(n, centers=[(-1.2, -0.8), (1.2, 0.8)], cluster_std=0.9, random_state=seed)
        y_noisy, flipped = flip_labels(y.astype(np.int32), 0.1, 2, rng)
        return Problem(name, logistic_loss, x.astype(np.float32), y_noisy.astype(np.float32),
                       np.array([-2.0, 2.5], np.float32), y_noisy.astype(int), flipped, "flipped label",
                       ("θ₁", "θ₂"), ((-3.0, 4.0), (-3.0, 4.0)), 0.5, 8)
    raise ValueError(f"unknown problem {name!r}; choose one of {', '.join(PROBLEMS)}")


def arrows(p: Problem, theta) -> np.ndarray:
    """Per-example gradients ∇θ ℓ(θ; xᵢ, yᵢ) at `theta (2,)`, shape `(N, 2)`, by `engine.per_example_grads`."""
    return np.asarray(engine.per_example_grads(p.loss_fn, jnp.asarray(theta, jnp.float32), p.xs, p.ys))


def mean_arrow(p: Problem, theta) -> np.ndarray:
    """The batch gradient ∇θ (1/N) Σᵢ ℓᵢ at `theta`, shape `(2,)`, by `engine.batch_grad(reduction="mean")`."""
    return np.asarray(engine.batch_grad(p.loss_fn, jnp.asarray(theta, jnp.float32), p.xs, p.ys, reduction="mean"))


def clip(grads: np.ndarray, clip_norm: float) -> np.ndarray:
    """Each row gᵢ scaled to norm at most C: gᵢ·min(1, C/‖gᵢ‖), shape `(N, 2)` (DP-SGD's clipping step).

    **Raises** `ValueError` unless C > 0.
    """
    if not clip_norm > 0:
        raise ValueError(f"the clipping norm C must be > 0, got {clip_norm:g}")
    g = np.asarray(grads, np.float64)
    norms = np.linalg.norm(g, axis=1, keepdims=True)
    return g * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30))


def noise_cloud(center, clip_norm: float, noise_multiplier: float, batch_size: int, *, samples: int = 200,
                seed: int = 0) -> np.ndarray:
    """Possible noisy DP-SGD steps: `center + N(0, (σ·C/B)² I)`, shape `(samples, 2)`.

    `center` is the clipped mean gradient; σ·C/B is the noise std of the averaged clipped gradient
    (Abadi et al. 2016, Algorithm 1, divided by the batch size B).
    """
    std = noise_multiplier * clip_norm / batch_size
    return np.asarray(center)[None, :] + std * np.random.default_rng(seed).standard_normal((samples, 2))


def loss_surface(p: Problem, resolution: int = 60) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mean loss (1/N)Σᵢ ℓ(θ; xᵢ, yᵢ) on a grid over `p.window`.

    **Returns** `(θ₀ values (R,), θ₁ values (R,), loss (R, R))` with `loss[j, i]` at `(θ₀[i], θ₁[j])`.
    """
    a = np.linspace(*p.window[0], resolution, dtype=np.float32)
    b = np.linspace(*p.window[1], resolution, dtype=np.float32)
    grid = jnp.stack(jnp.meshgrid(a, b), -1).reshape(-1, 2)
    z = _mean_loss_on(p.loss_fn, grid, jnp.asarray(p.xs), jnp.asarray(p.ys))
    return a, b, np.asarray(z).reshape(resolution, resolution)


@functools.partial(jax.jit, static_argnums=0)
def _mean_loss_on(loss_fn, thetas, xs, ys):
    per = jax.vmap(lambda t: jax.vmap(loss_fn, (None, 0, 0))(t, xs, ys).mean())
    return per(thetas)


def norms_along(p: Problem, path) -> np.ndarray:
    """Every example's gradient norm ‖gᵢ(θ)‖ at each point θ of `path (T + 1, 2)` (a `trajectory`): `(T + 1, N)`."""
    return np.stack([np.linalg.norm(arrows(p, np.asarray(theta, np.float32)), axis=1) for theta in np.asarray(path)])


def trajectory(p: Problem, method: str, *, lr: float, steps: int, batch_size: int, clip_norm: float = 1.0,
               noise_multiplier: float = 1.0, seed: int = 0) -> np.ndarray:
    """θ after each step of SGD, clipped SGD or DP-SGD from `p.start`, shape `(steps + 1, 2)`.

    Every method draws the same minibatches (B examples without replacement, from `seed`), so
    the paths differ only by clipping and noise. Steps: SGD θ ← θ − η·mean gᵢ; clipped SGD uses
    the mean of the clipped gᵢ (norm ≤ C); DP-SGD adds N(0, σ²C²I) to the clipped sum before
    dividing by B (Abadi et al. 2016, Algorithm 1).

    **Raises** `ValueError` for an unknown method or B outside 1..N.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if not 1 <= batch_size <= p.n:
        raise ValueError(f"batch size B must be between 1 and N = {p.n}, got {batch_size}")
    rng = np.random.default_rng(seed)
    batches = np.stack([rng.choice(p.n, batch_size, replace=False) for _ in range(steps)]) if steps else \
        np.zeros((0, batch_size), int)
    c = clip_norm if method != "sgd" else np.inf
    s = noise_multiplier if method == "dp" else 0.0
    path = _run(p.loss_fn, jnp.asarray(p.start), jnp.asarray(p.xs), jnp.asarray(p.ys), jnp.asarray(batches),
                jnp.float32(lr), jnp.float32(c), jnp.float32(s), jax.random.key(seed))
    return np.concatenate([p.start[None, :], np.asarray(path)])


@functools.partial(jax.jit, static_argnums=0)
def _run(loss_fn, start, xs, ys, batches, lr, clip_norm, sigma, key):
    """The path of θ: each step θ ← θ − η·`privacy.dp_sgd_gradient` on its minibatch (σ = 0, C = inf: SGD)."""

    def step(theta, inp):
        idx, k = inp
        g, _, _ = privacy.dp_sgd_gradient(loss_fn, theta, xs[idx], ys[idx], k, clip_norm=clip_norm,
                                          noise_multiplier=sigma, batch_size=idx.shape[0])
        theta = theta - lr * g
        return theta, theta

    keys = jax.random.split(key, batches.shape[0])
    _, path = jax.lax.scan(step, start, (batches, keys))
    return path


def optimum(p: Problem, weights=None, *, iterations: int = 30) -> np.ndarray:
    """argmin_θ Σᵢ wᵢ ℓᵢ(θ) / Σᵢ wᵢ by Newton's method from `p.start` (exact in one step for the squared loss).

    `weights (N,)` default all ones; a zero removes an example. **Raises** `ValueError` when the
    Hessian is singular (e.g. the scalar example with one of its two points removed).
    """
    w = jnp.ones(p.n) if weights is None else jnp.asarray(weights, jnp.float32)
    theta = _newton(p.loss_fn, jnp.asarray(p.start), jnp.asarray(p.xs), jnp.asarray(p.ys), w, iterations)
    theta = np.asarray(theta)
    if not np.all(np.isfinite(theta)):
        raise ValueError("this objective has no unique minimum (singular Hessian): keep more examples")
    return theta


def _weighted_mean_loss(loss_fn, theta, xs, ys, w):
    return jnp.sum(w * jax.vmap(loss_fn, (None, 0, 0))(theta, xs, ys)) / jnp.sum(w)


@functools.partial(jax.jit, static_argnums=(0, 5))
def _newton(loss_fn, theta, xs, ys, w, iterations):
    f = functools.partial(_weighted_mean_loss, loss_fn, xs=xs, ys=ys, w=w)

    def body(_, t):
        h = jax.hessian(f)(t)
        ok = jnp.abs(jnp.linalg.det(h)) > 1e-6 * jnp.maximum(jnp.trace(h) ** 2, 1e-12)
        return jnp.where(ok, t - jnp.linalg.solve(h, jax.grad(f)(t)), jnp.nan)

    return jax.lax.fori_loop(0, iterations, body, theta)


@dataclasses.dataclass(frozen=True)
class Removal:
    """Removing training example i: where the optimum actually moves and where influence predicts.

    - `optimum (2,)`: θ* on all N examples; `retrained (2,)`: θ*₋ᵢ, the optimum without example i.
    - `predicted (2,)`: θ* + (1/N)·H⁻¹∇ℓᵢ(θ*), the influence-function prediction (Koh & Liang 2017,
      eq. 3 with ε = −1/N; H is the Hessian of the mean loss at θ*).
    """

    index: int
    optimum: np.ndarray
    retrained: np.ndarray
    predicted: np.ndarray

    @property
    def error(self) -> float:
        """‖predicted − retrained‖ / ‖retrained − optimum‖: 0 is a perfect prediction."""
        moved = np.linalg.norm(self.retrained - self.optimum)
        return float(np.linalg.norm(self.predicted - self.retrained) / max(moved, 1e-30))


def remove_example(p: Problem, index: int) -> Removal:
    """Retrain without example `index` (Newton to convergence) and compare with the influence prediction.

    **Raises** `ValueError` for an index outside 0..N-1 or an objective without a unique minimum.
    """
    if not 0 <= index < p.n:
        raise ValueError(f"example index must be between 0 and {p.n - 1}, got {index}")
    theta = optimum(p)
    w = np.ones(p.n, np.float32)
    w[index] = 0.0
    retrained = optimum(p, w)
    f = functools.partial(_weighted_mean_loss, p.loss_fn, xs=jnp.asarray(p.xs), ys=jnp.asarray(p.ys),
                          w=jnp.ones(p.n))
    h = np.asarray(jax.hessian(f)(jnp.asarray(theta)), np.float64)
    g = arrows(p, theta)[index].astype(np.float64)
    predicted = theta + np.linalg.solve(h, g) / p.n
    return Removal(int(index), theta, retrained, predicted)


__all__ = ["PROBLEMS", "METHODS", "Problem", "problem", "arrows", "mean_arrow", "clip", "noise_cloud",
           "loss_surface", "norms_along", "trajectory", "optimum", "Removal", "remove_example", "squared_loss",
           "logistic_loss"]
