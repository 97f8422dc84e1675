"""The tests' fork server (tests/support/warm.py): its children are the processes asked for.

Each test compares what a child of the server reports with what a fresh process of the
same command reports, or checks that the server was bypassed: a child of the server has
the server as its parent, a fresh process has this pytest process.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import warm
from tests.support.cli import NOT_INSTALLED, SUBSTRAT

PARENT = "import os; print(os.getppid())"

# What a process sees of itself that a fork server could get wrong.
SELF = r"""
import json, os, signal, sys
sig = {}
for n in signal.valid_signals():
    try:
        h = signal.getsignal(n)
    except (ValueError, OSError):
        continue
    sig[int(n)] = h if h in (signal.SIG_IGN, signal.SIG_DFL, None) else getattr(h, "__name__", "?")
main = sys.modules["__main__"]
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": os.umask(0),
    "path0": sys.path[0], "main": sorted(k for k in vars(main) if k != "__builtins__"),
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    "signals": {k: str(v) for k, v in sig.items()},
    "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "stdio": [(s.name, s.encoding, s.errors, s.line_buffering, s.write_through, s.mode)
              for s in (sys.stdin, sys.stdout, sys.stderr)],
    "executable": sys.executable, "orig_argv": sys.orig_argv[1:2] + sys.orig_argv[3:],
    "flags": list(sys.flags),
}, default=str))
"""


@pytest.fixture(autouse=True)
def warm_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests test the server: not bypassed by a run that forces fresh processes."""
    monkeypatch.delenv(warm.FRESH, raising=False)


def both(args: list[str], **kwargs: Any) -> tuple[subprocess.CompletedProcess[Any], Any]:
    """``args`` run fresh and through the server (checked to be its child)."""
    plan = warm._plan(args, kwargs)
    assert not isinstance(plan, str), f"the server would not run it: {plan}"
    pid, warmed = warm.run_warm(*plan, list(args), **kwargs)
    assert pid != os.getpid()
    fresh = subprocess.run(args, **kwargs)
    return fresh, warmed


