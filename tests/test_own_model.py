"""Your own model in the explorer (`gradlab.own`, `gradlab.serve`): the example files meet the contract, their
per-example norms equal a Python loop of `jax.grad`, the data forms and row identity, the contract's errors,
the URL round-trip, and the pages on a served model (AppTest)."""

from __future__ import annotations

import os
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, assert_clean, open_page
from hostile import rendered_text

from gradlab import engine, own, serve
from gradlab.experiment import Experiment, Fitted, fit, load_data

FLAX = ROOT / "examples" / "own_model_flax.py"
EQUINOX = ROOT / "examples" / "own_model_equinox.py"


@pytest.fixture(scope="module")
def examples():
    pytest.importorskip("flax", reason="the Flax example needs flax (requirements-dev.txt)")
    return {"flax": own.load(FLAX), "equinox": own.load(EQUINOX)}


@pytest.fixture
def served(monkeypatch):
    """Serve a model file in this process, as `python -m gradlab serve` does for its Streamlit child."""

    def serve_file(path: Path) -> own.OwnModel:
        monkeypatch.setenv(own.ENV, str(path))
        return own.served()

    yield serve_file
    own._load_served.cache_clear()


def loop_norms(loss_fn, params, xs, ys):
    """The oracle: one `jax.grad` per example in a Python loop (jitted once; Equinox's filter for a module's
    non-array fields), norms in float64."""
    grad = eqx.filter_jit(eqx.filter_grad(loss_fn))
    out = []
    for x, y in zip(xs, ys):
        g = grad(params, jnp.asarray(x), jnp.asarray(y))
        out.append(np.sqrt(sum(np.sum(np.square(np.asarray(a, np.float64))) for a in jax.tree.leaves(g))))
    return np.array(out)


@pytest.mark.parametrize("name", ["flax", "equinox"])
def test_examples_load_and_their_norms_equal_a_loop_of_jax_grad(examples, name):
    m = examples[name]
    assert m.name.startswith("own:") and len(m.name) == 4 + 16
    assert m.data.task == "classification" and m.data.n_classes == 10 and m.data.image_shape == (8, 8)
    assert m.data.x_train.shape == (1437, 64) and m.data.x_test.shape == (360, 64)
    xs, ys = m.data.x_train[:32], m.data.y_train[:32]
    got = np.asarray(engine.per_example_norms(m.loss_fn, m.params, xs, ys))
    np.testing.assert_allclose(got, loop_norms(m.loss_fn, m.params, xs, ys), rtol=1e-4)
    # trained: the explorer shows a model that fits its test set
    pred = np.argmax(jax.vmap(lambda x: m.predict_fn(m.params, x))(m.data.x_test), axis=1)
    assert np.mean(pred == m.data.y_test) > 0.85


def test_the_equinox_example_lists_its_sgd_checkpoints(examples):
    run = examples["equinox"].run
    assert run.steps == (0, 50, 100, 150, 200) and run.lrs == (0.1,) * 5
    assert run.final is examples["equinox"].params


def arrays_of(model) -> list[np.ndarray]:
    return [np.asarray(a) for a in jax.tree.leaves(eqx.filter(model, eqx.is_array))]


@pytest.mark.slow
def test_gradlabs_loops_with_the_modules_recipe_retrace_its_own_training(examples):
    """The oracle is the module's own training loop (full-batch SGD, examples/own_model_equinox.py): gradlab's loop
    from `init_fn` with its optimizer and batch size, and DP-SGD with q = 1, σ = 0, C = ∞ (every example in every
    batch, divided by qN = N), both reach its checkpoint at step 50."""
    from gradlab.train import train, train_dp_sgd

    m = examples["equinox"]
    assert m.trainable and m.recipe()["batch_size"] == len(m.data.y_train) and m.run.steps[1] == 50
    xs, ys = m.data.x_train, m.data.y_train
    plain = train(m.init(0), m.loss_fn, xs, ys, **{**m.recipe(), "steps": 50}, seed=0).final
    dp = train_dp_sgd(m.init(0), m.loss_fn, xs, ys, sample_rate=1.0, noise_multiplier=0.0, clip_norm=np.inf,
                      optimizer=m.optimizer, steps=50, checkpoint_every=50).final
    for got in (plain, dp):
        for a, b in zip(arrays_of(got), arrays_of(m.run.checkpoints[1])):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_a_served_model_with_init_fn_trains_again_at_another_seed(examples, served):
    m = served(EQUINOX)
    f = fit(Experiment(dataset=m.name))
    assert f.trainable and f.run is m.run
    other = fit(Experiment(dataset=m.name, seed=1), data=m.data)  # what TRAK's ensemble asks for
    assert other.run.steps == (0, m.train_steps) and other.run is not m.run
    # seed 1 is init_fn(jax.random.key(1)): the run starts there
    for a, b in zip(arrays_of(other.run.checkpoints[0]), arrays_of(m.init_fn(jax.random.key(1)))):
        np.testing.assert_array_equal(a, b)


