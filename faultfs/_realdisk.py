"""The real directory under a FaultFS root: what reached it without passing through the model.

faultfs intercepts Python's os and io calls. Two ways of writing go around them
and land on the real disk under a root that exists there:

* C extensions (sqlite3, LMDB, HDF5, gdbm) and other processes call write(2)
  themselves. :func:`unchanged` compares the real tree under the root before
  and after a run; the pytest fixtures, explore and CrashStateMachine share it.
* A descriptor opened on a real file under the root before the FaultFS was
  activated (a ``logging.FileHandler`` set up at import) keeps writing the real
  file. :func:`note_preopened` finds such descriptors at a FaultFS's first
  activation (a scan of ``/proc/self/fd``, once per FaultFS: crash images and
  captured copies inherit the result, and explore scans once per profile) and
  :func:`check_preopened` names one that was written while active.

Both run at activation or at the end of a run, never per call.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from faultfs.errors import EscapeError

if TYPE_CHECKING:
    from faultfs._fs import FaultFS

# The real functions, bound before faultfs patches anything (this module is never rebound).
_stat = os.stat
_fstat = os.fstat
_lseek = os.lseek
_scandir = os.scandir
_listdir = os.listdir
_readlink = os.readlink
_fcntl = fcntl.fcntl

# relative path ("." for the root) -> (is a directory, size, mtime_ns, inode)
State = dict[str, tuple[bool, int, int, int]]

_LIMITS = (
    "docs/faultfs.md, 'Limits: what faultfs cannot see'. C extensions do their own I/O "
    "(sqlite3, LMDB, HDF5, RocksDB and LevelDB bindings, dbm.gnu; polars and pyarrow given a "
    "path: give them a file object from open()), and so do other processes and descriptors "
    "opened before the FaultFS was activated"
)


def state(root: str) -> State | None:
    """The real tree under ``root`` (None when it does not exist on the real disk)."""
    try:
        top = _stat(root)
    except OSError:
        return None
    found: State = {".": (True, 0, top.st_mtime_ns, top.st_ino)}
    pending = [(root, "")]
    while pending:
        path, prefix = pending.pop()
        try:
            entries = _scandir(path)
        except OSError:
            continue
        with entries:
            for entry in entries:
                name = prefix + entry.name
                try:
                    st = entry.stat(follow_symlinks=False)
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                found[name] = (is_dir, 0 if is_dir else st.st_size, st.st_mtime_ns, st.st_ino)
                if is_dir:
                    pending.append((entry.path, name + "/"))
    return found


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def changes(root: str, before: State | None) -> str | None:
    """What changed on the real disk under ``root`` since ``before``, as words; None if nothing."""
    after = state(root)
    if after == before:
        return None
    old = before or {}
    new = after or {}
    appeared = sorted(n for n in new if n not in old)
    removed = sorted(n for n in old if n not in new)
    changed = sorted(n for n in new if n in old and new[n] != old[n])
    if appeared or removed:  # a directory's time changed with its entries: named already
        changed = [n for n in changed if not new[n][0]]
    itself = "the root directory itself (an entry was created and removed, or renamed)"
    changed = [itself if n == "." else n for n in changed]
    parts = []
    if appeared:
        parts.append(f"{_shown(appeared)} appeared")
    if changed:
        parts.append(f"{_shown(changed)} changed")
    if removed:
        parts.append(f"{_shown(removed)} disappeared")
    return " and ".join(parts) if parts else None


def message(root: str, what: str) -> str:
    """Why a change under the root on the real disk makes the run's verdict worthless."""
    return (
        f"{what} on the real disk under the FaultFS root {root} while it was in use: something "
        "wrote there without going through Python's os and io, so faultfs neither saw nor "
        f"crashed it, and a passing run checked nothing of it ({_LIMITS}; faultfs cannot test "
        "that I/O). The files are still there: remove what the run left before running it again."
    )


def check(root: str, before: State | None) -> None:
    """Raise EscapeError if the real tree under ``root`` is no longer ``before``."""
    __tracebackhide__ = True
    what = changes(root, before)
    if what is not None:
        raise EscapeError(message(root, what))


