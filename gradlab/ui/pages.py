"""The page registry: every page once, with its path, title, icon, URL path and the keys of its controls.

app.py builds the navigation from it, presets and lecture steps check the controls they set against it
and reset every other control of every page (so nothing carries over from one step to the next), the
warm-up visits its pages, and `ui.control` draws a page's control bound to the URL (its key is the query
parameter). A control's default is written once, where the page draws it: several depend on the data
(a batch size of min(256, N), a problem's own learning rate), so a reset removes the value and lets the
page compute its default again.
"""

from __future__ import annotations

import dataclasses

from gradlab.influence.methods import controls as influence_controls
from gradlab.practice import enabled as practice_enabled


@dataclasses.dataclass(frozen=True)
class Page:
    """One page: `path` (its script), `title`, `icon`, `url_path` and `controls` (widget keys = URL parameters);
    `reads`: another page's controls it reads from its own URL without drawing them (a link carries them)."""

    path: str
    title: str
    icon: str
    url_path: str
    controls: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()


PAGES: tuple[Page, ...] = (
    Page("views/home.py", "Home", ":material/home:", ""),
    Page("views/norms.py", "Gradient norms", ":material/bar_chart:", "norms", ("topk", "log", "checkpoint")),
    Page("views/equivalence.py", "Equivalence", ":material/drag_handle:", "equivalence", ("eq_example", "eq_reduction")),
    Page("views/performance.py", "Performance", ":material/timer:", "performance",
         ("perf_workload", "perf_approaches", "perf_sizes", "perf_repeats", "perf_loop_max")),
    Page("views/dp_clipping.py", "DP clipping", ":material/lock:", "dp_clipping",
         ("dp_clip_checkpoint", "dp_clip_c", "dp_clip_sigma", "dp_clip_batch", "dp_clip_log", "dp_sgd_q", "dp_sgd_steps",
          "dp_sgd_c", "dp_sgd_opt", "dp_sgd_mode", "dp_sgd_eps", "dp_sgd_sigma", "dp_sgd_lr", "dp_sgd_delta",
          "dp_sgd_accountant", "dp_sgd_seed")),
    Page("views/influence.py", "Influence", ":material/explore:", "influence",
         # the attribution methods declare their own controls (gradlab.influence.methods: λ, δ, solver, TRAK's, …)
         ("infl_method", *(c.key for c in influence_controls()), "infl_k", "infl_test", "infl_self", "infl_top_pct",
          "infl_retrain_k", "infl_lds_m", "infl_lds_t")),
    Page("views/privacy_audit.py", "Privacy audit", ":material/policy:", "privacy_audit",
         ("mia_pool", "mia_shadows", "mia_q", "mia_steps", "mia_c", "mia_eps", "mia_opt", "mia_lr", "audit_sigma",
          "audit_steps", "audit_q", "audit_c", "audit_trials", "audit_canary", "audit_bug")),
    Page("views/geometry.py", "Geometry", ":material/call_split:", "geometry",
         ("geo_problem", "geo_clip", "geo_noise", "geo_paths", "geo_c", "geo_sigma", "geo_batch", "geo_steps", "geo_lr",
          "geo_t", "geo_remove")),
    # issue 43: one example from every page's side (its card, `?example=123`) and every example's quantities together;
    # the audit's canary (`?rec_set=canary`) is the audit of the Privacy audit page's settings, which its link carries
    Page("views/record.py", "Example record", ":material/badge:", "record",
         ("example", "rec_set", "rec_c", "rec_eps", "rec_x", "rec_y", "rec_trial"),
         reads=("audit_sigma", "audit_steps", "audit_q", "audit_c", "audit_trials", "audit_canary", "audit_bug")),
    Page("views/lecture.py", "Lecture", ":material/school:", "lecture"),
    # GRADLAB_PRACTICE=off: a deployer who will not run visitors' code leaves the page out of the app
    *([Page("views/practice.py", "Practice", ":material/edit_note:", "practice", ("problem",))] if practice_enabled() else []),
)

BY_PATH: dict[str, Page] = {p.path: p for p in PAGES}
BY_URL: dict[str, Page] = {p.url_path: p for p in PAGES}


def page(path: str) -> Page:
    """The page whose script is `path`. **Raises** KeyError for a path not in `PAGES`."""
    return BY_PATH[path]


def control_keys() -> frozenset[str]:
    """Every page control's key (none is an `Experiment` field: those are the sidebar's)."""
    return frozenset(k for p in PAGES for k in p.controls)
