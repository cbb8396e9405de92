"""Rule coverage: which leaves of user-written models take a per-layer rule, and why the others fall back.

    python -m benchmarks.rule_coverage     # one row per model, then the total and the fallback reasons

The models are the engine's test zoo (tests/test_engine_zoo.py: dict params, lax calls, Equinox, an LSTM and a
GRU by lax.scan, BatchNorm, dropout, cond/switch, custom_vjp, checkpoint) and its low-precision models
(tests/test_engine_precision.py). A *weight-like* leaf is a differentiable leaf with at least one axis (Python
floats and 0-d scalars excluded). Only tracing runs (`engine.explain`), nothing is compiled.
"""

from __future__ import annotations

import collections
import importlib.util
import pathlib
import sys

from gradlab import engine

TESTS = pathlib.Path(__file__).resolve().parent.parent / "tests"


def _module(name: str):
    """A test module by path (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, TESTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def zoo() -> list:
    """`(name, make)` for every model of the two test files; `make()` returns (loss, params, xs, ys, …)."""
    return [(f.__name__, f) for f in _module("test_engine_zoo").ZOO + _module("test_engine_precision").MODELS]


def coverage(models) -> tuple[list, collections.Counter]:
    """Per model `(name, ruled, weight-like)`, and a count of the fallback reasons over all models."""
    rows, reasons = [], collections.Counter()
    for name, make in models:
        loss, params, xs, ys = make()[:4]
        weight_like = [r for r in engine.explain(loss, params, xs, ys) if len(r["shape"]) >= 1]
        ruled = [r for r in weight_like if r["path"] == "rule"]
        for r in weight_like:
            if r["path"] != "rule":
                reasons[r["why"].split(":")[0].split(" (")[0]] += 1
        rows.append((name, len(ruled), len(weight_like)))
    return rows, reasons


def main() -> None:
    rows, reasons = coverage(zoo())
    print(f"{'model':28s} {'ruled':>5s} / {'weight-like':<11s}")
    for name, ruled, total in rows:
        print(f"{name:28s} {ruled:5d} / {total:<11d}")
    ruled, total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"\ncoverage: {ruled} of {total} weight-like leaves take a rule ({100 * ruled / total:.0f}%)")
    print("\nfallback reasons:")
    for why, count in reasons.most_common():
        print(f"  {count:3d}  {why}")


if __name__ == "__main__":
    main()
