"""A lecture hall without browsers: light clients of Streamlit's own websocket protocol against one server.

Each visitor is one websocket session on `/_stcore/stream`, as a browser tab opens it: the subprotocol
`streamlit` (no Origin header, so no XSRF token is needed on the socket), a `BackMsg.rerun_script` with
the page's URL path (`page_name`) and its query string, then the `ForwardMsg`s the script run sends:
`new_session`, deltas (elements), `script_finished`. A visitor records, from its request:

- the time to its first `plotly_chart` element and to the end of the run (`script_finished`);
- whether an exception element or an error alert (`st.error`, what `ui.guard` shows) appeared;
- whether the gate's "Queued: n ahead" message appeared, and when.

A CSV upload goes the browser's way too: `file_urls_request` over the socket, an HTTP PUT of the file
(multipart, with the `_streamlit_xsrf` cookie as `X-Xsrftoken`), then a rerun whose widget state names
the uploaded file.

Scenarios (one fresh `streamlit run app.py` each run; `--dir` keeps the results store and XLA's cache
between runs: "warm"; without it both start empty in a temporary directory: "cold"):

1. `--visitors` N open Lecture step 1 (`/lecture?step=1`) and N open Gradient norms, spread over 5 s.
2. 10 visitors open Gradient norms; then, at once, each changes a different control (seed, learning rate,
   width, steps, label noise, dataset, model, checkpoint, top-k, log scale) as the browser does: the widget's
   new state in a rerun (of its fragment only, for the log-scale toggle). `--by url` instead opens the page
   with that one URL query parameter changed.
3. 5 visitors at once upload a different CSV (Gradient norms on "your own data").
4. The server is stopped and started again on the same store; the first visitor of each page's default
   view, one page at a time (before the restart, the same tour warms the store).
5. `--followers` N students open a lecture room's link (`/lecture?room=…`), polling as the browser's follow
   fragment does (its auto-rerun every second); the lecturer moves the room one step on: when does each
   student's URL reach the new step, and its first chart come?

6. A lecture as given: the lecturer opens step 1 and presses **Open a room** (the warm-up of every step starts in the
   server), then presses Next every `--pace` seconds (30) through the last step: each Next's server time and first
   chart, and how far the warm-up was when it was pressed.

`--servers 2` runs the same scenarios against two servers sharing the store and XLA cache behind nginx
(`benchmarks/balancer.py`, sticky by client address; each visitor connects from its own loopback address, so its
upload reaches its own server); memory is then each server's (the larger is reported, both are printed), and the
run ends with how many stored results were written twice (two servers computing one result).

Server memory is the peak, sampled every 0.2 s from /proc (`benchmarks/browser.Sampler`; psutil is not a
dependency), of the server's RSS plus its children's private pages. RSS counts the shared libraries' pages
(about 200 MB of JAX's, SciPy's…) that a memory-limited host reclaims before it kills anything; with
`--memory-limit 690` the server runs in a memory cgroup of that size, as on the smallest Community Cloud
instance, and the run ends with the cgroup's peak and how many processes the kernel killed for memory.

    python -m benchmarks.crowd                      # cold, full sizes (about 4 min on 2 cores)
    python -m benchmarks.crowd --visitors 3 --changes 3 --uploads 2 --scenarios 1,2,3
    python -m benchmarks.crowd --dir /tmp/crowd-warm   # run twice: the second run is warm
    python -m benchmarks.crowd --memory-limit 690      # as root: the server in a 690 MB memory cgroup
    python -m benchmarks.crowd --servers 2 --scenarios 1,2,3   # two servers behind nginx (Debian's nginx)
    python -m benchmarks.crowd --scenarios 5 --follow-step 1 --open-room   # a room opened by its button, as in class
    python -m benchmarks.crowd --scenarios 5 --follow-step 10 --as-given   # the warm-up done, the projector's Next
    python -m benchmarks.crowd --scenarios 6                 # a lecture at one step per 30 s after opening a room
    python -m benchmarks.crowd --scenarios 5 --follow-step 10 --as-given --busy 2   # both cores contended: a machine
                                                             # about half as fast (two busy loops beside the server)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import http.client
import io
import itertools
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path

import numpy as np
import websockets
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.Common_pb2 import FileURLs, UploadedFileInfo
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState

from benchmarks import balancer
from benchmarks.browser import MemoryLimit, Sampler, free_port, run_times, streamlit_server

ROOT = Path(__file__).resolve().parents[1]

QUEUED = "Queued"
#: Error alerts a page shows on purpose: the Equivalence page runs the seeds' pitfalls live and shows each
#: one's JAX error with this icon (an unexpected error, `ui.guard`'s, has the icon ⚠️).
DEMO_ERROR_ICONS = {":material/block:"}

#: (url path, title) of every page; the url path is the page file's stem ("" is Home).
PAGES = [("", "Home"), ("norms", "Gradient norms"), ("equivalence", "Equivalence"), ("performance", "Performance"),
         ("dp_clipping", "DP clipping"), ("influence", "Influence"), ("privacy_audit", "Privacy audit"),
         ("geometry", "Geometry"), ("lecture", "Lecture")]

#: Scenario 2: one control each, changed through the URL (the sidebar and page widgets are bound to it).
CHANGES = [("seed", "seed=1"), ("learning rate", "lr=0.03"), ("width", "width=32"), ("steps", "steps=200"),
           ("label noise", "label_noise=0.1"), ("dataset", "dataset=moons"), ("model", "model=linear"),
           ("checkpoint", "checkpoint=100"), ("top-k", "topk=8"), ("log scale", "log=true")]
#: Text the page shows only once the change took effect (checked where one is this simple).
CHANGED_TEXT = {"dataset": "Moons (2-D toy", "topk": "The 8 examples"}


@dataclasses.dataclass
class Visit:
    """What one visitor saw; times in seconds from its request (None: never)."""

    name: str
    page: str
    query: str = ""
    chart_s: float | None = None
    queued_s: float | None = None
    progress_s: float | None = None
    finished_s: float | None = None
    charts: int = 0
    exceptions: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    status: str = "pending"
    note: str = ""
    expect: str = ""  # a text the page must show (an upload: its file name)
    expect_seen: bool = False
    moved_s: float | None = None  # follow mode: when the page's URL reached the room's new step

    @property
    def sign_s(self) -> float | None:
        """When the visitor first saw that the server had its request: its place in the queue or a progress bar."""
        return min((t for t in (self.queued_s, self.progress_s) if t is not None), default=None)

    @property
    def clean(self) -> bool:
        """Finished, with no exception element and no error alert."""
        return self.status == "ok" and not self.exceptions and not self.errors


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/_stcore/stream"


#: Behind a load balancer that is sticky by client address (`--servers 2`), each visitor connects from its own
#: loopback address (127.0.0.2, 127.0.0.3, …: Linux routes all of 127/8 to itself), as each student's browser has
#: its own: its websocket, its XSRF cookie and its upload's PUT then all reach one server. None: 127.0.0.1.
_SOURCES: itertools.cycle | None = None


def distinct_sources(on: bool = True) -> None:
    """Give each new visitor (`Session`) its own loopback source address (`on`), or the default one."""
    global _SOURCES
    _SOURCES = itertools.cycle(f"127.0.{i // 250}.{i % 250 + 2}" for i in range(250 * 250)) if on else None


def _request(url: str, *, method: str = "GET", body: bytes | None = None, headers: dict | None = None,
             source: str | None = None, timeout: float = 60) -> http.client.HTTPResponse:
    """An HTTP request from the loopback address `source` (None: any); returns the read response."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout,
                                      source_address=(source, 0) if source else None)
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=body, headers=headers or {})
        r = conn.getresponse()
        r.read()
        if r.status >= 400:
            raise OSError(f"HTTP {r.status} from {method} {url}")
        return r
    finally:
        conn.close()


