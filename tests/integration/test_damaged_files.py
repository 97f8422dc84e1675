"""A damaged file costs only itself: fsck names it, the daemon and the tools go on.

Real roots on the real file system, damaged the ways a user's disk or hand
damages them, with the CLI and the daemon as real processes (tests/support/roots.py).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from substrat.checkpointer import CheckpointPolicy
from substrat.client import Client, stop_daemon
from substrat.eventlog import read_log
from substrat.orchestrator import Orchestrator
from substrat.segments import active_first, list_sealed, read_start
from tests.support import roots
from tests.support.privileges import unprivileged, why_not_available

_UNAVAILABLE = why_not_available()
needs_unprivileged = pytest.mark.skipif(
    _UNAVAILABLE is not None, reason=f"cannot run a child that file modes apply to: {_UNAVAILABLE}"
)

SMALL = CheckpointPolicy(every_entries=4, segment_bytes=1500, compaction="archive")


async def _solo(root: Path, turns: int, policy: CheckpointPolicy = SMALL) -> str:
    """A root agent ``solo`` with ``turns`` turns, its log rolled (and archived, under
    ``SMALL``); its session id."""
    orch = await Orchestrator.open(root, checkpoints=policy)
    try:
        await orch.create_root("solo", "You answer.")
        for i in range(turns):
            await orch.run_turn("solo", f"round {i} " + "padding " * 20)
        return orch.agents()[0].session_id
    finally:
        await orch.close()


@pytest.fixture
def daemons() -> Iterator[list[Path]]:
    started: list[Path] = []
    yield started
    for root in started:
        stop_daemon(root, timeout_s=30)


def _findings(proc: object) -> list[dict[str, str]]:
    return list(json.loads(proc.stdout)["findings"])  # type: ignore[attr-defined]


def _finding(proc: Any, kind: str) -> dict[str, str]:
    (found,) = [f for f in _findings(proc) if f["kind"] == kind]
    return found


def _problems(proc: Any) -> list[tuple[str, str]]:
    """fsck's findings above notices, as (kind, path); fsck exited 1."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return [(f["kind"], f["path"]) for f in _findings(proc) if f["severity"] != "notice"]


def _turns(root: Path, agent: str) -> list[str]:
    with Client(root) as client:
        return [t["prompt"] for t in client.call("agent.history", {"agent": agent})["turns"]]


