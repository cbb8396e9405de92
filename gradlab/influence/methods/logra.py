"""Projected gradients at the trained checkpoint: LoGra's Kronecker-factored projection (Choe et al. 2024) scored with
TRAK's after-kernel (Park et al. 2023, eq. 4, one model), or with the plain inner product.

Each training example zᵢ is represented by φᵢ = Rᵀ∇θℓ(θ, zᵢ) `(k,)` at the trained model θ (no re-converged θ̂):
for every weight of a dense layer, convolution or embedding, R is the Kronecker product Pa ⊗ Pd of two Gaussian
matrices, `(I, k_in)` and `(O, k_out)`, so its part of φᵢ is Paᵀ(Σₜ aₜδₜᵀ)Pd = (aᵢPa)ᵀ(δᵢPd), computed by the rules
from the layer's input aᵢ and output gradient δᵢ without forming the gradient (`engine.per_example_projections`);
small leaves (biases) enter whole. A 1.2 M-parameter CNN holds (I + O)·k floats of projection per layer, never a
P × k matrix nor N × P gradients.

Scores of a test example z, high = proponent:

- `after` (the default; TRAK's after-kernel in the projected space, one model at the checkpoint): τ(z)ᵢ =
  φ(z)ᵀ(ΦᵀΦ + λI)⁻¹φᵢ, Φ `(N, k)` the training features, λ = `RIDGE` · tr(ΦᵀΦ)/k: a damping of 0.3 × the mean
  eigenvalue. Self-influence φᵢᵀ(ΦᵀΦ + λI)⁻¹φᵢ, the leverage score, in [0, 1).
- `inner` (projected gradient dot product, LoGra's score without its curvature): τ(z)ᵢ = ⟨φ(z), φᵢ⟩ ≈
  ⟨∇ℓ(z), ∇ℓ(zᵢ)⟩ (Johnson–Lindenstrauss; exact where every side is no larger than k). Self-influence ‖φᵢ‖².

The damping matters more than anything else here. At the checkpoint (not an optimum) ΦᵀΦ's small eigenvalues are
noise, and an undamped kernel divides by them: at λ = 10⁻³ × the mean eigenvalue the after-kernel ranked worse than
the plain inner product. λ = 0.3 × the mean eigenvalue was chosen on held-out test points (Fashion subset test images
100–199, never those the tables report) from 10⁻³…10 (`python -m benchmarks.logra_damping`); the same λ is the
best or near it on the digits MLP.
LDS (Park et al. 2023; M = 50 random halves), 2026-11-28:

| | `inner` | `after`, λ = 10⁻³ | `after`, λ = 0.3 (default) |
|---|---|---|---|
| SimpleCNN, Fashion subset, 2,000 images, test 0–99, k = 16, every layer (`benchmarks.lds_cnn`) | 0.105 ± 0.018 | 0.145 ± 0.018 | **0.289 ± 0.021** |
| same, k = 32 | 0.109 ± 0.018 | 0.100 ± 0.016 | 0.306 ± 0.020 |
| digits MLP, test 0–31, k = 16 (`benchmarks.lds --only mlp`) | 0.279 ± 0.034 | 0.164 ± 0.030 | **0.402 ± 0.034** |

Without SimpleCNN's first layer (`logra_layers`, "auto": 45% less of the pass) the after-kernel scores 0.281 ± 0.022
(paired −0.0075 ± 0.0025, 2026-12-03).

On SimpleCNN, on the same weights and tensors, dattri's TRAK-1 scores 0.204 ± 0.018 as shipped and 0.317 ± 0.018 damped
the same way (its dense projection of the whole gradient to 512 features, at 13× the CPU), the exact gradient dot
product 0.115 ± 0.018 (`docs/influence.md`).

The training features and the kernel's Cholesky factor are computed once per model and settings (`prepare`); a test
point is then one projected gradient and one matrix-vector product. Units: `inner` loss² per parameter², `after`
dimensionless.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from gradlab import engine, memory
from gradlab.influence.protocol import Context, Control, Method, Scored, Work
from gradlab.params import as_params, leaf_names, split_params

#: The damping of the after-kernel, relative to the mean eigenvalue tr(ΦᵀΦ)/k (chosen on held-out test points: above).
RIDGE = 0.3
#: Projection per side k (a layer (I, O) gives min(I, k)·min(O, k) features); the page's options.
SIDES = (8, 16, 32, 64)
DEFAULT_SIDE = 16
#: The fixed PRNG seed of the projection: every server and every session projects alike.
SEED = 0
#: `auto` leaves the first layer out (`engine.first_layer`) when it holds less than this share of the parameters: a
#: stem (SimpleCNN's conv1: 320 of 1.2 M) whose features would take a sixth of φ and whose δ costs the backward pass
#: through the second layer's input, 45% of the pass (benchmarks/RESULTS.md, issue 40, session 46).
FIRST_LAYER_SHARE = 0.01
#: Scores of every test point at once when their (T, N) float32 matrix holds at most this many bytes.
ALL_TEST_BYTES = 32 * 2**20
#: CPU-seconds of a dense (k, k) Cholesky factorization and an (N, k)ᵀ(N, k) product, per N·k² multiply-adds.
KERNEL_RATE = 2e10


@dataclasses.dataclass(frozen=True, eq=False)
class Features:
    """A prepared model: the `projection` (`engine.projections`), the training features `phi (N, k)` float32, the
    Cholesky factor `chol (k, k)` of ΦᵀΦ + λI (float64; None for `inner`), `ridge` λ, `self_influence (N,)` and
    the test set's features `test_phi (T, k)` (from the same pass: one compiled program for both)."""

    projection: tuple
    phi: np.ndarray
    chol: np.ndarray | None
    ridge: float
    self_influence: np.ndarray
    test_phi: np.ndarray | None = None


