"""Every page's "exact JAX code" panel runs, and computes the numbers gradlab's library computes.

Each view passes its code to `ui.code_panel(...)` as one string literal. The test reads that string
from the view's source with `ast` (the view itself is not run), defines the free names the panel uses
from gradlab's own data and models (a small preamble per page), `exec`s it and compares its results with
the library functions the page calls. A panel that stops running, or drifts from what the page computes
(as the Influence panel once showed a solver the page did not use), fails here. The Influence and DP clipping
panels train models (θ̂, an LDS ensemble, DP-SGD steps): those two tests are marked slow.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gradlab import audit, clipping, engine, equivalence, geometry, membership, metrics, privacy, train
from gradlab.experiment import Experiment, init_model, load_data
from gradlab.influence import METHODS, evaluation, scores, solvers
from gradlab.influence.protocol import Context
from gradlab.losses import cross_entropy

VIEWS = Path(__file__).resolve().parents[1] / "views"


def panel_code(page: str) -> str:
    """The string literal passed to `ui.code_panel` in views/<page>.py (exactly one per page)."""
    tree = ast.parse((VIEWS / f"{page}.py").read_text())
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "attr", getattr(n.func, "id", None)) == "code_panel"]
    assert len(found) == 1, f"views/{page}.py has {len(found)} code_panel calls"
    arg = found[0].args[0]
    assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), f"views/{page}.py: the panel is not a literal"
    return arg.value


def run_panel(page: str, **names) -> dict:
    """exec the panel of `page` with `names` defined; return its namespace."""
    ns = dict(names)
    exec(compile(panel_code(page), f"<code panel of views/{page}.py>", "exec"), ns)
    return ns


def test_every_view_with_a_panel_is_covered():
    pages = {p.stem for p in VIEWS.glob("*.py") if "code_panel" in p.read_text()}
    assert pages == set(PAGES), f"panels without a test: {pages - set(PAGES)}; tests without a panel: {set(PAGES) - pages}"


def flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in jax.tree.leaves(tree)])


def close(a, b, rtol=1e-4):
    """Equal to `rtol` of the larger magnitude (float32 sums in another order differ in the last bits)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = max(np.max(np.abs(b)), 1e-30)
    assert np.max(np.abs(a - b)) <= rtol * scale, f"max |a - b| = {np.max(np.abs(a - b)):.3g}, scale {scale:.3g}"


@pytest.fixture(scope="module")
def small():
    """A small digits MLP (P = 1,210: the influence function solves by CG, as on the page by default) and
    64 training examples; the model is trained 20 steps so its gradients are not those of the initialization."""
    exp = Experiment(dataset="digits", model="mlp", width=16, steps=20, checkpoint_every=10)
    data = load_data(exp)
    xs, ys = jnp.asarray(data.x_train[:64]), jnp.asarray(data.y_train[:64])
    init = init_model(exp, data)
    run = train.train(init, cross_entropy, xs, ys, steps=20, checkpoint_every=10, lr=0.01)
    return dict(model=run.final, init=init, xs=xs, ys=ys, data=data)


PAGES = ("norms", "equivalence", "performance", "dp_clipping", "privacy_audit", "influence", "geometry", "record")


def test_norms_panel(small):
    ns = run_panel("norms", model=small["model"], xs=small["xs"], ys=small["ys"])
    m, xs, ys = small["model"], small["xs"], small["ys"]
    sq = np.square(np.asarray(engine.per_example_norms(cross_entropy, m, xs, ys), np.float64))
    g_sq = float(np.sum(flat(engine.batch_grad(cross_entropy, m, xs, ys, reduction="mean")) ** 2))
    close(ns["norms"], np.sqrt(sq))
    layer = engine.per_example_layer_norms(cross_entropy, m, xs, ys)
    close(np.stack(jax.tree.leaves(ns["layer_sq"]), 1), np.stack([np.square(v) for v in layer.values()], 1))
    assert float(ns["B_simple"]) == pytest.approx(metrics.gradient_noise_scale(sq, g_sq), rel=1e-3)


