"""The results store and the gate: eviction by bytes, disk that outlives the object, single flight, queue."""

import sys
import threading
import time

import numpy as np
import pytest

from gradlab.store import Gate, Store, key_of, nbytes


def test_memory_tier_evicts_least_recently_used_by_bytes():
    store = Store(memory_bytes=3 * 8000 + 500)
    for name in "abc":
        store.put(name, np.zeros(1000), persist=False)  # 8000 bytes each
    store.get("a")  # a is now the most recently used
    store.put("d", np.zeros(1000), persist=False)
    assert "b" not in store and {"a", "c", "d"} <= {k for k in "abcd" if k in store}
    assert store.used_bytes <= store.memory_bytes
    assert nbytes({"x": np.zeros(10, np.float32)}) >= 40


def test_disk_tier_outlives_the_store_and_uploads_stay_in_memory(tmp_path):
    first = Store(1 << 20, str(tmp_path))
    first.put("kept", {"v": np.arange(3)})
    first.put("upload", np.arange(3), persist=False)
    restarted = Store(1 << 20, str(tmp_path))
    np.testing.assert_array_equal(restarted.get("kept")["v"], np.arange(3))
    assert restarted.get("upload", None) is None


def test_identical_requests_share_one_run_and_others_queue():
    gate = Gate(slots=1)
    calls, release = [], threading.Event()

    def slow(report):
        calls.append(1)
        report(0.5, "half")
        release.wait(5)
        return 42

    results = []
    threads = [threading.Thread(target=lambda: results.append(gate.run("k", "slow", slow))) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    other = gate.submit("other", "fast", lambda report: 7)
    ahead, wait = gate.position(other)
    assert ahead == 1 and wait >= 0  # the shared run is ahead of it
    release.set()
    for t in threads:
        t.join(60)
    assert results == [42, 42, 42] and len(calls) == 1
    assert other.done.wait(60) and other.result == 7
    gate.leave(other)


def test_errors_reach_every_waiter_and_nested_calls_run_inline():
    gate = Gate(slots=1)

    def bad(report):
        raise ValueError("impossible setting")

    with pytest.raises(ValueError, match="impossible"):
        gate.run("bad", "bad", bad)
    assert gate.run("outer", "outer", lambda report: gate.run("inner", "inner", lambda r: 3) + 1) == 4


def test_a_queued_job_nobody_waits_for_is_dropped():
    gate = Gate(slots=1)
    hold = threading.Event()
    busy = gate.submit("busy", "busy", lambda report: hold.wait(5))
    time.sleep(0.1)
    queued = gate.submit("queued", "q", lambda report: 1)
    gate.leave(queued)
    assert queued.done.is_set() and queued.error is not None
    hold.set()
    assert busy.done.wait(60)


def test_a_queued_caller_is_told_its_place_at_once():
    """A visitor behind a running computation sees "Queued" when it joins, not after the first poll interval."""
    gate = Gate(slots=1)
    hold = threading.Event()
    busy = gate.submit("busy", "busy", lambda report: hold.wait(5))
    time.sleep(0.1)
    seen = []

    def on_wait(job):
        seen.append(gate.position(job)[0])
        hold.set()

    assert gate.run("later", "later", lambda report: 7, on_wait=on_wait, poll=30) == 7
    gate.leave(busy)
    assert seen and seen[0] == 1  # one computation ahead, told before any poll


def test_a_reserved_place_keeps_its_turn_and_relieving_memory_does_not_hold_the_gate():
    """A caller reserves its place before its checks (`reserve`): later callers count it ahead, ready jobs behind it
    run while it is not ready, `submit` under its key makes it ready in its place, and an unused place is given up.
    Relieving memory before a job runs outside the gate's lock: meanwhile others join the queue and read their place."""
    relieving, hold, relieved, ran = threading.Event(), threading.Event(), threading.Event(), []

    def relieve():
        relieving.set()
        hold.wait(60)
        relieved.set()

    gate = Gate(slots=1, budget_bytes=0, relieve=relieve)  # every job over budget: relieved before it starts
    early = gate.reserve("early", "fit")
    assert gate.position(early) == (0, 0.0)  # nothing ahead: nothing to show
    first = gate.submit("first", "first", lambda report: ran.append("first"), est_seconds=4.0, est_bytes=1)
    assert relieving.wait(60)  # the first ready job runs although the earlier place is not ready
    gone = gate.reserve("gone", "fit")
    late = gate.submit("late", "late", lambda report: ran.append("late"), est_seconds=3.0)
    assert gate.position(late)[0] == 3  # the running job, the place reserved early, the one given up below
    assert not relieved.is_set()  # not blocked by the relief: it still holds (until `hold`, set below)
    gate.leave(gone)
    assert gone.done.is_set() and gone.error is not None and gate.position(late)[0] == 2
    assert gate.submit("early", "fit", lambda report: ran.append("early"), est_seconds=2.0) is early
    hold.set()
    for job in (first, early, late):
        assert job.done.wait(60)
    assert ran == ["first", "early", "late"]
    for job in (first, early, early, late):  # `early` was reserved and submitted: two waits to leave
        gate.leave(job)


def _fitted_page():
    import streamlit as st

    from gradlab import ui
    from gradlab.experiment import Experiment

    st.write(f"fitted: {ui.fitted(Experiment(seed=9_876))}")


def test_a_waiting_visitor_sees_their_place_before_the_training_checks(monkeypatch):
    """Behind a running computation, `ui.fitted` shows "Queued" before it checks the model (P and multiply-adds
    traced for a new shape: up to 1 s on a busy server); the place is gone once the model is trained."""
    from streamlit.testing.v1 import AppTest

    from gradlab.ui import cache

    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])  # a script run replaces it; spawn reads it
    events, hold = [], threading.Event()
    busy = cache.GATE.submit("test-busy", "busy", lambda report: hold.wait(30))
    shown = cache._show_queued
    monkeypatch.setattr(cache, "_show_queued", lambda slot, ahead, wait: (events.append(f"queued {ahead}"),
                                                                         shown(slot, ahead, wait)))
    monkeypatch.setattr(cache, "check_training_work", lambda *args: (events.append("checked"), hold.set()))
    monkeypatch.setattr(cache, "fit", lambda exp, data, progress: (events.append("trained"), "a model")[1])
    try:
        at = AppTest.from_function(_fitted_page, default_timeout=60).run()
    finally:
        hold.set()
        cache.GATE.leave(busy)
    assert events[:2] == ["queued 1", "checked"] and events[-1] == "trained", events
    assert [m.value for m in at.markdown] == ["fitted: a model"]
    assert not [i.value for i in at.info if "Queued" in i.value]