def xsrf_cookie(base: str, source: str | None = None) -> str:
    """The `_streamlit_xsrf` cookie the server sets (on /_stcore/health); an upload PUT must echo it."""
    r = _request(base + "/_stcore/health", source=source, timeout=30)
    for header in r.headers.get_all("Set-Cookie") or []:
        name, _, rest = header.partition("=")
        if name.strip() == "_streamlit_xsrf":
            return rest.split(";", 1)[0]
    return ""


def put_file(base: str, upload_url: str, name: str, data: bytes, cookie: str, source: str | None = None) -> int:
    """PUT `data` as a multipart form file to the upload URL (as the browser does); returns the HTTP status."""
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            f"Content-Type: text/csv\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    if cookie:
        headers |= {"X-Xsrftoken": cookie, "Cookie": f"_streamlit_xsrf={cookie}"}
    url = upload_url if upload_url.startswith("http") else base + upload_url
    return _request(url, method="PUT", body=body, headers=headers, source=source).status


class Session:
    """One visitor's websocket session (a browser tab without the browser)."""

    def __init__(self, base: str):
        self.base = base
        self.source = next(_SOURCES) if _SOURCES is not None else None  # this visitor's address (`distinct_sources`)
        self.ws = None
        self.session_id = ""
        self.widgets: dict[str, str] = {}  # element type/label -> widget id, of the last run
        self.bound: dict[str, tuple[str, object, str]] = {}  # URL key -> (element type, proto, fragment id)
        self.page = ""
        self.query = ""  # the URL's query string as the server last set it (bound widgets write it)
        self.page_hash = ""  # the page's script hash, as the server named it (the browser sends it back)
        self.auto_rerun: dict[str, float] = {}  # fragment id -> interval (s) of `st.fragment(run_every=…)`
        self.codes: list[str] = []  # the text of every code block shown (the room's links)
        self.progress = ""  # the text of the last progress bar shown

    async def __aenter__(self):
        # No pings: a busy 2-core server may answer a ping late, and the browser does not ping either.
        self.ws = await websockets.connect(ws_url(self.base), subprotocols=["streamlit"], max_size=None,
                                           ping_interval=None, open_timeout=120, close_timeout=5,
                                           **({"local_addr": (self.source, 0)} if self.source else {}))
        return self

    async def __aexit__(self, *exc):
        await self.ws.close()

    async def send(self, msg: BackMsg) -> None:
        await self.ws.send(msg.SerializeToString())

    async def rerun(self, visit: Visit, *, widget_states=(), fragment_id: str = "", auto: bool = False,
                    timeout: float = 600) -> Visit:
        """Run the page of `visit` with its query (and `widget_states`; only the fragment `fragment_id` if
        given); record until the run ends."""
        self.page, self.query = visit.page, visit.query
        msg = BackMsg()
        msg.rerun_script.query_string = visit.query
        msg.rerun_script.page_name = visit.page
        msg.rerun_script.widget_states.widgets.extend(widget_states)
        if fragment_id:
            msg.rerun_script.fragment_id = fragment_id
            msg.rerun_script.is_auto_rerun = auto
            msg.rerun_script.page_script_hash = self.page_hash  # a rerun the fragment asks for stays on this page
        msg.rerun_script.context_info.url = f"{self.base}/{visit.page}"
        msg.rerun_script.context_info.timezone = "UTC"
        msg.rerun_script.context_info.locale = "en-US"
        started = time.perf_counter()
        await self.send(msg)
        try:
            await asyncio.wait_for(self._read_run(visit, started), timeout)
        except TimeoutError:
            visit.status = f"timeout {timeout:.0f} s"
        except websockets.ConnectionClosed as err:
            visit.status = f"closed: {err}"
        return visit

    async def _read_run(self, visit: Visit, started: float) -> None:
        while True:
            fm = ForwardMsg()
            fm.ParseFromString(await self.ws.recv())
            now = time.perf_counter() - started
            kind = fm.WhichOneof("type")
            if kind == "new_session":
                self.session_id = fm.new_session.initialize.session_id or self.session_id
            elif kind == "navigation":  # st.navigation names the page it ran: the browser sends that hash back
                self.page_hash = fm.navigation.page_script_hash or self.page_hash
            elif kind == "page_info_changed":
                self.query = fm.page_info_changed.query_string
                visit.moved_s = now if visit.moved_s is None else visit.moved_s
            elif kind == "auto_rerun":
                self.auto_rerun[fm.auto_rerun.fragment_id] = fm.auto_rerun.interval
            elif kind == "delta" and fm.delta.WhichOneof("type") == "new_element":
                self._element(fm.delta.new_element, visit, now, fm.delta.fragment_id)
            elif kind == "script_finished":
                status = ForwardMsg.ScriptFinishedStatus.Name(fm.script_finished)
                if status in ("FINISHED_SUCCESSFULLY", "FINISHED_FRAGMENT_RUN_SUCCESSFULLY"):
                    visit.finished_s, visit.status = now, "ok"
                    return
                if status == "FINISHED_WITH_COMPILE_ERROR":
                    visit.finished_s, visit.status = now, "compile error"
                    return
                # FINISHED_EARLY_FOR_RERUN (a rerun follows) or a fragment's run: keep reading

    def _element(self, el, visit: Visit, now: float, fragment_id: str = "") -> None:
        kind = el.WhichOneof("type")
        key = getattr(getattr(el, kind), "query_param_key", "") if kind else ""
        if key:
            self.bound[key] = (kind, getattr(el, kind), fragment_id)
        if kind == "plotly_chart":
            visit.charts += 1
            if visit.chart_s is None:
                visit.chart_s = now
        elif kind == "exception":
            visit.exceptions.append(f"{el.exception.type}: {el.exception.message}"[:300])
        elif kind == "alert":
            body = el.alert.body
            if QUEUED in body and visit.queued_s is None:
                visit.queued_s = now
            if el.alert.format == el.alert.ERROR and el.alert.icon not in DEMO_ERROR_ICONS:
                visit.errors.append(body[:300])
        if visit.expect and not visit.expect_seen and visit.expect in str(getattr(el, kind, "")):
            visit.expect_seen = True
        if kind == "progress":
            self.progress = el.progress.text
            visit.progress_s = now if visit.progress_s is None else visit.progress_s
        elif kind == "file_uploader":
            self.widgets["file_uploader"] = el.file_uploader.id
        elif kind == "button":
            self.widgets[f"button/{el.button.label}"] = el.button.id
        elif kind == "code":
            self.codes.append(el.code.code_text)

    async def change(self, visit: Visit, key: str, value: str, *, timeout: float = 600) -> Visit:
        """Set the widget bound to URL key `key` to `value` (as written in a URL) as the browser does: its
        widget state in a rerun of the page (of its fragment only, when it lives in one)."""
        if key not in self.bound:
            visit.status = f"no widget bound to ?{key}= on the page"
            return visit
        kind, proto, fragment_id = self.bound[key]
        state = WidgetState(id=proto.id)
        if kind == "selectbox":
            state.string_value = value
        elif kind == "slider" and proto.type == proto.SELECT_SLIDER:
            state.string_array_value.data.append(value)
        elif kind == "slider":
            state.double_array_value.data.append(float(value))
        elif kind == "number_input":
            if proto.data_type == proto.INT:
                state.int_value = int(value)
            else:
                state.double_value = float(value)
        elif kind == "checkbox":
            state.bool_value = value.lower() == "true"
        else:
            visit.status = f"cannot set a {kind} widget"
            return visit
        # The browser rewrites the widget's URL parameter; leaving it out (as Streamlit's own agent interaction
        # does) keeps an old value from being put back, and the new value can only come from the widget state.
        visit.query = "&".join(p for p in self.query.split("&") if p and p.split("=", 1)[0] != key)
        return await self.rerun(visit, widget_states=[state], fragment_id=fragment_id, timeout=timeout)

    async def press(self, visit: Visit, label: str, *, timeout: float = 600) -> Visit:
        """Press the button labelled `label` that the last run showed, as the browser does (its trigger in a rerun)."""
        button = self.widgets.get(f"button/{label}")
        if not button:
            visit.status = f"no button {label!r} on the page"
            return visit
        return await self.rerun(visit, widget_states=[WidgetState(id=button, trigger_value=True)], timeout=timeout)

    async def upload(self, visit: Visit, name: str, data: bytes, *, timeout: float = 600) -> Visit:
        """Upload `data` as `name` to the page's file uploader (the last run must have shown it) and rerun."""
        uploader = self.widgets.get("file_uploader")
        if not uploader:
            visit.status = "no file uploader on the page"
            return visit
        request = BackMsg()
        request.file_urls_request.request_id = uuid.uuid4().hex
        request.file_urls_request.file_names.append(name)
        request.file_urls_request.session_id = self.session_id
        await self.send(request)
        while True:
            fm = ForwardMsg()
            fm.ParseFromString(await asyncio.wait_for(self.ws.recv(), 120))
            if fm.WhichOneof("type") == "file_urls_response" and \
                    fm.file_urls_response.response_id == request.file_urls_request.request_id:
                break
        urls = fm.file_urls_response.file_urls[0]
        cookie = await asyncio.to_thread(xsrf_cookie, self.base, self.source)
        await asyncio.to_thread(put_file, self.base, urls.upload_url, name, data, cookie, self.source)
        state = WidgetState(id=uploader)
        state.file_uploader_state_value.uploaded_file_info.append(UploadedFileInfo(
            name=name, size=len(data), file_id=urls.file_id,
            file_urls=FileURLs(file_id=urls.file_id, upload_url=urls.upload_url, delete_url=urls.delete_url)))
        return await self.rerun(visit, widget_states=[state], timeout=timeout)


