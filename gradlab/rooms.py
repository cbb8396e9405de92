"""Lecture rooms: the step a lecturer is on, read by every student's browser that follows the room.

A room has a short public code (what students' links carry) and a secret speaker key (what the lecturer's
speaker link carries): anyone may read a room's step, only the speaker key moves it. Rooms live in a small
`diskcache` beside the results store, so every server process sharing that directory (two servers behind a
load balancer) sees the same step; they expire after `ROOM_HOURS` without a move.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import time

import diskcache

from gradlab.store import default_directory

ROOM_HOURS = 12.0
_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i: read aloud and typed from a projector


@dataclasses.dataclass(frozen=True)
class Room:
    """A room's state: `code` (public), `step` (1-based), `opened` and `moved` (Unix seconds)."""

    code: str
    step: int
    opened: float
    moved: float


class Rooms:
    """Rooms by code, kept in `directory` (shared across processes) or in memory when `directory` is None."""

    def __init__(self, directory: str | None):
        self._cache = diskcache.Cache(directory) if directory else None
        self._memory: dict[str, tuple] = {}

    def _get(self, code: str):
        return self._cache.get(code) if self._cache is not None else self._memory.get(code)

    def _set(self, code: str, value) -> None:
        if self._cache is not None:
            self._cache.set(code, value, expire=ROOM_HOURS * 3600)
        else:
            self._memory[code] = value

    def open(self, step: int = 1) -> tuple[str, str]:
        """A new room on `step`. **Returns** `(code, speaker_key)`: 5 readable characters, 16 hex digits."""
        code = "".join(secrets.choice(_ALPHABET) for _ in range(5))
        key = secrets.token_hex(8)
        now = time.time()
        self._set(code, (key, int(step), now, now))
        return code, key

    def get(self, code: str) -> Room | None:
        """The room `code`, or None when there is none (unknown, expired)."""
        value = self._get(str(code)) if code else None
        if value is None:
            return None
        _, step, opened, moved = value
        return Room(str(code), int(step), float(opened), float(moved))

    def check(self, code: str, key: str) -> bool:
        """Whether `key` is room `code`'s speaker key."""
        value = self._get(str(code)) if code else None
        return value is not None and bool(key) and secrets.compare_digest(str(key), value[0])

    def move(self, code: str, key: str, step: int) -> bool:
        """Put room `code` on `step` when `key` is its speaker key. **Returns** whether it moved."""
        if not self.check(code, key):
            return False
        value = self._get(str(code))
        if value[1] != int(step):
            self._set(code, (value[0], int(step), value[2], time.time()))
        return True


def default_rooms() -> Rooms:
    """The rooms in the results store's directory (`GRADLAB_STORE_DIR`), in memory if it is unwritable."""
    try:
        directory = os.path.join(default_directory(), "rooms")
        os.makedirs(directory, exist_ok=True)
        return Rooms(directory)
    except OSError:
        return Rooms(None)
