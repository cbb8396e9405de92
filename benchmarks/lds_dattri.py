"""dattri's LDS protocol, offline: gradlab's attribution methods and dattri's on identical tensors.

    pip install -r requirements-bench.txt           # CPU torch, dattri, mnist1d (benchmark-only)
    python -m benchmarks.lds_dattri                  # full size: 5,000 train / 500 test, 100 retrains, LR and MLP
    python -m benchmarks.lds_dattri --train 1000 --test 100 --retrains 20 --only lr   # a smoke run
    python -m benchmarks.lds_dattri --data digits    # another offline source (`DATA`)

The protocol of dattri's MNIST benchmark (Deng et al., NeurIPS 2024; `dattri/benchmark/load.py`,
`experiments/benchmark_result.py`, `dattri/benchmark/datasets/mnist/`): the first 5,000 training and 500 test
examples; 100 models retrained on random 50% subsets with the benchmark's own recipe; the ground truth is each
retrained model's −loss on each test point; LDS = the Spearman correlation over subsets between Σ_{i∈S} τ_i and
that output, per test point, averaged (Park et al. 2023, eq. 4). Its models and recipes:

- logistic regression (`nn.Linear(D, 10)`): SGD lr 0.01, batch 32, 20 epochs;
- MLP (`fc1` D→128, `fc2` 128→64, `fc3` 64→10, ReLU; two hidden layers, as dattri's `MLPMnist`): SGD lr 0.01,
  momentum 0.9, batch 64, 50 epochs. dattri's dropout (0.1) is left out: attribution and retraining are of the
  deterministic network (dattri attributes it in `eval()` mode, i.e. without dropout, too).

MNIST itself is a download; here the data come from a `DATA` source generated on this machine: MNIST-1D
(Greydanus 2020; `mnist1d.data.make_dataset`, never its downloading loader) by default, 40 features, 10 classes.

Everything is built once, in JAX: the data (float32, standardized with the training split's statistics), the
100 subsets (`gradlab.influence.random_subsets`), the retrained models and their outputs (the ground truth
both sides are scored against), and the models to attribute: the model trained on all N examples (seed 0;
grad-dot and the influence function), 10 checkpoints along its run (TracIn, weighted by the learning rate
0.01), and an ensemble of models trained on other random halves (TRAK, as dattri's `models_half`). Those
weights are copied into a torch module with the same layer names, and dattri's attributors
(`TracInAttributor`, `IFAttributorExplicit` / `IFAttributorCG`, `TRAKAttributor`) score the same models on the
same tensors. Both sides' scores go through the same `gradlab.influence.lds` (dattri's `dattri.metric.lds`
agrees on them: the smoke test checks it).

The influence function's damping δ is picked as dattri's benchmark does: the best LDS over its grid
(`--damping`), for each side separately (selection on the test points, which flatters both alike). On the MLP
both sides stop conjugate gradient after the same `--cg-iters` steps (dattri's benchmark: 10), gradlab from
x₀ = 0 (`cg_steps`, labelled "truncated, k steps, residual r"), dattri from x₀ = v; `--converged` makes gradlab
solve to convergence instead, and refuse where H + δI is not positive definite. `--cache PREFIX` keeps the trained
models (the MLP's take minutes) for the next run with the same settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import pickle
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gradlab import influence as inf
from gradlab.influence import InfluenceError
from gradlab.influence import scores as sc

os.environ.setdefault("TQDM_DISABLE", "1")     # dattri's progress bars

# ------------------------------------------------------------------ data sources


def _mnist1d(n_train: int, n_test: int, seed: int):
    """MNIST-1D generated here (no download): 40-sample 1-D signals of the 10 digit templates."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = n_train + n_test
    args.train_split = n_train / (n_train + n_test)
    args.seed = seed
    d = make_dataset(args)
    return d["x"], d["y"], d["x_test"], d["y_test"]


def _digits(n_train: int, n_test: int, seed: int):
    """scikit-learn's bundled 8×8 digits (1,797 images: at most 1,797 train + test)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    return x[:n_train], y[:n_train], x[n_train:n_train + n_test], y[n_train:n_train + n_test]


#: name -> fn(n_train, n_test, seed) -> (x_train, y_train, x_test, y_test). A new source (Fashion-MNIST) plugs in here.
DATA: dict[str, Callable] = {"mnist1d": _mnist1d, "digits": _digits}


@dataclasses.dataclass(frozen=True)
class Split:
    """float32 features standardized with the training statistics, int32 labels 0..C−1."""

    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int


def load(source: str, n_train: int, n_test: int, seed: int = 0) -> Split:
    """The `source` data (a key of `DATA`) at the requested sizes.

    **Raises** `ValueError` for an unknown source or one with fewer examples than asked for.
    """
    if source not in DATA:
        raise ValueError(f"unknown data source {source!r}; choose one of {', '.join(DATA)}")
    x, y, xt, yt = (np.asarray(a) for a in DATA[source](n_train, n_test, seed))
    if len(y) < n_train or len(yt) < n_test:
        raise ValueError(f"{source} has {len(y)} training and {len(yt)} test examples; asked for {n_train} and {n_test}")
    x, y, xt, yt = x[:n_train], y[:n_train], xt[:n_test], yt[:n_test]
    mean, std = x.mean(0), x.std(0)
    std = np.where(std > 0, std, 1.0)
    f = lambda a: ((a - mean) / std).astype(np.float32)
    return Split(f(x), y.astype(np.int32), f(xt), yt.astype(np.int32), int(max(y.max(), yt.max())) + 1)


# ------------------------------------------------------------------ models (torch's layer names and layouts)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """dattri's model and training recipe: hidden widths, SGD learning rate and momentum, batch size, epochs."""

    hidden: tuple[int, ...]
    lr: float
    momentum: float
    batch: int
    epochs: int


#: dattri's MNIST recipes (`train_mnist_lr`, `train_mnist_mlp`, `dattri_retrain.DEFAULT_BATCH_SIZE`).
RECIPES = {
    "lr": Recipe(hidden=(), lr=0.01, momentum=0.0, batch=32, epochs=20),
    "mlp": Recipe(hidden=(128, 64), lr=0.01, momentum=0.9, batch=64, epochs=50),
}


def layer_names(recipe: Recipe) -> list[str]:
    """dattri's module names: `linear` for logistic regression, `fc1`, `fc2`, … for the MLP."""
    return ["linear"] if not recipe.hidden else [f"fc{i + 1}" for i in range(len(recipe.hidden) + 1)]


def init_params(key, recipe: Recipe, d_in: int, n_classes: int) -> dict:
    """torch.nn.Linear's default initialization, U(±1/√fan_in) for weight (out, in) and bias (out,)."""
    sizes = [d_in, *recipe.hidden, n_classes]
    params = {}
    for name, (a, b), k in zip(layer_names(recipe), zip(sizes[:-1], sizes[1:]), jax.random.split(key, len(sizes) - 1)):
        kw, kb = jax.random.split(k)
        bound = 1.0 / np.sqrt(a)
        params[f"{name}.weight"] = jax.random.uniform(kw, (b, a), jnp.float32, -bound, bound)
        params[f"{name}.bias"] = jax.random.uniform(kb, (b,), jnp.float32, -bound, bound)
    return params


def logits(params: dict, x):
    """Forward pass of one example `x (D,)`: Linear layers with ReLU between."""
    names = sorted({k.split(".")[0] for k in params}, key=lambda s: (len(s), s))
    for i, name in enumerate(names):
        x = params[f"{name}.weight"] @ x + params[f"{name}.bias"]
        if i < len(names) - 1:
            x = jax.nn.relu(x)
    return x


def loss(params: dict, x, y):
    """Cross-entropy of ONE example (torch's `nn.CrossEntropyLoss`)."""
    z = logits(params, x)
    return jax.nn.logsumexp(z) - z[y]


