"""The room's warm-up inside the server: every lecture step run once as a visitor's tab would run it, through this
server's own websocket, with its heavy sections pressed.

Each step is one short session on `/_stcore/stream` (Streamlit's protocol, as `benchmarks/crowd.py` speaks it), so the
step's computations run in this process, through the gate beside everyone else's, and land in the shared store and
in this process's compiled programs. A second process (`python -m gradlab.ui.warm --fill --lecture`, which the room
started before) needs its own JAX: beside a 440 MB server it took the app to 953 MB (benchmarks/RESULTS.md), over
Community Cloud's 690.

A step's heavy sections (`ui.on_request`) run only when pressed; the walk's sessions carry `?_warm=<token>`, a secret
of this process (`pressing`), so a shared link cannot start them.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Callable, Iterable

import streamlit as st
import websockets
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

PARAM = "_warm"  # hidden from the copy box and the link check, as every `_` parameter
#: This process's secret: only its own walk presses heavy sections by link. `GRADLAB_WARM_TOKEN` sets it (the tests).
TOKEN = os.environ.get("GRADLAB_WARM_TOKEN") or secrets.token_urlsafe(16)


def pressing() -> bool:
    """Whether this script run is the warm-up's own (its heavy sections count as pressed)."""
    return secrets.compare_digest(st.query_params.get(PARAM, "").encode(), TOKEN.encode())  # a link may hold any text


def server_url() -> str:
    """This server's websocket, from its own options: `ws://127.0.0.1:8501/_stcore/stream`."""
    address = st.get_option("server.address") or "127.0.0.1"
    host = "127.0.0.1" if address in ("0.0.0.0", "::", "localhost") else address
    base = (st.get_option("server.baseUrlPath") or "").strip("/")
    return f"ws://{host}:{st.get_option('server.port')}/{base + '/' if base else ''}_stcore/stream"


async def run_page(url: str, page: str, query: str, *, timeout: float = 900) -> list[str]:
    """Run `page` (its url path, "" for Home) with `query` in a new session on the websocket `url` until its script
    finishes. **Returns** the messages of any exception it showed (empty: it ran clean). **Raises** TimeoutError after
    `timeout` s, OSError or `websockets` errors when the server does not answer."""
    msg = BackMsg()
    msg.rerun_script.query_string = query
    msg.rerun_script.page_name = page
    errors: list[str] = []
    async with websockets.connect(url, subprotocols=["streamlit"], max_size=None, ping_interval=None,
                                  open_timeout=60, close_timeout=5) as ws:
        await ws.send(msg.SerializeToString())
        async with asyncio.timeout(timeout):
            while True:
                fm = ForwardMsg()
                fm.ParseFromString(await ws.recv())
                kind = fm.WhichOneof("type")
                if kind == "delta" and fm.delta.new_element.WhichOneof("type") == "exception":
                    errors.append(fm.delta.new_element.exception.message[:300])
                elif kind == "script_finished" and fm.script_finished == ForwardMsg.FINISHED_SUCCESSFULLY:
                    return errors
                elif kind == "script_finished" and fm.script_finished == ForwardMsg.FINISHED_WITH_COMPILE_ERROR:
                    return [*errors, "the script did not compile"]
                # FINISHED_EARLY_FOR_RERUN: a rerun follows; a fragment's own run: the page goes on


def walk_lecture(steps: Iterable[int], *, url: str, token: str = TOKEN,
                 done: Callable[[int, list[str]], None] = lambda step, errors: None) -> None:
    """Run the lecture's `steps` (1-based) in order, each in a session of its own on `url` with its heavy sections
    pressed (`token`: the server's `TOKEN`), then once more in presenter mode; `done(step, errors)` after each. A step
    that shows an exception is reported and the walk goes on. **Raises** what `run_page` raises when the server cannot
    be reached.

    The second run computes nothing (the first stored every result): it builds the step's figures in the projector's
    style (`ui.figures`), so the projector's Next draws them instead of building them while the room's students' pages
    run beside it (step 11: 0.1–0.5 s instead of 2.2, `benchmarks/crowd.py` scenario 5 `--as-given`)."""

    async def walk():
        for step in steps:
            errors = await run_page(url, "lecture", f"step={step}&{PARAM}={token}")
            errors += await run_page(url, "lecture", f"step={step}&presenter=true&{PARAM}={token}")
            done(step, errors)

    asyncio.run(walk())