def features(ctx: Context, xs, ys, projection) -> np.ndarray:
    """`(T, k)` projected gradients of `xs`, `ys` at the trained model, `engine.per_example_projections`."""
    f = ctx.fitted
    return np.asarray(engine.per_example_projections(f.loss_fn, f.model, xs, ys, projection))


def kernel(phi: np.ndarray, block: int = 1024) -> tuple[np.ndarray, float]:
    """`(chol, λ)`: the lower Cholesky factor `(k, k)` float64 of ΦᵀΦ + λI, λ = `RIDGE` · tr(ΦᵀΦ)/k (1e-12 for a
    zero Φ). ΦᵀΦ is accumulated in float64 over blocks of rows (no float64 copy of Φ)."""
    k = phi.shape[1]
    gram = np.zeros((k, k))
    for s in range(0, len(phi), block):
        b = np.asarray(phi[s:s + block], np.float64)
        gram += b.T @ b
    lam = max(RIDGE * float(np.trace(gram)) / max(gram.shape[0], 1), 1e-12)
    return scipy.linalg.cholesky(gram + lam * np.eye(gram.shape[0]), lower=True), lam


def leverage(phi: np.ndarray, chol: np.ndarray, block: int = 512) -> np.ndarray:
    """φᵢᵀ(ΦᵀΦ + λI)⁻¹φᵢ for every row, `(N,)`, in blocks of rows: ‖L⁻¹φᵢ‖² (a block holds three float64
    `(k, block)` arrays: 13 MB at k = 1,050, where 4,096 rows held 100 MB)."""
    out = []
    for s in range(0, len(phi), block):
        w = scipy.linalg.solve_triangular(chol, np.asarray(phi[s:s + block], np.float64).T, lower=True)
        out.append(np.sum(w * w, axis=0))
    return np.concatenate(out) if out else np.zeros(0)


def left_out(loss_fn, model, xs, ys, layers: str) -> tuple[str, ...]:
    """The leaves `logra_layers` leaves out of φ: none (`"all"`), the first layer (`"rest"`, `engine.first_layer`),
    or (`"auto"`) the first layer where it holds less than `FIRST_LAYER_SHARE` of the parameters.
    **Raises** `ValueError` for another value."""
    if layers not in ("auto", "all", "rest"):
        raise ValueError(f"logra_layers must be auto, all or rest, got {layers!r}")
    if layers == "all":
        return ()
    first = engine.first_layer(loss_fn, model, xs, ys)
    if layers == "auto":
        params = as_params(model)
        sizes = dict(zip(leaf_names(params), (int(np.size(a)) for a in jax.tree.leaves(split_params(params)[0]))))
        if sum(sizes[n] for n in first) >= FIRST_LAYER_SHARE * sum(sizes.values()):
            return ()
    return first


