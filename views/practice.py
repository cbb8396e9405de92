"""Practice: the seeds' problems. Write the code, Run it, Check it against an oracle on hidden inputs, and read
what went wrong. The code runs in an OS sandbox (gradlab.practice.sandbox), one run at a time through Practice's
own gate slot; where no sandbox can be set up, a shared server offers each problem as a file instead. Progress
lives in the session and the URL (`?problem=fix_in_axes&solved=1,3`)."""

import numpy as np
import streamlit as st

from gradlab import costs, practice, ui

PROBLEMS = practice.PROBLEMS
SOLVED_KEY, SOLVED_PARAM = "_practice_solved", "solved"

st.title("Practice")
st.markdown(
    "The problems the seed tutorials pose, in course order: write per-example gradients with `vmap(grad)`, fix the "
    "classic mistakes, then the seed's exercise, a DP-SGD step, an influence score and a timing. **Run** shows what "
    "your code prints and returns; **Check** compares it with an answer computed another way (closed-form "
    "gradients in float64) on the seed's input and on hidden random ones, and names the mistake when it is a known "
    "one. Your code runs in a sandbox of its own: only `jax`, `numpy`, `math`, `functools` and `time`."
)
LOCAL_ADDRESSES = ("localhost", "127.0.0.1", "::1")
MODE = practice.mode(local=str(st.get_option("server.address") or "") in LOCAL_ADDRESSES)


# ---------------------------------------------------------------- progress: the session, mirrored in the URL

def solved() -> set[str]:
    """The problems this session solved (slugs); a link's `?solved=1,3` (problem numbers) is merged in once."""
    if SOLVED_KEY not in st.session_state:
        numbers = {s.strip() for s in st.query_params.get(SOLVED_PARAM, "").split(",")}
        st.session_state[SOLVED_KEY] = {p.slug for i, p in enumerate(PROBLEMS, 1) if str(i) in numbers}
    return st.session_state[SOLVED_KEY]


def mirror_progress() -> None:
    numbers = [str(i) for i, p in enumerate(PROBLEMS, 1) if p.slug in solved()]
    if numbers:
        st.query_params[SOLVED_PARAM] = ",".join(numbers)


done = solved()
slug = ui.choice(st.selectbox, "Problem", {p.slug: f"{i}. {p.title}" for i, p in enumerate(PROBLEMS, 1)}, "problem",
                 help="A link with `?problem=<name>` opens that problem.")
number = [p.slug for p in PROBLEMS].index(slug) + 1
problem = practice.BY_SLUG[slug]
if MODE.runs_code:
    practice.prepare(problem)  # a child with JAX imported waits for this visitor's run; the problem's code compiled
progress_slot, heading_slot = st.empty(), st.empty()  # filled at the end: a Check below may solve this problem
st.caption(f"From seed {problem.seed}" + (f" · expected on the seed's input: `{problem.expected}`" if problem.expected else ""))
st.markdown(problem.statement)


# ---------------------------------------------------------------- runs: Practice's own gate slot, never shared

def run_code(slug: str, code: str) -> practice.Verdict:
    return practice.run(practice.BY_SLUG[slug], code)


def check_code(slug: str, code: str) -> practice.Verdict:
    return practice.check(practice.BY_SLUG[slug], code)  # hidden inputs from a fresh seed, each Check its own


code_key, result_key, hints_key = f"practice_code_{slug}", f"_practice_result_{slug}", f"_practice_hints_{slug}"


def reset_code() -> None:
    st.session_state[code_key] = problem.starter
    st.session_state.pop(result_key, None)


st.html("<style>[class*='st-key-practice_code_'] textarea { font-family: 'Source Code Pro', monospace; "
        "font-size: 0.85rem; }</style>")  # an editor: code in a fixed-width font
st.session_state.setdefault(code_key, problem.starter)  # the editor's text lives in the session (reset sets it)
if MODE.message:
    (st.info if MODE.runs_code else st.warning)(MODE.message, icon=":material/shield:")
code = st.text_area("Your code", height=380, key=code_key,
                    help="Press Run or Check when done (Ctrl+Enter applies the edit).")
b_run, b_check, b_reset = st.columns([1, 1, 2])
pressed_run = b_run.button("Run", key="practice_run", icon=":material/play_arrow:", width="stretch",
                           disabled=not MODE.runs_code)
pressed_check = b_check.button("Check", key="practice_check", type="primary", icon=":material/task_alt:",
                               width="stretch", disabled=not MODE.runs_code)
b_reset.button("Back to the starter code", key="practice_reset", on_click=reset_code)
st.download_button("Download this problem as a Python file", practice.as_file(problem),
                   file_name=f"{slug}.py", mime="text/x-python", key="practice_file", icon=":material/download:")

if (pressed_run or pressed_check) and MODE.runs_code:
    reasons = practice.refusals(code)
    wait = None if reasons else ui.practice_wait()
    if reasons:  # refused before it reaches the gate: nothing runs
        verdict = practice.Verdict(False, practice.Outcome(refused=reasons))
    elif wait:
        verdict = practice.Verdict(False, practice.Outcome(stopped=wait))
    else:
        failed = practice.Outcome(stopped="Your code could not be run: see the message above.")
        verdict = practice.Verdict(False, failed)
        with ui.guard("Your code could not be run"):
            verdict = ui.sandboxed(check_code if pressed_check else run_code, slug, code,
                                   label="Checking your code" if pressed_check else "Running your code",
                                   est_seconds=costs.PRACTICE_SECONDS)
    st.session_state[result_key] = ("check" if pressed_check else "run", code, verdict)
    if pressed_check and verdict.passed:
        done.add(slug)
        mirror_progress()


