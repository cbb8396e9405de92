"""Small widgets every page uses: error guard, code panel, checkpoint picker, downloads, charts."""

from __future__ import annotations

import contextlib
import functools
import html
import inspect
import logging
import os
import re
import sys
import time
from urllib.parse import parse_qs

import plotly.graph_objects as go
import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx
from streamlit.runtime.state.session_state_proxy import get_session_state

from gradlab import engine, escape, export, glossary, own
from gradlab.memory import release_memory
from gradlab.ui import figures, pages
from gradlab.experiment import Fitted

log = logging.getLogger("gradlab")


def fragment(fn):
    """`st.fragment`: a control inside `fn` reruns only `fn`, not the page; its controls' values are written into the
    link after it (`write_bound_values`). With GRADLAB_LOG_RUNS=1
    a fragment-only rerun logs its server time like app.py logs a full run (benchmarks/latency.py)."""

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
            write_bound_values()  # its own rerun ends here: app.py's call after the page does not run
            return out
        finally:
            ctx = get_script_run_ctx()
            if os.environ.get("GRADLAB_LOG_RUNS") and ctx is not None and ctx.fragment_ids_this_run:
                print(f"gradlab-run 'fragment {fn.__name__}' {time.perf_counter() - started:.3f}",
                      file=sys.stderr, flush=True)

    return st.fragment(timed)


#: Session key: True while the page shown is a lecture step, whose link is its step (it sets its own controls: values
#: written into its URL would win over the next step's on their first draw), so `write_bound_values` writes nothing.
STEP_SETS_CONTROLS = "_step_sets_controls"


def write_bound_values() -> None:
    """Put every control drawn in this run into the URL as its value stands (call after the page, before the link).

    Streamlit's browser side writes a bound control's change into the address bar, and the server keeps the address
    it is sent; a control that mounted again while its page was computing (Influence's test point after the method
    changed, on a cold store) kept its new value but left the address bar as it was, so the link lost it. Here each
    control drawn this run whose value is not its default, and not what the URL holds, is written there (Streamlit's
    own `set_corrected_value`, which tells the browser); one back at its default leaves the URL (`remove_param`). A
    control set through Session State this run is written whatever its value: it was drawn without its declared
    default (`bound`), so its widget's default is the widget's own (a number input's minimum), which says nothing
    about the link (a preset's `perf_repeats=1` fell out of its link so, the declared default being 2). A fragment's
    own rerun calls it for the fragment's controls (`fragment`)."""
    ctx = get_script_run_ctx()
    if ctx is None or st.session_state.get(STEP_SETS_CONTROLS):
        return
    state = get_session_state()._state
    params = state.query_params
    for widget_id in ctx.shared.widget_ids_this_run.snapshot():
        binding, meta = params.get_binding_for_widget(widget_id), state.get_widget_metadata(widget_id)
        if binding is None or meta is None or widget_id not in state:
            continue
        key, value, default = binding.param_key, state[widget_id], meta.deserializer(None)
        if value != default or set_through_session_state(key):
            wanted = meta.serializer(value)
            if not params.stored_param_matches_corrected_value(key, wanted, meta.value_type):
                params.set_corrected_value(key, wanted, meta.value_type)
        elif params.has_param(key) and not params.stored_param_matches_corrected_value(
                key, meta.serializer(default), meta.value_type):
            params.remove_param(key)
    # A control back at its default leaves the server's copy of the URL and not the browser's (Streamlit expects the
    # browser to have dropped it): where the browser's address is not the server's, the server's is sent.
    if parse_qs(ctx.query_string, keep_blank_values=True) != {k: params.get_all(k) for k in params}:
        st.query_params.update()


def inert(text) -> str:
    """`text` as Markdown that shows exactly its characters (`gradlab.escape.markdown`): a user's string (a CSV's
    column, label or file name, a served model's names or message, a URL parameter) cannot become an image, a link,
    HTML, emphasis, LaTeX, a colour or an emoji. Escape only the user's part: the message's own **bold** around it
    stays Markdown, `st.caption(f"label **{ui.inert(name)}**")`. Figures (`gradlab.plots`) and exports
    (`gradlab.export`) escape for their own media and take raw strings."""
    return escape.markdown(text)


