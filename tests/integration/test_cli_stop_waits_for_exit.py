"""``daemon stop`` says "stopped" once the daemon's process is gone, not when it gave the
root back.

A daemon releases its lock and its hold on the root before its interpreter has finished
exiting (atexit handlers, module teardown). ``stop`` used to return at the release, so a
script that checked the pid right after saw it still running (the lead saw this as a
flaky ``test_cli_removed_files``, session 28). Here the daemon's exit is made slow on
purpose: a ``sitecustomize`` on its PYTHONPATH registers an atexit handler that sleeps,
only in the daemon (a fresh interpreter: the changed PYTHONPATH keeps the tests' warm
server out of it).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.rpc import lock
from substrat.rpc.starting import wait_until
from tests.support.cli import SUBSTRAT, as_json, cli_env, cli_root, run

pytestmark = [
    pytest.mark.waits,
    pytest.mark.skipif(
        not SUBSTRAT or not os.path.exists("/proc/locks"),
        reason="needs the substrat console script and /proc/locks",
    ),
]

SITECUSTOMIZE = """
import atexit, os, sys, time
if "substrat.daemon" in sys.orig_argv:
    atexit.register(time.sleep, float(os.environ["SLOW_EXIT_S"]))
"""


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


@pytest.fixture
def slow_exit_env(root: Path, tmp_path: Path) -> dict[str, str]:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = cli_env(root)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hooks), env.get("PYTHONPATH")) if p)
    env["SLOW_EXIT_S"] = "2"
    return env


def _start(root: Path, env: dict[str, str]) -> int:
    started = as_json(run(root, "daemon", "start", "--json", env=env))
    assert lock.running(started["pid"])
    return int(started["pid"])


def _stop(root: Path, env: dict[str, str], pid: int) -> None:
    stopped = run(root, "daemon", "stop", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert f"daemon stopped (pid {pid})" in stopped.stdout
    assert not lock.running(pid), "stop returned while the daemon's process still ran"


def test_stop_returns_once_the_daemon_has_exited(root: Path, slow_exit_env: dict[str, str]) -> None:
    _stop(root, slow_exit_env, _start(root, slow_exit_env))


def test_stop_of_a_daemon_whose_lock_file_was_removed_waits_for_its_exit(
    root: Path, slow_exit_env: dict[str, str]
) -> None:
    pid = _start(root, slow_exit_env)
    lock.lock_path(root).unlink()  # stop then finds it by its hold on the root
    _stop(root, slow_exit_env, pid)


def test_a_daemon_that_does_not_exit_in_time_is_named(
    root: Path, slow_exit_env: dict[str, str]
) -> None:
    env = {**slow_exit_env, "SLOW_EXIT_S": "300"}  # far past the stop's timeout
    pid = _start(root, env)
    try:
        stopped = run(root, "daemon", "stop", "--timeout", "5", env=env)
        assert stopped.returncode == 3  # the daemon is not (yet) usable: EXIT_UNAVAILABLE
        message = " ".join(stopped.stderr.split())
        assert f"the daemon (pid {pid}) gave the root back but has not exited" in message
        assert f"kill -9 {pid}" in message
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # what the message tells a user to do
    assert wait_until(lambda: not lock.running(pid), 60)
