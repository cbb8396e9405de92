"""dattri's LDS protocol on the app's SimpleCNN over the Fashion-MNIST subset: every gradlab method that applies
without θ̂, and dattri's TRAK and EK-FAC, on the same model, data and checkpoints (issue 40, item 3).

    pip install -r requirements-bench.txt              # CPU torch and dattri (benchmark-only)
    python -m benchmarks.lds_cnn                        # 2,000 train / 100 test, 50 retrains (the table in docs/influence.md)
    python -m benchmarks.lds_cnn --json gradlab/data/lds_simple_cnn.json   # and write the Influence page's JSON
    python -m benchmarks.lds_cnn --retrains 10 --test 20 --no-dattri       # a quick look at gradlab's side

The protocol (Deng et al., NeurIPS 2024, dattri's benchmark; Park et al. 2023, eq. 4), as `benchmarks.lds_dattri`:

- data: the shipped Fashion-MNIST subset as the app loads it (`Experiment(dataset="fashion")`: standardized by one
  mean and std), its first `--train` training images (default 2,000 of 6,000, the recipe's steps scaled to match:
  `experiment`) and the first `--test` of its 1,000 test images;
- ground truth: `--retrains` SimpleCNNs, each trained on a random half of the training images
  (`gradlab.influence.random_subsets`, seed 0) with the app's own recipe (`gradlab.train.train` with
  `Experiment.for_model("simple_cnn")`'s recipe: 300 steps of 32, `adam_warmup` 0.005, epoch order, label smoothing
  0.1), retrain m from its own initialization and minibatch order (seed 100 + m); each one's output on each test
  point is −ℓ (the plain cross-entropy);
- LDS: per test point the Spearman correlation over the subsets between Σ_{i∈S} τ_i and that output
  (`gradlab.influence.lds`), averaged over test points, ± its standard error over test points;
- the model attributed: the app's SimpleCNN (`fit` at seed 0 on those images), with its checkpoints.

gradlab's side loops over `gradlab.influence.methods.METHODS`: every method that applies (`Method.applies`) and
prepares without θ̂ (this script's `Context` refuses `optimum()`: the L-BFGS optimum of a 1.2 M-parameter CNN is not
what the page computes at this size) joins the table without edits here. Each method's cost is its process time
(CPU-seconds, both cores: `time.process_time`) for `prepare` plus scoring the test points.

dattri's side: the same weights copied into a torch `SimpleCNN` with torch's layer names and layouts
(`benchmarks.torch_cnn`'s network: conv1, conv2, fc1, fc2, OIHW and (out, in)), the same tensors, and

- `TRAKAttributor` (Park et al.'s Algorithm 1: margin gradients, a random projection to `--proj-dim`, ΦᵀΦ), on the
  seed-0 model alone (TRAK-1, the identical weights), or with `--trak-models 1 3` also on an ensemble: the seed-0
  model and more trained on the same images with the same recipe at seeds 1, 2, … (the app's TRAK ensemble;
  dattri's benchmark uses models on other random halves);
- `IFAttributorEKFAC` on the seed-0 model: dattri 0.3's EK-FAC hooks `nn.Linear` modules only; by default on fc2
  (`--ekfac-modules fc1 fc2` adds fc1, whose 9,217 × 9,217 input factor did not fit a session on the shared machine),
  damping the best LDS over `--damping` (as dattri's benchmark picks it), as shipped and with its eigenbasis and bias
  layout corrected (`ekfac_columns`).

Trained models and the retrains' outputs are cached under `--cache` (default /tmp/gradlab-lds-cnn): a rerun with
the same settings trains nothing. The machine is shared: CPU-seconds are the cost to compare, wall times are not.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import pickle
import sys
import time
from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.torch_cnn import torch_simple_cnn
from gradlab import influence as inf
from gradlab.experiment import Experiment, Fitted, fit, init_model, load_data, recipe
from gradlab.influence import fitted as ifit
from gradlab.influence.methods import METHODS, defaults
from gradlab.influence.protocol import UNAVAILABLE
from gradlab.influence.solvers import InfluenceError
from gradlab.sources import source_of
from gradlab.train import TrainResult, train

os.environ.setdefault("TQDM_DISABLE", "1")     # dattri's progress bars

#: The experiment attributed: the app's SimpleCNN on the Fashion-MNIST subset, seed 0.
EXPERIMENT = Experiment.for_model("simple_cnn").replace(dataset="fashion")
#: The training images the app's recipe is written for (300 steps of 32: 1.6 epochs over 6,000 images).
APP_TRAIN = 6000


def experiment(n_train: int) -> Experiment:
    """The app's SimpleCNN experiment for the first `n_train` training images: the recipe's steps (and checkpoint
    interval) scaled by n_train / 6,000, so that every image is seen as often as in the app (1.6 epochs over all
    images, 3.2 over a half); everything else (batch 32, `adam_warmup` 0.005 with its 10% warm-up, epoch order,
    label smoothing 0.1) is the app's. At 6,000 it is the app's experiment itself."""
    if n_train == APP_TRAIN:
        return EXPERIMENT
    scale = n_train / APP_TRAIN
    return EXPERIMENT.replace(steps=max(1, round(EXPERIMENT.steps * scale)),
                              checkpoint_every=max(1, round(EXPERIMENT.checkpoint_every * scale)))


def dataset(n_train: int):
    """The app's Fashion-MNIST subset (`load_data`: standardized by the mean and std of all 6,000 training images),
    its first `n_train` training images (the shipped file is a stratified draw in Fashion-MNIST's order, so any
    prefix is close to 10% per class) and all 1,000 test images."""
    data = load_data(EXPERIMENT)
    if n_train >= len(data.y_train):
        return data
    cut = lambda a: a[:n_train] if a is not None and len(a) == len(data.y_train) else a
    return dataclasses.replace(data, **{f.name: cut(getattr(data, f.name)) for f in dataclasses.fields(data)
                                        if f.name.endswith("_train") or f.name in ("flipped",)})
#: Retrain m's seed (initialization and minibatch order): disjoint from the attributed model's 0 and TRAK's 1, 2, ….
RETRAIN_SEED = 100
NEEDS_OPTIMUM = "needs θ̂ (the L-BFGS optimum of mean ℓ + λ/2‖θ‖²), which this benchmark does not converge at 1.2 M parameters"


class Clock:
    """Process CPU-seconds (every thread, both cores) and wall seconds since construction."""

    def __init__(self):
        self.cpu, self.wall = time.process_time(), time.perf_counter()

    @property
    def cpu_s(self) -> float:
        return time.process_time() - self.cpu

    @property
    def wall_s(self) -> float:
        return time.perf_counter() - self.wall


# ------------------------------------------------------------------ the fixed experiment (cached)


def _host(model) -> list[np.ndarray]:
    return [np.asarray(a) for a in jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array))]


def _model(leaves: list[np.ndarray], template):
    diff, static = eqx.partition(template, eqx.is_inexact_array)
    tree = jax.tree.structure(diff)
    return eqx.combine(jax.tree.unflatten(tree, [jnp.asarray(a) for a in leaves]), static)


def _cached(path: str | None, make: Callable[[], dict]) -> dict:
    """`make()` (a dict of plain arrays and lists), saved to / loaded from the pickle at `path`."""
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            return pickle.load(f)
    out = make()
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".part", "wb") as f:
            pickle.dump(out, f)
        os.replace(path + ".part", path)
    return out


def attributed(cache: str | None, data, exp: Experiment) -> tuple[Fitted, float]:
    """The app's SimpleCNN at seed 0 on all training images (`fit`), with its run's checkpoints; and its training
    CPU-seconds (when trained now; the cached value otherwise)."""
    template = init_model(exp, data)

    def make():
        clock = Clock()
        run = fit(exp, data=data).run
        return {"checkpoints": [_host(c) for c in run.checkpoints], "steps": list(run.steps),
                "losses": np.asarray(run.losses), "lrs": list(run.lrs), "cpu_s": clock.cpu_s}

    got = _cached(cache and os.path.join(cache, f"attributed-{_tag(data, exp)}.pkl"), make)
    run = TrainResult(tuple(_model(c, template) for c in got["checkpoints"]), tuple(got["steps"]), got["losses"],
                      tuple(got["lrs"]))
    source = source_of(exp.dataset)
    return Fitted(exp, data, source.loss_fn(data), run, source.predict_fn()), got["cpu_s"]


def _tag(data, exp: Experiment) -> str:
    """What names a cache entry: the training set's size, a checksum of its pixels and labels, the recipe's steps."""
    h = float(np.asarray(data.x_train, np.float64)[:, ::97].sum()) + float(data.y_train.sum())
    return f"n{len(data.y_train)}-{h:.6e}-s{exp.steps}"


def train_one(data, exp: Experiment, subset: np.ndarray | None, seed: int):
    """`exp`'s recipe (`recipe(exp)`) from the initialization at `seed`, on the training images `subset`
    (None: all of them), minibatches drawn with `seed`. Returns the final model."""
    exp = exp.replace(seed=seed)
    xs, ys = (data.x_train, data.y_train) if subset is None else (data.x_train[subset], data.y_train[subset])
    kw = {k: v for k, v in recipe(exp).items() if k != "checkpoint_every"}
    return train(init_model(exp, data), _loss(data), xs, ys, checkpoint_every=kw["steps"], seed=seed, **kw).final


def _loss(data):
    return source_of(EXPERIMENT.dataset).loss_fn(data)


def outputs_of(model, data) -> np.ndarray:
    """−ℓ(θ, z) on every test image, `(1000,)`."""
    f = _loss(data)
    return -np.asarray(jax.jit(jax.vmap(f, in_axes=(None, 0, 0)))(model, jnp.asarray(data.x_test),
                                                                     jnp.asarray(data.y_test)))


def ground_truth(cache: str | None, data, exp: Experiment, retrains: int, say, reverse: bool = False,
                 share: bool = False):
    """`(subsets (M, N/2), outputs (M, 1000), CPU-seconds)`: M retrains on random halves (seed 0), each cached on its
    own (a run cut short resumes where it stopped; a second process with `reverse` trains from the last one down,
    and the two meet in the middle; with `share`, a retrain another process has claimed is skipped, so several
    `--build-only` processes split the work)."""
    n = len(data.y_train)
    subsets = inf.random_subsets(n, retrains, seed=0)
    outs, cpu = [], 0.0
    for m, s in reversed(list(enumerate(subsets))) if reverse else enumerate(subsets):
        path = cache and os.path.join(cache, f"retrain-{_tag(data, exp)}-half0-m{m}.pkl")
        if share and path and not os.path.exists(path):
            try:
                os.close(os.open(path + ".claim", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                continue
        def make(m=m, s=s):
            clock = Clock()
            out = outputs_of(train_one(data, exp, s, RETRAIN_SEED + m), data)
            return {"subset": s, "outputs": out, "cpu_s": clock.cpu_s}

        got = _cached(path, make)
        if not np.array_equal(got["subset"], s):
            raise RuntimeError(f"cache entry {m} holds another subset: remove {cache}")
        outs.append((m, got["outputs"]))
        cpu += got["cpu_s"]
        say(f"retrain {m + 1}/{retrains}: {got['cpu_s']:.1f} CPU-s, mean output {got['outputs'].mean():.3f}")
    if share:
        return subsets, None, cpu
    return subsets, np.stack([o for _, o in sorted(outs, key=lambda p: p[0])]), cpu


def full_models(cache: str | None, data, exp: Experiment, seeds, say) -> tuple[list, float]:
    """Models trained on all images with `exp`'s recipe at `seeds` (TRAK's ensemble beyond seed 0), cached."""
    template = init_model(exp, data)
    models, cpu = [], 0.0
    for seed in seeds:
        def make(seed=seed):
            clock = Clock()
            return {"leaves": _host(train_one(data, exp, None, seed)), "cpu_s": clock.cpu_s}

        got = _cached(cache and os.path.join(cache, f"full-{_tag(data, exp)}-seed{seed}.pkl"), make)
        models.append(_model(got["leaves"], template))
        cpu += got["cpu_s"]
        say(f"full-data model at seed {seed}: {got['cpu_s']:.1f} CPU-s")
    return models, cpu



# ------------------------------------------------------------------ gradlab's side: the registry


def _refuse_optimum():
    raise InfluenceError(NEEDS_OPTIMUM)


@dataclasses.dataclass
class Row:
    """One method's result: `side` ("gradlab" / "dattri"), `method` (registry name or dattri's class), `label`,
    `scores (T, N)`, `cpu_s` (process CPU-seconds of preparing and scoring), `wall_s`, `note`, `command` (what
    reproduces it), `per_test (T,)` its LDS once `score`d, `damping` (EK-FAC's δ)."""

    side: str
    method: str
    label: str
    scores: np.ndarray | None     # (T, N), high = proponent; None when the method did not run
    cpu_s: float | None
    wall_s: float | None
    note: str = ""
    command: str = ""
    per_test: np.ndarray | None = None   # (T,) LDS, filled in by `score`
    damping: float | None = None

    @property
    def lds(self) -> tuple[float, float]:
        return mean_se(self.per_test) if self.per_test is not None else (float("nan"), float("nan"))


def mean_se(per_test: np.ndarray) -> tuple[float, float]:
    """Mean and standard error over the test points with a defined correlation."""
    v = per_test[np.isfinite(per_test)]
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")


def gradlab_side(fitted: Fitted, t: int, say, only=None, damping_grid=None, settings=None) -> list[Row]:
    """Every registry method that applies to `fitted` and prepares without θ̂, scored on the first `t` test points:
    scores and CPU-seconds of `prepare` + `scores`. A method that cannot run here is a row with its reason. With
    `damping_grid`, a method that reads the damping δ (EK-FAC) is prepared once and scored at each δ, a row each
    (`score` keeps the best, as it does for dattri's EK-FAC); its CPU-s: preparing plus one δ's scoring.
    `settings`: the methods' settings where they differ from the page's defaults (`--set`)."""
    settings = dict(settings or {})
    ctx = ifit.context(fitted, settings, base=_refuse_optimum)
    why = {name: m.applies(fitted) for name, m in METHODS.items()}
    txs, tys = jnp.asarray(fitted.data.x_test[:t]), jnp.asarray(fitted.data.y_test[:t])
    rows = []
    for name, m in METHODS.items():
        if only and name not in only:
            continue
        if why[name] is not None:
            rows.append(Row("gradlab", name, m.label, None, None, None, f"does not apply: {why[name]}"))
            continue
        clock = Clock()
        state, err = ifit.prepare(ctx, m)
        prep_cpu, prep_wall = clock.cpu_s, clock.wall_s
        grid = list(damping_grid) if damping_grid and "damping" in m.reads else [None]
        for delta in grid:
            c, clock = (ctx if delta is None else ifit.context(fitted, {**settings, "damping": delta},
                                                                  base=_refuse_optimum)), Clock()
            if err is None:
                try:
                    values = np.asarray(m.scores(c, state, txs, tys).values)
                except UNAVAILABLE as e:
                    err = str(e)
            if err is not None:
                rows.append(Row("gradlab", name, m.label, None, None, None,
                                "not run: " + ("needs θ̂" if NEEDS_OPTIMUM in err else err)))
                say(f"gradlab {name}: {rows[-1].note}")
                break
            cpu, wall = prep_cpu + clock.cpu_s, prep_wall + clock.wall_s
            rows.append(Row("gradlab", name, m.label, values, cpu, wall, m.note(state) or "", damping=delta))
            say(f"gradlab {name}" + (f" at δ = {delta:g}" if delta is not None else "") + f": {cpu:.0f} CPU-s")
    return rows


def _settings(pairs) -> dict:
    """`--set` NAME=VALUE pairs as settings, each value parsed as its control's default's type."""
    known = defaults()
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in known:
            raise SystemExit(f"--set: no setting {name!r}; the settings are {', '.join(sorted(known))}")
        out[name] = type(known[name])(value)
    return out


def score(rows: list[Row], subsets, truth) -> list[Row]:
    """Each row's LDS against the ground truth; of a method run at several dampings (EK-FAC) the best mean LDS is
    kept, the others named in its note (dattri's benchmark picks δ so: selection on the test points, which flatters
    it)."""
    out, groups = [], {}
    for r in rows:
        r = dataclasses.replace(r, per_test=None if r.scores is None else
                                inf.lds(r.scores, subsets, truth[:, :len(r.scores)]).per_test)
        if r.damping is None:
            out.append(r)
        else:
            groups.setdefault((r.side, r.method), []).append(r)
            if len(groups[(r.side, r.method)]) == 1:
                out.append((r.side, r.method))
    final = []
    for r in out:
        if isinstance(r, tuple):
            g = groups[r]
            best = max(g, key=lambda x: x.lds[0])
            tried = ", ".join(f"δ = {x.damping:g}: {x.lds[0]:.3f}" for x in g)
            r = dataclasses.replace(best, note=f"damping δ = {best.damping:g}, the best of {tried}; " + best.note)
        final.append(r)
    return final


def fmt(row: Row) -> str:
    m, se = row.lds
    return "—" if row.per_test is None else f"{m:.3f} ± {se:.3f}"


# ------------------------------------------------------------------ dattri's side


def dattri_available() -> bool:
    """Whether torch and dattri import (benchmark-only dependencies)."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "dattri"))


def torch_cnn(n_classes: int = 10):
    """The SimpleCNN in torch (`benchmarks.torch_cnn.torch_simple_cnn`), in `eval()` mode."""
    return torch_simple_cnn(n_classes).eval()


def torch_state(model) -> dict:
    """An Equinox `SimpleCNN`'s weights as a torch state dict (same names and layouts: OIHW, (out, in); the conv
    biases (O, 1, 1) flattened)."""
    import torch

    out = {}
    for name in ("conv1", "conv2", "fc1", "fc2"):
        layer = getattr(model, name)
        out[f"{name}.weight"] = torch.from_numpy(np.array(layer.weight, np.float32))
        out[f"{name}.bias"] = torch.from_numpy(np.array(layer.bias, np.float32).reshape(-1))
    return out


def torch_outputs(model, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """−ℓ of the torch copy of `model` on images `x (T, 784)`: the port check against `outputs_of`."""
    import torch

    net = torch_cnn()
    net.load_state_dict(torch_state(model))
    with torch.no_grad():
        logp = net(torch.from_numpy(np.asarray(x, np.float32)).reshape(-1, 1, 28, 28))
    return logp[torch.arange(len(y)), torch.from_numpy(np.asarray(y, np.int64))].numpy()


def ekfac_columns():
    """dattri's `IFAttributorEKFAC` with two changes that make it the EK-FAC of George et al. (2018): the
    eigenbasis is the eigenvectors as COLUMNS (`torch.linalg.eigh`'s Q, A = Q diag(λ) Qᵀ: coordinates Q_Sᵀ V Q_A;
    dattri 0.3 computes Q_S V Q_Aᵀ, the rows, both when it corrects the eigenvalues and when it transforms), and a
    layer's gradient as the matrix [∇W | ∇b] (out, in + 1) with the bias as the last column, the layout of its
    factors' inputs [a; 1] (dattri 0.3 reshapes the concatenation of the flattened weight and bias, which puts the
    bias values across rows). The same factors, eigenvalue correction and damping otherwise."""
    import dattri.func.fisher as fisher
    import torch
    from dattri.algorithm.influence_function import IFAttributorEKFAC

    class EKFACColumns(IFAttributorEKFAC):
        def cache(self, full_train_dataloader, max_iter=None):
            plain = fisher.estimate_eigenvector
            # dattri's formulas take q_s @ v @ q_a.T: handing them Qᵀ makes that Q_Sᵀ V Q_A
            fisher.estimate_eigenvector = lambda cov: {k: (qa.T.contiguous(), qs.T.contiguous())
                                                       for k, (qa, qs) in plain(cov).items()}
            try:
                super().cache(full_train_dataloader, max_iter)
            finally:
                fisher.estimate_eigenvector = plain

        def transform_test_rep(self, ckpt_idx, test_rep):
            params = {k: p for k, p in self.task.model.named_parameters() if p.requires_grad}
            parts, at = {}, 0
            for name in self.layer_name:
                size = params[name].numel()
                parts[name] = test_rep[:, at: at + size].reshape(-1, *params[name].shape)
                at += size
            out = []
            for name in self.module_name:
                w, b = parts[name + ".weight"], parts.get(name + ".bias")
                v = torch.cat([w, b.unsqueeze(-1)], -1) if b is not None else w
                q_a, q_s = self.cached_q[name]            # transposed eigenvectors (rows = eigenvectors)
                r = q_s.T @ ((q_s @ v @ q_a.T) / (self.cached_lambdas[name] + self.damping)) @ q_a
                out.append(r[..., : w.shape[-1]].flatten(1))
                if b is not None:
                    out.append(r[..., -1])
            return torch.cat(out, 1)

    return EKFACColumns


def dattri_side(fitted: Fitted, ensemble: list, t: int, say, *, proj_dim: int, damping_grid,
                batch: int, trak_sizes, ekfac: bool = True, ekfac_batches: int | None = None,
                ekfac_modules=("fc1", "fc2"), trak_ridge: float = 0.0) -> list[Row]:
    """dattri's TRAK (TRAK-k for each k in `trak_sizes`: the first k models of `ensemble`) and EK-FAC (on the
    seed-0 model, fc1 and fc2) on the same weights and tensors. The CPU-seconds of a TRAK-k row are dattri's
    attribution; the extra models' training is in the row's note. `trak_ridge` r > 0: TRAK's kernel ΦᵀΦ damped as
    gradlab's projected gradients damp theirs, + r · tr(ΦᵀΦ)/k · I (dattri's `regularization` is an absolute number,
    and the trace is known only inside its `cache`: its kernel solve is wrapped there)."""
    import torch
    from dattri.algorithm.influence_function import IFAttributorEKFAC
    from dattri.algorithm.trak import TRAKAttributor

    EKFACColumns = ekfac_columns()
    from dattri.task import AttributionTask
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    d = fitted.data
    img = lambda a: torch.from_numpy(np.asarray(a, np.float32)).reshape(-1, 1, 28, 28)
    train_set = TensorDataset(img(d.x_train), torch.from_numpy(np.asarray(d.y_train, np.int64)))
    test_set = TensorDataset(img(d.x_test[:t]), torch.from_numpy(np.asarray(d.y_test[:t], np.int64)))
    loader = lambda ds, bs: DataLoader(ds, batch_size=bs, shuffle=False)
    net = torch_cnn()

    def nll(params, data):       # a batch's mean cross-entropy (per-example under dattri's vmap: batch of 1)
        x, y = data
        logp = torch.func.functional_call(net, params, x if x.dim() == 4 else x.unsqueeze(0))
        y = y if y.dim() == 1 else y.unsqueeze(0)
        return torch.nn.functional.nll_loss(logp, y)

    def margin(params, data):    # TRAK's model output: log p − log(1 − p)
        logp = -nll(params, data)
        return logp - torch.log(1 - torch.exp(logp))

    def probability(params, data):
        return torch.exp(-nll(params, data))

    rows = []
    for k in trak_sizes:
        clock = Clock()
        task = AttributionTask(model=net, loss_func=margin, checkpoints=[torch_state(m) for m in ensemble[:k]])
        att = TRAKAttributor(task=task, correct_probability_func=probability, device="cpu",
                             projector_kwargs={"proj_dim": proj_dim, "proj_seed": 0, "device": "cpu"})
        solve = torch.linalg.solve
        if trak_ridge:  # ΦᵀΦ + r · mean eigenvalue · I, in dattri's own cache (its only solve)
            torch.linalg.solve = lambda a, b: solve(a + trak_ridge * a.diagonal().mean() * torch.eye(len(a)), b)
        try:
            with torch.no_grad():
                att.cache(loader(train_set, batch))
                score = att.attribute(loader(test_set, batch))
        finally:
            torch.linalg.solve = solve
        values = score.detach().numpy().T.astype(np.float64)
        cpu, wall = clock.cpu_s, clock.wall_s
        damped = f", ΦᵀΦ damped by {trak_ridge:g} × its mean eigenvalue" if trak_ridge else ""
        rows.append(Row("dattri", f"trak-{k}" + "-damped" * bool(trak_ridge),
                        f"TRAK-{k} (dattri TRAKAttributor, k = {proj_dim}{damped})", values, cpu, wall,
                        "the seed-0 model" if k == 1 else f"seed 0 and {k - 1} more full-data models (seeds 1–{k - 1})"))
        say(f"dattri TRAK-{k}: {cpu:.0f} CPU-s")
    if ekfac:
        for fixed in (False, True):
            clock = Clock()
            task = AttributionTask(model=net, loss_func=nll, checkpoints=torch_state(fitted.model))
            att = (EKFACColumns if fixed else IFAttributorEKFAC)(task=task, module_name=list(ekfac_modules),
                                                                 device="cpu", damping=0.0)
            att.cache(loader(train_set, batch), max_iter=ekfac_batches)
            cache_cpu, cache_wall = clock.cpu_s, clock.wall_s
            name = "ekfac-columns" if fixed else "ekfac"
            say(f"dattri {name} cache: {cache_cpu:.0f} CPU-s")
            # dattri's `attribute` (one checkpoint: Σ over train batches of transform_train_rep(train rep) @
            # transform_test_rep(test rep)ᵀ) with its own functions, the train representations computed once for
            # the whole damping grid (`attribute` would recompute them, and the test ones per train batch, per δ)
            clock = Clock()
            with torch.no_grad():
                one = lambda xy: tuple(v.unsqueeze(0) for v in xy)
                test_rep = att.generate_test_rep(0, one(test_set.tensors))
                transformed = []
                for delta in damping_grid:
                    att.damping = delta
                    transformed.append(att.transform_test_rep(0, test_rep))
                parts = [[] for _ in damping_grid]
                for lo in range(0, len(train_set), batch):
                    rep = att.transform_train_rep(0, att.generate_train_rep(
                        0, one(tuple(v[lo: lo + batch] for v in train_set.tensors))))
                    for k, tr in enumerate(transformed):
                        parts[k].append(rep @ tr.T)
            share_cpu, share_wall = clock.cpu_s / len(damping_grid), clock.wall_s / len(damping_grid)
            layers = " + ".join(ekfac_modules)
            for delta, part in zip(damping_grid, parts):
                values = torch.cat(part, 0).numpy().T.astype(np.float64)
                rows.append(Row("dattri", name, f"EK-FAC (dattri IFAttributorEKFAC, {layers}"
                                + (", eigenbasis and bias layout corrected here)" if fixed else ")"), values,
                                cache_cpu + share_cpu, cache_wall + share_wall,
                                f"layers {layers} only (dattri 0.3's EK-FAC hooks nn.Linear, no Conv2d); factors and "
                                "eigenvalues from " + (f"the first {ekfac_batches * batch:,} training images"
                                                       if ekfac_batches else "all of them")
                                + ("; `EKFACColumns`: eigenvectors as columns and the bias as each layer's last "
                                   "column (dattri 0.3 uses rows and interleaves the bias)" if fixed else "")
                                + f"; CPU-s: the cache plus 1/{len(damping_grid)} of scoring the δ grid at once",
                                damping=delta))
            say(f"dattri {name}: scored {len(damping_grid)} dampings in {clock.cpu_s:.0f} CPU-s (+ {cache_cpu:.0f} to cache)")
    return rows


PARTS = ("gradlab", "trak", "ekfac")
COMMAND = "python -m benchmarks.lds_cnn"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", type=int, default=2000, help="the first N of the subset's 6,000 training images "
                    "(the recipe's steps scaled by N / 6,000: `experiment`)")
    ap.add_argument("--test", type=int, default=100, help="the first T of the subset's 1,000 test images")
    ap.add_argument("--retrains", type=int, default=50, help="models on random halves (dattri: ≥ 50)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                    help="gradlab's registry, dattri's TRAK, dattri's EK-FAC")
    ap.add_argument("--methods", nargs="+", default=None, help="gradlab methods (registry names): default all")
    ap.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                    help="gradlab methods' settings other than the page's defaults (e.g. logra_layers=all)")
    ap.add_argument("--trak-models", type=int, nargs="+", default=[1],
                    help="dattri TRAK ensemble sizes: the seed-0 model, then full-data models at seeds 1, 2, …")
    ap.add_argument("--proj-dim", type=int, default=512, help="dattri TRAK's projection dimension (dattri: 512)")
    ap.add_argument("--trak-ridge", type=float, default=0.0, help="damp dattri TRAK's ΦᵀΦ by this × its mean "
                    "eigenvalue, as gradlab's projected gradients (0: dattri's default, undamped)")
    ap.add_argument("--damping", type=float, nargs="+", default=[1e-1, 1e-2, 1e-3, 1e-4],
                    help="dattri EK-FAC's damping grid (the best LDS is kept)")
    ap.add_argument("--gradlab-damping", action="store_true", help="score gradlab's methods that read δ (EK-FAC) "
                    "at every --damping too and keep the best, as dattri's EK-FAC (default: the page's δ)")
    ap.add_argument("--ekfac-batches", type=int, default=0, help="training batches dattri's EK-FAC estimates its "
                    "factors and eigenvalues from (`cache(max_iter=…)`; 0: all)")
    ap.add_argument("--ekfac-modules", nargs="+", default=["fc2"], help="the nn.Linear modules dattri's "
                    "EK-FAC runs on (fc1's 9,217 × 9,217 input factor needs an eigendecomposition of that size)")
    ap.add_argument("--batch", type=int, default=200, help="dattri's data-loader batch (memory: batch × P floats)")
    ap.add_argument("--build-only", action="store_true", help="train and cache the models, score nothing (several "
                    "such processes share the retrains)")
    ap.add_argument("--reverse", action="store_true", help="with --build-only: retrains only, from the last down")
    ap.add_argument("--cache", default="/tmp/gradlab-lds-cnn", help="where trained models and outputs are kept "
                    "('' for none)")
    ap.add_argument("--save-rows", default=None, help="pickle this run's rows (scores and CPU-s) here, for --merge")
    ap.add_argument("--score-only", action="store_true", help="with --save-rows: score, and leave the ground truth "
                    "(and the LDS) to --merge, so scoring runs while other processes retrain")
    ap.add_argument("--merge", nargs="+", default=None, help="the LDS table of rows saved by --save-rows (the ground "
                    "truth from the cache), run nothing else")
    ap.add_argument("--json", default=None, help="write the table as JSON here (gradlab/data/lds_simple_cnn.json)")
    args = ap.parse_args(argv)
    cache = args.cache or None
    t0 = time.time()
    say = lambda msg: print(f"  [{time.time() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)
    data, exp = dataset(args.train), experiment(args.train)
    if args.merge:
        rows, infos = [], []
        for path in args.merge:
            with open(path, "rb") as f:
                got = pickle.load(f)
            rows += [Row(**r) for r in got["rows"]]
            infos.append(got["info"])
        info = {**infos[0], "load": (min(i["load"][0] for i in infos), max(i["load"][1] for i in infos)),
                "extra_models_cpu_s": max(i["extra_models_cpu_s"] for i in infos),
                "port": next((i["port"] for i in infos if i["port"] is not None), None)}
        if any((i["n_train"], i["n_test"], i["retrains"]) != (info["n_train"], info["n_test"], info["retrains"])
               for i in infos):
            raise SystemExit("the saved rows come from runs with different --train, --test or --retrains")
        subsets, truth, info["truth_cpu_s"] = ground_truth(cache, dataset(info["n_train"]),
                                                           experiment(info["n_train"]), info["retrains"], say)
        rows = score(rows, subsets, truth)
        print(table(rows, info))
        if args.json:
            write_json(args.json, rows, info)
        return
    n_extra = max(args.trak_models) - 1 if "trak" in args.parts else 0
    if args.build_only:
        if not args.reverse:
            attributed(cache, data, exp)
            full_models(cache, data, exp, range(1, 1 + n_extra), say)
        ground_truth(cache, data, exp, args.retrains, say, reverse=args.reverse, share=True)
        return
    load0 = os.getloadavg()
    fitted, fit_cpu = attributed(cache, data, exp)
    t = min(args.test, len(data.y_test))
    common = [f"--train {args.train}", f"--test {t}", f"--retrains {args.retrains}"]
    rows = []
    if "gradlab" in args.parts:
        for r in gradlab_side(fitted, t, say, only=args.methods, damping_grid=args.damping if args.gradlab_damping else None,
                              settings=_settings(args.set)):
            rows.append(dataclasses.replace(r, command=" ".join([COMMAND, *common, "--parts gradlab --methods", r.method]
                                                                + ["--gradlab-damping --damping " + " ".join(
                                                                    f"{d:g}" for d in args.damping)] * (r.damping is not None)
                                                                + ["--set " + " ".join(args.set)] * bool(args.set))))
    port, extra_cpu = None, 0.0
    dattri_parts = [p for p in args.parts if p != "gradlab"]
    if dattri_parts and not dattri_available():
        print("torch or dattri is not importable (pip install -r requirements-bench.txt): gradlab's side only")
    elif dattri_parts:
        port = float(np.max(np.abs(outputs_of(fitted.model, data)[:t]
                                   - torch_outputs(fitted.model, data.x_test[:t], data.y_test[:t]))))
        say(f"torch port: max |Δ(−ℓ)| on the test points = {port:.1e}")
        extra, extra_cpu = full_models(cache, data, exp, range(1, 1 + n_extra), say)
        got = dattri_side(fitted, [fitted.model, *extra], t, say, proj_dim=args.proj_dim,
                          damping_grid=args.damping, batch=args.batch,
                          trak_sizes=args.trak_models if "trak" in args.parts else (),
                          ekfac=("ekfac" in args.parts), ekfac_batches=args.ekfac_batches or None,
                          ekfac_modules=args.ekfac_modules, trak_ridge=args.trak_ridge)
        for r in got:
            sel = (f"--parts trak --trak-models {r.method.split('-')[1]} --proj-dim {args.proj_dim} --batch {args.batch}"
                   + (f" --trak-ridge {args.trak_ridge:g}" if args.trak_ridge else "")
                   if r.method.startswith("trak") else
                   f"--parts ekfac --damping {' '.join(f'{d:g}' for d in args.damping)} "
                   f"--ekfac-batches {args.ekfac_batches} --ekfac-modules {' '.join(args.ekfac_modules)} "
                   f"--batch {args.batch}")
            rows.append(dataclasses.replace(r, command=" ".join([COMMAND, *common, sel])))
    load1 = os.getloadavg()
    info = dict(n_train=len(data.y_train), n_test=t, retrains=args.retrains, steps=exp.steps, fit_cpu_s=fit_cpu,
                truth_cpu_s=None, extra_models_cpu_s=extra_cpu, port=port, load=(load0, load1),
                command=" ".join([COMMAND, *common]))
    if args.save_rows:
        with open(args.save_rows, "wb") as f:
            pickle.dump({"rows": [vars(r) for r in rows], "info": info}, f)
    if args.score_only:
        return
    subsets, truth, info["truth_cpu_s"] = ground_truth(cache, data, exp, args.retrains, say)
    rows = score(rows, subsets, truth)
    print(table(rows, info))
    if args.json:
        write_json(args.json, rows, info)


def table(rows: list[Row], info: dict) -> str:
    """The Markdown table (docs/influence.md's): method, LDS ± SE, CPU-s, the command that reproduces the row."""
    out = [f"LDS on SimpleCNN (dattri's protocol): Fashion-MNIST subset, the first {info['n_train']:,} training images "
           f"({info['steps']} steps of 32), first {info['n_test']} test images, {info['retrains']} retrains on random "
           f"halves ({info['truth_cpu_s']:.0f} CPU-s); mean ± SE over test points. Load average "
           f"{info['load'][0][0]:.1f} at the start, {info['load'][1][0]:.1f} at the end.",
           "",
           "| side | method | LDS | SE | CPU-s | command | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        m, se = r.lds
        cell = lambda v, f: "—" if v is None or not np.isfinite(v) else format(v, f)
        out.append(f"| {r.side} | {r.label} | {cell(m, '.3f')} | {cell(se, '.3f')} | {cell(r.cpu_s, '.0f')} | "
                   f"`{r.command}` | {r.note} |")
    return "\n".join(out)


def write_json(path: str, rows: list[Row], info: dict) -> None:
    """The stored table the Influence page shows (schema in docs/influence.md)."""
    doc = {
        "schema": 1,
        "benchmark": "benchmarks/lds_cnn.py",
        "command": info["command"],
        "measured": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()}-core CPU shared with other work, load average {info['load'][0][0]:.1f} to "
                   f"{info['load'][1][0]:.1f}; cost = process CPU-seconds",
        "experiment": {"dataset": EXPERIMENT.dataset, "model": EXPERIMENT.model, "seed": EXPERIMENT.seed,
                       "n_train": info["n_train"], "steps": info["steps"], "n_test": info["n_test"],
                       "retrains": info["retrains"], "subset_fraction": 0.5, "output": "-loss"},
        "ground_truth_cpu_s": round(info["truth_cpu_s"], 1),
        "methods": [
            {"side": r.side, "method": r.method, "label": r.label,
             "lds": None if r.per_test is None else round(r.lds[0], 4),
             "se": None if r.per_test is None else round(r.lds[1], 4),
             "cpu_s": None if r.cpu_s is None else round(r.cpu_s, 1), "command": r.command, "note": r.note}
            for r in rows
        ],
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
