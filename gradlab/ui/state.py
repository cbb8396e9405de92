"""The experiment sidebar, bound to the URL, and the glue that applies presets and shares links.

Every sidebar control is a widget whose key is an `Experiment` field (`experiment.CONTROLS`) and
whose value lives in the URL (`bind="query-params"`), so a shared link reproduces the experiment.
"""

from __future__ import annotations

import streamlit as st

from gradlab import engine, own, sources
from gradlab.experiment import CONTROLS, MODEL_DEFAULTS, Experiment
from gradlab.sources.served import Served
from gradlab.sources.upload import Upload
from gradlab.models import ACTIVATIONS, MODELS
from gradlab.train import OPTIMIZERS
from gradlab.ui import pages
from gradlab.ui.presets import BY_NAME, PRESETS
from gradlab.ui.upload import upload_controls, upload_dataset
from gradlab.ui.widgets import bound, inert
from streamlit.runtime.state.session_state_proxy import get_session_state

LEARNING_RATES = [0.0001, 0.0003, 0.001, 0.0015, 0.003, 0.005, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0]
STEPS = [0, 25, 50, 100, 200, 300, 500, 1000, 2000]
DEFAULT = Experiment()


def _widget(kind, label, key, **kwargs):
    """A sidebar widget whose value lives in the URL (`bind="query-params"`, key = param name)."""
    assert key in CONTROLS, key  # the sidebar's keys are the Experiment's fields
    return bound(kind, label, key=key, **kwargs)


OWN_LABEL = Served.label


def _dataset_label(name: str) -> str:
    return sources.source_of(name).label


def _datasets() -> list[str]:
    """The sidebar's dataset choices (`sources.choices`): the served model first (and so the default) when the
    server was started with one (`python -m gradlab serve`; its start-up setting, never a URL, names the file)."""
    return sources.choices()


def own_model_caption() -> None:
    """What the served model is, in the sidebar: its file, P, N and the checkpoints it lists."""
    try:
        m = own.served()
    except own.OwnModelError as err:
        st.error(f"**Your model could not be loaded.** {inert(err)}", icon="⚠️")
        return
    n, n_test = len(m.data.y_train), len(m.data.y_test)
    split = (f" (your data had no test split: gradlab held out {n_test / (n + n_test):.0%} as test points with "
             f"scikit-learn's `{m.data.split}`, the same on every run; give `x_train`, `y_train`, `x_test`, `y_test` to "
             "choose them)" if m.data.split else "")
    st.caption(f"**{inert(m.source)}**: P = {engine.num_params(m.params):,} parameters, {n:,} training and {n_test:,} "
               f"test examples{split} ({m.data.task}), {len(m.run.checkpoints)} checkpoint(s). Trained by you: the "
               "training controls do not apply. "
               + (f"Its `init_fn` and recipe ({m.train_steps} steps of {m.batch_size}) let gradlab's loop train it "
                  "again (DP-SGD, membership attack, LDS, TRAK)." if m.trainable else
                  "Without an `init_fn` gradlab's loop cannot train it again (DP-SGD, membership attack, LDS)."))


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
        dataset = _widget(st.selectbox, "Dataset", "dataset", options=_datasets(), index=0)
        st.caption(_dataset_label(dataset))
        source = sources.source_of(dataset)
        _SOURCE_UI.get(type(source), (lambda: None, None))[0]()
    if source.brings_model:  # the user's trained model: gradlab's model and training controls do not apply
        exp = experiment()
        with banner:
            preset_banner(exp)
        return exp
    with sb:
        model = _widget(st.selectbox, "Model", "model", options=list(MODELS), index=list(MODELS).index(d.model),
                        help=" · ".join(f"**{k}**: {v}" for k, v in MODELS.items()), on_change=_model_recipe)
        d = Experiment.for_model(model)  # the training controls start from the model's own recipe
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
                    index=list(OPTIMIZERS).index(d.optimizer),
                    help=" · ".join(f"**{k}**: {v}" for k, v in OPTIMIZERS.items()))
            _widget(st.select_slider, "Batch size", "batch_size", options=[16, 32, 64, 128, 256, 512, 2048], value=d.batch_size)
            _widget(st.select_slider, "L2 penalty λ", "l2", options=[0.0, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1], value=d.l2, format_func=lambda v: f"{v:g}")
            _widget(st.select_slider, "Checkpoint every k steps", "checkpoint_every", options=[10, 25, 50, 100, 250, 500], value=d.checkpoint_every)
    exp = experiment()
    with banner:
        preset_banner(exp)
    return exp


