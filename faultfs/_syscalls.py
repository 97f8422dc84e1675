"""The POSIX call surface over the model, with the crash counter at every boundary.

Paths given to these methods are absolute, normalised and under the root (the
interceptor guarantees it). Each mutating call passes two boundaries, one
before it takes effect and one after; an armed counter raises SimulatedCrash
at its boundary and freezes the file system.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import zlib
from typing import Any

from faultfs._fdtable import (
    ACCMODE,
    FD_OWNERS,
    FaultDirEntry,
    Handle,
    ScandirIterator,
    fd_numbers,
    oserror,
    owner_ref,
    stat_result,
)
from faultfs._model import ROOT_INO, Inode, Model
from faultfs._trace import Op, call_stack
from faultfs.errors import IOAfterCrash, SimulatedCrash

# A fixed umask of 022: reading the real one means changing it, which races.
_CREATE_MODE_MASK = 0o7777 & ~0o022
EPOCH_NS = 1_767_225_600_000_000_000
"""File times start here (2026-01-01 UTC) and move on by ``TICK_NS`` with each operation of
the model's clock: the same operations give the same times, so a disk image whose files hold
their own or other files' times (substrat's start summary holds fingerprints) is the same
byte for byte however and whenever it was reached. Wall-clock time would make every run's
image differ."""
TICK_NS = 1_000
_PARTS_KEPT = 4096
"""Paths whose split :meth:`Syscalls._parts` keeps per root (then it starts over)."""
_new_op = tuple.__new__
_ROOTS_KEPT = 64
_parts_by_root: dict[str, dict[str, tuple[str, ...]]] = {}
"""Root -> path -> its names below the root, shared by every file system on that root:
a crash image is a new file system on its parent's root, and a fuzzer recovers
thousands of them, each walking the same few paths."""


def _parts_cache(root: str) -> dict[str, tuple[str, ...]]:
    cache = _parts_by_root.get(root)
    if cache is None:
        if len(_parts_by_root) >= _ROOTS_KEPT:
            _parts_by_root.clear()
        cache = _parts_by_root[root] = {}
    return cache


class Syscalls:
    """Simulated system calls; FaultFS adds the user-facing API on top."""

    root: str

    def __init__(self, root: str, model: Model, record_trace: bool) -> None:
        self.root = root
        self._root_slash = root + "/"
        # path -> its names below the root: the same few paths are walked again and again
        self._parts_of = _parts_cache(root)
        self.model = model
        self._fds: dict[int, Handle] = {}
        self._owner_ref = owner_ref(self, self._fds)
        self._lock = threading.RLock()
        self._dev = zlib.crc32(root.encode())  # the same in every process, unlike hash()
        self._record_trace = record_trace
        self.trace: list[Op] = []
        # seq of a recorded rename or link -> the inode it gave a new name
        # (cause analysis asks which rename made a file visible).
        self.op_inodes: dict[int, int] = {}
        self.boundaries = 0
        self.crashed = False
        self.crash_point: tuple[int, str, Op] | None = None
        self.io_after_crash = 0
        # Where the dead process first did I/O (file:line), and why a run must stop (see
        # faultfs._swallowed): code that swallowed SimulatedCrash went on and acknowledged.
        self.first_io_after_crash: tuple[str, str] | None = None
        self.crash_swallowed: str | None = None
        self._crash_at: int | None = None
        # Boundaries still to capture (absolute, descending; see FaultFS.capture_at), and
        # the next boundary where the counter stops at all: a capture or the armed crash.
        self._capture_plan: list[int] = []
        self._stop_at: int | None = None
        # Injected faults (configured through FaultFS's public methods).
        self._fsync_faults: list[tuple[int | None, int]] = []
        self._write_errno: int | None = None
        self._write_budget = 0
        self._write_fault_ino: int | None = None
        self._short_write_max: int | None = None

    # --------------------------------------------------------------- boundaries

    def _alive(self, what: str, path: str | None = None) -> None:
        """Refuse I/O from a crashed process (it is dead; its cleanup must not run).

        The call is named ``what(path)``, formatted only then: this runs on every call.
        """
        if self.crashed:
            self.io_after_crash += 1
            call = what if path is None else f"{what}({path!r})"
            if self.first_io_after_crash is None:
                self.first_io_after_crash = (call, call_stack(2)[1])
            raise IOAfterCrash(call)

    def _before(self, kind: str, path: str, args: tuple[object, ...]) -> Op:
        """(Writes and fsyncs only count a boundary inline when nothing is traced or stops.)"""
        if self._record_trace:
            stack, site = call_stack(3)
            op = Op(kind, path, args, site, stack)
        else:  # Op(kind, path, args, ""), without its Python-level __new__ (every boundary)
            op = _new_op(Op, (kind, path, args, "", (), 0))
        self.boundaries += 1
        if self.boundaries == self._stop_at:
            self._stop("before", op)
        return op

    def _after(self, op: Op) -> None:
        if self._record_trace:
            self.trace.append(Op(op.kind, op.path, op.args, op.site, op.stack, self.model.clock))
        self.boundaries += 1
        if self.boundaries == self._stop_at:
            self._stop("after", op)

    def _stop(self, phase: str, op: Op) -> None:
        """At a planned boundary: capture what a crash here would leave, then crash if armed."""
        if not op.site:
            stack, site = call_stack(3)
            op = op._replace(site=site, stack=stack)
        plan = self._capture_plan
        if plan and plan[-1] == self.boundaries:
            plan.pop()
            self._capture(phase, op)
        self._plan_stops()
        if self.boundaries == self._crash_at:
            self._crash(phase, op)

    def _plan_stops(self) -> None:
        stops = [b for b in (self._crash_at, *self._capture_plan[-1:]) if b is not None]
        self._stop_at = min(stops) if stops else None

    def _capture(self, phase: str, op: Op) -> None:
        raise NotImplementedError  # FaultFS keeps the crash state (see FaultFS.capture_at)

    def _crash(self, phase: str, op: Op) -> None:
        self.crashed = True
        self._crash_at = self._stop_at = None
        self.crash_point = (self.boundaries, phase, op)
        raise SimulatedCrash(self.boundaries, phase, op)

    # ------------------------------------------------------------------- paths

    def _parts(self, path: str) -> tuple[str, ...]:
        parts = self._parts_of.get(path)
        if parts is None:
            assert path == self.root or path.startswith(self._root_slash), path
            parts = tuple(p for p in path[len(self.root) + 1 :].split("/") if p)
            if len(self._parts_of) >= _PARTS_KEPT:
                self._parts_of.clear()
            self._parts_of[path] = parts
        return parts

    def _walk(self, path: str) -> tuple[Inode | None, str, Inode | None]:
        """(parent directory, last name, inode or None) for ``path``."""
        inodes = self.model.inodes
        cur = inodes[ROOT_INO]
        parts = self._parts_of.get(path)  # _parts, its kept answer inlined: every call walks
        if parts is None:
            parts = self._parts(path)
        if not parts:
            return None, "", cur
        for name in parts[:-1]:
            ino = cur.entries.get(name)
            if ino is None:
                raise oserror(errno.ENOENT, path)
            cur = inodes[ino]
            if not cur.is_dir:
                raise oserror(errno.ENOTDIR, path)
        ino = cur.entries.get(parts[-1])
        return cur, parts[-1], (None if ino is None else inodes[ino])

    def _existing(self, path: str) -> Inode:
        node = self._walk(path)[2]
        if node is None:
            raise oserror(errno.ENOENT, path)
        return node

    def _handle(self, fd: int) -> Handle:
        handle = self._fds.get(fd)
        if handle is None:
            raise oserror(errno.EBADF)
        return handle

    def _now_ns(self) -> int:
        """A file time for the operation about to run (see ``EPOCH_NS``)."""
        return EPOCH_NS + (self.model.clock + 1) * TICK_NS

    # ------------------------------------------------------------ descriptors

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:
        with self._lock:
            if self.crashed:  # _alive, inlined in the hottest calls
                self._alive("open", path)
            parent, name, node = self._walk(path)
            if node is None:
                if not flags & os.O_CREAT:
                    raise oserror(errno.ENOENT, path)
                assert parent is not None
                op = self._before("create", path, ())
                node = self.model.new_inode(False, mode & _CREATE_MODE_MASK, self._now_ns())
                self.model.change_namespace("create", ((parent.ino, name, node.ino),))
                self._after(op)
            elif flags & os.O_CREAT and flags & os.O_EXCL:
                raise oserror(errno.EEXIST, path)
            elif node.is_dir:
                if flags & ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
                    raise oserror(errno.EISDIR, path)
            elif flags & getattr(os, "O_DIRECTORY", 0):
                raise oserror(errno.ENOTDIR, path)
            elif flags & os.O_TRUNC:
                op = self._before("truncate", path, (0,))
                self.model.truncate(node, 0, self._now_ns())
                self._after(op)
            fd = next(fd_numbers)  # next_fd, inlined: every open
            self._fds[fd] = Handle(fd, node, path, flags)
            FD_OWNERS[fd] = self._owner_ref
            return fd

    def close(self, fd: int) -> None:
        with self._lock:
            handle = self._fds.pop(fd, None)
            if handle is None:
                raise oserror(errno.EBADF)
            FD_OWNERS.pop(fd, None)
            # Closing is allowed after a crash: the kernel closes a dead
            # process's descriptors, and nothing reaches the disk by it.

    def read(self, fd: int, n: int) -> bytes:
        with self._lock:
            handle = self._fds.get(fd)
            if handle is None or self.crashed or handle.is_dir or not handle.readable:
                handle = self._usable(fd, "read", False)  # raises what it should
            data = self.model.inodes[handle.ino].data
            pos = handle.pos
            end = pos + n if n >= 0 else len(data)
            # One copy: slicing a bytearray copies, and bytes() of that would again.
            chunk = data[pos:end] if type(data) is bytes else bytes(memoryview(data)[pos:end])
            handle.pos = pos + len(chunk)
            return chunk

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        with self._lock:
            handle = self._usable(fd, "read", False)
            if offset < 0:
                raise oserror(errno.EINVAL)
            return bytes(self.model.inodes[handle.ino].data[offset : offset + n])

    def _usable(self, fd: int, what: str, write: bool) -> Handle:
        """The handle of ``fd`` if ``what`` may use it, else the error it would get."""
        if self.crashed:
            self._alive(what)
        handle = self._fds.get(fd)  # _handle, inlined
        if handle is None:
            raise oserror(errno.EBADF)
        if handle.is_dir:
            raise oserror(errno.EISDIR)
        if not (handle.writable if write else handle.readable):
            raise oserror(errno.EBADF)
        return handle

    def _admit_write(self, ino: int, n: int) -> int:
        """How many of ``n`` bytes the injected faults let through (may raise)."""
        if self._short_write_max is not None and n > self._short_write_max:
            n = self._short_write_max
        code = self._write_errno
        if code is not None and self._write_fault_ino in (None, ino):
            if self._write_budget <= 0 and n > 0:
                raise oserror(code)
            n = min(n, self._write_budget)
            self._write_budget -= n
        return n

    def write(self, fd: int, data: Any) -> int:
        with self._lock:
            handle = self._fds.get(fd)
            if handle is None or self.crashed or handle.is_dir or not handle.writable:
                handle = self._usable(fd, "write", True)  # raises what it should
            n = self._write_at(handle, data, None)
            if handle.sync:  # O_SYNC / O_DSYNC: durable before the write returns
                self.fsync(fd, handle.sync)
            return n

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        with self._lock:
            handle = self._fds.get(fd)
            if handle is None or self.crashed or handle.is_dir or not handle.writable:
                handle = self._usable(fd, "pwrite", True)  # raises what it should
            if offset < 0:
                raise oserror(errno.EINVAL)
            n = self._write_at(handle, data, offset)
            if handle.sync:
                self.fsync(fd, handle.sync)
            return n

    def _write_at(self, handle: Handle, data: Any, offset: int | None) -> int:
        """write (``offset`` None: at the descriptor's position, which moves) or pwrite."""
        model = self.model
        node = model.inodes[handle.ino]
        view = memoryview(data).cast("B")
        n = len(view)
        if self._write_errno is not None or self._short_write_max is not None:
            n = self._admit_write(node.ino, n)
        moves = offset is None
        if handle.append:  # Linux ignores the offset of pwrite on an O_APPEND descriptor
            offset = len(node.data)
        elif offset is None:
            offset = handle.pos
        args = (f"off={offset}", f"len={n}")
        if self._record_trace or self.boundaries + 1 == self._stop_at:
            op = self._before("write", handle.path, args)
        else:
            op = _new_op(Op, ("write", handle.path, args, "", (), 0))
            self.boundaries += 1
        model.write(node, offset, bytes(view[:n]), EPOCH_NS + (model.clock + 1) * TICK_NS)
        if moves:
            handle.pos = offset + n
        if self._record_trace or self.boundaries + 1 == self._stop_at:
            self._after(op)
        else:
            self.boundaries += 1
        return n

    def lseek(self, fd: int, pos: int, how: int) -> int:
        with self._lock:
            if self.crashed:
                self._alive("lseek")
            handle = self._fds.get(fd)  # _handle, inlined: every buffered open tells
            if handle is None:
                raise oserror(errno.EBADF)
            if how == os.SEEK_SET:
                new = pos
            elif how == os.SEEK_CUR:
                new = handle.pos + pos
            elif how == os.SEEK_END:
                new = (0 if handle.is_dir else len(self.model.inodes[handle.ino].data)) + pos
            else:
                raise oserror(errno.EINVAL)
            if new < 0:
                raise oserror(errno.EINVAL)
            handle.pos = new
            return new

    def ftruncate(self, fd: int, size: int) -> None:
        with self._lock:
            self._alive("ftruncate")
            handle = self._handle(fd)
            if handle.is_dir or not handle.writable or size < 0:
                raise oserror(errno.EINVAL)
            op = self._before("truncate", handle.path, (size,))
            self.model.truncate(self.model.inodes[handle.ino], size, self._now_ns())
            self._after(op)

    def truncate(self, path: str, size: int) -> None:
        with self._lock:
            self._alive("truncate")
            node = self._existing(path)
            if node.is_dir:
                raise oserror(errno.EISDIR, path)
            if size < 0:
                raise oserror(errno.EINVAL, path)
            op = self._before("truncate", path, (size,))
            self.model.truncate(node, size, self._now_ns())
            self._after(op)

    def fsync(self, fd: int, kind: str = "fsync") -> None:
        with self._lock:
            if self.crashed:
                self._alive(kind)
            handle = self._fds.get(fd)  # _handle, inlined
            if handle is None:
                raise oserror(errno.EBADF)
            node = self.model.inodes[handle.ino]
            if self._record_trace or self.boundaries + 1 == self._stop_at:
                op = self._before(kind, handle.path, ())
            else:
                op = _new_op(Op, (kind, handle.path, (), "", (), 0))
                self.boundaries += 1
            code = self._take_fsync_fault(node.ino) if self._fsync_faults else None
            if code is not None:
                if not node.is_dir:
                    self.model.fail_fsync(node)
                if self._record_trace:
                    failed = (f"failed: {errno.errorcode.get(code, code)}",)
                    self.trace.append(op._replace(args=failed, seq=self.model.clock))
                raise oserror(code, handle.path)
            if node.is_dir:
                self.model.fsync_dir(node)
            else:
                self.model.fsync_file(node)
            if self._record_trace or self.boundaries + 1 == self._stop_at:
                self._after(op)
            else:
                self.boundaries += 1

    def _take_fsync_fault(self, ino: int) -> int | None:
        for i, (target, code) in enumerate(self._fsync_faults):
            if target is None or target == ino:
                del self._fsync_faults[i]
                return code
        return None

    def fstat(self, fd: int) -> os.stat_result:
        with self._lock:
            if self.crashed:
                self._alive("fstat")
            return stat_result(self.model.inodes[self._handle(fd).ino], self._dev)

    def flock(self, fd: int, operation: int) -> None:
        """Advisory whole-file locks between open descriptions of this process."""
        with self._lock:
            self._alive("flock")
            handle = self._handle(fd)
            want = operation & (fcntl.LOCK_SH | fcntl.LOCK_EX | fcntl.LOCK_UN)
            if want == fcntl.LOCK_UN:
                handle.lock = 0
                return
            for other in self._fds.values():
                if other is handle or other.ino != handle.ino or not other.lock:
                    continue
                if want == fcntl.LOCK_EX or other.lock == fcntl.LOCK_EX:
                    if operation & fcntl.LOCK_NB:
                        raise oserror(errno.EWOULDBLOCK)
                    raise oserror(errno.EDEADLK)
            handle.lock = want

    def fd_path(self, fd: int) -> str:
        return self._handle(fd).path

    # -------------------------------------------------------------- namespace

    def stat(self, path: str) -> os.stat_result:
        with self._lock:
            if self.crashed:
                self._alive("stat", path)
            node = self._walk(path)[2]  # _existing, inlined: a start stats many paths
            if node is None:
                raise oserror(errno.ENOENT, path)
            return stat_result(node, self._dev)

    def listdir(self, path: str) -> list[str]:
        with self._lock:
            if self.crashed:
                self._alive("listdir", path)
            node = self._walk(path)[2]  # _existing, inlined
            if node is None:
                raise oserror(errno.ENOENT, path)
            if not node.is_dir:
                raise oserror(errno.ENOTDIR, path)
            return list(node.entries)

    def scandir(self, path: str, prefix: str) -> ScandirIterator:
        with self._lock:
            self._alive("scandir", path)
            node = self._existing(path)
            if not node.is_dir:
                raise oserror(errno.ENOTDIR, path)
            inodes = self.model.inodes
            sep = "" if not prefix or prefix.endswith("/") else "/"
            return ScandirIterator(
                [
                    FaultDirEntry(self, name, prefix + sep + name, ino, inodes[ino].is_dir)
                    for name, ino in node.entries.items()
                ]
            )

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        with self._lock:
            if self.crashed:
                self._alive("mkdir", path)
            parent, name, node = self._walk(path)
            if node is not None:
                raise oserror(errno.EEXIST, path)
            assert parent is not None
            op = self._before("mkdir", path, ())
            child = self.model.new_inode(True, mode & _CREATE_MODE_MASK, self._now_ns())
            child.nlink = 1  # "." (the parent's entry adds the second link)
            self.model.change_namespace("mkdir", ((parent.ino, name, child.ino),))
            self._after(op)

    def rmdir(self, path: str) -> None:
        with self._lock:
            self._alive("rmdir", path)
            parent, name, node = self._walk(path)
            if node is None:
                raise oserror(errno.ENOENT, path)
            if parent is None:
                raise oserror(errno.EBUSY, path)
            if not node.is_dir:
                raise oserror(errno.ENOTDIR, path)
            if node.entries:
                raise oserror(errno.ENOTEMPTY, path)
            op = self._before("rmdir", path, ())
            self.model.change_namespace("rmdir", ((parent.ino, name, None),))
            self._after(op)

    def unlink(self, path: str) -> None:
        with self._lock:
            if self.crashed:
                self._alive("unlink", path)
            parent, name, node = self._walk(path)
            if node is None:
                raise oserror(errno.ENOENT, path)
            if node.is_dir:
                raise oserror(errno.EISDIR, path)
            assert parent is not None
            op = self._before("unlink", path, ())
            self.model.change_namespace("unlink", ((parent.ino, name, None),))
            self._after(op)

    def link(self, src: str, dst: str) -> None:
        with self._lock:
            self._alive("link", src)
            node = self._existing(src)
            if node.is_dir:
                raise oserror(errno.EPERM, src, dst)
            parent, name, existing = self._walk(dst)
            if existing is not None:
                raise oserror(errno.EEXIST, src, dst)
            assert parent is not None
            op = self._before("link", dst, (src,))
            self.model.change_namespace("link", ((parent.ino, name, node.ino),))
            if self._record_trace:
                self.op_inodes[self.model.clock] = node.ino
            self._after(op)

    def rename(self, src: str, dst: str) -> None:
        with self._lock:
            if self.crashed:
                self._alive("rename", src)
            sparent, sname, node = self._walk(src)
            if node is None:
                raise oserror(errno.ENOENT, src, dst)
            dparent, dname, target = self._walk(dst)
            if sparent is None or dparent is None:
                raise oserror(errno.EBUSY, src, dst)
            if target is node:
                return  # both names already refer to the same inode: POSIX does nothing
            if node.is_dir and (dst + "/").startswith(src + "/"):
                raise oserror(errno.EINVAL, src, dst)
            if target is not None:
                if target.is_dir and not node.is_dir:
                    raise oserror(errno.EISDIR, src, dst)
                if node.is_dir and not target.is_dir:
                    raise oserror(errno.ENOTDIR, src, dst)
                if target.is_dir and target.entries:
                    raise oserror(errno.ENOTEMPTY, src, dst)
            op = self._before("rename", src, (f"-> {dst}",))
            model = self.model
            flush = None
            if target is not None and not node.is_dir:
                flush = (node.ino, model.clock)
            model.change_namespace(
                "rename", ((dparent.ino, dname, node.ino), (sparent.ino, sname, None)), flush
            )
            if self._record_trace:
                self.op_inodes[model.clock] = node.ino
            self._after(op)

    def chmod(self, path: str, mode: int) -> None:
        with self._lock:
            self._alive("chmod", path)
            self._existing(path).mode = mode & 0o7777

    def fchmod(self, fd: int, mode: int) -> None:
        with self._lock:
            self._alive("fchmod")
            self.model.inodes[self._handle(fd).ino].mode = mode & 0o7777

    def utime(self, path: str, mtime_ns: int | None) -> None:
        with self._lock:
            self._alive("utime", path)
            node = self._existing(path)
            node.mtime_ns = self._now_ns() if mtime_ns is None else mtime_ns

    def exists(self, path: str) -> bool:
        with self._lock:
            self._alive("access", path)
            try:
                return self._walk(path)[2] is not None
            except OSError:
                return False
