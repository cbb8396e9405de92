"""The DP-SGD audit's Streamlit glue, shared by the Privacy audit page and its canary's record card.

Both pages call the one shared computation `run` (a page's own function would be keyed by its file, so the card
would audit again what the page has stored), with the settings the Privacy audit page's controls hold: the page
draws them with `CONTROLS` (default and range, written once here), and the card reads them from its link
(`from_url`), which `link` writes. `result` is the section both pages show: the stored audit, or its button with
its CPU-second estimate.

Streamlit drops a page's widget-bound parameters from a link to another page within one session, so a click from the
Privacy audit page reaches the card without them: the card then takes this session's last audit (`card_settings`) and
writes its settings back into its own URL (`show_in_url`), so its address reproduces it.
"""

from __future__ import annotations

import math
from typing import Mapping

import streamlit as st
from streamlit.errors import StreamlitAPIException

from gradlab import audit, costs
from gradlab.ui.cache import on_request, shared

NO_BUG = "none (correct DP-SGD)"
TRIALS = (4096, 16384, 65536, 131072, 262144)

#: The Privacy audit page's number controls (their keys are declared in `gradlab.ui.pages`): each one's default and
#: range, as the page passes them to its widget; the canary's card holds a link's values to the same ranges.
CONTROLS: dict[str, dict] = {
    "audit_sigma": dict(value=2.0, min_value=0.3),
    "audit_steps": dict(value=1, min_value=1, max_value=16),
    "audit_q": dict(value=1.0, min_value=0.01, max_value=1.0),
    "audit_c": dict(value=1.0, min_value=0.01),
    "audit_trials": dict(options=list(TRIALS), value=16384),
}
#: The settings' order in `run`'s arguments (σ, T, q, C, trials, canary, bug) and the URL parameter of each.
KEYS = ("audit_sigma", "audit_steps", "audit_q", "audit_c", "audit_trials", "audit_canary", "audit_bug")
_LAST = "_audit_last"  # this session's last audit settings (`card_settings`)


def cost(sigma, steps, q, c, trials, canary, bug):
    """Estimated CPU-seconds of the audit (`costs.audit_seconds`)."""
    return costs.audit_seconds(trials=trials, steps=steps, canary=canary)


@shared(label="Auditing", cost=cost)
def run(sigma, steps, q, c, trials, canary, bug, progress):
    """`audit.audit_dp_sgd` with the page's settings, shared by every session and both pages (keyed on each one)."""
    return audit.audit_dp_sgd(noise_multiplier=sigma, steps=steps, sample_rate=q, clip_norm=c, bug=bug, trials=trials,
                              canary=canary, progress=lambda i, n: progress(i / n, f"training run {i} of {n}"))


def result(settings: tuple) -> audit.AuditResult | None:
    """The audit of `settings` (`KEYS`' order, `bug` None for none): the stored result at once, else the button with
    its estimate (a link never starts it), or over the work budget a warning with the most trials that fit. None until
    asked for."""
    st.session_state[_LAST] = settings
    fits = costs.largest(TRIALS, lambda t: cost(*settings[:4], t, *settings[5:]))
    return on_request(run, *settings, name="audit", button="Run the audit",
                      fix=f"Use at most {fits:,} trials or fewer steps." if fits else "Use fewer steps.")


def arguments(sigma, steps, q, c, trials, canary, bug: str) -> tuple:
    """The controls' values as `run`'s arguments: numbers as floats and ints, the bug None for `NO_BUG`."""
    return float(sigma), int(steps), float(q), float(c), int(trials), canary, None if bug == NO_BUG else bug


def link(settings: tuple) -> dict[str, str]:
    """`settings` (`run`'s arguments) as the Privacy audit page's URL parameters: what a link to its canary carries."""
    sigma, steps, q, c, trials, canary, bug = settings
    values = (repr(float(sigma)), str(int(steps)), repr(float(q)), repr(float(c)), str(int(trials)), canary,
              NO_BUG if bug is None else bug)
    return dict(zip(KEYS, values))


def _number(params: Mapping[str, str], key: str, kind: type, name: str):
    spec = CONTROLS[key]
    if key not in params:
        return spec["value"]
    raw = params[key]
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"the link's {key}={raw!r} is not a number ({name})") from None
    if not math.isfinite(value) or (kind is int and value != int(value)):
        raise ValueError(f"the link's {key}={raw!r} is not a {'whole ' if kind is int else ''}number ({name})")
    if "options" in spec and value not in spec["options"]:
        raise ValueError(f"the link's {key}={raw!r} is not one of {', '.join(f'{o:,}' for o in spec['options'])} ({name})")
    low, high = spec.get("min_value", -math.inf), spec.get("max_value", math.inf)
    if not low <= value <= high:
        side = f"below {low:g}, the lowest" if value < low else f"above {high:g}, the highest"
        raise ValueError(f"the link's {key}={raw!r} is {side} the Privacy audit page takes ({name})")
    return kind(value)


def from_url(params: Mapping[str, str]) -> tuple:
    """The audit's settings (`run`'s arguments) from URL parameters `params` (`st.query_params`), each one missing
    at the Privacy audit page's default.

    **Raises** `ValueError` naming the parameter, for a value that page's control would not take (not a number, out of
    its range, an unknown canary or bug).
    """
    canary = params.get("audit_canary", next(iter(audit.CANARIES)))
    if canary not in audit.CANARIES:
        raise ValueError(f"the link's audit_canary={canary!r} is not a canary: choose {' or '.join(audit.CANARIES)}")
    bug = params.get("audit_bug", NO_BUG)
    if bug != NO_BUG and bug not in audit.BUGS:
        raise ValueError(f"the link's audit_bug={bug!r} is not a planted bug: choose one of {', '.join(audit.BUGS)}")
    return arguments(_number(params, "audit_sigma", float, "the noise multiplier σ"),
                     _number(params, "audit_steps", int, "the steps T"),
                     _number(params, "audit_q", float, "the sampling rate q"),
                     _number(params, "audit_c", float, "the clipping norm C"),
                     _number(params, "audit_trials", int, "the trials"), canary, bug)


def card_settings(params: Mapping[str, str]) -> tuple:
    """The settings of the audit whose canary the card shows: the link's (`from_url`) when it names any of `KEYS`;
    else this session's last audit (`result`: a click from the Privacy audit page, whose bound parameters Streamlit
    drops on the way); else the Privacy audit page's defaults. **Raises** `ValueError` as `from_url`."""
    if any(k in params for k in KEYS):
        return from_url(params)
    return st.session_state.get(_LAST) or from_url({})


def show_in_url(settings: tuple) -> None:
    """Write `settings` into this page's URL, so its address (and the sidebar's share link) reproduces the card. In
    the one run right after a switch from the Privacy audit page, its controls still hold these parameters (Streamlit
    lets go of them at the end of that run): the URL then waits for the next run."""
    try:
        st.query_params.update(link(settings))
    except StreamlitAPIException:  # still bound to the other page's widgets
        pass
