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
