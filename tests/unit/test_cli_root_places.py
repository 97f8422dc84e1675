"""Roots a user mistypes (review s27d): a kernel file system, a ~ the shell left alone, an
empty directory on a read-only mount.

``--root /sys/kernel/x`` said "creating it failed: fsync of /sys failed (Invalid
argument); the unsynced data must be treated as lost and was not acknowledged", and
``--root /proc/x`` "creating it failed: No such file or directory" (/proc exists): now
both say the path is on a kernel file system that keeps no files, and a command that
only reads no longer suggests the `daemon start` that would fail. A quoted ``'~/x'``
(and ``--root=~/x``, which bash does not expand) is the home directory's x, as before;
the option's help now says so.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from substrat.cli import main
from tests.support import mounts

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


@pytest.mark.parametrize("spelling", [["--root", "~/x"], ["--root=~/x"]])
def test_a_tilde_the_shell_left_alone_is_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: list[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    args = ["agent", "list", "--no-autostart", *spelling]
    result = CliRunner().invoke(main, args, prog_name="substrat")
    assert result.exit_code == 2, result.output
    assert f"no substrat root at {tmp_path / 'home' / 'x'} " in result.output
    assert not os.path.lexists(tmp_path / "~")


@pytest.mark.parametrize("args", [["agent", "list", "--help"], ["agent", "--help"]])
def test_the_root_option_says_a_quoted_tilde_is_expanded(args: list[str]) -> None:
    result = CliRunner().invoke(main, args, prog_name="substrat", terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "a leading ~ is expanded, even quoted" in " ".join(result.output.split())


@pytest.fixture
def read_only_empty(tmp_path: Path) -> Iterator[Path]:
    with mounts.tmpfs(tmp_path / "mnt", "1m", "to make read-only") as mount_point:
        remount = subprocess.run(
            ["mount", "-o", "remount,ro", str(mount_point)], capture_output=True, text=True
        )
        assert remount.returncode == 0, remount.stderr
        yield mount_point


def test_an_empty_directory_on_a_read_only_mount_says_remount_not_chmod(
    read_only_empty: Path,
) -> None:
    # `agent list` suggested `chmod 700 DIR` (which fails there) then `daemon start`; that
    # said to remount, "(`substrat recover --dry-run` and `substrat fsck` read it as it
    # is)": there is nothing to read in an empty directory.
    root = str(read_only_empty)
    listing = CliRunner().invoke(main, ["agent", "list", "--no-autostart", "--root", root])
    assert listing.exit_code == 2, listing.output
    assert (
        f"no substrat root at {root} (an empty directory on a read-only file system); "
        "remount it read-write, or pick a writable directory with --root or SUBSTRAT_HOME"
    ) in listing.output
    assert "chmod" not in listing.output and "creates one" not in listing.output
    start = CliRunner().invoke(main, ["daemon", "start", "--root", root])
    assert start.exit_code == 2, start.output
    assert (
        "read-only file system; remount its file system read-write, or use --root or "
        "SUBSTRAT_HOME to pick a directory you can write"
    ) in start.output
    assert "recover --dry-run" not in start.output
    assert os.listdir(root) == []
