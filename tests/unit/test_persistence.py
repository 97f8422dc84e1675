from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from substrat import persistence
from substrat.errors import DurabilityError


def test_write_all_loops_over_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    calls: list[int] = []

    def short_write(fd: int, data: bytes) -> int:
        calls.append(len(data))
        return real_write(fd, bytes(data[:3]))

    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    monkeypatch.setattr(os, "write", short_write)
    persistence.write_all(fd, b"0123456789")
    monkeypatch.undo()
    os.close(fd)
    assert path.read_bytes() == b"0123456789"
    assert len(calls) == 4


def test_write_all_refuses_zero_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    with pytest.raises(DurabilityError):
        persistence.write_all(fd, b"abc")
    monkeypatch.undo()
    os.close(fd)


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "rec.json"
    persistence.atomic_write(target, b"one")
    persistence.atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec.json"]


def test_atomic_write_fsyncs_file_before_replace_and_dir_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        order.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        real_fsync(fd)

    def replace(src: object, dst: object) -> None:
        order.append("replace")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    persistence.atomic_write(tmp_path / "x", b"data")
    assert order == ["fsync-file", "replace", "fsync-dir"]


def test_failed_fsync_raises_durability_error_and_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0

    def failing(fd: int) -> None:
        nonlocal calls
        calls += 1
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(DurabilityError, match="treated as lost"):
        persistence.atomic_write(tmp_path / "x", b"data")
    assert calls == 1
    monkeypatch.undo()
    assert not (tmp_path / "x").exists()


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The directories `persistence.fsync_dir` really fsyncs during the test, in order."""
    calls: list[str] = []
    real = persistence.fsync_dir

    def spy(path: str | os.PathLike[str]) -> None:
        calls.append(os.fspath(path))
        real(path)

    monkeypatch.setattr(persistence, "fsync_dir", spy)
    return calls


def test_durable_mkdir_creates_parents_and_fsyncs_each_parent(
    tmp_path: Path, synced: list[str]
) -> None:
    above = _parents_from_the_mount_point(tmp_path)  # tmp_path's own entry lives there
    assert persistence.durable_mkdir(tmp_path / "a" / "b" / "c") is True
    assert (tmp_path / "a" / "b" / "c").is_dir()
    assert synced == [*above, str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a" / "b")]
    synced.clear()
    # Existing: every level's entry again (any may be left by an interrupted call), top down.
    assert persistence.durable_mkdir(tmp_path / "a" / "b" / "c") is False
    assert synced == [*above, str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a" / "b")]


def test_durable_mkdir_below_a_durable_base_fsyncs_only_from_the_base_down(
    tmp_path: Path, synced: list[str]
) -> None:
    base = tmp_path / "root"
    base.mkdir()
    assert persistence.durable_mkdir(base / "a" / "b", durable_base=base) is True
    assert synced == [str(base), str(base / "a")]
    synced.clear()
    assert persistence.durable_mkdir(base / "a" / "b", durable_base=base) is False
    assert synced == [str(base), str(base / "a")]
    synced.clear()
    assert persistence.durable_mkdir(base, durable_base=base) is False
    assert synced == []
    with pytest.raises(AssertionError, match="is not above"):
        persistence.durable_mkdir(tmp_path / "elsewhere", durable_base=base)


def _parents_from_the_mount_point(path: Path) -> list[str]:
    chain = []
    while path != path.parent and path.parent.stat().st_dev == path.stat().st_dev:
        path = path.parent
        chain.append(str(path))
    return chain[::-1]


def test_durable_mkdir_skips_an_ancestor_it_may_not_open_but_not_a_failed_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ancestor we may not read (``/home`` at 0711, say) cannot hold an entry a
    call of ours made durable; the walk skips it instead of failing. A failed fsync
    of an ancestor is never skipped."""
    real = persistence.fsync_dir
    synced: list[str] = []
    refuse: list[BaseException] = [PermissionError(13, "Permission denied")]

    def fsync_dir(path: str | os.PathLike[str]) -> None:
        if Path(path) == tmp_path.parent:
            raise refuse[0]
        synced.append(os.fspath(path))
        real(path)

    monkeypatch.setattr(persistence, "fsync_dir", fsync_dir)
    above = _parents_from_the_mount_point(tmp_path)
    assert persistence.durable_mkdir(tmp_path / "a") is True
    assert synced == [p for p in above if p != str(tmp_path.parent)] + [str(tmp_path)]
    refuse[0] = DurabilityError("fsync of the parent failed")
    with pytest.raises(DurabilityError):
        persistence.durable_mkdir(tmp_path / "b")
    assert not (tmp_path / "b").exists(), "nothing is created below an entry not made durable"


def test_durable_unlink_and_rename(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    assert persistence.durable_unlink(tmp_path / "f") is True
    assert persistence.durable_unlink(tmp_path / "f") is False
    with pytest.raises(FileNotFoundError):
        persistence.durable_unlink(tmp_path / "f", missing_ok=False)
    (tmp_path / "g").write_bytes(b"y")
    (tmp_path / "d").mkdir()
    persistence.durable_rename(tmp_path / "g", tmp_path / "d" / "h")
    assert (tmp_path / "d" / "h").read_bytes() == b"y"


def test_atomic_write_reports_any_io_error_as_not_acknowledged(tmp_path: Path) -> None:
    missing_dir = tmp_path / "gone" / "rec.json"
    with pytest.raises(DurabilityError, match="not acknowledged"):
        persistence.atomic_write(missing_dir, b"x")
