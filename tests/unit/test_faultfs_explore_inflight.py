"""explore and the operation in flight: a check that refuses it landing is the check's fault.

A correct, atomic, durable save, checked by a check that demands exactly the
acknowledged value: under kill -9 the save in flight may have landed, and the
check fails. The report must say so, not blame the code with "rejects even with
every write on the disk (a kill -9 shows it too)".
"""

from __future__ import annotations

import json

from faultfs import FaultFS, explore
from tests.support.faultfs_classic import atomic_write


def save(path: str, value: int, *, dir_sync: bool = True) -> None:
    atomic_write(path, json.dumps(value).encode(), file_sync=True, dir_sync=dir_sync)


def workload(fs: FaultFS) -> None:
    for value in (1, 2):
        save(fs.path("v"), value)
        fs.ack(value)


def stored(img: FaultFS) -> int:
    try:
        with open(img.path("v")) as handle:
            value: int = json.load(handle)
            return value
    except FileNotFoundError:
        return 0


def strict(img: FaultFS) -> None:
    # Forgets the save in flight: it may have landed before its acknowledgement.
    assert stored(img) == (img.acked[-1] if img.acked else 0)


def allowing(img: FaultFS) -> None:
    done = len(img.acked)
    allowed = {img.acked[-1] if img.acked else 0}
    if done < 2:
        allowed.add(done + 1)  # the save in flight landed
    assert stored(img) in allowed


def test_a_check_that_refuses_the_operation_in_flight_is_named_not_the_code() -> None:
    report = explore(workload, strict, modes=("process",))
    assert report.failures, "the strict check fails where the save in flight landed"
    assert report.causes() == [], [c.describe(None) for c in report.causes()]
    for failure in report.failures:
        assert "the check, not the code, is at fault" in failure.error, failure.error
        assert "the workload's next fs.ack: " in failure.error
    text = report.text()
    assert "a kill -9 shows it too" not in text
    assert "Operations in flight" in text
    assert explore(workload, allowing).ok  # the check that allows it passes


def test_a_real_loss_keeps_its_cause() -> None:
    def no_dir_fsync(fs: FaultFS) -> None:
        for value in (1, 2):
            save(fs.path("v"), value, dir_sync=False)
            fs.ack(value)

    report = explore(no_dir_fsync, allowing, modes=("power",))
    assert [c.kind for c in report.causes()] == ["entry-not-durable"]
    assert not any("the check, not the code" in f.error for f in report.failures)