async def visit(base: str, name: str, page: str, query: str = "", *, delay: float = 0.0,
                timeout: float = 600) -> Visit:
    """A new visitor opens `page` (url path, "" for Home) with `query` after `delay` s; returns what it saw."""
    await asyncio.sleep(delay)
    v = Visit(name, page, query)
    try:
        async with Session(base) as s:
            await s.rerun(v, timeout=timeout)
    except (OSError, websockets.WebSocketException, TimeoutError) as err:
        v.status = f"connect failed: {type(err).__name__}: {err}"
    return v


async def change_visit(base: str, name: str, page: str, key: str, value: str, start: asyncio.Event, ready: list,
                       *, timeout: float = 600) -> Visit:
    """A visitor opens `page`, waits for `start`, then changes the control bound to `?key=` to `value`."""
    v = Visit(name, page, expect=CHANGED_TEXT.get(key, ""))
    try:
        async with Session(base) as s:
            first = await s.rerun(Visit(name, page), timeout=timeout)
            ready.append(name)
            await start.wait()
            if first.status != "ok":
                v.status = f"before the change: {first.status}"
                return v
            await s.change(v, key, value, timeout=timeout)
            if v.status == "ok" and v.expect and not v.expect_seen:
                v.status = f"the page does not show {v.expect!r}: the change did not take"
            v.query = f"{key}={value} (widget)"
    except (OSError, websockets.WebSocketException, TimeoutError) as err:
        v.status = f"change failed: {type(err).__name__}: {err}"
    return v


