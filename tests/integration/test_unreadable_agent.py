"""An unreadable agent costs that agent, not the daemon.

One agent's files are made unusable the ways a user's root meets it (a mode-000
directory, log or record; a read-only directory; an unreadable parent, which
holds its child back too). The daemon and fsck run as a non-root user would
see it: as child processes without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH
(tests/support/privileges.py), so the modes apply even though the tests run
as root. The daemon starts, serves every other agent, and says which agent it
held back and what to do (recovery report, ``daemon status``, daemon.log);
fsck reports it (exit 1) and ``--repair`` leaves it untouched; once the modes
are fixed the agent comes back whole. EIO is shown in-process.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from substrat import logread, start_summary
from substrat.checkpoints import CHECKPOINTS_DIR
from substrat.client import Client, stop_daemon
from substrat.orchestrator import Orchestrator
from tests.support import roots
from tests.support.privileges import unprivileged, why_not_available

_UNAVAILABLE = why_not_available()
needs_unprivileged = pytest.mark.skipif(
    _UNAVAILABLE is not None, reason=f"cannot run a child that file modes apply to: {_UNAVAILABLE}"
)


def cli(root: Path, *args: str, drop: bool = True) -> subprocess.CompletedProcess[str]:
    """A ``substrat`` command (``--json``), as a non-root user unless ``drop`` is False."""
    return roots.cli(root, *args, preexec=unprivileged() if drop else None)


def _histories(root: Path) -> dict[str, list[tuple[str, str]]]:
    with Client(root) as client:
        return {
            a["path"]: [
                (t["turn_id"], t["prompt"])
                for t in client.call("agent.history", {"agent": a["agent_id"]})["turns"]
            ]
            for a in client.call("agent.list")
        }


def _fingerprint(directory: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for path in sorted([directory, *directory.rglob("*")]):
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        out[str(path)] = (info.st_mode, digest)
    return out


# (what is made unusable, the agents held back)
SHAPES = {
    "directory": ("beta", 0o000, "", {"beta"}),
    "log": ("beta", 0o000, "events.jsonl", {"beta"}),
    "record": ("beta", 0o000, "session.json", {"beta"}),
    "read_only": ("beta", 0o500, "", {"beta"}),
    "parent": ("alpha", 0o000, "", {"alpha", "alpha/kid"}),
}


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[Path]]:
    roots: list[Path] = []
    yield roots
    for root in roots:
        stop_daemon(root, timeout_s=30)


@needs_unprivileged
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_one_unreadable_agent_costs_only_itself(
    shape: str, root: Path, daemons: list[Path]
) -> None:
    sessions = asyncio.run(roots.three_roots(root))
    agent, mode, file, held = SHAPES[shape]
    directory = root / "agents" / sessions[agent]
    target = directory / file if file else directory
    before = _fingerprint(directory)
    want = _reference_histories(root)
    if shape == "read_only":
        for child in directory.iterdir():
            child.chmod(0o400)
    healthy = {path for path in sessions if path not in held}
    if shape == "record":
        # a start from the start summary does not read the record (nothing has written
        # it since the clean stop: docs/orchestrator.md); without it, it is read
        os.unlink(start_summary.summary_path(root))
    target.chmod(mode)
    try:
        # 1. the daemon starts, serves every other agent, and says what it held back
        daemons.append(root)
        started = cli(root, "daemon", "start")
        assert started.returncode == 0, started.stderr + (root / "daemon.log").read_text()
        with Client(root) as client:
            assert {a["path"] for a in client.call("agent.list")} == healthy
            answer = client.call("agent.send", {"agent": "gamma", "prompt": "still here?"})
            assert answer["turn_id"] == "t2"
        status = json.loads(cli(root, "daemon", "status", drop=False).stdout)
        held_sids = {item["session_id"]: item for item in status["unreadable"]}
        assert set(held_sids) == {sessions[p] for p in held}
        first = held_sids[sessions[agent]]
        assert first["held_by"] is None and "chmod" in first["what_to_do"]
        assert first["name"] == agent, "a root's name is in the registry"
        if shape == "parent":
            assert held_sids[sessions["alpha/kid"]]["name"] == "kid"
            assert held_sids[sessions["alpha/kid"]]["held_by"] == sessions["alpha"]
        assert "EACCES" in first["error"]
        report = status["last_recovery"]["report"]
        assert {item["session_id"] for item in report["unreadable"]} == set(held_sids)
        assert "held back" in (root / "daemon.log").read_text()
        # not "no agent": every command that asks for it says it is held, and why
        listed = roots.cli(root, "agent", "list", "--all", as_json=False, preexec=unprivileged())
        assert f"held back: {agent}" in listed.stdout, listed.stdout + listed.stderr
        everyone = json.loads(cli(root, "agent", "list", "--all").stdout)  # and for scripts
        in_json = {a["session_id"]: a for a in everyone if a["state"] == "held"}
        assert set(in_json) == set(held_sids)
        assert in_json[sessions[agent]]["name"] == agent
        assert in_json[sessions[agent]]["held"]["what_to_do"] == first["what_to_do"]
        assert {a["path"] for a in everyone if a["state"] != "held"} == healthy
        asked = cli(root, "log", agent)
        assert asked.returncode != 0
        assert f"agent {agent} is held back since the daemon started" in asked.stderr
        assert "chmod" in asked.stderr
        assert cli(root, "daemon", "stop").returncode == 0

        # 2. fsck reports it with what to do; --repair leaves it exactly as it was
        checked = cli(root, "fsck")
        assert checked.returncode == 1, checked.stdout + checked.stderr
        findings = json.loads(checked.stdout)["findings"]
        unreadable = [f for f in findings if f["kind"] == "unreadable"]
        assert [f["path"] for f in unreadable] == [f"agents/{sessions[agent]}"]
        assert "chmod" in unreadable[0]["detail"]
        problems = [f["kind"] for f in findings if f["severity"] != "notice"]
        assert problems == ["unreadable"], findings
        repaired = cli(root, "fsck", "--repair")
        assert repaired.returncode == 1, repaired.stdout + repaired.stderr
    finally:
        target.chmod(0o700 if not file else 0o600)
        if shape == "read_only":
            for child in directory.iterdir():
                child.chmod(0o600)
    assert _fingerprint(directory) == before, "nothing of the held agent may change"

    # 3. fixed: it comes back whole, with the others' new turn kept
    assert cli(root, "daemon", "start").returncode == 0
    got = _histories(root)
    assert set(got) == set(sessions)
    for path in sessions:
        extra = [("t2", "still here?")] if path == "gamma" else []
        assert got[path] == want[path] + extra, path
    status = json.loads(cli(root, "daemon", "status", drop=False).stdout)
    assert status["unreadable"] == []


def _reference_histories(root: Path) -> dict[str, list[tuple[str, str]]]:
    """What :func:`_histories` gives for the healthy ``root``: read from a copy of it, in this
    process, through the orchestrator calls the daemon's ``agent.list`` and ``agent.history``
    answer from (a daemon of its own for the copy cost a start, a stop and two CLI processes)."""
    copy = root.parent / "reference"
    shutil.copytree(root, copy)

    async def read() -> dict[str, list[tuple[str, str]]]:
        orch = await Orchestrator.open(copy)
        try:
            return {
                a.path: [(t.turn_id, t.prompt) for t in orch.history_and_gaps(a.agent_id)[0]]
                for a in orch.agents()
            }
        finally:
            await orch.close()

    return asyncio.run(read())


@pytest.mark.parametrize("where", ["log read in full", "checkpoint check"])
def test_eio_on_one_log_holds_that_agent_back(
    where: str, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = asyncio.run(roots.three_roots(root))
    broken = str(root / "agents" / sessions["beta"] / "events.jsonl")
    if where == "log read in full":  # no checkpoint: a start reads the whole log
        shutil.rmtree(root / CHECKPOINTS_DIR)
        real_pread = os.pread

        def failing_pread(fd: int, *args: Any) -> bytes:
            # a log is read with pread (substrat.logread.file_lines), the repair's through
            # the descriptor it appends with: the file is the one the descriptor names
            if os.readlink(f"/proc/self/fd/{fd}") == broken:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return real_pread(fd, *args)

        monkeypatch.setattr(logread.os, "pread", failing_pread)
    else:  # a log its checkpoint covers to the end: a start reads only the line it names
        assert (root / CHECKPOINTS_DIR).is_dir()
        # (docs/orchestrator.md: the error is met at the log's next open)
        roots.fail_checkpoint_open(monkeypatch, root, sessions["beta"], errno.EIO)

    async def reopen() -> None:
        orch = await Orchestrator.open(root)
        try:
            assert {a.path for a in orch.agents()} == {"alpha", "alpha/kid", "gamma"}
            report = orch.recovery_report
            assert report is not None
            (item,) = report.unreadable
            assert item.session_id == sessions["beta"] and "EIO" in item.error
            assert "check the device" in item.what_to_do
            assert (await orch.run_turn("gamma", "fine")).turn_id == "t2"
        finally:
            await orch.close()

    asyncio.run(reopen())
    monkeypatch.undo()

    async def fixed() -> set[str]:
        orch = await Orchestrator.open(root)
        try:
            return {a.path for a in orch.agents()}
        finally:
            await orch.close()

    assert asyncio.run(fixed()) == set(sessions)


@needs_unprivileged
def test_fsck_on_an_unreadable_record_the_start_summary_vouches_for_says_it_is_served(
    root: Path, daemons: list[Path]
) -> None:
    """After a clean stop, `chmod 000 session.json`: fsck said "the daemon holds this
    agent back", but a start from the start summary does not read the record: it serves
    the agent and writes the record again when its session is next suspended (a turn
    writes none). fsck says that."""
    sessions = asyncio.run(roots.three_roots(root))
    record = root / "agents" / sessions["beta"] / "session.json"
    assert os.path.exists(start_summary.summary_path(root))
    record.chmod(0o000)
    try:
        checked = cli(root, "fsck")
        found = [f for f in json.loads(checked.stdout)["findings"] if f["kind"] == "unreadable"]
        assert len(found) == 1, checked.stdout
        detail = found[0]["detail"]
        assert "holds this agent back;" not in detail, detail
        assert "the next start serves this agent from the start summary" in detail, detail
        assert "chmod" in detail, detail  # and still what fixes the file

        daemons.append(root)
        assert cli(root, "daemon", "start").returncode == 0
        with Client(root) as client:  # what fsck said: served, and the record written
            assert "beta" in {a["path"] for a in client.call("agent.list")}
            client.call("agent.send", {"agent": "beta", "prompt": "served?"})
            assert record.stat().st_mode & 0o777 == 0  # a turn writes no record
        assert cli(root, "daemon", "stop").returncode == 0  # its session suspended
        assert record.stat().st_mode & 0o777 == 0o600
    finally:
        if record.exists() and record.stat().st_mode & 0o777 == 0:
            record.chmod(0o600)
