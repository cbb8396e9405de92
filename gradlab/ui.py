"""The Streamlit glue: experiment sidebar bound to the URL, caches, progress, errors, code panels.

Pages import this and the library; they hold no JAX math. Caches are keyed on the hashable
`Experiment` (never on JAX arrays). Heavy results are shared across sessions (`st.cache_*`): they
are immutable arrays, safe to share.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import logging
import os
import threading
from collections import OrderedDict

import streamlit as st

from gradlab.data import DATASETS, DataError, load_csv, read_csv
from gradlab.experiment import Experiment, Fitted, fit
from gradlab.models import ACTIVATIONS, MODELS
from gradlab.train import OPTIMIZERS

log = logging.getLogger("gradlab")

LEARNING_RATES = [0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0]
STEPS = [0, 25, 50, 100, 200, 300, 500, 1000, 2000]
DEFAULT = Experiment()


def _widget(kind, label, key, **kwargs):
    """A sidebar widget whose value lives in the URL (`bind="query-params"`, key = param name)."""
    return kind(label, key=key, bind="query-params", **kwargs)


def experiment_sidebar() -> Experiment:
    """Render the shared experiment controls in the sidebar and return the current `Experiment`.

    Every control is bound to a URL query parameter named after its field, so a shared link
    reproduces the experiment.
    """
    d = DEFAULT
    sb = st.sidebar
    follow_preset()
    banner = sb.container()
    with sb:
        st.header("Experiment")
        # Bound selectboxes put the *displayed* option into the URL, so options are the short names
        # (links read ?dataset=moons) and the long description is the caption below.
        dataset = _widget(st.selectbox, "Dataset", "dataset", options=[*DATASETS, UPLOAD], index=0)
        st.caption(_dataset_label(dataset))
        if dataset == UPLOAD:
            upload_controls()
        model = _widget(st.selectbox, "Model", "model", options=list(MODELS), index=list(MODELS).index(d.model),
                        help=" · ".join(f"**{k}**: {v}" for k, v in MODELS.items()))
        if model == "mlp":
            _widget(st.select_slider, "Hidden width", "width", options=[8, 16, 32, 64, 128, 256, 512], value=d.width)
            _widget(st.slider, "Hidden layers", "depth", min_value=1, max_value=4, value=d.depth)
        if model in ("mlp", "cnn"):
            _widget(st.selectbox, "Activation", "activation", options=list(ACTIVATIONS), index=0)
        _widget(st.select_slider, "Training steps", "steps", options=STEPS, value=d.steps)
        _widget(st.select_slider, "Learning rate", "lr", options=LEARNING_RATES, value=d.lr, format_func=lambda v: f"{v:g}")
        _widget(
            st.slider, "Label noise (fraction of training labels flipped)", "label_noise",
            min_value=0.0, max_value=1.0, value=d.label_noise, step=0.05,
            help="Flipped examples are remembered, so the pages can show how well a score finds them.",
        )
        _widget(st.number_input, "Seed", "seed", min_value=0, max_value=10_000, value=d.seed, step=1)
        with st.expander("Advanced"):
            _widget(st.selectbox, "Optimizer (optax)", "optimizer", options=list(OPTIMIZERS),
                                help=" · ".join(f"**{k}**: {v}" for k, v in OPTIMIZERS.items()))
            _widget(st.select_slider, "Batch size", "batch_size", options=[16, 32, 64, 128, 256, 512, 2048], value=d.batch_size)
            _widget(st.select_slider, "L2 penalty λ", "l2", options=[0.0, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1], value=d.l2, format_func=lambda v: f"{v:g}")
            _widget(st.select_slider, "Checkpoint every k steps", "checkpoint_every", options=[10, 25, 50, 100, 250, 500], value=d.checkpoint_every)
    exp = experiment_from_state(st.session_state)
    with banner:
        preset_banner(exp)
    return exp


def experiment() -> Experiment:
    """The experiment the sidebar set on this run (app.py renders the sidebar before the page).

    Read from the sidebar's widget keys in session state: one definition for the sidebar and the pages.
    """
    return experiment_from_state(st.session_state)


def experiment_from_state(state) -> Experiment:
    """The `Experiment` that the sidebar's widget keys in `state` (a mapping) describe; defaults elsewhere."""
    d = DEFAULT
    get = lambda key, default: state[key] if key in state else default  # noqa: E731
    model = get("model", d.model)
    return Experiment(
        dataset=get("dataset", d.dataset), model=model,
        width=int(get("width", d.width)) if model == "mlp" else d.width,
        depth=int(get("depth", d.depth)) if model == "mlp" else d.depth,
        activation=get("activation", d.activation) if model in ("mlp", "cnn") else d.activation,
        optimizer=get("optimizer", d.optimizer), lr=float(get("lr", d.lr)), steps=int(get("steps", d.steps)),
        batch_size=int(get("batch_size", d.batch_size)), l2=float(get("l2", d.l2)),
        label_noise=float(get("label_noise", d.label_noise)), seed=int(get("seed", d.seed)),
        checkpoint_every=int(get("checkpoint_every", d.checkpoint_every)),
    )


