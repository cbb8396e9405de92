"""Measure DP-SGD on digits: test accuracy at a target (ε, δ), for the page's preset and a small sweep.

    python -m benchmarks.dp_digits_preset            # the preset only
    python -m benchmarks.dp_digits_preset --sweep    # a small sweep of models / batch sizes / steps

σ is calibrated with dp-accounting (RDP) so that the whole run spends at most the target ε at
δ = 1e-5; ε is then reported with both the RDP and the PLD accountant.
"""

from __future__ import annotations

import argparse
import time

import jax

from gradlab import data as data_mod
from gradlab import losses, privacy
from gradlab.models import ModelSpec, build_model
from gradlab.train import train_dp_sgd


def run(model="mlp", width=32, activation="tanh", batch=256, steps=400, eps=3.0, clip=1.0, opt="adam", lr=0.01,
        seed=0, delta=1e-5, data=None):
    data = data or data_mod.load_dataset("digits")
    n = data.x_train.shape[0]
    q = batch / n
    sigma = privacy.noise_multiplier_for_epsilon(target_epsilon=eps, sample_rate=q, steps=steps, delta=delta)
    m = build_model(ModelSpec(model, width, 1, activation), data.n_features, data.n_classes, key=jax.random.key(seed))
    t = time.time()
    r = train_dp_sgd(m, losses.cross_entropy, data.x_train, data.y_train, sample_rate=q, noise_multiplier=sigma,
                     clip_norm=clip, optimizer=opt, lr=lr, steps=steps, seed=seed, checkpoint_every=steps,
                     delta=delta)
    acc, _ = privacy.accuracy_by_class(r.final, data.x_test, data.y_test, data.n_classes)
    pld = privacy.dp_sgd_epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=delta, accountant="pld")
    print(f"{model:6s} w={width:3d} {activation:5s} B={batch:4d} T={steps:4d} C={clip:5.2f} {opt} lr={lr:g} seed={seed} "
          f"σ={sigma:.3f}  ε_rdp={r.epsilons[-1]:.3f} ε_pld={pld:.3f}  test acc={acc:.4f}  ({time.time() - t:.0f}s)",
          flush=True)
    return acc


PRESET = dict(model="linear", width=1, activation="relu", batch=512, steps=200, eps=3.0, clip=0.5, opt="adam", lr=0.02)

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--alt", action="store_true", help="the B=256 variant of the preset")
    ap.add_argument("--eps", type=float, default=3.0, help="target ε (the goal is ≤ 3)")
    a = ap.parse_args()
    PRESET.update(eps=a.eps)
    if a.alt:
        PRESET.update(batch=256)
    d = data_mod.load_dataset("digits")
    if a.sweep:
        for model, width, act in [("linear", 0, "relu"), ("mlp", 32, "tanh"), ("mlp", 64, "tanh")]:
            for batch, steps in [(256, 200), (256, 400), (512, 200)]:
                for clip, lr in [(1.0, 0.01), (0.5, 0.02)]:
                    run(model, max(width, 1), act, batch, steps, 3.0, clip, "adam", lr, 0, data=d)
    else:
        accs = [run(**PRESET, seed=s, data=d) for s in range(a.seeds)]
        print(f"preset mean test accuracy over {len(accs)} seeds: {sum(accs) / len(accs):.4f}")
