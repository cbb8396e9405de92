"""Export encodings for per-example results: CSV, NPZ and Parquet bytes, sizes, the full gradient matrix.

No Streamlit: the pages' download buttons (`gradlab.ui.widgets`) and the command line (`gradlab.cli`)
call these, and so can a notebook.
"""

from __future__ import annotations

import io
import zipfile

import jax
import numpy as np
import pandas as pd

from gradlab import engine, escape

#: Tables larger than this are not offered as a download (the reason is shown instead).
EXPORT_BUDGET_BYTES = 64 * 2**20


def _columns(table) -> dict:
    """A DataFrame or {name: array} as {column name: 1-D array}; 2-D arrays become name[0], name[1], …"""
    if isinstance(table, pd.DataFrame):
        return {str(c): table[c].to_numpy() for c in table.columns}
    cols = {}
    for name, values in table.items():
        a = np.asarray(values)
        if a.ndim <= 1:
            cols[str(name)] = a.reshape(-1)
        else:
            flat = a.reshape(a.shape[0], -1)
            cols.update({f"{name}[{j}]": flat[:, j] for j in range(flat.shape[1])})
    return cols


def export_bytes(table) -> int:
    """Bytes of the arrays in `table` (DataFrame or dict of arrays): what a download would hold."""
    if isinstance(table, pd.DataFrame):
        return int(table.memory_usage(index=False, deep=False).sum())
    return int(sum(np.asarray(v).nbytes for v in table.values()))


#: A text cell starting with one of these is a formula to a spreadsheet (CSV injection, OWASP).
FORMULA_STARTS = escape.FORMULA_STARTS

#: `escape.csv_cell`: a string that starts like a spreadsheet formula (`= + - @`, tab, CR) gets a leading `'`;
#: a plain number written as text (`-1`) and non-strings are returned as they are.
defuse = escape.csv_cell


def defused(table) -> pd.DataFrame:
    """`table` (a DataFrame or a dict of equally long arrays) as a new DataFrame whose text cells and column names a
    spreadsheet would not run as formulas (`escape.csv_cell`: a leading `'` on `=HYPERLINK(…)`, `+cmd`, `@SUM(…)`);
    numbers, and text that is a plain number (`-1`), stay as they are. What `to_csv` writes, and what a page's
    table shows (`ui.dataframe`: its toolbar downloads the cells as CSV)."""
    frame = table.copy() if isinstance(table, pd.DataFrame) else pd.DataFrame(_columns(table))
    frame = frame.rename(columns=lambda c: defuse(str(c)))
    for col in frame.columns:
        if frame[col].dtype == object or pd.api.types.is_string_dtype(frame[col]):
            frame[col] = frame[col].map(defuse)
    return frame


def to_csv(table) -> bytes:
    """CSV bytes of a DataFrame or a dict of equally long arrays (2-D arrays: one column per entry).

    Text cells and column names that a spreadsheet would run as formulas (a class or column name such as
    `=HYPERLINK(…)` from an uploaded CSV) are defused with a leading `'` (`defused`, `escape.csv_cell`); numbers
    stay numbers, and so does a class name that is a plain number (`-1`)."""
    return defused(table).to_csv(index=False).encode()


def to_npz(table) -> bytes:
    """Compressed NPZ bytes: one array per DataFrame column, or the dict's arrays with their shapes.

    Keys are the column names as they are (`np.load(...)["=x"]`), any name included: a CSV column called `file`
    or `allow_pickle` is a key like any other (`np.savez_compressed(buf, **arrays)` took them as its own arguments)."""
    if isinstance(table, pd.DataFrame):
        arrays = {}
        for c in table.columns:
            a = table[c].to_numpy()
            arrays[str(c)] = a.astype(str) if a.dtype == object else a
    else:
        arrays = {str(k): np.asarray(v) for k, v in table.items()}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:  # what np.savez_compressed writes
        for key, a in arrays.items():
            with z.open(key + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(a), allow_pickle=True)  # as np.savez_compressed
    return buf.getvalue()


def to_parquet(table) -> bytes:
    """Parquet bytes of a DataFrame or a dict of equally long arrays (2-D arrays: one column per entry)."""
    frame = table if isinstance(table, pd.DataFrame) else pd.DataFrame(_columns(table))
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()


def gradients_npz(fitted, checkpoint: int = -1) -> bytes:
    """NPZ bytes of the full per-example gradient matrix of a `Fitted` experiment at a checkpoint.

    **Returns** NPZ bytes with `grads (N, P) float32` (per-example gradients, leaves flattened in
    `engine.leaf_names` order), `labels (N,)`, `leaf_names (L,)`, `leaf_sizes (L,)`. Holds N × P × 4
    bytes: callers check `memory.per_example_grads_bytes` first.
    """
    model = fitted.run.checkpoints[checkpoint]
    g = engine.per_example_grads(fitted.loss_fn, model, fitted.data.x_train, fitted.data.y_train, chunk_size=256)
    buf = io.BytesIO()
    np.savez_compressed(buf, grads=np.asarray(engine.flatten_per_example(g)), labels=fitted.data.y_train,
                        leaf_names=np.array(engine.leaf_names(model)),
                        leaf_sizes=np.array([int(np.prod(a.shape[1:])) for a in jax.tree.leaves(g)]))
    return buf.getvalue()


def example_columns(data, idx, *, split: str = "train", features: int = 20) -> dict:
    """Columns that say which examples a per-example table is about, for a researcher to find them again.

    **Arguments** `data`: a `gradlab.data.Dataset`; `idx (n,)` int positions in its `split` (`"train"` or
    `"test"`); at most `features` feature columns (the first ones; digits' 64 pixels are not spelled out).

    **Returns** `{"example": idx, <data.row_label>: source rows, <feature name>: original (unstandardized)
    values, …}`, each `(n,)`: the uploaded CSV's line numbers, or the bundled set's index.
    """
    idx = np.asarray(idx, dtype=int)
    x = data.x_train if split == "train" else data.x_test
    rows = data.rows_train if split == "train" else data.rows_test
    cols = {"example": idx, data.row_label: (rows[idx] if rows is not None else idx)}
    if data.image_shape is None:
        raw = data.raw(x[idx])
        for j, name in enumerate(data.feature_names[:features]):
            cols[name if name not in cols else f"feature {name}"] = raw[:, j]
    return cols