def test_equivalence_panel(small):
    m, xs, ys = small["model"], small["xs"], small["ys"]
    ns = run_panel("equivalence", model=m, xs=xs, ys=ys)
    cmp = equivalence.compare(cross_entropy, m, xs, ys, reduction="sum")
    close(flat(ns["way_a"]), np.concatenate([v.ravel() for v in cmp.way_a.values()]))
    close(flat(ns["way_b"]), np.concatenate([v.ravel() for v in cmp.way_b.values()]))
    assert {str(a.dtype) for a in jax.tree.leaves(ns["way_a64"])} == {"float64"}
    diffs = np.array(jax.tree.leaves(ns["diff"]), np.float64)
    assert np.all(np.isfinite(diffs)) and diffs.max() < 1e-4
    assert np.max(np.abs(flat(ns["way_a64"]) - flat(ns["way_b64"]))) / np.max(np.abs(flat(ns["way_b64"]))) < 1e-12
    assert cmp.max_rel64 < 1e-12


def test_performance_panel(small):
    m, xs, ys = small["model"], small["xs"][:32], small["ys"][:32]
    ns = run_panel("performance", model=m, xs=xs, ys=ys)
    ref = engine.per_example_grads(cross_entropy, m, xs, ys)
    per = ns["vmapped"](ns["params"], xs, ys)
    close(flat(per), flat(eqx.filter(ref, eqx.is_array)))
    close(flat(jax.tree.map(lambda *g: jnp.stack(g), *ns["loop"]())), flat(per))
    close(flat(ns["batch"](ns["params"])), flat(engine.batch_grad(cross_entropy, m, xs, ys)))
    close(ns["norms"], engine.per_example_norms(cross_entropy, m, xs, ys))
    assert np.isfinite(ns["compile_s"]) and ns["run_s"] > 0


@pytest.mark.slow  # clipping analysis and three DP-SGD steps both ways (~10 s)
def test_dp_clipping_panel(small):
    m, xs, ys = small["model"], small["xs"], small["ys"]
    q, C, sigma, T, seed, delta = 0.25, 0.5, 1.1, 3, 7, 1e-5
    buffer = train.dp_buffer_size(len(xs), q)
    opt = optax.sgd(0.1)
    ns = run_panel("dp_clipping", model=m, xs=xs, ys=ys, q=q, C=C, sigma=sigma, T=T, seed=seed, delta=delta,
                   buffer=buffer, optimizer=opt)
    a = clipping.clipping_analysis(cross_entropy, m, xs, ys, C)
    assert float(ns["cos"]) == pytest.approx(a.cosine[a.index], abs=1e-4)
    assert float(np.linalg.norm(flat(ns["G_C"]))) == pytest.approx(a.clipped_mean_norm, rel=1e-4)
    assert float(np.linalg.norm(flat(ns["G"]))) == pytest.approx(a.mean_norm, rel=1e-4)
    run = train.train_dp_sgd(m, cross_entropy, xs, ys, sample_rate=q, noise_multiplier=sigma, clip_norm=C,
                             optimizer=opt, steps=T, checkpoint_every=T, seed=seed, delta=delta)
    close(flat(ns["params"]), flat(eqx.filter(run.final, eqx.is_array)))
    assert ns["epsilon"] == pytest.approx(privacy.dp_sgd_epsilon(sample_rate=q, noise_multiplier=sigma, steps=T,
                                                                 delta=delta, accountant="rdp"), rel=1e-9)


