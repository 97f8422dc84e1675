"""LazyFS's side of the driver: finding the binary, its configuration, its fault commands.

Pure functions and constants, kept apart from the process-driving code in
:mod:`faultfs.lazyfs`, which re-exports the public names.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Mapping

from faultfs.errors import FaultFSError

LAZYFS_BIN_ENV = "LAZYFS_BIN"
LAZYFS_PROGRAM = "lazyfs"
FUSE_DEVICE = "/dev/fuse"

HOW_TO_GET_LAZYFS = (
    "Build LazyFS from its source (github.com/dsrhaslab/lazyfs; it needs cmake, g++, "
    "libfuse3-dev and fuse3), then set LAZYFS_BIN to the built lazyfs binary or put it "
    "on PATH. docs/lazyfs.md has the steps."
)
HOW_TO_GET_FUSE = (
    "LazyFS is a FUSE file system: the machine needs the fuse kernel module and /dev/fuse "
    "(in a container: --device /dev/fuse --cap-add SYS_ADMIN), readable and writable by "
    "the user that runs LazyFS (root, or mode 0666 as Debian sets it, with fusermount3 "
    'from the fuse3 package). docs/lazyfs.md, "Getting LazyFS".'
)

DEFAULT_CACHE_SIZE_BYTES = 64 * 1024 * 1024
# LazyFS preallocates the whole cache and asserts it holds more than one page.
MIN_CACHE_SIZE_BYTES = 1024 * 1024
MAX_CACHE_SIZE_BYTES = 16 * 1024 * 1024 * 1024

# The fault worker reads into a buffer of this size and overwrites its last byte.
MAX_FIFO_COMMAND_BYTES = 100

DEFAULT_MOUNT_TIMEOUT_S = 15.0
DEFAULT_COMMAND_TIMEOUT_S = 15.0
DEFAULT_UNMOUNT_TIMEOUT_S = 15.0
_POLL_INTERVAL_S = 0.01
_LOG_TAIL_BYTES = 4000

CRASH_TIMINGS = frozenset({"before", "after"})
CRASH_OPS = frozenset(
    {
        "unlink",
        "truncate",
        "fsync",
        "write",
        "create",
        "access",
        "open",
        "read",
        "rename",
        "link",
        "symlink",
    }
)
MULTI_PATH_OPS = frozenset({"rename", "link", "symlink"})

_CONFIG_NAME = "lazyfs.toml"
_CLEAR_CACHE_CMD = "lazyfs::clear-cache"
_CHECKPOINT_CMD = "lazyfs::cache-checkpoint"
_CLEAR_DONE = b"finished::clear-cache\n"
_LOG_WORKER_READY = "waiting for fault commands"
_LOG_CHECKPOINT_DONE = "checkpoint is done"
_LOG_CRASH_ACCEPTED = "received: VALID crash fault"
_LOG_CRASH_REJECTED = "received: INVALID crash fault"
_LOG_COMMAND_UNKNOWN = "command unknown"
_LOG_CACHE_CLEARED = "cache is cleared"
TOO_OLD_FOR_CRASH_FAULTS = (
    "this LazyFS does not know crash faults ('command unknown' in its log): it is older "
    'than 0.3.0. Build LazyFS 0.3.0 or its main branch (docs/lazyfs.md, "Getting LazyFS")'
)
TOO_OLD_FOR_CLEAR_CACHE = (
    "this LazyFS cleared its cache but never confirmed it on the completion FIFO: it is "
    "older than 0.2.0. Build LazyFS 0.3.0 or its main branch (docs/lazyfs.md, "
    '"Getting LazyFS")'
)


class LazyFSError(FaultFSError):
    """LazyFS was found but did not do what was asked (mount, command, unmount)."""


class LazyFSUnavailable(LazyFSError):
    """LazyFS (or FUSE) is not available on this machine."""

    def __init__(self, reason: str, how: str = HOW_TO_GET_LAZYFS) -> None:
        super().__init__(f"LazyFS is not available: {reason}. {how}")
        self.reason = reason


def _is_executable_file(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _locate(environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The binary LazyFS would run from, or None with the reason it was not found."""
    explicit = environ.get(LAZYFS_BIN_ENV, "").strip()
    if explicit:
        if _is_executable_file(explicit):
            return os.path.abspath(explicit), ""
        return None, f"{LAZYFS_BIN_ENV}={explicit!r} is not an executable file"
    on_path = shutil.which(LAZYFS_PROGRAM, path=environ.get("PATH"))
    if on_path:
        return on_path, ""
    return None, f"{LAZYFS_BIN_ENV} is not set and no {LAZYFS_PROGRAM!r} is on PATH"


def find_lazyfs(environ: Mapping[str, str] | None = None) -> str | None:
    """Path of the LazyFS binary from ``LAZYFS_BIN`` or ``PATH``; None when absent."""
    found, _ = _locate(os.environ if environ is None else environ)
    return found


def require_lazyfs(environ: Mapping[str, str] | None = None) -> str:
    """Like :func:`find_lazyfs`, but raise :class:`LazyFSUnavailable` saying why and how."""
    found, reason = _locate(os.environ if environ is None else environ)
    if found is None:
        raise LazyFSUnavailable(reason)
    problem = fuse_device_problem()
    if problem is not None:
        raise LazyFSUnavailable(problem, HOW_TO_GET_FUSE)
    return found


