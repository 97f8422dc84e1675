"""What an outside user of faultfs met (review s15d): wrong causes, bare errors, wording.

Each test is one of the review's reproductions cut down: mkstemp then open
for writing, pool threads running built-ins, sqlite3 and mmap under the root,
pyfakefs in the same test, a mode given as a string, a machine without
observe().
"""

from __future__ import annotations

import inspect
import mmap
import os
import re
import sqlite3
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import strategies as st

from faultfs import FaultFS, explore
from faultfs.errors import ConfigError, EscapeError
from faultfs.stateful import CrashStateMachine, rule
from tests.support.faultfs_classic import fsync_dir
from tests.support.pytest_run import run_pytest

MINE = os.path.basename(__file__)


def mkstemp_save(path: str, text: str, *, fsync_file: bool, fsync_parent: bool = True) -> None:
    """A unique name from mkstemp, then open(name, "w") on it: how many libraries save."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder)
    os.close(fd)
    with open(tmp, "w") as handle:  # O_TRUNC of the empty file mkstemp made
        handle.write(text)
        if fsync_file:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    if fsync_parent:
        fsync_dir(folder)


def check_version(img: FaultFS) -> None:
    with open(img.path("state.txt")) as handle:
        assert int(handle.read().split()[1]) >= max(img.acked, default=0)


def save_versions(fs: FaultFS, **how: bool) -> None:
    for version in (1, 2, 3):
        mkstemp_save(fs.path("state.txt"), f"version {version}", **how)
        fs.ack(version)


def setup_version_0(fs: FaultFS) -> None:
    mkstemp_save(fs.path("state.txt"), "version 0", fsync_file=True)


def test_open_for_writing_of_an_empty_new_file_is_not_an_in_place_rewrite() -> None:
    # The O_TRUNC truncated nothing: the missing step is the fsync before the rename,
    # and the random temporary names read as one pattern, not as a list of names.
    report = explore(
        lambda fs: save_versions(fs, fsync_file=False), check_version, setup=setup_version_0
    )
    assert [cause.kind for cause in report.causes()] == ["unsynced-before-rename"]
    summary, _fix = report.causes()[0].describe(os.path.dirname(__file__))
    flushed_at = inspect.getsourcelines(mkstemp_save)[1] + 5  # the with's close writes
    assert re.match(
        rf"data written to tmpXXXXXXXX \(\d files\) at {MINE}:{flushed_at} was never fsynced "
        "before the rename",
        summary,
    ), summary


def test_truncating_a_file_with_data_is_still_an_in_place_rewrite() -> None:
    def workload(fs: FaultFS) -> None:
        with open(fs.path("state.txt"), "w") as handle:  # cuts "version 0" on the disk
            handle.write("version 1")
        fs.ack(1)

    report = explore(workload, check_version, setup=setup_version_0)
    assert "in-place-rewrite" in [cause.kind for cause in report.causes()]


def test_renames_in_one_directory_name_it_once_and_temporary_names_as_a_pattern() -> None:
    report = explore(
        lambda fs: save_versions(fs, fsync_file=True, fsync_parent=False),
        check_version,
        setup=setup_version_0,
    )
    (cause,) = report.causes()
    summary, fix = cause.describe(os.path.dirname(__file__))
    assert summary.startswith("the renames of tmpXXXXXXXX ("), summary
    assert " files) to state.txt at " in summary, summary
    assert fix == "fsync the directory (.) after the renames"


def test_io_a_pool_thread_runs_directly_is_located_where_it_was_submitted() -> None:
    def workload(fs: FaultFS) -> None:
        fd = os.open(fs.path("log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(os.write, fd, b"record\n").result()  # a built-in: no frame of ours
        os.close(fd)
        fs.ack(1)

    def check(img: FaultFS) -> None:
        with open(img.path("log"), "rb") as handle:
            assert handle.read().count(b"record\n") >= len(img.acked)

    def setup(fs: FaultFS) -> None:
        os.close(os.open(fs.path("log"), os.O_WRONLY | os.O_CREAT, 0o644))

    report = explore(workload, check, setup=setup)
    (cause,) = report.causes()
    submit_line = inspect.getsourcelines(workload)[1] + 3
    summary, _fix = cause.describe(os.path.dirname(__file__))
    assert summary.startswith(f"data written to log at {MINE}:{submit_line} "), summary
    text = report.text(os.path.dirname(__file__))
    assert f"in a worker thread, for work submitted at {MINE}:{submit_line} (workload)" in text


def test_sqlite3_under_the_root_is_named_as_invisible_even_when_swallowed() -> None:
    with FaultFS("/faultfs-outsiders") as fs:
        with pytest.raises(EscapeError, match="sqlite3 reads and writes it from C"):
            sqlite3.connect(fs.path("a.db"))
        try:
            sqlite3.connect(f"file:{fs.path('b.db')}?mode=rwc", uri=True)
        except Exception:
            pass
        sqlite3.connect(":memory:").close()  # nothing on any disk: allowed
    assert len(fs.escapes) == 2 and "'Limits: what faultfs cannot see'" in fs.escapes[1]


def test_mmap_of_a_simulated_file_is_named_not_ebadf() -> None:
    with FaultFS("/faultfs-outsiders") as fs:
        with open(fs.path("m"), "wb") as handle:
            handle.write(bytes(4096))
        with open(fs.path("m"), "r+b") as handle:
            with pytest.raises(EscapeError, match=r"mmap\.mmap of '/faultfs-outsiders/m'"):
                mmap.mmap(handle.fileno(), 4096)
    with mmap.mmap(-1, 16) as anonymous:  # faultfs inactive: no hook in the way
        anonymous[:2] = b"ok"


def test_a_mode_given_as_a_string_is_that_one_mode() -> None:
    report = explore(lambda fs: save_versions(fs, fsync_file=True), check_version,
                     setup=setup_version_0, modes="power")  # fmt: skip
    assert report.modes == ("power",) and report.ok


def test_machine_attributes_given_as_strings_say_to_pass_a_tuple() -> None:
    with pytest.raises(ConfigError, match=r"did you mean modes = \('power',\)\?"):

        class PowerOnly(CrashStateMachine):
            modes = "power"  # type: ignore[assignment]


class NoObserve(CrashStateMachine):
    def recover(self) -> None:
        pass

    @rule(x=st.integers(0, 3))
    def put(self, x: int) -> None:
        with self.acknowledging(x):
            pass


def test_a_machine_without_observe_says_so() -> None:
    with pytest.raises(ConfigError, match=r"does not define observe\(\) and expected\(\)"):
        NoObserve.TestCase().runTest()


# The two refusals run in the child pytest below, not here: pyfakefs's first start in a
# process scans every loaded module's names, and in a worker of the whole suite that
# touches the openai package's lazy module clients, which import its resources (1.3 CPU s
# alone, 3.8 in the main job). The child has not loaded them; the checks are the same.
PYFAKEFS_FIXTURES = """
import os

