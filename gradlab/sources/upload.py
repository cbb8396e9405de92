"""An uploaded CSV (`dataset="upload:<16 hex>"`, the hash of its bytes, label column and task: `upload_name`).

The bytes are never in the config or the URL: a session supplies them (`load(exp, upload)`), and the pages ask
for them only from the session that uploaded them (`gradlab.ui.upload.require_upload`). Results computed from an
upload stay in the server's memory (`persist = False`). The parsed table is kept per bytes (`table`, bounded):
the sidebar reads its columns and validates it, the pages split it, and the CSV is parsed once.
"""

from __future__ import annotations

import functools
import hashlib

import pandas as pd

from gradlab import data as data_mod
from gradlab.sources.base import Source

#: The sidebar's dataset choice for "your own data"; the experiment then names the upload by hash.
UPLOAD = "upload"
#: Parsed uploads kept (each at most `data.CSV_MAX_ROWS` × `CSV_MAX_FEATURES + 1` cells, about 8 MB).
TABLES_KEPT = 4


def upload_name(raw: bytes, label: str, task: str) -> str:
    """The `dataset` name of an uploaded CSV: `"upload:"` + 16 hex digits of SHA-256 over its bytes,
    label column and task. Different bytes, label or task give a different name (and cache key)."""
    digest = hashlib.sha256(raw + b"\0" + label.encode() + b"\0" + task.encode()).hexdigest()[:16]
    return f"{UPLOAD}:{digest}"


def table(raw: bytes) -> pd.DataFrame:
    """The upload `raw` parsed (`data.read_csv`, with the upload limits), once per bytes among the last
    `TABLES_KEPT`. Do not modify the returned frame. **Raises** `DataError` as `read_csv` does."""
    return _table(hashlib.sha256(raw).hexdigest(), raw)


@functools.lru_cache(maxsize=TABLES_KEPT)
def _table(digest: str, raw: bytes) -> pd.DataFrame:  # `digest` keys it: hashing 1 MB of bytes per call is avoided
    return data_mod.read_csv(raw)


class Upload(Source):
    """A session's uploaded CSV: numeric features and one label column (`data.load_csv`); rows are CSV lines."""

    label = "Your own data (CSV upload)"
    persist = False
    needs_upload = True

    def load(self, exp, upload=None):
        if upload is None:
            raise data_mod.DataError("This experiment uses an uploaded CSV: upload it again in the sidebar")
        return data_mod.load_csv(table(upload["bytes"]), upload["label"], upload["task"], seed=exp.seed,
                                 label_noise=exp.label_noise, test_fraction=exp.test_fraction)
