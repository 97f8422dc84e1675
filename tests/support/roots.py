"""A small root built with the real orchestrator, and the CLI run as a process, for tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from substrat import checkpoints, start_summary
from substrat.client import DaemonProcess
from substrat.orchestrator import Orchestrator
from tests.support import warm

CLI = [sys.executable, "-c", "import sys; from substrat.cli import run; sys.exit(run())"]
"""``substrat`` through this interpreter (no console script on PATH needed)."""


OPEN_PROBE = (
    "import asyncio, sys\n"
    "from substrat.errors import RootLockedError\n"
    "from substrat.orchestrator import Orchestrator\n"
    "async def main():\n"
    "    try:\n"
    "        orch = await Orchestrator.open(sys.argv[1])\n"
    "    except RootLockedError as exc:\n"
    "        print('refused:', exc)\n"
    "    else:\n"
    "        await orch.close()\n"
    "        print('opened')\n"
    "asyncio.run(main())\n"
)


def other_process_opens(root: Path) -> str:
    """What an application in another process gets from ``Orchestrator.open(root)``:
    ``opened`` (it closed it again) or ``refused: <the RootLockedError>``."""
    proc = warm.run(
        [sys.executable, "-c", OPEN_PROBE, str(root)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


async def three_roots(root: Path) -> dict[str, str]:
    """Roots alpha (with a child, kid), beta and gamma, one turn each; path -> session id."""
    orch = await Orchestrator.open(root)
    try:
        for name in ("alpha", "beta", "gamma"):
            await orch.create_root(name, f"{name} instructions")
        await orch.run_turn("alpha", "@spawn kid helper")
        await orch.run_turn("alpha/kid", "kid's own turn")
        await orch.run_turn("beta", "beta remembers this")
        await orch.run_turn("gamma", "hi")
        return {a.path: a.session_id for a in orch.agents()}
    finally:
        await orch.close()


def cli(
    root: Path,
    *args: str,
    as_json: bool = True,
    preexec: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """A ``substrat`` command on ``root`` (``--json`` unless told otherwise)."""
    flags = ["--root", str(root), *(["--json"] if as_json else [])]
    return warm.run(
        [*CLI, *args, *flags], capture_output=True, text=True, timeout=120, preexec_fn=preexec
    )


def fail_checkpoint_open(
    monkeypatch: pytest.MonkeyPatch, root: Path, session_id: str, code: int
) -> None:
    """Make the start's open of ``session_id``'s log fail with ``code``: the seam a start
    reads a log its checkpoint covers through (``os.open`` in substrat.checkpoints),
    without the start summary, which would take the agent from it after a stat."""
    os.unlink(start_summary.summary_path(root))
    broken = str(root / "agents" / session_id / "events.jsonl")
    real_os_open = os.open

    def failing_os_open(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path) == broken:
            raise OSError(code, os.strerror(code), str(path))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(checkpoints.os, "open", failing_os_open)


def no_wake_daemon(root: Path) -> Iterator[DaemonProcess]:
    """The body of a ``daemon`` fixture: a real daemon on ``root`` without its wake loop
    (the test drives every turn, and a retry waits for the agent's next use), killed
    afterwards."""
    process = DaemonProcess(root, daemon_args=["--no-wake"])
    process.start(timeout_s=30)
    yield process
    process.kill()
