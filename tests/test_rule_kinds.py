"""Rule kinds added through the registry, and leaves the rules used to get wrong, against a Python loop of jax.grad:
complex weights (real norms, conjugate dots, clipped sums), a zero-size leaf, a test-only kind registered from
this module, and the Kronecker projection hook (`rules.project`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from gradlab import engine, rules
from rule_kind_example import ROW_WINDOW
from testdata import normal


def _loop(loss_fn, params, xs, ys):
    """Per-example gradients by a Python loop of `jax.grad` (no vmap), stacked; JAX's complex convention."""
    g = jax.grad(loss_fn)
    rows = [g(params, xs[i], ys[i]) for i in range(xs.shape[0])]
    return jax.tree.map(lambda *r: np.stack(r), *rows)


def _norms(grads):
    flat = np.concatenate([np.reshape(a, (a.shape[0], -1)) for a in jax.tree.leaves(grads)], axis=1)
    return np.sqrt(np.sum(np.abs(flat.astype(np.complex128)) ** 2, axis=1))


def _plan(loss_fn, params, x, y):
    """The rules' view of one example's loss through the public `gradlab.rules` API, as the engine builds it:
    `(graph, plan, leaves)`, the leaves being `params`' in tree order."""
    leaves, tree = jax.tree.flatten(params)
    flat = lambda ls, x, y: loss_fn(jax.tree.unflatten(tree, ls), x, y)  # noqa: E731
    sds = lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a))  # noqa: E731
    graph = rules.trace(flat, [sds(a) for a in leaves], sds(x), sds(y))
    n = len(leaves)
    return graph, rules.plan(graph, graph.inputs[:n], graph.inputs[n:]), leaves


def _a_and_delta(graph, pl, leaves, x, y):
    """One example's saved operands a and output gradients δ, per ruled leaf (`sorted(pl.rules)`)."""
    def loss(probes):
        outs, saved = rules.run(graph, pl, list(leaves) + [x, y], probes)
        return outs[0], saved

    deltas, saved = jax.grad(loss, has_aux=True)(rules.zero_probes(pl))
    return saved, deltas


def _check_all(loss_fn, params, xs, ys, methods=("ghost", "vmap"), rtol=2e-5):
    """per_example_grads, norms, dots and the clipped sum of every method equal the loop's."""
    want = _loop(loss_fn, params, xs, ys)
    norms = _norms(want)
    v = jax.tree.map(lambda a: np.asarray(a[1]) + 0.5 * np.asarray(a[2]), want)  # a direction: two examples' gradients
    dots = sum(np.real(np.sum(np.conj(np.reshape(g, (g.shape[0], -1))) * np.reshape(w, (1, -1)), axis=1))
               for g, w in zip(jax.tree.leaves(want), jax.tree.leaves(v)))
    c = float(np.median(norms))
    scale = np.minimum(1.0, c / norms)
    clipped = jax.tree.map(lambda g: np.tensordot(scale, g, axes=1), want)
    for method in methods:
        got = engine.per_example_grads(loss_fn, params, xs, ys, method=method, chunk_size=3)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(1.0, float(np.abs(b).max(initial=0))))
        n = engine.per_example_norms(loss_fn, params, xs, ys, method=method, chunk_size=3)
        assert not jnp.iscomplexobj(n)
        np.testing.assert_allclose(n, norms, rtol=rtol)
        d = engine.per_example_dots(loss_fn, params, xs, ys, v, method=method, chunk_size=3)
        assert not jnp.iscomplexobj(d)
        np.testing.assert_allclose(d, dots, rtol=rtol, atol=1e-5)
        s = engine.clipped_grad_sum(loss_fn, params, xs, ys, c, method=method, chunk_size=3)
        for a, b in zip(jax.tree.leaves(s), jax.tree.leaves(clipped)):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-5)


# ------------------------------------------------------------------ complex weights


