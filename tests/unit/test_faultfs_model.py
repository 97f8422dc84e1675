"""The visible semantics of the model: flags, offsets, inode identity, errors."""

from __future__ import annotations

import errno
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faultfs import FaultFS

ROOT = "/faultfs-model"


@pytest.fixture
def fs() -> FaultFS:
    with FaultFS(ROOT) as fs:
        yield fs


def test_append_writes_at_the_end_whatever_the_offset(fs: FaultFS) -> None:
    path = fs.path("log")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    os.write(fd, b"ab")
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, b"cd")
    os.pwrite(fd, b"ef", 0)  # Linux appends on O_APPEND even for pwrite
    os.lseek(fd, 0, os.SEEK_SET)
    assert os.read(fd, 100) == b"abcdef"
    os.close(fd)


def test_trunc_excl_pwrite_ftruncate_and_holes(fs: FaultFS) -> None:
    path = fs.path("f")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.write(fd, b"hello world")
    with pytest.raises(FileExistsError):
        os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.pwrite(fd, b"J", 6)
    assert os.lseek(fd, 0, os.SEEK_CUR) == 11  # pwrite leaves the offset alone
    os.ftruncate(fd, 5)
    os.lseek(fd, 8, os.SEEK_SET)
    os.write(fd, b"!")
    os.close(fd)
    assert fs.read_file("f") == b"hello\0\0\0!"
    fd = os.open(path, os.O_RDWR | os.O_TRUNC)
    assert os.fstat(fd).st_size == 0
    os.close(fd)
    os.truncate(path, 3)
    assert fs.read_file("f") == b"\0\0\0"


def test_inode_identity_survives_rename_and_link(fs: FaultFS) -> None:
    a, b, c = fs.path("a"), fs.path("b"), fs.path("c")
    with open(a, "wb") as handle:
        handle.write(b"1")
    ino = os.stat(a).st_ino
    os.link(a, b)
    assert os.stat(b).st_ino == ino and os.stat(a).st_nlink == 2
    os.rename(a, c)
    assert os.stat(c).st_ino == ino
    with open(b, "ab") as handle:
        handle.write(b"2")
    assert fs.read_file("c") == b"12"
    os.unlink(b)
    assert os.stat(c).st_nlink == 1


def test_open_descriptor_outlives_unlink_and_rename_over(fs: FaultFS) -> None:
    path = fs.path("x")
    with open(path, "wb") as handle:
        handle.write(b"old")
    fd = os.open(path, os.O_RDONLY)
    with open(fs.path("y"), "wb") as handle:
        handle.write(b"new")
    os.replace(fs.path("y"), path)
    assert os.read(fd, 10) == b"old"
    os.close(fd)
    assert fs.read_file("x") == b"new"


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda p: os.stat(p("missing")), errno.ENOENT),
        (lambda p: os.open(p("missing", "x"), os.O_RDONLY | os.O_CREAT), errno.ENOENT),
        (lambda p: os.mkdir(p("dir")), errno.EEXIST),
        (lambda p: os.rmdir(p("dir")), errno.ENOTEMPTY),
        (lambda p: os.unlink(p("dir")), errno.EISDIR),
        (lambda p: os.rmdir(p("dir", "f")), errno.ENOTDIR),
        (lambda p: os.stat(p("dir", "f", "g")), errno.ENOTDIR),
        (lambda p: os.rename(p("dir", "f"), p("dir")), errno.EISDIR),
        (lambda p: os.rename(p("dir"), p("dir", "f")), errno.EINVAL),
        (lambda p: os.link(p("dir"), p("l")), errno.EPERM),
        (lambda p: os.link(p("dir", "f"), p("dir", "f")), errno.EEXIST),
        (lambda p: os.rmdir(p()), errno.EBUSY),
        (lambda p: os.read(os.open(p("dir", "f"), os.O_WRONLY), 1), errno.EBADF),
        (lambda p: os.write(os.open(p("dir", "f"), os.O_RDONLY), b"x"), errno.EBADF),
    ],
)
def test_errors_match_posix(fs: FaultFS, call: object, code: int) -> None:
    os.mkdir(fs.path("dir"))
    open(fs.path("dir", "f"), "w").close()
    with pytest.raises(OSError) as info:
        call(fs.path)  # type: ignore[operator]
    assert info.value.errno == code


def test_rename_onto_itself_via_hard_link_is_a_no_op(fs: FaultFS) -> None:
    open(fs.path("a"), "w").close()
    os.link(fs.path("a"), fs.path("b"))
    before = fs.boundaries
    os.rename(fs.path("a"), fs.path("b"))
    assert sorted(os.listdir(fs.root)) == ["a", "b"]
    assert fs.boundaries == before


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 2), st.binary(max_size=20)),
        st.tuples(st.just("pwrite"), st.integers(0, 2), st.binary(max_size=20), st.integers(0, 30)),
        st.tuples(st.just("truncate"), st.integers(0, 2), st.integers(0, 30)),
        st.tuples(st.just("fsync"), st.integers(0, 2)),
        st.tuples(st.just("fsync_root")),
        st.tuples(st.just("rename"), st.integers(0, 2), st.integers(0, 2)),
        st.tuples(st.just("eio"), st.integers(0, 2)),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_replaying_pending_onto_durable_gives_the_visible_bytes(ops: list[tuple]) -> None:
    """The model's core invariant, after any sequence (EIO marks a file diverged)."""
    with FaultFS("/faultfs-invariant") as fs:
        names = [fs.path(f"f{i}") for i in range(3)]
        for name in names:
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY))
        for op in ops:
            path = names[op[1]] if len(op) > 1 else fs.root
            if op[0] in ("write", "pwrite", "truncate", "fsync", "eio") and not os.path.exists(
                path
            ):
                continue
            if op[0] == "write":
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
                os.write(fd, op[2])
                os.close(fd)
            elif op[0] == "pwrite":
                fd = os.open(path, os.O_WRONLY)
                os.pwrite(fd, op[2], op[3])
                os.close(fd)
            elif op[0] == "truncate":
                os.truncate(path, op[2])
            elif op[0] in ("fsync", "fsync_root", "eio"):
                if op[0] == "eio":
                    fs.fail_next_fsync(path)
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                except OSError:
                    pass
                os.close(fd)
            elif op[0] == "rename" and os.path.exists(path):
                os.replace(path, names[op[2]])
            fs.model.check_invariants()