def parent_of(**kwargs: Any) -> int:
    """The parent of ``python -c`` run through :func:`warm.run` (the server's pid: warm)."""
    proc = warm.run(
        [sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=60, **kwargs
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout)


def server_pid() -> int:
    server = warm.get_server()
    assert server is not None
    return server.process.pid


def test_a_child_sees_itself_as_a_fresh_process_does(tmp_path: Path) -> None:
    (tmp_path / "note").write_text("x")
    old = os.umask(0o027)
    try:
        fresh, warmed = both(
            [sys.executable, "-c", SELF, "one", "two words"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "SOME_SETTING": "é value"},
        )
    finally:
        os.umask(old)
    assert fresh.returncode == warmed.returncode == 0, (fresh.stderr, warmed.stderr)
    seen, expected = json.loads(warmed.stdout), json.loads(fresh.stdout)
    assert seen == expected
    assert seen["argv"] == ["-c", "one", "two words"]
    assert seen["cwd"] == str(tmp_path)
    assert seen["env"]["SOME_SETTING"] == "é value"
    assert seen["umask"] == 0o027
    assert seen["fds"][:3] == [0, 1, 2]


@pytest.mark.skipif(not SUBSTRAT, reason=NOT_INSTALLED)
def test_a_script_child_sees_itself_as_a_fresh_script_does(tmp_path: Path) -> None:
    script = tmp_path / "probe"
    script.write_text(f"#!{warm._interpreter_of(SUBSTRAT)}\n{SELF}")
    script.chmod(0o755)
    fresh, warmed = both([str(script), "arg"], capture_output=True, text=True, timeout=60)
    assert fresh.returncode == warmed.returncode == 0, (fresh.stderr, warmed.stderr)
    seen = json.loads(warmed.stdout)
    assert seen == json.loads(fresh.stdout)
    assert seen["argv"] == [str(script), "arg"]
    assert seen["path0"] == str(tmp_path)
    assert "__file__" in seen["main"]


@pytest.mark.skipif(not SUBSTRAT, reason=NOT_INSTALLED)
def test_the_same_command_says_the_same_fresh_and_warm(tmp_path: Path) -> None:
    env = {**os.environ, "SUBSTRAT_NO_AUTOSTART": "1", "COLUMNS": "80"}
    for args in (
        [SUBSTRAT, "--help"],
        [SUBSTRAT, "agent", "list", "--root", str(tmp_path / "none"), "--json"],
        [SUBSTRAT, "agent", "send", "--root", str(tmp_path / "none")],
    ):
        fresh, warmed = both(args, capture_output=True, text=True, timeout=60, env=env)
        assert (warmed.returncode, warmed.stdout, warmed.stderr) == (
            fresh.returncode,
            fresh.stdout,
            fresh.stderr,
        ), args


def test_exit_codes_signals_and_exceptions_are_reported_as_subprocess_does() -> None:
    cases = {
        "import sys; sys.exit(3)": 3,
        "import os, signal; os.kill(os.getpid(), signal.SIGTERM)": -signal.SIGTERM,
        "raise KeyboardInterrupt": -signal.SIGINT,
        "raise ValueError('boom')": 1,
        "import sys; sys.exit('said')": 1,
        "pass": 0,
    }
    for code, expected in cases.items():
        fresh, warmed = both([sys.executable, "-c", code], capture_output=True, timeout=60)
        assert warmed.returncode == fresh.returncode == expected, code
        assert warmed.stdout == fresh.stdout
        assert without_server_frame(warmed.stderr) == fresh.stderr, code


def without_server_frame(stderr: bytes) -> bytes:
    """A traceback of a child of the server has one frame more at its top (the server's
    ``-c`` module, which ran the command's code): the one known difference."""
    return re.sub(rb'  File "<string>", line \d+, in <module>\n(?=  File )', b"", stderr, count=1)


def test_bytes_in_and_out_and_the_exit_path_are_a_fresh_process_s() -> None:
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stdout.write('at exit, unflushed'))\n"
        "data = sys.stdin.buffer.read()\n"
        "sys.stdout.buffer.write(data[::-1])\n"
        "sys.stderr.buffer.write(data[:10])\n"
    )
    data = bytes(range(256)) * 1000  # more than a pipe holds: written while read
    fresh, warmed = both([sys.executable, "-c", code], input=data, capture_output=True, timeout=60)
    assert warmed.stdout == fresh.stdout == data[::-1] + b"at exit, unflushed"
    assert warmed.stderr == fresh.stderr == data[:10]
    text_in = "é\r\nline\rend\n"
    fresh, warmed = both(
        [sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read())"],
        input=text_in,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert warmed.stdout == fresh.stdout == "é\nline\nend\n"


def test_output_to_a_file_and_stderr_to_stdout(tmp_path: Path) -> None:
    with open(tmp_path / "out", "wb") as out:
        proc = warm.run(
            [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=60,
        )
    assert proc.returncode == 0
    assert sorted((tmp_path / "out").read_text().split()) == ["err", "out"]


def test_a_timeout_kills_the_child_and_raises_as_subprocess_does() -> None:
    args = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"]
    plan = warm._plan(args, {})
    assert not isinstance(plan, str), plan
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        warm.run_warm(*plan, args, capture_output=True, timeout=2)
    assert time.monotonic() - started < 60
    assert raised.value.output == b"started\n"
    assert raised.value.timeout == 2
    # The server reaped it: nothing of it is left (it is no zombie either).
    children = Path(f"/proc/{server_pid()}/task/{server_pid()}/children").read_text().split()
    assert children == []


def test_check_raises_called_process_error() -> None:
    with pytest.raises(subprocess.CalledProcessError) as raised:
        warm.run(
            [sys.executable, "-c", "import sys; print('x'); sys.exit(4)"],
            capture_output=True,
            check=True,
            timeout=60,
        )
    assert (raised.value.returncode, raised.value.output) == (4, b"x\n")


def test_what_could_start_differently_runs_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_pid()
    assert parent_of() == server
    assert parent_of(env={**os.environ, "SUBSTRAT_HOME": "/elsewhere"}) == server
    here = os.getpid()
    utf8 = "0" if os.environ.get("PYTHONUTF8") == "1" else "1"
    assert parent_of(env={**os.environ, "PYTHONUTF8": utf8}) == here
    other_locale = "POSIX" if os.environ.get("LC_ALL") == "C" else "C"
    assert parent_of(env={**os.environ, "LC_ALL": other_locale}) == here
    assert parent_of(env={**os.environ, "HOME": f"{os.environ.get('HOME', '')}/elsewhere"}) == here
    proc = warm.run(
        [sys.executable, "-c", PARENT],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=os.getpid,
    )
    assert int(proc.stdout) == here
    # A working directory that would give a -c command another click than the server's.
    (tmp_path / "click").mkdir()
    assert parent_of(cwd=tmp_path) == here
    (tmp_path / "click").rmdir()
    (tmp_path / "json.py").write_text("")
    assert parent_of(cwd=tmp_path) == here
    (tmp_path / "json.py").unlink()
    (tmp_path / "click.txt").write_text("")  # not importable: no difference
    assert parent_of(cwd=tmp_path) == server
    limit = resource.getrlimit(resource.RLIMIT_CORE)
    if limit[0] != 0:
        resource.setrlimit(resource.RLIMIT_CORE, (0, limit[1]))
        try:
            assert parent_of() == here
        finally:
            resource.setrlimit(resource.RLIMIT_CORE, limit)
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        assert parent_of() == here
    finally:
        signal.signal(signal.SIGUSR1, previous)
    monkeypatch.setenv(warm.FRESH, "1")
    assert parent_of() == here


def test_a_dead_server_is_replaced_and_the_last_one_leaves_nothing() -> None:
    first = server_pid()
    os.kill(first, signal.SIGKILL)
    # Run fresh (if the server is not yet known dead), or by a new server.
    assert parent_of() != first
    assert parent_of() not in (first, os.getpid())
    second = server_pid()
    assert second != first
    directory = warm._servers["cli"].directory if "cli" in warm._servers else ""
    warm.shutdown()
    assert not os.path.exists(directory)
    with pytest.raises(ProcessLookupError):
        os.kill(second, 0)
    assert parent_of() not in (second, os.getpid())  # started again on demand
