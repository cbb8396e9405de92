"""The one table of layer kinds (`KINDS`): the walker in `core` tries them in this order on every equation
that uses a leaf. Adding a kind is one new file (a `base.RuleKind` subclass) plus one line here (or a call to
`register` from the code that defines it: a plug-in, a test)."""

from __future__ import annotations

import contextlib

from gradlab.rules.base import RuleKind
from gradlab.rules.conv import CONV
from gradlab.rules.dense import DENSE
from gradlab.rules.elementwise import ADDED, SCALE
from gradlab.rules.embedding import EMBEDDING
from gradlab.rules.structured import PRODUCT, SCALED

KINDS: list[RuleKind] = [
    ADDED,
    SCALE,
    DENSE,
    CONV,
    EMBEDDING,
]

#: Closed forms for the norms of weights computed from parameters (`structured.py`), tried in this order.
STRUCTURES: list = [
    PRODUCT,
    SCALED,
]


def register(kind: RuleKind) -> RuleKind:
    """Add `kind` to `KINDS` (once; tried after the built-in kinds). **Returns** it, so a module may write
    `MY_KIND = register(MyKind())`."""
    if kind not in KINDS:
        KINDS.append(kind)
    return kind


def unregister(kind: RuleKind) -> None:
    """Take `kind` out of `KINDS` (a test's clean-up)."""
    if kind in KINDS:
        KINDS.remove(kind)


@contextlib.contextmanager
def without(*names: str):
    """The kinds named `names` switched off inside the block (a benchmark's with/without comparison)."""
    saved = list(KINDS)
    KINDS[:] = [k for k in KINDS if k.name not in names]
    try:
        yield
    finally:
        KINDS[:] = saved


def ops() -> frozenset:
    """Every primitive some registered kind matches."""
    return frozenset().union(*(k.prims for k in KINDS))


def for_prim(name: str) -> list:
    """The registered kinds that may match an equation of primitive `name`, in table order."""
    return [k for k in KINDS if name in k.prims]