def test_dropping_compiled_programs_collects_everything_at_most_once_a_minute(monkeypatch):
    """A full collection holds the GIL for 0.3–0.5 s: `release_memory` runs it at most every
    `FULL_COLLECT_EVERY_S` (an ordinary collection otherwise), or when asked to (`full=True`)."""
    from gradlab import memory

    full = []
    monkeypatch.setattr(memory, "collect_everything", lambda: (full.append(1), memory._LAST_FULL.__setitem__(0, time.monotonic())))
    monkeypatch.setattr(memory, "_LAST_FULL", [float("-inf")])
    for _ in range(3):
        memory.release_memory(force=True)
    assert len(full) == 1
    memory._LAST_FULL[0] -= memory.FULL_COLLECT_EVERY_S
    memory.release_memory(force=True)
    memory.release_memory(force=True, full=False)
    assert len(full) == 2
    memory.release_memory(force=True, full=True)  # asked for: collect everything now
    assert len(full) == 3


def test_keys_hash_arrays_by_content():
    assert key_of(np.arange(3), 1.0) == key_of(np.arange(3), 1.0) != key_of(np.arange(1, 4), 1.0)


def _visitor(directory, log_path, out):
    """One server process: its own store and gate on the shared directory, asking for the same result."""
    store = Store(1 << 20, directory)
    gate = Gate(slots=1, hold=store.slot)

    def compute(report):
        return store.once("shared-key", lambda: (open(log_path, "a").write("computed\n"), time.sleep(1.0), 7)[2])

    out.put(gate.run("shared-key", "demo", compute))


@pytest.mark.slow
def test_two_processes_sharing_the_directory_compute_a_result_once(tmp_path):
    """Two servers behind a load balancer (here: two processes) ask for one result at once: the key's file
    lock makes the second wait and read the first's result from disk."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out, log_path = ctx.Queue(), tmp_path / "log.txt"
    procs = [ctx.Process(target=_visitor, args=(str(tmp_path / "store"), str(log_path), out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    assert results == [7, 7]
    assert log_path.read_text().count("computed") == 1


def test_gate_slots_are_held_across_processes(tmp_path):
    """A slot held elsewhere (another server, the warm-up command) keeps this gate's job queued until freed."""
    store = Store(1 << 20, str(tmp_path))
    other = store.slot(0)
    other.acquire()
    gate = Gate(slots=1, hold=Store(1 << 20, str(tmp_path)).slot)
    job = gate.submit("k", "demo", lambda report: 5)
    time.sleep(0.6)
    assert job.started is None and not job.done.is_set()
    assert gate.position(job)[0] == 1  # the other process's computation is ahead: the visitor sees "Queued"
    other.release()
    assert job.done.wait(60) and job.result == 5
    gate.leave(job)