def test_the_lds_models_follow_the_modules_recipe():
    """The LDS trains its models on random halves with a served model's recipe (an optax object, not a name) in one
    vmapped scan; the oracle is `train` on each half alone with the same recipe and seed."""
    import optax

    from gradlab.influence import evaluation
    from gradlab.train import train

    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    m = own.from_objects(linear_loss, jnp.zeros(3), (x, x @ np.array([1.0, -1.0, 2.0], np.float32)),
                         init_fn=lambda key: 0.1 * jax.random.normal(key, (3,)), optimizer=optax.sgd(0.05, momentum=0.5),
                         train_steps=30, batch_size=8)
    r = m.recipe()
    xs, ys = m.data.x_train, m.data.y_train
    subsets = evaluation.random_subsets(len(ys), 3, seed=0)
    stacked = evaluation.train_on_subsets(m.init(0), m.loss_fn, xs, ys, subsets, optimizer=r["optimizer"], lr=r["lr"],
                                          steps=r["steps"], batch_size=r["batch_size"], l2=r["l2"], seed=1)
    for j, subset in enumerate(subsets):
        alone = train(m.init(0), m.loss_fn, xs[subset], ys[subset], **r, seed=1 + j).final
        np.testing.assert_allclose(np.asarray(stacked[j]), np.asarray(alone), rtol=1e-5, atol=1e-6)


def test_trak_without_init_fn_takes_the_last_checkpoints_of_the_run(examples, served):
    from gradlab.influence import fitted as ifit

    run = examples["equinox"].run
    # the example's module without its recipe: checkpoints only
    d = examples["equinox"].data
    m = own.from_objects(examples["equinox"].loss_fn, run.final, (d.x_train, d.y_train, d.x_test, d.y_test),
                         checkpoints=run.checkpoints)
    f = Fitted(Experiment(dataset=m.name), m.data, m.loss_fn, m.run, m.predict_fn)
    assert not m.trainable
    monkey = pytest.MonkeyPatch()
    monkey.setattr(own, "for_name", lambda name: m)
    try:
        models = ifit.trak_models(f, n_models=3)
        assert models == [run.checkpoints[-1], run.checkpoints[-2], run.checkpoints[-3]]
        with pytest.raises(ValueError, match="init_fn"):
            ifit.trak_models(f, n_models=6)
    finally:
        monkey.undo()


def test_a_served_model_is_an_experiment_that_fits_without_training(examples, served):
    m = served(EQUINOX)
    exp = Experiment.from_query({"dataset": m.name})
    assert exp == Experiment(dataset=m.name) and Experiment.from_query(exp.to_query()) == exp
    # every other field is unused: a link with stray values is the same experiment (one cache key)
    assert Experiment(dataset=m.name, steps=25, model="cnn", lr=3.0).canonical() == exp
    assert exp.source.brings_model and exp.in_memory_only and not Experiment().source.brings_model
    f = fit(exp)
    assert f.trainable and f.run is m.run and f.loss_fn is m.loss_fn  # trainable: the module has init_fn
    assert load_data(exp) is m.data
    # no predict_fn: a classifier predicts the class whose label gives the lowest loss = argmax of the logits
    logits = jax.vmap(m.params)(m.data.x_test)
    np.testing.assert_array_equal(np.asarray(f.predict(f.model, m.data.x_test)), np.argmax(logits, axis=1))


def test_a_link_to_a_model_this_server_does_not_serve_says_so(monkeypatch):
    monkeypatch.delenv(own.ENV, raising=False)
    with pytest.raises(own.OwnModelError, match="started without one"):
        load_data(Experiment(dataset="own:0123456789abcdef"))


