"""Seed 003's SimpleCNN on the bundled Fashion-MNIST subset: training time and test accuracy, a cold Gradient
norms page (the library calls it makes, in a fresh process), and DP-SGD at a target ε.

    python -m benchmarks.fashion_cnn                       # SimpleCNN's defaults (300 steps of 32, adam_warmup 0.005,
                                                           # epoch order, label smoothing 0.1) + norms page
    python -m benchmarks.fashion_cnn --steps 200 --batch 64 --optimizer adam
    python -m benchmarks.fashion_cnn --dp                  # also DP-SGD at ε = 3 (δ = 1e-5), RDP accountant, the DP page's start
    python -m benchmarks.fashion_cnn --seeds 0-4           # test accuracy of the recipe at each Experiment seed
    python -m benchmarks.fashion_cnn --seeds 0-4 --steps 500 --batch 16 --lr 0.0015   # another recipe, same seeds
    python -m benchmarks.fashion_cnn --seeds 0-9 --full-test   # also on all 10,000 test images (dataset-fashion-mnist)
    python -m benchmarks.fashion_cnn --seeds 0-9 --order random --label-smoothing 0 --ema 0.99   # recipe fields

Prints wall seconds and process CPU-seconds (both cores): on a shared machine the CPU-seconds are what to compare.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np

from gradlab import costs, losses, privacy
from gradlab.experiment import DP_SGD_DEFAULTS, Experiment, count_params, fit, forward_macs, init_model, load_data
from gradlab.summary import norm_summary, summary_size
from gradlab.train import train_dp_sgd


class Clock:
    """Wall and process CPU seconds since construction."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def __str__(self):
        return f"{time.perf_counter() - self.wall:.1f} s wall, {time.process_time() - self.cpu:.1f} CPU-s"