# ---------------------------------------------------------------- trained models, shared LRU

_FIT_LOCK = threading.Lock()


@st.cache_resource
def _fitted_store() -> OrderedDict:
    """Process-wide LRU of trained experiments (immutable: safe to share across sessions)."""
    return OrderedDict()


FIT_CACHE_SIZE = 4


def fitted(exp: Experiment) -> Fitted:
    """The trained experiment, from the shared cache or trained now with a progress bar.

    A bad setting shows a clear message and stops this page (the sidebar keeps working).
    Uploaded data (`exp.dataset == "upload"`) is trained and kept in this session only.
    """
    if exp.dataset == UPLOAD:
        return _fitted_upload(exp)
    store = _fitted_store()
    with _FIT_LOCK:
        if exp in store:
            store.move_to_end(exp)
            return store[exp]
    bar = st.progress(0.0, text="Training…")

    def progress(step, steps):
        bar.progress(step / max(steps, 1), text=f"Training: step {step} of {steps}")

    with guard("Training failed", stop=True):
        result = fit(exp, progress=progress)
    release_memory()
    bar.empty()
    with _FIT_LOCK:
        store[exp] = result
        while len(store) > FIT_CACHE_SIZE:
            store.popitem(last=False)
    return result


def cached(fn=None, *, max_entries: int = 16):
    """Cache `fn(exp, *args)` across sessions on its hashable arguments (`st.cache_data`).

    Use for per-page computations that return NumPy arrays or plain data.
    """
    if fn is None:
        return functools.partial(cached, max_entries=max_entries)
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        # Results derived from an uploaded CSV never enter the cross-session cache.
        if any(_from_upload(v) for v in (*args, *kwargs.values())):
            return _session_cached(fn, signature, max_entries, args, kwargs)
        return shared(*args, **kwargs)

    @functools.wraps(fn)
    def computed(*args, **kwargs):  # runs on a cache miss only
        result = fn(*args, **kwargs)
        release_memory()  # hand XLA's scratch memory back after a real computation
        return result

    shared = st.cache_data(max_entries=max_entries, show_spinner=False)(computed)

    wrapper.clear = shared.clear
    return wrapper


# ---------------------------------------------------------------- errors, code, small widgets


@contextlib.contextmanager
def guard(what: str = "This part of the page could not be computed", *, stop: bool = False):
    """Show an exception as a clear message instead of a traceback.

    `ValueError` carries our own messages (bad settings, diverged runs) and is shown as is;
    anything else is logged and shown briefly. With `stop=True` the page stops after the message.
    """
    try:
        yield
    except ValueError as err:
        st.error(f"**{what}.** {err}", icon="⚠️")
        if stop:
            st.stop()
    except Exception as err:  # noqa: BLE001 - a user must never see a raw traceback
        log.exception(what)
        st.error(f"**{what}.** Unexpected {type(err).__name__}: {err}", icon="⚠️")
        if stop:
            st.stop()


def code_panel(code: str, title: str = "The exact JAX code behind these numbers") -> None:
    """An expander with the code that produced the page's numbers."""
    with st.expander(title):
        st.code(code.strip(), language="python")