async def changes(base: str, page: str, controls: list[tuple[str, str]], *, timeout: float = 600) -> list[Visit]:
    """Visitors each open `page`; once all have it, each changes one control (`(name, "key=value")`) at once."""
    start, ready = asyncio.Event(), []
    tasks = [asyncio.create_task(change_visit(base, f"change {what}", page, *kv.split("=", 1), start, ready,
                                              timeout=timeout)) for what, kv in controls]
    deadline = time.monotonic() + timeout
    while len(ready) < len(tasks) and time.monotonic() < deadline and not all(t.done() for t in tasks):
        await asyncio.sleep(0.1)
    start.set()
    return list(await asyncio.gather(*tasks))


async def upload_visit(base: str, name: str, csv: bytes, *, query: str = "dataset=upload",
                       timeout: float = 600) -> Visit:
    """A new visitor opens Gradient norms on "your own data", uploads `csv` and waits for the page."""
    v = Visit(name, "norms", query, expect=f"{name}.csv")
    try:
        async with Session(base) as s:
            first = await s.rerun(Visit(name, "norms", query), timeout=timeout)
            if first.status != "ok":
                v.status = f"before the upload: {first.status}"
                return v
            await s.upload(v, f"{name}.csv", csv, timeout=timeout)
            if v.status == "ok" and not v.expect_seen:
                v.status = "the page did not show the uploaded file"
    except (OSError, websockets.WebSocketException, TimeoutError) as err:
        v.status = f"upload failed: {type(err).__name__}: {err}"
    return v


async def follow_visit(base: str, name: str, room: str, step: int, moved: list, ready: list, *,
                       timeout: float = 600) -> Visit:
    """A student on the lecture page of `room` (at `step`), polling as the browser does (the follow fragment's
    auto-rerun every interval); returns, from the room's move (`moved[0]`, a `perf_counter` time), when its URL
    reached the next step (`moved_s`) and when the next step's first chart came (`chart_s`)."""
    v = Visit(name, "lecture", f"room={room}&step={step}")
    try:
        async with Session(base) as s:
            first = await s.rerun(Visit(name, "lecture", v.query), timeout=timeout)
            if first.status != "ok" or not s.auto_rerun:
                v.status = f"before the move: {first.status}" + ("" if s.auto_rerun else ", no follow fragment")
                return v
            ready.append(name)
            fragment, interval = next(iter(s.auto_rerun.items()))
            deadline = time.perf_counter() + timeout
            while time.perf_counter() < deadline:
                await asyncio.sleep(interval)
                sent = time.perf_counter()
                poll = await s.rerun(Visit(name, "lecture", s.query), fragment_id=fragment, auto=True, timeout=timeout)
                if f"step={step + 1}" in s.query.split("&"):
                    v.status, v.exceptions, v.errors = poll.status, poll.exceptions, poll.errors
                    v.moved_s = sent + (poll.moved_s or 0.0) - moved[0]
                    v.chart_s = None if poll.chart_s is None else sent + poll.chart_s - moved[0]
                    v.finished_s = None if poll.finished_s is None else sent + poll.finished_s - moved[0]
                    v.charts = poll.charts
                    return v
                if poll.status != "ok":
                    v.status = f"poll: {poll.status}"
                    return v
            v.status = "never moved"
    except (OSError, websockets.WebSocketException, TimeoutError) as err:
        v.status = f"follow failed: {type(err).__name__}: {err}"
    return v


#: Scenario 5: a function giving the server's CPU-seconds (`main` sets it), and what the followers' idle polling cost.
SERVER_CPU: list = []
IDLE: dict = {}


async def _follow_room(base: str, rooms_dir: str, code: str, key: str, n: int, step: int, *, settle: float,
                       timeout: float, before_move=None, move=None) -> list[Visit]:
    """`n` students open room `code`'s link on `step`; once all follow it (and `settle` s of polling went by, then
    `await before_move()` if given), the room moves to `step + 1` (as the speaker view's Next does; `await move()`
    instead when given: the projector's own Next). **Returns** each student's `Visit`, its times from the move."""
    from gradlab.rooms import Rooms

    moved, ready = [float("inf")], []
    tasks = [asyncio.create_task(follow_visit(base, f"follower-{i}", code, step, moved, ready, timeout=timeout))
             for i in range(n)]
    deadline = time.monotonic() + timeout
    while len(ready) < n and time.monotonic() < deadline and not all(t.done() for t in tasks):
        await asyncio.sleep(0.1)
    cpu = SERVER_CPU[0]() if SERVER_CPU else None
    await asyncio.sleep(settle)
    if cpu is not None:  # the followers' pages only poll the room meanwhile: what following costs the server
        IDLE["server_cpu_per_s"] = (SERVER_CPU[0]() - cpu) / settle
    if before_move is not None:
        await before_move()
    moved[0] = time.perf_counter()
    if move is None:
        Rooms(rooms_dir).move(code, key, step + 1)
    else:
        tasks.append(asyncio.create_task(move()))
    return list(await asyncio.gather(*tasks))[:n]


async def follow(base: str, rooms_dir: str, n: int, step: int, *, settle: float = 3.0,
                 timeout: float = 600) -> list[Visit]:
    """`n` students open a new room's students' link on `step`; once all follow it (and `settle` s of polling
    went by), the lecturer moves the room to `step + 1` (as the speaker view's Next does)."""
    from gradlab.rooms import Rooms

    code, key = Rooms(rooms_dir).open(step)
    return await _follow_room(base, rooms_dir, code, key, n, step, settle=settle, timeout=timeout)