def accuracy(model, data) -> float:
    return float(np.mean(np.asarray(losses.predict(model, data.x_test, "classification")) == data.y_test))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = Experiment.for_model("simple_cnn")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--optimizer", default=d.optimizer)
    p.add_argument("--l2", type=float, default=d.l2)
    p.add_argument("--order", default=None, help="minibatch order: random | epoch (default: the recipe's)")
    p.add_argument("--ema", type=float, default=None, help="moving-average decay of the parameters, 0 = off "
                                                          "(default: the recipe's)")
    p.add_argument("--label-smoothing", type=float, default=None, help="ε of the training loss's label smoothing "
                                                                       "(default: the recipe's)")
    p.add_argument("--full-test", action="store_true", help="with --seeds: also the accuracy on all 10,000 test "
                                                            "images of Debian's dataset-fashion-mnist")
    p.add_argument("--seeds", help="a range 'a-b' or a list 'a,b,c' of Experiment seeds (initialization and minibatch "
                                   "order): train the recipe at each through `fit`, print test accuracy and CPU-s; "
                                   "nothing else runs")
    p.add_argument("--dp", action="store_true", help="also run DP-SGD at --eps")
    p.add_argument("--dp-only", action="store_true", help="DP-SGD only (no non-private training, no norms)")
    p.add_argument("--eps", type=float, default=3.0)
    dp = DP_SGD_DEFAULTS["simple_cnn"]  # where the DP clipping page starts SimpleCNN
    p.add_argument("--dp-batch", type=int, default=dp["expected_batch"], help="expected DP-SGD batch qN")
    p.add_argument("--dp-steps", type=int, default=dp["steps"])
    p.add_argument("--dp-lr", type=float, default=dp["lr"])
    p.add_argument("--clip", type=float, default=1.0)
    a = p.parse_args(argv)

    if a.seeds:
        return seeds(a)
    if a.dp_only:
        exp = Experiment(dataset="fashion", model="simple_cnn")
        return dp_sgd(exp, load_data(exp), a)
    page = Clock()
    exp = Experiment.for_model("simple_cnn").replace(dataset="fashion", steps=a.steps, batch_size=a.batch, lr=a.lr,
                                                     optimizer=a.optimizer)
    data = load_data(exp)
    n_params, macs = count_params(exp, data), forward_macs(exp, data)
    est = costs.training_seconds(n_params, exp.steps, exp.batch_size, macs)
    clock = Clock()
    fitted = fit(exp, data)
    print(f"train {exp.steps} steps × {exp.batch_size} ({exp.optimizer} {exp.lr:g}), P = {n_params:,}, {macs:,} MACs: {clock} "
          f"(estimate {est:.0f} CPU-s); test accuracy {accuracy(fitted.model, data):.3f}", flush=True)
    size = summary_size(len(data.y_train), n_params, macs, est)
    clock = Clock()
    s = norm_summary(fitted, size=size)
    print(f"norm summary over {len(s.norms):,} of N = {len(data.y_train):,} (the page's size; cold, compile included): "
          f"{clock} (estimate {costs.summary_seconds(n_params, size, macs):.0f} CPU-s); median ‖g‖ {np.median(s.norms):.3g}")
    print(f"Gradient norms page's computations from a fresh process (data, train, norms): {page}; "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB", flush=True)

    if a.dp:
        dp_sgd(exp, data, a)


def parse_seeds(text: str) -> list[int]:
    """`"0-4"` → [0, 1, 2, 3, 4]; `"0,2,7"` → [0, 2, 7]."""
    if "-" in text:
        lo, hi = map(int, text.split("-"))
        return list(range(lo, hi + 1))
    return [int(s) for s in text.split(",")]


def full_test_set(data):
    """All 10,000 Fashion-MNIST test images from Debian's `dataset-fashion-mnist`, standardized as `data`'s (the
    training pixels' mean and std): `(x (10000, 784) float32, y (10000,) int32)`. **Raises** FileNotFoundError
    without the package."""
    from scripts.make_fashion_subset import SOURCE, read_idx
    x = read_idx(SOURCE / "t10k-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float64)
    y = read_idx(SOURCE / "t10k-labels-idx1-ubyte.gz").astype(np.int32)
    return ((x - data.x_mean) / data.x_std).astype(np.float32), y


def seeds(a):
    """The recipe at each seed through the app's own path (`fit` on the Experiment): test accuracy on the subset's 1,000 test images (and with --full-test on
    all 10,000) and the training's CPU-seconds (the first seed's include compiling, unless the XLA cache has it)."""
    base = Experiment.for_model("simple_cnn").replace(dataset="fashion", steps=a.steps, batch_size=a.batch, lr=a.lr,
                                                      optimizer=a.optimizer, l2=a.l2)
    base = base.replace(**{k: v for k, v in (("order", a.order), ("ema", a.ema), ("label_smoothing", a.label_smoothing))
                           if v is not None})
    print(f"{base.steps} steps × {base.batch_size}, {base.optimizer} {base.lr:g}, l2 {base.l2:g}, order {base.order}, "
          f"ema {base.ema:g}, label smoothing {base.label_smoothing:g}:", flush=True)
    accs, fulls, cpus = [], [], []
    full = None
    for s in parse_seeds(a.seeds):
        exp = base.replace(seed=s)
        data = load_data(exp)
        cpu = time.process_time()
        model = fit(exp, data).model
        cpus.append(time.process_time() - cpu)
        accs.append(accuracy(model, data))
        line = f"  seed {s}: test accuracy {accs[-1]:.3f}"
        if a.full_test:
            full = full if full is not None else full_test_set(data)
            fulls.append(float(np.mean(np.asarray(losses.predict(model, full[0], "classification")) == full[1])))
            line += f", on all 10,000 test images {fulls[-1]:.4f}"
        print(line + f", training {cpus[-1]:.1f} CPU-s", flush=True)
    print(f"  mean {np.mean(accs):.4f}, min {min(accs):.3f}, max {max(accs):.3f}"
          + (f"; 10,000 test images: mean {np.mean(fulls):.4f}, min {min(fulls):.4f}, max {max(fulls):.4f}" if fulls else "")
          + f"; training CPU-s median {np.median(cpus):.1f}; load average {os.getloadavg()[0]:.1f}", flush=True)
    return accs


def dp_sgd(exp, data, a):
    """DP-SGD from the untrained SimpleCNN, σ calibrated (RDP) to spend `a.eps` at δ = 1e-5."""
    n = len(data.y_train)
    q = a.dp_batch / n
    sigma = privacy.noise_multiplier_for_epsilon(target_epsilon=a.eps, sample_rate=q, steps=a.dp_steps, delta=1e-5)
    clock = Clock()
    r = train_dp_sgd(init_model(exp, data), losses.cross_entropy, data.x_train, data.y_train, sample_rate=q,
                     noise_multiplier=sigma, clip_norm=a.clip, optimizer="adam", lr=a.dp_lr, steps=a.dp_steps,
                     seed=0, checkpoint_every=a.dp_steps, delta=1e-5)
    print(f"DP-SGD q = {q:.4f} (qN = {a.dp_batch}), T = {a.dp_steps}, C = {a.clip}, σ = {sigma:.3f}: "
          f"ε = {r.epsilons[-1]:.4f} (δ = 1e-5); test accuracy {accuracy(r.final, data):.3f}; {clock}", flush=True)


if __name__ == "__main__":
    main()
