"""explore() reports causes, not symptoms: the missing durability step behind each failure.

The six classic bugs of docs/faultfs.md each yield exactly one cause naming the
missing step at its source line, with a fix hint, however many crash points,
modes and images show it. Different bugs that go through one helper stay apart;
one missing fsync spread over several writes stays one cause.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

import tests.support.faultfs_classic as classic
from faultfs import PROFILES, FaultFS, explore
from tests.support.faultfs_classic import CLASSIC, Classic, fsync_dir, line_of, write_all
from tests.support.pytest_run import run_pytest

CLASSIC_FILE = classic.__file__


def site(marker: str) -> str:
    return f"{CLASSIC_FILE}:{line_of(marker)}"


@pytest.mark.parametrize("bug", CLASSIC, ids=[b.name for b in CLASSIC])
def test_each_classic_bug_is_one_cause_at_its_lines_with_a_fix(bug: Classic) -> None:
    for profile in bug.visible_in:
        report = explore(bug.workload, bug.check, setup=bug.setup, profile=profile)
        causes = report.causes()
        assert len(causes) == 1, report.text()
        (cause,) = causes
        assert cause.kind == bug.cause
        # Every failing image is explained, and by this one cause.
        assert cause.failures == report.failures
        for role, marker in bug.steps:
            assert {s.site for s in cause.steps if s.role == role} == {site(marker)}, role
        summary, fix = cause.describe(os.path.dirname(CLASSIC_FILE))
        for _role, marker in bug.steps:
            assert f"faultfs_classic.py:{line_of(marker)}" in summary
        assert bug.fix in fix
        assert cause.profiles == {profile: len(report.failures)}


@pytest.mark.parametrize("bug", CLASSIC, ids=[b.name for b in CLASSIC])
def test_counts_per_mode_and_profile_add_up(bug: Classic) -> None:
    report = explore(bug.workload, bug.check, setup=bug.setup, profile=sorted(PROFILES))
    per_profile = report.failures_per_profile()
    assert set(per_profile) == set(bug.visible_in)  # invisible where the file system hides it
    assert sum(per_profile.values()) == len(report.failures)
    per_mode = report.failures_per_mode()
    assert sum(per_mode.values()) == len(report.failures) and "process" not in per_mode
    (cause,) = report.causes()
    assert cause.profiles == per_profile and cause.modes == per_mode
    text = report.text()
    assert "failing images per profile: " in text


def shared_helper_workload(fs: FaultFS) -> None:
    """Two different bugs, both writing through write_all (one helper line)."""
    tmp = fs.path("config.json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    write_all(fd, json.dumps({"version": 1}).encode())  # bug 1: no fsync before the rename
    os.close(fd)
    os.replace(tmp, fs.path("config.json"))
    fsync_dir(fs.root)
    fs.ack("config")
    fd = os.open(fs.path("log"), os.O_WRONLY | os.O_APPEND)
    write_all(fd, b"record\n")
    fs.ack("record")  # bug 2: acknowledged before the fsync below
    os.fsync(fd)
    os.close(fd)


def shared_helper_setup(fs: FaultFS) -> None:
    with open(fs.path("config.json"), "w") as handle:
        json.dump({"version": 0}, handle)
    os.close(os.open(fs.path("log"), os.O_WRONLY | os.O_CREAT, 0o644))


def shared_helper_check(img: FaultFS) -> None:
    with open(img.path("config.json")) as handle:
        json.load(handle)
    if "record" in img.acked:
        with open(img.path("log"), "rb") as handle:
            assert handle.read() == b"record\n"


def test_different_bugs_sharing_a_helper_stay_apart() -> None:
    report = explore(shared_helper_workload, shared_helper_check, setup=shared_helper_setup)
    causes = {c.kind: c for c in report.causes()}
    assert set(causes) == {"unsynced-before-rename", "unsynced-before-ack"}, report.text()
    helper = site("write-all")
    for cause in causes.values():
        (write,) = [s for s in cause.steps if s.role == "write"]
        assert write.site == helper  # the same helper line ...
        assert len(write.frames) >= 2  # ... reached from different callers
    callers = {c.kind: c.steps[0].frames[1].line for c in causes.values()}
    assert callers["unsynced-before-rename"] != callers["unsynced-before-ack"]
    rename = [s for s in causes["unsynced-before-rename"].steps if s.role == "rename"]
    assert rename and rename[0].path == report.root + "/config.json.tmp"


def split_record_workload(fs: FaultFS) -> None:
    """One record written as header and body, acknowledged without an fsync."""
    fd = os.open(fs.path("log"), os.O_WRONLY | os.O_APPEND)
    for i in range(2):
        os.write(fd, f"{i}:".encode())  # header
        os.write(fd, b"payload\n")  # body
        fs.ack(i)
    os.fsync(fd)
    os.close(fd)


def split_record_check(img: FaultFS) -> None:
    with open(img.path("log"), "rb") as handle:
        lines = handle.read().split(b"\n")
    for i in img.acked:
        assert f"{i}:payload".encode() in lines, f"record {i} lost"


def test_one_missing_fsync_over_several_writes_is_one_cause() -> None:
    report = explore(
        split_record_workload,
        split_record_check,
        setup=lambda fs: os.close(os.open(fs.path("log"), os.O_WRONLY | os.O_CREAT, 0o644)),
    )
    (cause,) = report.causes()
    assert cause.kind == "unsynced-before-ack"
    writes = {s.site for s in cause.steps if s.role == "write"}
    assert len(writes) == 2  # the header's and the body's write lines, in one cause
    assert "fsync the file before acknowledging" in cause.fix


def write_new(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, data)
    os.close(fd)


def two_files_workload(fs: FaultFS) -> None:
    """A value in one file and its index in another, acknowledged with neither fsynced."""
    write_new(fs.path("data"), b"value\n")
    write_new(fs.path("index"), b"data:0\n")
    fs.ack(1)


def two_files_check(img: FaultFS) -> None:
    if img.acked:
        with open(img.path("data"), "rb") as data, open(img.path("index"), "rb") as index:
            assert (data.read(), index.read()) == (b"value\n", b"data:0\n")


def test_a_cause_over_writes_to_two_files_names_each_file_at_its_line() -> None:
    def setup(fs: FaultFS) -> None:
        for name in ("data", "index"):
            os.close(os.open(fs.path(name), os.O_WRONLY | os.O_CREAT, 0o644))
        fsync_dir(fs.root)

    report = explore(two_files_workload, two_files_check, setup=setup)
    (cause,) = report.causes()
    summary, fix = cause.describe(os.path.dirname(__file__))
    line = inspect.getsourcelines(write_new)[1] + 2  # its os.write: one helper, two files
    mine = os.path.basename(__file__)
    assert summary.startswith(
        f"data written to data and index at {mine}:{line} was never fsynced"
    ), summary
    assert fix.startswith("fsync each of these files before acknowledging"), fix


def rewrite_in_place(fs: FaultFS) -> None:
    fd = os.open(fs.path("state.json"), os.O_WRONLY | os.O_TRUNC)
    os.write(fd, json.dumps({"version": 1}).encode())
    os.fsync(fd)
    os.close(fd)
    fs.ack(1)


def state_check(img: FaultFS) -> None:
    with open(img.path("state.json")) as handle:
        assert json.load(handle)["version"] >= max(img.acked, default=0)


def test_rewriting_in_place_is_one_cause_with_the_atomic_fix() -> None:
    def setup(fs: FaultFS) -> None:
        with open(fs.path("state.json"), "w") as handle:
            json.dump({"version": 0}, handle)

    report = explore(rewrite_in_place, state_check, setup=setup)
    # A kill -9 between the truncate and the write shows it, and so does a
    # reordering disk that kept the truncate: one cause either way.
    assert {"process", "reorder"} <= report.modes_failed()
    (cause,) = report.causes()
    assert cause.kind == "in-place-rewrite"
    assert "rename it over the old one" in cause.fix
    assert "state.json was truncated at" in cause.summary


def test_pytest_failure_is_the_report_with_relative_paths(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_app.py").write_text(
        textwrap.dedent(
            """
            import os

            def save(path, data):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.write(fd, data)
                os.close(fd)

            def test_save(faultfs_explore):
                def workload(fs):
                    save(fs.path("f"), b"x")
                    fs.ack("f")

                def check(img):
                    if img.acked:
                        with open(img.path("f"), "rb") as handle:
                            assert handle.read() == b"x"

                faultfs_explore(workload, check)
            """
        )
    )
    result = run_pytest(project, "test_app.py")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "data written to f at test_app.py:6 was never fsynced" in out
    assert "the entry f created at test_app.py:5 was never made durable" in out
    assert "fix: fsync the file before acknowledging" in out
    assert "self = " not in out and "ExploreReport(" not in out and "Traceback" not in out
    # Sources relative to the rootdir, files relative to the simulated root.
    assert str(project) not in out and "pytest-of" not in out


def copy_workload(fs: FaultFS) -> None:
    shutil.copyfile(fs.path("src"), fs.path("dst"))  # the standard library writes
    fs.ack("dst")


def copy_check(img: FaultFS) -> None:
    if img.acked:
        with open(img.path("dst"), "rb") as handle:
            assert handle.read() == b"payload"


def test_a_step_the_standard_library_issued_names_its_frame_and_the_users() -> None:
    def setup(fs: FaultFS) -> None:
        with open(fs.path("src"), "wb") as handle:
            handle.write(b"payload")

    report = explore(copy_workload, copy_check, setup=setup)
    causes = {c.kind: c for c in report.causes()}
    assert set(causes) == {"entry-not-durable", "unsynced-before-ack"}, report.text()
    (write,) = [s for s in causes["unsynced-before-ack"].steps if s.role == "write"]
    assert write.frames[0].in_stdlib and write.frames[0].file.endswith("shutil.py")
    user_line = line_of_source(copy_workload, "shutil.copyfile")
    assert write.site == f"{__file__}:{user_line}"
    text = report.text(os.path.dirname(__file__))
    assert f"<stdlib>/shutil.py:{write.frames[0].line} ({write.frames[0].function}), " in text
    assert f"called from test_faultfs_causes.py:{user_line} (copy_workload)" in text


def line_of_source(function: Any, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def overwrite_then_truncate(fs: FaultFS) -> None:
    """A store that rewrites its whole file in place: write at 0, fsync, then cut the rest.

    TinyDB's JSONStorage does this; the cut is never fsynced, and a shorter
    document leaves old bytes behind it until the cut lands.
    """
    fd = os.open(fs.path("db.json"), os.O_RDWR)
    os.write(fd, json.dumps({"docs": [1]}).encode())
    os.fsync(fd)
    os.ftruncate(fd, len(json.dumps({"docs": [1]})))
    os.close(fd)
    fs.ack("removed 2")


def db_setup(fs: FaultFS) -> None:
    with open(fs.path("db.json"), "w") as handle:
        json.dump({"docs": [1, 2]}, handle)


def db_check(img: FaultFS) -> None:
    with open(img.path("db.json")) as handle:
        docs = json.load(handle)["docs"]
    assert docs == [1] if img.acked else docs in ([1], [1, 2])


def truncate_then_rewrite(fs: FaultFS) -> None:
    with open(fs.path("state.json"), "r+") as handle:
        handle.truncate(0)
        handle.write(json.dumps({"version": 1}))
        handle.flush()
        os.fsync(handle.fileno())
    fs.ack(1)


def test_a_kill_between_the_truncate_and_the_write_names_no_unknown_line() -> None:
    def setup(fs: FaultFS) -> None:
        with open(fs.path("state.json"), "w") as handle:
            json.dump({"version": 0}, handle)

    # A kill -9 alone sees only the truncate: the cause has no write to name.
    report = explore(truncate_then_rewrite, state_check, setup=setup, modes=["process"])
    (cause,) = report.causes()
    summary, fix = cause.describe(os.path.dirname(__file__))
    line = inspect.getsourcelines(truncate_then_rewrite)[1] + 2
    assert summary == (
        f"state.json was truncated at test_faultfs_causes.py:{line} to be rewritten in place: "
        "a crash before the new data was written leaves it cut"
    ), summary
    assert "rename it over the old one" in fix


def test_a_lost_truncate_names_the_truncated_file() -> None:
    report = explore(overwrite_then_truncate, db_check, setup=db_setup)
    causes = {c.kind: c for c in report.causes()}
    assert set(causes) == {"not-atomic", "lost-truncate"}, report.text()
    line = line_of_source(overwrite_then_truncate, "os.ftruncate")
    summary, fix = causes["lost-truncate"].describe(os.path.dirname(__file__))
    assert summary.startswith(f"the truncate of db.json at test_faultfs_causes.py:{line} "), summary
    assert fix == "fsync the file after truncating it"


def whole_file_rewrite(fs: FaultFS) -> None:
    with open(fs.path("db.json"), "w") as handle:  # the whole document, from offset 0
        json.dump({"docs": [1, 2, 3]}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    fs.ack("saved")


def test_a_torn_whole_file_rewrite_suggests_a_temporary_file_and_a_rename() -> None:
    def setup(fs: FaultFS) -> None:
        os.close(os.open(fs.path("db.json"), os.O_WRONLY | os.O_CREAT, 0o644))

    def check(img: FaultFS) -> None:
        with open(img.path("db.json")) as handle:
            text = handle.read()
        if text or img.acked:
            assert json.loads(text) == {"docs": [1, 2, 3]}

    report = explore(whole_file_rewrite, check, setup=setup, modes=("torn",))
    causes = {c.kind: c for c in report.causes()}
    assert "torn-write" in causes, report.text()
    fix = causes["torn-write"].fix
    assert "write a temporary file, fsync it and rename it over the old one" in fix, fix
    # It may still be the first record of a log: the log advice stays.
    assert "self-checking" in fix


def publish_without_dir_fsync(fs: FaultFS) -> None:
    """persist-queue's info save: a temporary file renamed into place, no fsync at all."""
    tmp = fs.path("info.tmp")
    with open(tmp, "w") as handle:
        json.dump({"version": 1}, handle)
    os.replace(tmp, fs.path("info"))
    fs.ack(1)


def test_on_a_journal_a_missing_directory_fsync_is_one_cause_at_the_rename() -> None:
    def setup(fs: FaultFS) -> None:
        with open(fs.path("info"), "w") as handle:
            json.dump({"version": 0}, handle)

    def check(img: FaultFS) -> None:
        with open(img.path("info")) as handle:
            assert json.load(handle)["version"] >= max(img.acked, default=0)

    report = explore(publish_without_dir_fsync, check, setup=setup, profile="ext4-ordered")
    # Losing the temporary file's create loses the rename after it (a journal
    # loses a suffix): one missing step, named at the rename.
    (cause,) = report.causes()
    assert cause.kind == "entry-not-durable", report.text()
    line = line_of_source(publish_without_dir_fsync, "os.replace")
    assert [s.site for s in cause.steps if s.role == "rename"] == [f"{__file__}:{line}"]
    assert cause.failures == report.failures
