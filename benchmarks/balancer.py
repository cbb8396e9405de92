"""Servers behind a load balancer, as a deployment past one machine runs them: Debian's nginx in front of several
`streamlit run app.py` processes that share one results store. Used by `benchmarks/crowd.py --servers 2` and
`tests/test_two_servers.py`.

nginx runs as this user from a temporary prefix (`daemon off`) and sends each websocket to one server by
`hash $remote_port consistent`: sticky for the life of a connection, as Streamlit needs (a session lives in the
process that opened it). Every client here is 127.0.0.1, so `ip_hash` would send them all to one server. The
websocket upgrade headers are passed on; `access.log` in the prefix names the server of each request.

"Computed once" is counted on the shared store's disk (`ValueFiles`): `diskcache` keeps a value over 32 KB (a
trained model) in its own file with a fresh random name, and writing the key again replaces that file, so a value
file that appeared during a run and is gone at its end is a result written twice.
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
from pathlib import Path

from benchmarks.browser import wait_healthy

NGINX_CONF = """
{user}
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
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
        hash {sticky} consistent;
{servers}
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


def available() -> bool:
    """Whether Debian's nginx is installed (`apt-get install nginx`)."""
    return shutil.which("nginx") is not None


@contextlib.contextmanager
def nginx(port: int, upstreams: list[int], *, sticky: str = "$remote_port", timeout: float = 30):
    """nginx on `port` in front of the servers on `upstreams` (ports on 127.0.0.1), answering once a server's
    `/_stcore/health` does through it; yields its temporary prefix (`access.log` lists the routing).

    `sticky`: what picks the server (`hash … consistent`): `$remote_port` spreads one machine's connections (but
    an upload's PUT, on a connection of its own, may reach the other server: "Invalid session_id");
    `$remote_addr` keeps each client address on one server, as a deployment does (`docs/deploy.md`), and needs
    clients with addresses of their own (`crowd.distinct_sources`)."""
    tmp = Path(tempfile.mkdtemp(prefix="gradlab-nginx-"))
    # As root, nginx's workers would switch to `nobody`, who cannot write the temporary prefix: keep this user.
    user = f"user {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name};" if os.getuid() == 0 else ""
    servers = "\n".join(f"        server 127.0.0.1:{p};" for p in upstreams)
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(user=user, tmp=tmp, port=port, servers=servers, sticky=sticky))
    proc = subprocess.Popen(["nginx", "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    error_log = tmp / "error.log"
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", timeout, "nginx", poll=0.2,
                     exit_detail=lambda: f": {error_log.read_text()[-2000:]}" if error_log.exists() else "")
        yield tmp
    finally:
        proc.terminate()  # SIGTERM: fast shutdown, the access log is flushed
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def websockets_per_server(prefix: Path, upstreams: list[int]) -> dict[int, int]:
    """How many websocket sessions (`/_stcore/stream`) nginx in `prefix` sent to each upstream port so far."""
    log = prefix / "access.log"
    routed = [line.split()[1] for line in (log.read_text().splitlines() if log.exists() else [])
              if "_stcore/stream" in line and len(line.split()) > 1]
    return {p: sum(u.endswith(f":{p}") for u in routed) for p in upstreams}


class ValueFiles(threading.Thread):
    """Every value file (`*.val`) that appears under `directory` while it runs (polled every `interval` s);
    `written_twice()` once stopped: the value files seen that are gone (a result written again, or evicted when
    the store passes its size bound)."""

    def __init__(self, directory: Path, interval: float = 0.01):
        super().__init__(daemon=True)
        self.directory, self.interval, self.seen, self.stop = Path(directory), interval, set(), threading.Event()

    def present(self) -> set[str]:
        return {os.path.join(d, f) for d, _, fs in os.walk(self.directory) for f in fs if f.endswith(".val")}

    def run(self):
        while not self.stop.is_set():
            self.seen.update(self.present())
            time.sleep(self.interval)

    def written_twice(self) -> set[str]:
        """Stop polling; the value files that appeared and were replaced."""
        self.stop.set()
        self.join()
        return self.seen - self.present()
