"""An interrupt that lands while the daemon is being spawned leaves it killable
(substrat.deferred_signals; DaemonProcess.start)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from substrat.client import DaemonProcess
from substrat.deferred_signals import interrupts_held


class Stop(Exception):
    pass


@pytest.fixture
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises, as the power-loss campaign's handler does."""

    def handler(signum: int, frame: object) -> None:
        raise Stop

    before = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_sigterm_during_the_spawn_arrives_after_the_caller_holds_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sigterm_raises: None
) -> None:
    real = subprocess.Popen

    def spawn_then_signalled(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # lands before Popen would have returned
        return proc

    monkeypatch.setattr(subprocess, "Popen", spawn_then_signalled)
    daemon = DaemonProcess(tmp_path / "root")
    try:
        with pytest.raises(Stop):
            daemon.start()
        assert daemon.proc is not None, "the daemon was spawned and nobody holds it"
    finally:
        daemon.kill()
    assert daemon.proc.poll() is not None  # killed: nothing left running


def test_held_signals_run_their_handlers_once_in_order_after_the_block(
    sigterm_raises: None,
) -> None:
    seen: list[int] = []

    def mine(signum: int, frame: object) -> None:
        seen.append(signum)

    before = signal.signal(signal.SIGINT, mine)
    try:
        with pytest.raises(Stop):
            with interrupts_held():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)
                seen.append(0)  # the block went on
        assert seen == [0, signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is mine  # the handlers are back
    finally:
        signal.signal(signal.SIGINT, before)