def train(params0: dict, xs, ys, subsets, keys, recipe: Recipe, n_checkpoints: int = 0):
    """Train one model per row of `subsets (M, H)` with `recipe`, all M at once (vmap of a scan over epochs).

    Each epoch shuffles the subset and takes ⌊H / batch⌋ SGD steps on mean cross-entropy (the last partial
    batch is dropped: one compiled shape). `params0` has a leading M axis (one initialization per model).
    **Returns** the M final models (stacked), and with `n_checkpoints` > 0 also the parameters after
    `n_checkpoints` evenly spaced epochs, stacked `(M, n_checkpoints, …)`.
    """
    opt = optax.sgd(recipe.lr, momentum=recipe.momentum or None)
    h = subsets.shape[1]
    steps = h // recipe.batch
    keep = np.round(np.linspace(recipe.epochs / max(n_checkpoints, 1), recipe.epochs, max(n_checkpoints, 1))).astype(int) - 1

    def mean_loss(p, bx, by):
        return jnp.mean(jax.vmap(loss, in_axes=(None, 0, 0))(p, bx, by))

    def one(p, subset, key):
        def epoch(carry, k):
            def step(c, b):
                p, s = c
                g = jax.grad(mean_loss)(p, xs[b], ys[b])
                u, s = opt.update(g, s, p)
                return (optax.apply_updates(p, u), s), None

            batches = subset[jax.random.permutation(k, h)][: steps * recipe.batch].reshape(steps, recipe.batch)
            carry, _ = jax.lax.scan(step, carry, batches)
            return carry, carry[0] if n_checkpoints else None

        (p, _), trace = jax.lax.scan(epoch, (p, opt.init(p)), jax.random.split(key, recipe.epochs))
        return p, (jax.tree.map(lambda a: a[keep], trace) if n_checkpoints else None)

    return jax.jit(jax.vmap(one))(params0, jnp.asarray(subsets), keys)


def outputs(stacked: dict, xs, ys) -> np.ndarray:
    """The ground truth: −ℓ(θ_m, z_t) of each model on each test point, `(M, T)`."""
    per_model = lambda p: -jax.vmap(loss, in_axes=(None, 0, 0))(p, xs, ys)
    return np.asarray(jax.jit(jax.vmap(per_model))(stacked))


def unstack(stacked: dict) -> list[dict]:
    """A stacked pytree (leading M axis) as a list of M pytrees."""
    m = len(next(iter(stacked.values())))
    return [jax.tree.map(lambda a: a[i], stacked) for i in range(m)]


# ------------------------------------------------------------------ the fixed experiment


@dataclasses.dataclass
class Setup:
    """Everything both sides score against: data, subsets, ground truth, and the models to attribute."""

    name: str
    recipe: Recipe
    data: Split
    subsets: np.ndarray          # (M, N/2) int
    truth: np.ndarray            # (M, T) −loss of each retrained model on each test point
    full: dict                   # the model trained on all N (seed 0)
    checkpoints: list            # TracIn's checkpoints along that run
    trak_models: list            # models trained on other random halves
    seconds: float


def build(name: str, data: Split, *, retrains: int, trak_models: int, n_checkpoints: int = 10, seed: int = 0) -> Setup:
    """Train everything once: M retrained models on half subsets, the full model and its checkpoints, TRAK's models."""
    t0 = time.time()
    recipe = RECIPES[name]
    n, d = data.x.shape
    xs, ys = jnp.asarray(data.x), jnp.asarray(data.y)
    inits = lambda seeds: jax.vmap(lambda k: init_params(k, recipe, d, data.n_classes))(
        jnp.stack([jax.random.key(s) for s in seeds]))
    keys = lambda seeds: jnp.stack([jax.random.key(10_000 + s) for s in seeds])
    subsets = inf.random_subsets(n, retrains, seed=seed)
    retrained, _ = train(inits(range(1, retrains + 1)), xs, ys, subsets, keys(range(1, retrains + 1)), recipe)
    truth = outputs(retrained, jnp.asarray(data.x_test), jnp.asarray(data.y_test))
    full, trace = train(inits([0]), xs, ys, np.arange(n)[None], keys([0]), recipe, n_checkpoints=n_checkpoints)
    halves = inf.random_subsets(n, trak_models, seed=seed + 1)
    s = range(retrains + 1, retrains + 1 + trak_models)
    trak, _ = train(inits(s), xs, ys, halves, keys(s), recipe)
    return Setup(name, recipe, data, subsets, truth, unstack(full)[0], unstack(jax.tree.map(lambda a: a[0], trace)),
                 unstack(trak), time.time() - t0)


