"""The daemon SIGKILLed while a claude-code turn runs: the agent resumes the logged conversation."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from substrat.client import Client, DaemonProcess
from substrat.conversation import conversation_from_log
from substrat.providers.claude_code import SCRATCH_PREFIX
from tests.support import fake_claude

START_TIMEOUT_S = 30.0


def wait_for_lines(path: Path, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} never reached {count} lines")


def scratch_dirs(temp: Path) -> set[str]:
    return {p.name for p in temp.iterdir() if p.name.startswith(SCRATCH_PREFIX)}


def test_sigkill_mid_turn_resumes_from_the_last_completed_turn(tmp_path: Path) -> None:
    root = tmp_path / "root"
    home = tmp_path / "cli-home"
    home.mkdir()
    # The daemons' own temp directory, short (the tool socket's path must fit sun_path), so
    # what a killed daemon leaves there can be seen.
    temp = Path(tempfile.mkdtemp(prefix="cc"))
    env = dict(os.environ)
    env["TMPDIR"] = str(temp)
    env["SUBSTRAT_CLAUDE_BIN"] = str(fake_claude.install(tmp_path / "bin"))
    env["FAKE_CLAUDE_HOME"] = str(home)
    daemon = DaemonProcess(root, env=env).start(timeout_s=START_TIMEOUT_S)
    try:
        with Client(root) as client:
            info = client.call(
                "agent.create", {"name": "coder", "provider": "claude-code", "model": "default"}
            )
            client.call("agent.send", {"agent": "coder", "prompt": "one"})
        failures: list[BaseException] = []

        def doomed() -> None:
            try:
                with Client(root) as other:
                    other.call("agent.send", {"agent": "coder", "prompt": "lost\n@sleep 20"})
            except BaseException as exc:  # the daemon dies under this call
                failures.append(exc)

        worker = threading.Thread(target=doomed)
        worker.start()
        wait_for_lines(home / "running.pids", 2, START_TIMEOUT_S)  # the CLI saved the prompt
        daemon.kill()
        worker.join(START_TIMEOUT_S)
        assert failures
        left_by_the_killed = scratch_dirs(temp)
        assert len(left_by_the_killed) == 1
    finally:
        daemon.kill()
        for line in (home / "running.pids").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line), signal.SIGKILL)  # the orphaned CLI of the killed daemon

    restarted = DaemonProcess(root, env=env).start(timeout_s=START_TIMEOUT_S)
    try:
        with Client(root) as client:
            result = client.call("agent.send", {"agent": "coder", "prompt": "two"})
        # The restarted daemon's first claude-code session removed the dead one's directory.
        now = scratch_dirs(temp)
        assert len(now) == 1 and not now & left_by_the_killed
    finally:
        restarted.kill()
        shutil.rmtree(temp, ignore_errors=True)
    history = conversation_from_log(root / "agents" / info["session_id"] / "events.jsonl")
    prompts = [t.prompt for t in history]
    assert len(prompts) == 2 and prompts[0] == "one" and prompts[1].endswith("two")
    # The CLI's own conversation is exactly the logged one: the cut turn is not in it.
    assert result["response"] == fake_claude.answer_for(prompts)
    assert (
        history[1].transcript[-1]["cli_session_id"] != history[0].transcript[-1]["cli_session_id"]
    )
