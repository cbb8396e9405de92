"""Open the explorer on your own model: `python -m gradlab serve my_model.py` and `gradlab.explore(...)`.

Both start `streamlit run app.py` as a child process of the caller, with the model named by the server's
start-up setting `GRADLAB_OWN_MODEL` (`gradlab.own`): the user's code runs on the user's machine, in the
user's own process tree. The file is loaded here first, so a module that breaks the contract fails in the
terminal or notebook with the reason, before a browser opens.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from gradlab import own

#: The Streamlit entry point: app.py at the repository root (an editable install, `pip install -e .`).
APP = Path(__file__).resolve().parents[1] / "app.py"


@dataclasses.dataclass
class Server:
    """A running explorer: its `process` (a `subprocess.Popen`) and the `url` to open."""

    process: subprocess.Popen
    url: str
    #: Files that only this server reads (`explore`'s pickle of the params and data): removed once it has ended.
    owned: list[Path] = dataclasses.field(default_factory=list)

    def stop(self) -> None:
        """End the server (it also ends when the Python process that started it exits), then remove the files only
        it read (`explore`'s pickle of your params and data in the temporary folder)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        while self.owned:
            self.owned.pop().unlink(missing_ok=True)

    def _repr_html_(self) -> str:  # a notebook shows the link
        return f'gradlab explorer: <a href="{self.url}" target="_blank">{self.url}</a>'


def free_port(start: int = 8501) -> int:
    """The first port from `start` on that nobody listens on (Streamlit's default first)."""
    for port in range(start, start + 100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise OSError(f"no free port in {start}–{start + 99}")


def command(port: int, *, address: str = "127.0.0.1", headless: bool = False) -> list[str]:
    """The `streamlit run app.py` command line, listening on `address` (this machine only by default: the
    explorer runs the user's code, which is not for the network to reach). **Raises** `FileNotFoundError` when app.py is not next to the
    package (gradlab installed from a wheel rather than `pip install -e` of the repository)."""
    if not APP.is_file():
        raise FileNotFoundError(f"{APP} is missing: the explorer runs from a checkout of the repository "
                                "(pip install -e /path/to/gradlab)")
    return [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port), "--server.address", address,
            "--server.headless", str(headless).lower(), "--browser.gatherUsageStats", "false"]


def start(model_file: str | os.PathLike, *, port: int | None = None, address: str = "127.0.0.1",
          headless: bool = False, check: bool = True) -> Server:
    """Start the explorer on the model in `model_file` (a `.py` module, or a spec from `own.save_spec`).

    **Arguments** `port`: the first free one from 8501 by default; `address`: the interface to listen on
    (`"0.0.0.0"` lets other machines in, e.g. a projector's); `headless`: do not open a browser;
    `check`: load the model here first (`own.load`), so a broken module fails now with its reason.

    **Returns** the running `Server`. **Raises** `own.OwnModelError` when the module breaks the contract."""
    path = Path(model_file).expanduser().resolve()
    if check:
        own.load(path)
    port = port or free_port()
    env = {**os.environ, own.ENV: str(path)}
    process = subprocess.Popen(command(port, address=address, headless=headless), env=env, cwd=APP.parent)
    server = Server(process, f"http://localhost:{port}")
    atexit.register(server.stop)
    return server


def explore(loss_fn, params, data, *, port: int | None = None, headless: bool = False, **optional) -> Server:
    """Open the explorer on a model from a notebook or script: `loss_fn(params, x, y) -> scalar` (one example),
    `params` (any pytree) and `data` (arrays, an NPZ or CSV path); `optional` takes the module contract's other
    names (`predict_fn`, `task`, `class_names`, `image_shape`, `label`, `checkpoints`, `steps`,
    `learning_rates`; docs/own-model.md).

    The model is checked here, pickled (cloudpickle: a loss written in a notebook travels by value) into a
    temporary file and served by a Streamlit process started from this one; `stop()` (or this process's exit)
    ends that process and removes the file.

    **Returns** the running `Server` (its `url`; `stop()` ends it). **Raises** `own.OwnModelError` naming what
    breaks the contract."""
    spec = dict(loss_fn=loss_fn, params=params, data=data, **optional)
    unknown = set(optional) - set(own.CONTRACT)
    if unknown:
        raise own.OwnModelError(f"explore() got unknown argument(s) {', '.join(sorted(unknown))}; it takes "
                                f"{', '.join(own.CONTRACT)}")
    own.from_objects(**spec)
    handle, path = tempfile.mkstemp(prefix="gradlab_model_", suffix=".pkl")
    os.close(handle)
    try:
        own.save_spec(path, **spec)
        server = start(path, port=port, headless=headless, check=False)
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise
    server.owned.append(Path(path))  # `stop()`, or this process's exit (`atexit`), removes it after the server ends
    return server


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(model_file: str, *, port: int | None = None, address: str = "127.0.0.1", headless: bool = False) -> int:
    """`python -m gradlab serve`: start the explorer and wait for it; Ctrl-C or SIGTERM ends both processes.
    **Returns** the server's exit status (2 with the reason when the module breaks the contract)."""
    try:
        server = start(model_file, port=port, address=address, headless=headless)
    except (own.OwnModelError, FileNotFoundError) as err:
        print(f"gradlab serve: error: {err}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"gradlab: serving {Path(model_file).name} at {server.url} (Ctrl-C to stop)", flush=True)
    try:
        return server.process.wait()
    except KeyboardInterrupt:
        server.stop()
        return 0