def cached_build(path: str | None, name: str, data: Split, *, retrains: int, trak_models: int) -> Setup:
    """`build`, saved to / loaded from the pickle at `path` (None: no cache; plain dicts and arrays, so any entry
    point reads it). A saved setup is used only when its model, data arrays, number of retrains and TRAK models are
    the ones asked for; else it is built again."""
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            s = pickle.load(f)
        if isinstance(s, dict):
            s = Setup(**{**s, "recipe": Recipe(**s["recipe"]), "data": Split(**s["data"])})
        if (s.name == name and len(s.subsets) == retrains and len(s.trak_models) == trak_models
                and all(np.array_equal(a, b) for a, b in zip(
                    (s.data.x, s.data.y, s.data.x_test, s.data.y_test), (data.x, data.y, data.x_test, data.y_test)))):
            return s
    s = build(name, data, retrains=retrains, trak_models=trak_models)
    if path:
        host = lambda t: jax.tree.map(np.asarray, t)
        plain = {**vars(s), "recipe": dataclasses.asdict(s.recipe), "data": dataclasses.asdict(s.data),
                 "full": host(s.full), "checkpoints": [host(c) for c in s.checkpoints],
                 "trak_models": [host(m) for m in s.trak_models]}
        with open(path, "wb") as f:     # plain dicts and arrays: classes pickled under `python -m` are __main__'s
            pickle.dump(plain, f)
    return s


# ------------------------------------------------------------------ gradlab's side


def gradlab_influence(s: Setup, damping: float, cg_steps: int | None = 10, cg_maxiter: int = 200):
    """gradlab's influence function, `((T, N) scores, InverseHVP)`: the exact Hessian for logistic regression;
    for the MLP conjugate gradient truncated at `cg_steps` steps (dattri's benchmark stops its CG at 10 too), or with
    `cg_steps=None` run to relative residual 1e-5 within `cg_maxiter` steps, else refused (`InfluenceError`)."""
    xs, ys = jnp.asarray(s.data.x), jnp.asarray(s.data.y)
    txs, tys = jnp.asarray(s.data.x_test), jnp.asarray(s.data.y_test)
    if not s.recipe.hidden:
        scores, info = inf.influence_scores(loss, s.full, xs, ys, txs, tys, damping=damping, method="exact")
    else:
        scores, info = inf.influence_scores(loss, s.full, xs, ys, txs, tys, damping=damping, method="cg",
                                            cg_maxiter=cg_maxiter, cg_steps=cg_steps)
    return np.asarray(scores), info


def gradlab_scores(s: Setup, method: str, *, damping: float = 0.0, proj_dim: int = 512) -> np.ndarray:
    """gradlab's `(T, N)` scores of one method on the setup's models (high = proponent); the influence function
    as `gradlab_influence` with its defaults."""
    xs, ys = jnp.asarray(s.data.x), jnp.asarray(s.data.y)
    txs, tys = jnp.asarray(s.data.x_test), jnp.asarray(s.data.y_test)
    dots = lambda p: sc.project(loss, p, xs, ys, sc.flat_gradients(loss, p, txs, tys).T).T
    if method == "grad_dot":
        return np.asarray(dots(s.full))
    if method == "tracin":
        return np.asarray(sum(s.recipe.lr * dots(c) for c in s.checkpoints))
    if method == "influence":
        return gradlab_influence(s, damping)[0]
    if method == "trak":   # Park et al.'s Algorithm 1, as dattri's TRAKAttributor
        return np.asarray(inf.trak(loss, s.trak_models, xs, ys, txs, tys, proj_dim=proj_dim, kernel="algorithm1"))
    if method == "trak_gn":   # gradlab's own TRAK: the softmax Gauss–Newton kernel, all C classes
        p = sum(v.size for v in s.full.values())
        return np.asarray(inf.trak(loss, s.trak_models, xs, ys, txs, tys, proj_dim=min(proj_dim, p), l2=0.0,
                                   damping=damping, n_classes=s.data.n_classes))
    raise ValueError(method)


# ------------------------------------------------------------------ dattri's side


