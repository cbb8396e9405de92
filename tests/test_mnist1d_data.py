"""The bundled MNIST-1D set: small, loaded with its own split and row names, and (where the script-only `mnist1d`
package is installed) made bit for bit by its script from mnist1d's generator."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradlab import data

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "gradlab" / "data" / data.MNIST1D_FILE


def test_shipped_mnist1d_is_small_and_loads_with_its_own_split():
    assert SHIPPED.stat().st_size <= 2**20
    total = sum(p.stat().st_size for p in SHIPPED.parent.glob("*.npz"))
    assert total <= 10 * 2**20  # the limit on shipped data
    d = data.load_dataset("mnist1d", test_fraction=0.5)  # its own split: the fraction is unused
    assert d.x_train.shape == (4000, 40) and d.x_test.shape == (1000, 40) and d.n_classes == 10
    assert d.row(0, "test") == 4000 and sorted(d.rows_train.tolist()) == list(range(4000))
    raw = np.load(SHIPPED)
    at = int(np.flatnonzero(d.rows_train == 17)[0])
    np.testing.assert_allclose(d.raw(d.x_train[at]), raw["x_train"][17], atol=1e-4)  # row 17 is the file's row 17
    assert d.y_train[at] == raw["y_train"][17]
    np.testing.assert_allclose(d.x_train.mean(0), 0, atol=1e-4)


@pytest.mark.skipif(importlib.util.find_spec("mnist1d") is None,
                    reason="mnist1d is script-only (scripts/make_mnist1d.py says how to install it)")
def test_script_reproduces_the_shipped_file_bit_for_bit(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_mnist1d.py"), "--out", str(tmp_path)], check=True)
    assert (tmp_path / data.MNIST1D_FILE).read_bytes() == SHIPPED.read_bytes()
