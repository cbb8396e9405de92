"""Teaching live: a room that students' browsers follow, the speaker view that drives it, and the warm-up.

Three links per room (`gradlab.rooms`), all on the lecture page:
- students: `?room=<code>`: a "Follow the lecturer" toggle (on); every half second the page checks the room's
  step and moves there (the step's results come from the shared store: a room on one step is one
  computation). Turning it off detaches to explore; turning it on again jumps back to the lecturer.
- projector: `?room=<code>&_key=<key>&presenter=true`: follows the room, and its Back / Next move it.
- speaker: `?room=<code>&_key=<key>&speaker=true`: the notes, the next step, a timer, Back / Next.
The speaker key rides in `_key`, which the copy-link box never shows.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import threading
import time

import segno
import streamlit as st

from gradlab import rooms
from gradlab.ui import lecture as ui_lecture
from gradlab.ui import walk
from gradlab.ui.presets import LECTURE
from gradlab.ui.widgets import inert  # `?room=` is whatever a link says: shown as text

ROOM, KEY, SPEAKER = "room", "_key", "speaker"
FOLLOW = "_room_follow"
ROOMS = rooms.default_rooms()
_WARMUP: dict = {}  # the one warm-up of this server: {"thread", "done", "total", "failed", "error", "started", "ended"}


def code() -> str | None:
    """The room in the URL (`?room=`), if any."""
    return st.query_params.get(ROOM) or None


def may_drive() -> bool:
    """Whether this session holds the room's speaker key (its Back / Next move the room)."""
    return ROOMS.check(code(), st.query_params.get(KEY))


def go(step: int) -> None:
    """`on_click` of Back / Next in a room: apply `step` here, and move the room when this session drives it. A student
    who follows the lecturer stays where the lecturer is, and is told why (and how to explore)."""
    if following():
        st.toast("Following the lecturer: turn off **Follow the lecturer** to explore on your own.",
                 icon=":material/groups:")
        return
    if code() and st.query_params.get(KEY):
        ROOMS.move(code(), st.query_params.get(KEY), step)
    ui_lecture.go(step)


def following() -> bool:
    """Whether this session is a student's page that follows an open room (no speaker key, the toggle on)."""
    c = code()
    return bool(c and not st.query_params.get(KEY) and st.session_state.get(FOLLOW, True) and ROOMS.get(c) is not None)


#: Seconds a following student's page waits for its turn (`in_turn`) before it runs anyway.
TURN_WAIT_S = 5.0
_TURN = threading.Lock()


@contextlib.contextmanager
def in_turn(url_path: str):
    """Run a following student's lecture page one at a time in this server (FIFO-ish, a lock); any other run at once.

    When the lecturer moves, every follower's page reruns within the same second. Python runs their threads in turns
    of 5 ms, so all 30 ended together, ~30 runs later, and the server's event loop, which sends the pages, got one
    turn in 31. One at a time, the first students see the step after one run and the last no later than before
    (`benchmarks/crowd.py` scenario 5). A run that waits `TURN_WAIT_S` goes on without its turn."""
    if url_path != "lecture" or not following():
        yield
        return
    mine = _TURN.acquire(timeout=TURN_WAIT_S)
    try:
        yield
    finally:
        if mine:
            _TURN.release()


def follow(step: int) -> None:
    """For a student in a room: the follow toggle, and (when on) a check every `FOLLOW_POLL_S` that moves to the room's
    step."""
    c = code()
    if not c:
        return
    room = ROOMS.get(c)
    if room is None:
        st.warning(f"There is no lecture room **{inert(c)}** on this server (it may have ended). The lecture works on "
                   "its own: use Back and Next.", icon=":material/meeting_room:")
        return
    if st.query_params.get(KEY):
        _watch(c, step)  # the projector follows the speaker view
        return
    if st.toggle(f"Follow the lecturer (room {inert(c)})", value=True, key=FOLLOW,
                 help="On: this page moves with the lecturer's steps. Off: explore on your own; on again jumps back."):
        _watch(c, step)