def _model_recipe() -> None:
    """On a change of model: the training settings its recipe sets (`MODEL_DEFAULTS`) go to the new model's
    recipe, when the new model has one or the settings were another model's recipe (so SimpleCNN's 500 steps
    of 16 do not follow a visitor back to the MLP; settings a visitor chose for other models stay)."""
    new = Experiment.for_model(st.session_state["model"])
    for key in {k for recipe in MODEL_DEFAULTS.values() for k in recipe} & set(CONTROLS):  # the sidebar's own
        current = st.session_state.get(key, getattr(DEFAULT, key))
        if new.model in MODEL_DEFAULTS or any(current == recipe.get(key) for recipe in MODEL_DEFAULTS.values()):
            st.session_state[key] = getattr(new, key)


def experiment() -> Experiment:
    """The experiment the sidebar set on this run (app.py renders the sidebar before the page),
    complete: an upload is named by the hash of this session's bytes (`dataset="upload:3fa9…"`)."""
    exp = experiment_from_state(st.session_state)
    complete = _SOURCE_UI.get(type(exp.source), (None, None))[1]
    return exp.replace(dataset=complete()) if complete else exp


def _served_dataset() -> str:
    """The served model's `dataset`, `"own:<fingerprint>"` (the bare `"own"` when it cannot be loaded: the page
    says why, `ui.fitted`)."""
    try:
        return own.served().name
    except own.OwnModelError:
        return own.OWN


#: The Streamlit side of the sources that have one (the library holds no Streamlit), by source class: what the
#: sidebar draws under the dataset choice, and the experiment's complete `dataset` for this session (an upload
#: named by the hash of this session's bytes, the served model by its fingerprint).
_SOURCE_UI = {Upload: (upload_controls, upload_dataset), Served: (own_model_caption, _served_dataset)}


def experiment_from_state(state) -> Experiment:
    """The `Experiment` that the sidebar's widget keys in `state` (a mapping) describe; defaults
    elsewhere (`Experiment.from_state`). A dataset with a key (an upload's hash, a served model's fingerprint) reads
    as its source's bare prefix here (`"upload"`, `"own"`): the sidebar's choice."""
    exp = Experiment.from_state(state)
    return exp.replace(dataset=exp.source.prefix)


#: The link box: the address bar itself (the parent page's URL, read every 0.3 s), less the app's private `_`
#: parameters, with a Copy button. A control inside a fragment (Gradient norms' log scale) reruns only its fragment,
#: so a box drawn by the server at the end of a full run went stale; this one cannot differ from the address bar.
_LINK_BOX = """
<style>
 body { margin: 0; font-family: "Source Sans Pro", sans-serif; }
 textarea { box-sizing: border-box; width: 100%; height: 84px; resize: none; border: 0; border-radius: 0.5rem;
            padding: 0.5rem; background: #f0f2f6; color: #31333f; font: 0.8rem/1.35 monospace; }
 button { margin-top: 4px; padding: 2px 12px; border: 1px solid #ccc; border-radius: 0.5rem; background: white;
          cursor: pointer; font: 0.85rem sans-serif; }
</style>
<textarea id="link" readonly aria-label="Link to this view"></textarea>
<button id="copy" type="button">Copy link</button>
<script>
const box = document.getElementById("link"), copy = document.getElementById("copy");
function show() {
  const url = new URL(window.parent.location.href);
  [...url.searchParams.keys()].filter((k) => k.startsWith("_")).forEach((k) => url.searchParams.delete(k));
  if (box.value !== url.href) box.value = url.href;
}
show();
setInterval(show, 300);
copy.onclick = () => {
  box.select();
  const done = () => { copy.textContent = "Copied"; setTimeout(() => (copy.textContent = "Copy link"), 1500); };
  (navigator.clipboard ? navigator.clipboard.writeText(box.value) : Promise.reject()).then(done, () => {
    document.execCommand("copy");
    done();
  });
};
</script>
"""


