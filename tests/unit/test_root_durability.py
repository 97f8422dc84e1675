"""A new root and its lock file survive a power loss as written.

A root that ``prepare_root`` returned is a root after any crash: the directory
and its marker (``substrat-root.json``) are durable, so the next start does not
find a missing or unmarked directory where the user's agents are to live.

A daemon writes ``state: running`` into ``daemon.lock`` when it starts and
``state: stopped`` when it stops cleanly; the next daemon reports the previous
shutdown from what it finds (``clean``, ``unclean``, ``recovered``: `substrat
daemon status`, fsck's ``unclean_shutdown`` notice). Both writes are fsynced,
and a new lock file's directory entry too: without them a power loss while a
daemon runs leaves an empty or missing file, or the last clean stop's, and the
next daemon calls the power loss a clean shutdown. Checked on every power-loss
and reorder image faultfs can make after the write returned.
"""

from __future__ import annotations

import os

import pytest

from faultfs import FaultFS
from substrat import rootdir
from substrat.rpc import lock as root_lock

IMAGES_PER_MODE = 16


def test_a_new_root_and_its_marker_survive_a_power_loss() -> None:
    fs = FaultFS("/substrat-root", "posix")
    with fs:
        os.makedirs(fs.path("home"))
        fs.sync_all()
        made = rootdir.prepare_root(fs.path("home", "root"))
    checked = 0
    for mode in ("power", "reorder"):
        for image in fs.crash_images(mode, limit=IMAGES_PER_MODE):
            with image:
                info = rootdir.inspect(image.path("home", "root"))
            where = image.origin.detail if image.origin is not None else "?"
            assert info.state is rootdir.RootState.ROOT, f"{mode} image ({where}): {info.state}"
            checked += 1
    assert checked >= 2 and made.name == "root"


def _start(fs: FaultFS, *, clean_stop_before: bool) -> None:
    """Inside ``fs``: a durable empty root, optionally a clean stop of an earlier daemon,
    then a new daemon's lock taken and ``running`` written."""
    os.makedirs(fs.path("root"))
    fs.sync_all()
    if clean_stop_before:
        earlier = root_lock.RootLock.acquire(fs.path("root"))
        earlier.write(pid=1, started_at="t0", state="stopped", stopped_at="t1")
        earlier.release()
    held = root_lock.RootLock.acquire(fs.path("root"))
    held.write(pid=2, started_at="t2", state="running")
    # the daemon dies here (power loss): no clean stop is written


@pytest.mark.parametrize("clean_stop_before", [False, True], ids=["new root", "after a stop"])
def test_a_power_loss_while_the_daemon_runs_is_reported_unclean(clean_stop_before: bool) -> None:
    fs = FaultFS("/substrat-lock", "posix")
    with fs:
        _start(fs, clean_stop_before=clean_stop_before)
    checked = 0
    for mode in ("power", "reorder"):
        for image in fs.crash_images(mode, limit=IMAGES_PER_MODE):
            with image:
                found = root_lock.read_info(image.path("root"))
                held = root_lock.RootLock.acquire(image.path("root"))
                shutdown = held.previous_shutdown
                held.release()
            where = image.origin.detail if image.origin is not None else "?"
            assert found is not None and found.state == "running", (
                f"{mode} image ({where}): the lock file holds {found}"
            )
            assert shutdown == "unclean", f"{mode} image ({where}): reported {shutdown}"
            checked += 1
    assert checked >= 2