import pytest
from pyfakefs.fake_filesystem_unittest import Patcher

from faultfs import FaultFS
from faultfs.errors import ConfigError


def test_fs_then_faultfs(fs, faultfs):
    pass

def test_faultfs_then_fs(faultfs, fs):
    pass

def test_fs_alone_after(fs):
    fs.create_file("/x", contents="y")
    assert open("/x").read() == "y"

def test_faultfs_refuses_to_start_under_pyfakefs(fs):
    with pytest.raises(ConfigError, match="faultfs and pyfakefs cannot be combined"):
        FaultFS("/srv/app").__enter__()

def test_pyfakefs_refuses_to_start_under_faultfs_and_works_after():
    with FaultFS("/faultfs-outsiders"):
        with pytest.raises(ConfigError, match="pyfakefs cannot start while faultfs is active"):
            Patcher().setUp()
    with Patcher() as patcher:  # the refusal left pyfakefs's own count alone
        assert patcher.fs is not None
        patcher.fs.create_file("/fake/f", contents="x")
        assert open("/fake/f").read() == "x"
"""
REFUSALS = (
    "test_faultfs_refuses_to_start_under_pyfakefs",
    "test_pyfakefs_refuses_to_start_under_faultfs_and_works_after",
)


def test_fixtures_of_both_in_one_test_fail_it_with_the_reason_not_a_recursion(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_both.py").write_text(PYFAKEFS_FIXTURES)
    result = run_pytest(tmp_path, "-rA", plugins_off=("benchmark", "anyio"))  # pyfakefs's `fs`
    out = result.stdout + result.stderr
    assert "RecursionError" not in out and "numbered dir" not in out, out[-3000:]
    assert "3 passed, 2 errors" in out, out[-3000:]
    assert out.count("faultfs and pyfakefs cannot be combined") >= 2, out[-3000:]
    for name in REFUSALS:
        assert f"PASSED test_both.py::{name}" in out, out[-3000:]


def test_a_state_after_renames_of_random_names_names_their_pattern() -> None:
    from faultfs._causes import Step
    from faultfs._trace import Frame
    from faultfs._wording import Where, describe

    frames = (Frame("/src/queue.py", 22, "atomic_rename"),)
    steps = tuple(
        Step("after", "rename", f"/r/tmp{n}", (), frames) for n in ("a1b2c3d4", "z9y8x7w6")
    )
    summary, _fix = describe("not-atomic", steps, "", Where("/r"))
    assert summary.startswith(
        "a crash right after any of the renames of tmpXXXXXXXX (2 files) at /src/queue.py:22 "
    ), summary