async def _open_a_room(lecturer: Session, step: int, timeout: float) -> tuple[Visit, str]:
    """The `lecturer`'s session opens the lecture on `step` and presses **Open a room** (which starts the warm-up of
    every step inside the server). **Returns** `(first, link)`: its first visit of the step and the room's projector
    link (it holds `room=` and the speaker key `_key=`). **Raises** RuntimeError when no room opened."""
    first = await lecturer.rerun(Visit("lecturer", "lecture", f"step={step}"), timeout=timeout)
    opened = await lecturer.press(Visit("lecturer", "lecture", lecturer.query), "Open a room for a live lecture",
                                  timeout=timeout)
    links = [c for c in lecturer.codes if "room=" in c and "_key=" in c]
    if first.status != "ok" or opened.status != "ok" or not links:
        raise RuntimeError(f"the lecturer could not open a room: {first.status}, {opened.status}, {lecturer.codes}")
    return first, links[0]


async def follow_a_lecturer(base: str, rooms_dir: str, n: int, step: int, *, settle: float = 3.0,
                            timeout: float = 600):
    """As in class: a lecturer opens the lecture on `step` and presses **Open a room** (which starts the warm-up of
    every step inside the server), `n` students open the room's link, and once all follow it (and `settle` s went by)
    the lecturer's Next moves the room to `step + 1`, while the warm-up still computes. **Returns** `(visits, note)`:
    each student's `Visit` (times from the move) and what the warm-up had done by the move."""
    lecturer = Session(base)
    async with lecturer:
        _, link = await _open_a_room(lecturer, step, timeout)
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(link).query))
        opened_at, note = time.perf_counter(), []

        async def look_at_the_warm_up():  # the lecturer's own page, just before the Next: its progress bar
            warm = await lecturer.rerun(Visit("lecturer", "lecture", lecturer.query), timeout=timeout)
            note.append(f"the lecturer opened the room {time.perf_counter() - opened_at:.0f} s before the move; "
                        f"warm-up then: {lecturer.progress or 'no progress shown'} ({warm.status})")

        visits = await _follow_room(base, rooms_dir, query["room"], query["_key"], n, step, settle=settle,
                                    timeout=timeout, before_move=look_at_the_warm_up)
        return visits, note[0]


async def _refresh(lecturer: Session, timeout: float) -> str:
    """Rerun the `lecturer`'s page's fragments (as the browser does every second); **returns** the warm-up progress
    text they show now ("" once the bar is gone: the warm-up ended)."""
    lecturer.progress = ""  # what this refresh shows, not an earlier one's
    for fragment in list(lecturer.auto_rerun):
        await lecturer.rerun(Visit("lecturer", "lecture", lecturer.query), fragment_id=fragment, auto=True,
                             timeout=timeout)
    return lecturer.progress


async def _next(session: Session, name: str, timeout: float) -> Visit:
    """Press the lecture page's Next in `session` (the new step's page names its own fragments: the old ones are
    forgotten, since Streamlit never answers a gone fragment's rerun); **returns** the visit."""
    session.auto_rerun.clear()
    return await session.press(Visit(name, "lecture", session.query), "Next", timeout=timeout)


async def _until_warm(lecturer: Session, timeout: float) -> float:
    """Refresh the `lecturer`'s page until its warm-up progress bar is gone; **returns** the seconds waited.
    **Raises** TimeoutError after `timeout` s."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if not (await _refresh(lecturer, 60)).startswith("Warming up"):
            return time.perf_counter() - t0
        await asyncio.sleep(1.0)
    raise TimeoutError(f"the warm-up still ran after {timeout:.0f} s: {lecturer.progress}")


async def follow_a_lecture(base: str, rooms_dir: str, n: int, step: int, *, settle: float = 3.0,
                           timeout: float = 600):
    """Scenario 5 as a lecture is given (`--as-given`): the lecturer opens step 1, presses **Open a room** and waits
    for its warm-up to end; the tab becomes the projector (presenter mode) and presses Next up to `step`, as in class;
    then `n` students open the room's link, and the projector's Next moves them to `step + 1` (its own page runs beside
    theirs). **Returns** `(visits, note)`: each student's `Visit` (times from the Next) and the projector's."""
    lecturer = Session(base)
    async with lecturer:
        _, link = await _open_a_room(lecturer, 1, timeout)
        waited = await _until_warm(lecturer, timeout)
        query = urllib.parse.urlsplit(link).query
        room = dict(urllib.parse.parse_qsl(query))
        lecturer.auto_rerun.clear()
        await lecturer.rerun(Visit("projector", "lecture", query), timeout=timeout)
        for _ in range(1, step):
            await _next(lecturer, "projector", timeout)
        projector = []

        async def next_step():
            projector.append(await _next(lecturer, "projector", timeout))

        visits = await _follow_room(base, rooms_dir, room["room"], room["_key"], n, step, settle=settle,
                                    timeout=timeout, move=next_step)
        p = projector[0]
        return visits, (f"the warm-up ended {waited:.0f} s after the room opened; the projector's Next: chart "
                        f"{_s(p.chart_s)} s, run {_s(p.finished_s)} s ({p.status})")


async def lecture_at_pace(base: str, pace: float = 30.0, *, timeout: float = 600) -> tuple[Visit, list[dict]]:
    """Scenario 6: a lecturer opens the lecture's step 1, presses **Open a room** (which starts the warm-up of every step
    in the server) and then Next every `pace` seconds, counted from the room's opening, through the last step. Before
    each Next the lecturer's page refreshes its warm-up progress (its fragment's own rerun, as the browser's is every
    second). **Returns** `(first, rows)`: the first visit of step 1, and per Next a dict: `step` (reached), `at_s`
    (since the room opened), `warm` (the progress text just before), `finished_s` and `chart_s` (the Next's server
    time to the end of its run and to its first chart), `status`, `errors`."""
    from gradlab.ui.presets import LECTURE

    lecturer, rows = Session(base), []
    async with lecturer:
        first, _ = await _open_a_room(lecturer, 1, timeout)
        t0 = time.perf_counter()
        for step in range(2, len(LECTURE) + 1):
            await asyncio.sleep(max(0.0, t0 + pace * (step - 1) - time.perf_counter()))
            warm = await _refresh(lecturer, 30)  # the warm-up's progress, as the page shows it now
            at = time.perf_counter() - t0
            warm = warm if warm.startswith("Warming up") else "ended (no progress bar: every step ready)"
            v = await _next(lecturer, "lecturer", timeout)
            rows.append(dict(step=step, at_s=at, warm=warm, finished_s=v.finished_s, chart_s=v.chart_s,
                             status=v.status, errors=v.exceptions + v.errors))
    return first, rows


def crowd(base: str, visits: list[tuple[str, str, str]], *, spread: float = 0.0, seed: int = 0,
          timeout: float = 600) -> list[Visit]:
    """`visits` = [(name, page, query)], all started within `spread` s (random offsets); blocks until all end."""
    rng = random.Random(seed)

    async def run():
        return await asyncio.gather(*(visit(base, n, p, q, delay=rng.uniform(0, spread), timeout=timeout)
                                      for n, p, q in visits))

    return asyncio.run(run())


def make_csv(seed: int, rows: int = 400, features: int = 4) -> bytes:
    """A small classification CSV (numeric features, a 0/1 label), different for each seed."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features))
    w = rng.normal(size=features)
    y = (x @ w + 0.3 * rng.normal(size=rows) > 0).astype(int)
    out = io.StringIO()
    out.write(",".join([f"f{i}" for i in range(features)] + ["label"]) + "\n")
    for row, label in zip(x, y):
        out.write(",".join(f"{v:.5f}" for v in row) + f",{label}\n")
    return out.getvalue().encode()


