"""Make the Fashion-MNIST subset that ships with gradlab, reproducibly, from Debian's `dataset-fashion-mnist`.

    apt-get install dataset-fashion-mnist
    python scripts/make_fashion_subset.py                 # writes gradlab/data/fashion_mnist_subset.npz
    python scripts/make_fashion_subset.py --out DIR       # anywhere else (the reproducibility test does this)

A stratified sample with a fixed seed: 600 images of each of the 10 classes from the 60,000 training
images and 100 of each from the 10,000 test images (uint8, 28×28), in the order of their original
index. Written as a compressed NPZ (what `np.savez_compressed` writes, with fixed timestamps in the ZIP
entries so a re-run gives the same bytes; `np.load` reads it).

Arrays: `x_train (6000, 28, 28) uint8`, `y_train (6000,) uint8`, `index_train (6000,) int32` (position
in `train-images-idx3-ubyte`), and `x_test`, `y_test`, `index_test` (1000 rows, position in `t10k-…`).
"""

from __future__ import annotations

import argparse
import gzip
import io
import zipfile
from pathlib import Path

import numpy as np

SOURCE = Path("/usr/share/datasets/fashion-mnist")
OUT = Path(__file__).resolve().parents[1] / "gradlab" / "data"
FILENAME = "fashion_mnist_subset.npz"
SEED = 0
PER_CLASS = {"train": 600, "t10k": 100}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped): big-endian header `0, 0, dtype code, ndim`, then ndim uint32 sizes, then uint8 data."""
    raw = gzip.decompress(path.read_bytes())
    zero, code, ndim = int.from_bytes(raw[:2], "big"), raw[2], raw[3]
    if zero != 0 or code != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (magic {raw[:4].hex()})")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def stratified(labels: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    """`per_class` indices of each class drawn without replacement, sorted (the original order)."""
    picks = [rng.choice(np.flatnonzero(labels == c), per_class, replace=False) for c in np.unique(labels)]
    return np.sort(np.concatenate(picks)).astype(np.int32)


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """`np.savez_compressed` with a fixed ZIP timestamp (numpy stamps each entry with the current time)."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
            zf.writestr(info, buf.getvalue(), compresslevel=9)


def make_subset(source: Path = SOURCE, seed: int = SEED) -> dict[str, np.ndarray]:
    """The subset's arrays (see the module docstring). **Raises** FileNotFoundError without the Debian package."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, name in (("train", "train"), ("t10k", "test")):
        images = read_idx(source / f"{split}-images-idx3-ubyte.gz")
        labels = read_idx(source / f"{split}-labels-idx1-ubyte.gz")
        idx = stratified(labels, PER_CLASS[split], rng)
        arrays |= {f"x_{name}": images[idx], f"y_{name}": labels[idx], f"index_{name}": idx}
    return arrays


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=SOURCE, help="folder of the IDX files (Debian's package)")
    parser.add_argument("--out", type=Path, default=OUT, help="folder to write the NPZ into")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / FILENAME
    save_npz(path, make_subset(args.source))
    print(f"wrote {path} ({path.stat().st_size / 2**20:.2f} MB)")
    return path


if __name__ == "__main__":
    main()
