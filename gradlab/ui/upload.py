"""Your own data: the CSV uploader, and the upload this session holds.

The uploaded bytes live in this session's `st.session_state` only. Everything derived from them is
cached under the experiment `dataset="upload:<hash>"` (`gradlab.experiment.upload_name`: a hash of
the bytes, the label column and the task), so a result computed from an upload is only ever found
by a session that uploaded the same bytes with the same choices.
"""

from __future__ import annotations

import streamlit as st

from gradlab.data import CSV_MAX_FEATURES, CSV_MAX_ROWS, CSV_MIN_ROWS, DataError, load_csv
from gradlab.experiment import UPLOAD, Experiment, upload_name
from gradlab.sources import upload as upload_source
from gradlab.ui.widgets import inert

UPLOAD_LABEL = upload_source.Upload.label
_UPLOAD_STATE = "_upload"  # {"bytes", "file", "label", "task", "name"} or absent


def upload_controls() -> None:
    """Sidebar controls for "your own data": a CSV uploader, the label column and the task.

    Valid uploads are stored in this session only (`st.session_state`); a bad file shows what to fix.
    """

    file = st.file_uploader(
        "CSV file (header row, numeric features, one label column)", type=["csv"], key="upload_file",
        help=f"{CSV_MIN_ROWS}–{CSV_MAX_ROWS:,} rows, at most {CSV_MAX_FEATURES} feature columns, no missing values. "
             "It stays in your browser session: a shared link does not carry it.",
    )
    st.session_state.pop(_UPLOAD_ERROR, None)
    if file is None:
        st.session_state.pop(_UPLOAD_STATE, None)
        st.info("Upload a CSV to use your own data.", icon="📄")
        return
    raw = file.getvalue()
    try:
        table = upload_source.table(raw)  # parsed once per bytes: the pages' loads reuse it
    except DataError as err:
        _refuse(file.name, err)
        return
    columns = [str(c) for c in table.columns]
    label = st.selectbox("Label column", columns, index=len(columns) - 1, key="upload_label")
    task = st.radio("Task", ["classification", "regression"], key="upload_task", horizontal=True)
    try:
        load_csv(table, label, task)  # validate now, so the message sits next to the controls
    except DataError as err:
        _refuse(file.name, err)
        return
    st.session_state[_UPLOAD_STATE] = {"bytes": raw, "file": file.name, "label": label, "task": task,
                                       "name": upload_name(raw, label, task)}
    st.caption(f"{inert(file.name)}: {len(table):,} rows, {len(columns) - 1} features, label **{inert(label)}** ({task}).")


_UPLOAD_ERROR = "_upload_error"


def _refuse(name: str, err: DataError) -> None:
    """Forget the upload and say why, here (the sidebar) and in the main area (`require_upload`)."""
    st.session_state.pop(_UPLOAD_STATE, None)
    message = f"**This CSV cannot be used** ({inert(name)}). {inert(err)}"
    st.session_state[_UPLOAD_ERROR] = message
    st.error(message, icon="⚠️")


def uploaded() -> dict | None:
    """This session's validated upload (`bytes`, `file`, `label`, `task`, `name`), or None."""
    return st.session_state.get(_UPLOAD_STATE)


def upload_dataset() -> str:
    """The experiment's `dataset` for this session's upload: `"upload:<hash>"`, or `"upload"` if none."""
    up = uploaded()
    return up["name"] if up else UPLOAD


def require_upload(exp: Experiment) -> dict:
    """This session's upload for an upload experiment; stops the page with a hint when there is none
    (or when `exp` names other bytes than this session holds)."""
    up = uploaded()
    if up is None and _UPLOAD_ERROR in st.session_state:  # the file is there but unusable: say why, here too
        st.error(st.session_state[_UPLOAD_ERROR], icon="⚠️")
        st.stop()
    if up is None or up["name"] != exp.dataset:
        st.info(
            "This view uses **your own data**: upload a CSV in the sidebar. Uploaded data stays in the "
            "uploader's browser session, so a shared link cannot carry it.", icon="📄",
        )
        st.stop()
    return up
