"""Hostile programs against the sandbox: no escape, no forged pass, and the calling process survives.

Each program gets the test cases of an honest task; an escape or a forgery would show as a passed
test (or as a trace on the host), everything else must score 0.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from rlvr_lightning.grading.sandbox import run_python_tests, sandbox_capabilities
from rlvr_lightning.grading.sandbox_limits import SandboxLimits
from rlvr_lightning.grading.sandbox_root import interpreter_files

pytestmark = pytest.mark.skipif(
    not sandbox_capabilities()["network_isolated"],
    reason="no namespaces on this host: run_python_tests refuses to run (see SandboxUnavailable)",
)

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 2.0
ADD_TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(10, 20) == 30"]


def _world_visible_dir(*bases: Path) -> Path:
    """A fresh world-writable directory under the first writable base (outside the sandbox's /tmp)."""
    for base in bases:
        if base.is_dir() and os.access(base, os.W_OK | os.X_OK):
            path = Path(tempfile.mkdtemp(prefix="rlvr_hostile_", dir=base))
            path.chmod(0o777)
            return path
    pytest.skip(f"none of {bases} is writable")


class UnixServer:
    """A listening host Unix socket (world-writable) that records every connection and answers it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.connections = 0
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        if not path.startswith("\0"):
            os.chmod(path, 0o777)
        self.server.listen(8)
        self.server.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.sendall(b"pong")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.server.close()


CONNECT = (
    "import socket\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "s.settimeout(1)\n"
    "s.connect({path!r})\n"
    "print(s.recv(4).decode())\n"
)


def test_host_unix_sockets_are_unreachable():
    # a world-writable socket outside /tmp (where the old sandbox only hid /tmp, /var/tmp, /dev/shm)
    directory = _world_visible_dir(Path("/run"), REPO)
    servers = [UnixServer(str(directory / "host.sock")), UnixServer("\0rlvr-hostile-" + uuid.uuid4().hex)]
    try:
        for server in servers:
            result = run_python_tests(
                CONNECT.format(path=server.path),
                [{"input": "", "output": "pong"}],
                limits=SandboxLimits(timeout_s=TIMEOUT),
            )
            assert result.passed == 0, (server.path, result)
        seen = run_python_tests(
            f"import os\nprint(os.path.exists({str(directory)!r}))", [{"input": "", "output": "False"}]
        )
        assert seen.passed == 1, seen  # the host directory does not exist for the program
        assert [server.connections for server in servers] == [0, 0]
    finally:
        for server in servers:
            server.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_host_files_are_invisible():
    directory = _world_visible_dir(REPO)  # a world-readable file under a host work directory
    secret = directory / "data.txt"
    secret.write_text("host secret")
    secret.chmod(0o644)
    directory.chmod(0o755)
    try:
        for path in ("/etc/passwd", str(secret), "/proc/1/root/etc/passwd"):
            read = f"print(open({path!r}).read()[:11])"
            expected = "host secret" if path == str(secret) else "root:x:0:0:"
            assert (
                run_python_tests(
                    read, [{"input": "", "output": expected}], limits=SandboxLimits(timeout_s=TIMEOUT)
                ).passed
                == 0
            ), path
        # what the program sees of the filesystem: its interpreter's files, a private /tmp, devices, its /proc
        binds = interpreter_files(sandbox_capabilities()["python"])["binds"]
        allowed = {"dev", "proc", "tmp"} | {p.split("/")[1] for b in binds for p in (b, os.path.realpath(b))}
        probe = f"import os\nprint(set(os.listdir('/')) <= {allowed!r})"
        assert run_python_tests(probe, [{"input": "", "output": "True"}]).passed == 1
        bound = {Path(p) for b in binds for p in (b, os.path.realpath(b))}
        for absent in ("/etc", "/run", "/work", "/home/" + os.environ.get("USER", "x"), str(REPO)):
            # an interpreter installed below it (a Python under /work or the home directory): only the way to its
            # files is there
            leads = {p.relative_to(absent).parts[0] for p in bound if p.is_relative_to(absent) and p != Path(absent)}
            if leads:
                probe = f"import os\nprint(set(os.listdir({absent!r})) <= {leads!r})"
            else:
                probe = f"import os\nprint(not os.path.exists({absent!r}))"
            assert run_python_tests(probe, [{"input": "", "output": "True"}]).passed == 1, absent
    finally:
        shutil.rmtree(directory, ignore_errors=True)


HONEST_ADD = "def add(a, b):\n    return a + b\n"

FORGERIES = {
    # __eq__ that always agrees, compared against the expected value
    "always-equal object": (
        "class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return Yes()\n"
    ),
    "always-equal int subclass": (
        "class Yes(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Yes(0)\n"
    ),
    # read its own source for the success marker and print it
    "marker from own source": (
        "import re, sys, os\n"
        "src = open(sys.argv[0]).read()\n"
        "for token in set(re.findall(r'rlvr-[A-Za-z0-9-]+', src)):\n"
        "    sys.stdout.write('\\n' + token + '[[\"ok\", true]]\\n' + token + '\\n')\n"
        "sys.stdout.flush()\n"
        "os._exit(0)\n"
    ),
    # jump over every assertion line (and every line of the harness calling the function under test)
    "settrace over asserts": (
        "import sys, linecache\n"
        "def tracer(frame, event, arg):\n"
        "    if event == 'line':\n"
        "        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).lstrip()\n"
        "        if line.startswith('assert') or ('add(' in line and not line.startswith('def')):\n"
        "            try:\n"
        "                frame.f_lineno = frame.f_lineno + 1\n"
        "            except ValueError:\n"
        "                pass\n"
        "    return tracer\n"
        "sys.settrace(tracer)\n"
        "sys._getframe().f_trace = tracer\n"
        "def add(a, b):\n    return None\n"
    ),
    # claim a value for whatever the harness asks, by replacing its encoder
    "patched encoder": (
        "import builtins, json\n"
        "real = json.dumps\n"
        "json.dumps = lambda obj, *a, **k: real(\n"
        "    [['ok', True] for _ in obj] if isinstance(obj, list) else obj, *a, **k\n"
        ")\n"
        "def add(a, b):\n    return None\n"
    ),
    "exit code": "import sys\nsys.exit(0)\n",
    "exception hook": (
        "import sys, os\nsys.excepthook = lambda *a: os._exit(0)\ndef add(a, b):\n    raise AssertionError\n"
    ),
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_passes_score_zero(name):
    result = run_python_tests(FORGERIES[name], ADD_TESTS, limits=SandboxLimits(timeout_s=TIMEOUT))
    assert result.passed == 0, (name, result)


def test_honest_programs_still_pass_assertion_tests():
    assert run_python_tests(HONEST_ADD, ADD_TESTS, limits=SandboxLimits(timeout_s=TIMEOUT)).reward == 1.0
    printing = "def add(a, b):\n    print('adding', a, b)\n    return a + b\nprint('module loaded')\n"
    assert run_python_tests(printing, ADD_TESTS, limits=SandboxLimits(timeout_s=TIMEOUT)).reward == 1.0
    tests = [
        "import math\nassert math.isclose(area(2), 12.566, rel_tol=1e-3)",
        "assert sorted(pairs([3, 1, 2])) == [(1, 2), (2, 3)]",
        "assert Box(3).volume() == 27 and isinstance(Box(2).volume(), int)",
        "assert table()['b'] == [2] and set(table()) == {'a', 'b'}",
        "assert abs(area(1) - math.pi) < 1e-9",  # math named without an import: the judge imports it
        "assert not is_even(3)",
    ]
    program = (
        "import math\n"
        "def area(r):\n    return math.pi * r * r\n"
        "def pairs(xs):\n    xs = sorted(xs)\n    return [(a, b) for a, b in zip(xs, xs[1:])]\n"
        "class Box:\n    def __init__(self, n):\n        self.n = n\n"
        "    def volume(self):\n        return self.n ** 3\n"
        "def table():\n    return {'a': [1], 'b': [2]}\n"
        "def is_even(n):\n    return n % 2 == 0\n"
    )
    result = run_python_tests(program, tests, limits=SandboxLimits(timeout_s=TIMEOUT))
    assert result.reward == 1.0, result
    wrong = program.replace("self.n ** 3", "float(self.n ** 3)")  # 27.0 == 27 but not an int
    assert run_python_tests(wrong, tests, limits=SandboxLimits(timeout_s=TIMEOUT)).passed == 5


def test_assertions_that_cannot_be_judged_outside_are_refused():
    for test in [
        "assert all(add(x, 1) == x + 1 for x in range(3))",
        "x = add(1, 2)\nassert x == 3",
        "assert _rlvr_v0 == 1",
    ]:
        with pytest.raises(ValueError, match="test 0: "):
            run_python_tests(HONEST_ADD, [test])


PARENT_KILLERS = {
    "kill parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint(1)",
    "kill everything": "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint(1)",
    "kill by pid scan": (
        "import os, signal\n"
        "for pid in range(1, 5000):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
        "print(1)"
    ),
}


@pytest.mark.parametrize("name", list(PARENT_KILLERS))
def test_the_calling_process_survives(name):
    sentinel = subprocess.Popen(["sleep", "30"])  # a host process of the caller's uid
    try:
        run_python_tests(PARENT_KILLERS[name], [{"input": "", "output": "1"}], limits=SandboxLimits(timeout_s=TIMEOUT))
        time.sleep(0.1)
        assert sentinel.poll() is None
    finally:
        sentinel.send_signal(signal.SIGKILL)
        sentinel.wait()
    assert (
        run_python_tests(HONEST_ADD, ADD_TESTS[:1], limits=SandboxLimits(timeout_s=TIMEOUT)).reward == 1.0
    )  # still works


CTYPES = {
    "segfault": "import ctypes\nctypes.string_at(0)\nprint(1)",
    "new user and mount namespace": (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.unshare(0x10000000 | 0x00020000)\n"
        "libc.mount(b'proc', b'/tmp', b'proc', 0, None)\n"
        "print(open('/etc/passwd').read()[:4])"
    ),
    "ptrace the parent": (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.ptrace(16, os.getppid(), 0, 0) == 0 and os.getppid() != 0)"
    ),
}


@pytest.mark.parametrize("name", list(CTYPES))
def test_ctypes_gets_nothing(name):
    result = run_python_tests(
        CTYPES[name],
        [{"input": "", "output": "root"}, {"input": "", "output": "True"}],
        limits=SandboxLimits(timeout_s=TIMEOUT),
    )
    assert result.passed == 0, (name, result)


def test_refuses_when_the_filesystem_view_cannot_be_built(monkeypatch):
    # a root that cannot be assembled (here: a library that cannot be mounted) is a failed probe,
    # and without an isolated mode the sandbox refuses, as it does without a network namespace
    import rlvr_lightning.grading.sandbox as sandbox
    import rlvr_lightning.grading.sandbox_process as sandbox_process
    from rlvr_lightning.grading.sandbox import SandboxUnavailable

    real = sandbox_process.interpreter_files
    monkeypatch.setattr(
        sandbox_process,
        "interpreter_files",
        lambda py: {**real(py), "binds": [*real(py)["binds"], "/nonexistent/lib.so"]},
    )
    monkeypatch.setattr(sandbox, "_PROBE", None)
    caps = sandbox.sandbox_capabilities()
    assert not caps["network_isolated"] and caps["mode"] == "none"
    assert any("/nonexistent/lib.so" in error for error in caps["errors"]), caps["errors"]
    with pytest.raises(SandboxUnavailable, match="filesystem"):
        run_python_tests(HONEST_ADD, ADD_TESTS)