def sentence(message) -> str:
    """`message` (an exception's text, often written to follow a colon) as a sentence after the page's own: a first
    word in lower case upper-cased ("… could not be computed. The clipping norm C must be > 0 …"); a message that
    opens on a symbol keeps it as written ("δ must be in (0, 1)", "q must be …": a variable's case is its name)."""
    text = str(message)
    return text[:1].upper() + text[1:] if re.match(r"[a-z]{2,}\b", text) else text


@contextlib.contextmanager
def guard(what: str = "This part of the page could not be computed", *, stop: bool = False):
    """Show an exception as a clear message instead of a traceback.

    `ValueError` carries our own messages (bad settings, diverged runs, over the memory budget), shown as text
    (`inert`: a `DataError` quotes a CSV's column names, a served model's code may raise anything); a refusal
    (`escape.Refusal`: over the work or memory budget) is gradlab's own Markdown and shown as written. Anything
    else is logged and shown briefly. With `stop=True` the page stops.
    """
    try:
        yield
    except escape.Refusal as err:
        st.error(f"**{what}.** {sentence(err)}", icon="⚠️")
        if stop:
            st.stop()
    except ValueError as err:
        st.error(f"**{what}.** {inert(sentence(err))}", icon="⚠️")
        if stop:
            st.stop()
    except Exception as err:  # noqa: BLE001 - a user must never see a raw traceback
        log.exception(what)
        st.error(f"**{what}.** Unexpected {type(err).__name__}: {inert(err)}", icon="⚠️")
        if stop:
            st.stop()


def needs_training_loop(what: str = "This section") -> None:
    """Say plainly why a section that trains models from an initialization (DP-SGD, shadow models, the LDS) is not
    shown for a served model whose module has no `init_fn`, and what to add to show it."""
    st.info(f"**{what} needs gradlab's training loop**: it trains your model from an initialization, and your module "
            f"brings trained params only. To show it, {own.NEEDS_INIT}.", icon=":material/model_training:")


def code_panel(code: str, title: str = "The exact JAX code behind these numbers") -> None:
    """An expander with the code that produced the page's numbers."""
    with st.expander(title):
        st.code(code.strip(), language="python")


def checkpoint_picker(f: Fitted, key: str = "checkpoint") -> int:
    """Select a checkpoint by training step (default: the last). Returns its index (a served model without
    checkpoints has one: nothing to pick)."""
    steps = list(f.run.steps)
    if len(steps) == 1:
        return 0
    step = control(st.select_slider, "Checkpoint (training step)", options=steps, value=steps[-1], key=key,
                   help="The model as it was after this many training steps.")
    return steps.index(step)


def dataframe(table, **kwargs):
    """`st.dataframe(table, **kwargs)` for a table that holds a user's text (an upload's column and class names, a
    served model's leaf names). A table draws text as text, but its toolbar downloads the cells as a CSV that
    Streamlit does not defuse: cells and headers are shown as `ui.download`'s CSV holds them (`export.defused`: a
    leading `'` on a cell a spreadsheet would run as a formula, such as `=HYPERLINK(…)`; numbers unchanged)."""
    return st.dataframe(export.defused(table), **kwargs)


