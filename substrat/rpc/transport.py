"""The Unix socket under the root: its path, binding it privately, peer credentials.

A Unix socket address holds at most 107 bytes of path. A root deep in a
temporary directory can exceed that, so a long path is reached through
``/proc/self/fd/<dirfd>/daemon.sock`` (a short alias of the root directory held
open for the call). Where ``/proc`` is missing the caller gets
:class:`~substrat.errors.SocketPathTooLongError` with what to do.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

from substrat.errors import SocketPathTooLongError

SOCKET_NAME = "daemon.sock"
MAX_SUN_PATH_BYTES = 107
SOCKET_MODE = 0o600
_PROC_FD = Path("/proc/self/fd")


def socket_path(root: str | os.PathLike[str]) -> Path:
    return Path(root) / SOCKET_NAME


@contextlib.contextmanager
def short_address(path: Path) -> Iterator[str]:
    """A string that fits ``sun_path`` and names ``path``, valid inside the block."""
    if len(os.fsencode(path)) <= MAX_SUN_PATH_BYTES:
        yield str(path)
        return
    if not _PROC_FD.is_dir():
        raise SocketPathTooLongError(
            f"socket path {path} is {len(os.fsencode(path))} bytes, over the "
            f"{MAX_SUN_PATH_BYTES}-byte limit of a Unix socket address; use a shorter --root"
        )
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        alias = f"{_PROC_FD}/{dir_fd}/{path.name}"
        assert len(alias) <= MAX_SUN_PATH_BYTES
        yield alias
    finally:
        os.close(dir_fd)


def bind_private(path: Path) -> socket.socket:
    """Bind a listening socket at ``path`` with mode 0600 from the first instant.

    A stale socket file (left by a killed daemon) is removed first; the caller
    holds the root's lock, so no live daemon can own it.
    """
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # The umask makes bind() create the file 0600, so there is no window
        # in which another user could connect before the chmod.
        old_umask = os.umask(0o177)
        try:
            with short_address(path) as address:
                sock.bind(address)
        finally:
            os.umask(old_umask)
        os.chmod(path, SOCKET_MODE)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def connect(path: Path, timeout_s: float) -> socket.socket:
    """Connect to the daemon's socket (raises OSError when nobody listens)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        with short_address(path) as address:
            sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid
