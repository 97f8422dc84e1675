"""Recording an incident and acknowledging one (substrat/incidents.py) at every crash point.

Both are new durable steps: an ``incident.recorded`` or ``incident.acknowledged`` entry
appended to ``incidents/events.jsonl`` (its directory made first). A crash anywhere in
one must leave a log that reads: the incident on record or not yet (the checkpoint that
tells it is still there, so the next recovery records it), acknowledged or still open;
once the call returned, only the new state. Nothing else in the log may be lost.
"""

from __future__ import annotations

import pytest

from faultfs import PROFILES, FaultFS, explore
from substrat import incidents
from substrat.incidents import Behind

RECORDED, ACKNOWLEDGED = 1, 2


def loss(endpoint: str, log_last: int) -> Behind:
    return Behind(
        endpoint,
        f"agents/{endpoint}/events.jsonl",
        {"seq": 12, "file_first": 1, "offset": 3000},
        "0badcafe",
        {"last_seq": log_last, "bytes": 1800},
        "the log ends before entry 12 (it is shorter than the checkpoint)",
    )


def _record(fs: FaultFS) -> None:
    incidents.record(fs.root, [loss("a" * 32, 7)], "test")
    fs.ack(RECORDED)


def _check_record(img: FaultFS) -> None:
    read = incidents.read_incidents(img.root)
    ids = sorted(read.incidents)
    # a damaged last line: the append cut short, never returned (the next open cuts it)
    assert not read.damage or (ids == [] and RECORDED not in img.acked), (read, img.origin)
    assert ids in ([], [1]) if RECORDED not in img.acked else ids == [1], (ids, img.origin)
    if ids:
        assert read.incidents[1].data["missing"] == 5 and read.incidents[1].acknowledged is None
    # the next recovery finds the same loss: on record once, the torn tail cut
    again = incidents.record(img.root, [loss("a" * 32, 7)], "test")
    assert sorted(again.incidents) in ([1], [2]) and not again.damage, (again, img.origin)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_an_incident_recorded_cut_anywhere_is_on_record_or_not_and_once_returned(
    profile: str,
) -> None:
    report = explore(_record, _check_record, profile=profile, root="/incident-root")
    report.assert_ok()
    assert report.boundaries >= 3, report.boundaries  # directory, file, append's fsync


def _recorded(fs: FaultFS) -> None:
    incidents.record(fs.root, [loss("a" * 32, 7), loss("b" * 32, 3)], "test")


def _acknowledge(fs: FaultFS) -> None:
    incidents.acknowledge_all(fs.root, [2], "test")
    fs.ack(ACKNOWLEDGED)


def _check_acknowledge(img: FaultFS) -> None:
    read = incidents.read_incidents(img.root)
    assert sorted(read.incidents) == [1, 2], (read.incidents, img.origin)
    assert read.incidents[1].acknowledged is None, img.origin  # the other one stays open
    acked = read.incidents[2].acknowledged is not None
    assert acked or ACKNOWLEDGED not in img.acked, f"acknowledgement lost at {img.origin}"
    assert not read.damage or not acked, (read, img.origin)  # only the cut-short last line
    if not acked:  # the operator acknowledges it again: the log ends clean
        incidents.acknowledge_all(img.root, [2], "test")
        after = incidents.read_incidents(img.root)
        assert [i.id for i in after.open()] == [1] and not after.damage, (after, img.origin)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_an_acknowledgement_cut_anywhere_is_there_or_not_and_once_returned(profile: str) -> None:
    report = explore(
        _acknowledge, _check_acknowledge, setup=_recorded, profile=profile, root="/incident-root"
    )
    report.assert_ok()
    assert report.boundaries >= 2, report.boundaries
