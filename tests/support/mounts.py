"""A small tmpfs of its own for a test: a disk to fill, or to remount read-only."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(mount_point: Path, size: str, why: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` at ``mount_point`` (made here); skip the test, saying
    ``why`` it needs one, where mounting is not allowed (it needs CAP_SYS_ADMIN)."""
    mount_point.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs {why} (needs CAP_SYS_ADMIN): {made.stderr}")
    try:
        yield mount_point
    finally:
        _unmount(mount_point)


def _unmount(mount_point: Path) -> None:
    """Unmount, retrying while a process that just exited still holds a file there."""
    for _ in range(50):
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode == 0:
            break
        time.sleep(0.1)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte; the file that holds it all."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as handle:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while handle.write(b"\0" * size):
                    pass
            except OSError:  # ENOSPC: on to smaller writes, for the last bytes
                pass
    return filler


@contextlib.contextmanager
def ext4_that_fails(mount_point: Path, image: Path, why: str) -> Iterator[Path]:
    """A small ext4 on a loop device at ``mount_point`` (made here), mounted with
    ``errors=remount-ro``: :func:`fail_ext4` makes it refuse every write from then on, as
    a disk error would, while the files stay open (a tmpfs cannot be remounted read-only
    under a process writing to it). Skips the test, saying ``why``, where it cannot."""
    mount_point.mkdir()
    with open(image, "wb") as handle:
        handle.truncate(16 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True)
    mounted = made.returncode == 0 and (
        subprocess.run(
            ["mount", "-o", "loop,errors=remount-ro", str(image), str(mount_point)],
            capture_output=True,
        ).returncode
        == 0
    )
    if not mounted:
        image.unlink(missing_ok=True)
        pytest.skip(f"cannot mount an ext4 image {why} (needs mkfs.ext4, loop devices, root)")
    try:
        yield mount_point
    finally:
        _unmount(mount_point)
        image.unlink(missing_ok=True)


def fail_ext4(mount_point: Path) -> None:
    """Make the ext4 at ``mount_point`` hit an error: it refuses writes from now on (EROFS)."""
    device = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE", str(mount_point)], capture_output=True, text=True
    ).stdout.strip()
    trigger = Path("/sys/fs/ext4") / Path(device).name / "trigger_fs_error"
    if not trigger.exists():
        pytest.skip(f"this kernel cannot make an ext4 fail on purpose (no {trigger})")
    trigger.write_text("1")
