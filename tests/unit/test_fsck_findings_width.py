"""``substrat fsck``'s findings on any terminal width: every file name printed whole.

On a 50-column terminal the table used to fold the FILE column mid-name
(``daemon.soc`` over ``k``) and rich cut the severity and kind (``lefto…``).
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from substrat.cli.offline_cmds import _findings
from substrat.fsck_report import Finding, FsckReport

SID = "9031480c0d2b4a3c9e5f6a7b8c9d0e1f"
SEGMENT = "events-000001.jsonl.pending"
GONE = "socket of a daemon that is gone"
UNCLEAN = "the last daemon (pid 24297) did not shut down cleanly; it recovers at the next start"
IN_LOG = "pending entry already in the log"


def _report() -> FsckReport:
    report = FsckReport(root="/tmp/root", repair=False)
    report.findings = [
        Finding("stale_socket", "daemon.sock", "leftover", GONE, repair="remove it"),
        Finding("unclean_shutdown", "daemon.lock", "notice", UNCLEAN),
        Finding("stale_pending", "roots/events.pending", "leftover", IN_LOG, repair="remove it"),
        Finding("stale_pending", f"agents/{SID}/{SEGMENT}", "leftover", IN_LOG,
                repair="remove it", agent="lead/scout"),
    ]  # fmt: skip
    return report


def _printed(width: int, repair: bool = False) -> list[str]:
    file = io.StringIO()
    console = Console(file=file, width=width, highlight=False, soft_wrap=True, _environ={})
    for part in _findings(_report(), repair, width):
        console.print(part)
    return file.getvalue().splitlines()


@pytest.mark.parametrize("width", [30, 40, 50, 60, 70, 80, 100, 140])
@pytest.mark.parametrize("repair", [False, True])
def test_every_file_name_and_kind_is_on_one_line_whole(width: int, repair: bool) -> None:
    printed = _printed(width, repair)
    for name in ("daemon.sock", "daemon.lock", "roots/events.pending", SEGMENT):
        assert any(name in line for line in printed), (name, printed)
    for kind in ("stale_socket", "unclean_shutdown", "stale_pending"):
        assert any(kind in line for line in printed), (kind, printed)
    assert not any("…" in line for line in printed), printed


@pytest.mark.parametrize("width", [30, 50])
def test_a_narrow_terminal_gets_each_finding_in_full_below_its_file(width: int) -> None:
    printed = _printed(width)
    assert all(len(line) <= width for line in printed), printed
    at = printed.index("  daemon.sock")
    below = []
    for line in printed[at + 1 :]:
        if not line.startswith("    "):
            break
        below.append(line.strip())
    # wrapped at spaces, within the width
    assert " ".join(below) == f"leftover stale_socket: {GONE} repair: remove it", printed
    assert "lead/scout (session 9031480c)" in printed
    assert f"  {SEGMENT}" in printed


def test_a_wide_terminal_keeps_the_table() -> None:
    printed = _printed(140)
    assert printed[0].split() == ["SEVERITY", "KIND", "FILE", "DETAIL", "REPAIR"]
    assert any(line.split()[:3] == ["leftover", "stale_socket", "daemon.sock"] for line in printed)