def download(name: str, table, *, label: str | None = None, key: str | None = None) -> None:
    """CSV and NPZ download buttons for a table of per-example results.

    **Arguments** `name`: file stem, e.g. `"gradlab_norms_step300"`; `table`: a `pandas.DataFrame`
    or `{name: array}` with the example axis first (2-D arrays such as per-example gradients
    `(N, P)` are kept whole in the NPZ and spread over columns in the CSV). Files are built only
    when clicked (`gradlab.export`). Over `export.EXPORT_BUDGET_BYTES` the buttons are replaced by the reason.
    """
    size = export.export_bytes(table)
    what = label or name.replace("_", " ")
    if size > export.EXPORT_BUDGET_BYTES:
        st.caption(f"⬇️ {what}: {size / 2**20:,.0f} MB is over the {export.EXPORT_BUDGET_BYTES // 2**20} MB export "
                   "limit; use a smaller model or dataset (or the library in a notebook) to export it.")
        return
    key = key or f"download_{name}"
    c1, c2 = st.columns(2)
    c1.download_button(f"⬇️ {what} (CSV)", lambda: export.to_csv(table), file_name=f"{name}.csv", mime="text/csv",
                       key=f"{key}_csv", on_click="ignore", width="stretch")
    c2.download_button(f"⬇️ {what} (NPZ)", lambda: export.to_npz(table), file_name=f"{name}.npz",
                       mime="application/octet-stream", key=f"{key}_npz", on_click="ignore", width="stretch")


def download_gradients(name: str, f: Fitted, checkpoint: int = -1, *, budget_bytes: int | None = None) -> None:
    """An NPZ download of the full per-example gradient matrix (N, P) at a checkpoint, when it fits.

    The matrix is built only when the button is clicked (`export.gradients_npz`), and only if
    N × P × 4 bytes is within `budget_bytes` (default `export.EXPORT_BUDGET_BYTES`); otherwise the
    reason is shown instead (norms and dot products never need the matrix: the pages stream them).
    """
    model = f.run.checkpoints[checkpoint]
    n, p = f.data.x_train.shape[0], engine.num_params(model)
    size = n * p * 4
    budget = export.EXPORT_BUDGET_BYTES if budget_bytes is None else budget_bytes
    if size > budget:
        st.caption(f"⬇️ Per-example gradients: N × P = {n:,} × {p:,} floats = {size / 2**20:,.0f} MB is over the "
                   f"{budget // 2**20} MB export limit, so the matrix is not built; use a smaller model.")
        return

    def build() -> bytes:
        data = export.gradients_npz(f, checkpoint)
        release_memory()
        return data

    st.download_button(f"⬇️ Per-example gradients, {n:,} × {p:,} (NPZ, {size / 2**20:,.1f} MB)", build,
                       file_name=f"{name}.npz", mime="application/octet-stream", key=f"download_{name}_grads",
                       on_click="ignore")


def plotly_config(filename: str = "gradlab") -> dict:
    """`st.plotly_chart(config=...)`: the modebar's camera button saves a 2× PNG named `filename`."""
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", filename).strip("_")[:80] or "gradlab"
    return {
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": stem, "scale": 2},
    }


def chart(fig, *, filename: str | None = None, **kwargs):
    """`st.plotly_chart(fig, width="stretch")` whose PNG download is named after the figure's title."""
    title = filename or (html.unescape(fig.layout.title.text) if fig.layout.title and fig.layout.title.text
                         else "gradlab figure")  # a title is escaped text (`escape.plotly`)
    kwargs.setdefault("width", "stretch")
    spec = figures.FIGURES.spec(fig)  # a shared figure's dict, made once: not again on every run of every session
    return st.plotly_chart(fig if spec is None else _Drawn(spec), config=plotly_config("gradlab_" + title), **kwargs)


class _Drawn(go.Figure):
    """A figure as the dict `to_dict()` made (`figures.FIGURES.spec`), for `st.plotly_chart`, which asks a figure for
    exactly that. Plotly's own initialisation is skipped on purpose: it would validate every property again."""

    def __init__(self, spec: dict):  # noqa: D107 - no super().__init__: see the class docstring
        object.__setattr__(self, "_gradlab_spec", spec)

    def to_dict(self) -> dict:
        return self._gradlab_spec


def intro(lead: str, more: str = "", *, label: str = "More about this page") -> None:
    """A page's opening: `lead` (a sentence or two, always shown) and `more` in a collapsed expander, so the page's
    first figure starts on a laptop's first screen (1024×768) and the rest is one click away. Presenter mode hides
    both (`lecture._PRESENTER_CSS`: the narration says what the step is about)."""
    st.markdown(lead)
    if more:
        with st.container(key="page_intro_more"), st.expander(label):
            st.markdown(more)


