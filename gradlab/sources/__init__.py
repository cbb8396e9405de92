"""Data sources: the registry (`SOURCES`, one table keyed by prefix) and `source_of(dataset)`.

`Experiment.dataset` stays a string (the URL's and the config's value, hashable); its prefix, up to the first
`:`, picks the source here, and nothing outside this table compares a prefix. The sources and their files:

- `bundled.py`: the datasets of `gradlab.data.DATASETS` (`"digits"`, `"fashion"`, …);
- `wine.py`: scikit-learn's wine set, the example of how to add a source (docs/extending.md);
- `upload.py`: an uploaded CSV, `"upload:<hash>"`;
- `served.py`: the model the server was started with, `"own:<fingerprint>"`.

The protocol is `base.Source`. Loading is cached where the work is: the served model once per process
(`gradlab.own`), an upload's parse once per bytes (`upload.table`), and each loaded `Dataset` once per
`data_key` in the results store's memory tier (`gradlab.ui.cache.data`, bounded by bytes).
"""

from __future__ import annotations

import functools

from gradlab import own
from gradlab.data import DATASETS
from gradlab.sources.base import DATA_FIELDS, Source
from gradlab.sources.bundled import Bundled
from gradlab.sources.served import Served
from gradlab.sources.upload import UPLOAD, Upload, upload_name
from gradlab.sources.wine import Wine

__all__ = ["SOURCES", "Source", "source_of", "choices", "data_key", "DATA_FIELDS", "UPLOAD", "OWN", "upload_name"]

OWN = own.OWN

#: prefix -> Source class; the sidebar offers the choices in this order (the served model first, and so the default).
SOURCES: dict[str, type[Source]] = {
    OWN: Served,
    **dict.fromkeys(DATASETS, Bundled),
    "wine": Wine,
    UPLOAD: Upload,
}


@functools.lru_cache(maxsize=256)
def source_of(dataset: str) -> Source:
    """The `Source` of an experiment's `dataset` string (`"digits"`, `"upload:3fa9…"`, `"own:1c0e…"`), by its
    prefix. Never raises: an unknown name is a `Bundled` source whose `load` raises `DataError` naming the choices
    (so a link with a bad name opens, and says why)."""
    return SOURCES.get(dataset.split(":", 1)[0], Bundled)(dataset)


def choices() -> list[str]:
    """The sidebar's dataset choices, in `SOURCES` order."""
    return [c for prefix, cls in SOURCES.items() for c in cls.choices(prefix)]


def data_key(exp):
    """`exp` with every field but `DATA_FIELDS` at its default: equal for experiments whose data are equal."""
    return type(exp)(**{f: getattr(exp, f) for f in DATA_FIELDS})
