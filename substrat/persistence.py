"""Durable file operations: the only module in substrat that makes data durable.

Everything that must survive a power loss goes through here, so the rules live
in one place:

* a write is a loop: ``os.write`` may write less than it was given;
* data is durable only after ``fsync`` of the file;
* a new, renamed or removed directory entry is durable only after ``fsync`` of
  the directory that holds it;
* a visible directory is not thereby durable (a call that failed or was killed
  before that fsync leaves it in the page cache only), so callers pass every
  directory they create files in through :func:`durable_mkdir`, which makes the
  entries of the levels it finds visible durable too;
* after a failed ``fsync`` nothing is acknowledged and the fsync is not retried
  as if the data were safe (Linux may already have dropped the dirty pages and
  marked them clean), so :class:`~substrat.errors.DurabilityError` is raised and
  the caller must treat the write as lost.

All calls go through the ``os`` module attributes at call time, so a crash
simulator that patches ``os`` (faultfs) sees every boundary.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from substrat import paths
from substrat.errors import DurabilityError

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_READ_CHUNK_BYTES = 1 << 16
_FILE_MODE = 0o600
_DIR_MODE = 0o700
TMP_SUFFIX = ".tmp"


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``, looping over short writes."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise DurabilityError(f"write returned {written}; the device accepted no bytes")
        view = view[written:]


def fsync_fd(fd: int, what: str | os.PathLike[str]) -> None:
    """fsync ``fd``; on failure raise DurabilityError and never retry."""
    try:
        os.fsync(fd)
    except OSError as exc:
        raise DurabilityError(
            f"fsync of {what} failed ({exc.strerror}); the unsynced data must be "
            "treated as lost and was not acknowledged"
        ) from exc


def durable_contents(path: str | os.PathLike[str]) -> None:
    """Make the file at ``path`` durably hold what it shows now (its bytes and size).

    For a file about to be renamed into a name nothing repairs: changes made
    through descriptors since closed (a truncate at open, say) are made durable.
    It is truncated to its own size first: a failed fsync drops a truncate's
    dirty state with the pages, and a later fsync with nothing dirty would not
    bring it back. Bytes it shows that were never fsynced must not be relied on
    (see the module docstring); the callers' were, up to the size they check.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, os.fstat(fd).st_size)
        fsync_fd(fd, path)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of directory ``path`` durable."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        fsync_fd(fd, path)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old or the new bytes.

    Temp file in the same directory, full write, fsync, ``os.replace``, fsync of
    the directory. A crash leaves at most a stale ``<name>.tmp`` next to the
    target, which readers ignore and the next write replaces. Any I/O error is
    raised as :class:`DurabilityError`: the new bytes were not acknowledged (the
    old or the new ones may be there after a crash).
    """
    try:
        _atomic_write(path, data)
    except DurabilityError:
        raise
    except OSError as exc:
        raise DurabilityError(
            f"atomic write of {os.fspath(path)} failed ({exc}); it was not acknowledged"
        ) from exc


def _atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    # strings, not Paths: every record and checkpoint write comes through here
    target = _file_text(path)
    tmp = target + TMP_SUFFIX
    try:
        _write_temp(tmp, data)
    except OSError:
        # Refused (a full disk): the temp file was never acknowledged and nothing names
        # it, so it goes, rather than stay for fsck to report (a crash may still leave it).
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.replace(tmp, target)
    fsync_dir(_parent(target))


def _write_temp(tmp: str, data: bytes) -> None:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, _FILE_MODE)
    try:
        write_all(fd, data)
        fsync_fd(fd, tmp)
    finally:
        os.close(fd)


def _file_text(path: str | os.PathLike[str]) -> str:
    """``path`` as text, with the trailing separators a Path would drop."""
    text = paths.text(path)
    stripped = text.rstrip(os.sep)
    return stripped if stripped else text[:1]


def _parent(path: str | os.PathLike[str]) -> str:
    """``Path(path).parent`` as text, built without a Path (see :func:`_file_text`)."""
    return _dirname(_file_text(path)) or "."


def _dirname(text: str) -> str:
    """``os.path.dirname(text)`` of a string, without its look-ups (every durable step
    asks it of its directory)."""
    head = text[: text.rfind(os.sep) + 1]
    stripped = head.rstrip(os.sep)
    return stripped if stripped else head  # "" or the root's separators, kept


def _absolute(text: str) -> str:
    """``os.path.abspath(text)``: a text that is one already (normalised, absolute: what
    the store's paths are) is returned as it is, without normpath's split and join."""
    if text[:1] == os.sep and "//" not in text and "/." not in text and text[-1:] != os.sep:
        return text
    return os.path.abspath(text)


def _within(path: str, base: str) -> bool:
    """Whether normalised absolute ``path`` is ``base`` or below it (``is_relative_to``)."""
    return path == base or path.startswith(base if base.endswith(os.sep) else base + os.sep)


def durable_mkdir(
    path: str | os.PathLike[str], *, durable_base: str | os.PathLike[str] | None = None
) -> bool:
    """Create directory ``path`` (and missing parents) durably.

    Returns True when something was created. On return ``path`` and every
    ancestor entry it relies on are durable: each created level by an fsync of
    its parent, from the top down, so a crash never leaves a durable child under
    a parent entry that was lost. A level that is already visible may have been
    left by an earlier call that failed, or was killed, before its parent's fsync
    (visible in the page cache, not on disk), and nothing on disk tells it apart
    from an old one; so its entry and those above it are fsynced too, up to the
    file system's root (see :func:`_make_ancestors_durable`).

    ``durable_base`` cuts that walk short: an ancestor of ``path`` (or ``path``
    itself) whose own entry, and every one above it, the caller has already made
    durable with an earlier ``durable_mkdir`` of it. Nothing at or above it is
    fsynced again, or looked up (it is a directory), so a store that made its root
    durable once pays one fsync per level below the root.
    """
    # normalised absolute text (what Path(os.path.abspath(...)) holds), no Paths built:
    # every new session directory comes through here
    target = _absolute(paths.text(path))
    base = None if durable_base is None else _absolute(paths.text(durable_base))
    assert base is None or _within(target, base), f"{base} is not above {target}"
    missing: list[str] = []
    probe = target
    found: os.stat_result | None = None  # the probe's, when it is a directory
    # the base is a directory (see above): the walk stops there without a stat
    while probe != base:
        found = _directory_stat(probe)
        if found is not None:
            break
        missing.append(probe)
        parent = _dirname(probe)
        if parent == probe:
            break
        probe = parent
    assert base is None or _within(probe, base), f"durable_base {base} does not exist"
    _make_ancestors_durable(probe, base, found)
    for level in reversed(missing):
        try:
            os.mkdir(level, _DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(level):
                raise
        fsync_dir(_dirname(level))
    return bool(missing)


def _make_ancestors_durable(
    existing: str, base: str | None, existing_stat: os.stat_result | None = None
) -> None:
    """Make the entry of the visible directory ``existing`` and of each ancestor durable.

    fsyncs each parent from the file system's root (or from ``base``) down to
    ``existing``'s parent: top down, for the reason given in
    :func:`durable_mkdir`. Each fsync is needed under POSIX rules, because any of
    these levels may be one an interrupted call left visible but not durable;
    none is repeated by the creation loop, which fsyncs ``existing`` and the
    levels below it. A directory this process may not open (``/home`` at mode
    0711, say) is skipped: we cannot fsync it, and it holds no entry a call of
    ours made, since creating one there fails at that very fsync.

    The walk ends at the file system's root: ``/``, a mount point (its parent is on
    another device), or a level whose parent cannot be looked up (then nothing above
    it is visible to us: a file system simulator mounted there, or a search
    permission we lack). Each level is looked up once (``existing_stat``: the
    caller's look-up of ``existing``, if it made one).
    """
    chain: list[str] = []
    level = existing
    device = None if existing_stat is None else existing_stat.st_dev
    while level != base:
        parent = _dirname(level)
        if parent == level:
            break
        try:
            parent_device = os.stat(parent).st_dev
            if device is None:
                device = os.stat(level).st_dev
        except OSError:
            break
        if parent_device != device:
            break
        level, device = parent, parent_device
        chain.append(level)
    for parent in reversed(chain):
        try:
            fsync_dir(parent)
        except PermissionError:  # from opening it; a failed fsync is a DurabilityError
            continue


def _directory_stat(path: str) -> os.stat_result | None:
    """``os.stat(path)`` if ``path`` is a directory, else None (``os.path.isdir``)."""
    try:
        found = os.stat(path)
    except (OSError, ValueError):
        return None
    return found if stat.S_ISDIR(found.st_mode) else None


def durable_create(path: str | os.PathLike[str]) -> None:
    """Create an empty file at ``path`` (if absent) and make its entry durable.

    Only the directory is fsynced: the new file has no data to make durable, and
    its entry (with the inode it names) is what the directory fsync commits.
    """
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE))
    fsync_dir(_parent(path))


def durable_unlink(path: str | os.PathLike[str], *, missing_ok: bool = True) -> bool:
    """Remove ``path`` and make the removal durable. Returns True if it existed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise
        # Gone already, maybe by an earlier attempt whose fsync failed: make the
        # removal durable before saying so.
        if os.path.isdir(_parent(path)):
            fsync_dir(_parent(path))
        return False
    fsync_dir(_parent(path))
    return True


def durable_rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Rename ``src`` to ``dst`` and make both directories' entries durable."""
    os.replace(src, dst)
    fsync_dir(_parent(dst))
    if Path(_parent(src)) != Path(_parent(dst)):  # the same directory however spelt
        fsync_dir(_parent(src))


def on_read_only_fs(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is on a file system mounted read-only (nothing can be written,
    whatever the modes say)."""
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def read_bytes(path: str | os.PathLike[str], chunk_bytes: int = _READ_CHUNK_BYTES) -> bytes:
    """Read a whole file (through ``os.open`` and ``os.read``, so simulators see the read).

    Raises what ``open(path, "rb").read()`` would (FileNotFoundError,
    IsADirectoryError, ...), without its buffered file object. ``chunk_bytes``: what
    one ``os.read`` asks for; a file read whole in one is not copied again (a few
    megabytes read in small pieces touch twice their size: the pieces, then the join).
    """
    fd = os.open(path, _READ_FLAGS)
    try:
        chunks: list[bytes] = []
        while chunk := os.read(fd, chunk_bytes):
            chunks.append(chunk)
    except OSError as exc:  # os.read names no file (a directory opens, then EISDIR)
        if exc.filename is not None:
            raise
        raise type(exc)(exc.errno, exc.strerror, os.fspath(path)) from None
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