def show(kind: str, ran_code: str, v: practice.Verdict) -> None:
    """The outcome of a Run or a Check, diagnosis first."""
    out = v.outcome
    if ran_code != code:
        st.caption("This is the result for an earlier version of your code.")
    if out.refused:
        st.error("**Your code was not run:** it uses what Practice does not allow.\n\n"
                 + "\n".join(f"- {_spans(r)}" for r in out.refused), icon=":material/block:")
        return
    if out.stopped:
        st.error(ui.inert(out.stopped), icon=":material/timer_off:")
    if kind == "check" and v.passed:
        st.success(f"**Correct** on the seed's input and {len(v.cases) - 1} hidden ones. Solved!",
                   icon=":material/check_circle:")
    elif kind == "check" and v.cases:
        st.error(f"**Not yet:** {sum(not c.passed for c in v.cases)} of {len(v.cases)} inputs give a different answer.",
                 icon=":material/close:")
    for d in v.diagnoses:
        st.warning(f"**{d.title}.** {d.explain}", icon=":material/lightbulb:")
    if out.exec_error:
        line = f" (line {out.exec_error['line']})" if out.exec_error.get("line") else ""
        st.error(f"**{ui.inert(out.exec_error['type'])}{line}:** {ui.inert(out.exec_error['message'])}",
                 icon=":material/bug_report:")
    for note in v.notes:
        st.info(note, icon=":material/info:")
    if out.output:
        st.markdown("**Output**")
        st.code(out.output + (f"\n… {out.truncated:,} more characters not shown" if out.truncated else ""), language=None)
    for c in v.cases:
        mark = ":green[:material/check:]" if c.passed else ":red[:material/close:]"
        with st.expander(f"{mark} {c.name}" + ("" if c.passed else f": {ui.inert(c.message)}"), expanded=kind == "run"):
            if c.got is not None:
                st.markdown("Your answer:")
                st.code(_text(c.got), language=None)
            if c.name.startswith("the seed") and c.expected is not None:
                st.markdown("Expected (computed another way):")
                st.code(_text(c.expected), language=None)
    fig = practice.figure(problem, v)
    if fig is not None:
        ui.chart(fig)
    st.caption(f"Ran in {out.seconds:.2f} s in a sandbox of its own." if MODE.os_wall else
               f"Ran in {out.seconds:.2f} s in a separate process on this machine (no OS sandbox).")


def _spans(reason: str) -> str:
    """A refusal as Markdown: its `code spans` (a name from the student's code: an identifier) stay code, which
    Markdown shows literally; everything else is inert text."""
    parts = reason.split("`")
    if len(parts) % 2 == 0:  # an odd number of backticks: all of it as text
        return ui.inert(reason)
    return "".join(ui.inert(p) if i % 2 == 0 else f"`{p}`" for i, p in enumerate(parts))


def _text(leaves) -> str:
    with np.printoptions(precision=5, suppress=True, threshold=40, edgeitems=4):
        return "\n".join("(not compared)" if x is None else f"shape {np.shape(x)}: {np.asarray(x)}" for x in leaves)


if result_key in st.session_state:
    show(*st.session_state[result_key])

# ---------------------------------------------------------------- explain it: choose the cause (a fix-it problem)
if problem.causes:
    st.markdown(f"**Explain it.** {problem.question}")
    chosen = st.radio("The cause", [c.text for c in problem.causes], index=None, key=f"practice_cause_{slug}",
                      label_visibility="collapsed")
    cause = next((c for c in problem.causes if c.text == chosen), None)
    if cause is not None and cause.right:
        st.success(f"{cause.why} Explained: solved!", icon=":material/check_circle:")
        done.add(slug)
    elif cause is not None:
        st.error(cause.why, icon=":material/close:")

# ---------------------------------------------------------------- hints one at a time, the solution behind a button
shown = st.session_state.get(hints_key, 0)


def show_hint() -> None:
    st.session_state[hints_key] = shown + 1


for i, hint in enumerate(problem.hints[:shown], 1):
    st.info(f"**Hint {i}.** {hint}", icon=":material/help:")
if shown < len(problem.hints):
    st.button(f"Show a hint ({shown + 1} of {len(problem.hints)})", key="practice_hint", on_click=show_hint)
if st.toggle("Show the solution", key=f"practice_solution_{slug}"):
    st.code(problem.solution, language="python")

progress_slot.progress(len(done) / len(PROBLEMS), text=f"Solved {len(done)} of {len(PROBLEMS)}" + (
    ": " + ", ".join(str(i) for i, p in enumerate(PROBLEMS, 1) if p.slug in done) if done else ""))
heading_slot.subheader(f"{number}. {problem.title}" + (" :green[:material/check_circle:]" if slug in done else ""))
mirror_progress()
