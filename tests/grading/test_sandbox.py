"""The code sandbox: correct programs pass, hostile ones score 0 and leave the host unchanged."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import pytest

from rlvr_lightning.grading import sandbox
from rlvr_lightning.grading.sandbox import (
    SandboxResult,
    SandboxUnavailable,
    extract_python_program,
    run_python_tests,
    sandbox_capabilities,
)
from rlvr_lightning.grading.sandbox_limits import SandboxLimits

TIMEOUT = 1.5
SLACK = 3.0 + 1.5  # the caller's own grace (sandbox_process.SLACK_S) plus scheduling noise

pytestmark = pytest.mark.skipif(
    not sandbox_capabilities()["network_isolated"],
    reason="no network namespace on this host: run_python_tests refuses to run (see SandboxUnavailable)",
)

DOUBLE = "def f(x):\n    return 2 * x\n"
ECHO_DOUBLE = "n = int(input())\nprint(2 * n)\n"
IO_TESTS = [{"input": "2", "output": "4"}, {"input": "5\n", "output": "10\n"}, {"input": "-1", "output": "-2"}]


def _procs_of_uid(uid: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(d))
                        break
        except OSError:
            pass
    return pids


def _sandbox_uid() -> int:
    return 65534 if os.geteuid() == 0 else os.getuid()


def _run(program, tests=None, **limits):
    limits.setdefault("timeout_s", TIMEOUT)
    t0 = time.monotonic()
    r = run_python_tests(program, tests if tests is not None else IO_TESTS, limits=SandboxLimits(**limits))
    return r, time.monotonic() - t0


# ----------------------------------------------------------------------------- extraction


def test_extract_python_program():
    text = "Here:\n```\nprint(0)\n```\nbetter:\n```python\nprint(1)\n```\nand\n```text\nout\n```\n"
    assert extract_python_program(text) == "print(1)"
    assert extract_python_program("```\nprint(2)\n```") == "print(2)"
    assert extract_python_program("```py\nx = 1\nprint(x)\n```") == "x = 1\nprint(x)"
    assert extract_python_program("```python\nprint(3)") is None  # unterminated
    assert extract_python_program("no code") is None
    assert extract_python_program(None) is None


# ----------------------------------------------------------------------------- behaviour


def test_correct_program_passes_all():
    r, _ = _run(ECHO_DOUBLE)
    assert r == SandboxResult(3, 3, None) and r.reward == 1.0
    r, _ = _run(DOUBLE, ["assert f(2) == 4", "assert f(0) == 0", "assert f(-3) == -6"])
    assert r.passed == 3 and r.reward == 1.0


def test_wrong_program_partial():
    r, _ = _run("n = int(input())\nprint(4 if n == 2 else n)\n")
    assert (r.passed, r.total) == (1, 3) and "wrong answer" in r.error
    r, _ = _run(DOUBLE, ["assert f(2) == 4", "assert f(3) == 7"])
    assert (r.passed, r.total) == (1, 2) and "AssertionError" in r.error
    assert run_python_tests("", IO_TESTS) == SandboxResult(0, 3, "no program")
    assert run_python_tests(None, IO_TESTS).reward == 0.0


def test_exiting_early_does_not_pass_assertions():
    r, _ = _run("import sys\nsys.exit(0)\n", ["assert False"])
    assert r.passed == 0
    r, _ = _run("import os\nos._exit(0)\n", ["assert False"])
    assert r.passed == 0


def test_infinite_loop_times_out_and_caller_continues():
    r, elapsed = _run("while True:\n    pass\n")
    assert r.passed == 0 and r.error.startswith("test 0: timeout")
    assert elapsed < TIMEOUT + SLACK  # one timeout, not one per test
    r, elapsed = _run("import time\ntime.sleep(1000)\n", ["assert True"])
    assert r.passed == 0 and elapsed < TIMEOUT + SLACK
    assert _run(ECHO_DOUBLE)[0].reward == 1.0


def _new_procs_of_uid(uid: int, before: set[int], settle_s: float = 10.0) -> set[int]:
    """Processes of `uid` not in `before` that are still alive after up to `settle_s`.

    Another test run on the same machine (also sandboxing as nobody) can own short-lived processes
    of this uid; a leak from ours would still be there after the wait (the sleepers sleep 600 s).
    """
    deadline = time.monotonic() + settle_s
    while True:
        new = set(_procs_of_uid(uid)) - before
        if not new or time.monotonic() >= deadline:
            return new
        time.sleep(0.1)


def test_fork_bomb_is_contained():
    uid = _sandbox_uid()
    before = set(_procs_of_uid(uid)) if uid == 65534 else set()
    r, elapsed = _run("import os\nwhile True:\n    os.fork()\n", ["assert True"])
    assert r.passed == 0 and elapsed < TIMEOUT + SLACK
    if uid == 65534:
        assert _new_procs_of_uid(uid, before) == set()
    assert _run(ECHO_DOUBLE)[0].reward == 1.0


def test_daemonised_child_does_not_outlive_the_run():
    uid = _sandbox_uid()
    before = set(_procs_of_uid(uid)) if uid == 65534 else set()
    prog = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\nprint(2 * int(input()))\n"
    r, _ = _run(prog, [{"input": "2", "output": "4"}])
    assert r.reward == 1.0  # the program itself is fine...
    if uid == 65534:  # ... but its escaped sleeper died with the pid namespace
        assert _new_procs_of_uid(uid, before) == set()


@pytest.mark.parametrize(
    "program",
    ["x = 'a' * 10**10\nprint(4)\n", "xs = []\nwhile True:\n    xs.append(' ' * 10**6)\n"],
    ids=["big-string", "list-growth"],
)
def test_memory_bomb(program):
    r, elapsed = _run(program, [{"input": "", "output": "4"}], memory_mb=256)
    assert r.passed == 0 and elapsed < TIMEOUT + SLACK


def test_output_flood_is_capped():
    r, elapsed = _run("while True:\n    print('x' * 10000)\n", [{"input": "", "output": "x"}], max_file_mb=1)
    assert r.passed == 0 and elapsed < TIMEOUT + SLACK


def test_writes_outside_the_workdir_do_not_reach_the_host():
    tag = uuid.uuid4().hex
    targets = [
        f"/tmp/{tag}_pwned",
        f"/var/tmp/{tag}_pwned",
        f"/dev/shm/{tag}_pwned",
        os.path.join(os.path.dirname(os.__file__), f"{tag}_pwned"),
    ]
    prog = (
        "import os\n"
        f"for p in {targets!r}:\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "    except OSError:\n"
        "        pass\n"
        "open('local.txt', 'w').write('own workdir is writable')\n"
        "print(open('local.txt').read())\n"
    )
    r, _ = _run(prog, [{"input": "", "output": "pwned"}])
    assert r.passed == 0
    for p in targets:
        assert not os.path.exists(p), p


def test_environment_secrets_do_not_leak(monkeypatch):
    secret = "s3cr3t-" + uuid.uuid4().hex
    monkeypatch.setenv("RLVR_TEST_SECRET", secret)
    prog = (
        "import os\n"
        "found = os.environ.get('RLVR_TEST_SECRET', '')\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        env = open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace')\n"
        "    except OSError:\n"
        "        continue\n"
        "    for kv in env.split('\\0'):\n"
        "        if kv.startswith('RLVR_TEST_SECRET='):\n"
        "            found = kv.split('=', 1)[1]\n"
        "print(found)\n"
    )
    r, _ = _run(prog, [{"input": "", "output": secret}])
    assert r.passed == 0  # the test that needs the secret fails


def test_no_network_even_to_localhost():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    prog = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "s.sendall(b'hello')\n"
        "print('connected')\n"
    )
    try:
        r, _ = _run(prog, [{"input": "", "output": "connected"}])
        assert r.passed == 0
        with pytest.raises(socket.timeout):
            srv.accept()  # no connection ever arrived
    finally:
        srv.close()


def test_concurrent_runs_with_a_fork_bomb():
    results = {}

    def go(name, program, tests):
        results[name] = run_python_tests(program, tests, limits=SandboxLimits(timeout_s=TIMEOUT))

    threads = [threading.Thread(target=go, args=("bomb", "import os\nwhile True:\n    os.fork()\n", ["assert True"]))]
    threads += [threading.Thread(target=go, args=(f"ok{i}", ECHO_DOUBLE, IO_TESTS)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results["bomb"].passed == 0
    assert [results[f"ok{i}"].reward for i in range(3)] == [1.0, 1.0, 1.0]


def test_refuses_without_network_isolation(monkeypatch):
    caps = dict(sandbox_capabilities(), network_isolated=False, mode="none", child_userns=False)
    monkeypatch.setattr(sandbox, "_PROBE", caps)
    with pytest.raises(SandboxUnavailable, match="allow_network_unisolated"):
        run_python_tests(ECHO_DOUBLE, IO_TESTS)
    # The explicit opt-out still runs with rlimits, uid drop and time-outs.
    assert run_python_tests(ECHO_DOUBLE, IO_TESTS, allow_network_unisolated=True).reward == 1.0


def test_bad_test_case_is_rejected():
    with pytest.raises(ValueError):
        run_python_tests(ECHO_DOUBLE, [{"stdin": "1"}])
    assert run_python_tests(ECHO_DOUBLE, []) == SandboxResult(0, 0, "no tests")
