"""Shared results keyed on complete inputs, the gate for heavy work, and memory hygiene for a shared server.

One server serves every visitor, so every cache here is shared across sessions and its key holds
every input that changes the result:

- `shared`: the one decorator for page computations: results in `gradlab.store`'s store (memory by
  bytes, then disk, so a restarted server answers from disk), heavy work through its gate (one at a
  time, identical requests joined, the queue and progress drawn for each waiting visitor).
- `on_request`: a heavy section that starts from a button (never from a link) unless already stored,
  and refuses a run over the work budget with its estimate.
- `fitted(exp)`: the trained experiment, `shared`, keyed on the complete `Experiment` (an upload is
  `dataset="upload:<hash of its bytes, label column, task>"`, so a session only ever gets a model
  trained on bytes it uploaded itself; it is never written to disk).
- `requested`: which button-started computations this session asked for (keys only, no results),
  so a second visitor gets a stored result by pressing the button, never unasked.

Streamlit's own `clear_cache` (any visitor can send it) clears `st.cache_*` only: nothing here lives there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import streamlit as st

from gradlab import costs, equivalence, memory, summary
from gradlab.memory import release_memory, rss_mb
from gradlab.models import MODELS
from gradlab.store import MB, Gate, Store, default_directory, key_of
from gradlab.ui import walk
from gradlab.ui.upload import require_upload
from gradlab.ui.widgets import guard
from gradlab.experiment import (Experiment, Fitted, check_training_memory, check_training_work, count_params, fit,
                                forward_macs, load_data, recipe)
from gradlab.sources import data_key

log = logging.getLogger("gradlab")
LOG_RUNS = bool(os.environ.get("GRADLAB_LOG_RUNS"))  # benchmarks/latency.py reads the server times
_MISSING = object()


_ROOT = Path(__file__).resolve().parents[2]


def _code_version() -> str:
    """A hash of gradlab's and the views' sources and JAX's version: stored results from other code are never used."""
    h = hashlib.sha256(jax.__version__.encode())
    for path in sorted([*_ROOT.glob("gradlab/**/*.py"), *_ROOT.glob("views/*.py")]):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


CODE_VERSION = _code_version()


def fitted_key(f: Fitted) -> str:
    """What identifies a `Fitted` in a cache key: its complete experiment (upload hash included)."""
    return repr(f.experiment)



_REQUESTED = "_requested"


def requested(name: str, key, pressed: bool, *, kept: int = 8) -> bool:
    """Whether this session asked for computation `name` with `key` (pressed now, or before).

    For results a button starts (DP-SGD runs, retraining checks): the result itself lives in the
    shared store; this remembers only which keys this session asked for, so nobody is shown a
    result before they ask for it.
    """
    asked = st.session_state.setdefault(_REQUESTED, {}).setdefault(name, [])
    if pressed and key not in asked:
        asked.append(key)
        del asked[:-kept]
    return key in asked


# ---------------------------------------------------------------- shared work: the gate and the store

#: Heavy computations running at once (one on a 2-core machine) and the server's memory budget.
GATE_SLOTS = int(os.environ.get("GRADLAB_GATE_SLOTS", "1"))
SERVER_BUDGET_MB = float(os.environ.get("GRADLAB_SERVER_BUDGET_MB", "600"))
#: Memory for stored results (evicted by bytes); the disk tier is bounded by `GRADLAB_STORE_DISK_MB`.
STORE_MB = float(os.environ.get("GRADLAB_STORE_MB", "64"))

STORE = Store(int(STORE_MB * MB), default_directory(),
              int(float(os.environ.get("GRADLAB_STORE_DISK_MB", "256")) * MB))


def _relieve() -> None:
    """A heavy job would take the server over its budget: drop what is rebuilt on demand before it starts, compiled
    programs first, then (if that is not enough) stored results' memory tier. The shared figures stay: all 88 of the
    lecture's (13 steps, both styles) hold ~1 MB (clearing them returned 3.7 MB), while each heavy job of a room's
    warm-up cleared them and the students' pages then rebuilt a step's figures at the lecturer's Next, under the GIL
    (benchmarks/RESULTS.md, issue 41, session 44). `ui.figures.FIGURES` keeps at most `KEEP`."""
    release_memory(force=True)
    if (rss_mb() * MB + memory.BUDGET_BYTES + memory.COMPILE_BYTES) > SERVER_BUDGET_MB * MB:
        STORE.clear_memory()
        release_memory()


