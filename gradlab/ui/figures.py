"""Figures built once for every session: `gradlab.plots` and `gradlab.audit_plots` memoized on their arguments.

Building a Plotly figure (every property validated) is most of a warm page run: 0.29 s of the 0.41 s a
Geometry lecture step takes. A room of 30 students on one step built the same figure 30 times, one after
another under the GIL; now the first session builds it and the others reuse the object. Views pass figures
straight to `ui.chart` and never change them, so one object can serve every session.

Pages import `from gradlab.ui.figures import plots` (or `audit_plots`) and call it as the library module.
Arguments are keyed by value (arrays by dtype, shape and bytes); a call with an argument that has no value
key (a function, an object) is built as before, unshared.

The library's builders take their `plots.Style` as an argument; here it is this session's: presenter mode
(`set_presenter`, once per run) and a half-width column (`half_column`, a block), passed to every builder a page
calls unless the page passes its own, and so part of the key.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import threading

import numpy as np

from gradlab import audit_plots as _audit_plots
from gradlab import plots as _plots

#: Figures kept (least recently used go first): a page's figures hold at most a few thousand points each. The lecture's
#: 13 steps draw 44 figures in each style (a screen's and a projector's), and the room's warm-up builds both before the
#: lecturer reaches a step: the memo holds those 88 (10.2 MB with their dicts, ~0.12 MB each) and 40 more for the pages
#: visited beside the lecture.
KEEP = 128


class _Unkeyable(Exception):
    pass


def _feed(h, value) -> None:
    """Feed `value` into the hash `h`, tagged by type; **raises** `_Unkeyable` for a value with no value key."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        h.update(f"{type(value).__name__}:{value!r};".encode())
    elif isinstance(value, (np.ndarray, np.generic)) or type(value).__module__.startswith("jax"):
        try:
            a = np.ascontiguousarray(np.asarray(value))
        except TypeError:  # a typed PRNG key array has no NumPy view
            raise _Unkeyable from None
        if a.dtype == object:
            raise _Unkeyable
        h.update(f"array:{a.dtype.str}:{a.shape};".encode())
        h.update(a.tobytes())
    elif isinstance(value, _plots.Style):
        h.update(f"{value!r};".encode())
    elif isinstance(value, (tuple, list)):
        h.update(f"{type(value).__name__}:{len(value)}(".encode())
        for v in value:
            _feed(h, v)
        h.update(b")")
    elif isinstance(value, dict):
        h.update(f"dict:{len(value)}(".encode())
        for k, v in value.items():
            _feed(h, k)
            _feed(h, v)
        h.update(b")")
    else:
        raise _Unkeyable


class _Figures:
    """Least-recently-used figures by key, shared by every session (thread-safe)."""

    def __init__(self, keep: int):
        self.keep = keep
        self._items: collections.OrderedDict = collections.OrderedDict()
        self._specs: dict[int, dict] = {}  # id of a held figure -> its `to_dict()`, made at its first drawing
        self._lock = threading.Lock()

    def get(self, key: str, build):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        fig = build()  # outside the lock: another session's figure need not wait for this one
        with self._lock:
            self._items[key] = fig
            while len(self._items) > self.keep:
                _, old = self._items.popitem(last=False)
                self._specs.pop(id(old), None)
        return fig

    def spec(self, fig) -> dict | None:
        """`fig.to_dict()` for a figure this memo holds, made once (`None` for any other figure).

        `st.plotly_chart` turns its figure into a dict on every run (every array walked and base64-encoded): 20 ms of
        each of a room's 30 followers' runs on the DP clipping step, one after another under the GIL (py-spy,
        `benchmarks/crowd.py` scenario 5). A held figure never changes (views pass it straight to `ui.chart`), so
        its dict is made at its first drawing and reused."""
        with self._lock:
            if id(fig) in self._specs:
                return self._specs[id(fig)]
            if not any(held is fig for held in self._items.values()):
                return None
        spec = fig.to_dict()  # outside the lock; two sessions making the same dict at once keep the same value
        with self._lock:
            if any(held is fig for held in self._items.values()):
                self._specs[id(fig)] = spec
        return spec

    def clear(self) -> None:
        """Drop every figure; each is rebuilt on its next use. (The gate's relief no longer calls it: the figures
        hold about 1 MB, `ui.cache._relieve`.)"""
        with self._lock:
            self._items.clear()
            self._specs.clear()


FIGURES = _Figures(KEEP)


_SESSION = threading.local()  # Streamlit runs each session's script in its own thread


def style() -> _plots.Style:
    """This session's figure style: presenter mode as set for this run, a half column inside `half_column`."""
    return getattr(_SESSION, "style", _plots.NORMAL)


def set_presenter(on: bool) -> None:
    """Presenter mode for the figures this session's run builds from now on (`lecture.frame`, once per run)."""
    _SESSION.style = dataclasses.replace(style(), presenter=bool(on))


@contextlib.contextmanager
def half_column():
    """Figures built inside this block are for a column of at most half the page (`plots.Style.half`)."""
    before = style()
    _SESSION.style = dataclasses.replace(before, half=True)
    try:
        yield
    finally:
        _SESSION.style = before


def _shared(fn):
    @functools.wraps(fn)
    def build(*args, **kwargs):
        kwargs.setdefault("style", style())  # a figure's style is an argument like any other: part of the key
        h = hashlib.blake2b(f"{fn.__module__}.{fn.__qualname__};".encode(), digest_size=20)
        try:
            _feed(h, args)
            _feed(h, sorted(kwargs.items()))
        except _Unkeyable:
            return fn(*args, **kwargs)
        return FIGURES.get(h.hexdigest(), lambda: fn(*args, **kwargs))

    return build


class _Module:
    """A plotting module whose figure builders (marked by `plots.figure`) are shared; other names pass through."""

    def __init__(self, module):
        self._module = module

    @functools.cache  # noqa: B019 - two module-lifetime instances
    def __getattr__(self, name: str):
        value = getattr(self._module, name)
        return _shared(value) if getattr(value, "builds_figure", False) else value


plots = _Module(_plots)
audit_plots = _Module(_audit_plots)
