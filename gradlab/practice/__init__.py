"""Practice: the seeds' problems, solved in the browser, checked against an oracle and diagnosed, run safely.

- `problems`: the problems in course order (`PROBLEMS`, `BY_SLUG`), each with its oracle and pitfalls;
- `checker`: `run(problem, code)` and `check(problem, code)` return a `Verdict` (cases, diagnoses, output);
  `prepare(problem)` readies a visitor's next run (a warm child, the reference compiled into the children's cache);
- `sandbox`: the language wall (`refusals`, RestrictedPython), the OS wall (`os_wall`, bubblewrap and seccomp), the
  run itself (`execute`) and what this server may run (`mode`).

Nothing here imports Streamlit: `views/practice.py` draws it.
"""

import os

from gradlab.practice.checker import HIDDEN_SEED, Case, Verdict, as_file, check, figure, fill_cache, prepare, run
from gradlab.practice.problems import BY_SLUG, PROBLEMS, Cause, Key, Pitfall, Problem
from gradlab.practice.sandbox import LIMITS, Limits, Mode, Outcome, execute, mode, os_wall, refusals


def enabled() -> bool:
    """Whether this server offers Practice: `GRADLAB_PRACTICE=off` (or 0, false, no) turns it off."""
    return os.environ.get("GRADLAB_PRACTICE", "on").strip().lower() not in ("off", "0", "false", "no")


__all__ = ["BY_SLUG", "HIDDEN_SEED", "LIMITS", "PROBLEMS", "Case", "Cause", "Key", "Limits", "Mode", "Outcome",
           "Pitfall", "Problem", "Verdict", "as_file", "check", "enabled", "execute", "figure", "fill_cache", "mode",
           "os_wall", "prepare", "refusals", "run"]
