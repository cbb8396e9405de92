"""`memory.lean_compiles`: XLA:CPU's lean compile flags where the installed jaxlib has them, never an abort where it
has not, and the same per-example gradients with them on (in a child process: XLA reads XLA_FLAGS once, when a
process's first backend starts)."""

import os
import subprocess
import sys

import jaxlib
import pytest

from gradlab import memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child(code: str, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "GRADLAB_LEAN_XLA")}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def _jaxlib() -> tuple[int, int]:
    return tuple(int(p) for p in jaxlib.__version__.split(".")[:2])


@pytest.fixture
def fresh(monkeypatch):
    """`lean_compiles` not yet called, `XLA_FLAGS` and `GRADLAB_LEAN_XLA` unset (restored after the test)."""
    memory.lean_compiles.cache_clear()
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv("GRADLAB_LEAN_XLA", raising=False)
    yield monkeypatch
    memory.lean_compiles.cache_clear()


def test_the_flags_are_on_exactly_where_this_jaxlib_has_them(fresh):
    on = memory.lean_compiles()  # its own child process tries them
    if _jaxlib() <= (0, 10):  # jaxlib 0.10 has the switch; 0.11.2 and 0.12 do not (each tried, 2026-11-28)
        assert on and os.environ["XLA_FLAGS"] == " ".join(memory.LEAN_XLA_FLAGS)
    else:
        assert not on and "XLA_FLAGS" not in os.environ


def test_a_crowds_first_script_runs_start_one_child_not_one_each(fresh):
    """A room's 30 first script runs call it at once (app.py, every run): one child tries the flags (30 children
    importing JAX held 2.4 GB on a fresh server before the lock)."""
    import threading

    children = []
    real = subprocess.run

    def counted(*args, **kwargs):
        children.append(args[0])
        return real(*args, **kwargs)

    fresh.setattr(subprocess, "run", counted)
    fresh.setattr(memory, "LEAN_XLA_FLAGS", ("--xla_gradlab_no_such_flag=true",))  # refused: asked again if not kept
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(memory.lean_compiles())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [False] * 8 and len(children) == 1
    assert memory.lean_compiles() is False and len(children) == 1  # and never again in this process


def test_an_unknown_flag_is_left_out_instead_of_aborting_the_process(fresh):
    fresh.setattr(memory, "LEAN_XLA_FLAGS", ("--xla_gradlab_no_such_flag=true",))
    assert memory.lean_compiles() is False and "XLA_FLAGS" not in os.environ
    memory.lean_compiles.cache_clear()
    fresh.setenv("GRADLAB_LEAN_XLA", "0")  # off: XLA's defaults
    assert memory.lean_compiles() is False and "XLA_FLAGS" not in os.environ


def test_a_flag_the_user_set_is_theirs(fresh):
    fresh.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=true")
    assert memory.lean_compiles() is False and os.environ["XLA_FLAGS"] == "--xla_cpu_use_fusion_emitters=true"


@pytest.mark.slow  # a child process compiling a convolution's rules (~10 s)
def test_a_convolutions_per_example_norms_equal_a_loop_of_jax_grad_with_the_flags_on():
    code = """
import os
from gradlab import memory
on = memory.lean_compiles()
import jax, jax.numpy as jnp, numpy as np
from gradlab import engine
from gradlab.experiment import Experiment, init_model, load_data
from gradlab.losses import loss_for
exp = Experiment.for_model("simple_cnn").replace(dataset="fashion")
d = load_data(exp)
loss, model = loss_for(d.task), init_model(exp, d)
xs, ys = jnp.asarray(d.x_train[:6]), jnp.asarray(d.y_train[:6])
got = np.asarray(engine.per_example_norms(loss, model, xs, ys))
import equinox as eqx
want = [float(jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(eqx.filter_grad(lambda m: loss(m, x, y))(model)))))
        for x, y in zip(xs, ys)]
np.testing.assert_allclose(got, want, rtol=2e-5)
print(on, os.environ.get("XLA_FLAGS", ""))
"""
    got = _child(code)
    assert got.returncode == 0, got.stderr[-3000:]
    if _jaxlib() <= (0, 10):
        assert got.stdout.startswith("True"), got.stdout
