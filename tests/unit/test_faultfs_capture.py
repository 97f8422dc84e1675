"""FaultFS.capture_at: one run keeps, at each planned boundary, exactly what a crash armed
there would have left (crash point, trace, acknowledgements, and every image of every mode)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest

from faultfs import MODES, FaultFS, Op, SimulatedCrash
from faultfs.errors import ConfigError

ROOT = "/faultfs-capture"
IMAGES_PER_MODE = 6


def workload(fs: FaultFS) -> None:
    """Appends with and without fsync, an atomic replace, a new directory, an unlink:
    something for every mode to tear or reorder."""
    os.mkdir(fs.path("d"))
    fd = os.open(fs.path("d", "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for n in range(3):
        os.write(fd, b"record %d\n" % n * 700)
        if n != 1:
            os.fsync(fd)
        fs.ack(n)
    os.close(fd)
    with open(fs.path("s.tmp"), "wb") as f:
        f.write(b"state" * 1000)
        f.flush()
        os.fsync(f.fileno())
    os.replace(fs.path("s.tmp"), fs.path("s"))
    with open(fs.path("d", "scratch"), "wb") as f:
        f.write(b"x" * 5000)
    os.unlink(fs.path("d", "scratch"))
    fs.ack("saved")


def _boundaries() -> int:
    fs = FaultFS(ROOT)
    with fs:
        workload(fs)
    return fs.boundaries


def _armed(boundary: int, record_trace: bool) -> FaultFS:
    fs = FaultFS(ROOT, profile="ext4-ordered", record_trace=record_trace)
    fs.arm(boundary)
    with pytest.raises(SimulatedCrash), fs:
        workload(fs)
    return fs


def _in_workload(op: Op) -> Op:
    """``op`` with its stack cut to the workload's frames: the tests call it from
    different places, the workload's own frames are what must agree."""
    return op._replace(stack=tuple(f for f in op.stack if f.function == "workload"))


def _state(fs: FaultFS) -> tuple[Any, ...]:
    """Everything a checker can get from a crash point: its point, trace, acks, and the
    images of every mode (origin, tree and acks of each)."""
    images = []
    for mode in MODES:
        for image in fs.crash_images(mode, limit=IMAGES_PER_MODE):
            origin = image.origin
            assert origin is not None and origin.op is not None
            origin = replace(origin, op=_in_workload(origin.op))
            images.append((origin, origin.choice, sorted(image.tree().items()), image.acked))
        images.append(("sampled", mode, sorted(fs.crash_image(mode, seed=3).tree().items())))
    assert fs.crash_point is not None
    boundary, phase, op = fs.crash_point
    point = (boundary, phase, _in_workload(op))
    trace = [_in_workload(op) for op in fs.trace]
    return (fs.crashed, point, trace, fs.acked, fs.boundaries, images)


@pytest.mark.parametrize("record_trace", [True, False])
def test_capturing_every_boundary_equals_arming_each_one(record_trace: bool) -> None:
    total = _boundaries()
    assert total > 20
    fs = FaultFS(ROOT, profile="ext4-ordered", record_trace=record_trace)
    captured = fs.capture_at(range(1, total + 1))
    with fs:
        workload(fs)
    assert not fs.crashed  # the run went on to the end
    assert [c.crash_point[0] for c in captured if c.crash_point] == list(range(1, total + 1))
    for boundary, copy in enumerate(captured, start=1):
        assert _state(copy) == _state(_armed(boundary, record_trace)), f"boundary {boundary}"


def test_capturing_changes_nothing_the_run_sees() -> None:
    plain = FaultFS(ROOT)
    with plain:
        workload(plain)
    fs = FaultFS(ROOT)
    fs.capture_at([1, 5, 9])
    with fs:
        workload(fs)
    assert fs.boundaries == plain.boundaries and fs.acked == plain.acked
    assert [_in_workload(op) for op in fs.trace] == [_in_workload(op) for op in plain.trace]
    assert fs.tree() == plain.tree() and fs.tree(durable=True) == plain.tree(durable=True)


def test_on_capture_runs_at_the_boundary_and_counts_from_now() -> None:
    fs = FaultFS(ROOT)
    with fs:
        os.mkdir(fs.path("first"))  # 2 boundaries before the plan
        seen: list[tuple[int, list[Any]]] = []
        captured = fs.capture_at([2, 4], lambda copy: seen.append((fs.boundaries, list(fs.acked))))
        workload(fs)
    assert [c.crash_point[0] for c in captured if c.crash_point] == [4, 6]
    assert seen == [(4, []), (6, [])]
    assert all(c.crashed for c in captured)
    with pytest.raises(Exception, match="crash"):
        captured[0].arm(1)  # a captured copy is a crashed process


def test_a_boundary_never_reached_leaves_no_entry_and_an_armed_crash_is_captured_first() -> None:
    total = _boundaries()
    fs = FaultFS(ROOT)
    captured = fs.capture_at([3, total + 5])
    with fs:
        workload(fs)
    assert len(captured) == 1
    fs = FaultFS(ROOT)
    captured = fs.capture_at([3, 7])
    fs.arm(7)
    with pytest.raises(SimulatedCrash), fs:
        workload(fs)
    assert [_state(c) for c in captured] == [_state(_armed(3, True)), _state(fs)]


def test_a_new_plan_replaces_the_old_one() -> None:
    fs = FaultFS(ROOT)
    first = fs.capture_at([1, 2])
    second = fs.capture_at(())
    with fs:
        workload(fs)
    assert first == [] and second == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True])
def test_bad_boundaries_are_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match="boundaries >= 1"):
        FaultFS(ROOT).capture_at([1, bad])


def test_capturing_on_a_crashed_file_system_is_refused() -> None:
    with pytest.raises(ConfigError, match="already crashed"):
        _armed(2, False).capture_at([1])


def test_io_from_on_capture_under_the_root_is_an_error() -> None:
    fs = FaultFS(ROOT)
    fs.capture_at([1], lambda copy: os.mkdir(fs.path("sneaky")))
    with pytest.raises(ConfigError, match="must not do I/O under the root"), fs:
        workload(fs)
