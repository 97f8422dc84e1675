"""The daemon and the ``substrat`` program end without the interpreter's teardown
(substrat.process_end), and what they leave is what the interpreter's exit left.

The teardown is seen with ``PYTHONVERBOSE=1``: the interpreter's exit then writes a
``# cleanup[...]`` line for every module it drops; ``os._exit`` writes none. The variable
is read at start, so the processes below are fresh ones (warm.py and warm_daemons.py
start any such process with a new interpreter).
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import pytest

from substrat.client import Client, DaemonProcess
from substrat.rpc import lock
from substrat.session import SessionState, SessionStore
from tests.support import warm

REPO = Path(__file__).resolve().parents[2]
VERBOSE = {**os.environ, "PYTHONVERBOSE": "1"}


def torn_down(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("# cleanup", "# destroy"))]


def test_a_stopped_daemon_skips_the_teardown_and_keeps_what_it_acknowledged(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    daemon = DaemonProcess(root, env=VERBOSE).start(timeout_s=60)
    try:
        with Client(root) as client:
            info = client.call("agent.create", {"name": "alpha"})
            client.call("agent.send", {"agent": "alpha", "prompt": "hello"})
        assert daemon.terminate() == 0
    finally:
        daemon.kill()
    text = (root / "daemon.log").read_text()
    assert "\nimport " in text  # the variable reached the daemon: it says its imports
    assert torn_down(text) == []
    said = [line for line in text.splitlines() if not line.startswith(("#", "import "))]
    assert "stopped cleanly: sessions suspended" in said[-1]
    assert SessionStore(root).load(info["session_id"]).state is SessionState.SUSPENDED
    assert lock.read_info(root).state == "stopped"  # type: ignore[union-attr]
    with DaemonProcess(root) as again, Client(root) as client:
        assert client.call("daemon.status")["previous_shutdown"] == "clean"
        assert client.call("agent.history", {"agent": "alpha"})["total"] == 1
        assert again.terminate() == 0


def test_the_console_script_is_run() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["substrat"] == "substrat.cli:run"


RUN = "import sys; from substrat.cli import run; sys.exit(run())"
MAIN = "import sys; from substrat.cli import main; sys.exit(main())"


def test_a_command_skips_the_teardown(tmp_path: Path) -> None:
    done = warm.run(
        [sys.executable, "-c", RUN, "--root", str(tmp_path), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env=VERBOSE,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("substrat, version ")
    assert "\nimport " in done.stderr
    assert torn_down(done.stderr) == []


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--json", "agent", "list"],  # no root there: an error and its status
        ["agent", "list", "--no-autostart"],
        ["agent", "no-such-command"],  # click's usage error, 2
    ],
)
def test_a_command_says_and_exits_as_through_main(tmp_path: Path, args: list[str]) -> None:
    env = {**os.environ, "SUBSTRAT_HOME": str(tmp_path / "none"), "COLUMNS": "120"}
    ends = [
        warm.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        for code in (MAIN, RUN)
    ]
    through_main, through_run = ((d.returncode, d.stdout, d.stderr) for d in ends)
    assert through_run == through_main
    assert through_run[1] or through_run[2]