def checkpoint_picker(f: Fitted, key: str = "checkpoint") -> int:
    """Select a checkpoint by training step (default: the last). Returns its index."""
    steps = list(f.run.steps)
    step = st.select_slider(
        "Checkpoint (training step)", options=steps, value=steps[-1], key=key, bind="query-params",
        help="The model as it was after this many training steps.",
    )
    return steps.index(step)


# ---------------------------------------------------------------- your own data: per-session only
#
# An uploaded CSV, everything trained on it and every page result derived from it live in this
# user's `st.session_state`, never in `st.cache_*` (which every session of the server shares).
# The shared caches are keyed on `Experiment`, and `Experiment(dataset="upload")` is the same key
# for every user, so `fitted` and `cached` route upload-derived calls to per-session stores keyed
# by a token of this session's upload (its bytes, label column and task).

UPLOAD = "upload"
UPLOAD_LABEL = "Your own data (CSV upload)"
_UPLOAD_STATE = "_upload"          # {"bytes", "file", "label", "task", "token"} or absent
_UPLOAD_FITTED = "_upload_fitted"  # OrderedDict[(Experiment, token)] -> Fitted
_UPLOAD_CACHE = "_upload_cache"    # OrderedDict[(function, token, args)] -> result
UPLOAD_FIT_CACHE_SIZE = 2


def _dataset_label(name: str) -> str:
    return UPLOAD_LABEL if name == UPLOAD else DATASETS.get(name, name)


def upload_controls() -> None:
    """Sidebar controls for "your own data": a CSV uploader, the label column and the task.

    Valid uploads are stored in this session only (`st.session_state`); a bad file shows what to fix.
    """
    from gradlab.data import CSV_MAX_FEATURES, CSV_MAX_ROWS, CSV_MIN_ROWS

    file = st.file_uploader(
        "CSV file (header row, numeric features, one label column)", type=["csv"], key="upload_file",
        help=f"{CSV_MIN_ROWS}–{CSV_MAX_ROWS:,} rows, at most {CSV_MAX_FEATURES} feature columns, no missing values. "
             "It stays in your browser session: a shared link does not carry it.",
    )
    if file is None:
        st.session_state.pop(_UPLOAD_STATE, None)
        st.info("Upload a CSV to use your own data.", icon="📄")
        return
    raw = file.getvalue()
    try:
        table = read_csv(raw)
    except DataError as err:
        st.session_state.pop(_UPLOAD_STATE, None)
        st.error(f"**This CSV cannot be used.** {err}", icon="⚠️")
        return
    columns = [str(c) for c in table.columns]
    label = st.selectbox("Label column", columns, index=len(columns) - 1, key="upload_label")
    task = st.radio("Task", ["classification", "regression"], key="upload_task", horizontal=True)
    try:
        load_csv(raw, label, task)  # validate now, so the message sits next to the controls
    except DataError as err:
        st.session_state.pop(_UPLOAD_STATE, None)
        st.error(f"**This CSV cannot be used.** {err}", icon="⚠️")
        return
    token = hashlib.sha256(raw + b"\0" + label.encode() + b"\0" + task.encode()).hexdigest()[:16]
    st.session_state[_UPLOAD_STATE] = {"bytes": raw, "file": file.name, "label": label, "task": task, "token": token}
    st.caption(f"{file.name}: {len(table):,} rows, {len(columns) - 1} features, label **{label}** ({task}).")


def uploaded() -> dict | None:
    """This session's validated upload (`bytes`, `file`, `label`, `task`, `token`), or None."""
    return st.session_state.get(_UPLOAD_STATE)


def _from_upload(value) -> bool:
    """Whether a cache argument is derived from uploaded data (an upload Experiment or its Fitted)."""
    exp = value.experiment if isinstance(value, Fitted) else value
    return isinstance(exp, Experiment) and exp.dataset == UPLOAD


def _upload_token() -> str:
    up = uploaded()
    return up["token"] if up else "none"