# Before and after every job, `release_memory` collects the frozen heap in full (0.3–0.5 s under the GIL) at most every
# `memory.FULL_COLLECT_EVERY_S`, waiters or not. A full collection whenever nobody waited in the gate's queue came to
# ~8 in one Influence press on seed 003's SimpleCNN, ~1.3 of its 25 CPU-s, and held the GIL against other visitors'
# page runs, which the queue does not count (benchmarks/RESULTS.md, issue 40, session 46).
GATE = Gate(GATE_SLOTS, int(SERVER_BUDGET_MB * MB), rss=lambda: int(rss_mb() * MB),
            relieve=_relieve, after=release_memory, hold=STORE.slot)


#: Practice's own slot: a student's run waits only behind other students' runs, never in the pages' queue, so a run
#: held for its whole wall-clock limit delays no page's computation (the child runs at nice 10 besides).
#: Its memory is the sandbox child's, not this process's: no budget check here (the child has its own limit).
PRACTICE_GATE = Gate(1, 2**62)
#: Run/Check presses one session may make in a minute.
PRACTICE_PER_MINUTE = int(os.environ.get("GRADLAB_PRACTICE_PER_MINUTE", "8"))


def sandboxed(fn, *args, label: str, est_seconds: float):
    """`fn(*args)` (a Practice run) through Practice's own gate slot, the queue drawn while it waits. Never stored
    and never joined with another request: every press is its own run, and a verdict is only ever its own
    session's. Raises what `fn` raises."""
    slot, shown = st.empty(), [None]

    def on_wait(job):
        ahead, wait = PRACTICE_GATE.position(job)
        view = (ahead, round(wait))
        if view != shown[0]:
            shown[0] = view
            if ahead:
                slot.info(f"**Queued:** {ahead} student run{'s' * (ahead > 1)} ahead of yours, about {wait:.0f} s.",
                          icon=":material/hourglass_top:")
            else:
                slot.info(f"{label}…", icon=":material/hourglass_top:")

    try:
        return PRACTICE_GATE.run(f"practice-{time.monotonic_ns()}-{threading.get_ident()}", fn.__name__,
                                 lambda report: fn(*args), on_wait=on_wait, poll=0.2, est_seconds=est_seconds)
    finally:
        slot.empty()


def practice_wait() -> str | None:
    """Why this session must wait before its next Run or Check (None: go ahead; the press is counted): at most
    `PRACTICE_PER_MINUTE` presses in any minute."""
    now, key = time.monotonic(), "_practice_presses"
    presses = [t for t in st.session_state.get(key, []) if now - t < 60]
    if len(presses) >= PRACTICE_PER_MINUTE:
        st.session_state[key] = presses
        return (f"Slow down: at most {PRACTICE_PER_MINUTE} run{'s' * (PRACTICE_PER_MINUTE != 1)} a minute. "
                f"Try again in {60 - (now - presses[0]):.0f} s.")
    st.session_state[key] = [*presses, now]
    return None


def _show_queued(slot, ahead: int, wait: float) -> None:
    """The gate's queue message in `slot` (an `st.empty()`)."""
    slot.info(f"**Queued:** {ahead} computation{'s' * (ahead > 1)} ahead of yours, about {wait:.0f} s. "
              "The server runs one heavy computation at a time; the rest of the page works meanwhile.",
              icon=":material/hourglass_top:")


_PLACE = threading.local()  # the slot `place_in_queue` drew in, for the gated computation that follows in this run


def _take_place():
    slot, _PLACE.slot = getattr(_PLACE, "slot", None), None
    return slot


def _clear_place() -> None:
    slot = _take_place()
    if slot is not None:
        slot.empty()


@contextlib.contextmanager
def place_in_queue(fn, *args):
    """Take this visitor's place in the gate's queue for the gated computation `fn(*args)` (a `shared` function)
    that this block is about to request, and show it at once, before the block's checks (a model's P and
    multiply-adds traced for a new shape, its cost): on a busy 2-core server those checks share the GIL with the
    running computation and took up to 1 s (`benchmarks/crowd.py` scenario 2), and a visitor behind them is
    served in the order they came, not the order their checks ended (`Gate.reserve`). The computation's own
    queue message and progress bar then draw in the same place; the place is given up, and its message
    cleared, when the block ends."""
    if GATE.in_worker:
        yield
        return
    job = GATE.reserve(fn.key(*args), fn.__name__)
    slot = None
    try:
        ahead, wait = GATE.position(job)
        if ahead:
            slot = _PLACE.slot = st.empty()
            _show_queued(slot, ahead, wait)
        yield
    finally:
        _PLACE.slot = None
        GATE.leave(job)
        if slot is not None:
            slot.empty()


