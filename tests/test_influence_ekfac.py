"""EK-FAC and K-FAC curvature from the rules' factors (`gradlab.influence.curvature`, the `ekfac` method), against
independent oracles in float64: activations and output gradients formed by hand (numpy im2col for the convolution),
per-example gradients from a Python loop of `jax.grad`, the explicit empirical Fisher and its dense inverse, the
dense EK-FAC formula, and the exact influence function at θ̂ on the digits MLP."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax import lax
from scipy.stats import spearmanr

from conftest import FAST, assert_clean, open_page
from gradlab import losses, memory, store
from gradlab.experiment import Experiment, fit
from gradlab.influence import METHODS, methods
from gradlab.influence import curvature as cv
from gradlab.influence import fitted as ifit
from gradlab.influence.protocol import Context
from gradlab.models import SimpleCNN


def _rng(seed):
    return np.random.default_rng(seed)


# ------------------------------------------------------------------ toy models, written out so a, δ can be formed


def mlp_loss(p, x, y):
    """Cross-entropy of softmax(tanh(x W1 + b1) W2 + b2): two dense sites (W1 (I, H), W2 (H, K)), two biases."""
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    z = h @ p["w2"] + p["b2"]
    return jax.nn.logsumexp(z) - z[y]


def mlp_params(seed=0, i=6, h=5, k=3):
    r = _rng(seed)
    return {"w1": jnp.asarray(r.normal(size=(i, h)) / np.sqrt(i)), "b1": jnp.asarray(0.1 * r.normal(size=h)),
            "w2": jnp.asarray(r.normal(size=(h, k)) / np.sqrt(h)), "b2": jnp.asarray(0.1 * r.normal(size=k))}


def mlp_formed(p, xs, ys):
    """Per example: [(a (1, I), δ (1, H)), (a (1, H), δ (1, K))], formed in numpy float64 by the chain rule."""
    w1, b1, w2, b2 = (np.asarray(p[k], np.float64) for k in ("w1", "b1", "w2", "b2"))
    out = []
    for x, y in zip(np.asarray(xs, np.float64), np.asarray(ys)):
        h = np.tanh(x @ w1 + b1)
        z = h @ w2 + b2
        q = np.exp(z - z.max())
        q /= q.sum()
        d2 = q - np.eye(len(z))[y]
        d1 = (w2 @ d2) * (1 - h ** 2)
        out.append([(x[None], d1[None]), (h[None], d2[None])])
    return out


def conv_loss(p, x, y):
    """A 3×3 convolution (C=2 → O=4, padding 1, `lax.conv_general_dilated`, NCHW / OIHW) on a 5×5 image, tanh, a
    dense head: sites `conv` (I = 2·9, O = 4, T = 25 positions) and `head`."""
    z = lax.conv_general_dilated(x[None], p["conv"], (1, 1), ((1, 1), (1, 1)))[0]  # (4, 5, 5)
    h = jnp.tanh(z + p["cb"][:, None, None])
    out = h.reshape(-1) @ p["head"]
    return jax.nn.logsumexp(out) - out[y]


def conv_params(seed=0):
    r = _rng(seed)
    return {"conv": jnp.asarray(r.normal(size=(4, 2, 3, 3)) / 4), "cb": jnp.asarray(0.1 * r.normal(size=4)),
            "head": jnp.asarray(r.normal(size=(100, 3)) / 10)}


def conv_formed(p, xs, ys):
    """Per example: [(patches (25, 18) in (C, kh, kw) order, δ (25, 4) at the conv's output), (h (1, 100), δ (1, 3))
    of the head]: numpy im2col and forward pass; the conv's δ by `jax.grad` of the loss in an output perturbation
    (no rules involved), the head's softmax − onehot."""
    def loss_at(e, x, y):
        z = lax.conv_general_dilated(x[None], p["conv"], (1, 1), ((1, 1), (1, 1)))[0] + e
        h = jnp.tanh(z + p["cb"][:, None, None])
        out = h.reshape(-1) @ p["head"]
        return jax.nn.logsumexp(out) - out[y]

    grad = jax.jit(jax.grad(loss_at))
    out = []
    for x, y in zip(xs, ys):
        xp = np.pad(np.asarray(x, np.float64), ((0, 0), (1, 1), (1, 1)))
        patches = np.array([xp[:, r:r + 3, c:c + 3].ravel() for r in range(5) for c in range(5)])  # (25, 18)
        d = np.asarray(grad(jnp.zeros((4, 5, 5)), x, y), np.float64)              # (4, 5, 5)
        z = np.einsum("tj,oj->ot", patches, np.asarray(p["conv"], np.float64).reshape(4, -1))  # (4, 25)
        h = np.tanh(z + np.asarray(p["cb"], np.float64)[:, None]).reshape(-1)
        out_ = h @ np.asarray(p["head"], np.float64)
        q = np.exp(out_ - out_.max())
        out.append([(patches, d.reshape(4, 25).T), (h[None], (q / q.sum() - np.eye(3)[y])[None])])
    return out


def _loop_grads(loss, p, xs, ys):
    """Per-example gradients by a Python loop of `jax.grad`, {name: (N, *shape)} float64."""
    grad = jax.jit(jax.grad(loss))  # compiled once, called once per example
    rows = [grad(p, x, y) for x, y in zip(xs, ys)]
    return {k: np.stack([np.asarray(r[k], np.float64) for r in rows]) for k in p}


def _mlp_data(n=40, seed=1, i=6, k=3):
    r = _rng(seed)
    return jnp.asarray(r.normal(size=(n, i))), jnp.asarray(r.integers(0, k, n))


def _conv_data(n=12, seed=2):
    r = _rng(seed)
    return jnp.asarray(r.normal(size=(n, 2, 5, 5))), jnp.asarray(r.integers(0, 3, n))


# ------------------------------------------------------------------ (1) the factors are the explicit sums


def test_factors_are_the_explicit_sums_over_examples_and_tokens(x64):
    """A = (1/N) Σₙ Σₜ aaᵀ and S = (1/N) Σₙ (1/T) Σₜ δδᵀ (KFC), with a and δ formed by hand, for a dense model (T = 1)
    and a convolution (T = 25 positions, a = numpy patches); the biases' diagonal blocks are (1/N) Σₙ gₙ² from a loop
    of jax.grad."""
    for loss, p, (xs, ys), formed, names in (
            (mlp_loss, mlp_params(), _mlp_data(), mlp_formed, ("w1", "w2")),
            (conv_loss, conv_params(), _conv_data(), conv_formed, ("conv", "head"))):
        lay = cv.layout(loss, p, xs[0], ys[0])
        leaf_names = sorted(p)  # a dict's leaves in key order
        assert [leaf_names[s.leaf] for s in lay.sites] == sorted(names)
        A, S, D = cv.factors(lay, p, xs, ys)
        per = formed(p, xs, ys)
        order = [list(names).index(leaf_names[s.leaf]) for s in lay.sites]
        for s, a_got, s_got, j in zip(lay.sites, A, S, order):
            a_want = np.mean([a.T @ a for ex in per for a in [ex[j][0]]], axis=0)
            s_want = np.mean([d.T @ d / d.shape[0] for ex in per for d in [ex[j][1]]], axis=0)
            np.testing.assert_allclose(np.asarray(a_got)[0], a_want, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(np.asarray(s_got)[0], s_want, rtol=1e-10, atol=1e-12)
            assert s.tokens == per[0][j][0].shape[0]
        g = _loop_grads(loss, p, xs, ys)
        assert [leaf_names[j] for j in lay.diagonal] == sorted(set(p) - set(names))
        for j, d in zip(lay.diagonal, D):
            np.testing.assert_allclose(d, np.mean(g[leaf_names[j]] ** 2, axis=0), rtol=1e-10, atol=1e-14)


# ------------------------------------------------------------------ (2) exact where the Kronecker form is


def one_layer_loss(p, x, y):
    z = x @ p["w"]
    return jax.nn.logsumexp(z) - z[y]


def test_kfac_inverse_is_the_dense_inverse_where_the_kronecker_form_is_exact(x64):
    """One dense layer, every example the same input x (labels differ): F = (1/N) Σ (x ⊗ δₙ)(x ⊗ δₙ)ᵀ = xxᵀ ⊗ S exactly,
    so K-FAC's and EK-FAC's (F + δI)⁻¹g equal np.linalg.solve on the explicit empirical Fisher (from a loop of
    jax.grad), at δ = 0 its pseudo-inverse (np.linalg.pinv), and the scores (1/N) g_testᵀ(F + δI)⁻¹gₙ too."""
    r = _rng(3)
    p = {"w": jnp.asarray(r.normal(size=(4, 3)))}
    x = r.normal(size=4)
    xs, ys = jnp.asarray(np.tile(x, (9, 1))), jnp.asarray(r.integers(0, 3, 9))
    g = _loop_grads(one_layer_loss, p, xs, ys)["w"].reshape(9, -1)  # factor layout = the weight's own (I, O)
    fisher = g.T @ g / 9
    test = r.normal(size=(2, 12))
    lay = cv.layout(one_layer_loss, p, xs[0], ys[0])
    for corrected in (False, True):
        curv = cv.fit(lay, p, xs, ys, corrected=corrected)
        for damping in (1e-3, 0.5):
            want = np.linalg.solve(fisher + damping * np.eye(12), test.T).T
            got = cv.precondition(curv, [jnp.asarray(test.reshape(2, 4, 3))], damping)[0]
            np.testing.assert_allclose(np.asarray(got).reshape(2, -1), want, rtol=1e-8, atol=1e-10)
        # δ = 0: F is singular (A = xxᵀ has rank 1, S annihilates the all-ones output direction); the pseudo-inverse
        got = cv.precondition(curv, [jnp.asarray(test.reshape(2, 4, 3))], 0.0)[0]
        np.testing.assert_allclose(np.asarray(got).reshape(2, -1), test @ np.linalg.pinv(fisher, rcond=1e-10),
                                   rtol=1e-6, atol=1e-8)
        tx, ty = jnp.asarray(r.normal(size=(2, 4))), jnp.asarray([0, 2])
        gt = _loop_grads(one_layer_loss, p, tx, ty)["w"].reshape(2, -1)
        want = gt @ np.linalg.solve(fisher + 0.1 * np.eye(12), g.T) / 9
        np.testing.assert_allclose(cv.influence(curv, p, xs, ys, tx, ty, damping=0.1), want, rtol=1e-8, atol=1e-12)


# ------------------------------------------------------------------ (3) EK-FAC's correction


def test_ekfac_eigenvalues_are_the_fishers_diagonal_in_the_kronecker_eigenbasis(x64):
    """Λ* = diag((Q_A ⊗ Q_S)ᵀ F (Q_A ⊗ Q_S)), F = (1/N) Σ vec(Gₙ)vec(Gₙ)ᵀ of each site from a loop of jax.grad, Q_A and
    Q_S the eigenvectors of the explicit factors; on the MLP (T = 1) and the convolution (T = 25, the conv weight's
    gradient in (C·kh·kw, O) layout)."""
    for loss, p, (xs, ys), formed, names, as_factor in (
            (mlp_loss, mlp_params(), _mlp_data(), mlp_formed, ("w1", "w2"), lambda g: g),
            (conv_loss, conv_params(), _conv_data(), conv_formed, ("conv", "head"),
             lambda g: g.reshape(g.shape[0], 4, -1).transpose(0, 2, 1) if g.ndim == 5 else g)):
        lay = cv.layout(loss, p, xs[0], ys[0])
        curv = cv.fit(lay, p, xs, ys)
        grads = _loop_grads(loss, p, xs, ys)
        per = formed(p, xs, ys)
        leaf_names = sorted(p)
        for s, eig in zip(lay.sites, curv.eig):
            name = leaf_names[s.leaf]
            j = list(names).index(name)
            a = np.mean([ex[j][0].T @ ex[j][0] for ex in per], axis=0)
            sm = np.mean([ex[j][1].T @ ex[j][1] / ex[j][1].shape[0] for ex in per], axis=0)
            q = np.kron(np.linalg.eigh(a)[1], np.linalg.eigh(sm)[1])
            gf = as_factor(grads[name]).reshape(len(xs), -1)
            want = np.diag(q.T @ (gf.T @ gf / len(xs)) @ q).reshape(s.inputs, s.outputs)
            np.testing.assert_allclose(np.asarray(eig)[0], want, rtol=1e-8, atol=1e-12)


# ------------------------------------------------------------------ (4) the scores, densely


def _dense_ekfac(p, xs, ys, p_in=None, p_out=None):
    """EK-FAC (F + δI) as explicit matrices, float64, independent of the library: per site (in the projected space
    when `p_in`/`p_out` are given) the factors from formed a and δ, their eigenvectors, Λ* from a loop of jax.grad;
    biases diagonal. **Returns** `(features(grads) -> (n, F), blocks: [F_k])`, F's blocks in feature order."""
    per = mlp_formed(p, xs, ys)
    g = _loop_grads(mlp_loss, p, xs, ys)
    mats = {}
    for j, name in enumerate(("w1", "w2")):
        pi = np.eye(p[name].shape[0]) if p_in is None or p_in[j] is None else np.asarray(p_in[j])[0]
        po = np.eye(p[name].shape[1]) if p_out is None or p_out[j] is None else np.asarray(p_out[j])[0]
        a = np.mean([pi.T @ ex[j][0].T @ ex[j][0] @ pi for ex in per], axis=0)
        sm = np.mean([po.T @ ex[j][1].T @ ex[j][1] @ po for ex in per], axis=0)
        q = np.kron(np.linalg.eigh(a)[1], np.linalg.eigh(sm)[1])
        proj = lambda gr, pi=pi, po=po: np.einsum("ik,nio,ol->nkl", pi, gr, po).reshape(len(gr), -1)  # noqa: E731
        f = proj(g[name])
        lam = np.mean((f @ q) ** 2, axis=0)
        mats[name] = (proj, q @ np.diag(lam) @ q.T)
    for name in ("b1", "b2"):
        mats[name] = (lambda gr: gr, np.diag(np.mean(g[name] ** 2, axis=0)))
    order = sorted(p)

    def features(grads):
        return np.concatenate([mats[k][0](grads[k]) for k in order], axis=1)

    blocks = [mats[k][1] for k in order]
    return features, blocks


@pytest.mark.parametrize("k", [None, 4])
def test_ekfac_scores_and_self_influence_equal_the_dense_formula(x64, k):
    """τ = (1/N) φ(z)ᵀ(F̃ + δI)⁻¹φ(zₙ) and self-influence (1/N) φₙᵀ(F̃ + δI)⁻¹φₙ with F̃ the EK-FAC matrix built densely
    (block-diagonal over leaves), φ the gradient (k = None) or its LoGra projection P_inᵀ G P_out (k = 4: the MLP's
    6 and 5 wide sides projected with the library's own P, the 3 classes kept), gradients from a loop of jax.grad."""
    p = mlp_params()
    xs, ys = _mlp_data()
    tx, ty = _mlp_data(3, seed=9)
    lay = cv.layout(mlp_loss, p, xs[0], ys[0], proj_dim=k)
    curv = cv.fit(lay, p, xs, ys)
    p_in, p_out = cv.projections(lay)
    features, blocks = _dense_ekfac(p, xs, ys, p_in, p_out)
    damping = 0.05
    f = scipy.linalg.block_diag(*blocks) + damping * np.eye(sum(b.shape[0] for b in blocks))
    phi, phi_t = features(_loop_grads(mlp_loss, p, xs, ys)), features(_loop_grads(mlp_loss, p, tx, ty))
    want = phi_t @ np.linalg.solve(f, phi.T) / len(xs)
    np.testing.assert_allclose(cv.influence(curv, p, xs, ys, tx, ty, damping=damping), want, rtol=1e-8, atol=1e-12)
    want_self = np.einsum("nf,fn->n", phi, np.linalg.solve(f, phi.T)) / len(xs)
    np.testing.assert_allclose(cv.self_influence(curv, p, xs, ys, damping=damping), want_self, rtol=1e-8)


# ------------------------------------------------------------------ (5) against the exact influence function


def _extremes_spearman(exact, other, k=50):
    """Spearman's ρ of two score vectors over the exact scores' top-k proponents and top-k opponents."""
    idx = np.r_[np.argsort(-exact)[:k], np.argsort(exact)[:k]]
    return spearmanr(exact[idx], other[idx])[0]


@pytest.mark.slow
def test_ekfac_ranks_proponents_and_opponents_as_the_exact_influence_function_on_digits():
    """The digits MLP (`Experiment()`, 1,437 training examples), 8 test points: the ekfac method (sampled-label
    Fisher on every example, k = 512: every layer exact, at the TRAINED model, δ = 0.01) against the influence function at θ̂ with the
    exact Hessian (the `influence` method): Spearman's ρ over the exact scores' 50 top proponents and 50 top
    opponents is positive for every point and on average above the plain gradient dot product's. Measured: EK-FAC
    0.39 to 0.76 (mean 0.54), grad-dot 0.31 to 0.65 (mean 0.44); EK-FAC at θ̂ itself 0.59 to 0.87 (δ = 0.01)."""
    f = fit(Experiment())
    ctx = ifit.context(f, {"ekfac_examples": "all"})
    pts = [ifit.test_point(f, r) for r in range(8)]
    txs, tys = jnp.stack([q[0] for q in pts]), jnp.stack([q[1] for q in pts])
    exact = METHODS["influence"].scores(ctx, ctx.optimum(), txs, tys).values
    dots = METHODS["grad_dot"].scores(ctx, None, txs, tys).values
    ek = METHODS["ekfac"]
    got = ek.scores(ctx, ek.prepare(ctx), txs, tys).values
    rho = np.array([_extremes_spearman(a, b) for a, b in zip(exact, got)])
    rho_dot = np.array([_extremes_spearman(a, b) for a, b in zip(exact, dots)])
    print(f"Spearman (extremes) EK-FAC {np.round(rho, 2)} mean {rho.mean():.2f}; grad-dot mean {rho_dot.mean():.2f}")
    assert np.all(rho > 0.2), rho
    assert rho.mean() > rho_dot.mean(), (rho, rho_dot)


@pytest.mark.slow
def test_the_influence_page_picks_ekfac_by_its_url_code_and_shows_its_note():
    """Wiring: `infl_method=ekfac` on the Influence page (digits softmax regression: one dense site, its bias
    diagonal) ranks proponents under the method's label, shows its note and caption, and offers its controls."""
    at = open_page("influence", **dict(FAST, model="linear", infl_trak_models=2))
    at.selectbox(key="infl_method").set_value("ekfac")
    at.run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert any(h.value == f"Proponents and opponents: {METHODS['ekfac'].label}" for h in at.subheader)
    notes = [i.value for i in at.info]
    assert any("over 1 layer (" in v and "; 1 leaf (biases" in v for v in notes), notes
    assert any("(1/N) ∇ℓ(z)ᵀ(F + δI)⁻¹∇ℓ(zᵢ)" in c.value for c in at.caption)
    assert {"infl_ekfac_kind", "infl_ekfac_fisher", "infl_ekfac_k", "infl_ekfac_n"} <= {
        w.key for w in [*at.selectbox, *at.select_slider]}


def test_a_prepared_curvature_pickles_and_the_store_sizes_it_by_its_arrays():
    """The results store keeps a prepared state in memory (sized by `store.nbytes`) and on disk (pickled): the Layout
    pickles as what built it and comes back as the same object, so scores from the unpickled state are the same."""
    p = mlp_params()
    p = {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}
    xs, ys = _mlp_data()
    xs = xs.astype(jnp.float32)
    lay = cv.layout(mlp_loss, p, xs[0], ys[0])
    curv = cv.fit(lay, p, xs, ys)
    back = pickle.loads(pickle.dumps(curv))
    assert back.layout is lay
    arrays = sum(np.asarray(a).nbytes for group in (curv.m_in, curv.m_out, curv.eig, curv.diag, curv.a_factors,
                                                     curv.s_factors) for a in group)
    assert arrays <= store.nbytes(curv) < arrays + 4096
    np.testing.assert_array_equal(cv.influence(back, p, xs, ys, xs[:2], ys[:2], damping=0.1),
                                  cv.influence(curv, p, xs, ys, xs[:2], ys[:2], damping=0.1))


def test_exact_factors_of_seed_003s_fc1_are_refused_with_the_fix():
    """SimpleCNN's fc1 (9,216 inputs): with no projection `prepare` refuses before any pass (its A alone is 9,216²
    floats, over the compute budget) and names the control; at k = 512 the layout holds about 27 MB."""
    model = SimpleCNN((28, 28), 10, key=jax.random.key(0))
    r = _rng(0)
    data = SimpleNamespace(x_train=r.normal(size=(4, 784)).astype(np.float32), y_train=np.arange(4),
                           task="classification")
    fitted = SimpleNamespace(model=model, loss_fn=losses.cross_entropy, data=data, predict_fn=None)
    ek = METHODS["ekfac"]
    settings = {**methods.defaults(), "ekfac_k": "none (exact)"}
    with pytest.raises(memory.OverBudget, match="Projection k"):
        ek.prepare(Context(fitted, settings, lambda: None))
    lay = cv.layout(losses.cross_entropy, model, jnp.asarray(data.x_train[0]), 0, proj_dim=512)
    assert [(s.inputs, s.outputs, s.k_in, s.k_out) for s in lay.sites] == [
        (9, 32, 9, 32), (288, 64, 288, 64), (9216, 128, 512, 128), (128, 10, 128, 10)]
    assert 20 * memory.MB < lay.held_bytes() < 40 * memory.MB
