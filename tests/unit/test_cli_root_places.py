"""Roots a user mistypes (review s27d): a kernel file system.

``--root /sys/kernel/x`` said "creating it failed: fsync of /sys failed (Invalid
argument); the unsynced data must be treated as lost and was not acknowledged", and
``--root /proc/x`` "creating it failed: No such file or directory" (/proc exists): now
both say the path is on a kernel file system that keeps no files, and a command that
only reads no longer suggests the `daemon start` that would fail.
"""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from substrat.cli import main

CASES = [
    ["daemon", "start", "--root", "/sys/kernel/substrat-s27d"],
    ["agent", "create", "lead", "--root", "/sys/kernel/substrat-s27d"],
    ["daemon", "start", "--root", "/proc/substrat-s27d"],
    ["agent", "list", "--no-autostart", "--root", "/sys/kernel/substrat-s27d"],
    ["fsck", "--root", "/proc/self/substrat-s27d"],
]


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs Linux's /proc and /sys")
@pytest.mark.parametrize("args", CASES, ids=[" ".join(case[:2]) + " " + case[-1] for case in CASES])
def test_a_root_on_a_kernel_file_system_is_refused_saying_so(args: list[str]) -> None:
    result = CliRunner().invoke(main, args, prog_name="substrat")
    assert result.exit_code == 2, result.output
    top = "/sys" if args[-1].startswith("/sys") else "/proc"
    assert f"as a substrat root: it is under {top} (" in result.output, result.output
    assert "keeps nothing; use --root or SUBSTRAT_HOME to pick a directory on a disk" in (
        result.output
    )
    assert "fsync" not in result.output and "creates one" not in result.output
    assert not os.path.lexists(args[-1])