def test_data_forms_and_row_identity(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 3)).astype(np.float32), rng.integers(0, 3, 50)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    d = own.as_dataset(tmp_path / "d.npz")
    assert d.task == "classification" and len(d.y_train) == 40 and len(d.y_test) == 10 and d.row_label == "index"
    # rows name each example's place in the source arrays: the split loses none and invents none
    np.testing.assert_array_equal(x[d.rows_train], d.x_train)
    assert sorted([*d.rows_train, *d.rows_test]) == list(range(50))
    # a CSV: rows are its lines (the header is line 1), text labels become class ids in sorted order
    lines = ["a,b,kind"] + [f"{i},{i % 7},{'cat' if i % 2 else 'dog'}" for i in range(30)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    c = own.as_dataset(str(tmp_path / "d.csv"), label="kind")
    assert c.row_label == "CSV line" and c.class_names == ("cat", "dog")
    i = 3
    line = lines[c.rows_train[i] - 1].split(",")
    assert c.x_train[i].tolist() == [float(line[0]), float(line[1])] and c.class_names[c.y_train[i]] == line[2]
    # regression: float targets; images: (N, H, W) sets the image shape
    r = own.as_dataset((x, x[:, 0] * 2.0))
    assert r.task == "regression" and r.n_classes == 1
    assert own.as_dataset((rng.normal(size=(20, 5, 4)), rng.integers(0, 2, 20))).image_shape == (5, 4)


def linear_loss(w, x, y):
    return jnp.square(x @ w - y)


@pytest.mark.parametrize("bad,match", [
    (dict(params=jnp.zeros(3), data=(np.zeros((9, 3)), np.zeros(9))), "does not define loss_fn"),
    (dict(loss_fn=linear_loss, params=jnp.zeros(3), data=(np.zeros((9, 3)), np.zeros(8))), "x must be"),
    (dict(loss_fn=linear_loss, params=jnp.zeros(4), data=(np.zeros((9, 3)), np.zeros(9))), "failed on the first"),
    (dict(loss_fn=lambda w, x, y: x * w, params=jnp.zeros(3), data=(np.zeros((9, 3)), np.zeros(9))), "scalar"),
    (dict(loss_fn=linear_loss, params=jnp.zeros(3), data=(np.zeros((9, 3)), np.arange(9)), class_names=["a", "b"]),
     "class ids 0..1"),
    (dict(loss_fn=linear_loss, params=jnp.zeros(3), data=(np.zeros((9, 3)), np.zeros(9)),
          checkpoints=[jnp.zeros(3)], steps=[0, 1]), "same non-zero length"),
    (dict(loss_fn=linear_loss, params=jnp.zeros(3), data=(np.zeros((9, 3)), np.zeros(9)), train_steps=5),
     "no init_fn: add `init_fn"),
    (dict(loss_fn=linear_loss, params=jnp.zeros(3), data=(np.zeros((9, 3)), np.zeros(9)),
          init_fn=lambda key: jnp.zeros(4)), "same structure and shapes"),
    (dict(loss_fn=linear_loss, params=jnp.zeros(3), data=(np.zeros((9, 3)), np.zeros(9)),
          init_fn=lambda key: jnp.zeros(3), optimizer="adam"), "optax GradientTransformation"),
    (dict(loss_fn=linear_loss, params=jnp.zeros(3), data=(np.zeros((9, 3)), np.zeros(9)),
          init_fn=lambda key: jnp.zeros(3), batch_size=0), "batch_size must be"),
])
def test_contract_errors_say_what_to_change(bad, match):
    with pytest.raises(own.OwnModelError, match=match):
        own.from_objects(**bad)


def test_a_module_that_raises_names_its_error(tmp_path):
    (tmp_path / "broken.py").write_text("import numpy as np\nparams = 1 / 0\n")
    with pytest.raises(own.OwnModelError, match="broken.py raised ZeroDivisionError"):
        own.load(tmp_path / "broken.py")


def test_an_explore_spec_travels_by_value_and_its_fingerprint_follows_the_data(tmp_path):
    scale = 3.0  # a closure over a notebook variable: cloudpickle carries it

    def loss(p, x, y):
        return scale * jnp.square(x @ p["w"] - y)

    x = np.random.default_rng(1).normal(size=(30, 2)).astype(np.float32)
    spec = dict(loss_fn=loss, params={"w": jnp.ones(2)}, data=(x, x.sum(1)))
    own.save_spec(tmp_path / "a.pkl", **spec)
    m = own.load(tmp_path / "a.pkl")
    xs, ys = m.data.x_train, m.data.y_train
    np.testing.assert_allclose(np.asarray(engine.per_example_norms(m.loss_fn, m.params, xs, ys)),
                               loop_norms(m.loss_fn, m.params, xs, ys), rtol=1e-4)
    assert m.predict_fn is None and np.isnan(fit_predictions(m)).all()  # regression without predict_fn: none
    again = own.from_objects(**spec)
    changed = own.from_objects(**{**spec, "data": (x + 1, x.sum(1))})
    assert again.name == own.from_objects(**spec).name != changed.name


def fit_predictions(m):
    from gradlab.experiment import Fitted

    return Fitted(Experiment(dataset=m.name), m.data, m.loss_fn, m.run, m.predict_fn).predict(m.params, m.data.x_test)


def test_explore_rejects_unknown_arguments_before_starting_anything():
    with pytest.raises(own.OwnModelError, match="unknown argument"):
        serve.explore(linear_loss, jnp.zeros(3), (np.zeros((9, 3)), np.zeros(9)), optimiser="adam")


def test_serve_command_listens_on_this_machine_only():
    cmd = serve.command(8599)
    assert cmd[1:4] == ["-m", "streamlit", "run"] and Path(cmd[4]) == ROOT / "app.py"
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"


# ---------------------------------------------------------------- the pages on a served model (AppTest)


def _open(page):
    at = open_page(page, dataset=own.OWN)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    return at


@pytest.mark.slow
def test_norms_page_on_the_served_equinox_model(served):
    m = served(EQUINOX)
    at = _open("norms")
    shown = {x.label: x.value for x in at.metric}
    norms = np.asarray(engine.per_example_norms(m.loss_fn, m.params, m.data.x_train, m.data.y_train))
    assert shown["Training examples N"] == f"{len(norms):,}" and shown["Median norm"] == f"{np.median(norms):.3g}"
    # the top-k table names each example by its row in the source and the checkpoint picker offers its steps
    table = at.dataframe[0].value
    assert "index" in table.columns and table["gradient norm"].iloc[0] == pytest.approx(norms.max(), rel=1e-5)
    assert at.select_slider(key="checkpoint").options == ["0", "50", "100", "150", "200"]
    assert any("own_model_equinox.py" in rendered_text(c.value) for c in at.sidebar.caption)  # a file name: text


def test_pages_that_train_from_an_initialization_say_what_they_need(served):
    served(FLAX)  # no init_fn
    at = _open("privacy_audit")
    said = [i.value for i in at.info if "needs gradlab's training loop" in i.value]
    assert len(said) == 1 and "Membership inference" in said[0] and "init_fn(key) -> params" in said[0]
    # the membership attack is not offered; the audit of gradlab's own DP-SGD (canaries, no model of yours) is
    assert "Auditing gradlab's DP-SGD" in [h.value for h in at.header]
    assert "run_mia" not in [b.key for b in at.button]


def test_accuracy_of_a_served_model_goes_through_its_predict_fn(examples):
    """DP-SGD's and the audit's accuracies call the module's `predict_fn` on params that are not callable."""
    from gradlab import privacy

    m = examples["flax"]
    logits = jax.vmap(lambda x: m.predict_fn(m.params, x))(m.data.x_test)
    acc, per = privacy.accuracy_by_class(m.params, m.data.x_test, m.data.y_test, 10, m.predict_fn)
    assert acc == pytest.approx(np.mean(np.argmax(logits, 1) == m.data.y_test))
    assert per[3] == pytest.approx(np.mean(np.argmax(logits, 1)[m.data.y_test == 3] == 3))


def test_tracin_follows_the_listed_checkpoints_or_says_what_it_needs(examples, served):
    from gradlab.influence import fitted as ifit

    m = served(EQUINOX)
    run, note = ifit.tracin_run(fit(Experiment(dataset=m.name)))
    assert run is m.run and "checkpoints" in note
    own._load_served.cache_clear()
    flax = served(FLAX)
    with pytest.raises(ValueError, match="list `checkpoints`"):
        ifit.tracin_run(fit(Experiment(dataset=flax.name)))
    with pytest.raises(ValueError, match="Models in the ensemble"):
        ifit.trak_models(fit(Experiment(dataset=flax.name)), n_models=2)


@pytest.mark.slow
def test_a_link_naming_own_on_a_server_without_a_model_loads_nothing(monkeypatch):
    """The hosted app has no start-up setting: `?dataset=own` is not one of its datasets, so the link opens the
    default one and no module is loaded from anything a visitor sent."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.delenv(own.ENV, raising=False)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.query_params["dataset"] = "own:0123456789abcdef"
    at.run()
    assert_clean(at)
    assert at.session_state["dataset"] == "digits" and "own" not in at.sidebar.selectbox(key="dataset").options
    assert own._load_served.cache_info().currsize == 0


def test_flax_nnx_state_is_params_too():
    nnx = pytest.importorskip("flax.nnx", reason="needs flax (requirements-dev.txt)")
    graphdef, state = nnx.split(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))

    def loss_fn(state, x, y):
        logits = nnx.merge(graphdef, state)(x)
        return jax.nn.logsumexp(logits) - logits[y]

    x = np.random.default_rng(0).normal(size=(20, 3)).astype(np.float32)
    m = own.from_objects(loss_fn, state, (x, (x[:, 0] > 0).astype(int)))
    xs, ys = m.data.x_train, m.data.y_train
    np.testing.assert_allclose(np.asarray(engine.per_example_norms(m.loss_fn, m.params, xs, ys)),
                               loop_norms(m.loss_fn, m.params, xs, ys), rtol=1e-4)


# ---------------------------------------------------------------- issue 40: what a researcher found


def _classifier(n_out):
    """A linear classifier of `n_out` outputs on 4 features whose loss indexes the logits by the label, as most do."""
    w = jnp.asarray(np.random.default_rng(0).normal(size=(4, n_out)), jnp.float32)

    def loss(w, x, y):
        logits = x @ w
        return jax.nn.logsumexp(logits) - logits[y]  # JAX clamps y ≥ n_out to the last class: no error

    return loss, w


def test_labels_past_the_models_outputs_are_refused_at_load():
    x = np.random.default_rng(1).normal(size=(60, 4)).astype(np.float32)
    y = np.arange(60) % 12 + 1  # labels 1..12 on a model of 10 outputs (the researcher's file)
    loss, w = _classifier(10)
    # the oracle for what went wrong: JAX scores labels 10, 11 and 12 exactly as label 9
    assert float(loss(w, x[0], 12)) == float(loss(w, x[0], 9))
    with pytest.raises(own.OwnModelError, match=r"labels 9\.\.12 .* at most 10 outputs \(class ids 0\.\.9\)"):
        own.from_objects(loss, w, (x, y))
    with pytest.raises(own.OwnModelError, match="predict_fn gives 10 outputs"):  # with a predict_fn: its output size
        own.from_objects(loss, w, (x, y), predict_fn=lambda w, x: x @ w)
    # labels 0..11 on a model of 12 outputs load, with or without predict_fn
    loss12, w12 = _classifier(12)
    assert own.from_objects(loss12, w12, (x, y - 1)).data.n_classes == 12
    assert own.from_objects(loss12, w12, (x, y - 1), predict_fn=lambda w, x: x @ w).data.n_classes == 12


def test_explore_removes_its_pickle_when_stopped(monkeypatch, tmp_path):
    """`explore` pickles params and data into the temporary folder for its server; `stop()` removes the file once the
    server has ended (a stand-in process here: the file's life is the point, not Streamlit's)."""
    import subprocess
    import sys

    monkeypatch.setattr(serve.tempfile, "tempdir", str(tmp_path))
    started = {}

    def start(path, **kw):
        started["path"] = Path(path)
        return serve.Server(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]), "http://x")

    monkeypatch.setattr(serve, "start", start)
    server = serve.explore(linear_loss, jnp.zeros(3), (np.zeros((9, 3), np.float32), np.zeros(9, np.float32)))
    assert started["path"].is_file() and started["path"].parent == tmp_path  # the server reads it
    server.stop()
    assert server.process.poll() is not None and not started["path"].exists()
    assert list(tmp_path.iterdir()) == []


def test_serve_accepts_streamlits_spelling_of_its_flags(capsys):
    from gradlab import cli

    args = cli.parser().parse_args(["serve", "m.py", "--server.port", "8765", "--server.address", "0.0.0.0",
                                    "--server.headless", "true"])
    assert (args.port, args.address, args.headless) == (8765, "0.0.0.0", True)
    args = cli.parser().parse_args(["serve", "m.py", "--port", "8766", "--headless"])
    assert (args.port, args.address, args.headless) == (8766, "127.0.0.1", True)
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert "test_size=0.2, random_state=0" in " ".join(capsys.readouterr().out.split())  # the 80/20 split, said


def test_the_80_20_split_is_said_where_a_researcher_reads():
    """Data without a test split is split by `train_test_split(x, y, test_size=0.2, random_state=0)`: the oracle is that
    call itself; the dataset names it (the sidebar's caption shows it), and docs/own-model.md says it."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    d = own.as_dataset((x.astype(np.float32), y))
    _, x_test, _, _ = train_test_split(x.astype(np.float32), y, test_size=0.2, random_state=0)
    np.testing.assert_array_equal(d.x_test, x_test)
    assert d.split == "train_test_split(x, y, test_size=0.2, random_state=0)"
    given = own.as_dataset((x[:10], y[:10], x[10:15], y[10:15]))
    assert given.split == ""  # a split of the user's own: nothing to say
    assert "train_test_split(x, y, test_size=0.2, random_state=0)" in (ROOT / "docs" / "own-model.md").read_text()