def test_privacy_audit_panel():
    trials, sigma, steps, delta = 256, 0.4, 4, 1e-5
    res = audit.audit_dp_sgd(noise_multiplier=sigma, steps=steps, trials=trials, seed=0, delta=delta)
    rng = np.random.default_rng(0)  # audit_dp_sgd's draws: membership of each trial, then the run's seed
    is_in = rng.random(trials) < 0.5
    seed = int(rng.integers(2**31))
    np.testing.assert_array_equal(is_in, res.is_in)
    assert res.epsilon_lower > 0  # the comparison below is not only 0 = 0
    # a membership-inference pool: random logits of a target and of S shadows on N examples with K classes
    r = np.random.default_rng(1)
    n, s, k = 40, 6, 3
    labels = jnp.asarray(r.integers(0, k, n))
    target, shadows = r.normal(size=(n, k)), r.normal(size=(s, n, k))
    shadow_in = r.random((s, n)) < 0.5
    shadow_in[0] = False  # every example has an OUT shadow
    is_member = r.random(n) < 0.5
    ns = run_panel("privacy_audit", R=trials, is_in=is_in, q=1.0, sigma=sigma, C=1.0, T=steps, seed=seed,
                   t=res.threshold, direction=res.direction, delta=delta, target_logits=jnp.asarray(target),
                   shadow_logits=jnp.asarray(shadows), labels=labels, shadow_in=shadow_in, is_member=is_member,
                   target_losses=r.random(n), eps=2.0)
    close(ns["score"], res.scores)
    assert ns["eps_lower"] == pytest.approx(res.epsilon_lower, rel=1e-6)
    assert ns["mu_lower"] == pytest.approx(res.mu_lower, rel=1e-9) and res.mu_lower > 1  # μ = √T/σ = 5 in truth
    assert ns["eps_gdp"] == pytest.approx(res.estimates["Gaussian DP"], rel=1e-6)
    conf = membership.logit_confidence(target, labels)
    shadow_conf = np.stack([membership.logit_confidence(l, labels) for l in shadows])
    close(ns["lira"], membership.lira_offline_scores(conf, shadow_conf, shadow_in), rtol=1e-5)
    close(ns["bound"], membership.dp_roc_bound(ns["fpr"], 2.0, delta))
    assert metrics.roc(ns["lira"], is_member).auc == pytest.approx(np.trapezoid(ns["tpr"], ns["fpr"]), abs=1e-9)


@pytest.mark.slow  # trains θ̂, an LDS ensemble and TRAK (~15 s)
def test_influence_panel(small):
    m, init, xs, ys, data = small["model"], small["init"], small["xs"], small["ys"], small["data"]
    lam, damping = 1e-2, 1e-2
    x_tests, y_tests = jnp.asarray(data.x_test[:3]), jnp.asarray(data.y_test[:3])
    sgd_run = train.train(init, cross_entropy, xs, ys, optimizer="sgd", lr=0.1, steps=10, checkpoint_every=5)
    ns = run_panel("influence", model=m, init=eqx.filter(init, eqx.is_array), xs=xs, ys=ys, lam=lam, delta=damping,
                   x_test=x_tests[0], y_test=y_tests[0], sgd_run=sgd_run, models=[eqx.filter(m, eqx.is_array)],
                   x_tests=x_tests, y_tests=y_tests, K=data.n_classes, M=4)
    close(ns["grad_dot"], scores.grad_dot(cross_entropy, m, xs, ys, x_tests[0], y_tests[0]))
    # the page's projected gradients (its default after-kernel, k = 16 per side) are the panel's
    fitted = SimpleNamespace(model=m, loss_fn=cross_entropy, data=SimpleNamespace(
        x_train=xs, y_train=ys, x_test=x_tests[:1], y_test=y_tests[:1]))
    ctx = Context(fitted, {"logra_k": 16, "logra_kernel": "after"}, lambda: None)
    logra = METHODS["logra"]
    close(ns["projected"], logra.scores(ctx, logra.prepare(ctx), x_tests[:1], y_tests[:1]).values[0], rtol=1e-4)
    ckpts, lrs = scores.tracin_checkpoints(sgd_run)
    close(ns["tracin"], scores.tracin(cross_entropy, ckpts, lrs, xs, ys, x_tests[0], y_tests[0]))
    assert ns["base"].grad_norm < 1e-2  # L-BFGS near θ̂ (a ReLU network stalls at its kinks, ~4e-3 here)
    theta_hat = eqx.combine(ns["base"].params, eqx.partition(m, eqx.is_array)[1])  # the panel's θ̂ as the model
    assert solvers.resolve_method(engine.num_params(m))[0] == "cg"  # the page's default path is the panel's
    ref, info = scores.influence_scores(cross_entropy, theta_hat, xs, ys, x_tests[:1], y_tests[:1], l2=lam,
                                        damping=damping, method="auto")
    assert info.method == "cg"
    close(ns["predicted"], ref[0], rtol=2e-3)
    trak = scores.trak(cross_entropy, [m], xs, ys, x_tests, y_tests, proj_dim=engine.num_params(m), l2=lam,
                       n_classes=data.n_classes)
    close(ns["trak"], trak, rtol=1e-3)
    outputs = ns["outputs"]
    assert outputs.shape == (4, 3) and np.all(outputs < 0)  # −loss of each subset model on each test point
    assert ns["lds"] == pytest.approx(evaluation.lds(trak, ns["subsets"], outputs).mean, abs=1e-6)


