"""Using the faultfs pytest fixture on a project that is not substrat.

Nothing here imports substrat: ``notes_app`` is plain open/json.dump/os.replace
code, and the tests use only the ``faultfs`` and ``faultfs_explore`` fixtures
that installing the distribution provides.
"""

from __future__ import annotations

from typing import Any

import notes_app
import pytest

from faultfs import FaultFS, SimulatedCrash


def test_round_trip_on_the_simulated_disk(faultfs: FaultFS) -> None:
    path = faultfs.path("notes.json")
    notes_app.save(path, {"todo": ["milk"]})
    assert notes_app.load(path) == {"todo": ["milk"]}
    assert faultfs.tree() == {"notes.json": b'{"todo": ["milk"]}'}


@pytest.mark.faultfs(profile="posix")
def test_every_crash_point_leaves_old_or_new_notes(faultfs: FaultFS) -> None:
    path = faultfs.path("notes.json")
    notes_app.save(path, {"v": 1})
    faultfs.sync_all()
    start = faultfs.snapshot()
    before = faultfs.boundaries
    notes_app.save(path, {"v": 2})  # counting run: how many boundaries does a save have?
    total = faultfs.boundaries - before
    assert total == 10  # create, write, fsync, rename, directory fsync: two each
    for boundary in range(1, total + 1):
        run = FaultFS.from_snapshot(start)
        run.arm(boundary)
        with run:
            try:
                notes_app.save(path, {"v": 2})
            except SimulatedCrash:
                pass
        for mode in ("process", "power", "torn", "reorder"):
            for image in run.crash_images(mode, limit=8):
                with image:
                    assert notes_app.load(path) in ({"v": 1}, {"v": 2})


def save_twice(save: Any) -> Any:
    def workload(fs: FaultFS) -> None:
        for version in (1, 2):
            save(fs.path("notes.json"), {"v": version})
            fs.ack(version)

    return workload


def check(img: FaultFS) -> None:
    notes = notes_app.load(img.path("notes.json"))
    assert notes.get("v", 0) >= max(img.acked, default=0), f"acknowledged save lost: {notes}"


def test_the_durable_save_survives_every_mode(faultfs_explore: Any) -> None:
    report = faultfs_explore(save_twice(notes_app.save), check)
    assert report.boundaries > 0


def test_the_naive_save_is_caught(faultfs_explore: Any) -> None:
    report = faultfs_explore(save_twice(notes_app.save_naive), check, expect_failures=True)
    assert {"power", "reorder"} <= report.modes_failed()
    assert all("notes_app.py:" in site or site.startswith("<") for site in report.groups())
