"""Live lecture rooms: the speaker key moves a room, students' pages follow it, two servers share it."""

import threading

import pytest

from conftest import assert_clean

from gradlab.rooms import Rooms


def test_a_room_moves_only_with_its_key_and_two_servers_see_the_same_step(tmp_path):
    here, there = Rooms(str(tmp_path)), Rooms(str(tmp_path))  # two server processes sharing the directory
    code, key = here.open(step=3)
    assert len(code) == 5 and there.get(code).step == 3
    assert not there.move(code, "not-the-key", 5) and there.get(code).step == 3
    assert there.move(code, key, 5) and here.get(code).step == 5
    assert here.get("nope") is None and not here.check(code, "")


def lecture(**params):
    from conftest import ROOT
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    for k, v in params.items():
        at.query_params[k] = v
    at.switch_page("views/lecture.py")
    return at.run()


def test_students_follow_the_speaker_views_next_and_may_detach():
    from gradlab.ui import room

    code, key = room.ROOMS.open(step=1)
    student = lecture(room=code)
    assert_clean(student)
    assert student.title[0].value.startswith("Lecture 1/")
    assert "Speaker notes, live room and warm-up" not in [e.label for e in student.expander]  # the lecturer's, not theirs
    speaker = lecture(room=code, _key=key, speaker="true")
    assert_clean(speaker)
    assert any(s.value.startswith("Now: 1.") for s in speaker.subheader)
    speaker.button(key="speaker_next").click().run()
    assert room.ROOMS.get(code).step == 2
    student.run()  # its once-a-second check, run here by a rerun
    assert_clean(student)
    assert student.title[0].value.startswith("Lecture 2/"), student.title[0].value
    student.toggle(key=room.FOLLOW).set_value(False).run()
    room.ROOMS.move(code, key, 3)
    student.run()
    assert student.title[0].value.startswith("Lecture 2/")  # detached: stays
    wrong = lecture(room=code, _key="guess", speaker="true")
    assert any("wrong key" in e.value for e in wrong.error)


def test_a_rooms_followers_pages_run_one_at_a_time_and_no_one_else_waits(monkeypatch):
    """When the lecturer moves, 30 followers' pages rerun at once; run one at a time, the first see the step after one
    run instead of all after 30 (`benchmarks/crowd.py` scenario 5). A page that is not a follower's never waits, and a
    follower waits at most `TURN_WAIT_S`."""
    import threading
    import time

    from gradlab.ui import room

    monkeypatch.setattr(room, "following", lambda: True)
    inside, release, order = threading.Event(), threading.Event(), []

    def first():
        with room.in_turn("lecture"):
            inside.set()
            release.wait(60)
            time.sleep(0.2)  # without the turns, the second follower would be in by now
            order.append("first out")

    t = threading.Thread(target=first)
    t.start()
    inside.wait(60)
    with room.in_turn("norms"):  # another page: at once
        order.append("norms")
    release.set()
    with room.in_turn("lecture"):  # the next follower: after the first
        order.append("second")
    t.join()
    assert order == ["norms", "first out", "second"]

    monkeypatch.setattr(room, "TURN_WAIT_S", 0.2)
    room._TURN.acquire()  # a follower's run that never ends
    try:
        with room.in_turn("lecture"):  # waits its TURN_WAIT_S, then runs anyway
            order.append("without its turn")
        assert room._TURN.locked()  # and leaves the lock it never held alone
        monkeypatch.setattr(room, "TURN_WAIT_S", 600.0)
        monkeypatch.setattr(room, "following", lambda: False)
        lecturer = threading.Thread(target=lambda: room.in_turn("lecture").__enter__())
        lecturer.start()  # the lecturer's own page, or a detached student's: never waits for a follower
        lecturer.join(60)
        assert not lecturer.is_alive()
    finally:
        room._TURN.release()
    assert order[-1] == "without its turn"


def _fake_walk(monkeypatch, hold=None) -> list:
    """`walk.walk_lecture` replaced by a stand-in that reports steps 1 and 2 (then waits for the event `hold`, if
    given); **returns** the list of its calls' `(steps, url)`. The real walk needs a server:
    `test_the_warm_up_walks_a_step_in_the_server_with_its_heavy_sections_pressed`."""
    from gradlab.ui import room

    calls = []

    def fake(steps, *, url, done):
        calls.append((list(steps), url))
        done(1, [])
        done(2, [])
        if hold is not None:
            hold.wait(60)

    monkeypatch.setattr(room.walk, "walk_lecture", fake)
    monkeypatch.setattr(room, "_WARMUP", {})
    return calls


def test_the_warm_up_button_walks_the_steps_in_this_server_and_reports_progress(monkeypatch):
    """The button starts the walk over every step in this process (a thread; here a stand-in), against this server's
    own websocket, and reports its end."""
    from gradlab.ui import room

    calls = _fake_walk(monkeypatch)
    at = lecture()
    at.button(key="lecture_warmup").click().run()
    assert len(calls) == 1 and calls[0][1].endswith("/_stcore/stream") and calls[0][1].startswith("ws://")
    room._WARMUP["thread"].join(10)
    at.run()
    assert_clean(at)
    assert any("Every step is ready" in s.value for s in at.success)


