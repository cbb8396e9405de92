"""Make the MNIST-1D set that ships with gradlab, reproducibly, with the `mnist1d` package's generator (never its
downloading loader), in a script-only environment (mnist1d imports matplotlib; gradlab does not need it):

    python3 -m venv /tmp/m1d && /tmp/m1d/bin/pip install mnist1d==0.0.2.post1
    /tmp/m1d/bin/python scripts/make_mnist1d.py             # writes gradlab/data/mnist1d.npz
    /tmp/m1d/bin/python scripts/make_mnist1d.py --out DIR   # anywhere else (the reproducibility test does this)

`mnist1d.data.make_dataset` with the package's default arguments (`get_dataset_args()`: 5,000 examples from its
10 built-in digit templates, padded, scaled, sheared, translated, noised, 40 samples each; seed 42; the first
4,000 for training). Arrays: `x_train (4000, 40) float32`, `y_train (4000,) uint8`, `x_test (1000, 40)`,
`y_test (1000,)`, and `t (40,)` (the signal's sample positions), written with fixed ZIP timestamps.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from make_fashion_subset import OUT, save_npz  # noqa: E402 (the script's folder is on sys.path)

FILENAME = "mnist1d.npz"


def make_arrays() -> dict[str, np.ndarray]:
    """MNIST-1D from mnist1d's templates with its default arguments (see the module docstring)."""
    from mnist1d.data import get_dataset_args, make_dataset

    d = make_dataset(get_dataset_args())
    return {"x_train": d["x"].astype(np.float32), "y_train": d["y"].astype(np.uint8),
            "x_test": d["x_test"].astype(np.float32), "y_test": d["y_test"].astype(np.uint8),
            "t": np.asarray(d["t"], np.float32)}


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder to write the NPZ into")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / FILENAME
    save_npz(path, make_arrays())
    print(f"wrote {path} ({path.stat().st_size / 2**20:.2f} MB)")
    return path


if __name__ == "__main__":
    main()
