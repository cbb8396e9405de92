"""Home: what per-example gradients are, in one screen, and where to look next."""

import streamlit as st

from gradlab import equivalence, ui
from gradlab.ui import pages
from gradlab.ui.figures import plots
from gradlab.ui.presets import LECTURE, PRESETS

st.title("gradlab: per-example gradients, made visible")

left, right = st.columns([3, 2])
with left:
    st.markdown(
        """
Training uses **one** gradient: the gradient of the mean loss over a batch. Inside it hide **N**
gradients, one per training example, ∇θ ℓ(xᵢ, yᵢ). In JAX you get all of them with one line:
the loss of a *single* example, differentiated with `grad`, vectorized over the batch with `vmap`
(`params` is shared: `in_axes=None`; inputs and labels are mapped over their first axis: `0`).
"""
    )
    st.code("per_example_grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)", language="python", wrap_lines=True)
    # the picture: the seeds' two examples, computed live: one gradient each, and their sum is the batch's
    with ui.half_column():
        ui.chart(plots.scalar_gradients(*ui.shared(gated=False)(equivalence.scalar_gradients)()))
    st.markdown(
        """
It costs about as much as one batch gradient, not N of them. **Why people need it:**
- **DP-SGD**: clip each example's gradient to norm C before adding noise, so no example dominates.
- **Outlier and mislabel detection**: examples the model fights against have large gradients.
- **Influence**: the dot product of a training example's gradient with a test example's says
  whether that training example helped or hurt the prediction.

Every number in gradlab is computed live on a real model and dataset (digits from scikit-learn by
default) and checked in the test suite against an independent oracle: a Python loop of `jax.grad`,
float64, actual leave-one-out retraining, published privacy-accountant values.
The sidebar sets the experiment shared by every page; the URL keeps it, so a link reproduces it.
The **seeds** cited on the pages ("seed 000" to "seed 003") are the four public tutorials gradlab grew from:
JAX's per-example gradients (000), a lesson on a linear model with DP-SGD and influence (001), the
`vmap(grad).sum()` = `grad(sum)` identity (002), and PyTorch's per-sample gradients of a SimpleCNN (003).
"""
    )
with right:
    st.subheader("Pages")
    st.page_link("views/norms.py", label="**Gradient norms**: who pulls hardest; mislabels", icon=":material/bar_chart:")
    st.page_link("views/equivalence.py", label="**Equivalence**: sum of per-example = batch gradient", icon=":material/drag_handle:")
    st.page_link("views/performance.py", label="**Performance**: loop vs `vmap(grad)` vs batch", icon=":material/timer:")
    st.page_link("views/dp_clipping.py", label="**DP clipping**: clipping bias, DP-SGD, real ε", icon=":material/lock:")
    st.page_link("views/influence.py", label="**Influence**: who helped this prediction?", icon=":material/explore:")
    st.page_link("views/privacy_audit.py", label="**Privacy audit**: what ε means; audit DP-SGD, spot the bug", icon=":material/policy:")
    st.page_link("views/geometry.py", label="**Geometry**: every example's gradient is an arrow", icon=":material/call_split:")
    if "views/practice.py" in pages.BY_PATH:  # the page exists unless the server turned Practice off
        st.page_link("views/practice.py", label="**Practice**: write the seeds' code, checked against an oracle",
                     icon=":material/edit_note:")
    st.page_link("views/lecture.py", label="**Lecture**: the whole story, step by step", icon=":material/school:",
                 query_params={"step": "1"})

st.subheader("Lecture scenarios")
st.caption("One click sets the experiment and the page's controls and opens the page; the link in the sidebar shares it. "
           "Each scenario is also a step of the **Lecture**: the step link opens it inside the story, with Back and Next.")
ui.preset_picker(columns=3)

# the presets as entry points into the lecture's story
entries = {s.preset.name: i for i, s in enumerate(LECTURE, start=1)}
cols = st.columns(3)
for i, p in enumerate(PRESETS):
    if p.name in entries:
        cols[i % 3].page_link("views/lecture.py", label=f"Lecture step {entries[p.name]}: {p.name}",
                              icon=":material/school:", query_params={"step": str(entries[p.name])})
