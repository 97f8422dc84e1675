"""The power-loss campaign's disks: LazyFS or a plain directory, and the check of a cut.

A cut is only a power cut if it drops what was never fsynced. Each cycle
writes a canary, unsynced, on the mount just before its cut; the cut must
leave none of it (:func:`canary_survived`), or the run tested nothing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Protocol

CANARY_NAME = "powerloss-canary"
"""Written on the mount, never fsynced, just before each cut: the cut must drop it."""
CANARY_BYTES = 8192
LAZYFS_TIMEOUT_S = 15.0
HOW_TO_GET_LAZYFS_AGAIN = (
    'Is it LazyFS, built as docs/lazyfs.md says ("Getting LazyFS"), with its build '
    "tree still in place (the binary loads libpcache.so from there)?"
)


class Disk(Protocol):
    """What a cycle needs of the file system under the root (LazyFS, or a plain dir)."""

    mount_dir: str

    @property
    def crashed(self) -> bool: ...

    def clear_cache(self, timeout_s: float = ...) -> None: ...

    def remount(self, timeout_s: float = ...) -> None: ...


class PlainDisk:
    """A plain directory: no power loss, only SIGKILL (to test the campaign itself)."""

    crashed = False

    def __init__(self, path: Path) -> None:
        self.mount_dir = str(path)

    def clear_cache(self, timeout_s: float = 0.0) -> None:
        pass

    def remount(self, timeout_s: float = 0.0) -> None:
        pass


def write_canary(mount_dir: str, index: int) -> bytes:
    """Unsynced bytes on the mount: a power cut that keeps them tested nothing."""
    line = f"cycle {index + 1}: unsynced, a power cut must drop this\n".encode()
    data = (line * (CANARY_BYTES // len(line) + 1))[:CANARY_BYTES]
    with open(Path(mount_dir) / CANARY_NAME, "wb") as canary:
        canary.write(data)  # no fsync, on purpose
    return data


def canary_survived(mount_dir: str, data: bytes) -> bool:
    try:
        return (Path(mount_dir) / CANARY_NAME).read_bytes() == data
    except FileNotFoundError:
        return False


def tree_bytes(path: Path) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(directory, name)).st_size
    return total


def lazyfs_unavailable_reason(binary: str | None = None) -> str | None:
    """Why LazyFS cannot run here (with how to get it), or None when it can."""
    from faultfs.lazyfs import LAZYFS_BIN_ENV, LazyFSUnavailable, require_lazyfs

    environ = dict(os.environ)
    if binary is not None:
        environ[LAZYFS_BIN_ENV] = binary
    try:
        require_lazyfs(environ)
    except LazyFSUnavailable as exc:
        return str(exc)
    return None


def mount_first(disk: Any) -> None:
    """Mount LazyFS; one that cannot mount here is unavailable, said in one message."""
    from faultfs.lazyfs import HOW_TO_GET_FUSE, LazyFSError, LazyFSUnavailable

    try:
        disk.mount(LAZYFS_TIMEOUT_S)
    except LazyFSUnavailable:
        raise
    except LazyFSError as exc:
        output = str(exc).split("\n", 1)[-1].strip().splitlines()[-3:]
        said = " | ".join(line.strip() for line in output)
        fuse = "fuse:" in said or "/dev/fuse" in said
        raise LazyFSUnavailable(
            f"{disk.binary} did not mount a LazyFS file system (its last words: {said})",
            HOW_TO_GET_FUSE if fuse else HOW_TO_GET_LAZYFS_AGAIN,
        ) from exc


_CAMPAIGN_MOUNT = re.compile(r"/substrat-powerloss-[^/]+/mnt$")


def leftover_campaigns(mountinfo: str | None = None, proc: Path = Path("/proc")) -> list[str]:
    """LazyFS mounts of earlier campaigns still up, each with the pids of its processes.

    A campaign killed with SIGKILL cannot take its daemon, LazyFS and mount
    down. They do not stop the next run (it works in a new directory), but
    LazyFS keeps its whole cache allocated, so each is named with how to stop
    it. Nothing is stopped here: another campaign may be running.
    """
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text(errors="replace")
        except OSError:
            return []
    mounts = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) > 4 and right.startswith("fuse") and _CAMPAIGN_MOUNT.search(fields[4]):
            mounts.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    if not mounts:
        return []
    commands: dict[int, str] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            commands[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace")
    found = []
    for mount in sorted(mounts):
        work = mount[: -len("/mnt")]
        pids = sorted(pid for pid, command in commands.items() if f"{work}/" in command)
        kill = f"kill {' '.join(map(str, pids))}; " if pids else ""
        found.append(
            f"{mount} is still mounted (processes: {', '.join(map(str, pids)) or 'none'}); "
            f"if no campaign runs there any more: {kill}fusermount3 -u {mount}"
        )
    return found