def _key_part(value):
    if isinstance(value, Fitted):
        return fitted_key(value)
    return value


def origin(fn) -> str:
    """Where `fn` is defined, as a key: its module, or for a page (Streamlit runs every page, and the lecture runs
    each step, as `__main__`) the page file's path relative to the app's root, so that two pages defining a
    function of the same name and parameters never share results. Relative, so servers sharing a store agree."""
    if fn.__module__ != "__main__":
        return fn.__module__
    path = Path(fn.__code__.co_filename).resolve()
    return path.relative_to(_ROOT).as_posix() if path.is_relative_to(_ROOT) else path.as_posix()


#: A running computation shows its seconds so far once it has run this long (a long library call that reports no
#: progress of its own must still show that it is working: issue 40, Influence on a served model ran 197 s silently).
CLOCK_AFTER_S = 2.0


def progress_view(job, label: str, now: float) -> tuple[float, str]:
    """What the progress bar of a running gated `job` shows: `(fraction, text)`.

    The computation's own progress (`job.fraction`, `job.text`, from its `progress(fraction, text)` or a nested
    computation's) when it reports some; and after `CLOCK_AFTER_S`, the seconds so far and the estimate
    (`job.est_seconds`: the function's `cost`, else its last run on this server), with the bar moving by time while the
    computation reports nothing (at most 95%: an estimate is not a promise). Text: gradlab's Markdown, no user text."""
    elapsed = 0.0 if job.started is None else max(now - job.started, 0.0)
    fraction, text = job.fraction, f"{label}… {job.text}".rstrip()
    if elapsed >= CLOCK_AFTER_S:
        est = job.est_seconds if job.est_seconds and job.est_seconds > 0 else None
        if fraction <= 0 and est:
            fraction = min(elapsed / est, 0.95)
        clock = f"{elapsed:.0f} s so far" + (f", about {est:.0f} s in all" if est and elapsed < est else "")
        text = f"{text} ({clock})"
    return float(min(max(fraction, 0.0), 1.0)), text


def _released(value):
    """`value`, once the computation's freed memory went back to the system (`release_memory`; no full collection,
    which the gate's `after` decides), before the store pickles it (SimpleCNN's projected features on the Influence
    page: VmHWM 694 MB without, 687 MB with)."""
    release_memory(full=False)
    return value


