"""Live lecture rooms: the speaker key moves a room, students' pages follow it, two servers share it."""

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


def test_the_warm_up_button_runs_the_fill_command_and_reports_progress(monkeypatch):
    """The button starts `python -m gradlab.ui.warm --fill --lecture` (here a stand-in printing its step lines)."""
    import subprocess
    import sys
    import time

    from gradlab.ui import room

    started = []
    real = subprocess.Popen

    def fake(cmd, **kwargs):
        started.append(cmd)
        return real([sys.executable, "-c", "print('step 1'); print('step 2')"], **kwargs)

    monkeypatch.setattr(room.subprocess, "Popen", fake)
    monkeypatch.setattr(room, "_WARMUP", {})
    at = lecture()
    at.button(key="lecture_warmup").click().run()
    assert started and started[0][-3:] == ["gradlab.ui.warm", "--fill", "--lecture"]
    time.sleep(2)
    at.run()
    assert_clean(at)
    assert any("Every step is ready" in s.value for s in at.success) or any("Warming up" in str(p.text) for p in at.get("progress"))


def test_opening_a_room_or_the_speaker_view_starts_the_warm_up_by_itself_once(monkeypatch):
    """No button to know about: the room's Open button (and a speaker view opened first) start the warm-up, once per
    server, and the lecturer sees its progress."""
    import subprocess
    import sys

    from gradlab.ui import room

    started = []
    real = subprocess.Popen

    def fake(cmd, **kwargs):
        started.append(cmd)
        return real([sys.executable, "-c", "import time; print('step 1', flush=True); time.sleep(30)"], **kwargs)

    monkeypatch.setattr(room.subprocess, "Popen", fake)
    monkeypatch.setattr(room, "_WARMUP", {})
    monkeypatch.setenv(room.AUTO_WARMUP_ENV, "1")
    at = lecture()
    assert not started  # the lecture alone starts nothing
    at.button(key="room_open").click().run()
    assert_clean(at)
    assert len(started) == 1 and started[0][-3:] == ["gradlab.ui.warm", "--fill", "--lecture"]
    assert any("Warming up" in str(p.text) for p in at.get("progress"))
    code, key = at.session_state["_room_opened"]
    speaker = lecture(room=code, _key=key, speaker="true")
    assert_clean(speaker)
    assert len(started) == 1  # one per server: the speaker view shows the same run's progress
    assert any("Warming up" in str(p.text) for p in speaker.get("progress"))
    room._WARMUP["proc"].kill()
    room._WARMUP["proc"].wait()


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
