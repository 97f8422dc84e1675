"""The root's own directories made unusable by their modes, at a daemon's start.

``roots/`` (the root registry) at mode 000 costs root creation only, as the
registry's own file at 000 does (docs/daemon.md, "The root registry": the
daemon serves every agent and reports ``registry_problem``). ``agents/`` at
mode 000 holds every agent: the start is refused with one line naming the
directory and the ``chown``/``chmod`` to run, exit 2, no traceback. The
commands run as a non-root user would see the modes (tests/support/privileges.py).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.client import Client, stop_daemon
from substrat.rootdir import prepare_root
from tests.support import roots
from tests.support.privileges import unprivileged, why_not_available

_UNAVAILABLE = why_not_available()
pytestmark = pytest.mark.skipif(
    _UNAVAILABLE is not None, reason=f"cannot run a child that file modes apply to: {_UNAVAILABLE}"
)


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return roots.cli(root, *args, as_json=False, preexec=unprivileged())


@pytest.fixture
def built(root: Path) -> Iterator[dict[str, str]]:
    sessions = asyncio.run(roots.three_roots(root))
    prepare_root(root)  # its marker, as a root the CLI made has (agents/ can then be shut)
    yield sessions
    for directory in ("roots", "agents"):
        (root / directory).chmod(0o700)
    stop_daemon(root, timeout_s=30)


def test_a_registry_directory_at_mode_000_costs_only_root_creation(
    root: Path, built: dict[str, str]
) -> None:
    (root / "roots").chmod(0o000)
    started = cli(root, "daemon", "start")
    assert started.returncode == 0, started.stderr + (root / "daemon.log").read_text()
    assert "root registry unusable" in started.stdout, started.stdout
    with Client(root) as client:
        assert {a["path"] for a in client.call("agent.list")} == set(built)
        assert client.call("agent.send", {"agent": "gamma", "prompt": "still"})["turn_id"] == "t2"
        assert "Permission denied" in client.call("daemon.status")["registry_problem"]
    made = cli(root, "agent", "create", "delta")
    assert made.returncode == 1 and "no root agent can be created" in made.stderr, made.stderr
    assert f"chmod -R u+rwX {root / 'roots'}" in made.stderr, "fsck --repair cannot fix modes"
    assert "Traceback" not in (root / "daemon.log").read_text()
    assert cli(root, "daemon", "stop").returncode == 0

    (root / "roots").chmod(0o700)
    made = cli(root, "agent", "create", "delta")
    assert made.returncode == 0, made.stderr
    with Client(root) as client:
        assert client.call("daemon.status").get("registry_problem") is None


def test_an_agents_directory_at_mode_000_is_refused_in_one_line(
    root: Path, built: dict[str, str]
) -> None:
    agents = root / "agents"
    agents.chmod(0o000)
    log_before = (root / "daemon.log").read_bytes() if (root / "daemon.log").exists() else b""
    for command in (("daemon", "start"), ("agent", "list")):
        refused = cli(root, *command)
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        assert f"chmod -R u+rwX {agents}" in line and "Traceback" not in line, line
    # the daemon process itself (a service manager starts it so) says the same in one line
    daemon = subprocess.run(
        [sys.executable, "-P", "-m", "substrat.daemon", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=unprivileged(),
    )
    assert daemon.returncode == 2, daemon.stderr
    (line,) = daemon.stderr.strip().splitlines()
    assert "cannot start" in line and f"chmod -R u+rwX {agents}" in line, line
    after = (root / "daemon.log").read_bytes() if (root / "daemon.log").exists() else b""
    assert after == log_before, "a refused start writes nothing (not even daemon.log)"

    agents.chmod(0o700)
    started = cli(root, "daemon", "start")
    assert started.returncode == 0, started.stderr
    with Client(root) as client:
        assert {a["path"] for a in client.call("agent.list")} == set(built)


def test_a_root_file_failing_at_a_start_is_one_line_with_what_to_do(root: Path) -> None:
    """EIO (or EACCES that no check foresaw, a race) on a file of the root's own, met
    during recovery: one line naming it and what to do; an error elsewhere keeps its
    traceback (it is a bug to report)."""
    import errno

    from substrat.rootdir import user_log_failure

    agents = root / "agents"
    denied = user_log_failure(root, PermissionError(errno.EACCES, "Permission denied", agents))
    assert denied is not None and f"chmod -R u+rwX {agents}" in denied
    failed = user_log_failure(root, OSError(errno.EIO, "Input/output error", agents / "x.tmp"))
    assert failed is not None and "check the device" in failed
    assert user_log_failure(root, OSError(errno.EIO, "I/O", "/elsewhere/file")) is None
    assert user_log_failure(root, FileNotFoundError(errno.ENOENT, "gone", agents)) is None
    inbox = user_log_failure(root, OSError(errno.EIO, "I/O", root / "user" / "events.jsonl"))
    assert inbox is not None and "the user's inbox failed" in inbox
    assert "\n" not in denied + failed + inbox


def test_a_checkpoints_directory_at_mode_000_stops_the_start_in_one_line(
    root: Path, built: dict[str, str]
) -> None:
    # a clean stop leaves a start summary there, which the next start must retire first
    assert cli(root, "daemon", "start").returncode == 0
    assert cli(root, "daemon", "stop").returncode == 0
    store = root / "checkpoints"
    assert (store / "start.json").exists()
    store.chmod(0o000)
    try:
        refused = cli(root, "daemon", "start")
    finally:
        store.chmod(0o700)
    # the daemon itself finds it (in its recovery); the CLI shows the line it logged
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert f"chmod -R u+rwX {store}" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr + (root / "daemon.log").read_text()
    assert cli(root, "daemon", "start").returncode == 0  # fixed: the root is whole
    with Client(root) as client:
        assert {a["path"] for a in client.call("agent.list")} == set(built)
