"""explore captures every crash point in one run; it must report what one run per boundary did.

The re-run path is explore's own: with the nondeterministic health check
suppressed, each boundary still gets its own run armed there (a workload
allowed to differ between runs is sampled anew per crash point). For a
deterministic workload both paths must give the same report, field for field:
crash points, images checked, reused and analysed per mode, every failure
(where, which image, the error, its trace and acknowledgements) and the causes
traced from them.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from faultfs import FaultFS, HealthCheck, explore
from faultfs._report import ExploreReport, Failure
from tests.support.faultfs_classic import CLASSIC, config_check, config_setup, config_workload

RERUN = [HealthCheck.nondeterministic]


def _notes_app() -> Any:
    path = Path(__file__).parents[1] / "faultfs_example" / "notes_app.py"
    spec = importlib.util.spec_from_file_location("notes_app_for_capture", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def notes_workload(save: Callable[[str, dict[str, Any]], None]) -> Callable[[FaultFS], None]:
    def workload(fs: FaultFS) -> None:
        for version in (1, 2, 3):
            save(fs.path("notes.json"), {"v": version})
            fs.ack(version)

    return workload


def notes_check(img: FaultFS) -> None:
    notes = _NOTES.load(img.path("notes.json"))
    assert notes.get("v", 0) >= max(img.acked, default=0), f"acknowledged save lost: {notes}"


_NOTES = _notes_app()


def counted(workload: Callable[[FaultFS], None]) -> tuple[Callable[[FaultFS], None], list[int]]:
    runs = [0]

    def run(fs: FaultFS) -> None:
        runs[0] += 1
        workload(fs)

    return run, runs


def no_addresses(text: str) -> str:
    # pytest's assertion messages show objects' addresses, which differ between any two runs.
    return re.sub(r"0x[0-9a-f]+", "0x?", text)


def failure_fields(f: Failure) -> tuple[object, ...]:
    where = (f.profile, f.boundary, f.phase, f.op, f.mode, f.image_index, f.seed, f.detail)
    what = (no_addresses(f.error), no_addresses(f.traceback), f.trace, f.acked, f.findings)
    return where + what


def summary(report: ExploreReport) -> dict[str, Any]:
    """Everything a report says, as plain values (failures with their causes)."""
    return {
        "boundaries": report.boundaries,
        "unreached": report.unreached,
        "checked": report.images_checked,
        "reused": report.images_reused,
        "analysed": report.images_analysed,
        "per_mode": report.failures_per_mode(),
        "per_profile": report.failures_per_profile(),
        "failures": [failure_fields(f) for f in report.failures],
        "causes": [(c.kind, c.key, c.steps, c.note, len(c.failures)) for c in report.causes()],
        "text": no_addresses(report.text()),
    }


CASES: list[tuple[str, Any, Any, Any, Any]] = [
    (c.name, c.workload, c.check, c.setup, list(c.visible_in)) for c in CLASSIC
] + [
    ("notes_app.save_naive", notes_workload(_NOTES.save_naive), notes_check, None, "posix"),
    ("notes_app.save", notes_workload(_NOTES.save), notes_check, None, ["posix", "lazyfs"]),
    ("config, correct", config_workload(), config_check, config_setup, ["posix", "lazyfs"]),
]


@pytest.mark.parametrize(("name", "workload", "check", "setup", "profile"), CASES,
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_one_capturing_run_reports_what_a_run_per_boundary_did(
    name: str, workload: Any, check: Any, setup: Any, profile: Any
) -> None:
    captured_workload, captured_runs = counted(workload)
    rerun_workload, rerun_runs = counted(workload)
    captured = explore(captured_workload, check, setup=setup, profile=profile)
    rerun = explore(rerun_workload, check, setup=setup, profile=profile,
                    suppress_health_check=RERUN)  # fmt: skip
    profiles = 1 if isinstance(profile, str) else len(profile)
    # Each path ran as it says: counting, determinism and one capturing run per
    # profile against counting and one armed run per boundary.
    assert captured_runs[0] == 3 * profiles
    assert rerun_runs[0] == profiles * (1 + rerun.boundaries)
    assert captured.boundaries > 0 and captured.images_checked > 0
    assert summary(captured) == summary(rerun)


def test_the_comparison_sees_a_difference() -> None:
    """summary() is fine enough to tell two different sweeps apart."""
    whole = explore(notes_workload(_NOTES.save_naive), notes_check)
    part = explore(notes_workload(_NOTES.save_naive), notes_check,
                   boundaries=range(1, whole.boundaries))  # fmt: skip
    assert not whole.ok
    assert summary(whole) != summary(part)


def test_a_long_workload_is_captured_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    from faultfs import _explore

    monkeypatch.setattr(_explore, "CAPTURED_PER_RUN", 7)
    workload, runs = counted(notes_workload(_NOTES.save_naive))
    sliced = explore(workload, notes_check)
    assert runs[0] == 2 + -(-sliced.boundaries // 7)
    rerun, _ = counted(notes_workload(_NOTES.save_naive))  # the same frames in every op
    assert summary(sliced) == summary(explore(rerun, notes_check, suppress_health_check=RERUN))


def test_a_third_run_that_differs_fails_the_nondeterministic_check() -> None:
    """Capturing trusts one run for every crash point, so it checks that run too."""
    runs = [0]

    def workload(fs: FaultFS) -> None:
        runs[0] += 1
        with open(fs.path("a"), "w") as f:
            f.write("x")
            if runs[0] == 3:  # the capturing run does one more thing
                os.fsync(f.fileno())
        fs.ack("a")

    from faultfs.errors import FailedHealthCheck

    with pytest.raises(FailedHealthCheck, match="not deterministic") as info:
        explore(workload, lambda img: img.tree())
    assert info.value.health_check is HealthCheck.nondeterministic


@pytest.mark.parametrize(("name", "workload", "check", "setup", "profile"), CASES,
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_a_point_like_an_earlier_passing_one_reports_the_same_without_its_images(
    monkeypatch: pytest.MonkeyPatch, name: str, workload: Any, check: Any, setup: Any,
    profile: Any,
) -> None:  # fmt: skip
    """A crash point whose model and acknowledgements equal those of an earlier point all of
    whose images passed (a crash after one call and one before the next) has the same
    images: explore counts them reused without building them, and reports what building
    them all reports, field for field."""
    from faultfs._model import Model

    built = [0]
    real = FaultFS.crash_images

    def counting(self: FaultFS, *args: Any, **kwargs: Any) -> Any:
        built[0] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FaultFS, "crash_images", counting)
    memo = explore(workload, check, setup=setup, profile=profile)
    with_memo = built[0]
    keys = iter(range(10**9))
    monkeypatch.setattr(Model, "key", lambda self: str(next(keys)).encode())  # all unequal
    built[0] = 0
    every = explore(workload, check, setup=setup, profile=profile)
    assert summary(memo) == summary(every)
    assert with_memo <= built[0]
    if memo.ok:  # the points of a workload that passes are all such repeats or not
        assert with_memo < built[0]