def shared(fn=None, *, label: str = "Computing", persist: bool = True, gated: bool = True, cost=None):
    """The one cache of page computations: shared by every session, stored, and heavy work through the gate.

    - Key: every argument (a `Fitted` by its experiment; arguments named `_x` are left out, so the key
      must hold every input that changes the result), where the function is defined (`origin`: the page's
      file for a page's function), its name and `CODE_VERSION`.
    - Store: results are kept in `STORE` (memory by bytes, and on disk unless `persist=False` or an
      argument is an upload's or a served model's experiment: `Experiment.in_memory_only`); a file lock on
      the key makes two servers sharing the store directory compute a result once.
    - Gate (`gated=True`): `fn` runs in the gate's worker thread (never inside a Streamlit cache, so no
      element is replayed into another visitor's page); identical requests join one run; every waiting
      visitor sees "Queued: n ahead, about s" or the progress bar, which `fn` moves through its
      `progress(fraction, text)` argument when it declares one. `gated=False` is for computations well
      under a second and a few MB (they run in the visitor's own thread).
    - `cost(*args, **kwargs)`: estimated CPU-seconds of a run (the queue's wait estimate, and `ui.on_request`'s
      budget check); without it the gate uses the last run's duration.

    `fn.key(*args)` is the store key; `fn.stored(*args)` says whether a result is already stored; `fn.cost(*args)`
    is the estimate (or None).
    """
    if fn is None:
        return functools.partial(shared, label=label, persist=persist, gated=gated, cost=cost)
    names = list(inspect.signature(fn).parameters)
    where = origin(fn)
    takes_progress = "progress" in names

    def key(args, kwargs) -> tuple[str, bool]:
        bound = dict(zip(names, args), **kwargs)
        parts = {k: _key_part(v) for k, v in bound.items() if not k.startswith("_") and k != "progress"}
        memory_only = any(isinstance(v, Experiment) and v.in_memory_only for v in parts.values()) or any(
            isinstance(v, Fitted) and v.experiment.in_memory_only for v in bound.values())
        return key_of(where, fn.__qualname__, CODE_VERSION, parts), memory_only

    @functools.wraps(fn)
    def run(*args, **kwargs):
        k, memory_only = key(args, kwargs)
        value = STORE.get(k, _MISSING)
        if value is not _MISSING:
            return value
        keep = persist and not memory_only

        def compute(report):  # another server sharing the store may have computed it meanwhile: `once`
            started, cpu, before, ran = time.perf_counter(), time.process_time(), rss_mb(), []

            def run_fn():
                ran.append(True)
                return _released(fn(*args, **({"progress": report} if takes_progress else {}), **kwargs))

            if LOG_RUNS:
                memory.peak_rss_mb(reset=True)
            try:
                return STORE.once(k, run_fn, persist=keep)
            finally:
                # each computation's server time, beside app.py's per-run line (not a wait on the key's lock that found
                # another session's result: a cold room's 30 followers printed 25 lines for one computation)
                if LOG_RUNS and ran:
                    live = sum(a.nbytes for a in jax.live_arrays()) / MB
                    print(f"gradlab-compute {fn.__qualname__} {time.perf_counter() - started:.3f} s "
                          f"({time.process_time() - cpu:.1f} process CPU-s), RSS {before:.0f} MB "
                          f"-> peak {memory.peak_rss_mb():.0f} MB; JAX arrays alive after {live:.0f} MB, store memory tier "
                          f"{STORE.used_bytes / MB:.0f} MB", file=sys.stderr, flush=True)

        if not gated:
            return compute(lambda *a, **kw: None)
        slot, shown = [_take_place()], [None]  # the place a page showed before its checks (`place_in_queue`), if any

        def on_wait(job):
            ahead, wait = GATE.position(job)
            bar = None if ahead else progress_view(job, label, time.monotonic())
            view = ("queue", ahead, round(wait)) if ahead else ("run", round(bar[0] * 40), bar[1])
            if view == shown[0]:
                return
            shown[0] = view
            if slot[0] is None:
                slot[0] = st.empty()
            if ahead:
                _show_queued(slot[0], ahead, wait)
            else:
                slot[0].progress(*bar)

        # memory: every page computation is refused above memory.BUDGET_BYTES before it runs, and a cold one compiles
        estimate = {"est_bytes": memory.BUDGET_BYTES + memory.COMPILE_BYTES}
        if cost is not None:
            estimate["est_seconds"] = float(cost(*args, **kwargs))
        try:
            return GATE.run(k, fn.__qualname__, compute, on_wait=on_wait, poll=0.2, **estimate)
        finally:
            if slot[0] is not None:
                slot[0].empty()

    run.key = lambda *args, **kwargs: key(args, kwargs)[0]
    run.stored = lambda *args, **kwargs: run.key(*args, **kwargs) in STORE
    run.cost = (lambda *args, **kwargs: None) if cost is None else cost
    return run


def on_request(fn, *args, name: str, button: str, help: str | None = None, fix: str = "", go: bool = False, **kwargs):
    """A heavy section: run the shared computation `fn(*args, **kwargs)` only when its result is stored or this
    session pressed its button (a shared link never starts it), and refuse a run over the work budget.

    Draws the button (its label with `fn.cost`'s estimate) or, over `costs.WORK_BUDGET_SECONDS`, a warning with
    the estimate and `fix` (the largest setting that fits). `go=True` counts as a press (a preset's own button), as
    does the room's warm-up walking the page (`walk.pressing`).
    Returns the result, or None when not asked for.
    """
    if fn.stored(*args, **kwargs):
        return fn(*args, **kwargs)
    seconds = fn.cost(*args, **kwargs)
    if seconds is not None and seconds > costs.WORK_BUDGET_SECONDS:
        st.warning(f"This would take about {seconds:,.0f} CPU-seconds on this shared server; the limit is "
                   f"{costs.WORK_BUDGET_SECONDS:.0f}. {fix}", icon=":material/hourglass_disabled:")
        return None
    about = f" (about {max(seconds, 1):.0f} s)" if seconds is not None else ""
    slot = st.empty()
    pressed = slot.button(button + about, type="primary", key=f"run_{name}", help=help) or go or walk.pressing()
    if requested(name, fn.key(*args, **kwargs), pressed, kept=1):
        result = fn(*args, **kwargs)
        slot.empty()  # its result is shown now (and stored: no button on the next run either)
        return result
    return None