def test_opening_a_room_or_the_speaker_view_starts_the_warm_up_by_itself_once(monkeypatch):
    """No button to know about: the room's Open button (and a speaker view opened first) start the warm-up, once per
    server, and the lecturer sees its progress."""
    from gradlab.ui import room

    hold = threading.Event()
    calls = _fake_walk(monkeypatch, hold)
    monkeypatch.setenv(room.AUTO_WARMUP_ENV, "1")
    at = lecture()
    assert not calls  # the lecture alone starts nothing
    at.button(key="room_open").click().run()
    assert_clean(at)
    assert len(calls) == 1
    assert any("Warming up: 2 of" in str(p.text) for p in at.get("progress"))
    assert at.button(key="lecture_warmup").disabled  # greyed while the walk runs (it sits in the progress fragment)
    code, key = at.session_state["_room_opened"]
    speaker = lecture(room=code, _key=key, speaker="true")
    assert_clean(speaker)
    assert len(calls) == 1  # one per server: the speaker view shows the same run's progress
    assert any("Warming up" in str(p.text) for p in speaker.get("progress"))
    hold.set()
    room._WARMUP["thread"].join(10)
    at.run()
    assert not at.button(key="lecture_warmup").disabled  # and may be pressed again once it ended


def test_a_warm_up_that_cannot_reach_the_server_says_so_and_the_lecture_goes_on(monkeypatch):
    from gradlab.ui import room

    def unreachable(steps, *, url, done):
        raise ConnectionRefusedError(111, "Connect call failed")

    monkeypatch.setattr(room.walk, "walk_lecture", unreachable)
    monkeypatch.setattr(room, "_WARMUP", {})
    at = lecture()
    at.button(key="lecture_warmup").click().run()
    room._WARMUP["thread"].join(10)
    at.run()
    assert_clean(at)
    assert any("did not finish" in e.value and "ConnectionRefusedError" in e.value for e in at.error)
    assert at.title[0].value.startswith("Lecture 1/")


def test_a_room_gives_a_link_a_copy_box_a_qr_code_and_this_tab_can_become_the_projector():
    from gradlab.ui import room

    at = lecture()
    at.button(key="room_open").click().run()
    assert_clean(at)
    code, key = at.session_state["_room_opened"]
    boxes = [c.value for c in at.code]
    assert any(b.endswith(f"?room={code}") for b in boxes), boxes  # the students' link in a box with a copy button
    assert any(f"[" in m.value and f"?room={code})" in m.value for m in at.markdown)  # and as a real link
    assert at.get("image")  # the QR code
    png = room.qr_png(f"http://example.org/lecture?room={code}")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at.button(key="room_projector").click().run()
    assert_clean(at)
    assert at.query_params["room"] in (code, [code]) and at.query_params["_key"] in (key, [key])
    assert at.toggle(key="presenter").value is True


def test_a_following_students_next_stays_with_the_lecturer_and_says_why():
    from gradlab.ui import room

    code, key = room.ROOMS.open(step=3)
    student = lecture(room=code)
    assert student.title[0].value.startswith("Lecture 3/")
    student.button(key="lecture_next").click().run()
    assert_clean(student)
    assert student.title[0].value.startswith("Lecture 3/")
    assert any("Following the lecturer" in t.value for t in student.toast)
    student.toggle(key=room.FOLLOW).set_value(False).run()  # detached: Next explores
    student.button(key="lecture_next").click().run()
    assert student.title[0].value.startswith("Lecture 4/")


async def _buttons(url: str, query: str) -> list[str]:
    """The labels of the buttons a new visitor of the lecture with `query` is shown (Streamlit's websocket protocol)."""
    import websockets
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    msg = BackMsg()
    msg.rerun_script.query_string, msg.rerun_script.page_name = query, "lecture"
    labels = []
    async with websockets.connect(url, subprotocols=["streamlit"], max_size=None, ping_interval=None) as ws:
        await ws.send(msg.SerializeToString())
        while True:
            fm = ForwardMsg()
            fm.ParseFromString(await ws.recv())
            if fm.WhichOneof("type") == "delta" and fm.delta.new_element.WhichOneof("type") == "button":
                labels.append(fm.delta.new_element.button.label)
            elif fm.WhichOneof("type") == "script_finished" and fm.script_finished == ForwardMsg.FINISHED_SUCCESSFULLY:
                return labels


@pytest.mark.slow
def test_the_warm_up_walks_a_step_in_the_server_with_its_heavy_sections_pressed(tmp_path):
    """The real walk against a real server: step 11 (DP-SGD and its ε) shows the button of its heavy section ("Train
    private and non-private models") until the walk, with the server's token, has run the step; a link with another
    token presses nothing."""
    import asyncio

    from benchmarks.browser import streamlit_server
    from benchmarks.crowd import ws_url

    from gradlab.ui import walk

    env = {"GRADLAB_WARM_TOKEN": "the-servers-own", "GRADLAB_STORE_DIR": str(tmp_path)}
    with streamlit_server(env=env, timeout=180) as (base, _):
        url = ws_url(base)
        heavy = lambda labels: [b for b in labels if b.startswith("Train private and non-private")]  # noqa: E731
        assert heavy(asyncio.run(_buttons(url, "step=11")))
        assert heavy(asyncio.run(_buttons(url, f"step=11&{walk.PARAM}=a-guess")))  # a shared link presses nothing
        done = []
        walk.walk_lecture([11], url=url, token="the-servers-own", done=lambda step, errors: done.append((step, errors)))
        assert done == [(11, [])]
        assert not heavy(asyncio.run(_buttons(url, "step=11")))  # trained and stored: the next visitor sees the result


def test_a_link_with_a_guessed_or_odd_warm_up_token_presses_nothing():
    """`?_warm=` is the walk's secret: a link holding any other value (non-ASCII included) opens the step as a plain
    visitor, its heavy section behind its button."""
    for guess in ("a-guess", "é∇"):
        at = lecture(step="9", _warm=guess)
        assert_clean(at)
        assert any(b.label.startswith("Train private and non-private") for b in at.button), [b.label for b in at.button]
