"""Two servers behind nginx share one results store: a crowd on the same view gets charts and no errors,
and the result is computed once.

nginx and the "computed once" count are `benchmarks/balancer.py`'s (`benchmarks/crowd.py --servers 2` runs the
crowd scenarios the same way): two `streamlit run app.py` processes with the same `GRADLAB_STORE_DIR`, each
websocket sent to one of them by its remote port. The clients are the light websocket clients of
`benchmarks/crowd.py`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import tempfile
import time
from pathlib import Path

import pytest

from benchmarks import balancer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not balancer.available(),
                       reason="nginx is not installed (apt-get install nginx): this test puts nginx in front of "
                              "two streamlit servers"),
]

VISITORS = 6
PAGE, QUERY = "norms", "steps=50&checkpoint_every=25"  # identical settings for everyone, a quick training


def test_two_servers_share_one_store_behind_nginx():
    from benchmarks import crowd
    from benchmarks.browser import free_port, streamlit_server

    store = Path(tempfile.mkdtemp(prefix="gradlab-two-servers-store-"))
    logs = Path(tempfile.mkdtemp(prefix="gradlab-two-servers-logs-"))
    env = {"GRADLAB_STORE_DIR": str(store)}
    port_a, port_b, port = free_port(), free_port(), free_port()
    files = balancer.ValueFiles(store)
    with contextlib.ExitStack() as stack:
        stack.enter_context(streamlit_server(port_a, env=env, log_path=logs / "a.log", timeout=180))
        stack.enter_context(streamlit_server(port_b, env=env, log_path=logs / "b.log", timeout=180))
        prefix = stack.enter_context(balancer.nginx(port, [port_a, port_b]))
        files.start()
        # on a thread of its own: a worker that ran a browser test before holds Playwright's event loop on this one
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            visits = pool.submit(crowd.crowd, f"http://127.0.0.1:{port}",
                                 [(f"v{i}", PAGE, QUERY) for i in range(VISITORS)], spread=0.0, timeout=420).result()
        time.sleep(0.5)
        replaced = files.written_twice()
    per_server = balancer.websockets_per_server(prefix, [port_a, port_b])
    report = "\n".join(f"{v.name}: {v.status}, chart {v.chart_s}, errors {v.exceptions + v.errors}" for v in visits)

    for v in visits:
        assert v.status == "ok", report
        assert v.chart_s is not None, report
        assert not v.exceptions and not v.errors, report
    assert sum(per_server.values()) == VISITORS, per_server

    # a result written twice leaves a replaced value file behind (diskcache writes a new file and removes the old)
    present = files.present()
    print(f"websockets per server {per_server}; {len(present)} results on disk, {len(replaced)} written twice")
    assert present, f"nothing was written to the shared store {store}"
    assert not replaced, f"{len(replaced)} results computed twice by two servers sharing one store ({per_server})"
