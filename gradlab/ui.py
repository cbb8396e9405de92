"""The Streamlit glue: experiment sidebar bound to the URL, caches, progress, errors, code panels.

Pages import this and the library; they hold no JAX math. Caches are keyed on the hashable
`Experiment` (never on JAX arrays). Heavy results are shared across sessions (`st.cache_*`): they
are immutable arrays, safe to share.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections import OrderedDict

import streamlit as st

from gradlab.data import DATASETS
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
    with sb:
        st.header("Experiment")
        dataset = _widget(st.selectbox, "Dataset", "dataset", options=list(DATASETS), index=0, format_func=DATASETS.get)
        model = _widget(st.selectbox, "Model", "model", options=list(MODELS), index=list(MODELS).index(d.model), format_func=MODELS.get)
        width, depth, activation = d.width, d.depth, d.activation
        if model == "mlp":
            width = _widget(st.select_slider, "Hidden width", "width", options=[8, 16, 32, 64, 128, 256, 512], value=d.width)
            depth = _widget(st.slider, "Hidden layers", "depth", min_value=1, max_value=4, value=d.depth)
        if model in ("mlp", "cnn"):
            activation = _widget(st.selectbox, "Activation", "activation", options=list(ACTIVATIONS), index=0)
        steps = _widget(st.select_slider, "Training steps", "steps", options=STEPS, value=d.steps)
        lr = _widget(st.select_slider, "Learning rate", "lr", options=LEARNING_RATES, value=d.lr, format_func=lambda v: f"{v:g}")
        label_noise = _widget(
            st.slider, "Label noise (fraction of training labels flipped)", "label_noise",
            min_value=0.0, max_value=1.0, value=d.label_noise, step=0.05,
            help="Flipped examples are remembered, so the pages can show how well a score finds them.",
        )
        seed = _widget(st.number_input, "Seed", "seed", min_value=0, max_value=10_000, value=d.seed, step=1)
        with st.expander("Advanced"):
            optimizer = _widget(st.selectbox, "Optimizer (optax)", "optimizer", options=list(OPTIMIZERS), format_func=OPTIMIZERS.get)
            batch_size = _widget(st.select_slider, "Batch size", "batch_size", options=[16, 32, 64, 128, 256, 512, 2048], value=d.batch_size)
            l2 = _widget(st.select_slider, "L2 penalty λ", "l2", options=[0.0, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1], value=d.l2, format_func=lambda v: f"{v:g}")
            checkpoint_every = _widget(st.select_slider, "Checkpoint every k steps", "checkpoint_every", options=[10, 25, 50, 100, 250, 500], value=d.checkpoint_every)
    return Experiment(
        dataset=dataset, model=model, width=int(width), depth=int(depth), activation=activation,
        optimizer=optimizer, lr=float(lr), steps=int(steps), batch_size=int(batch_size), l2=float(l2),
        label_noise=float(label_noise), seed=int(seed), checkpoint_every=int(checkpoint_every),
    )


def experiment() -> Experiment:
    """The experiment the sidebar set on this run (app.py renders the sidebar before the page)."""
    return st.session_state.get("_experiment", DEFAULT)


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
    """
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
    return st.cache_data(max_entries=max_entries, show_spinner=False)(fn)


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
