"""Driver for LazyFS, a FUSE file system that keeps unsynced data in its own cache.

LazyFS sits over a backing directory and holds every write in a private page
cache until the program fsyncs it (or a checkpoint flushes it). Clearing that
cache through its fault FIFO therefore leaves exactly what a power cut would
leave of file *data*. This module starts LazyFS as a child process, talks to it
through its FIFOs, and knows how to bring a crashed mount back.

It is an optional integration: nothing else in faultfs imports it, and it
needs the ``lazyfs`` binary (``LAZYFS_BIN`` or ``PATH``) plus ``/dev/fuse``.
See docs/lazyfs.md for how to build LazyFS and for its blind spot (it applies
creates, renames and unlinks to the backing directory at once).

Facts about LazyFS this driver relies on (checked against its source):

* the fault worker reads at most ``MAX_FIFO_COMMAND_BYTES`` per ``read`` and
  treats the last byte as the line end, so each command is one short line and
  the driver never sends a second command before the first is acknowledged;
* only ``lazyfs::clear-cache`` is acknowledged on the completion FIFO
  (``finished::clear-cache``); checkpoints and crash faults are acknowledged
  only in LazyFS's log, so the driver waits on log lines for those;
* the worker opens the completion FIFO for writing with a blocking ``open``,
  so the driver holds the read end open before LazyFS starts;
* a crash fault makes LazyFS ``SIGKILL`` itself, which leaves a dead mount
  ("Transport endpoint is not connected") that needs a lazy unmount.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType

from faultfs._arguments import checked
from faultfs._lazyfs_protocol import (
    _CHECKPOINT_CMD,
    _CLEAR_CACHE_CMD,
    _CLEAR_DONE,
    _CONFIG_NAME,
    _LOG_CACHE_CLEARED,
    _LOG_CHECKPOINT_DONE,
    _LOG_COMMAND_UNKNOWN,
    _LOG_CRASH_ACCEPTED,
    _LOG_CRASH_REJECTED,
    _LOG_TAIL_BYTES,
    _LOG_WORKER_READY,
    _POLL_INTERVAL_S,
    CRASH_OPS,
    CRASH_TIMINGS,
    DEFAULT_CACHE_SIZE_BYTES,
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_MOUNT_TIMEOUT_S,
    DEFAULT_UNMOUNT_TIMEOUT_S,
    FUSE_DEVICE,
    HOW_TO_GET_FUSE,
    HOW_TO_GET_LAZYFS,
    LAZYFS_BIN_ENV,
    LAZYFS_PROGRAM,
    MAX_CACHE_SIZE_BYTES,
    MAX_FIFO_COMMAND_BYTES,
    MIN_CACHE_SIZE_BYTES,
    MULTI_PATH_OPS,
    TOO_OLD_FOR_CLEAR_CACHE,
    TOO_OLD_FOR_CRASH_FAULTS,
    LazyFSError,
    LazyFSUnavailable,
    _cache_size_text,
    _emergency_cleanup,
    _is_executable_file,
    _unmount_command,
    crash_command,
    find_lazyfs,
    fuse_device_problem,
    fuse_mounted_at,
    render_config,
    require_lazyfs,
)

__all__ = [
    "CRASH_OPS",
    "CRASH_TIMINGS",
    "DEFAULT_CACHE_SIZE_BYTES",
    "DEFAULT_COMMAND_TIMEOUT_S",
    "DEFAULT_MOUNT_TIMEOUT_S",
    "DEFAULT_UNMOUNT_TIMEOUT_S",
    "FUSE_DEVICE",
    "HOW_TO_GET_FUSE",
    "HOW_TO_GET_LAZYFS",
    "LAZYFS_BIN_ENV",
    "LAZYFS_PROGRAM",
    "MAX_CACHE_SIZE_BYTES",
    "MAX_FIFO_COMMAND_BYTES",
    "MIN_CACHE_SIZE_BYTES",
    "MULTI_PATH_OPS",
    "LazyFS",
    "LazyFSError",
    "LazyFSUnavailable",
    "crash_command",
    "find_lazyfs",
    "fuse_device_problem",
    "fuse_mounted_at",
    "render_config",
    "require_lazyfs",
]


class LazyFS:
    """One LazyFS mount of ``backing_dir`` at ``mount_dir``, driven from Python.

    Use as a context manager (mounts on enter, tears down on exit) or call
    :meth:`mount` and :meth:`unmount`. All waits take ``timeout_s`` in seconds.
    """

    @checked
    def __init__(
        self,
        mount_dir: str | os.PathLike[str],
        backing_dir: str | os.PathLike[str],
        *,
        binary: str | None = None,
        cache_size_bytes: int = DEFAULT_CACHE_SIZE_BYTES,
        fifo_dir: str | os.PathLike[str] | None = None,
        log_file: str | os.PathLike[str] | None = None,
        log_all_operations: bool = False,
        allow_other: bool = False,
    ) -> None:
        self.mount_dir = os.path.realpath(mount_dir)
        self.backing_dir = os.path.realpath(backing_dir)
        for name, path in (("mount_dir", self.mount_dir), ("backing_dir", self.backing_dir)):
            if not os.path.isdir(path):
                if fuse_mounted_at(path):  # stat fails with ENOTCONN on a dead FUSE mount
                    raise LazyFSError(
                        f"{name}={path!r} is a dead FUSE mount (its file system process is "
                        f"gone, e.g. a LazyFS that was killed); detach it first: "
                        f"fusermount3 -uz {path}"
                    )
                raise ValueError(f"{name}={path!r} is not an existing directory")
        if self.mount_dir == self.backing_dir:
            raise ValueError("mount_dir and backing_dir must be different directories")
        if "," in self.backing_dir:
            # FUSE splits -o options on commas, so such a path cannot be passed as subdir.
            raise ValueError(f"backing_dir={self.backing_dir!r} may not contain a comma")
        if binary is None:
            self.binary = require_lazyfs()
        elif _is_executable_file(binary):
            self.binary = os.path.abspath(binary)
        else:
            raise LazyFSUnavailable(f"binary={binary!r} is not an executable file")
        self.cache_size_bytes = cache_size_bytes
        _cache_size_text(cache_size_bytes)  # validate now, not at mount time
        self._own_fifo_dir = fifo_dir is None
        self.fifo_dir = (
            tempfile.mkdtemp(prefix="lazyfs-ctl-") if fifo_dir is None else os.fspath(fifo_dir)
        )
        os.makedirs(self.fifo_dir, exist_ok=True)
        self.fifo_path = os.path.join(self.fifo_dir, "faults.fifo")
        self.completed_fifo_path = os.path.join(self.fifo_dir, "completed.fifo")
        self.config_path = os.path.join(self.fifo_dir, _CONFIG_NAME)
        self.output_path = os.path.join(self.fifo_dir, "lazyfs.out")
        self.log_file = (
            os.path.join(self.fifo_dir, "lazyfs.log") if log_file is None else os.fspath(log_file)
        )
        self.log_all_operations = log_all_operations
        self.allow_other = allow_other
        self._proc: subprocess.Popen[bytes] | None = None
        self._done_fd: int | None = None
        self._finalizer: weakref.finalize[..., LazyFS] | None = None
        self._command_lock = threading.Lock()

    # -- state -------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        """The LazyFS process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def crashed(self) -> bool:
        """LazyFS was mounted by this object and its process has died since."""
        return self._proc is not None and self._proc.poll() is not None

    def log_text(self) -> str:
        """LazyFS's log of the current (or last) mount, for diagnostics."""
        try:
            return Path(self.log_file).read_text(errors="replace")
        except OSError:
            return ""

    def _diagnostics(self) -> str:
        tail = self.log_text()[-_LOG_TAIL_BYTES:]
        with contextlib.suppress(OSError):
            tail += Path(self.output_path).read_text(errors="replace")[-_LOG_TAIL_BYTES:]
        return tail.strip() or "(LazyFS wrote no log)"

    # -- mounting ----------------------------------------------------------

    @checked
    def mount(self, timeout_s: float = DEFAULT_MOUNT_TIMEOUT_S) -> None:
        """Start LazyFS and return once the mount answers and its fault worker listens."""
        if self._proc is not None:
            raise LazyFSError(f"{self.mount_dir} is already mounted by this object")
        if fuse_mounted_at(self.mount_dir) or os.path.ismount(self.mount_dir):
            raise LazyFSError(
                f"{self.mount_dir} is already a mount point; unmount it first "
                f"(fusermount3 -uz {self.mount_dir})"
            )
        self._prepare_control_files()
        args = [
            self.binary,
            self.mount_dir,
            "--config-path",
            # LazyFS ignores a config path containing "-o" (any case), which temp dirs
            # like pytest-of-root do; a bare name resolved against cwd avoids that.
            _CONFIG_NAME,
            "-o",
            "modules=subdir",
            "-o",
            f"subdir={self.backing_dir}",
            "-f",
        ]
        if self.allow_other:
            args += ["-o", "allow_other"]
        with open(self.output_path, "wb") as out:
            # Own session: a Ctrl-C aimed at the test run must not kill LazyFS mid-teardown.
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.fifo_dir,
                start_new_session=True,
            )
        self._finalizer = weakref.finalize(self, _emergency_cleanup, self._proc, self.mount_dir)
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc.poll() is not None:
                diagnostics = self._diagnostics()
                self._reap_dead_mount(timeout_s=max(1.0, deadline - time.monotonic()))
                raise LazyFSError(f"LazyFS exited while mounting {self.mount_dir}:\n{diagnostics}")
            if fuse_mounted_at(self.mount_dir) and _LOG_WORKER_READY in self.log_text():
                return
            if time.monotonic() > deadline:
                diagnostics = self._diagnostics()
                self._kill_and_reap(timeout_s=5.0)
                raise LazyFSError(
                    f"LazyFS did not come up at {self.mount_dir} within {timeout_s} s:\n"
                    f"{diagnostics}"
                )
            time.sleep(_POLL_INTERVAL_S)

    def _prepare_control_files(self) -> None:
        os.makedirs(self.fifo_dir, exist_ok=True)
        for path in (self.fifo_path, self.completed_fifo_path, self.log_file):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        os.mkfifo(self.fifo_path, 0o600)
        os.mkfifo(self.completed_fifo_path, 0o600)
        Path(self.config_path).write_text(
            render_config(
                fifo_path=self.fifo_path,
                completed_fifo_path=self.completed_fifo_path,
                cache_size_bytes=self.cache_size_bytes,
                log_file=self.log_file,
                log_all_operations=self.log_all_operations,
            )
        )
        self._close_done_fd()
        # Held before LazyFS starts: its worker blocks opening the write end until a reader exists.
        self._done_fd = os.open(self.completed_fifo_path, os.O_RDONLY | os.O_NONBLOCK)

    def _close_done_fd(self) -> None:
        if self._done_fd is not None:
            os.close(self._done_fd)
            self._done_fd = None

    # -- fault commands ----------------------------------------------------

    def _send(self, command: str) -> None:
        line = (command + "\n").encode()
        assert "\n" not in command and len(line) <= MAX_FIFO_COMMAND_BYTES, command
        if not self.running:
            raise LazyFSError(
                f"LazyFS at {self.mount_dir} is not running (crashed or never mounted); "
                "call remount() or mount() first"
            )
        try:
            fd = os.open(self.fifo_path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                raise LazyFSError(f"LazyFS is not reading its fault FIFO {self.fifo_path}") from exc
            raise
        try:
            written = os.write(fd, line)
        finally:
            os.close(fd)
        # Lines shorter than PIPE_BUF are written whole or not at all.
        assert written == len(line), (written, len(line))

    def _wait_for_log(
        self, *, start: int, accept: str, reject: str | None, timeout_s: float, what: str
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.log_text()[start:]
            if reject is not None and reject in text:
                time.sleep(0.05)  # the reasons are logged right after the verdict
                reasons = [
                    line.split("crash fault error:", 1)[1].strip()
                    for line in self.log_text()[start:].splitlines()
                    if "crash fault error:" in line
                ]
                raise LazyFSError(f"LazyFS rejected {what}: {'; '.join(reasons) or text.strip()}")
            if accept in text:
                return
            if _LOG_COMMAND_UNKNOWN in text:
                raise LazyFSError(f"LazyFS refused {what}: {TOO_OLD_FOR_CRASH_FAULTS}")
            if not self.running:
                raise LazyFSError(f"LazyFS died before finishing {what}:\n{self._diagnostics()}")
            if time.monotonic() > deadline:
                raise LazyFSError(f"LazyFS did not finish {what} within {timeout_s} s")
            time.sleep(_POLL_INTERVAL_S)

    @checked
    def clear_cache(self, timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S) -> None:
        """Drop every unsynced page (power loss) and wait for LazyFS to confirm."""
        with self._command_lock:
            assert self._done_fd is not None
            start = len(self.log_text())
            self._send(_CLEAR_CACHE_CMD)
            received = b""
            deadline = time.monotonic() + timeout_s
            while not received.endswith(_CLEAR_DONE):
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    if _LOG_CACHE_CLEARED in self.log_text()[start:]:
                        raise LazyFSError(
                            f"LazyFS did not confirm clear-cache: {TOO_OLD_FOR_CLEAR_CACHE}"
                        )
                    raise LazyFSError(f"LazyFS did not confirm clear-cache within {timeout_s} s")
                ready, _, _ = select.select([self._done_fd], [], [], min(remaining_s, 0.5))
                if not ready:
                    if not self.running:
                        raise LazyFSError("LazyFS died while clearing its cache")
                    continue
                chunk = os.read(self._done_fd, 4096)
                if not chunk:
                    raise LazyFSError("LazyFS closed its completion FIFO while clearing its cache")
                received += chunk
            # One command, one confirmation: anything else on the FIFO is a protocol break.
            assert received == _CLEAR_DONE, received

    @checked
    def checkpoint(self, timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S) -> None:
        """Write all cached data to the backing files (without fsync) and wait for it."""
        with self._command_lock:
            start = len(self.log_text())
            self._send(_CHECKPOINT_CMD)
            self._wait_for_log(
                start=start,
                accept=_LOG_CHECKPOINT_DONE,
                reject=None,
                timeout_s=timeout_s,
                what="the cache checkpoint",
            )

    @checked
    def crash(
        self,
        *,
        op: str,
        timing: str = "before",
        from_regex: str | None = None,
        to_regex: str | None = None,
        timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
    ) -> None:
        """Arm a crash: LazyFS kills itself at the next matching operation.

        Returns once LazyFS has accepted the fault. Unsynced data is lost with
        the process, so the crash is a power loss for the mount; call
        :meth:`wait_crashed` and then :meth:`remount`.
        """
        command = crash_command(op=op, timing=timing, from_regex=from_regex, to_regex=to_regex)
        with self._command_lock:
            start = len(self.log_text())
            self._send(command)
            self._wait_for_log(
                start=start,
                accept=_LOG_CRASH_ACCEPTED,
                reject=_LOG_CRASH_REJECTED,
                timeout_s=timeout_s,
                what=f"crash fault {command!r}",
            )

    @checked
    def wait_crashed(self, timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S) -> None:
        """Wait until the LazyFS process has died (after an armed crash fired)."""
        if self._proc is None:
            raise LazyFSError("LazyFS was never mounted by this object")
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise LazyFSError(f"LazyFS at {self.mount_dir} still runs after {timeout_s} s") from exc

    # -- recovery and teardown ---------------------------------------------

    @checked
    def remount(self, timeout_s: float = DEFAULT_MOUNT_TIMEOUT_S) -> None:
        """Bring the mount back: unmount (lazily, if LazyFS died), then mount again.

        A live mount is unmounted with its cache cleared first, so a remount
        never makes unsynced data durable: it behaves like a reboot.
        """
        self._stop(timeout_s=timeout_s, clear_cache=True)
        self.mount(timeout_s=timeout_s)

    @checked
    def unmount(
        self, timeout_s: float = DEFAULT_UNMOUNT_TIMEOUT_S, *, clear_cache: bool = True
    ) -> None:
        """Tear the mount down, stop LazyFS and remove the FIFOs.

        With ``clear_cache`` (the default) unsynced data is dropped first:
        some LazyFS versions flush the cache when unmounted, which would turn
        a test's unsynced writes into durable ones.
        """
        try:
            self._stop(timeout_s=timeout_s, clear_cache=clear_cache)
        finally:
            if self._proc is None:
                self._cleanup_control_dir()

    def _stop(self, *, timeout_s: float, clear_cache: bool) -> None:
        if self._proc is None:
            return
        if not self.running:
            self._reap_dead_mount(timeout_s=timeout_s)
            return
        if clear_cache:
            try:
                self.clear_cache(timeout_s=timeout_s)
            except LazyFSError:
                # Killing LazyFS drops its cache too; never fall back to an unmount that may flush.
                self._kill_and_reap(timeout_s=timeout_s)
                raise
        result = subprocess.run(
            _unmount_command(self.mount_dir, lazy=False), capture_output=True, timeout=timeout_s
        )
        if result.returncode != 0:
            # Busy (a process still has files open): detach now, LazyFS exits when they close.
            subprocess.run(
                _unmount_command(self.mount_dir, lazy=True), capture_output=True, timeout=timeout_s
            )
        assert self._proc is not None
        try:
            # LazyFS may abort while exiting (a worker thread is left joinable); that is fine.
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_and_reap(timeout_s=timeout_s)
        self._reap_dead_mount(timeout_s=timeout_s)

    def _kill_and_reap(self, *, timeout_s: float) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=timeout_s)
        self._reap_dead_mount(timeout_s=timeout_s)

    def _reap_dead_mount(self, *, timeout_s: float) -> None:
        """Detach a dead FUSE mount and forget the process."""
        if self._proc is not None and self._proc.poll() is None:
            raise LazyFSError("refusing to detach a mount whose LazyFS process is alive")
        deadline = time.monotonic() + timeout_s
        while fuse_mounted_at(self.mount_dir):
            result = subprocess.run(
                _unmount_command(self.mount_dir, lazy=True), capture_output=True, timeout=timeout_s
            )
            if time.monotonic() > deadline:
                raise LazyFSError(
                    f"could not detach the dead mount at {self.mount_dir}: "
                    f"{result.stderr.decode(errors='replace').strip()}"
                )
            time.sleep(_POLL_INTERVAL_S)
        self._forget_process()

    def _forget_process(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._proc = None
        self._close_done_fd()

    def _cleanup_control_dir(self) -> None:
        for path in (self.fifo_path, self.completed_fifo_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if self._own_fifo_dir:
            shutil.rmtree(self.fifo_dir, ignore_errors=True)

    def __enter__(self) -> LazyFS:
        self.mount()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.unmount()
