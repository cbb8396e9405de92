"""An influence function at the trained checkpoint with Kronecker-factored curvature (EK-FAC, George et al. 2018;
K-FAC, Martens & Grosse 2015), as Grosse et al. 2023 and Kronfluence compute it for large networks: no re-converged
θ̂, the Hessian replaced by the damped Fisher F + δI, factored per layer from the rules' activations aᵢ and output
gradients δᵢ (`gradlab.influence.curvature`). τ = (1/N) ∇ℓ(z)ᵀ(F + δI)⁻¹∇ℓ(zᵢ): the influence function's sign and
scale (positive = proponent, the predicted rise of the test loss if zᵢ were removed)."""

from __future__ import annotations

import weakref

import jax
import jax.numpy as jnp
import numpy as np

from gradlab import memory
from gradlab.influence import curvature
from gradlab.influence.protocol import Context, Control, Method, Scored, Work

#: The projection dimensions the page offers, and no projection (every factor exact).
PROJ_DIMS = (64, 128, 256, 512, 1024, 2048)
EXACT = "none (exact)"
#: The default k: every layer of the digits MLP is exact; seed 003's SimpleCNN projects fc1's 9,216 inputs to 512.
DEFAULT_K = "512"
#: How many training examples the curvature is estimated on (a fixed random subset), and all of them. The default:
#: SimpleCNN's preparation within the 30 CPU-s a visitor's settings may cost (19 measured).
EXAMPLES = (500, 1000, 2000, 4000)
ALL = "all"
DEFAULT_EXAMPLES = "1000"
KINDS = {"ekfac": "EK-FAC (eigenvalue-corrected)", "kfac": "K-FAC (Kronecker eigenvalues)"}
FISHERS = {"sampled": "true Fisher (labels sampled from the model)", "empirical": "empirical Fisher (dataset labels)"}
#: One curvature pass (a forward and a backward pass to the layers' outputs, then the factors' or the eigenbasis'
#: products) per example, against a plain streamed pass's (`Work.pass_seconds`, `costs.pass_seconds`: convolutions by
#: their multiply-adds); the set-up (tracing, compiling two programs, the sampled labels' forward pass, the
#: eigendecompositions): `SETUP_SECONDS` plus P / `SETUP_RATE` CPU-seconds. From
#: `python -m benchmarks.ekfac_scale --warm` (docs/influence.md), seed 003's SimpleCNN (1.2 M parameters, 6,000
#: examples), EK-FAC at k = 512 on 1,000 of them: 19.2 CPU-s cold, 10.2 compiled, so about 4.5 CPU-ms per example
#: and pass (its 288 × 288 convolution factor, T·I² = 48 M multiply-adds per example, dominates) and 9 CPU-s of
#: compiling; its self-influence over all 6,000 in 25.2 CPU-s; a plain pass is estimated at 1.9 CPU-ms per example.
#: First answer (prepare, a cold test point, self-influence) estimated 59 CPU-s against 65 measured. The digits MLP
#: prepares in about 2.5 CPU-s, nearly all set-up.
PASS_FACTOR = 2.3
SETUP_SECONDS = 2.0
SETUP_RATE = 1.5e5


def proj_dim(settings) -> int | None:
    """The projection k a setting names; None for `EXACT`."""
    return None if settings["ekfac_k"] == EXACT else int(settings["ekfac_k"])


def examples(settings, n: int) -> int:
    """How many of the `n` training examples the curvature is estimated on."""
    return n if settings["ekfac_examples"] == ALL else min(n, int(settings["ekfac_examples"]))


#: Examples per step of the sampled labels' forward pass: seed 003's SimpleCNN holds about 1 MB of activations per
#: example; `losses.FORWARD_CHUNK` (64) over all 6,000 examples measured ~30 MB more at a compiled preparation's peak.
FORWARD_CHUNK = 8


def model_outputs(fitted, xs):
    """The model's outputs on `xs`: logits or log-probabilities `(N, K)` for classification, `(N,)` for
    regression (in chunks of `FORWARD_CHUNK`)."""
    model = fitted.model
    apply = model if fitted.predict_fn is None else (lambda x: fitted.predict_fn(model, x))
    return jax.lax.map(apply, jnp.asarray(xs), batch_size=FORWARD_CHUNK)