def fourier_loss(p, x, y):
    """A one-layer Fourier neural operator on a (16, 2) signal: modes of its FFT times a complex64 weight shared
    by the modes (`w`: a dense layer over 6 modes), a per-mode complex weight (`r`: a dense layer with batch
    dims), a complex bias, back by the inverse FFT, then a real head."""
    xf = jnp.fft.rfft(x, axis=0)[:6]  # (6, 2) complex64
    z = xf @ p["w"] + jnp.einsum("mc,mco->mo", xf, p["r"]) + p["b"]  # (6, 3)
    h = jnp.fft.irfft(z, n=16, axis=0)  # (16, 3) real
    return jnp.mean((h @ p["head"] - y) ** 2)


def _fourier():
    k = jax.random.split(jax.random.key(3), 4)
    cplx = lambda i, s: (0.5 * (jax.random.normal(k[i], s) + 1j * jax.random.normal(k[i + 1], s))).astype(jnp.complex64)  # noqa: E731
    p = {"w": cplx(0, (2, 3)), "r": cplx(1, (6, 2, 3)), "b": cplx(2, (3,)), "head": normal(4, (3,))}
    return fourier_loss, p, normal(5, (7, 16, 2)), normal(6, (7, 16))


@pytest.mark.parametrize("method", ["ghost", pytest.param("vmap", marks=pytest.mark.slow)])
def test_complex_weights_are_exact_real_norms_conjugate_dots(method):
    loss_fn, p, xs, ys = _fourier()
    rows = {r["leaf"]: r for r in engine.explain(loss_fn, p, xs, ys)}
    assert rows["['w']"]["path"] == "rule" and rows["['w']"]["kind"] == "dense", rows
    _check_all(loss_fn, p, xs, ys, methods=(method,))


@pytest.mark.slow  # the dense rule's ghost form on complex factors; the quick test above has one token per mode
def test_complex_ghost_norm_over_tokens():
    """A complex dense weight over 12 tokens (ghost norm: Σ (AAᴴ)⊙(DDᴴ), real)."""
    def loss_fn(p, x, y):
        return jnp.sum(jnp.abs(x.astype(jnp.complex64) @ p["w"] @ p["v"]) ** 2) * y

    k = jax.random.split(jax.random.key(4), 2)
    w = (jax.random.normal(k[0], (40, 40)) + 1j * jax.random.normal(k[1], (40, 40))).astype(jnp.complex64) / 8
    p = {"w": w, "v": w.T[:, :30]}
    xs, ys = normal(1, (5, 12, 40)), normal(2, (5,))
    _, pl, _ = _plan(loss_fn, p, xs[0], ys[0])
    assert [pl.rules[i].sites[0].norm for i in sorted(pl.rules)] == ["gram", "gram"]
    _check_all(loss_fn, p, xs, ys, methods=("ghost",), rtol=1e-4)


# ------------------------------------------------------------------ a zero-size leaf


def test_a_zero_size_leaf_is_exact():
    """A (0, h) leaf (an empty set of extra features) beside a dense layer: zero gradient, zero norm share."""
    def loss_fn(p, x, y):
        h = jnp.tanh(x @ p["w"] + x[:0] @ p["empty"])
        return jnp.sum((h @ p["head"] - y) ** 2)

    p = {"w": normal(1, (4, 5)), "empty": jnp.zeros((0, 5)), "head": normal(2, (5,))}
    xs, ys = normal(3, (6, 4)), normal(4, (6,))
    _check_all(loss_fn, p, xs, ys)
    got = engine.per_example_layer_norms(loss_fn, p, xs, ys, method="ghost")
    np.testing.assert_array_equal(got["['empty']"], np.zeros(6))


# ------------------------------------------------------------------ a kind added the registry way


@pytest.fixture
def row_window():
    rules.register(ROW_WINDOW)  # the one registry line (a plug-in would put it beside its kind)
    yield ROW_WINDOW
    rules.unregister(ROW_WINDOW)


def row_window_loss(p, i, y):
    """A row and a 2-row window of `table` at the example's id, a dense head, and the table tied as output
    layer (its gradient: the window's and the head's uses summed, by pairwise ghost products)."""
    h = jnp.tanh(p["table"][i] + lax.dynamic_slice_in_dim(p["table"], i, 2).sum(0))
    logits = h @ p["table"].T
    return jnp.sum((h @ p["w"] - y) ** 2) + jax.nn.logsumexp(logits) - logits[i]