def _fitted_upload(exp: Experiment) -> Fitted:
    """Train on this session's uploaded CSV (kept in `st.session_state`, never in a shared cache)."""
    up = uploaded()
    if up is None:
        st.info(
            "This view uses **your own data**: upload a CSV in the sidebar. Uploaded data stays in the "
            "uploader's browser session, so a shared link cannot carry it.", icon="📄",
        )
        st.stop()
    store = st.session_state.setdefault(_UPLOAD_FITTED, OrderedDict())
    key = (exp, up["token"])
    if key in store:
        store.move_to_end(key)
        return store[key]
    with guard("Your CSV cannot be used with these settings", stop=True):
        data = load_csv(up["bytes"], up["label"], up["task"], seed=exp.seed, label_noise=exp.label_noise,
                        test_fraction=exp.test_fraction)
    bar = st.progress(0.0, text="Training on your data…")

    def progress(step, steps):
        bar.progress(step / max(steps, 1), text=f"Training on your data: step {step} of {steps}")

    with guard("Training failed", stop=True):
        result = fit(exp, data=data, progress=progress)
    bar.empty()
    store[key] = result
    while len(store) > UPLOAD_FIT_CACHE_SIZE:
        store.popitem(last=False)
    return result


def _hashable(value):
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def _session_cached(fn, signature, max_entries, args, kwargs):
    """`fn(*args, **kwargs)` memoized in this session's state (arguments named `_x` are not keys)."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    key = (fn.__module__, fn.__qualname__, _upload_token(),
           tuple((k, _hashable(v)) for k, v in bound.arguments.items() if not k.startswith("_")))
    store = st.session_state.setdefault(_UPLOAD_CACHE, OrderedDict())
    if key in store:
        store.move_to_end(key)
        return store[key]
    result = fn(*args, **kwargs)
    store[key] = result
    while len(store) > max_entries:
        store.popitem(last=False)
    return result


# ---------------------------------------------------------------- exports, figures, links, presets

#: Tables larger than this are not offered as a download (the reason is shown instead).
EXPORT_BUDGET_BYTES = 64 * 2**20


def _columns(table) -> dict:
    """A DataFrame or {name: array} as {column name: 1-D array}; 2-D arrays become name[0], name[1], …"""
    import numpy as np
    import pandas as pd

    if isinstance(table, pd.DataFrame):
        return {str(c): table[c].to_numpy() for c in table.columns}
    cols = {}
    for name, values in table.items():
        a = np.asarray(values)
        if a.ndim <= 1:
            cols[str(name)] = a.reshape(-1)
        else:
            flat = a.reshape(a.shape[0], -1)
            cols.update({f"{name}[{j}]": flat[:, j] for j in range(flat.shape[1])})
    return cols


def export_bytes(table) -> int:
    """Bytes of the arrays in `table` (DataFrame or dict of arrays): what a download would hold."""
    import numpy as np
    import pandas as pd

    if isinstance(table, pd.DataFrame):
        return int(table.memory_usage(index=False, deep=False).sum())
    return int(sum(np.asarray(v).nbytes for v in table.values()))


def to_csv(table) -> bytes:
    """CSV bytes of a DataFrame or a dict of equally long arrays (2-D arrays: one column per entry)."""
    import pandas as pd

    frame = table if isinstance(table, pd.DataFrame) else pd.DataFrame(_columns(table))
    return frame.to_csv(index=False).encode()


def to_npz(table) -> bytes:
    """Compressed NPZ bytes: one array per DataFrame column, or the dict's arrays with their shapes."""
    import io

    import numpy as np
    import pandas as pd

    if isinstance(table, pd.DataFrame):
        arrays = {}
        for c in table.columns:
            a = table[c].to_numpy()
            arrays[str(c)] = a.astype(str) if a.dtype == object else a
    else:
        arrays = {str(k): np.asarray(v) for k, v in table.items()}
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def download(name: str, table, *, label: str | None = None, key: str | None = None) -> None:
    """CSV and NPZ download buttons for a table of per-example results.

    **Arguments** `name`: file stem, e.g. `"gradlab_norms_step300"`; `table`: a `pandas.DataFrame`
    or `{name: array}` with the example axis first (2-D arrays such as per-example gradients
    `(N, P)` are kept whole in the NPZ and spread over columns in the CSV). Files are built only
    when clicked. Over `EXPORT_BUDGET_BYTES` the buttons are replaced by the reason.
    """
    size = export_bytes(table)
    what = label or name.replace("_", " ")
    if size > EXPORT_BUDGET_BYTES:
        st.caption(f"⬇️ {what}: {size / 2**20:,.0f} MB is over the {EXPORT_BUDGET_BYTES // 2**20} MB export "
                   "limit; use a smaller model or dataset (or the library in a notebook) to export it.")
        return
    key = key or f"download_{name}"
    c1, c2 = st.columns(2)
    c1.download_button(f"⬇️ {what} (CSV)", lambda: to_csv(table), file_name=f"{name}.csv", mime="text/csv",
                       key=f"{key}_csv", on_click="ignore", width="stretch")
    c2.download_button(f"⬇️ {what} (NPZ)", lambda: to_npz(table), file_name=f"{name}.npz",
                       mime="application/octet-stream", key=f"{key}_npz", on_click="ignore", width="stretch")