# ---------------------------------------------------------------- reporting


def _q(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(values, q))


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


def summary_row(scenario: str, group: str, visits: list[Visit], peak_mb: tuple[float, float]) -> str:
    """One summary line; `peak_mb` is (RSS, anonymous) peak MB."""
    charts = [v.chart_s for v in visits if v.chart_s is not None]
    done = [v.finished_s for v in visits if v.finished_s is not None]
    queued = [v.queued_s for v in visits if v.queued_s is not None]
    signs = [v.sign_s for v in visits if v.sign_s is not None]
    bad = [v for v in visits if v.exceptions or v.errors]
    failed = [v for v in visits if v.status != "ok"]
    return (f"| {scenario} | {group} | {len(visits)} | {len(charts)} | {_s(_q(charts, 50))} | {_s(_q(charts, 95))} | "
            f"{_s(_q(done, 50))} | {_s(_q(done, 95))} | {len(bad)} | {len(failed)} | "
            f"{len(queued)} | {_s(statistics.median(queued)) if queued else '–'} | "
            f"{_s(statistics.median(signs)) if signs else '–'} / {_s(max(signs, default=None))} | "
            f"{peak_mb[0]:.0f} ({peak_mb[1]:.0f}) |")


SUMMARY_HEAD = ("| scenario | visitors | n | with chart | chart p50 s | chart p95 s | done p50 s | done p95 s | "
                "error/exception | not finished | saw Queued | Queued after s (median) | "
                "Queued or progress after s (median / max) | server peak MB (anonymous) |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

DETAIL_HEAD = ("| scenario | visitor | page?query | first chart s | done s | Queued after s | progress after s | "
               "error/exception | status |\n"
               "|---|---|---|---|---|---|---|---|---|")


def detail_row(scenario: str, v: Visit) -> str:
    bad = "; ".join(v.exceptions + v.errors)[:120].replace("|", "/").replace("\n", " ") or "no"
    where = f"/{v.page}" + (f"?{v.query}" if v.query else "")
    return (f"| {scenario} | {v.name} | `{where}` | {_s(v.chart_s)} | {_s(v.finished_s)} | {_s(v.queued_s)} | "
            f"{_s(v.progress_s)} | {bad} | {v.status}{' ' + v.note if v.note else ''} |")


# ---------------------------------------------------------------- the benchmark


class Peaks:
    """Peak-memory samplers (0.2 s) on each server's process tree: `.peak` and `.peak_anon` are the largest of any
    one server (each server is its own instance, with its own memory), `.each` says every server's."""

    def __init__(self, pids: list[int]):
        self.samplers = [Sampler(pid, interval=0.2) for pid in pids]
        for sampler in self.samplers:
            sampler.start()

    @property
    def peak(self) -> float:
        return max(s.peak for s in self.samplers)

    @property
    def peak_anon(self) -> float:
        return max(s.peak_anon for s in self.samplers)

    @property
    def each(self) -> str:
        return " / ".join(f"{s.peak:.0f} ({s.peak_anon:.0f})" for s in self.samplers)

    def stop(self) -> None:
        for sampler in self.samplers:
            sampler.stop.set()


class Server:
    """`servers` × `streamlit run app.py` sharing one results store and XLA cache, with a memory sampler; with more
    than one, nginx in front (`benchmarks/balancer.py`, sticky by client address) is `base`. `restart()` keeps the
    store, the caches and the ports (nginx keeps running)."""

    def __init__(self, directory: Path, log_dir: Path, limit_mb: float = 0.0, servers: int = 1):
        self.env = {"GRADLAB_STORE_DIR": str(directory / "store"), "JAX_COMPILATION_CACHE_DIR": str(directory / "xla"),
                    "GRADLAB_LOG_RUNS": "1"}
        self.log_dir, self.servers = log_dir, servers
        self.limits = [MemoryLimit(limit_mb) for _ in range(servers)] if limit_mb else [None] * servers
        self.ports = [free_port() for _ in range(servers)]
        self.starts = 0
        self._stack: contextlib.ExitStack | None = None
        self._nginx = contextlib.ExitStack()
        self.prefix: Path | None = None  # nginx's, with its access.log
        self.base = ""
        self.procs: list = []
        self.peaks: Peaks | None = None

    def start(self) -> float:
        """Start the servers (and nginx, the first time); returns the seconds until every /_stcore/health answered."""
        self.starts += 1
        t0 = time.perf_counter()
        self._stack = contextlib.ExitStack()
        self.procs = []
        for port, limit, log in zip(self.ports, self.limits, self.logs):
            base, proc = self._stack.enter_context(streamlit_server(port, timeout=300, env=self.env, limit=limit,
                                                                    log_path=log))
            self.procs.append(proc)
        if self.servers == 1:
            self.base = base
        elif self.prefix is None:
            port = free_port()
            self.prefix = self._nginx.enter_context(balancer.nginx(port, self.ports, sticky="$remote_addr"))
            self.base = f"http://127.0.0.1:{port}"
        return time.perf_counter() - t0

    @property
    def logs(self) -> list[Path]:
        """Each server's log of its current start."""
        return [self.log_dir / f"server{self.starts}{'abcdefgh'[i] if self.servers > 1 else ''}.log"
                for i in range(self.servers)]

    def run_times(self) -> list[list[tuple[str, float]]]:
        """Each server's script runs logged since its current start (`browser.run_times`)."""
        return [run_times(log) if log.exists() else [] for log in self.logs]

    def run_seconds_since(self, before: list[list]) -> float:
        """Server time of the script runs logged since `before` (an earlier `run_times()`), all servers together."""
        return sum(t for old, new in zip(before, self.run_times()) for _, t in new[len(old):])

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def close(self) -> None:
        """Stop the servers and nginx; print each memory cgroup's report."""
        self.stop()
        self._nginx.close()
        for i, limit in enumerate(self.limits):
            if limit is not None:
                r = limit.report()
                print(f"# memory cgroup{f' of server {i + 1}' if self.servers > 1 else ''}: limit {r['limit_mb']:.0f} MB, "
                      f"peak {r['peak_mb']:.0f} MB (with reclaimable file pages), processes killed for memory: "
                      f"{r['oom_kills']}", flush=True)
                limit.close()

    def measure(self) -> Peaks:
        """Fresh peak-memory samplers on the servers."""
        if self.peaks is not None:
            self.peaks.stop()
        self.peaks = Peaks([proc.pid for proc in self.procs])
        return self.peaks

    def routing(self) -> str:
        """Behind nginx: how many websockets each server got so far."""
        if self.prefix is None:
            return ""
        per = balancer.websockets_per_server(self.prefix, self.ports)
        return "websockets per server " + " / ".join(str(per[p]) for p in self.ports)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--visitors", type=int, default=30, help="scenario 1: visitors per page (N lecture + N norms)")
    ap.add_argument("--spread", type=float, default=5.0, help="scenario 1: the visitors arrive within this many s")
    ap.add_argument("--changes", type=int, default=len(CHANGES), help="scenario 2: how many of the 10 controls")
    ap.add_argument("--by", choices=["widget", "url"], default="widget",
                    help="scenario 2: change each control in an open page (widget state) or open a link with it")
    ap.add_argument("--uploads", type=int, default=5, help="scenario 3: visitors uploading a CSV each")
    ap.add_argument("--scenarios", default="1,2,3,4",
                    help="which scenarios, e.g. 1,4 (5: follow mode; 6: a lecture at --pace after opening a room)")
    ap.add_argument("--followers", type=int, default=30, help="scenario 5: students following a room")
    ap.add_argument("--follow-step", type=int, default=2, help="scenario 5: the room moves from this step to the next")
    ap.add_argument("--pace", type=float, default=30.0, help="scenario 6: seconds between the lecturer's Nexts")
    ap.add_argument("--open-room", action="store_true",
                    help="scenario 5 as in class: a lecturer's session presses Open a room (the warm-up of every step "
                         "then runs inside the server) and moves the room while it runs")
    ap.add_argument("--as-given", action="store_true",
                    help="scenario 5 as a lecture is given: the room opened by its button and its warm-up ended, the "
                         "lecturer's tab the projector, Next pressed up to --follow-step, then the students join and "
                         "the projector's Next moves them")
    ap.add_argument("--pages", default="", help="scenario 4: only these url paths (comma separated; 'home' for Home)")
    ap.add_argument("--dir", default="", help="keep the store and XLA cache here (warm on a second run); "
                                              "default: a new temporary directory (cold)")
    ap.add_argument("--timeout", type=float, default=600, help="per visitor, s")
    ap.add_argument("--detail", action="store_true", help="also list every visitor of scenario 1")
    ap.add_argument("--memory-limit", type=float, default=0,
                    help="run the server in a memory cgroup of this many MB (root; cgroup v1 or v2); each server in "
                         "its own with --servers")
    ap.add_argument("--servers", type=int, default=1,
                    help="this many servers sharing the store and XLA cache behind nginx (sticky by client address; "
                         "each visitor connects from its own loopback address)")
    ap.add_argument("--busy", type=int, default=0,
                    help="this many busy-loop processes run beside the server for the whole run (contended cores: a "
                         "stand-in for a slower or shared machine)")
    args = ap.parse_args(argv)
    scenarios = {int(s) for s in args.scenarios.split(",") if s.strip()}

    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="gradlab-crowd-"))
    warm = bool(args.dir) and (directory / "store").exists()
    directory.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="gradlab-crowd-logs-"))
    server = Server(directory, logs, args.memory_limit, args.servers)
    distinct_sources(args.servers > 1)
    written = balancer.ValueFiles(directory / "store", interval=0.1) if args.servers > 1 else None
    summary, details = [], []
    print(f"# crowd: {'warm' if warm else 'cold'} store and XLA cache in {directory}; server logs in {logs}", flush=True)
    print(f"# machine: {os.cpu_count()} cores; command: python -m benchmarks.crowd {' '.join(sys.argv[1:] if argv is None else argv)}",
          flush=True)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    if busy:
        print(f"# {len(busy)} busy-loop process(es) beside the server", flush=True)
    try:
        up = server.start()
        print(f"# {args.servers} server{'s behind nginx' if args.servers > 1 else ''} healthy after {up:.1f} s", flush=True)
        if written is not None:
            written.start()

        if 1 in scenarios:
            sampler = server.measure()
            n = args.visitors
            specs = [(f"lecture-{i}", "lecture", "step=1") for i in range(n)] + \
                    [(f"norms-{i}", "norms", "") for i in range(n)]
            t0 = time.perf_counter()
            visits = crowd(server.base, specs, spread=args.spread, timeout=args.timeout)
            print(f"# scenario 1: {time.perf_counter() - t0:.1f} s; peak MB (anonymous) {sampler.each}; {server.routing()}",
                  flush=True)
            summary.append(summary_row("1 arrive", f"Lecture step 1 (`/lecture?step=1`)", visits[:n], (sampler.peak, sampler.peak_anon)))
            summary.append(summary_row("1 arrive", "Gradient norms (`/norms`)", visits[n:], (sampler.peak, sampler.peak_anon)))
            if args.detail:
                details += [detail_row("1", v) for v in visits]
            else:
                details += [detail_row("1", v) for v in visits if not v.clean]

        if 2 in scenarios:
            sampler = server.measure()
            t0 = time.perf_counter()
            if args.by == "url":
                specs = [(f"change {what}", "norms", q) for what, q in CHANGES[: args.changes]]
                visits = crowd(server.base, specs, spread=1.0, timeout=args.timeout)
                group = "one control each, by URL (`/norms?…`)"
            else:
                visits = asyncio.run(changes(server.base, "norms", CHANGES[: args.changes], timeout=args.timeout))
                group = "one control each, widget changed in an open `/norms`"
            print(f"# scenario 2: {time.perf_counter() - t0:.1f} s; peak MB (anonymous) {sampler.each}; {server.routing()}",
                  flush=True)
            summary.append(summary_row("2 change", group, visits, (sampler.peak, sampler.peak_anon)))
            details += [detail_row("2", v) for v in visits]

        if 3 in scenarios and args.uploads:
            sampler = server.measure()

            async def uploads():
                return await asyncio.gather(*(upload_visit(server.base, f"upload-{i}", make_csv(i), timeout=args.timeout)
                                              for i in range(args.uploads)))

            t0 = time.perf_counter()
            visits = asyncio.run(uploads())
            print(f"# scenario 3: {time.perf_counter() - t0:.1f} s; peak MB (anonymous) {sampler.each}; {server.routing()}",
                  flush=True)
            for v in visits:
                v.note = "(times from the upload's rerun)"
            summary.append(summary_row("3 upload", "a different CSV each (`/norms?dataset=upload`)", visits, (sampler.peak, sampler.peak_anon)))
            details += [detail_row("3", v) for v in visits]

        if 4 in scenarios:
            pages = PAGES
            if args.pages:
                wanted = {"" if p == "home" else p for p in args.pages.split(",")}
                pages = [p for p in PAGES if p[0] in wanted]
            for when in ("before restart", "after restart"):
                if when == "after restart":
                    server.stop()
                    up = server.start()
                    print(f"# restarted: healthy after {up:.1f} s", flush=True)
                tour, peak = [], (0.0, 0.0)
                for path, title in pages:
                    sampler = server.measure()
                    before = server.run_times()
                    v = asyncio.run(visit(server.base, title, path, timeout=args.timeout))
                    time.sleep(0.3)  # the app logs its run time as the run ends
                    peak = (max(peak[0], sampler.peak), max(peak[1], sampler.peak_anon))
                    v.note = (f"(server run {server.run_seconds_since(before):.1f} s, "
                              f"peak {sampler.peak:.0f} MB, {sampler.peak_anon:.0f} anonymous)")
                    tour.append(v)
                    details.append(detail_row(f"4 {when}", v))
                    print(f"# 4 {when}: {title}: chart {_s(v.chart_s)} s, done {_s(v.finished_s)} s, {v.status}", flush=True)
                summary.append(summary_row(f"4 {when}", "first visitor, every page, one at a time", tour, peak))
        if 5 in scenarios:
            sampler = server.measure()
            from benchmarks.cold_page import cpu_seconds

            SERVER_CPU[:] = [lambda: sum(cpu_seconds(proc.pid) for proc in server.procs)]
            if args.as_given:
                visits, note = asyncio.run(follow_a_lecture(server.base, str(directory / "store" / "rooms"),
                                                            args.followers, args.follow_step, timeout=args.timeout))
                print(f"# scenario 5 as a lecture is given: {note}", flush=True)
            elif args.open_room:
                visits, note = asyncio.run(follow_a_lecturer(server.base, str(directory / "store" / "rooms"),
                                                             args.followers, args.follow_step, timeout=args.timeout))
                print(f"# scenario 5 with the room opened by its button: {note}", flush=True)
            else:
                visits = asyncio.run(follow(server.base, str(directory / "store" / "rooms"), args.followers,
                                            args.follow_step, timeout=args.timeout))
            moved = [v.moved_s for v in visits if v.moved_s is not None]
            charts = [v.chart_s for v in visits if v.chart_s is not None]
            print(f"# scenario 5: {len(moved)} of {len(visits)} followers moved; after the lecturer's move: URL "
                  f"p50 {_s(_q(moved, 50))} s, max {_s(max(moved, default=None))} s; first chart p50 "
                  f"{_s(_q(charts, 50))} s, max {_s(max(charts, default=None))} s (the last follower); while they "
                  f"followed the step before, the server ran {IDLE.get('server_cpu_per_s', float('nan')):.2f} "
                  f"CPU-s per s", flush=True)
            for v in visits:
                v.note = f"(URL moved after {_s(v.moved_s)} s)"
            summary.append(summary_row("5 follow", f"students following a room, step {args.follow_step} → "
                                                   f"{args.follow_step + 1} (times from the lecturer's move)",
                                       visits, (sampler.peak, sampler.peak_anon)))
            details += [detail_row("5", v) for v in visits if not v.clean or args.detail]
        if 6 in scenarios:
            sampler = server.measure()
            first, rows = asyncio.run(lecture_at_pace(server.base, args.pace, timeout=args.timeout))
            print(f"# scenario 6: a lecture at one step per {args.pace:g} s after the room opened; step 1 first drawn "
                  f"after {_s(first.finished_s)} s; peak MB (anonymous) {sampler.each}", flush=True)
            print("| Next to step | pressed at s (from the room's opening) | warm-up just before | Next's run s | "
                  "first chart s | status |\n|---|---|---|---|---|---|")
            for r in rows:
                print(f"| {r['step']} | {r['at_s']:.0f} | {r['warm'] or '–'} | {_s(r['finished_s'])} | "
                      f"{_s(r['chart_s'])} | {r['status']}{'; ' + r['errors'][0] if r['errors'] else ''} |", flush=True)
    finally:
        for proc in busy:
            proc.kill()
        server.close()
        if written is not None:
            twice = written.written_twice()
            print(f"# shared store: {len(written.present())} result files, {len(twice)} written twice (a value file "
                  f"replaced: two servers computed one result); {server.routing()}", flush=True)

    print()
    print(SUMMARY_HEAD)
    print("\n".join(summary))
    print()
    print(DETAIL_HEAD)
    print("\n".join(details))
    return 0


if __name__ == "__main__":
    sys.exit(main())