def dattri_available() -> bool:
    """Whether torch and dattri import (they are benchmark-only dependencies)."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "dattri"))


#: Test points dattri's influence function takes per `attribute` call: one test batch, whose CG dattri vmaps over its
#: rows (`dattri.func.hessian.ihvp_at_x_cg`); 16 rows at once took a third of the time of 16 one-row calls.
DATTRI_TEST_BATCH = 100


def dattri_scores(s: Setup, method: str, *, damping: float = 0.0, proj_dim: int = 512, cg_iters: int = 10,
                  progress: Callable[[np.ndarray], None] | None = None) -> np.ndarray:
    """dattri's `(T, N)` scores of one method on the same models, weights copied into torch (dattri's own settings:
    `experiments/benchmark_result.py`). The influence function runs `DATTRI_TEST_BATCH` test points per call and
    hands the scores so far, `(t, N)`, to `progress` after each."""
    import torch
    from dattri.algorithm.influence_function import IFAttributorCG, IFAttributorExplicit
    from dattri.algorithm.tracin import TracInAttributor
    from dattri.algorithm.trak import TRAKAttributor
    from dattri.task import AttributionTask
    from torch import nn
    from torch.utils.data import DataLoader, Subset, TensorDataset

    torch.manual_seed(0)
    names = layer_names(s.recipe)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            sizes = [s.data.x.shape[1], *s.recipe.hidden, s.data.n_classes]
            for name, a, b in zip(names, sizes[:-1], sizes[1:]):
                setattr(self, name, nn.Linear(a, b))

        def forward(self, x):
            for i, name in enumerate(names):
                x = getattr(self, name)(x)
                x = torch.relu(x) if i < len(names) - 1 else x
            return x

    model = Net().eval()
    state = lambda p: {k: torch.from_numpy(np.array(v)) for k, v in p.items()}
    train_set = TensorDataset(torch.from_numpy(s.data.x), torch.from_numpy(s.data.y).long())
    test_set = TensorDataset(torch.from_numpy(s.data.x_test), torch.from_numpy(s.data.y_test).long())
    n = len(train_set)
    loader = lambda ds, bs: DataLoader(ds, batch_size=bs, shuffle=False)
    ce = nn.CrossEntropyLoss()

    def per_example(params, data):     # dattri's benchmark losses see one example (vmapped)
        x, y = data
        return ce(torch.func.functional_call(model, params, x.unsqueeze(0)), y.unsqueeze(0))

    def mean_loss(params, data):       # the influence function's loss sees a batch
        x, y = data
        return ce(torch.func.functional_call(model, params, x), y)

    def margin(params, data):
        logp = -per_example(params, data)
        return logp - torch.log(1 - torch.exp(logp))

    def probability(params, data):
        return torch.exp(-per_example(params, data))

    with torch.no_grad():
        if method in ("grad_dot", "tracin"):
            ckpts = [s.full] if method == "grad_dot" else s.checkpoints
            weights = torch.ones(1) if method == "grad_dot" else torch.full((len(ckpts),), s.recipe.lr)
            task = AttributionTask(model=model, loss_func=per_example, checkpoints=[state(c) for c in ckpts])
            att = TracInAttributor(task=task, weight_list=weights, normalized_grad=False)
            score = att.attribute(loader(train_set, 500), loader(test_set, 500))
        elif method == "influence":
            task = AttributionTask(model=model, loss_func=mean_loss, checkpoints=state(s.full))
            att = (IFAttributorExplicit(task=task, regularization=damping) if not s.recipe.hidden else
                   IFAttributorCG(task=task, regularization=damping, max_iter=cg_iters))
            att.cache(loader(train_set, n))          # one batch: dattri sums the inverse HVPs of its batches
            # the training set in one batch too: dattri solves the test points' inverse HVPs again for every
            # training batch (same scores, 10× the work at batch 500); test points 100 per batch (memory)
            parts, t = [], len(test_set)
            for lo in range(0, t, DATTRI_TEST_BATCH):
                chunk = Subset(test_set, range(lo, min(lo + DATTRI_TEST_BATCH, t)))
                parts.append(att.attribute(loader(train_set, n), loader(chunk, DATTRI_TEST_BATCH)))
                if progress:
                    progress(torch.cat(parts, 1).numpy().T.astype(np.float64))
            score = torch.cat(parts, 1)
        elif method == "trak":
            task = AttributionTask(model=model, loss_func=margin, checkpoints=[state(m) for m in s.trak_models])
            att = TRAKAttributor(task=task, correct_probability_func=probability, **_projection(proj_dim))
            att.cache(loader(train_set, 500))
            score = att.attribute(loader(test_set, 500))
        else:
            raise ValueError(method)
    return score.detach().numpy().T.astype(np.float64)


def _projection(k: int) -> dict:
    """TRAK's projection dimension in either dattri API (0.3: `projector_kwargs`; later: `proj_params`)."""
    try:
        from dattri.params.projection import TRAKProjectionParams
    except ImportError:
        return {"projector_kwargs": {"proj_dim": k}}
    return {"proj_params": TRAKProjectionParams(proj_dim=k)}