#: Seconds between a following student's checks of the room's step. 30 followers of step 11 (`benchmarks/crowd.py`
#: scenario 5 `--as-given`, warm store, quiet): at 1 s the last saw the new step's chart 1.5–1.6 s after the
#: lecturer's Next (median 1.2) and their checks cost the server 0.08–0.09 CPU-s per second; at 0.5 s, 1.1–1.2 s
#: (median 0.7) for 0.18–0.21 CPU-s per second (benchmarks/RESULTS.md, issue 41, session 42).
FOLLOW_POLL_S = 0.5


@st.fragment(run_every=FOLLOW_POLL_S)
def _watch(c: str, step: int) -> None:
    room = ROOMS.get(c)
    if room is not None and room.step != step:
        st.query_params[ui_lecture.STEP] = str(room.step)
        st.rerun()


def open_room_panel(step: int) -> None:
    """A button that opens a room on `step`, then its links: the students' (a link, a copy box, a short form and a QR
    code for a room of 30), the projector's (or this tab becomes the projector) and the speaker view's."""
    if st.button("Open a room for a live lecture", key="room_open",
                 help="Students open one link and their page follows your steps; every step is warmed up for you."):
        st.session_state["_room_opened"] = ROOMS.open(step)
        start_warmup()  # every step computed before the lecturer reaches it
    opened = st.session_state.get("_room_opened")
    if not opened:
        return
    c, key = opened
    base = (st.context.url or "").split("?")[0]
    students = f"{base}?room={c}"
    short = re.sub(r"^https?://", "", students)
    text, qr = st.columns([3, 1])
    with text:
        st.markdown(f"**Room {c}**. Students open [{short}]({students}) (copy it below, or scan the code):")
        st.code(students, language=None, wrap_lines=True)  # Streamlit's copy button sits in its corner
        st.button("Make this tab the projector", key="room_projector", on_click=_become_projector, args=(c, key),
                  help="This tab follows the room in presenter mode; its Back / Next (and arrow keys) move the room.")
        st.markdown("Projector in another tab or machine (follows you, its Next moves the room):")
        st.code(f"{base}?room={c}&_key={key}&presenter=true", language=None, wrap_lines=True)
        st.markdown("Speaker view (notes, next step, timer; keep it to yourself):")
        st.code(f"{base}?room={c}&_key={key}&speaker=true", language=None, wrap_lines=True)
    with qr:
        st.image(qr_png(students), caption=f"Room {c}", width="stretch")


def qr_png(url: str) -> bytes:
    """A QR code of `url` as PNG bytes (segno: pure Python, nothing fetched at run time)."""
    buffer = io.BytesIO()
    segno.make(url, error="m").save(buffer, kind="png", scale=8, border=2)
    return buffer.getvalue()


def _become_projector(c: str, key: str) -> None:
    """`on_click`: this tab becomes the room's projector (its key in the URL, presenter mode on)."""
    st.query_params[ROOM] = c
    st.query_params[KEY] = key
    st.session_state[ui_lecture.PRESENTER] = True
    ui_lecture.scroll_to_top_next_run()


def speaker_view(lecture, step: int) -> bool:
    """With `?speaker=true` and a valid key: the speaker view (notes, next step, timer, Back / Next) instead of
    the step's page. **Returns** whether it was drawn (the caller then stops)."""
    if st.query_params.get(SPEAKER, "").lower() != "true":
        return False
    c = code()
    room = ROOMS.get(c) if c else None
    if room is None or not may_drive():
        st.error("This speaker link has no open room or a wrong key: open a room from the lecture's speaker notes.")
        return True
    n, s = len(lecture), lecture[step - 1]
    st.caption(f"Speaker view · room **{inert(c)}** · students open `?room={c}` on the lecture page")
    start_warmup()  # a lecturer who opens the speaker view first gets every step warmed up too
    _watch(c, step)  # a projector's Next moves the room: follow it here too
    _timer(c)
    back, nxt = st.columns(2)
    back.button("Back", key="speaker_back", on_click=go, args=(step - 1,), disabled=step == 1, width="stretch")
    nxt.button("Next", key="speaker_next", on_click=go, args=(step + 1,), disabled=step == n, width="stretch",
               type="primary")
    ui_lecture.arrow_keys()
    st.subheader(f"Now: {step}. {s.title}")
    st.markdown(f"*{s.narration}*")
    st.markdown(s.notes)
    if step < n:
        st.subheader(f"Next: {step + 1}. {lecture[step].title}")
        st.markdown(f"*{lecture[step].narration}*")
    warmup_panel(len(lecture))
    return True


