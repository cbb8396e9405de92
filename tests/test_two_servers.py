"""Two servers behind nginx share one results store: a crowd on the same view gets charts and no errors,
and the result is computed once.

nginx (run as this user from a temporary prefix, `daemon off`) sends each websocket to one of two
`streamlit run app.py` processes by `hash $remote_port consistent` (every client here is 127.0.0.1, so
`ip_hash` would send them all to one server), with the websocket upgrade headers. Both servers get the
same `GRADLAB_STORE_DIR`. The clients are the light websocket clients of `benchmarks/crowd.py`.

"Computed once" is counted on the shared store's disk: `diskcache` keeps a value over 32 KB (a trained
model) in its own file with a fresh random name, and writing the key again replaces that file, so a value
file that appeared during the run and is gone at its end is a result written twice.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("nginx") is None,
                       reason="nginx is not installed (apt-get install nginx): this test puts nginx in front of "
                              "two streamlit servers"),
]

VISITORS = 6
PAGE, QUERY = "norms", "steps=50&checkpoint_every=25"  # identical settings for everyone, a quick training

NGINX_CONF = """
{user}
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
    log_format upstream '$remote_port $upstream_addr "$request" $status';
    access_log {tmp}/access.log upstream;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
    upstream gradlab {{
        hash $remote_port consistent;
        server 127.0.0.1:{port_a};
        server 127.0.0.1:{port_b};
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 6m;
        location / {{
            proxy_pass http://gradlab;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $host;
            proxy_read_timeout 1h;
            proxy_buffering off;
        }}
    }}
}}
"""


@contextlib.contextmanager
def nginx(port: int, port_a: int, port_b: int):
    """nginx on `port` in front of two servers; yields its temporary prefix (access.log lists the routing)."""
    tmp = Path(tempfile.mkdtemp(prefix="gradlab-nginx-"))
    # As root, nginx's workers would switch to `nobody`, who cannot write the temporary prefix: keep this user.
    user = f"user {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name};" if os.getuid() == 0 else ""
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(user=user, tmp=tmp, port=port, port_a=port_a, port_b=port_b))
    proc = subprocess.Popen(["nginx", "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while True:
            if proc.poll() is not None:
                log = (tmp / "error.log").read_text() if (tmp / "error.log").exists() else ""
                raise RuntimeError(f"nginx exited with code {proc.returncode}: {log[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise TimeoutError("nginx did not answer within 30 s")
            time.sleep(0.2)
        yield tmp
    finally:
        proc.terminate()  # SIGTERM: fast shutdown, the access log is flushed
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ValueFiles(threading.Thread):
    """Every value file (`*.val`) that appears under `directory` while it runs (polled every 10 ms)."""

    def __init__(self, directory: Path):
        super().__init__(daemon=True)
        self.directory, self.seen, self.stop = directory, set(), threading.Event()

    def run(self):
        while not self.stop.is_set():
            for dirpath, _, files in os.walk(self.directory):
                self.seen.update(os.path.join(dirpath, f) for f in files if f.endswith(".val"))
            time.sleep(0.01)


def test_two_servers_share_one_store_behind_nginx():
    from benchmarks import crowd
    from benchmarks.browser import free_port, streamlit_server


    store = Path(tempfile.mkdtemp(prefix="gradlab-two-servers-store-"))
    logs = Path(tempfile.mkdtemp(prefix="gradlab-two-servers-logs-"))
    env = {"GRADLAB_STORE_DIR": str(store)}
    port_a, port_b, port = free_port(), free_port(), free_port()
    files = ValueFiles(store)
    with contextlib.ExitStack() as stack:
        stack.enter_context(streamlit_server(port_a, env=env, log_path=logs / "a.log", timeout=180))
        stack.enter_context(streamlit_server(port_b, env=env, log_path=logs / "b.log", timeout=180))
        prefix = stack.enter_context(nginx(port, port_a, port_b))
        files.start()
        visits = crowd.crowd(f"http://127.0.0.1:{port}", [(f"v{i}", PAGE, QUERY) for i in range(VISITORS)],
                             spread=0.0, timeout=420)
        time.sleep(0.5)
        files.stop.set()
        files.join()
    routed = [line.split()[1] for line in (prefix / "access.log").read_text().splitlines() if "_stcore/stream" in line]
    per_server = {p: sum(u.endswith(f":{p}") for u in routed) for p in (port_a, port_b)}
    report = "\n".join(f"{v.name}: {v.status}, chart {v.chart_s}, errors {v.exceptions + v.errors}" for v in visits)

    for v in visits:
        assert v.status == "ok", report
        assert v.chart_s is not None, report
        assert not v.exceptions and not v.errors, report
    assert sum(per_server.values()) == VISITORS, (per_server, routed)

    # a result written twice leaves a replaced value file behind (diskcache writes a new file and removes the old)
    present = {os.path.join(d, f) for d, _, fs in os.walk(store) for f in fs if f.endswith(".val")}
    replaced = files.seen - present
    print(f"websockets per server {per_server}; {len(present)} results on disk, {len(replaced)} written twice")
    assert present, f"nothing was written to the shared store {store}"
    assert not replaced, f"{len(replaced)} results computed twice by two servers sharing one store ({per_server})"
