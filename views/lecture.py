"""Lecture: an ordered story through per-example gradients. Each step is a full page view with every
control set (app.py applies the step in the URL before the sidebar is drawn), its narration, speaker
notes, and Back / Next."""

import runpy

import streamlit as st

from gradlab.ui import lecture as ui_lecture
from gradlab.presets import LECTURE

n = len(LECTURE)
step = ui_lecture.requested_step(n)
s = LECTURE[step - 1]

st.title(f"Lecture {step}/{n}: {s.title}")
back, where, nxt = st.columns([1, 4, 1], vertical_alignment="center")
back.button("Back", key="lecture_back", on_click=ui_lecture.go, args=(step - 1,), disabled=step == 1, width="stretch")
nxt.button("Next", key="lecture_next", on_click=ui_lecture.go, args=(step + 1,), disabled=step == n, width="stretch",
           type="primary")
where.progress(step / n, text=f"Step {step} of {n}")
st.markdown(f"#### {s.narration}")
with st.expander("Speaker notes"):
    st.markdown(s.notes)
    st.markdown("**All steps** (each link opens that step with every control set):")
    for i, t in enumerate(LECTURE, start=1):
        st.page_link("views/lecture.py", label=f"{i}. {t.title}", query_params={"step": str(i)})
st.divider()

# the step's page, run here with the controls the step set
runpy.run_path(s.preset.page, run_name="__main__")
