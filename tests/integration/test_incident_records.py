"""Incidents in process (substrat/incidents.py): recorded once by recovery before a clean
stop rewrites the checkpoint that told it, and a damaged incident record costs that
record only, reported by fsck and the start, and set aside by ``fsck --repair``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from oracle.kill import exit_without_close
from substrat import fsck, incidents
from substrat.checkpointer import CheckpointPolicy
from substrat.incidents import Behind, incidents_path
from substrat.orchestrator import Orchestrator
from substrat.recovery import RecoveryReport
from substrat.session.store import AGENTS_DIR
from tests.integration.test_checkpoints import run

NO_ROLL = CheckpointPolicy(every_entries=4, segment_bytes=1 << 20)


async def _turns(root: Path, *prompts: str) -> None:
    orch = await Orchestrator.open(root, checkpoints=NO_ROLL, slots=1)
    if not orch.tree.roots():
        await orch.create_root("lead", "You lead.")
    for prompt in prompts:
        await orch.run_turn("lead", prompt)
    await orch.close()


def _open(root: Path, *, clean: bool) -> RecoveryReport:
    async def go() -> RecoveryReport:
        orch = await Orchestrator.open(root, checkpoints=NO_ROLL, slots=1)
        report = orch.recovery_report
        assert report is not None
        if clean:
            await orch.close()  # a clean stop checkpoints every log anew
        else:
            exit_without_close(orch)
        return report

    return run(go())


def test_recovery_records_a_shorter_log_once_and_keeps_reporting_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run(_turns(root, "one"))
    (log,) = (root / AGENTS_DIR).glob("*/events.jsonl")
    shutil.copy2(log, tmp_path / "backup")
    run(_turns(root, "two", "three"))
    shutil.copy2(tmp_path / "backup", log)

    first = _open(root, clean=False)  # a crash before any checkpoint is rewritten
    (incident,) = first.incidents
    assert incident["endpoint"] == log.parent.name and incident["missing"] >= 2, incident
    assert incident["agent"] == "lead"
    assert f"the log of agent lead (session {log.parent.name})" in incident["message"]
    assert incident["found_by"].startswith("recovery")
    again = _open(root, clean=True)  # the same loss: not recorded twice
    assert [i["id"] for i in again.incidents] == [incident["id"]]
    after = _open(root, clean=True)  # the checkpoints agree with the short log now
    assert not after.checkpoints_rejected and after.incidents == again.incidents
    assert len(incidents.read_incidents(root).incidents) == 1


def _loss(endpoint: str) -> Behind:
    return Behind(
        endpoint,
        f"agents/{endpoint}/events.jsonl",
        {"seq": 9, "file_first": 1, "offset": 900},
        "00c0ffee",
        {"last_seq": 4, "bytes": 400},
        "the log ends before entry 9 (it is shorter than the checkpoint)",
    )


def test_an_incident_names_the_agent_by_its_path_in_the_tree(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run(_turns(root, "@spawn a worker"))
    paths = {
        log.parent.name: incidents.agent_path(root, log.parent.name)
        for log in (root / AGENTS_DIR).glob("*/events.jsonl")
    }
    assert sorted(paths.values()) == ["lead", "lead/a"]
    child = next(sid for sid, path in paths.items() if path == "lead/a")
    log = root / AGENTS_DIR / child / "events.jsonl"
    log.write_bytes(log.read_bytes().splitlines(keepends=True)[0])  # agent.created lost
    assert incidents.agent_path(root, child) is None
    message = incidents.Incident(1, "now", _loss(child).to_data("test")).message()
    assert f"the log of {child} (" in message  # the session ID is all it can name


def test_a_damaged_incident_record_costs_that_record_only(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run(_turns(root, "one"))
    incidents.record(root, [_loss(c * 32) for c in "abc"], "test")
    path = incidents_path(root)
    lines = path.read_bytes().splitlines(keepends=True)
    middle = lines[1].replace(b'"missing":5', b'"missing":6')  # its checksum fails now
    assert middle != lines[1]
    path.write_bytes(lines[0] + middle + lines[2])

    read = incidents.read_incidents(root)
    assert sorted(read.incidents) == [1, 3] and read.damage == {"bad_checksum": 1}, read
    found = fsck.check(root)
    kinds = [(f.kind, f.path) for f in found.problems]
    assert ("damaged_line", "incidents/events.jsonl") in kinds, kinds
    assert [f.detail.split(" (")[0] for f in found.problems if f.kind == "incident_open"] == [
        "incident 1",
        "incident 3",
    ]
    report = _open(root, clean=True)
    assert [i["id"] for i in report.incidents] == [1, 3]
    assert report.log_damage == {incidents.INCIDENTS_DIR: {"bad_checksum": 1}}
    assert report.checkpoints_used > 0  # the incident log's damage sets no checkpoint aside

    fsck.check(root, repair=True)  # the damaged line goes to quarantine/, as any log's
    after = fsck.check(root)
    assert [f.kind for f in after.problems] == ["incident_open", "incident_open"], after.problems
    assert sorted(incidents.read_incidents(root).incidents) == [1, 3]
    assert any((root / "quarantine").iterdir())


def test_an_incident_log_that_is_not_a_file_stops_the_start_saying_why(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run(_turns(root, "one"))
    incidents_path(root).mkdir(parents=True)  # a directory where the log belongs
    with pytest.raises(incidents.IncidentError, match="incident log cannot be read"):
        _open(root, clean=True)
    kinds = [f.kind for f in fsck.check(root).problems]
    assert kinds == ["bad_incidents"], kinds