# ------------------------------------------------------------------ report


def mean_se(per_test: np.ndarray) -> tuple[float, float]:
    """Mean and standard error over the test points with a defined correlation."""
    v = per_test[np.isfinite(per_test)]
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")


def cell(per_test) -> str:
    if per_test is None:
        return "—"
    m, se = mean_se(per_test)
    return f"{m:.3f} ± {se:.3f}"


def best_damping(score_fn: Callable[[float], np.ndarray | tuple], grid, subsets, truth):
    """dattri's protocol for the influence function: the damping with the best mean LDS. `score_fn(δ)` returns
    the scores, or `(scores, InverseHVP)` whose label goes into the notes. Returns `(per_test LDS, δ, notes)`; a δ
    whose solve fails is noted and skipped."""
    best, notes = None, []
    for delta in grid:
        try:
            out = score_fn(delta)
        except InfluenceError as err:
            notes.append(f"δ = {delta:g}: {str(err).split(':')[0]}")
            continue
        scores, label = out if isinstance(out, tuple) else (out, None)
        r = inf.lds(scores, subsets, truth)
        label = label.label if label is not None else None
        notes.append(f"δ = {delta:g}: {r.mean:.3f}" + (f" ({label})" if label else ""))
        if best is None or r.mean > best[0].mean:
            best = (r, delta, label)
    return (best[0].per_test, best[1], notes, best[2]) if best else (None, None, notes, None)


METHODS = {"grad_dot": "Grad-Dot", "tracin": "TracIn", "influence": "IF", "trak": "TRAK"}