def share_link() -> str | None:
    """A "copy link to this view" box in the sidebar that shows the address bar (`_LINK_BOX`), with a Copy button.

    **Returns** the page URL plus the current query parameters as this run sees them (None outside a server).
    """
    from urllib.parse import urlencode

    base = st.context.url
    if not base:
        return None
    params = {k: v for k, v in st.query_params.to_dict().items() if not k.startswith("_")}
    with st.sidebar:
        st.markdown("**Copy link to this view**", help="Opens this page with the same experiment and controls. "
                    "Uploaded data is not in the link.")
        st.iframe(_LINK_BOX, height=125)  # our own constant page, never user text (st.iframe runs what it is given)
    return base + ("?" + urlencode(params) if params else "")


# ---------------------------------------------------------------- hand-written links

_FIRST_URL = "_first_url"
#: Parameters of the app itself, on every page: presenter mode, a lecture's step and room, the speaker view.
APP_PARAMS = frozenset({"presenter", "step", "room", "speaker"})


def remember_url() -> None:
    """Keep this session's first URL parameters (call before any widget is drawn): `url_warnings` checks them."""
    if _FIRST_URL not in st.session_state:
        st.session_state[_FIRST_URL] = st.query_params.to_dict()


def _same(raw: str, value) -> bool:
    if value is None:
        return raw == ""
    if isinstance(value, bool):
        return raw.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return abs(float(raw) - float(value)) <= 1e-9 * max(1.0, abs(float(value)))
        except ValueError:
            return False
    if isinstance(value, (list, tuple)):
        return True  # a multiselect: Streamlit keeps the valid items
    return raw == str(value)


def url_warnings(slot, url_path: str) -> None:
    """Once per session, after its first run: name every parameter of the first URL that a control of this page or
    the sidebar did not take as written (an unknown code, a number out of range, a word for a number), and the
    value used instead, in `slot` (a container at the top of the page). Streamlit itself drops them silently."""
    first = st.session_state.get(_FIRST_URL)
    if first is None or st.session_state.get("_url_checked") or url_path not in pages.BY_URL or url_path == "lecture":
        return  # a lecture step sets its own controls over the link's
    st.session_state["_url_checked"] = True
    keys = [*CONTROLS, *pages.BY_URL[url_path].controls]
    bad = [f"**{inert(k)}={inert(first[k])}** (shown: {inert(repr(st.session_state[k]))})" for k in keys
           if k in first and k in st.session_state and not _same(first[k], st.session_state[k])]
    if bad:
        slot.warning("This link has values this page cannot use, so it shows others: " + ", ".join(bad)
                     + ". Check the spelling, or pick the value with the control.", icon=":material/link_off:")
    reads = pages.BY_URL[url_path].reads  # another page's settings this page takes from its link (it checks them)
    unknown = [f"**{inert(k)}={inert(v)}**" for k, v in first.items() if k not in keys and not k.startswith("_")
               and k not in APP_PARAMS and k not in reads]
    if unknown:
        elsewhere = [k for k in first if k in pages.control_keys() and k not in keys and k not in reads]
        slot.warning("This link has parameters this page does not use, so it ignores them: " + ", ".join(unknown)
                     + (". Pages are chosen by their path (`/norms`, `/dp_clipping`, …), not a parameter"
                        if "page" in first else "")
                     + (f" ({', '.join(inert(k) for k in elsewhere)} belong to another page)" if elsewhere else "")
                     + ".", icon=":material/link_off:")


# ---------------------------------------------------------------- presets