def fuse_device_problem(device: str = FUSE_DEVICE) -> str | None:
    """Why LazyFS could not open the FUSE device, or None when it can.

    libfuse opens the device itself before it would ask fusermount3, so a
    device this user may not open fails every mount, root or not.
    """
    try:
        mode = os.stat(device).st_mode
    except FileNotFoundError:
        return f"{device} does not exist (FUSE is not usable here)"
    except OSError as exc:
        return f"{device} cannot be examined: {exc.strerror}"
    if not stat.S_ISCHR(mode):
        return f"{device} is not a character device (FUSE is not usable here)"
    if not os.access(device, os.R_OK | os.W_OK):
        return (
            f"{device} (mode {stat.S_IMODE(mode):04o}) is not readable and writable by "
            f"uid {os.geteuid()}, so LazyFS cannot mount"
        )
    return None


def _toml_string(value: str) -> str:
    # JSON's string escapes (\\, \", \n, \uXXXX) are all valid in TOML basic strings.
    return json.dumps(value, ensure_ascii=True)


def _cache_size_text(cache_size_bytes: int) -> str:
    if not MIN_CACHE_SIZE_BYTES <= cache_size_bytes <= MAX_CACHE_SIZE_BYTES:
        raise ValueError(
            f"cache_size_bytes={cache_size_bytes} is outside "
            f"[{MIN_CACHE_SIZE_BYTES}, {MAX_CACHE_SIZE_BYTES}]"
        )
    if cache_size_bytes % 1024:
        raise ValueError(f"cache_size_bytes={cache_size_bytes} must be a multiple of 1024")
    # LazyFS parses a number and a unit; KiB keeps every allowed size exact.
    return f"{cache_size_bytes // 1024}kb"


def render_config(
    *,
    fifo_path: str,
    completed_fifo_path: str,
    cache_size_bytes: int,
    log_file: str,
    log_all_operations: bool = False,
) -> str:
    """LazyFS's TOML configuration: fault FIFOs, a simple cache without eviction, a log."""
    return "\n".join(
        [
            "[faults]",
            f"fifo_path = {_toml_string(fifo_path)}",
            f"fifo_path_completed = {_toml_string(completed_fifo_path)}",
            "",
            "[cache]",
            # Eviction would write dirty pages back on its own and blur what power loss drops.
            "apply_eviction = false",
            "",
            "[cache.simple]",
            f"custom_size = {_toml_string(_cache_size_text(cache_size_bytes))}",
            "blocks_per_page = 1",
            "",
            "[filesystem]",
            f"log_all_operations = {'true' if log_all_operations else 'false'}",
            f"logfile = {_toml_string(log_file)}",
            "",
        ]
    )


def _check_regex_field(name: str, value: str) -> None:
    if not value:
        raise ValueError(f"{name} must not be empty (pass None to leave it out)")
    if "::" in value or "\n" in value or "=" in value:
        raise ValueError(f"{name}={value!r} may not contain '::', '=' or a newline")


def crash_command(
    *, op: str, timing: str = "before", from_regex: str | None = None, to_regex: str | None = None
) -> str:
    """The FIFO line that arms a crash fault (without the trailing newline).

    Regexes are searched (unanchored) in the path LazyFS sees, which is the
    absolute path inside the backing directory. For rename, link and symlink the
    LazyFS version this was written against skips the source check unless the
    source regex also matches the literal ``none``; the source pattern is
    wrapped so that it does, which keeps both filters working.
    """
    if op not in CRASH_OPS:
        raise ValueError(
            f"op={op!r} is not one LazyFS can crash on; use one of {sorted(CRASH_OPS)}"
        )
    if timing not in CRASH_TIMINGS:
        raise ValueError(f"timing={timing!r} must be 'before' or 'after'")
    for name, value in (("from_regex", from_regex), ("to_regex", to_regex)):
        if value is not None:
            _check_regex_field(name, value)
    parts = ["lazyfs", "crash", f"timing={timing}", f"op={op}"]
    if op in MULTI_PATH_OPS:
        if from_regex is None and to_regex is None:
            raise ValueError(f"op={op!r} needs from_regex, to_regex or both")
        parts.append("from_rgx=" + (".*" if from_regex is None else f"(?:{from_regex}|^none$)"))
        if to_regex is not None:
            parts.append(f"to_rgx={to_regex}")
    else:
        if from_regex is None:
            raise ValueError(f"op={op!r} needs from_regex")
        if to_regex is not None:
            raise ValueError(f"to_regex only applies to {sorted(MULTI_PATH_OPS)}, not {op!r}")
        parts.append(f"from_rgx={from_regex}")
    command = "::".join(parts)
    if len(command.encode()) + 1 > MAX_FIFO_COMMAND_BYTES:
        raise ValueError(
            f"crash command is {len(command.encode()) + 1} bytes; LazyFS reads at most "
            f"{MAX_FIFO_COMMAND_BYTES} per command, so shorten the regexes"
        )
    return command


def _decode_mountinfo_path(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def fuse_mounted_at(path: str) -> bool:
    """Whether a FUSE file system is mounted exactly at ``path`` (dead or alive)."""
    target = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except OSError:
        return os.path.ismount(target)
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        fstype = right.split(" ", 1)[0]
        at_target = len(fields) > 4 and _decode_mountinfo_path(fields[4]) == target
        if at_target and fstype.startswith("fuse"):
            return True
    return False


def _unmount_command(mount_dir: str, *, lazy: bool) -> list[str]:
    fusermount = shutil.which("fusermount3") or shutil.which("fusermount")
    if fusermount:
        return [fusermount, "-uz" if lazy else "-u", mount_dir]
    return ["umount", "-l", mount_dir] if lazy else ["umount", mount_dir]


def _emergency_cleanup(proc: subprocess.Popen[bytes], mount_dir: str) -> None:
    # Runs only if a LazyFS object is dropped while mounted: never leave a live FUSE
    # process behind the interpreter.
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    if fuse_mounted_at(mount_dir):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(_unmount_command(mount_dir, lazy=True), capture_output=True, timeout=5)
