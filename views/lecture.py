"""Lecture: an ordered story through per-example gradients. Each step is a full page view with every
control set (app.py applies the step in the URL before the sidebar is drawn), its narration, speaker
notes, and Back / Next."""

import streamlit as st

from gradlab import practice
from gradlab.ui import lecture as ui_lecture
from gradlab.ui import points as ui_points
from gradlab.ui import room as ui_room
from gradlab.ui.presets import LECTURE

n = len(LECTURE)
step = ui_lecture.requested_step(n)
s = LECTURE[step - 1]
if ui_room.speaker_view(LECTURE, step):
    st.stop()

ui_lecture.arrow_keys()  # first and the same on every step: its listener stays loaded from step to step
entering = ui_lecture.entering(step)  # a step other than the one last drawn in full here: nothing of it stays
status = None
try:
    # Entering a step, its first message to the browser replaces the whole step before (title, narration, figures) at
    # once; a block that began after the new title left the old figures under it for a moment (issue 41).
    with ui_lecture.fresh(entering):
        st.title(f"Lecture {step}/{n}: {s.title}")
        back, where, nxt = st.columns([1, 4, 1], vertical_alignment="center")
        back.button("Back", key="lecture_back", on_click=ui_room.go, args=(step - 1,), disabled=step == 1,
                    width="stretch")
        nxt.button("Next", key="lecture_next", on_click=ui_room.go, args=(step + 1,), disabled=step == n,
                   width="stretch", type="primary")
        where.progress(step / n, text=f"Step {step} of {n} · ← / → keys")
        ui_lecture.scroll_to_top_if_asked()
        ui_lecture.step_note()
        st.markdown(f"#### {s.narration}")
        status = st.empty()
        if entering:
            status.info(f"Computing step {step}…", icon=":material/hourglass_top:")
        if s.practice and practice.enabled():  # the students' turn: the problem where they write this step's code
            number = [p.slug for p in practice.PROBLEMS].index(s.practice) + 1
            with st.container(key=ui_lecture.TRY_IT_KEY):
                st.page_link("views/practice.py", label=f"Try it yourself: Practice problem {number}, "
                             f"{practice.BY_SLUG[s.practice].title}", icon=":material/edit_note:",
                             query_params={"problem": s.practice})
        ui_room.follow(step)
        # the step's own point first: the figure its narration is about, then the page
        with st.container(key=ui_lecture.PAGE_KEY), ui_points.slots(s.point):
            ui_lecture.test_delay(step)
            # notes never reach the projector (the speaker view holds them there) nor a student who follows a room
            if not ui_lecture.presenter_mode() and not ui_room.following():
                with st.expander("Speaker notes, live room and warm-up"):
                    st.markdown(s.notes)
                    ui_room.open_room_panel(step)
                    ui_room.warmup_panel(n)
                    st.markdown("**All steps** (each link opens that step with every control set):")
                    for i, t in enumerate(LECTURE, start=1):
                        st.page_link("views/lecture.py", label=f"{i}. {t.title}", query_params={"step": str(i)})
                st.divider()
            # the step's page, run here with the controls the step set
            ui_lecture.run_page(s.preset.page)
finally:
    if status is not None:
        status.empty()
    ui_lecture.drawn(step)