def test_a_truncated_archive_costs_its_tail_only(root: Path, daemons: list[Path]) -> None:
    sid = asyncio.run(_solo(root, 14))
    archived = [s for s in list_sealed(root / "agents" / sid / "events.jsonl") if s.archived]
    assert len(archived) >= 3, archived
    victim = archived[1].path
    os.truncate(victim, victim.stat().st_size // 2)
    damaged = victim.read_bytes()

    checked = roots.cli(root, "fsck")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    found = [f for f in _findings(checked) if f["kind"] == "damaged_archive"]
    assert [f["path"] for f in found] == [f"agents/{sid}/{victim.name}"], _findings(checked)
    assert found[0]["severity"] == "damage" and "backup" in found[0]["detail"]
    assert {f["kind"] for f in _findings(checked)} <= {
        "damaged_archive",
        "seq_gap",
        "checkpoint_mismatch",
        "start_summary_stale",
    }, "the line the cut split is the archive's damage, not a torn tail"
    plain = roots.cli(root, "fsck", as_json=False)
    assert plain.returncode == 1 and "damaged_archive" in plain.stdout, plain.stderr
    assert "Aborted" not in plain.stderr

    dry = roots.cli(root, "recover", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "damaged_archive" in dry.stdout
    assert roots.cli(root, "compact", "--dry-run").returncode == 0

    daemons.append(root)
    started = roots.cli(root, "daemon", "start")
    assert started.returncode == 0, started.stderr + (root / "daemon.log").read_text()
    prompts = _turns(root, "solo")
    assert prompts[0].startswith("round 0 ") and prompts[-1].startswith("round 13 ")
    assert 0 < 14 - len(prompts) < 14 // 2, "only what the cut archive held is missing"
    with Client(root) as client:
        assert client.call("agent.send", {"agent": "solo", "prompt": "still here?"})["turn_id"]
    shown = roots.cli(root, "log", "solo", "-n", "100", as_json=False)
    assert shown.returncode == 0 and "round 13" in shown.stdout, shown.stderr
    assert roots.cli(root, "daemon", "stop").returncode == 0

    repaired = roots.cli(root, "fsck", "--repair")
    assert repaired.returncode == 1, repaired.stdout + repaired.stderr
    assert "damaged_archive" in {f["kind"] for f in _findings(repaired)}
    assert victim.read_bytes() == damaged, "the repair leaves the damaged archive as it is"


def _unprivileged_cli(root: Path, *args: str, as_json: bool = True) -> Any:
    return roots.cli(root, *args, as_json=as_json, preexec=unprivileged())


@needs_unprivileged
def test_compact_skips_a_log_with_an_unreadable_segment(root: Path) -> None:
    """Run as a non-root user would (CAP_DAC_OVERRIDE dropped): a mode-000 sealed
    segment costs what it holds (named with what to do), not the command; nothing is lost."""
    policy = CheckpointPolicy(every_entries=4, segment_bytes=1500, compaction="keep")
    sid = asyncio.run(_solo(root, 14, policy))
    sealed = list_sealed(root / "agents" / sid / "events.jsonl")
    assert sealed and not any(s.archived for s in sealed)
    directory = root / "agents" / sid
    victim = sealed[-1].path  # where the store's older checkpoint of it points
    victim.chmod(0)
    held = victim.read_bytes()
    entries = read_log(directory / "events.jsonl").entries
    try:
        dry = _unprivileged_cli(root, "compact", "--dry-run", as_json=False)
        assert dry.returncode == 1, dry.stdout + dry.stderr
        assert "Traceback" not in dry.stderr
        assert f"agents/{sid} cannot be read" in dry.stdout and "chmod" in dry.stdout
        planned = json.loads(_unprivileged_cli(root, "compact", "--dry-run").stdout)
        (item,) = [i for i in planned["logs"] if i["endpoint"] == sid]
        assert "Permission denied" in item["unreadable"], item
        done = _unprivileged_cli(root, "compact", as_json=False)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        assert f"agents/{sid} compacted only as far as it reads" in done.stdout
    finally:
        victim.chmod(0o600)
    assert victim.read_bytes() == held
    assert read_log(directory / "events.jsonl").entries == entries, "nothing is lost"
    again = roots.cli(root, "compact")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["archived"] >= 1


async def _with_user_messages(root: Path) -> None:
    """Roots alpha (with a child), beta and gamma (tests/support/roots.py); alpha tells
    the user two things."""
    await roots.three_roots(root)
    orch = await Orchestrator.open(root)
    try:
        await orch.run_turn("alpha", "@send user first news")
        await orch.run_turn("alpha", "@send user second news")
    finally:
        await orch.close()


def _inbox(root: Path) -> list[str]:
    with Client(root) as client:
        return sorted(str(m["payload"]) for m in client.call("inbox.list")["messages"])


def _one_line_refusal(proc: Any) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return str(lines[0])


@needs_unprivileged
def test_a_read_only_user_inbox_is_reported_and_refused_in_one_line(root: Path) -> None:
    asyncio.run(_with_user_messages(root))
    user_log = root / "user" / "events.jsonl"
    before = user_log.read_bytes()
    user_log.chmod(0o444)
    try:
        checked = _unprivileged_cli(root, "fsck")
        assert _problems(checked) == [("unreadable_user_log", "user/events.jsonl")]
        assert "chmod" in _finding(checked, "unreadable_user_log")["detail"]
        line = _one_line_refusal(_unprivileged_cli(root, "daemon", "start", as_json=False))
        assert "user/events.jsonl" in line and "chmod" in line, line
        assert not (root / "daemon.sock").exists()
    finally:
        user_log.chmod(0o600)
    assert user_log.read_bytes() == before, "nothing of it changed"


def test_a_directory_for_the_user_inbox_is_repaired_from_the_senders_logs(
    root: Path, daemons: list[Path]
) -> None:
    asyncio.run(_with_user_messages(root))
    daemons.append(root)
    assert roots.cli(root, "daemon", "start").returncode == 0
    want = _inbox(root)
    assert want == ["first news", "second news"], want
    assert roots.cli(root, "daemon", "stop").returncode == 0
    user_log = root / "user" / "events.jsonl"
    user_log.unlink()
    user_log.mkdir()

    assert _problems(roots.cli(root, "fsck")) == [("bad_user_log", "user/events.jsonl")]
    line = _one_line_refusal(roots.cli(root, "daemon", "start", as_json=False))
    assert "is not a file" in line and "fsck --repair" in line, line

    repaired = roots.cli(root, "fsck", "--repair")
    assert repaired.returncode == 1, repaired.stdout + repaired.stderr
    assert [f["repaired"] for f in _findings(repaired) if f["kind"] == "bad_user_log"] == [True]
    assert user_log.is_file() and (root / "quarantine").is_dir()
    again = roots.cli(root, "fsck")
    assert again.returncode == 0, again.stdout
    assert roots.cli(root, "daemon", "start").returncode == 0
    assert _inbox(root) == want, "what the agents sent the user comes back from their logs"


@needs_unprivileged
@pytest.mark.parametrize(
    ("file", "kind"),
    [
        ("roots/events.jsonl", "unreadable_registry"),
        ("checkpoints/events.jsonl", "unwritable_checkpoints"),
    ],
)
def test_a_read_only_root_file_is_reported_with_the_fix(root: Path, file: str, kind: str) -> None:
    asyncio.run(roots.three_roots(root))
    target = root / file
    assert target.is_file()
    target.chmod(0o444)
    try:
        checked = _unprivileged_cli(root, "fsck")
    finally:
        target.chmod(0o600)
    assert _problems(checked) == [(kind, file)]
    assert "chmod" in _finding(checked, kind)["detail"]


def test_a_directory_for_the_checkpoint_store_is_moved_aside(
    root: Path, daemons: list[Path]
) -> None:
    asyncio.run(roots.three_roots(root))
    store = root / "checkpoints" / "events.jsonl"
    store.unlink()
    store.mkdir()
    problems = _problems(roots.cli(root, "fsck"))
    assert problems == [("bad_checkpoints", "checkpoints/events.jsonl")]
    assert roots.cli(root, "fsck", "--repair").returncode == 1
    assert store.is_file() and store.stat().st_size > 0, "the repair's recovery wrote checkpoints"
    assert roots.cli(root, "fsck").returncode == 0


def test_a_directory_for_the_start_record_costs_only_the_record(
    root: Path, daemons: list[Path]
) -> None:
    sid = asyncio.run(_solo(root, 6))
    log = root / "agents" / sid / "events.jsonl"
    record = log.with_name("events.start")
    want = read_start(log)
    assert want is not None and want > 1
    record.unlink()
    record.mkdir()
    (record / "keep-me").write_text("someone's file")

    checked = roots.cli(root, "fsck")
    assert _problems(checked) == [("damaged_start", f"agents/{sid}/events.start")]
    assert "quarantine" in str(_finding(checked, "damaged_start")["repair"])

    daemons.append(root)
    assert roots.cli(root, "daemon", "start").returncode == 0
    with Client(root) as client:
        assert client.call("agent.send", {"agent": "solo", "prompt": "still here?"})["turn_id"]
    assert roots.cli(root, "daemon", "stop").returncode == 0

    repaired = roots.cli(root, "fsck", "--repair")
    assert [f["repaired"] for f in _findings(repaired) if f["kind"] == "damaged_start"] == [True]
    assert record.is_file() and read_start(log) == active_first(list_sealed(log))
    kept = [p for p in (root / "quarantine").iterdir() if p.is_dir()]
    assert [(p / "keep-me").read_text() for p in kept] == ["someone's file"]
    assert roots.cli(root, "fsck").returncode == 0


def test_a_directory_for_the_record_is_a_corrupt_record(root: Path, daemons: list[Path]) -> None:
    sid = asyncio.run(_solo(root, 3))
    record = root / "agents" / sid / "session.json"
    record.unlink()
    record.mkdir()
    checked = roots.cli(root, "fsck")
    assert _problems(checked) == [("corrupt_record", f"agents/{sid}/session.json")]
    assert "session.json is not a file" in _finding(checked, "corrupt_record")["detail"]
    daemons.append(root)
    assert roots.cli(root, "daemon", "start").returncode == 0
    prompts = _turns(root, "solo")
    assert len(prompts) == 3 and prompts[-1].startswith("round 2 "), prompts
    assert record.is_file(), "rebuilt from the log"


@needs_unprivileged
@pytest.mark.parametrize("command", [("fsck",), ("agent", "list"), ("daemon", "start")])
def test_a_mode_000_root_gets_one_line_saying_the_chmod(
    root: Path, command: tuple[str, ...]
) -> None:
    asyncio.run(roots.three_roots(root))
    root.chmod(0)
    try:
        line = _one_line_refusal(_unprivileged_cli(root, *command, as_json=False))
    finally:
        root.chmod(0o700)
    assert f"`chmod 700 {root}`" in line and "Usage" not in line, line


def test_eio_on_the_user_inbox_stops_the_daemon_with_one_line(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """EIO cannot be made with real files here: the user's log read is made to fail
    with it (in process, the daemon's own main)."""
    import errno

    from substrat import daemon, recovery

    asyncio.run(_with_user_messages(root))
    user_log = root / "user" / "events.jsonl"

    def failing(*_: object) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(user_log))

    monkeypatch.setattr(recovery, "read_user", failing)
    with caplog.at_level("ERROR", logger="substrat.daemon"):
        code = daemon.main(["--root", str(root)])
    assert code == 2
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.exc_info is None, "one line, no traceback"
    assert "user's inbox failed: Input/output error (EIO)" in record.getMessage()
    assert "check the device" in record.getMessage()


def test_a_checkpoint_store_out_of_use_shows_in_daemon_status(
    root: Path, daemons: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints that fail while the daemon runs lose nothing, but the next start reads
    more of the logs: ``daemon status`` says so (it was a warning in daemon.log only)."""
    asyncio.run(roots.three_roots(root))
    store = root / "checkpoints" / "events.jsonl"
    store.unlink()
    store.mkdir()  # the daemon's first checkpoint append fails: the store goes out of use
    monkeypatch.setenv("SUBSTRAT_CHECKPOINT_ENTRIES", "2")
    daemons.append(root)
    assert roots.cli(root, "daemon", "start").returncode == 0
    for i in range(3):
        sent = roots.cli(root, "agent", "send", "beta", f"note {i}")
        assert sent.returncode == 0, sent.stderr
    assert _turns(root, "beta")[-1] == "note 2"  # every turn still served
    status = json.loads(roots.cli(root, "daemon", "status").stdout)
    health = status["checkpoints"]
    assert health is not None and health["failures"] >= 1, status
    assert "Is a directory" in (health["store_out_of_use"] or ""), health
    shown = roots.cli(root, "daemon", "status", as_json=False)
    assert "checkpoints stopped: the checkpoint store is out of use" in shown.stdout
    assert "substrat fsck" in shown.stdout


def test_daemon_status_says_nothing_of_checkpoints_that_work(
    root: Path, daemons: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(roots.three_roots(root))
    monkeypatch.setenv("SUBSTRAT_CHECKPOINT_ENTRIES", "2")
    daemons.append(root)
    assert roots.cli(root, "daemon", "start").returncode == 0
    assert roots.cli(root, "agent", "send", "beta", "note").returncode == 0
    status = json.loads(roots.cli(root, "daemon", "status").stdout)
    assert status["checkpoints"] is None, status
    assert "checkpoint" not in roots.cli(root, "daemon", "status", as_json=False).stdout
