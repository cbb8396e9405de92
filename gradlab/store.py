"""Shared work for a server full of visitors: a results store and a gate for heavy computations.

One process serves a whole lecture hall, so two things are shared by every session:

- `Store`: results in memory, evicted least recently used **by bytes** under one budget, and on disk
  (`diskcache`, bounded, safe across threads and processes) so a restarted server, or a second server
  behind a load balancer, answers from disk instead of computing again.
- `Gate`: at most `slots` heavy computations at a time, admitted only while the process's memory plus
  the computation's estimate stays under a budget; identical requests join the running computation
  (single flight); waiting requests know their place in the queue and an estimated wait.

Nothing here imports Streamlit: `gradlab.ui.cache` draws the queue and the progress.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import logging
import os
import pickle
import statistics
import threading
import time
from typing import Any, Callable

import diskcache
import filelock
import numpy as np

log = logging.getLogger("gradlab")

MB = 2**20
_MISSING = object()


def nbytes(value: Any) -> int:
    """Approximate memory held by `value` in bytes: array buffers plus a small overhead per object.

    Walks dicts, lists, tuples, dataclasses and pytrees (Equinox modules); arrays count their
    `nbytes`. Used to evict by bytes, not by count.
    """
    seen: set[int] = set()

    def size(v, depth=0) -> int:
        if id(v) in seen or depth > 50:
            return 0
        seen.add(id(v))
        if hasattr(v, "nbytes") and hasattr(v, "dtype"):
            return int(v.nbytes)
        if isinstance(v, (str, bytes)):
            return len(v) + 50
        if isinstance(v, dict):
            return 64 + sum(size(k, depth + 1) + size(x, depth + 1) for k, x in v.items())
        if isinstance(v, (list, tuple, set, frozenset)):
            return 64 + sum(size(x, depth + 1) for x in v)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return 64 + sum(size(getattr(v, f.name), depth + 1) for f in dataclasses.fields(v))
        if hasattr(v, "__dict__") and not callable(v):
            return 64 + sum(size(x, depth + 1) for x in vars(v).values())
        return 32

    return size(value)


class Store:
    """Results by key: a memory tier evicted by bytes, and an optional disk tier.

    **Arguments**
    - `memory_bytes`: budget of the memory tier (bytes); the least recently used results go first.
    - `directory`: where the disk tier lives (`None`: memory only).
    - `disk_bytes`: size limit of the disk tier (bytes; `diskcache` evicts least recently stored).

    Values kept on disk must pickle; a value that does not is kept in memory only.
    """

    def __init__(self, memory_bytes: int, directory: str | None = None, disk_bytes: int = 512 * MB):
        self.memory_bytes = int(memory_bytes)
        self._memory: collections.OrderedDict[str, tuple[Any, int]] = collections.OrderedDict()
        self._used = 0
        self._lock = threading.Lock()
        self._disk = None
        if directory:
            try:
                self._disk = diskcache.Cache(directory, size_limit=int(disk_bytes), eviction_policy="least-recently-used")
                os.makedirs(os.path.join(directory, "locks"), exist_ok=True)
            except Exception as err:  # noqa: BLE001 - a read-only or full disk leaves the memory tier working
                log.warning("results store on disk unavailable (%s): memory only", err)

    @property
    def used_bytes(self) -> int:
        """Bytes held by the memory tier."""
        return self._used

    def get(self, key: str, default=_MISSING):
        """The stored value for `key` (memory first, then disk, which also refills memory), else `default`."""
        with self._lock:
            if key in self._memory:
                self._memory.move_to_end(key)
                return self._memory[key][0]
        if self._disk is not None:
            try:
                blob = self._disk.get(key, default=None)
            except Exception:  # noqa: BLE001 - a damaged entry is a miss
                blob = None
            if blob is not None:
                try:
                    value = pickle.loads(blob)
                except Exception:  # noqa: BLE001 - written by another version: recompute
                    return default
                self._keep(key, value)
                return value
        return default

    def __contains__(self, key: str) -> bool:
        with self._lock:
            if key in self._memory:
                return True
        return self._disk is not None and key in self._disk

    def put(self, key: str, value, *, persist: bool = True) -> None:
        """Keep `value` under `key`; on disk too when `persist` (never for a visitor's upload)."""
        self._keep(key, value)
        if persist and self._disk is not None:
            try:
                self._disk.set(key, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
            except Exception as err:  # noqa: BLE001 - unpicklable or disk full: memory only
                log.info("not stored on disk (%s): %s", key[:80], err)

    def _keep(self, key: str, value) -> None:
        size = nbytes(value)
        with self._lock:
            if key in self._memory:
                self._used -= self._memory.pop(key)[1]
            if size > self.memory_bytes:
                return
            self._memory[key] = (value, size)
            self._used += size
            while self._used > self.memory_bytes and self._memory:
                _, (_, s) = self._memory.popitem(last=False)
                self._used -= s

    def lock(self, key: str, *, timeout: float = 900.0):
        """A lock on `key` held across processes (a file lock beside the disk tier), so that two servers sharing
        the directory compute one result once: the second waits, then finds the first's result stored.
        Without a disk tier, a no-op. A lock not acquired within `timeout` s is skipped (compute anyway)."""
        if self._disk is None:
            return contextlib.nullcontext()
        return _Lock(self._lock_file(hashlib.sha256(key.encode()).hexdigest()[:32]), timeout)

    def once(self, key: str, compute: Callable[[], Any], *, persist: bool = True):
        """The value under `key`, computed by `compute()` and stored only if no one (in any process sharing the
        directory) has stored it: the key's file lock is held while computing. Returns the value."""
        with self.lock(key) if persist else contextlib.nullcontext():
            value = self.get(key, _MISSING)
            if value is _MISSING:
                value = compute()
                self.put(key, value, persist=persist)
            return value

    def slot(self, i: int):
        """Gate slot `i` held across processes (a file lock beside the disk tier; a no-op without one)."""
        if self._disk is None:
            return contextlib.nullcontext()
        return self._lock_file(f"gate-slot-{int(i)}")

    def _lock_file(self, name: str) -> filelock.FileLock:
        """The file lock `name` in the disk tier's `locks` folder (made once, when the store opens)."""
        return filelock.FileLock(os.path.join(self._disk.directory, "locks", name + ".lock"))

    def clear_memory(self) -> None:
        """Drop the memory tier (the disk tier stays)."""
        with self._lock:
            self._memory.clear()
            self._used = 0


class _Lock:
    """A file lock that gives up after `timeout` s instead of raising (a stale lock must not stall a page)."""

    def __init__(self, lock: filelock.FileLock, timeout: float):
        self._file, self._timeout, self._held = lock, timeout, False

    def __enter__(self):
        try:
            self._file.acquire(timeout=self._timeout)
            self._held = True
        except filelock.Timeout:
            log.warning("store lock %s not acquired in %.0f s: computing anyway", self._file.lock_file, self._timeout)
        return self

    def __exit__(self, *exc):
        if self._held:
            self._file.release()


@dataclasses.dataclass
class Job:
    """One computation in the gate: its key, progress (0–1 and a line of text), result or error."""

    key: str
    name: str
    fn: Callable[[Callable], Any] | None  # None while only reserved (`Gate.reserve`): not ready to run
    est_seconds: float
    est_bytes: int
    waiters: int = 0
    fraction: float = 0.0
    text: str = ""
    started: float | None = None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def report(self, fraction: float, text: str | None = None) -> None:
        """Progress callback handed to the computation: `fraction` in [0, 1], an optional line of text."""
        self.fraction = float(min(max(fraction, 0.0), 1.0))
        if text:
            self.text = str(text)

    def remaining(self, now: float) -> float:
        """Estimated seconds until this job ends (from its progress once it runs)."""
        if self.started is None:
            return self.est_seconds
        elapsed = now - self.started
        if self.fraction > 0.05:
            return max(elapsed / self.fraction - elapsed, 0.0)
        return max(self.est_seconds - elapsed, 0.5)


class Gate:
    """Admission control for heavy computations, shared by every session of a server.

    **Arguments**
    - `slots`: computations running at once (1 on a 2-core machine: two would only share the cores).
    - `budget_bytes`: a computation starts only while `rss() + its estimate` stays below this (unless
      nothing else runs: then it starts after `relieve()`, so the queue never stalls).
    - `rss`: the process's resident bytes now; `relieve`: frees memory (drop caches) when over budget.
    - `after`: called after each computation in the worker (e.g. return freed memory to the system).
    - `hold(i)`: a context manager held by worker `i` while it runs a computation: `Store.slot(i)` makes the
      slots machine-wide (two servers, or `python -m gradlab.ui.warm`, sharing a store directory share them);
      while a worker waits for a slot held elsewhere, `position` counts that computation ahead of every queued job.

    Computations run in the gate's worker threads; a caller waits on the `Job` (`submit`, `position`); a caller
    whose request is not ready yet can take its place in the queue first (`reserve`).
    A computation submitted from inside a worker runs inline (nested cached calls cannot deadlock).
    """

    def __init__(self, slots: int = 1, budget_bytes: int = 600 * MB, *, rss: Callable[[], int] = lambda: 0,
                 relieve: Callable[[], None] = lambda: None, after: Callable[[], None] = lambda: None,
                 hold: Callable[[int], Any] = lambda i: contextlib.nullcontext()):
        if slots < 1:
            raise ValueError(f"the gate needs at least one slot, got {slots}")
        self.slots, self.budget_bytes = int(slots), int(budget_bytes)
        self._rss, self._relieve, self._after, self._hold = rss, relieve, after, hold
        self._lock = threading.Condition()
        self._queue: list[Job] = []
        self._running: list[Job] = []
        self._jobs: dict[str, Job] = {}
        self._seconds: dict[str, float] = {}  # recent duration per computation name, for wait estimates
        self._elsewhere = 0  # workers waiting for a slot another process holds (`hold`): its computation runs
        self._local = threading.local()
        for i in range(self.slots):
            threading.Thread(target=self._work, args=(i,), name=f"gradlab-gate-{i}", daemon=True).start()

    @property
    def waiting(self) -> int:
        """How many requests wait in the queue (reserved places included)."""
        with self._lock:
            return len(self._queue)

    @property
    def in_worker(self) -> bool:
        """Whether the calling thread is one of the gate's workers."""
        return getattr(self._local, "worker", False)

    def submit(self, key: str, name: str, fn: Callable[[Callable], Any], *, est_seconds: float | None = None,
               est_bytes: int = 0) -> Job:
        """Queue `fn(report)` under `key`, or join the job already queued or running under `key`.

        The caller must call `leave(job)` when it stops waiting (`wait` does). Returns the `Job`.
        """
        with self._lock:
            job = self._jobs.get(key)
            est = est_seconds if est_seconds is not None else self._seconds.get(name, 5.0)
            if job is None:
                job = Job(key, name, fn, float(est), int(est_bytes))
                self._jobs[key] = job
                self._queue.append(job)
                self._lock.notify_all()
            elif job.fn is None:  # reserved: ready now, in the place it was reserved
                job.fn, job.est_seconds, job.est_bytes = fn, float(est), int(est_bytes)
                self._lock.notify_all()
            job.waiters += 1
            return job

    def reserve(self, key: str, name: str) -> Job:
        """Take a place in the queue for a request under `key` that is not ready yet (its checks still run), or
        join the job already queued or running under `key`. The place shows in `position` (its own and that of
        later requests) from now on; jobs behind it that are ready run first while it is not. `submit` with the
        same key makes it ready; the caller must `leave(job)` when it stops waiting (a place never made ready
        is then given up). Returns the `Job`."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                job = Job(key, name, None, self._seconds.get(name, 5.0), 0)
                self._jobs[key] = job
                self._queue.append(job)
            job.waiters += 1
            return job

    def leave(self, job: Job) -> None:
        """The caller no longer waits; a queued job nobody waits for is dropped (a visitor moved on)."""
        with self._lock:
            job.waiters -= 1
            if job.waiters <= 0 and job.started is None and job in self._queue:
                self._queue.remove(job)
                self._jobs.pop(job.key, None)
                job.error = RuntimeError("cancelled: nobody waits for it")
                job.done.set()

    def position(self, job: Job) -> tuple[int, float]:
        """`(ahead, seconds)`: computations ahead of `job` (0 once it runs) and the estimated wait."""
        now = time.monotonic()
        with self._lock:
            if job.started is not None or job not in self._queue:
                return 0, 0.0
            ahead = self._queue[: self._queue.index(job)]
            running = sorted([j.remaining(now) for j in self._running] + [self._typical()] * self._elsewhere)
        wait = (min(running) if len(running) >= self.slots else 0.0) + sum(j.est_seconds for j in ahead) / self.slots
        return len(ahead) + len(running), wait

    def _typical(self) -> float:
        """Seconds a computation of another process holding a slot is counted for (its own estimate is not known
        here): the median of this gate's recent durations, else 5 s."""
        return statistics.median(self._seconds.values()) if self._seconds else 5.0

    def run(self, key: str, name: str, fn: Callable[[Callable], Any], *, on_wait: Callable[[Job], None] | None = None,
            poll: float = 0.25, **estimates):
        """Submit and wait; `on_wait(job)` is called every `poll` s while waiting (draw the queue, progress).

        Returns the result of `fn(report)`; re-raises its exception. Inside a worker, runs `fn` inline, its `report`
        the running computation's (a nested computation's progress moves the bar its visitors see).
        """
        if self.in_worker:  # nested: its progress moves the running computation's bar
            return fn(getattr(self._local, "report", None) or (lambda *a, **k: None))
        job = self.submit(key, name, fn, **estimates)
        try:
            if on_wait is not None and self.position(job)[0]:
                on_wait(job)  # queued behind others: say so at once, not after the first poll
            while not job.done.wait(poll):
                if on_wait is not None:
                    on_wait(job)
        finally:
            self.leave(job)
        if job.error is not None:
            raise job.error
        return job.result

    def _next(self) -> tuple[Job | None, bool]:
        """The first queued job that fits the memory budget, or (when nothing runs) the first, with whether memory
        must be relieved before it starts."""
        ready = [job for job in self._queue if job.fn is not None]
        for job in ready:
            if self._rss() + job.est_bytes <= self.budget_bytes:
                return job, False
        if not self._running and ready:
            return ready[0], True
        return None, False

    def _work(self, slot: int) -> None:
        self._local.worker = True
        while True:
            with self._lock:
                while not any(job.fn is not None for job in self._queue):  # reserved places are not ready to run
                    self._lock.wait(0.5)
            with contextlib.ExitStack() as held:
                with self._lock:
                    self._elsewhere += 1  # until the slot is ours, another process's computation is ahead of ours
                try:
                    held.enter_context(self._hold(slot))  # another process may hold it: wait with the job queued
                finally:
                    with self._lock:
                        self._elsewhere -= 1
                with self._lock:
                    job, relieve = self._next()
                    if job is None:  # over the memory budget while others run: wait for one to end
                        self._lock.wait(0.5)
                        continue
                    self._queue.remove(job)
                    self._running.append(job)
                    job.started = time.monotonic()
                if relieve:  # outside the lock: meanwhile visitors still join the queue and read their place
                    try:
                        self._relieve()
                    except Exception:  # noqa: BLE001 - the job runs anyway, as it would without relief
                        log.exception("relieving memory before a computation")
                try:
                    self._local.report = job.report  # nested gated calls report here (`run`)
                    job.result = job.fn(job.report)
                except BaseException as err:  # noqa: BLE001 - handed to every waiter
                    job.error = err
                finally:
                    self._local.report = None
                    seconds = time.monotonic() - job.started
                    with self._lock:
                        self._running.remove(job)
                        self._jobs.pop(job.key, None)
                        self._seconds[job.name] = seconds
                        self._lock.notify_all()
                    job.done.set()
                    try:
                        self._after()
                    except Exception:  # noqa: BLE001
                        log.exception("after a computation")


def key_of(*parts) -> str:
    """A stable text key for `parts`: reprs, with arrays by the SHA-256 of their bytes, shape and dtype."""

    def text(p) -> str:
        if isinstance(p, np.ndarray) or (hasattr(p, "dtype") and hasattr(p, "shape")):
            a = np.asarray(p)
            return f"array{a.shape}{a.dtype}:{hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]}"
        if isinstance(p, (list, tuple)):
            return "(" + ",".join(text(x) for x in p) + ")"
        if isinstance(p, dict):
            return "{" + ",".join(f"{k!r}:{text(v)}" for k, v in sorted(p.items(), key=lambda kv: repr(kv[0]))) + "}"
        return repr(p)

    return "|".join(text(p) for p in parts)


def default_directory() -> str:
    """Where the disk tier lives: `GRADLAB_STORE_DIR`, else `~/.cache/gradlab/results`."""
    return os.environ.get("GRADLAB_STORE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gradlab", "results")