class LoGra(Method):
    """Prepared state: `Features` of the training set at the trained model (no θ̂). Scores every test point at once
    (one pass over the test set) when their matrix is small, so a click is a lookup; else one matrix-vector
    product per click."""

    name = "logra"
    label = "Projected gradients at the checkpoint (LoGra / TRAK after-kernel, no θ̂)"
    short = "projected (LoGra)"
    self_label = "Leverage of the projected gradient, φᵢᵀ(ΦᵀΦ + λI)⁻¹φᵢ (‖φᵢ‖² for the inner product)"
    self_short = "projected (LoGra)"
    controls = (
        Control("logra_k", "infl_logra_k", "Projection per side k", DEFAULT_SIDE, "slider", SIDES,
                help="Each layer's gradient (I × O) is projected to min(I, k) × min(O, k) features by two Gaussian "
                     "matrices, (aPa)ᵀ(δPd), never formed; biases are kept whole. Larger k: closer to the exact "
                     "gradients, more memory (N × features floats)."),
        Control("logra_layers", "infl_logra_layers", "Layers projected", "auto", "select", ("auto", "all", "rest"),
                fmt=lambda v: {"auto": "auto: all but a small first layer", "all": "every layer",
                               "rest": "every layer but the first"}[v],
                help="The first layer's gradient needs the backward pass through the second layer's input (on "
                     "seed 003's SimpleCNN, 45% of the projection pass, for 320 of 1.2 M parameters). Auto leaves "
                     f"the first layer out where it holds under {FIRST_LAYER_SHARE:.0%} of the parameters (every "
                     "layer of the digits MLP is kept)."),
        Control("logra_kernel", "infl_logra_kernel", "Kernel", "after", "select", ("after", "inner"),
                fmt=lambda v: {"after": "TRAK after-kernel φᵀ(ΦᵀΦ + λI)⁻¹φᵢ",
                               "inner": "inner product ⟨φ, φᵢ⟩"}[v],
                help="The after-kernel (the default) reweights directions by the training features' covariance, "
                     f"damped by λ = {RIDGE:g} × its mean eigenvalue (TRAK with one model, at the checkpoint): LDS "
                     "0.28 on seed 003's SimpleCNN, 0.40 on the digits MLP. The inner product is the projected "
                     "gradient dot product (LoGra's score without curvature): LDS 0.11 and 0.28 there."),
    )
    prepare_reads = ("logra_k", "logra_layers", "logra_kernel")
    reads = ("logra_k", "logra_layers", "logra_kernel")

    @staticmethod
    def _k(work: Work, settings) -> int:
        """The feature count from the leaves' shapes (a matrix (O, I…) as min(I, k)·min(O, k), a leaf of at most
        `engine.PROJECT_WHOLE_MAX` whole); without shapes, at most 8 layers' k² and 1,024 more."""
        side = int(settings["logra_k"])
        if not work.shapes:
            return int(min(work.num_params, 8 * side * side + 1024))
        k = 0
        for shape in work.shapes:
            size = int(np.prod(shape))
            if len(shape) >= 2:
                k += min(size // shape[0], side) * min(shape[0], side)
            else:
                k += size if size <= engine.PROJECT_WHOLE_MAX else 1024
        return k

    def cost_seconds(self, work, settings) -> float:
        k = self._k(work, settings)  # one pass over the training and the test set, the kernel, every test point
        return work.pass_seconds(work.n + work.n_test) + (work.n + work.n_test) * k * k / KERNEL_RATE

    def click_seconds(self, work, settings) -> float:
        return 0.05 + work.n * self._k(work, settings) / KERNEL_RATE  # one projected gradient, one matvec

    def held_bytes(self, work, settings) -> int:
        k = self._k(work, settings)
        return 4 * work.n * k + 8 * 3 * k * k + 4 * work.n * min(work.n_test, ALL_TEST_BYTES // max(4 * work.n, 1))

    def fix(self, work, settings) -> str:
        fits = [s for s in SIDES if self.held_bytes(work, {**settings, "logra_k": s}) <= memory.BUDGET_BYTES]
        return (f"Use a projection per side k ≤ {fits[-1]} (projected settings)." if fits
                else "Use fewer training examples or a smaller model.")

    def projection(self, ctx: Context):
        """The projection for `ctx`'s model at its `logra_k` and `logra_layers` (`engine.projections`, seed
        `SEED`)."""
        f, side = ctx.fitted, int(ctx.settings["logra_k"])
        xs, ys = ctx.arrays()
        skip = left_out(f.loss_fn, f.model, xs[:1], ys[:1], ctx.settings.get("logra_layers", "auto"))
        return engine.projections(f.loss_fn, f.model, xs[:1], ys[:1], k_in=side, k_out=side, key=SEED, skip=skip)

    def prepare(self, ctx: Context) -> Features:
        xs, ys = ctx.arrays()
        d = ctx.fitted.data
        proj = self.projection(ctx)
        ctx.between()  # drawing it traced and compiled: the page returns that memory before the pass compiles
        # the training and the test set in one pass: one compiled program, and a click never runs another
        both = features(ctx, jnp.concatenate([xs, jnp.asarray(d.x_test, xs.dtype)]),
                        jnp.concatenate([ys, jnp.asarray(d.y_test, ys.dtype)]), proj)
        phi, test_phi = both[: len(ys)], both[len(ys):]
        if not np.all(np.isfinite(phi)):
            raise ValueError("the projected gradients are not finite at the trained model")
        if ctx.settings["logra_kernel"] == "after":
            chol, lam = kernel(phi)
            return Features(proj, phi, chol, lam, leverage(phi, chol), test_phi)
        return Features(proj, phi, None, 0.0, np.sum(np.square(phi, dtype=np.float64), axis=1), test_phi)

    def every_test_point(self, ctx: Context) -> bool:
        d = ctx.fitted.data
        return 4 * len(d.y_test) * len(d.y_train) <= ALL_TEST_BYTES

    def note(self, state: Features) -> str | None:
        k = state.phi.shape[1]
        how = (f"TRAK's after-kernel (ΦᵀΦ + λI)⁻¹ with λ = {state.ridge:.2g}" if state.chol is not None
               else "their inner product")
        count = {h: sum(p.how == h for p in state.projection) for h in ("kronecker", "whole", "gaussian", "skip")}
        parts = [f"{count['kronecker']} weights projected as (aPa)ᵀ(δPd) from the layers' a and δ"]
        parts += [f"{count['whole']} small leaves whole"] * bool(count["whole"])
        parts += [f"{count['gaussian']} leaves by a dense Gaussian"] * bool(count["gaussian"])
        skipped = [p.name for p in state.projection if p.how == "skip"]
        parts += [f"the first layer ({', '.join(skipped)}) left out"] * bool(skipped)
        return (f"Projected gradients at the trained model: {k:,} features per example ({'; '.join(parts)}), "
                f"scored by {how}. No re-converged θ̂.")

    def test_features(self, ctx: Context, state: Features, test_xs, test_ys):
        x_test = ctx.fitted.data.x_test
        if state.test_phi is not None and np.shape(test_xs) == np.shape(x_test) and np.array_equal(test_xs, x_test):
            return state.test_phi  # the whole test set (every test point at once): computed with Φ
        return features(ctx, jnp.asarray(test_xs), jnp.asarray(test_ys), state.projection)

    def train_scores(self, ctx: Context, state: Features, feats):
        feats = np.asarray(feats, np.float64)
        if state.chol is not None:
            feats = scipy.linalg.cho_solve((state.chol, True), feats.T).T  # (T, k): (ΦᵀΦ + λI)⁻¹φ(z)
        phi = np.asarray(state.phi)
        return feats.astype(phi.dtype) @ phi.T  # (T, N), in the features' precision

    def scores(self, ctx: Context, state: Features, test_xs, test_ys) -> Scored:
        return Scored(np.asarray(self.train_scores(ctx, state, self.test_features(ctx, state, test_xs, test_ys))))

    def self_influence(self, ctx: Context, state: Features) -> np.ndarray:
        return np.asarray(state.self_influence)


METHOD = LoGra()