_PRESET_GOTO = "_preset_goto"
_PRESET_ACTIVE = "_preset_active"


def reset_controls(keep=()) -> None:
    """Every page control (`gradlab.ui.pages`) not in `keep` back to its page's default: its session value and
    its URL parameter go, so the page computes its default again (several depend on the data) when it draws it.

    A bound URL parameter cannot be deleted through `st.query_params`; Streamlit's own `remove_param` can.
    """
    with get_session_state().query_params() as params:
        for key in pages.control_keys() - set(keep):
            st.session_state.pop(key, None)
            params.remove_param(key)


def apply_preset(name: str) -> None:
    """Set every control of preset `name` in session state and ask for its page (an `on_click` callback).

    Every page control the preset does not set goes back to its default (`reset_controls`); bound widgets
    take session-state values over the URL, and write them into the URL.
    """
    preset = BY_NAME[name]
    reset_controls(keep=preset.widgets)
    for key, value in preset.state().items():
        unset = getattr(DEFAULT, key) if key in CONTROLS else object()  # an absent sidebar key is its default
        current = st.session_state[key] if key in st.session_state else unset
        if current != value:
            st.session_state[key] = value
    st.session_state[_PRESET_GOTO] = preset.page
    st.session_state[_PRESET_ACTIVE] = name


#: A page switch this session asked for, `(page path, query params, session state, switches left)`, until that page
#: runs (`arrive`).
_SWITCH = "_switch_pending"


def switch_page(path: str, params: dict[str, str], state: dict | None = None, again: int = 2) -> None:
    """`st.switch_page` to page `path` with `params`, its controls' values `state` set through Session State first,
    remembered until that page runs. Streamlit folds a rerun the browser asks for at the same moment into the switch's
    rerun, and the browser's page wins: the switch is lost and the page before runs again (read so from the card's
    parameters on Privacy audit's address in the record browser test, 2026-12-02; on 2026-12-03 that address proved to
    be a switch on its way, and the failure a trial dropped from the link: `widgets.without_default`). `arrive` then
    switches `again` more times, setting `state` again each time: the page before may have let go of it."""
    state = dict(state or {})
    st.session_state.update(state)
    st.session_state[_SWITCH] = (path, dict(params), state, again)
    st.switch_page(path, query_params=params)


def arrive(url_path: str) -> None:
    """Call at the start of every run (app.py) with the url path of the page about to run: on the page a pending
    switch asked for it is done; on any other page it was lost, and is made again (at most `again` times)."""
    pending = st.session_state.pop(_SWITCH, None)
    if pending is not None and pages.BY_PATH[pending[0]].url_path != url_path and pending[3] > 0:
        switch_page(pending[0], pending[1], pending[2], again=pending[3] - 1)


def follow_preset() -> None:
    """Switch to the page a preset asked for (call it early in a run; no-op otherwise)."""
    page = st.session_state.pop(_PRESET_GOTO, None)
    if page:  # an empty link, not None: Streamlit refuses to clear a URL that holds a bound control's value
        switch_page(page, {})


def preset_picker(*, columns: int = 2) -> None:
    """The lecture scenarios as buttons, each with what to look at; a click opens the scenario."""
    follow_preset()  # the sidebar follows it first in the app; AppTest reruns only the page
    cols = st.columns(columns)
    for i, p in enumerate(PRESETS):
        with cols[i % columns].container(border=True):
            st.button(p.name, key=f"preset_{i}", on_click=apply_preset, args=(p.name,), type="primary",
                      width="stretch")
            st.caption(p.look_at)


def preset_banner(exp: Experiment) -> None:
    """While the experiment is still the one a preset set: its name and what to look at."""
    name = st.session_state.get(_PRESET_ACTIVE)
    if name in BY_NAME and BY_NAME[name].config == exp:
        st.info(f"**Lecture scenario: {name}.** {BY_NAME[name].look_at}", icon="🎓")
    elif name is not None:
        del st.session_state[_PRESET_ACTIVE]