def test_geometry_panel():
    p = geometry.problem("line")
    C, sigma, B, i = 2.0, 1.0, 8, 3
    ns = run_panel("geometry", xs=jnp.asarray(p.xs), ys=jnp.asarray(p.ys), C=C, sigma=sigma, B=B,
                   key=jax.random.key(0), i=i)
    theta = np.asarray(ns["theta"])
    close(ns["g"], geometry.arrows(p, theta))
    close(ns["G"], geometry.mean_arrow(p, theta))
    close(ns["clipped"], geometry.clip(geometry.arrows(p, theta), C))
    assert np.all(np.linalg.norm(np.asarray(ns["clipped"]), axis=1) <= C * (1 + 1e-6))
    assert np.all(np.isfinite(ns["noisy"]))
    r = geometry.remove_example(p, i)
    close(ns["theta_star"], r.optimum, rtol=1e-3)
    close(ns["retrained"], r.retrained, rtol=1e-3)
    close(ns["predicted"], r.predicted, rtol=1e-3)


def test_record_panel(small):
    from gradlab import record

    m, xs, ys, data = small["model"], small["xs"], small["ys"], small["data"]
    checkpoints = [small["init"], m]
    x_test, y_test = jnp.asarray(data.x_test[:32]), jnp.asarray(data.y_test[:32])
    rng = np.random.default_rng(0)
    masks = rng.random((6, 64)) < 0.5
    masks[0], masks[1] = True, False  # every example in and out of some model
    correct = rng.random((6, 64)) < 0.7
    i, C = 5, 0.5
    static = eqx.partition(m, eqx.is_array)[1]
    arrays = [eqx.partition(c, eqx.is_array)[0] for c in checkpoints]  # the panel differentiates the arrays

    def loss(params, x, y):
        return cross_entropy(eqx.combine(params, static), x, y)

    ns = run_panel("record", loss=loss, checkpoints=arrays, final=arrays[-1], xs=xs, ys=ys, i=i, C=C,
                   x_test=x_test, y_test=y_test, correct=correct, masks=masks)
    want = np.array([float(engine.per_example_norms(cross_entropy, c, xs[i:i + 1], ys[i:i + 1])[0]) for c in checkpoints])
    close(ns["norms_i"], want)
    assert float(ns["kept"]) == pytest.approx(min(1.0, C / want[-1]), rel=1e-5)
    assert float(ns["tracin_self"]) == pytest.approx(float(np.sum(want ** 2)), rel=1e-4)
    g = jax.tree.map(lambda a: a[0], engine.per_example_grads(cross_entropy, m, xs[i:i + 1], ys[i:i + 1]))
    close(ns["dots"], engine.per_example_dots(cross_entropy, m, x_test, y_test, g))
    close(ns["memorization"], record.memorization(correct, masks).value)
