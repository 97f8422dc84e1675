"""RootGuard says what happened to the root as a kind beside its message
(substrat/rootguard.py): the daemon acts on the kind (a replaced marker also writes the
reason into the restored ``daemon.log``), never on the message's wording."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from substrat import rootguard
from substrat.rootguard import RootGuard
from substrat.rootnest import MARKER_NAME


def guarded_root(tmp_path: Path) -> tuple[Path, RootGuard]:
    root = tmp_path / "root"
    root.mkdir()
    (root / MARKER_NAME).write_text("{}\n")
    guard = RootGuard(root)
    guard.note_marker()
    return root, guard


def test_an_untouched_root_has_no_problem(tmp_path: Path) -> None:
    assert guarded_root(tmp_path)[1].problem() is None


def test_a_marker_replaced_in_place_is_its_own_kind(tmp_path: Path) -> None:
    root, guard = guarded_root(tmp_path)
    os.unlink(root / MARKER_NAME)
    (root / MARKER_NAME).write_text("{}\n")  # a restore: unlink, then create
    found = guard.problem()
    assert found is not None and found.kind == "marker_replaced", found
    assert MARKER_NAME in found.message


def test_a_removed_marker_is_a_replaced_marker(tmp_path: Path) -> None:
    root, guard = guarded_root(tmp_path)
    os.unlink(root / MARKER_NAME)
    found = guard.problem()
    assert found is not None and found.kind == "marker_replaced", found


def test_a_renamed_root_is_gone_and_a_new_directory_there_is_moved(tmp_path: Path) -> None:
    root, guard = guarded_root(tmp_path)
    os.rename(root, tmp_path / "elsewhere")
    found = guard.problem()
    assert found is not None and found.kind == "gone", found
    root.mkdir()
    (root / MARKER_NAME).write_text("{}\n")
    found = guard.problem()
    assert found is not None and found.kind == "moved", found
    assert "another directory" in found.message


def test_a_restore_that_replaces_daemon_log_after_the_marker_still_gets_the_reason(
    tmp_path: Path,
) -> None:
    """tar may extract the marker before ``daemon.log``: the stopping daemon waits for the
    restored log instead of finding its own still there (a landing run lost the line)."""
    root, _ = guarded_root(tmp_path)
    log = root / "daemon.log"
    log.write_text("old\n")
    saved = os.dup(2)
    with open(log, "a") as stderr:
        os.dup2(stderr.fileno(), 2)  # the daemon's stderr is its daemon.log
    try:

        def restore() -> None:
            time.sleep(0.3)
            os.unlink(log)
            log.write_text("restored\n")

        later = threading.Thread(target=restore)
        later.start()
        rootguard._tell_restored_log(root, "its marker was replaced", wait_s=30)
        later.join()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    lines = log.read_text().splitlines()
    assert lines[0] == "restored" and lines[1].endswith("stopped: its marker was replaced"), lines