@contextlib.contextmanager
def unchanged(root: str) -> Iterator[None]:
    """Fail the block with EscapeError if the real tree under ``root`` changed during it.

    Checked also when the block raises: what reached the real disk explains the
    block's own error (a store that cannot read its C extension's files) first.
    """
    before = state(root)
    try:
        yield
    except EscapeError:
        raise  # an escape named where it happened says more than what it left behind
    except BaseException as exc:
        what = changes(root, before)
        if what is not None:
            # The cause first: shown chained, the block's own error (no boundary passed,
            # a check that read nothing) came first and gave advice that does not apply.
            then = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise EscapeError(
                f"{message(root, what)} The run then failed because of it: {then}"
            ) from None
        raise
    check(root, before)


# -------------------------------------------------- descriptors opened before activation


def _writable_under(roots: tuple[str, ...]) -> dict[int, str]:
    """Descriptors of this process open for writing on a real file under one of ``roots``."""
    found: dict[int, str] = {}
    try:
        names = _listdir("/proc/self/fd")
    except OSError:  # no procfs: nothing to find
        return found
    for name in names:
        fd = int(name)
        try:  # the flags first: a read-only descriptor needs no readlink
            if _fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
                continue
            target = _readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if any(target.startswith(root + "/") for root in roots):
            found[fd] = target
    return found


def _mark(fd: int) -> tuple[int, int, int, int] | None:
    """(inode, size, mtime_ns, offset) of a real descriptor; None once it is closed."""
    try:
        st = _fstat(fd)
        offset = _lseek(fd, 0, os.SEEK_CUR)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, offset


def preopened(root: str) -> dict[int, str]:
    """This process's descriptors open for writing on a real file under ``root`` (a scan of
    /proc/self/fd; about 10 us per descriptor on the development machine)."""
    if not _stat_ok(root):
        return {}
    # realpath through the model when another FaultFS is active is still right: the model's
    # root is a directory, and the parents above it are read from the real disk.
    return _writable_under((root, os.path.realpath(root)))


def note_preopened(fs: FaultFS) -> None:
    """Before ``fs`` is activated: find (the first time) and mark the descriptors under its root."""
    if fs._preopened is None:
        fs._preopened = preopened(fs.root)
    if fs._preopened:
        fs._preopened_marks = {fd: _mark(fd) for fd in fs._preopened}


def _stat_ok(path: str) -> bool:
    try:
        _stat(path)
    except OSError:
        return False
    return True


def check_preopened(fs: FaultFS) -> None:
    """After ``fs`` was deactivated: an EscapeError naming a pre-opened descriptor it wrote."""
    if not fs._preopened:
        return
    for fd, path in fs._preopened.items():
        before = fs._preopened_marks.get(fd)
        after = _mark(fd)
        if before is None or after is None or before[0] != after[0] or before == after:
            continue  # closed, reused for another file, or untouched
        text = (
            f"{path} (descriptor {fd}) was opened for writing before the FaultFS at "
            f"{fs.root!r} was first activated, and was written while it was active: those "
            "writes went to the real file, never counted, crashed or checked (a logging "
            "handler or a file opened at import time, say). Open it inside the workload "
            "(create the handler or file there, under fs.root), or close it and reopen it "
            "after activating the FaultFS."
        )
        fs.escapes.append(text)
        raise EscapeError(text)


# ------------------------------------------------- a plain FaultFS's own real-tree check


def note_tree(fs: FaultFS) -> None:
    """Before a plain ``fs`` is activated: the real tree under its root (None if it is not
    on the real disk). explore, the fixtures and CrashStateMachine (``watch_outside``) keep
    their own comparison around the whole run instead of one per activation."""
    fs._real_tree = None if fs.watch_outside else state(fs.root)


def check_tree(fs: FaultFS) -> None:
    """After a plain ``fs`` was deactivated: EscapeError if its root's real tree changed
    (C code or another process wrote there around Python's os and io)."""
    before, fs._real_tree = fs._real_tree, None
    if before is None:
        return
    what = changes(fs.root, before)
    if what is not None:
        text = message(fs.root, what)
        fs.escapes.append(text)
        raise EscapeError(text)