def plotly_config(filename: str = "gradlab") -> dict:
    """`st.plotly_chart(config=...)`: the modebar's camera button saves a 2× PNG named `filename`."""
    import re

    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", filename).strip("_")[:80] or "gradlab"
    return {
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": stem, "scale": 2},
    }


def chart(fig, *, filename: str | None = None, **kwargs):
    """`st.plotly_chart(fig, width="stretch")` whose PNG download is named after the figure's title."""
    title = filename or (fig.layout.title.text if fig.layout.title and fig.layout.title.text else "gradlab figure")
    kwargs.setdefault("width", "stretch")
    return st.plotly_chart(fig, config=plotly_config("gradlab_" + title), **kwargs)


def share_link() -> str | None:
    """A "copy link to this view" box in the sidebar: the page URL plus the current query parameters.

    Call it at the end of a run (after the page's widgets are bound), so the link holds every control.
    """
    from urllib.parse import urlencode

    base = st.context.url
    if not base:
        return None
    params = {k: v for k, v in st.query_params.to_dict().items() if not k.startswith("_")}
    link = base + ("?" + urlencode(params) if params else "")
    with st.sidebar:
        st.markdown("**Copy link to this view**", help="Opens this page with the same experiment and controls. "
                    "Uploaded data is not in the link.")
        st.code(link, language=None, wrap_lines=True)
    return link


_PRESET_GOTO = "_preset_goto"
_PRESET_ACTIVE = "_preset_active"


def apply_preset(name: str) -> None:
    """Set every control of preset `name` in session state and ask for its page (an `on_click` callback).

    Bound widgets take session-state values over the URL, and write them into the URL.
    """
    from gradlab.presets import BY_NAME, SIDEBAR_KEYS

    preset = BY_NAME[name]
    for key, value in preset.state().items():
        unset = getattr(DEFAULT, key) if key in SIDEBAR_KEYS else object()  # an absent sidebar key is its default
        current = st.session_state[key] if key in st.session_state else unset
        if current != value:
            st.session_state[key] = value
    st.session_state[_PRESET_GOTO] = preset.page
    st.session_state[_PRESET_ACTIVE] = name


def follow_preset() -> None:
    """Switch to the page a preset asked for (call it early in a run; no-op otherwise)."""
    page = st.session_state.pop(_PRESET_GOTO, None)
    if page:
        st.switch_page(page)


def preset_picker(*, columns: int = 2) -> None:
    """The lecture scenarios as buttons, each with what to look at; a click opens the scenario."""
    from gradlab.presets import PRESETS

    follow_preset()  # the sidebar follows it first in the app; AppTest reruns only the page
    cols = st.columns(columns)
    for i, p in enumerate(PRESETS):
        with cols[i % columns].container(border=True):
            st.button(p.name, key=f"preset_{i}", on_click=apply_preset, args=(p.name,), type="primary",
                      width="stretch")
            st.caption(p.look_at)


def preset_banner(exp: Experiment) -> None:
    """While the experiment is still the one a preset set: its name and what to look at."""
    from gradlab.presets import BY_NAME

    name = st.session_state.get(_PRESET_ACTIVE)
    if name in BY_NAME and BY_NAME[name].config == exp:
        st.info(f"**Lecture scenario: {name}.** {BY_NAME[name].look_at}", icon="🎓")
    elif name is not None:
        del st.session_state[_PRESET_ACTIVE]


