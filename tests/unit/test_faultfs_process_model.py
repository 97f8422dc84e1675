"""``FaultFS(durable_state=False)``: what the process sees is the same; images need the default."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faultfs import FaultFS
from faultfs._process_model import ProcessModel
from faultfs.errors import ConfigError

ROOT = "/faultfs-process-model"
NAMES = ("a", "b", "d/c")

# One program step: (kind, name, other name, bytes, offset).
Step = tuple[str, str, str, bytes, int]
STEP = st.tuples(
    st.sampled_from(("write", "pwrite", "append", "truncate", "fsync", "rename", "unlink", "link")),
    st.sampled_from(NAMES),
    st.sampled_from(NAMES),
    st.binary(max_size=9),
    st.integers(0, 12),
)


def _run(fs: FaultFS, steps: list[Step]) -> list[object]:
    """Run ``steps`` under ``fs``; what the program saw (results, errors, stats)."""
    seen: list[object] = []
    with fs:
        os.mkdir(fs.path("d"))
        for kind, name, other, data, offset in steps:
            path, target = fs.path(name), fs.path(other)
            try:
                if kind == "rename":
                    os.rename(path, target)
                elif kind == "unlink":
                    os.unlink(path)
                elif kind == "link":
                    os.link(path, target)
                else:
                    flags = os.O_RDWR | os.O_CREAT | (os.O_APPEND if kind == "append" else 0)
                    fd = os.open(path, flags)
                    if kind == "pwrite":
                        os.pwrite(fd, data, offset)
                    elif kind == "truncate":
                        os.ftruncate(fd, offset)
                    elif kind == "fsync":
                        os.fsync(fd)
                    else:
                        os.write(fd, data)
                    os.close(fd)
                    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
                    os.fsync(dfd)
                    os.close(dfd)
                stat = os.stat(path if kind not in ("rename", "unlink") else fs.path("d"))
                seen.append((stat.st_ino, stat.st_size, stat.st_nlink, stat.st_mtime_ns))
            except OSError as exc:
                seen.append(exc.errno)
            seen.append(sorted(os.listdir(fs.path("d"))))
    return seen


@settings(max_examples=40, deadline=None)
@given(st.lists(STEP, max_size=12))
def test_the_process_sees_the_same_file_system(steps: list[Step]) -> None:
    full, light = FaultFS(ROOT), FaultFS(ROOT, durable_state=False)
    assert _run(full, steps) == _run(light, steps)
    assert light.tree() == full.tree()
    assert (light.boundaries, light.model.clock) == (full.boundaries, full.model.clock)
    assert next(light.crash_images("process")).tree() == next(full.crash_images("process")).tree()
    # what it does not keep: nothing pending, nothing durable
    assert light.model.meta_pending == []
    assert all(not node.pending and not node.durable for node in light.model.inodes.values())


def test_what_needs_the_durable_layer_is_refused_with_the_fix() -> None:
    fs = FaultFS(ROOT, durable_state=False)
    with fs:
        with open(fs.path("f"), "wb") as handle:
            handle.write(b"data")
    for build in (
        lambda: fs.crash_image("power"),
        lambda: fs.crash_image("torn"),
        lambda: fs.crash_image("reorder"),
        lambda: next(fs.crash_images("torn")),
        lambda: next(fs.crash_images("reorder")),
        lambda: fs.tree(durable=True),
    ):
        with pytest.raises(ConfigError, match="durable_state=True"):
            build()
    assert fs.crash_image("process").tree() == {"f": b"data"}


def test_copies_keep_the_lighter_model() -> None:
    fs = FaultFS(ROOT, durable_state=False)
    assert isinstance(FaultFS.from_snapshot(fs.snapshot()).model, ProcessModel)
    with fs:
        captured = fs.capture_at([1])
        with open(fs.path("f"), "wb"):
            pass
    assert isinstance(captured[0].model, ProcessModel)
    assert not isinstance(FaultFS(ROOT).model, ProcessModel)
