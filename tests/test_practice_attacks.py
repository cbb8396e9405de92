"""The hostile student's corpus (`benchmarks/attacks.py`): every attack contained, with the server as root (this
process) and as an ordinary user (a subprocess as `nobody`, as on Community Cloud), and no forged verdict.

Each attack is checked from outside: canaries of the server never reach the student, no marker file exists on the
machine after the run, no process of the run is left, the server gets no signal and its socket no connection, the
children's compilation cache is unchanged, and the server does not grow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from benchmarks import attacks
from benchmarks.browser import ROOT
from gradlab.practice import sandbox

needs_os_wall = pytest.mark.skipif(sandbox.os_wall() is not None, reason=f"no OS sandbox here: {sandbox.os_wall()}")
#: A few of each kind in the quick subset; the whole corpus in the whole suite.
QUICK = ("jax.version.os", "operator.attrgetter through np.random.mtrand", "generator frame", "fork",
         "read the server's environment", "TCP to the server's loopback", "signal the server",
         "forge the reply on its pipe", "a deeply nested reply", "write the children's compilation cache")


@pytest.fixture(scope="module")
def scene():
    s = attacks.Scene()
    yield s
    s.close()


def _marks(name: str):
    return [needs_os_wall] + ([] if name in QUICK else [pytest.mark.slow])


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in attacks.ATTACKS])
def test_attack_is_contained_with_the_server_as_root(name, scene):
    sandbox.prepare(attacks.SMALL)  # a visitor on the page: the next run's child is warm
    result = attacks.run_one(name, attacks.ATTACKS[name], scene)
    assert result.contained, (result.why, result.said)


def test_the_corpus_covers_every_category_of_the_issue():
    categories = {a.category for a in attacks.ATTACKS.values()}
    assert categories == {"language wall", "OS wall", "limits"} and len(attacks.LANGUAGE) + len(attacks.OS) >= 60
    assert len(attacks.LANGUAGE) >= 13


@needs_os_wall
@pytest.mark.slow
def test_no_verdict_can_be_forged(scene):
    results = attacks.forgeries(scene)
    assert len(results) == 3 and all(r.contained for r in results), [(r.name, r.why) for r in results]


AS_USER = """set -e
mkdir -p /tmp/.gradlab-pyenv
mount --bind "$1" /tmp/.gradlab-pyenv
mount -t tmpfs -o mode=755 tmpfs "$2"
mkdir -p "$1"
mount --bind /tmp/.gradlab-pyenv "$1"
shift 2
exec setpriv --reuid=65534 --regid=65534 --clear-groups "$@"
"""


#: The ordinary-user lane in parts, one server process each, so the suite's two workers share it (one part took
#: 2–5 min alone, the suite's longest test).
PARTS = 3


@needs_os_wall
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")),
                    reason="needs root to start a server as an ordinary user (unshare, setpriv)")
@pytest.mark.parametrize("part", range(PARTS))
def test_every_os_attack_is_contained_with_the_server_as_an_ordinary_user(part):
    """The server as `nobody` (bubblewrap then maps the sandbox into a user namespace of that user): the whole corpus
    (every `PARTS`-th attack from `part`) and the forgeries (part 0), in a private mount namespace where only the
    interpreter's folder of /root is visible to that user. (The first corpus's refused attacks never start a
    process: `refusals` does not depend on the user.)"""
    base = os.path.realpath(sys.base_prefix)
    store = tempfile.mkdtemp(prefix="gradlab-nobody-store-")  # pytest's own folders are closed to other users
    os.chown(store, 65534, 65534)
    env = {"PATH": os.environ["PATH"], "HOME": "/tmp", "GRADLAB_STORE_DIR": store, "JAX_PLATFORMS": "cpu",
           "GRADLAB_PRACTICE_PRIORITY": os.environ.get("GRADLAB_PRACTICE_PRIORITY", "idle")}
    if base.startswith("/root/"):  # pyenv's interpreters: /root is closed to others, so show them only that folder
        prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", AS_USER, "sh", base, "/root"]
    else:
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    cmd = [*prefix, sys.executable, "-m", "benchmarks.attacks", "--json", "--part", f"{part}/{PARTS}"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["uid"] == 65534 and report["os_wall"] is None
    bad = [(r["name"], r["why"]) for r in report["results"] if not r["contained"]]
    expected = len(range(part, len(attacks.ATTACKS), PARTS)) + (3 if part == 0 else 0)
    assert len(report["results"]) == expected and not bad, bad