def test_a_kind_added_through_the_registry_is_exact(row_window):
    p = {"table": normal(1, (9, 4)), "w": normal(2, (4, 3))}
    xs, ys = jnp.array([0, 3, 8, 3, 5, 7, 1]), normal(3, (7, 3))
    rows = {r["leaf"]: r for r in engine.explain(row_window_loss, p, xs, ys)}
    assert rows["['table']"]["path"] == "rule" and "row-window" in rows["['table']"]["kind"], rows
    _check_all(row_window_loss, p, xs, ys, methods=("ghost",))
    rules.unregister(row_window)  # without the kind the table falls back, the same numbers
    assert {r["leaf"]: r for r in engine.explain(row_window_loss, p, xs, ys)}["['table']"]["path"] == "fallback"


# ------------------------------------------------------------------ the projection hook


def test_project_is_the_kronecker_projection_of_the_gradient():
    """`rules.project` of one example's (a, δ) = (Pa ⊗ Pd)ᵀ vec(gᵢ) for a dense weight over tokens and for an
    embedding's table, gᵢ from the loop of jax.grad; no gradient formed."""
    def loss_fn(p, ids, y):
        h = jnp.tanh(p["emb"][ids] @ p["w"])  # (T, O)
        return jnp.sum((h.mean(0) - y) ** 2)

    p = {"emb": normal(1, (11, 4)), "w": normal(2, (4, 5))}
    xs, ys = jax.random.randint(jax.random.key(5), (3, 6), 0, 11), normal(3, (3, 5))
    want = _loop(loss_fn, p, xs, ys)
    graph, pl, leaves = _plan(loss_fn, p, xs[0], ys[0])
    assert sorted(pl.rules) == [0, 1]  # emb, w (tree order)
    for i in range(3):
        saved, deltas = _a_and_delta(graph, pl, leaves, xs[i], ys[i])
        for j, leaf in enumerate(sorted(pl.rules)):
            name = ["emb", "w"][leaf]
            rows, cols = p[name].shape
            pa, pd = normal(10 + j, (rows, 3)), normal(20 + j, (cols, 2))
            (got,) = rules.project(pl.rules[leaf], saved[j], deltas[j], [pa], [pd])
            g = want[name][i]
            np.testing.assert_allclose(np.ravel(got), np.kron(pa, pd).T @ np.ravel(g), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ weights computed from several parameters


def weight_norm_loss(p, x, y):
    """Weight normalization (Salimans & Kingma 2016): w = g·v/‖v‖ per output column, then a bias and a head."""
    w = p["g"] * p["v"] / jnp.linalg.norm(p["v"], axis=0, keepdims=True)
    h = jnp.tanh(x @ w + p["b"])
    return jnp.sum((h @ p["head"] - y) ** 2)


def spectral_norm_loss(p, x, y):
    """Spectral normalization (Miyato et al. 2018): w / σ, σ = uᵀ W v from two power iterations from a fixed u."""
    u = jnp.ones(p["w"].shape[1]) / jnp.sqrt(p["w"].shape[1])
    for _ in range(2):
        v = p["w"] @ u
        v = v / jnp.linalg.norm(v)
        u = p["w"].T @ v
        u = u / jnp.linalg.norm(u)
    w = p["w"] / (v @ p["w"] @ u)
    h = jnp.tanh(x @ w)
    return jnp.sum((h @ p["head"] - y) ** 2)


def lora_merged_loss(p, x, y):
    """LoRA written merged: x @ (W0 + A·B) over 3 tokens."""
    h = jnp.tanh(x @ (p["w0"] + p["a"] @ p["b"]))
    return jnp.sum((h.mean(0) @ p["head"] - y) ** 2)


def hypernet_loss(p, x, y):
    """A small hypernetwork: the layer's weight is a two-layer network's output from a learned code z."""
    w = (jnp.tanh(p["z"] @ p["h1"]) @ p["h2"]).reshape(4, 5)
    h = jnp.tanh(x @ w)
    return jnp.sum((h @ p["head"] - y) ** 2)


SLOW = pytest.mark.slow  # the same machinery as weight-norm and lora-merged, which stay in the quick subset
#: name: (loss, params, x shape, the leaves that reach the loss only through the computed weight's VJP; the others
#: of its construction keep a rule of their own: the hypernetwork's last matrix is a dense layer on its hidden units;
#: LoRA's W0 joins its structure, `rules.structured.Product`: its gradient is the merged weight's, from its factors)
COMPUTED = {
    "weight-norm": (weight_norm_loss, lambda: {"g": 1 + 0.1 * normal(1, (1, 5)), "v": normal(2, (4, 5)),
                                              "b": normal(3, (5,)), "head": normal(4, (5, 2))}, (6, 4), ["g", "v"]),
    "spectral-norm": (spectral_norm_loss, lambda: {"w": normal(1, (4, 5)), "head": normal(4, (5, 2))}, (6, 4), ["w"]),
    "lora-merged": (lora_merged_loss, lambda: {"w0": normal(1, (4, 5)), "a": normal(2, (4, 2)),
                                               "b": normal(3, (2, 5)), "head": normal(4, (5, 2))}, (6, 3, 4),
                    ["a", "b", "w0"]),
    "hypernetwork": (hypernet_loss, lambda: {"z": normal(1, (3,)), "h1": normal(2, (3, 6)), "h2": normal(3, (6, 20)),
                                             "head": normal(4, (5, 2))}, (6, 4), ["h1", "z"]),
}


@pytest.mark.parametrize("name", [n if n in ("weight-norm", "lora-merged") else pytest.param(n, marks=SLOW)
                                  for n in COMPUTED])
def test_a_weight_computed_from_parameters_is_on_a_rule_and_exact(name):
    loss_fn, make, x_shape, computed = COMPUTED[name]
    p = make()
    xs, ys = normal(7, x_shape), normal(8, (x_shape[0], 2))
    rows = engine.explain(loss_fn, p, xs, ys)
    assert all(r["path"] == "rule" for r in rows), rows
    assert [r["leaf"] for r in rows if r["kind"] == "computed weight: dense"] == [f"['{k}']" for k in computed], rows
    _check_all(loss_fn, p, xs, ys, methods=("ghost",), rtol=1e-4)


# ------------------------------------------------------------------ structured norms of computed weights


def _wn(axis, g_shape):
    def loss_fn(p, x, y):
        w = p["g"] * p["v"] / jnp.linalg.norm(p["v"], axis=axis, keepdims=axis is not None)
        return jnp.sum((jnp.tanh(x @ w) @ p["head"] - y) ** 2)

    return loss_fn, {"g": 1 + 0.1 * normal(1, g_shape), "v": normal(2, (4, 5)), "head": normal(4, (5, 2))}


def _spectral_stopped(p, x, y):
    """Spectral normalization with the power iteration's u, v held constant (`stop_gradient`, as torch does)."""
    u = jnp.ones(5) / jnp.sqrt(5.0)
    for _ in range(2):
        v = p["w"] @ u
        v = v / jnp.linalg.norm(v)
        u = p["w"].T @ v
        u = u / jnp.linalg.norm(u)
    u, v = lax.stop_gradient(u), lax.stop_gradient(v)
    return jnp.sum((jnp.tanh(x @ (p["w"] / (v @ p["w"] @ u))) @ p["head"] - y) ** 2)


def _lora_transposed(p, x, y):
    """LoRA merged, used as `x @ W.T` over 3 tokens (the weight's factors along (columns, rows))."""
    return jnp.sum((jnp.tanh(x @ (p["w0"] + p["a"] @ p["b"]).T).mean(0) @ p["head"] - y) ** 2)


def _lora_scaled(p, x, y):
    """LoRA as usually written: W0 + (α/r)·Aᵀ-stored A times B, `a` kept (R, I)."""
    return jnp.sum((jnp.tanh(x @ (p["w0"] + 0.5 * (p["a"].T @ p["b"]))) @ p["head"] - y) ** 2)


def _wn_literal(p, x, y):
    """Weight normalization times a literal (w = 2·g·v/‖v‖)."""
    w = 2.0 * (p["g"] * p["v"] / jnp.linalg.norm(p["v"], axis=0, keepdims=True))
    return jnp.sum((jnp.tanh(x @ w) @ p["head"] - y) ** 2)


def _mixed_columns(p, x, y):
    """A per-column scale computed from the rows (‖row j‖ divides column j): not separable, so no structure."""
    return jnp.sum((jnp.tanh(x @ (p["v"] / jnp.linalg.norm(p["v"], axis=1)[None, :])) @ p["head"] - y) ** 2)


STRUCTURED = {
    "weight-norm per column, g (5,)": (*_wn(0, (5,)), (6, 4), "scaled"),
    "weight-norm per row": (*_wn(1, (4, 1)), (6, 4), "scaled"),
    "weight-norm of the whole matrix": (*_wn(None, ()), (6, 3, 4), "scaled"),
    "spectral-norm, u and v stopped": (_spectral_stopped, {"w": normal(1, (4, 5)), "head": normal(4, (5, 2))},
                                       (6, 3, 4), "scaled"),
    "lora-merged transposed": (_lora_transposed, {"w0": normal(1, (5, 4)), "a": normal(2, (5, 2)),
                                                  "b": normal(3, (2, 4)), "head": normal(4, (5, 2))}, (6, 3, 4),
                               "product"),
    "lora-merged, alpha/r, A stored transposed": (_lora_scaled, {"w0": normal(1, (4, 5)), "a": normal(2, (2, 4)),
                                                                "b": normal(3, (2, 5)), "head": normal(4, (5, 2))},
                                                  (6, 4), "product"),
    "weight-norm times a literal": (_wn_literal, _wn(0, (1, 5))[1], (6, 4), "scaled"),
    "columns mixed": (_mixed_columns, {"v": normal(2, (4, 4)), "head": normal(4, (4, 2))}, (6, 4), None),
}


def _structures(loss_fn, p, x, y):
    _, pl, _ = _plan(loss_fn, p, x, y)
    return [str(c.structure) if c.structure is None else type(c.structure).__name__ for c in pl.composites]


@pytest.mark.parametrize("name", list(STRUCTURED))
def test_structured_norms_are_exact_per_leaf(name):
    """Each leaf's per-example norm by its construction's closed form (`rules.structured`) equals the loop's, and
    grads, dots and clipped sums stay exact; a construction without one keeps the general path, exactly."""
    loss_fn, p, x_shape, want_structure = STRUCTURED[name]
    xs, ys = normal(7, x_shape), normal(8, (x_shape[0], 2))
    bound = {"scaled": "BoundScaled", "product": "BoundProduct", None: "None"}[want_structure]
    assert _structures(loss_fn, p, xs[0], ys[0]) == [bound]
    want = _loop(loss_fn, p, xs, ys)
    got = engine.per_example_layer_norms(loss_fn, p, xs, ys, method="ghost", chunk_size=4)
    for (path, g) in jax.tree_util.tree_flatten_with_path(want)[0]:
        expect = np.sqrt(np.sum(np.reshape(g, (g.shape[0], -1)) ** 2, axis=1))
        np.testing.assert_allclose(got[jax.tree_util.keystr(path)], expect, rtol=1e-4, atol=1e-6)
    _check_all(loss_fn, p, xs, ys, methods=("ghost",), rtol=1e-4)


def test_the_benchmark_constructions_have_structures():
    """Weight and spectral normalization (differentiated through the power iteration) and merged LoRA get a
    closed form; the hypernetwork stays on the construction's VJP."""
    got = {}
    for name, (loss_fn, make, x_shape, _) in COMPUTED.items():
        got[name] = _structures(loss_fn, make(), normal(7, x_shape)[0], normal(8, (2,)))
    assert got == {"weight-norm": ["BoundScaled"], "spectral-norm": ["BoundScaled"], "lora-merged": ["BoundProduct"],
                   "hypernetwork": ["None"]}