def terms(*names: str, label: str = "Terms") -> None:
    """A small popover that explains the field's terms `names` in one sentence each (`gradlab.glossary`)."""
    with st.popover(label, icon=":material/menu_book:"):
        for name in names:
            st.markdown(f"**{name}**: {glossary.explain(name)}")


def control(kind, label: str, *args, key: str, **kwargs):
    """Draw a page's control `kind(label, *args, **kwargs)` (a Streamlit widget or a column's) bound to the URL:
    its key is the query parameter, as the sidebar's controls are.

    **Raises** KeyError when no page declares `key` in `gradlab.ui.pages` (every control is declared once there,
    so presets, the lecture's resets and the link checks know it).
    """
    if key not in pages.control_keys():
        raise KeyError(f"control {key!r} is not declared in gradlab.ui.pages: add it to its page's controls")
    return bound(kind, label, *args, key=key, **kwargs)


def bound(kind, label: str, *args, key: str, **kwargs):
    """Widget `kind(label, *args, **kwargs)` bound to the URL parameter `key` (the sidebar's and the pages' controls).
    A value given through Session State in this run (a preset, a lecture step, a card's switch) wins: the widget is
    then drawn without its default (`without_default`), which Streamlit would warn about."""
    if set_through_session_state(key):
        args, kwargs = without_default(kind, label, args, kwargs)
        return kind(*args, key=key, bind="query-params", **kwargs)
    return kind(label, *args, key=key, bind="query-params", **kwargs)


def set_through_session_state(key: str) -> bool:
    """Whether `key` was given a value through `st.session_state` in this run, before its widget is drawn (Streamlit's
    own test before it warns about a default beside it). A value the widget itself holds from an earlier run is not:
    the widget keeps it, and without its default a number input would fall back to 0."""
    return get_session_state().is_new_state_value(key)


def without_default(kind, label: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments of widget `kind(label, *args, **kwargs)` less its default value (`value`, `index`, `default`),
    positional or not: for a widget whose key was just set through Session State (`set_through_session_state`), where
    Streamlit warns about a default beside it (and uses the Session State value anyway). A default of None stays: it
    draws no warning, and without it a number input's default would become its minimum, a value the URL then drops as
    the default (the canary's trial 0 fell out of its card's link so, CI 2026-12-03)."""
    bound = inspect.signature(kind).bind_partial(label, *args, **kwargs)
    for name in ("value", "index", "default"):
        if bound.arguments.get(name) is not None:
            del bound.arguments[name]
    return bound.args, bound.kwargs


def choice(kind, label: str, choices: dict, key: str, **kwargs):
    """A radio or selectbox bound to the URL whose value there is a short stable code (`?eq_example=scalar`).

    `choices`: `{code: description}`. Streamlit writes the shown option into the URL, so the options shown are
    the codes, and each description goes beside them (a radio's captions, a selectbox's help). A hand-written
    code works; anything else is reported by `url_warnings`. **Returns** the chosen code.
    """
    codes = list(choices)
    if kind is st.radio:
        kwargs.setdefault("captions", [choices[c] for c in codes])
    else:
        listing = "\n".join(f"- **{c}**: {choices[c]}" for c in codes)
        kwargs["help"] = f"{kwargs['help']}\n\n{listing}" if kwargs.get("help") else listing
    return control(kind, label, codes, key=key, **kwargs)


def picked_index(event, n: int) -> int | None:
    """The example a Plotly chart selection picked (its `customdata`, else its point index), if it is a whole
    number in [0, n); None for no selection or anything malformed (a visitor's client can send any payload)."""
    try:
        point = event["selection"]["points"][0]
        value = point.get("customdata", point.get("point_index"))
        if isinstance(value, (list, tuple)):
            value = value[0]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            return None
        index = int(value)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError, OverflowError):
        return None
    return index if 0 <= index < n else None
