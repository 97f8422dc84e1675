"""Which Python file objects still hold written data in their buffers (asked at each ack).

The commonest kill -9 bug is acknowledging a record the program handed to a
Python file object that never wrote it to the OS (no ``flush`` before the
acknowledgement): the process dies and its buffer with it. faultfs opens
those objects itself (:mod:`faultfs._fileobj`), so at an acknowledgement it
can look at each one still open for writing, without flushing it:

* a ``BufferedWriter``/``BufferedRandom`` holds data when its position is past
  its raw file's (``tell`` reads both and flushes nothing);
* a ``TextIOWrapper`` holds text in its own pending list before it hands it to
  its buffer. Python offers no way to read that list without flushing it, but
  the object reports it to the garbage collector (``gc.get_referents``). That
  is CPython's internals, so a self-test at import checks that it works here;
  where it does not, text pending at that level is not claimed.

Cause analysis (:mod:`faultfs._causes`) then says "acknowledged while still in
the process's buffer" instead of blaming the state the OS had.
"""

from __future__ import annotations

import gc
import io
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faultfs._syscalls import Syscalls

_NEWLINES = frozenset(("", "\n", "\r", "\r\n"))  # a text object's newline setting, not data
_PRUNE_AT = 64  # tracked objects before the dead and closed ones are first dropped


def track(fs: Syscalls, obj: Any) -> None:
    """Remember ``obj`` (a buffered object open for writing on ``fs``) while it lives."""
    refs = fs.__dict__.get("_buffered_objs")
    if refs is None:
        refs = fs.__dict__["_buffered_objs"] = []
    count = len(refs)
    if count >= _PRUNE_AT and not count & (count - 1):  # at 64, 128, ...: amortised
        refs[:] = [r for r in refs if (o := r()) is not None and not o.closed]
    refs.append(weakref.ref(obj))


def _text_pending(text: Any) -> bool:
    refs = gc.get_referents(text)
    strs = []
    for ref in refs:
        kind = type(ref)
        if kind is list or kind is bytes:
            return True
        if kind is str and ref not in _NEWLINES:
            strs.append(ref)
    if len(strs) < 2:  # the encoding and the errors setting are always there
        return False
    encoding, errors = text.encoding, text.errors
    return any(ref is not encoding and ref is not errors for ref in strs)


def _buffer_pending(buffer: Any) -> bool:
    raw = getattr(buffer, "raw", None)
    if raw is None or raw.closed:
        return False
    fs = getattr(raw, "_fs", None)
    if fs is None:  # not faultfs's raw file
        return bool(buffer.tell() > raw.tell())
    handle = fs._fds.get(raw._fd)  # the raw file's offset, without another lseek
    return handle is not None and bool(buffer.tell() > handle.pos)


def _self_test() -> bool:
    text = io.TextIOWrapper(io.BufferedWriter(io.BytesIO()), "utf-8")
    text.write("record")
    held = _text_pending(text)
    text.flush()
    return held and not _text_pending(text)


_TEXT_PROBE = _self_test()


def holds_data(obj: Any) -> bool:
    """Whether ``obj`` (open, writable) holds bytes or text it has not written to the OS."""
    if obj.closed:
        return False
    if isinstance(obj, io.TextIOWrapper):
        if _TEXT_PROBE and _text_pending(obj):
            return True
        return _buffer_pending(obj.buffer)
    return _buffer_pending(obj)


def unflushed(fs: Syscalls) -> tuple[str, ...]:
    """The paths of ``fs``'s open file objects that hold unwritten data, in name order."""
    refs = fs.__dict__.get("_buffered_objs")
    if not refs:
        return ()
    paths: set[str] = set()
    for ref in refs:
        obj = ref()
        if obj is None:
            continue
        try:
            if holds_data(obj):
                raw = obj.buffer.raw if isinstance(obj, io.TextIOWrapper) else obj.raw
                paths.add(fs.fd_path(raw.fileno()))
        except (OSError, ValueError):
            continue  # closed or detached meanwhile: nothing of it to claim
    return tuple(sorted(paths))