def curvature_labels(fitted, fisher: str, seed: int, rows=None):
    """The labels the curvature's δ is taken at, for the training examples `rows` (None: all): the dataset's
    (`"empirical"`), or drawn from the model's predictive distribution (`"sampled"`, `curvature.fisher_labels`)."""
    rows = np.arange(len(fitted.data.y_train)) if rows is None else np.asarray(rows)
    ys = jnp.asarray(fitted.data.y_train[rows])
    if fisher == "empirical":
        return ys
    out = model_outputs(fitted, fitted.data.x_train[rows])
    return curvature.fisher_labels(jax.random.key(seed), out, fitted.data.task).astype(ys.dtype)


#: `Ekfac.applies`' answer per fitted model, dropped with it.
_APPLIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Ekfac(Method):
    """Representation: a test example by (F + δI)⁻¹∇ℓ(z) (preconditioned per layer in its Kronecker eigenbasis), a
    training example by its gradient at the trained model (streamed). Prepared state: the `curvature.Curvature`
    (two streamed passes for EK-FAC, one for K-FAC), independent of δ."""

    name, label, short = "ekfac", "Influence function, EK-FAC curvature (trained model, no θ̂)", "EK-FAC"
    #: Prepared only when picked (or for the LDS): its curvature's passes and eigendecompositions beside every other
    #: method took the extreme links' server to 703 MB (tests/test_browser.py, limit 690).
    on_demand = True
    self_label, self_short = "EK-FAC influence ∇ℓᵢᵀ(F + δI)⁻¹∇ℓᵢ / N at the trained model", "EK-FAC"
    controls = (
        Control("ekfac_kind", "infl_ekfac_kind", "Curvature", "ekfac", "select", tuple(KINDS), fmt=KINDS.get,
                help="**EK-FAC**: each layer's Kronecker eigenbasis Q_A ⊗ Q_S with the Fisher's own variance along "
                     "each basis vector (one more pass). **K-FAC**: the Kronecker product's eigenvalues λ_A·λ_S."),
        Control("ekfac_fisher", "infl_ekfac_fisher", "Fisher", "sampled", "select", tuple(FISHERS), fmt=FISHERS.get,
                help="Which labels the curvature's output gradients are taken at. Sampled from the model's own "
                     "predictions: the true Fisher, the Gauss–Newton matrix of cross-entropy (Kronfluence's default). "
                     "The dataset's: the empirical Fisher, near zero on examples the model already fits."),
        Control("ekfac_k", "infl_ekfac_k", "Projection k (per layer side)", DEFAULT_K, "slider",
                (*map(str, PROJ_DIMS), EXACT),
                help="A layer with more than k inputs (or outputs) first projects them to k by a fixed Gaussian "
                     "matrix (LoGra), so its factor is k × k: seed 003's fc1 has 9,216 inputs, whose exact factor "
                     "takes 340 MB. Layers of at most k keep their exact factors."),
        Control("ekfac_examples", "infl_ekfac_n", "Examples for the curvature", DEFAULT_EXAMPLES, "slider",
                (*map(str, EXAMPLES), ALL),
                help="The factors and the eigenvalue correction are means over this many training examples (a fixed "
                     "random subset; every example is still scored). Preparing costs two passes over them: on seed "
                     "003's SimpleCNN about 9 CPU-ms per example (its 288-input convolution's factor dominates)."),
    )
    prepare_reads = ("ekfac_kind", "ekfac_fisher", "ekfac_k", "ekfac_examples")
    reads = ("damping", "ekfac_kind", "ekfac_fisher", "ekfac_k", "ekfac_examples")

    def applies(self, fitted) -> str | None:
        try:
            return _APPLIES[fitted]
        except (KeyError, TypeError):
            pass
        x, y = fitted.data.x_train[0], fitted.data.y_train[0]
        try:
            lay = curvature.layout(fitted.loss_fn, fitted.model, jnp.asarray(x), jnp.asarray(y))
            why = None if lay.sites else ("the model has no dense or convolution layer whose weight the rules "
                                          "factor as activations ⊗ output gradients")
        except Exception as err:  # noqa: BLE001  a loss the tracer cannot follow
            why = f"its loss could not be traced for the layers' factors ({type(err).__name__})"
        try:
            _APPLIES[fitted] = why  # traced once per fitted model (the page asks on every rerun)
        except TypeError:
            pass
        return why

    def cost_seconds(self, work: Work, settings) -> float:
        # set-up, the factors' pass and (EK-FAC) the correction's over the curvature's examples, one test point's
        # scoring pass, and the self-influence pass over all n (the page computes every method's)
        passes = 1 if settings["ekfac_kind"] == "kfac" else 2
        curvature_pass = PASS_FACTOR * work.pass_seconds(1, setup=False)  # per example
        return (SETUP_SECONDS + int(work.num_params) / SETUP_RATE + work.pass_seconds()
                + (passes * examples(settings, work.n) + work.n) * curvature_pass)

    def held_bytes(self, work: Work, settings) -> int:
        # From the leaves' shapes: a matrix (O, I…) as one site I × O, each side over k projected (its P·Q kept),
        # A, S, Q_A, Q_S, Λ, and numpy's float64 eigendecomposition of the largest factor; a vector diagonal. Without
        # shapes, from P alone: the factors as if each side were k (unprojected: one square layer of P weights).
        # `prepare` checks the exact bytes of the layers it finds (`curvature.Layout.held_bytes`).
        p, k = int(work.num_params), proj_dim(settings)
        if not work.shapes:
            side = int(np.sqrt(p)) if k is None else min(k, p)
            return 4 * (2 * p + 3 * side * side)
        floats, largest = p, 0  # one preconditioned test vector
        for shape in work.shapes:
            size = int(np.prod(shape))
            if len(shape) < 2:
                floats += size
                continue
            o, i = int(shape[0]), size // int(shape[0])
            ki, ko = (i, o) if k is None else (min(i, k), min(o, k))
            floats += 2 * ki * ki + 2 * ko * ko + ki * ko + (i * ki if ki < i else 0) + (o * ko if ko < o else 0)
            largest = max(largest, ki, ko)
        return 4 * floats + 8 * 3 * largest * largest

    def fix(self, work: Work, settings) -> str:
        fits = [d for d in PROJ_DIMS if self.held_bytes(work, {**settings, "ekfac_k": str(d)}) <= memory.BUDGET_BYTES]
        return (f"Set the EK-FAC settings' **Projection k** to {fits[-1]} or less." if fits
                else "Use a smaller model for EK-FAC.")

    def prepare(self, ctx: Context):
        f, s = ctx.fitted, ctx.settings
        xs, ys = ctx.arrays()
        lay = curvature.layout(f.loss_fn, f.model, xs[0], ys[0], proj_dim=proj_dim(s))
        k = proj_dim(s)
        memory.check(f"{KINDS[s['ekfac_kind']]} factors", lay.held_bytes(),
                     "Set the EK-FAC settings' **Projection k** lower" + (f" than {k}." if k else " (e.g. 512)."))
        seed = getattr(getattr(f, "experiment", None), "seed", 0)
        m = examples(s, len(ys))
        pick = np.sort(np.random.default_rng(seed).permutation(len(ys))[:m]) if m < len(ys) else np.arange(len(ys))
        labels = curvature_labels(f, s["ekfac_fisher"], seed, pick)
        return curvature.fit(lay, f.model, xs[pick], labels, corrected=s["ekfac_kind"] == "ekfac",
                             fisher=s["ekfac_fisher"])

    def note(self, state) -> str | None:
        lay = state.layout
        n, d = len(lay.sites), len(lay.diagonal)
        proj = sum(1 for s in lay.sites if s.k_in < s.inputs or s.k_out < s.outputs)
        return (f"{KINDS['ekfac' if state.corrected else 'kfac']} over {n} layer{'s' * (n != 1)} "
                f"({FISHERS[state.fisher]}, estimated on {state.n:,} examples), at the trained model"
                + (f"; {proj} projected (LoGra)" if proj else "")
                + (f"; {d} {'leaves' if d != 1 else 'leaf'} (biases, scales, …) with a diagonal curvature" if d else "")
                + ".")

    def scores(self, ctx: Context, state, test_xs, test_ys) -> Scored:
        xs, ys = ctx.arrays()
        damping = float(ctx.settings["damping"])
        values = curvature.influence(state, ctx.fitted.model, xs, ys, test_xs, test_ys, damping=damping)
        kind = KINDS["ekfac" if state.corrected else "kfac"]
        return Scored(np.asarray(values), caption=f"{kind} at the trained model, {FISHERS[state.fisher]}, "
                                                  f"δ = {damping:g}: (1/N) ∇ℓ(z)ᵀ(F + δI)⁻¹∇ℓ(zᵢ).")

    def self_influence(self, ctx: Context, state) -> np.ndarray:
        xs, ys = ctx.arrays()
        return np.asarray(curvature.self_influence(state, ctx.fitted.model, xs, ys,
                                                   damping=float(ctx.settings["damping"])))


METHOD = Ekfac()

__all__ = ["METHOD", "Ekfac", "curvature_labels", "model_outputs", "proj_dim"]
