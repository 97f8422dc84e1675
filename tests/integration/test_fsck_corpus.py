"""A corpus of damaged roots: the daemon starts on each, every healthy agent comes back,
and ``fsck`` reports exactly the damage (and ``fsck --repair`` leaves a clean root).

The base root is built once with the real orchestrator: three root agents, a
child, turns, a message to the user. Each case copies it and damages it the way
crashes, disks and careless hands do.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from substrat import fsck
from substrat.checkpointer import CheckpointPolicy
from substrat.client import Client, DaemonProcess
from substrat.eventlog import encode_entry, read_log
from substrat.orchestrator import Orchestrator
from substrat.session import Session, SessionState, SessionStore, new_session_id
from tests.support.roots import cli


@dataclass
class Base:
    root: Path
    sessions: dict[str, str]  # agent path -> session id
    agents: dict[str, str]  # agent path -> agent id
    histories: dict[str, list[tuple[str, str, str]]]
    inbox: list[str]


async def _build(root: Path) -> None:
    # no checkpoints: a damaged line before one would also be a checkpoint that
    # disagrees with its log (tests/integration/test_checkpoints.py covers that)
    orch = await Orchestrator.open(root, checkpoints=CheckpointPolicy.off())
    try:
        for name in ("alpha", "beta", "gamma"):
            await orch.create_root(name, f"{name} instructions")
        await orch.run_turn("alpha", "start\n@spawn kid helper\n@send user hello")
        await orch.run_turn("alpha", "@send kid ping")
        await orch.run_pending()
        await orch.run_turn("beta", "hi")
        await orch.run_turn("gamma", "hey")
    finally:
        await orch.close()


def _served(root: Path) -> tuple[dict[str, str], dict[str, list[tuple[str, str, str]]], list[str]]:
    with Client(root) as client:
        agents = {a["path"]: a["agent_id"] for a in client.call("agent.list")}
        histories = {
            path: [
                (t["turn_id"], t["prompt"], t["response"])
                for t in client.call("agent.history", {"agent": agent_id})["turns"]
            ]
            for path, agent_id in agents.items()
        }
        inbox = [m["payload"] for m in client.call("inbox.list")["messages"]]
    return agents, histories, inbox


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    root = tmp_path_factory.mktemp("base") / "root"
    asyncio.run(_build(root))
    probe = root.parent / "probe"
    shutil.copytree(root, probe)
    with DaemonProcess(probe).start() as daemon:
        agents, histories, inbox = _served(probe)
        with Client(probe) as client:
            sessions = {a["path"]: a["session_id"] for a in client.call("agent.list")}
        daemon.terminate()
    assert set(agents) == {"alpha", "alpha/kid", "beta", "gamma"}
    assert len(histories["alpha/kid"]) == 1 and inbox == ["hello"]
    return Base(root, sessions, agents, histories, inbox)


# -- damage ------------------------------------------------------------------------------


def _log(root: Path, sid: str) -> Path:
    return SessionStore(root).log_path(sid)


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _next_entry(path: Path, event: str, data: dict[str, Any], sid: str) -> bytes:
    last = max(e["seq"] for e in read_log(path, known_events=None).entries)
    body = {"seq": last + 1, "session_id": sid, "ts": "2026-01-01T00:00:00+00:00"}
    return encode_entry({**body, "event": event, "data": data})


def _insert(path: Path, index: int, raw: bytes) -> None:
    lines = _lines(path)
    path.write_bytes(b"".join([*lines[:index], raw, *lines[index:]]))


@dataclass
class Case:
    name: str
    damage: Callable[[Base, Path], None]
    problems: dict[str, int]
    notices: dict[str, int] = field(default_factory=dict)


def torn_tail(b: Base, r: Path) -> None:
    with open(_log(r, b.sessions["alpha"]), "ab") as f:
        f.write(b'{"crc":"0badf00d","seq":99,"session_id":"')


def nul_tail(b: Base, r: Path) -> None:
    with open(_log(r, b.sessions["beta"]), "ab") as f:
        f.write(b"\x00" * 4096)


def garbage_line(b: Base, r: Path) -> None:
    _insert(_log(r, b.sessions["alpha"]), 2, b"this is not json at all\n")


def bad_checksum_line(b: Base, r: Path) -> None:
    path = _log(r, b.sessions["gamma"])
    entry = _next_entry(path, "suspend.result", {"state_size": 7}, b.sessions["gamma"])
    _insert(path, 1, entry.replace(b'"state_size":7', b'"state_size":8'))


def invalid_utf8_line(b: Base, r: Path) -> None:
    _insert(_log(r, b.sessions["alpha/kid"]), 1, b"\xff\xfe\xfd broken bytes\n")


def duplicate_seq(b: Base, r: Path) -> None:
    path = _log(r, b.sessions["beta"])
    _insert(path, 3, _lines(path)[1])


def corrupt_record(b: Base, r: Path) -> None:
    SessionStore(r).record_path(b.sessions["beta"]).write_bytes(b'{"version": 1, "crc": "nope"')


def missing_record(b: Base, r: Path) -> None:
    SessionStore(r).record_path(b.sessions["gamma"]).unlink()


def unreplayed_pending(b: Base, r: Path) -> None:
    path = _log(r, b.sessions["alpha"])
    entry = _next_entry(path, "suspend.result", {"state_size": 0}, b.sessions["alpha"])
    path.with_name("events.pending").write_bytes(entry)


def stale_pending(b: Base, r: Path) -> None:
    path = _log(r, b.sessions["beta"])
    path.with_name("events.pending").write_bytes(_lines(path)[-1])


def stray_temp(b: Base, r: Path) -> None:
    record = SessionStore(r).record_path(b.sessions["gamma"])
    record.with_name("session.json.tmp").write_bytes(b'{"half": ')


def unknown_event(b: Base, r: Path) -> None:
    path = _log(r, b.sessions["alpha"])
    entry = _next_entry(path, "future.feature", {"x": 1}, b.sessions["alpha"])
    with open(path, "ab") as f:
        f.write(entry)


def bad_dir_name(b: Base, r: Path) -> None:
    (r / "agents" / "not-a-session").mkdir()
    (r / "agents" / "not-a-session" / "notes.txt").write_text("hi")


def orphan_session(b: Base, r: Path) -> None:
    store = SessionStore(r)
    sid = new_session_id()
    store.save(Session(sid, "scripted", "directives", state=SessionState.ACTIVE))
    path = store.log_path(sid)
    path.write_bytes(
        encode_entry(
            {
                "seq": 1,
                "session_id": sid,
                "ts": "2026-01-01T00:00:00+00:00",
                "event": "session.created",
                "data": {"provider": "scripted"},
            }
        )
    )


def user_log_torn(b: Base, r: Path) -> None:
    with open(r / "user" / "events.jsonl", "ab") as f:
        f.write(b'{"crc":"12345678","seq":5,"endpo')


def crash_leftovers(b: Base, r: Path) -> None:
    (r / "daemon.lock").write_text(json.dumps({"pid": 999999, "state": "running"}))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(r / "daemon.sock"))
    sock.close()  # the file stays, as after kill -9


def everything_at_once(b: Base, r: Path) -> None:
    for damage in (torn_tail, nul_tail, garbage_line, corrupt_record, stray_temp, bad_dir_name):
        damage(b, r)


CASES = [
    Case("torn_tail", torn_tail, {"torn_tail": 1}),
    Case("nul_padded_tail", nul_tail, {"nul_padded_tail": 1}),
    Case("garbage_line", garbage_line, {"damaged_line": 1}),
    Case("bad_checksum_line", bad_checksum_line, {"damaged_line": 1}),
    Case("invalid_utf8_line", invalid_utf8_line, {"damaged_line": 1}),
    Case("duplicate_seq", duplicate_seq, {"damaged_line": 1}),
    Case("corrupt_record", corrupt_record, {"corrupt_record": 1}),
    Case("missing_record", missing_record, {"missing_record": 1}),
    Case("unreplayed_pending", unreplayed_pending, {"pending_unreplayed": 1}),
    Case("stale_pending", stale_pending, {"stale_pending": 1}),
    Case("stray_temp", stray_temp, {"stray_temp": 1}),
    Case("unknown_event", unknown_event, {}, {"unknown_event": 1}),
    Case("bad_dir_name", bad_dir_name, {"bad_name": 1}),
    Case("orphan_session", orphan_session, {"orphan_session": 1}),
    Case("user_log_torn", user_log_torn, {"torn_tail": 1}),
    Case("crash_leftovers", crash_leftovers, {"stale_socket": 1}, {"unclean_shutdown": 1}),
    Case(
        "everything_at_once",
        everything_at_once,
        {
            "torn_tail": 1,
            "nul_padded_tail": 1,
            "damaged_line": 1,
            "corrupt_record": 1,
            "stray_temp": 1,
            "bad_name": 1,
        },
    ),
]


def _fingerprint(root: Path) -> dict[str, tuple[int, str]]:
    """Every path under the root with its mode and content hash."""
    prints: dict[str, tuple[int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = os.lstat(path)
            digest = ""
            if path.is_file() and not path.is_symlink():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            prints[str(path.relative_to(root))] = (info.st_mode, digest)
    return prints


def test_the_corpus_has_at_least_ten_kinds_of_damage() -> None:
    kinds = {kind for case in CASES for kind in {**case.problems, **case.notices}}
    assert len(CASES) >= 10 and len(kinds) >= 10


def test_base_root_is_clean(base: Base, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(base.root, root)
    report = fsck.check(root)
    assert report.findings == [] and report.exit_code == 0


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_damaged_root(case: Case, base: Base, tmp_path: Path) -> None:
    root, spare = tmp_path / "root", tmp_path / "spare"
    for copy in (root, spare):  # a socket cannot be copied: damage each copy
        shutil.copytree(base.root, copy)
        case.damage(base, copy)

    # 1. fsck reports exactly the damage, and changes nothing.
    before = _fingerprint(root)
    report = fsck.check(root)
    assert report.kinds() == case.problems
    notices = {
        k: v for k, v in report.kinds(include_notices=True).items() if k not in report.kinds()
    }
    assert notices == case.notices
    assert report.exit_code == (1 if case.problems else 0)
    assert _fingerprint(root) == before, "a read-only fsck changed the root"

    # 2. The daemon starts on it and every healthy agent comes back whole.
    with DaemonProcess(root).start() as daemon:
        agents, histories, inbox = _served(root)
        assert agents == base.agents
        assert histories == base.histories
        assert inbox == base.inbox
        assert daemon.terminate() == 0

    # 3. fsck --repair fixes it (on an untouched copy); a second fsck finds nothing.
    repaired = fsck.check(spare, repair=True)
    assert repaired.kinds() == case.problems
    assert all(f.repaired for f in repaired.problems), repaired.problems
    again = fsck.check(spare)
    assert again.kinds() == {}, again.findings
    assert again.exit_code == 0
    with DaemonProcess(spare).start() as daemon:
        agents, histories, inbox = _served(spare)
        assert (agents, histories, inbox) == (base.agents, base.histories, base.inbox)
        daemon.terminate()


def _file_in_place_of_a_session(b: Base, r: Path) -> None:
    (r / "agents" / ("0123456789abcdef" * 2)).write_text("not a directory")


def test_file_where_a_session_directory_should_be(base: Base, tmp_path: Path) -> None:
    """fsck names it and moves it aside; the rest of the root is untouched."""
    root = tmp_path / "root"
    shutil.copytree(base.root, root)
    _file_in_place_of_a_session(base, root)
    report = fsck.check(root)
    assert report.kinds() == {"bad_name": 1}
    repaired = fsck.check(root, repair=True)
    assert all(f.repaired for f in repaired.problems)
    assert fsck.check(root).kinds() == {}
    with DaemonProcess(root).start() as daemon:
        assert _served(root) == (base.agents, base.histories, base.inbox)
        daemon.terminate()


def test_daemon_starts_with_a_file_where_a_session_directory_should_be(
    base: Base, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(base.root, root)
    _file_in_place_of_a_session(base, root)
    with DaemonProcess(root).start(timeout_s=20) as daemon:
        assert _served(root) == (base.agents, base.histories, base.inbox)
        daemon.terminate()


def test_repair_moves_an_unrecoverable_session_directory_to_quarantine(
    base: Base, tmp_path: Path
) -> None:
    """A session directory with neither a record nor a log (a crash between its
    ``durable_mkdir`` and the first save) cannot be rebuilt: ``fsck --repair`` moves
    it to ``quarantine/`` (which does not exist yet here), so the next check is
    clean and the healthy agents are untouched."""
    root = tmp_path / "root"
    shutil.copytree(base.root, root)
    sid = new_session_id()
    SessionStore(root).session_dir(sid).mkdir()
    assert not (root / "quarantine").exists()

    repaired = cli(root, "fsck", "--repair")
    assert repaired.returncode == 1, f"fsck --repair failed: {repaired.stderr}"
    report = json.loads(repaired.stdout)
    assert report["recovery"]["unrecoverable"] == [sid]
    assert all(f["repaired"] for f in report["findings"]), report["findings"]
    assert not (root / "agents" / sid).exists(), "the unrecoverable directory stayed"
    assert (root / "quarantine" / f"{sid}.session.0").is_dir()
    assert fsck.check(root).kinds() == {}
    with DaemonProcess(root).start() as daemon:
        assert _served(root) == (base.agents, base.histories, base.inbox)
        daemon.terminate()


def test_repair_keeps_every_line_it_drops_in_quarantine(base: Base, tmp_path: Path) -> None:
    """A damaged line costs that line in the log, never its bytes: ``fsck --repair``
    writes the lines it drops to ``quarantine/`` before it rewrites the log."""
    root = tmp_path / "root"
    shutil.copytree(base.root, root)
    garbage_line(base, root)
    invalid_utf8_line(base, root)
    repaired = fsck.check(root, repair=True)
    assert all(f.repaired for f in repaired.problems), repaired.problems
    kept = {p.name: p.read_bytes() for p in (root / "quarantine").iterdir() if ".damaged" in p.name}
    assert sorted(kept.values()) == [
        b"this is not json at all\n",
        b"\xff\xfe\xfd broken bytes\n",
    ], kept
    assert fsck.check(root).kinds() == {}
