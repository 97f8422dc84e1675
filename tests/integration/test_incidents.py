"""A log restored from an older backup stays on record until an operator acknowledges it
(docs/daemon.md, "Incidents"; substrat/incidents.py).

Session 22 found that after one clean run the new checkpoints agreed with the short log,
and nothing could tell any more that acknowledged turns were lost. Now the first recovery
(or ``fsck --repair``) records an incident durably before anything rewrites the
checkpoint that tells it, and fsck, every start and ``daemon status`` report it until
``substrat fsck --acknowledge ID``. Real CLI processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from substrat import events
from substrat.eventlog import read_log
from substrat.incidents import incidents_path
from tests.integration.test_orchestrator_e2e import documented_events
from tests.integration.test_restored_old_log import restore_older_log
from tests.integration.test_restored_old_log import root as root  # the fixture
from tests.support.cli import SUBSTRAT, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


def fsck_findings(root: Path, *args: str) -> tuple[int, dict[str, list[dict]]]:
    done = run(root, "--json", "fsck", *args)
    assert done.returncode in (0, 1), done.stderr
    found: dict[str, list[dict]] = {}
    for finding in json.loads(done.stdout)["findings"]:
        found.setdefault(finding["kind"], []).append(finding)
    return done.returncode, found


def status(root: Path) -> dict:
    done = run(root, "--json", "daemon", "status")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_restored_older_log_stays_reported_until_acknowledged(root: Path, tmp_path: Path) -> None:
    restore_older_log(root, tmp_path)
    assert not incidents_path(root).exists()  # fsck without --repair writes nothing

    assert run(root, "daemon", "start").returncode == 0
    (incident,) = status(root)["incidents"]
    assert incident["id"] == 1 and incident["kind"] == "log_behind_checkpoint", incident
    assert incident["log"].startswith("agents/") and incident["log"].endswith("events.jsonl")
    assert incident["checkpoint"]["seq"] > incident["log_end"]["last_seq"] > 0, incident
    assert incident["missing"] == incident["checkpoint"]["seq"] - incident["log_end"]["last_seq"]
    assert "substrat fsck --acknowledge 1" in incident["message"]

    # a clean run: the checkpoints now agree with the short log, and nothing else says so
    assert run(root, "agent", "send", "lead", "four").returncode == 0
    assert run(root, "daemon", "stop").returncode == 0
    code, found = fsck_findings(root)
    assert "log_behind_checkpoint" not in found, found  # the evidence is rewritten...
    assert code == 1 and [f["detail"] for f in found["incident_open"]] == [incident["message"]]
    assert found["incident_open"][0]["agent"] == "lead"  # ...the incident stays

    started = run(root, "daemon", "start")  # every start reports it
    assert started.returncode == 0 and "open incident: incident 1 (" in started.stdout, started
    said = (root / "daemon.log").read_text()
    assert said.count("incident 1 (") >= 2, said
    human = run(root, "daemon", "status")
    assert "open incident" in human.stdout and "--acknowledge 1" in human.stdout, human.stdout
    assert run(root, "fsck", "--acknowledge", "1").returncode == 2  # the daemon must be stopped
    assert run(root, "daemon", "stop").returncode == 0

    wrong = run(root, "fsck", "--acknowledge", "7")
    assert wrong.returncode == 2 and "incident 7 is not on record" in wrong.stderr, wrong.stderr
    assert "open incidents: 1" in wrong.stderr
    done = run(root, "fsck", "--acknowledge", "1")
    assert "acknowledged incident 1" in done.stdout, done.stdout
    code, found = fsck_findings(root)
    assert "incident_open" not in found, found
    again = run(root, "fsck", "--acknowledge", "1")  # a repeat changes nothing
    assert again.returncode == 0 and "acknowledged incident 1" in again.stdout, again.stderr

    assert run(root, "daemon", "start").returncode == 0
    assert status(root)["incidents"] == []
    assert "open incident" not in run(root, "daemon", "status").stdout
    assert run(root, "daemon", "stop").returncode == 0

    entries = read_log(incidents_path(root)).entries
    assert [e["event"] for e in entries] == [
        events.INCIDENT_RECORDED,
        events.INCIDENT_ACKNOWLEDGED,
    ]
    table = documented_events()
    for entry in entries:
        assert set(entry["data"]) <= table[entry["event"]], entry


def test_fsck_repair_records_the_incident_before_it_drops_the_checkpoint(
    root: Path, tmp_path: Path
) -> None:
    restore_older_log(root, tmp_path)
    code, found = fsck_findings(root, "--repair")
    assert code == 1 and "log_behind_checkpoint" in found, found
    code, found = fsck_findings(root)
    assert "log_behind_checkpoint" not in found, found  # the repair dropped the checkpoint
    (incident,) = found["incident_open"]
    assert "substrat fsck --acknowledge 1" in incident["detail"]
    (entry,) = read_log(incidents_path(root)).entries
    assert entry["data"]["found_by"] == "substrat fsck --repair"