def test_imported_objects_leave_the_collectors_full_passes_once_per_import():
    """`memory.freeze_imported_heap` (called after every script run) freezes only when a module was imported since."""
    import gc
    import sys

    from gradlab import memory

    memory.freeze_imported_heap()
    frozen = gc.get_freeze_count()
    garbage = [[] for _ in range(1000)]
    memory.freeze_imported_heap()  # nothing new imported: the new objects stay collectable
    assert gc.get_freeze_count() < frozen + len(garbage) // 2  # (frozen objects that die leave the count)
    sys.modules["gradlab_test_new_module"] = type(sys)("gradlab_test_new_module")
    try:
        memory.freeze_imported_heap()
        assert gc.get_freeze_count() > frozen + len(garbage) // 2
    finally:
        del sys.modules["gradlab_test_new_module"]
        gc.unfreeze()


def test_a_full_collection_frees_cycles_that_were_frozen_while_alive():
    """A session alive at a freeze and gone later leaves a reference cycle among frozen objects:
    `memory.collect_everything` (run when compiled programs are dropped) frees it, and the rest stays frozen."""
    import gc
    import weakref

    from gradlab import memory

    class Session:
        pass

    session = Session()
    session.me = session  # a cycle: reference counting alone never frees it
    alive = weakref.ref(session)
    gc.freeze()
    try:
        del session
        gc.collect()
        assert alive() is not None  # frozen: the ordinary collection does not reach it
        frozen = gc.get_freeze_count()
        memory.collect_everything()
        assert alive() is None
        assert gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()


def test_a_long_call_shows_progress_even_when_it_reports_none():
    """Issue 40: a served model's Influence ran 197 s behind a still bar. A nested gated call's progress moves the
    running computation's bar, and a computation that reports nothing shows its seconds and moves by its estimate."""
    from gradlab.store import Job
    from gradlab.ui.cache import CLOCK_AFTER_S, progress_view

    gate, seen, release = Gate(slots=1), [], threading.Event()

    def inner(report):
        report(0.5, "half of the inner work")
        release.wait(5)
        return 1

    job = gate.submit("outer", "outer", lambda report: gate.run("inner", "inner", inner))
    try:
        deadline = time.monotonic() + 5
        while job.fraction == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append((job.fraction, job.text))
    finally:
        release.set()
        gate.leave(job)
    job.done.wait(5)
    assert seen == [(0.5, "half of the inner work")] and job.result == 1

    silent = Job("k", "influence", lambda r: None, est_seconds=100.0, est_bytes=0, started=1000.0)
    assert progress_view(silent, "Scoring", 1000.0 + CLOCK_AFTER_S / 2) == (0.0, "Scoring…")  # a blink: no clock
    fraction, text = progress_view(silent, "Scoring", 1050.0)
    assert fraction == 0.5 and text == "Scoring… (50 s so far, about 100 s in all)"
    assert progress_view(silent, "Scoring", 1300.0) == (0.95, "Scoring… (300 s so far)")  # past its estimate
    silent.report(0.2, "test point 3 of 16")  # its own progress wins over the clock's
    assert progress_view(silent, "Scoring", 1050.0) == (0.2, "Scoring… test point 3 of 16 (50 s so far, about 100 s in all)")


def test_a_long_compile_returns_its_scratch_memory_before_its_program_runs(monkeypatch):
    """`memory.trim_after_compiles`: JAX's compile-duration event trims the heap (`malloc_trim`) after a compile of
    at least `TRIM_AFTER_COMPILE_S`, before the compiled program's first run; a shorter compile leaves it alone.

    The listener is fed JAX's event directly (it runs in the thread that records it), so the counts are this test's:
    in the suite a real compile may come with other compiles of the same or another thread (CI's stop 53 and a whole
    suite of session 44 saw two trims for one program). A real compile then shows that JAX records the event under
    the name listened to."""
    import jax
    import jax.numpy as jnp

    from gradlab import memory

    trims = []
    here = threading.get_ident()
    monkeypatch.setattr(memory, "_trim", lambda: trims.append(1) if threading.get_ident() == here else None)
    memory.trim_after_compiles()
    memory.trim_after_compiles()  # once per process: a second call adds no second listener
    jax.monitoring.record_event_duration_secs(memory.COMPILE_EVENT, memory.TRIM_AFTER_COMPILE_S)
    assert len(trims) == 1  # one listener, one trim
    jax.monitoring.record_event_duration_secs(memory.COMPILE_EVENT, memory.TRIM_AFTER_COMPILE_S / 2)  # a short compile
    jax.monitoring.record_event_duration_secs("/jax/core/compile/jaxpr_trace_duration", 10.0)  # not a compile
    assert len(trims) == 1
    x = jnp.arange(7.0).block_until_ready()
    monkeypatch.setattr(memory, "TRIM_AFTER_COMPILE_S", 0.0)
    fresh = float(time.time_ns() % 1_000_003)  # a program no persistent compile cache holds: it compiles here
    jax.jit(lambda x: jnp.sin(x) * 3.0 + fresh)(x).block_until_ready()
    assert len(trims) >= 2