@st.fragment(run_every=1.0)
def _timer(c: str) -> None:
    room = ROOMS.get(c)
    if room is None:
        return
    now = time.time()
    total, here = int(now - room.opened), int(now - room.moved)
    st.markdown(f"⏱ **{total // 60}:{total % 60:02d}** since the room opened · **{here // 60}:{here % 60:02d}** on this step")


def warmup_panel(n_steps: int) -> None:
    """A button that computes every lecture step into the shared store (`start_warmup`: a walk over the steps inside
    this server, one per server), and its progress; afterwards every Next answers from the store."""
    if _WARMUP:
        _warmup_progress(n_steps)  # the button greys while the walk runs and comes back when it ends
    else:
        _warmup_button(n_steps, running=False)


def _warmup_button(n_steps: int, *, running: bool) -> None:
    st.button("Warm up every step", key="lecture_warmup", disabled=running, on_click=start_warmup, args=(n_steps,),
              kwargs={"again": True}, help="Computes what each step shows into the shared store, so every Next answers "
                                           "at once. Opening a room or the speaker view starts it by itself.")


#: `GRADLAB_AUTO_WARMUP=0`: opening a room or the speaker view does not start the warm-up (the tests set it; the button
#: still does).
AUTO_WARMUP_ENV = "GRADLAB_AUTO_WARMUP"


def start_warmup(n_steps: int | None = None, *, again: bool = False) -> bool:
    """Start the walk over every lecture step in this server (`walk.walk_lecture`, one per server, in a thread) unless
    one runs or, without `again`, one already ran or `GRADLAB_AUTO_WARMUP=0`. **Returns** whether it started one. Its
    progress: `warmup_panel`."""
    thread = _WARMUP.get("thread")
    if thread is not None and (thread.is_alive() or not again):
        return False
    if not again and os.environ.get(AUTO_WARMUP_ENV, "1") == "0":
        return False
    total = n_steps or len(LECTURE)
    _WARMUP.update(done=0, total=total, failed=[], error=None, started=time.time(), ended=None)
    _WARMUP["thread"] = threading.Thread(target=_walk, args=(total, walk.server_url()), name="gradlab-warmup",
                                         daemon=True)
    _WARMUP["thread"].start()
    return True


def _walk(total: int, url: str) -> None:
    """The warm-up thread: every step, then the time it took; an unreachable server ends it with its error."""
    def done(step: int, errors: list[str]) -> None:
        _WARMUP["done"] = step
        if errors:
            _WARMUP["failed"].append(step)

    try:
        walk.walk_lecture(range(1, total + 1), url=url, done=done)
    except Exception as err:  # noqa: BLE001 - shown to the lecturer; the lecture works without the warm-up
        _WARMUP["error"] = f"{type(err).__name__}: {err}"
    _WARMUP["ended"] = time.time()


@st.fragment(run_every=1.0)
def _warmup_progress(n_steps: int) -> None:
    thread = _WARMUP.get("thread")
    _warmup_button(n_steps, running=thread is not None and thread.is_alive())
    if _WARMUP["ended"] is None:
        st.progress(min(_WARMUP["done"] / _WARMUP["total"], 1.0),
                    text=f"Warming up: {_WARMUP['done']} of {_WARMUP['total']} steps ready")
    elif _WARMUP["error"] is None and not _WARMUP["failed"]:
        st.success(f"Every step is ready ({_WARMUP['ended'] - _WARMUP['started']:.0f} s): each Next answers from the store.")
    else:
        what = (f"steps {', '.join(map(str, _WARMUP['failed']))} showed an error" if _WARMUP["failed"]
                else f"it stopped: {inert(_WARMUP['error'])}")
        st.error(f"The warm-up did not finish ({what}); the lecture still works (each step computes when opened).")