def compare(full: Setup, *, grid, proj_dim: int, cg_iters: int, with_dattri: bool, gn: bool, if_test: int | None = None,
            methods=None, converged: bool = False, say=lambda *_: None) -> list[str]:
    """Markdown rows: per method gradlab's LDS, dattri's, and their paired difference (± SE over test points).
    `if_test`: the influence function on the first K test points only (its solves cost T × the rest). The MLP's
    influence function: both sides stop conjugate gradient after `cg_iters` steps (gradlab from 0, dattri from v),
    or with `converged` gradlab solves to convergence (and refuses where it cannot)."""
    rows = []
    for m, label in METHODS.items():
        if methods and m not in methods:
            continue
        t0 = time.time()
        s = full
        note = ""
        if m == "influence":
            s = dataclasses.replace(full, data=dataclasses.replace(
                full.data, x_test=full.data.x_test[:if_test], y_test=full.data.y_test[:if_test]),
                truth=full.truth[:, :if_test]) if if_test else full
            label = f"IF ({len(s.data.y_test)} test points)" if if_test else label
            steps = None if converged else cg_iters
            g, dg, notes, how = best_damping(lambda d: gradlab_influence(s, d, cg_steps=steps), grid, s.subsets, s.truth)
            say(f"gradlab IF: {'; '.join(notes)}")
            note = f"gradlab δ = {dg:g}" + (f" ({how})" if s.recipe.hidden else "") if dg is not None else "gradlab failed"
            d = None
            if with_dattri:
                def running(x):     # dattri's LDS over the test points so far: a run cut short says something
                    return lambda sc: say(f"dattri IF δ = {x:g}: {len(sc)} test points, LDS "
                                          f"{cell(inf.lds(sc, s.subsets, s.truth[:, :len(sc)]).per_test)}")

                d, dd, notes, _ = best_damping(lambda x: dattri_scores(s, m, damping=x, cg_iters=cg_iters,
                                                                       progress=running(x)), grid, s.subsets, s.truth)
                say(f"dattri IF: {'; '.join(notes)}")
                note += f", dattri δ = {dd:g}" if dd is not None else ", dattri failed"
        else:
            g = inf.lds(gradlab_scores(s, m, proj_dim=proj_dim), s.subsets, s.truth).per_test
            d = inf.lds(dattri_scores(s, m, proj_dim=proj_dim), s.subsets, s.truth).per_test if with_dattri else None
        diff = cell(g - d) if g is not None and d is not None else "—"
        if diff != "—" and not diff.startswith("-"):
            diff = "+" + diff
        rows.append(f"| {s.name} | {label} | {cell(g)} | {cell(d)} | {diff} | {note} | {time.time() - t0:.0f} |")
        say(rows[-1])
    if gn:
        s, t0 = full, time.time()
        g, dg, _, _ = best_damping(lambda d: gradlab_scores(s, "trak_gn", damping=d, proj_dim=proj_dim), grid,
                                s.subsets, s.truth)
        rows.append(f"| {s.name} | TRAK, gradlab's Gauss–Newton kernel | {cell(g)} | — | — | δ = {dg} | "
                    f"{time.time() - t0:.0f} |")
        say(rows[-1])
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", choices=list(DATA), default="mnist1d")
    ap.add_argument("--train", type=int, default=5000)
    ap.add_argument("--test", type=int, default=500)
    ap.add_argument("--retrains", type=int, default=100)
    ap.add_argument("--trak-models", type=int, default=10, help="TRAK's ensemble (dattri: TRAK-1, -10, -50)")
    ap.add_argument("--proj-dim", type=int, default=512, help="TRAK's projection dimension (dattri: 512)")
    ap.add_argument("--damping", type=float, nargs="+", default=[1e0, 1e-1, 1e-2, 5e-3, 1e-3, 1e-4, 1e-5],
                    help="the influence function's damping grid (dattri's)")
    ap.add_argument("--cg-iters", type=int, default=10,
                    help="CG steps of the MLP influence function on both sides (dattri's benchmark: 10)")
    ap.add_argument("--converged", action="store_true",
                    help="gradlab's MLP influence function: CG to convergence (refused where it fails), not truncated")
    ap.add_argument("--if-test", type=int, default=None, help="the influence function on the first K test points only")
    ap.add_argument("--only", choices=list(RECIPES), default=None)
    ap.add_argument("--methods", nargs="+", choices=list(METHODS), default=None, help="a subset of the methods")
    ap.add_argument("--no-dattri", action="store_true", help="gradlab's side only")
    ap.add_argument("--cache", default=None, help="save the trained models to PREFIX.<data>-<model>-<N>-<T>.pkl and "
                    "reuse them in a later run with the same settings")
    ap.add_argument("--gauss-newton", action="store_true", help="also gradlab's Gauss–Newton TRAK (slow on the MLP)")
    args = ap.parse_args(argv)

    with_dattri = not args.no_dattri and dattri_available()
    if not args.no_dattri and not with_dattri:
        print("dattri or torch is not importable (pip install -r requirements-bench.txt): gradlab's side only")
    t_start = time.time()
    say = lambda msg: print(f"  [{time.time() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)
    data = load(args.data, args.train, args.test)
    print(f"# LDS, dattri's protocol on {args.data}: {args.train} train / {args.test} test, {args.retrains} retrains on "
          f"50% subsets, TRAK-{args.trak_models} (k = {args.proj_dim}), mean ± SE over test points")
    print("| model | method | gradlab | dattri | gradlab − dattri | damping | seconds |")
    print("|---|---|---|---|---|---|---|")
    for name in RECIPES:
        if args.only and name != args.only:
            continue
        cache = args.cache and f"{args.cache}.{args.data}-{name}-{args.train}-{args.test}.pkl"
        s = cached_build(cache, name, data, retrains=args.retrains, trak_models=args.trak_models)
        say(f"{name}: trained {args.retrains} + 1 + {args.trak_models} models in {s.seconds:.0f}s")
        for row in compare(s, grid=args.damping, proj_dim=args.proj_dim, cg_iters=args.cg_iters,
                           with_dattri=with_dattri, gn=args.gauss_newton, if_test=args.if_test,
                           methods=args.methods, converged=args.converged, say=say):
            print(row, flush=True)
    print(f"total {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
