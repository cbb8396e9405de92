"""A clean install from requirements.txt alone: JAX's persistent compile cache, as app.py configures it, writes
programs to disk (without `filelock`, JAX refuses a size-bounded cache and writes nothing)."""

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# app.py's compile-cache settings, read from app.py itself so the test follows it
SETTINGS = "\n".join(re.findall(r'^os\.environ\.setdefault\("JAX.*$', (ROOT / "app.py").read_text(), re.M))
PROBE = f"""
import os
{SETTINGS}
import jax.numpy as jnp
from gradlab import engine
loss = lambda w, x, y: (jnp.dot(w, x) - y) ** 2
print(engine.per_example_norms(loss, jnp.ones(3), jnp.ones((4, 3)), jnp.zeros(4)).shape)
"""


@pytest.mark.slow
def test_compile_cache_writes_programs_in_a_clean_venv_from_requirements_txt(tmp_path):
    assert "JAX_COMPILATION_CACHE_MAX_SIZE" in SETTINGS  # the bounded cache is what needs filelock
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-compile", "-r", str(ROOT / "requirements.txt")],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-2000:]
    cache = tmp_path / "xla"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PYTHON"))}
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    run = subprocess.run([python, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "filelock" not in run.stderr.lower(), run.stderr[-2000:]
    written = [p for p in cache.rglob("*") if p.is_file()]
    assert written, f"no compiled program written to {cache}; stderr: {run.stderr[-1000:]}"
    assert sys.version_info >= (3, 11)