_FILLING: list = []


def fill_store_in_background() -> None:
    """With `GRADLAB_WARM_ON_START=1`, start `python -m gradlab.ui.warm --fill` once per server process (niced):
    it computes every page's default view and every lecture step into the shared store through the same
    machine-wide gate slots. Off by default: the second process needs its own ~400 MB, more than the
    smallest Community Cloud instance leaves beside the server."""
    if _FILLING or os.environ.get("GRADLAB_WARM_ON_START") != "1":
        return
    env = {**os.environ, "GRADLAB_WARM_ON_START": "0"}
    _FILLING.append(subprocess.Popen([sys.executable, "-m", "gradlab.ui.warm", "--fill"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=lambda: os.nice(19)))
    log.info("filling the results store in the background (pid %d)", _FILLING[0].pid)


@shared(gated=False, persist=False)
def _data(exp: Experiment, _upload: dict | None):
    """`exp`'s data (`load_data`), once per `sources.data_key(exp)` (`exp` is one already) while the store's memory
    tier keeps it: P, N, the forward's multiply-adds and the training all read it (an upload is parsed once)."""
    return load_data(exp, _upload)


def _session_upload(exp: Experiment) -> dict | None:
    """This session's upload when `exp`'s source needs one (`Source.needs_upload`; stops the page without it)."""
    return require_upload(exp) if exp.source.needs_upload else None


def data(exp: Experiment):
    """`exp`'s `Dataset`, loaded once per data key (`_data`). **Raises** `DataError` for impossible settings;
    stops the page with a hint when an upload's bytes are not this session's."""
    return _data(data_key(exp), _session_upload(exp))


@shared(gated=False)
def _num_params(exp: Experiment, _upload: dict | None) -> int:
    return count_params(exp, _data(data_key(exp), _upload))


@shared(gated=False)
def _forward_macs(exp: Experiment, _upload: dict | None) -> int:
    return forward_macs(exp, _data(data_key(exp), _upload))


#: Settings that change how a model trains, never its shapes: P and the forward's multiply-adds do not depend on them,
#: so a visitor who changes one (the seed, the learning rate…) reaches the queue without tracing the model again.
#: `train`'s keyword arguments (`recipe`), the training labels' noise and the seed.
_TRAINING_ONLY = (*recipe(Experiment()), "label_noise", "seed")


def _shapes_only(exp: Experiment) -> Experiment:
    return dataclasses.replace(exp, **{f: getattr(_SHAPES, f) for f in _TRAINING_ONLY})


_SHAPES = Experiment()


def num_params(exp: Experiment) -> int:
    """P, the number of parameters `exp`'s model has, from its untrained initialization: lets a page
    refuse a model too large for it before anything trains. **Raises** `DataError` for impossible settings."""
    return _num_params(_shapes_only(exp), _session_upload(exp))


@shared(gated=False)
def _num_examples(exp: Experiment, _upload: dict | None) -> int:
    return len(_data(data_key(exp), _upload).y_train)


def num_examples(exp: Experiment) -> int:
    """N, the number of training examples `exp` trains on (stored): lets a page refuse work for a model and data
    too large for it before anything trains. **Raises** `DataError` for impossible settings."""
    return _num_examples(_shapes_only(exp), _session_upload(exp))


def macs(exp: Experiment) -> int:
    """Multiply-adds of one forward pass of `exp`'s model (`experiment.forward_macs`, stored): the work estimates
    of models whose convolutions reuse each weight; 0 for a served model (its forward is the user's own, run on
    the user's machine; estimates count its P: `Source.forward_macs`). **Raises** `DataError` for impossible settings."""
    return _forward_macs(_shapes_only(exp), _session_upload(exp))


def summary_size(exp: Experiment, f: Fitted) -> int:
    """How many training examples `exp`'s norm summary covers before a button (`summary.summary_size`: the
    training's and the summary's estimates together fit `costs.WORK_BUDGET_SECONDS`); all of a served model's.
    A training over `costs.TRAIN_BUTTON_SECONDS` runs from its own button, never as a link's work, so the
    summary after it has the whole budget."""
    n = len(f.data.y_train)
    if exp.source.brings_model:
        return n
    p, m = num_params(exp), macs(exp)
    train = costs.training_seconds(p, exp.steps, exp.batch_size, m)
    return summary.summary_size(n, p, m, train if train <= costs.TRAIN_BUTTON_SECONDS else 0.0)


def summary_seconds(exp: Experiment, size: int) -> float:
    """Estimated CPU-seconds of `exp`'s norm summary over `size` examples (`costs.summary_seconds`)."""
    p = num_params(exp)
    return costs.summary_seconds(p, size, macs(exp))  # a served model's 0 counts as its P


@shared(gated=False)
def _example_bytes(exp: Experiment, itemsize: int, _f: Fitted) -> int:
    return memory.example_bytes(_f.loss_fn, _f.model, _f.data.x_train, _f.data.y_train, itemsize=itemsize)


def equivalence_plan(exp: Experiment, f: Fitted) -> equivalence.SubsetPlan:
    """How many of `f`'s training examples the Equivalence page compares before a button (`equivalence.plan_subset`):
    all of them when the float64 comparison fits this server's memory budget per computation and what
    `costs.WORK_BUDGET_SECONDS` leaves after the page's own work and a training that a link starts (one over
    `costs.TRAIN_BUTTON_SECONDS` runs from its own button), else a fixed random subset. A served model gets the
    same plan (no training before it: its owner trained it)."""
    p, m = num_params(exp), macs(exp)
    train = 0.0 if exp.source.brings_model else costs.training_seconds(p, exp.steps, exp.batch_size, m)
    left = costs.WORK_BUDGET_SECONDS - costs.PAGE_SECONDS - (train if train <= costs.TRAIN_BUTTON_SECONDS else 0.0)
    return equivalence.plan_subset(len(f.data.y_train), p, _example_bytes(exp, 8, f), macs=m, seconds_left=left)


def fitted(exp: Experiment) -> Fitted:
    """The trained experiment, from the shared cache or trained now with a progress bar.

    A bad setting shows a clear message and stops this page (the sidebar keeps working). An upload
    experiment is trained on this session's upload, whose hash must match `exp.dataset`; a served model
    (`Source.brings_model`) is the one the server was started with.
    """
    if exp.source.brings_model:  # the served model: loaded once per server, trained by its owner
        with guard("Your model could not be loaded", stop=True):
            return fit(exp)
    upload = _session_upload(exp)
    with guard("These settings cannot be trained", stop=True):
        if _fit.stored(exp):
            return _fit(exp, upload)
        with place_in_queue(_fit, exp, upload):
            check_training_work(exp, _num_params(_shapes_only(exp), upload), _forward_macs(_shapes_only(exp), upload))
            if _fit.cost(exp, upload) > costs.TRAIN_BUTTON_SECONDS:  # a large model: a link alone never trains it
                _clear_place()  # nothing is queued for this visitor until they ask
                ask = st.empty()  # the notice and its button go once trained (this run goes on to the page)
                with ask.container():
                    st.info(f"This page needs the {MODELS.get(exp.model, exp.model)} trained on "
                            f"{exp.source.label} ({exp.steps} steps of {exp.batch_size}). No one has "
                            "trained it on this server yet; a link alone never starts work this large, so it starts when "
                            "you ask.", icon=":material/model_training:")
                    trained = on_request(_fit, exp, upload, name="train", button="Train the model")
                if trained is None:
                    st.stop()
                ask.empty()
                return trained
            return _fit(exp, upload)
    raise AssertionError("unreachable: guard(stop=True) stops the page")  # pragma: no cover


def _training_cost(exp: Experiment, _upload: dict | None) -> float:
    """CPU-seconds `_fit` is estimated to take (`costs.training_seconds`)."""
    shapes = _shapes_only(exp)
    return costs.training_seconds(_num_params(shapes, _upload), exp.steps, exp.batch_size, _forward_macs(shapes, _upload))


@shared(label="Training", cost=_training_cost)
def _fit(exp: Experiment, _upload: dict | None, progress) -> Fitted:
    """Train `exp` (on `_upload`'s bytes when it is an upload; its hash is in `exp.dataset`, and then the
    model stays in memory only)."""
    check_training_memory(exp, _num_params(_shapes_only(exp), _upload))
    return fit(exp, data=_data(data_key(exp), _upload), progress=lambda step, steps: progress(step / max(steps, 1), f"step {step} of {steps}"))
