"""A root as ``substrat agent create NAME --root R`` leaves it once its daemon is stopped,
made once per test process and copied for each test that stands on one.

Making one costs a ``substrat`` process and the daemon it starts (about 0.35 CPU s);
a copy costs a few milliseconds. A test that needs such a root only as the setting of
what it checks (commands refused inside it, or on it once it is made unusable) gets a
copy of its own: every file and mode the real CLI and daemon wrote, in a directory no
other test sees, as independent as a root made for it. The copy is made as
tests/integration/test_fsck_corpus.py copies its base root: ``shutil.copytree``.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from substrat.rpc import lock
from tests.support import warm
from tests.support.cli import SUBSTRAT, stop_or_kill

Commands = tuple[tuple[str, ...], ...]

_MADE: dict[tuple[str, Commands], Path] = {}
"""(this process's base temporary directory, the commands) -> the root they made there."""


def made_root(
    factory: pytest.TempPathFactory,
    dest: Path,
    agent: str = "lead",
    *,
    commands: Commands | None = None,
) -> Path:
    """A copy at ``dest`` of a root that ``substrat agent create AGENT`` made, or the
    ``substrat`` ``commands`` one after the other (``--root`` added to each; each must
    succeed), its daemon then stopped: made on first use in this process, copied from
    then on."""
    commands = commands or (("agent", "create", agent),)
    key = (str(factory.getbasetemp()), commands)
    made = _MADE.get(key)
    if made is None or not made.is_dir():
        made = factory.mktemp("made-root") / "root"
        env = {**os.environ, "COLUMNS": "200"}
        env.pop("SUBSTRAT_NO_AUTOSTART", None)
        env.pop("SUBSTRAT_HOME", None)
        try:
            for args in commands:
                done = warm.run(
                    [SUBSTRAT, *args, "--root", str(made)],
                    capture_output=True, text=True, timeout=60, env=env,
                )  # fmt: skip
                assert done.returncode == 0, (args, done.stderr)
        finally:
            stop_or_kill(made)
        _wait_gone(made)  # its last line in daemon.log is in every copy
        _MADE[key] = made
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(made, dest, symlinks=True)
    return dest


def _wait_gone(root: Path, timeout_s: float = 20) -> None:
    """Until the stopped daemon's process has exited (or is a zombie), at most
    ``timeout_s``: it lets go of the root's lock before its last writes to daemon.log."""
    info = lock.read_info(root)
    if info is None or info.pid is None:
        return
    status = Path(f"/proc/{info.pid}/status")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = next(
                (line for line in status.read_text().splitlines() if line.startswith("State:")),
                "",
            )
        except OSError:
            return  # gone
        if "Z" in state.split()[1:2]:
            return
        time.sleep(0.01)
    # still there: its pid is another process's by now, or the daemon lingers; a copy
    # without its last log line is a root all the same