# ---------------------------------------------------------------- memory on a small server


def _libc():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas (like `MALLOC_ARENA_MAX=2`): Streamlit runs each session's script in
    its own thread, and every thread arena keeps the memory its frees leave behind."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(-8, int(arenas))  # M_ARENA_MAX


#: Above this resident size (MB) the compiled-function caches are dropped after a computation.
#: Compiled XLA executables are what fills a long-running server (~280 MB for one tour of all
#: pages); dropping them costs a recompile later, never a wrong result. Set
#: GRADLAB_MEMORY_BUDGET_MB=0 to disable (e.g. on a laptop with plenty of memory).
MEMORY_BUDGET_MB = float(os.environ.get("GRADLAB_MEMORY_BUDGET_MB", "480"))


def rss_mb() -> float:
    """This process's resident set size in MB (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _trim() -> None:
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def release_memory() -> None:
    """After a computation: return freed heap pages to the OS (`malloc_trim(0)`: an XLA compile
    leaves ~70 MB of freed scratch memory behind) and, over `MEMORY_BUDGET_MB`, drop JAX's compiled
    functions (`jax.clear_caches()`), which other sessions simply recompile when they need them."""
    _trim()
    if MEMORY_BUDGET_MB and rss_mb() > MEMORY_BUDGET_MB:
        import gc

        import jax

        before = rss_mb()
        jax.clear_caches()
        gc.collect()
        _trim()
        log.info("memory budget %.0f MB: dropped compiled functions, RSS %.0f -> %.0f MB",
                 MEMORY_BUDGET_MB, before, rss_mb())


limit_malloc_arenas()


def download_gradients(name: str, f: Fitted, checkpoint: int = -1, *, budget_bytes: int | None = None) -> None:
    """An NPZ download of the full per-example gradient matrix (N, P) at a checkpoint, when it fits.

    The matrix is built only when the button is clicked (`engine.per_example_grads`, flattened in
    `leaf_names` order), and only if N × P × 4 bytes is within `budget_bytes` (default
    `EXPORT_BUDGET_BYTES`); otherwise the reason is shown instead (norms and dot products never
    need the matrix: the pages stream them).
    """
    from gradlab import engine

    model = f.run.checkpoints[checkpoint]
    n, p = f.data.x_train.shape[0], engine.num_params(model)
    size = n * p * 4
    budget = EXPORT_BUDGET_BYTES if budget_bytes is None else budget_bytes
    if size > budget:
        st.caption(f"⬇️ Per-example gradients: N × P = {n:,} × {p:,} floats = {size / 2**20:,.0f} MB is over the "
                   f"{budget // 2**20} MB export limit, so the matrix is not built; use a smaller model.")
        return

    def build() -> bytes:
        data = gradients_npz(f, checkpoint)
        release_memory()
        return data

    st.download_button(f"⬇️ Per-example gradients, {n:,} × {p:,} (NPZ, {size / 2**20:,.1f} MB)", build,
                       file_name=f"{name}.npz", mime="application/octet-stream", key=f"download_{name}_grads",
                       on_click="ignore")


def gradients_npz(f: Fitted, checkpoint: int = -1) -> bytes:
    """NPZ bytes: `grads (N, P) float32` (per-example gradients, leaves flattened in `leaf_names`
    order), `labels (N,)`, `leaf_names (L,)`, `leaf_sizes (L,)`."""
    import io

    import jax
    import numpy as np

    from gradlab import engine

    model = f.run.checkpoints[checkpoint]
    g = engine.per_example_grads(f.loss_fn, model, f.data.x_train, f.data.y_train, chunk_size=256)
    buf = io.BytesIO()
    np.savez_compressed(buf, grads=np.asarray(engine.flatten_per_example(g)), labels=f.data.y_train,
                        leaf_names=np.array(engine.leaf_names(model)),
                        leaf_sizes=np.array([int(np.prod(a.shape[1:])) for a in jax.tree.leaves(g)]))
    return buf.getvalue()
