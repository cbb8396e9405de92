"""What per-example clipping does to the gradient: norms before/after, fraction clipped, bias.

DP-SGD replaces the mean gradient G = (1/N) Σᵢ gᵢ by the mean of the clipped gradients
Ḡ_C = (1/N) Σᵢ gᵢ·min(1, C/‖gᵢ‖). Clipping bounds each example's influence (the sensitivity the
noise is calibrated to) but biases the update: examples with large gradients (hard, rare or
mislabeled) are scaled down the most (Chen, Wu, Hong 2020, "Understanding gradient clipping in
private SGD"; Bagdasaryan, Poursaeed, Shmatikov 2019, "Differential privacy has disparate impact
on model accuracy"). Abadi et al. (2016) suggest C near the median per-example norm.

`clipping_analysis` takes the per-example norms (whole and per leaf) from the engine's rules path,
then every clipped sum it needs (a whole grid of C values, flat and per-layer, and per-class sums
at the chosen C) as weighted gradients Σᵢ wᵢ·gᵢ = Jᵀw, one weight column each
(`engine.weighted_grads`): no per-example gradient is built. Memory ≈ (2·G + 2·K) × P floats.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from gradlab import engine
from gradlab.params import as_params
from gradlab.privacy import check_batch_size, check_clip_norm, check_noise_multiplier, noise_std_of_mean

DEFAULT_GRID = 40
#: bytes allowed for the (G, P) sums of clipped gradients; flops allowed for the grid's backward passes.
GRID_BYTES = 128 * 2**20
MAX_FLOPS = 2e10


def clip_factor(norms, clip_norm: float) -> np.ndarray:
    """min(1, C/‖gᵢ‖): what clipping at C keeps of each per-example gradient (1: not clipped), in float64.

    **Arguments** `norms (n,)` (or a scalar) ‖gᵢ‖; `clip_norm` C. **Returns** `(n,)` float64 in (0, 1]. (In a
    traced program: `engine.clip_factors`.)"""
    norms = np.asarray(norms, np.float64)
    return np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30))


@dataclasses.dataclass(frozen=True, eq=False)
class ClippingAnalysis:
    """Per-example clipping at one clipping norm C, and the bias it causes as C varies.

    Per example (N training examples):
    - `norms (N,)`: ‖gᵢ‖₂ before clipping; `clipped_norms (N,)`: min(‖gᵢ‖, C) after flat clipping.
    - `layer_norms {leaf: (N,)}`; `layer_clipped_norms (N,)`: global norm after per-layer clipping
      (each of the L leaves clipped to C/√L).

    Over the grid of clipping norms `grid (G,)` (sorted, includes C at index `index`):
    - `cosine (G,)`, `norm_ratio (G,)`: cos∠(Ḡ_C, G) and ‖Ḡ_C‖/‖G‖ for flat clipping, where
      G = mean gradient and Ḡ_C = mean clipped gradient; `cosine_layer`, `norm_ratio_layer`: per-layer.
    - `fraction_clipped (G,)`: share of examples with ‖gᵢ‖ > C; `fraction_clipped_layer (G,)`: share
      with at least one leaf clipped.

    Per class (classification; empty arrays otherwise), at C:
    - `class_counts (K,)`, `class_fraction_clipped (K,)`, `class_cosine (K,)`, `class_norm_ratio (K,)`
      (bias of the class's clipped mean gradient against its true mean gradient).

    Scalars: `clip_norm` C; `mean_norm` ‖G‖; `clipped_mean_norm` ‖Ḡ_C‖; `num_params` P.
    """

    clip_norm: float
    norms: np.ndarray
    clipped_norms: np.ndarray
    layer_norms: dict[str, np.ndarray]
    layer_clipped_norms: np.ndarray
    grid: np.ndarray
    index: int
    cosine: np.ndarray
    norm_ratio: np.ndarray
    cosine_layer: np.ndarray
    norm_ratio_layer: np.ndarray
    fraction_clipped: np.ndarray
    fraction_clipped_layer: np.ndarray
    class_counts: np.ndarray
    class_fraction_clipped: np.ndarray
    class_cosine: np.ndarray
    class_norm_ratio: np.ndarray
    mean_norm: float
    clipped_mean_norm: float
    num_params: int

    @property
    def fraction_clipped_at_c(self) -> float:
        return float(self.fraction_clipped[self.index])


def grid_size(n: int, num_params: int) -> int:
    """Clipping norms on the bias curve of `clipping_analysis` for N examples and P parameters: `DEFAULT_GRID`,
    fewer for big models (memory 2·G·P floats under `GRID_BYTES`, work ~4·N·G·P flops under `MAX_FLOPS`), at least 8."""
    n, p = max(int(n), 1), max(int(num_params), 1)
    return int(max(8, min(DEFAULT_GRID, GRID_BYTES // (8 * p), MAX_FLOPS // (4 * n * p))))


def analysis_passes(params, n: int, n_classes: int = 0) -> int:
    """Weighted backward passes over all N examples that `clipping_analysis` makes: the per-leaf norms (one), one
    column per clipping norm on the grid (plus C and the unclipped sum), two per class, and the grid once more
    for every parameter leaf (per-layer clipping). Its cost estimate: `costs.clipping_seconds`."""
    params = as_params(params)
    g = grid_size(n, engine.num_params(params)) + 1
    leaves = len(jax.tree.leaves(eqx.filter(params, eqx.is_inexact_array)))
    return 1 + (1 + g + 2 * int(n_classes)) + leaves * g


def default_grid(norms: np.ndarray, size: int = DEFAULT_GRID) -> np.ndarray:
    """Geometric grid of clipping norms from well below the smallest to above the largest norm."""
    norms = np.asarray(norms, np.float64)
    pos = norms[norms > 0]
    if pos.size == 0:
        return np.geomspace(1e-3, 1.0, size)
    lo, hi = np.quantile(pos, 0.01) / 4, pos.max() * 1.5
    return np.geomspace(max(lo, 1e-12), max(hi, lo * 10), size)


def _flat(tree) -> np.ndarray:
    """(K, P) float64 from a pytree whose leaves have a leading K axis (tree order)."""
    return np.concatenate([np.asarray(a, np.float64).reshape(a.shape[0], -1) for a in jax.tree.leaves(tree)], 1)


def _cos_ratio(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos∠(a, b) and ‖a‖/‖b‖ along the last axis (float64; NaN where ‖b‖ = 0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sum(a * b, axis=-1) / (na * nb), na / nb


def clipping_analysis(
    loss_fn,
    params,
    xs,
    ys,
    clip_norm: float,
    *,
    labels=None,
    n_classes: int | None = None,
    grid: np.ndarray | None = None,
    chunk_size: int | None = None,
) -> ClippingAnalysis:
    """Per-example clipping at C and the bias of the clipped mean gradient as C varies.

    **Arguments**
    - `loss_fn`, `params`, `xs (N, …)`, `ys (N, …)`: as `gradlab.engine.per_example_grads`.
    - `clip_norm`: C > 0.
    - `labels (N,)` int class ids and `n_classes` K for the per-class breakdown (None: skip it).
    - `grid`: clipping norms for the bias curve (default: `default_grid(norms)`, 40 values, fewer
      for models so large that 2 × 40 × P floats would pass `GRID_BYTES`); C is inserted into it.
    - `chunk_size`: examples per chunk of the streamed passes (None: the engine's byte-sized default).

    **Returns** a `ClippingAnalysis` (NumPy arrays, float64 for the bias curves).

    **Raises** `ValueError` if C ≤ 0 or as `per_example_grads`.

    Flat clipping: Abadi et al. 2016, Alg. 1. Per-layer clipping with C/√L per leaf: McMahan et al.
    2017. Per-class disparity: Bagdasaryan et al. 2019.
    """
    c = check_clip_norm(clip_norm)
    params = as_params(params)
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    p = engine.num_params(params)
    layer = engine.per_example_layer_norms(loss_fn, params, xs, ys, chunk_size=chunk_size)
    layer = {k: np.asarray(v, np.float64) for k, v in layer.items()}
    lsq = np.stack([np.square(v) for v in layer.values()], 1)  # (N, L), leaves in tree order
    norms = np.sqrt(lsq.sum(1))
    n, n_leaves = lsq.shape
    size = grid_size(n, p)
    base = default_grid(norms, size) if grid is None else np.asarray(grid, np.float64)
    full = np.unique(np.append(base[np.isfinite(base) & (base > 0)], c if np.isfinite(c) else base.max()))
    index = int(np.searchsorted(full, c if np.isfinite(c) else base.max()))
    g = len(full)
    k = int(n_classes) if labels is not None else 0
    # weight columns, all leaves: [1 | min(1, C_g/‖gᵢ‖) per C_g | class j | class j clipped at C]
    scale = np.minimum(1.0, full[None, :] / np.maximum(norms, 1e-30)[:, None])  # (N, G)
    onehot = np.eye(k)[np.asarray(labels)] if k else np.zeros((n, 0))
    s_c = np.minimum(1.0, c / np.maximum(norms, 1e-30))
    cols = np.concatenate([np.ones((n, 1)), scale, onehot, onehot * s_c[:, None]], 1)
    sums = _flat(engine.weighted_grads(loss_fn, params, xs, ys, cols, chunk_size=chunk_size))
    total, flat_g, cls, cls_c = sums[0], sums[1:1 + g], sums[1 + g:1 + g + k], sums[1 + g + k:]
    # per-layer clipping: leaf l is clipped to C_g/√L by its own norm, so it has its own columns
    lnorm = np.sqrt(lsq)
    lcols = [np.minimum(1.0, full[None, :] / np.sqrt(n_leaves) / np.maximum(lnorm[:, l], 1e-30)[:, None])
             for l in range(n_leaves)]
    layer_g = _flat(engine.weighted_grads(loss_fn, params, xs, ys, lcols, chunk_size=chunk_size))
    cos, ratio = _cos_ratio(flat_g, total[None])
    cos_l, ratio_l = _cos_ratio(layer_g, total[None])
    cl = full[:, None, None] / np.sqrt(n_leaves)
    frac = (norms[None, :] > full[:, None]).mean(1)
    frac_l = (lnorm[None] > cl).any(-1).mean(1)
    layer_clipped = np.sqrt(np.sum(np.minimum(lnorm, c / np.sqrt(n_leaves)) ** 2, 1))
    if labels is not None:
        labels_np = np.asarray(labels)
        counts = np.bincount(labels_np, minlength=k)[:k]
        clipped = norms > c
        with np.errstate(invalid="ignore"):
            cfrac = np.array([clipped[labels_np == j].mean() if counts[j] else np.nan for j in range(k)])
        ccos, cratio = _cos_ratio(cls_c, cls)
    else:
        counts = cfrac = ccos = cratio = np.zeros(0)
    return ClippingAnalysis(
        clip_norm=c,
        norms=norms,
        clipped_norms=np.minimum(norms, c),
        layer_norms=layer,
        layer_clipped_norms=layer_clipped,
        grid=full,
        index=index,
        cosine=cos,
        norm_ratio=ratio,
        cosine_layer=cos_l,
        norm_ratio_layer=ratio_l,
        fraction_clipped=frac,
        fraction_clipped_layer=frac_l,
        class_counts=counts,
        class_fraction_clipped=cfrac,
        class_cosine=ccos,
        class_norm_ratio=cratio,
        mean_norm=float(np.linalg.norm(total) / n),
        clipped_mean_norm=float(np.linalg.norm(flat_g[index]) / n),
        num_params=int(total.size),
    )


@dataclasses.dataclass(frozen=True)
class SignalToNoise:
    """The noise DP-SGD adds against the signal it perturbs, for one step with batch size B.

    - `noise_std`: σ·C/B, the std of each coordinate of the noise on the averaged gradient.
    - `noise_norm`: σ·C·√P/B, the expected norm of that noise vector (P parameters).
    - `signal_norm`: ‖Ḡ_C‖, the norm of the clipped mean gradient.
    - `ratio`: signal_norm / noise_norm (above 1: the step mostly follows the data).
    """

    noise_std: float
    noise_norm: float
    signal_norm: float
    ratio: float


def signal_to_noise(analysis: ClippingAnalysis, noise_multiplier: float, batch_size: float) -> SignalToNoise:
    """Compare the per-step noise σC/B (per coordinate; ×√P in norm) with the clipped mean gradient.

    **Arguments** `analysis` from `clipping_analysis`; `noise_multiplier` σ ≥ 0; `batch_size` B > 0
    (for Poisson sampling the expected batch size qN).

    **Returns** a `SignalToNoise` (ratio is inf when σ = 0).

    **Raises** `ValueError` if σ < 0 or B ≤ 0.
    """
    sigma = check_noise_multiplier(noise_multiplier)
    b = check_batch_size(batch_size)
    std = noise_std_of_mean(analysis.clip_norm, sigma, b) if sigma > 0 else 0.0
    norm = std * np.sqrt(analysis.num_params)
    signal = analysis.clipped_mean_norm
    return SignalToNoise(std, norm, signal, signal / norm if norm > 0 else np.inf)
