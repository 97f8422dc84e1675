"""Causes made of several directory entries from one line: each entry named, each parent in
the fix, and what made the loss matter (an acknowledgement or not) kept apart."""

from __future__ import annotations

import os

from faultfs import FaultFS, explore
from tests.support.faultfs_classic import fsync_dir

TREE = ("box", "box/new", "box/cur")


def make_tree(fs: FaultFS) -> None:
    for name in TREE:
        os.mkdir(fs.path(name))  # no directory fsync: the bug


def tree_then_ack(fs: FaultFS) -> None:
    make_tree(fs)
    fs.ack("tree")


def tree_check(img: FaultFS) -> None:
    if img.acked:
        for name in TREE:
            assert os.path.isdir(img.path(name)), name


def test_a_tree_made_by_one_line_is_one_cause_naming_each_directory_and_parent() -> None:
    report = explore(tree_then_ack, tree_check)
    (cause,) = report.causes()
    assert cause.kind == "entry-not-durable", report.text()
    summary, fix = cause.describe()
    assert "the directories box, box/new and box/cur created at" in summary, summary
    assert "were never made durable before they were acknowledged at" in summary, summary
    assert fix == "fsync their parent directories (., box) after mkdir"
    # What was done reads first, what relied on it last.
    assert [s.role for s in cause.steps] == ["mkdir", "mkdir", "mkdir", "acknowledged"]
    lines = [line.strip() for line in report.text().splitlines()]
    listed = [line.split(" ")[0] + " " + line.split(" ")[1] for line in lines if line]
    assert listed.index("mkdir box/cur") < listed.index("acknowledged at")


def tree_flag_then_ack(fs: FaultFS) -> None:
    make_tree(fs)
    with open(fs.path("flags/ready"), "w") as flag:  # durable: file and directory synced
        flag.flush()
        os.fsync(flag.fileno())
    fsync_dir(fs.path("flags"))
    fs.ack("tree")


def flag_setup(fs: FaultFS) -> None:
    os.mkdir(fs.path("flags"))
    fsync_dir(fs.root)


def flag_check(img: FaultFS) -> None:
    if img.acked or os.path.exists(img.path("flags/ready")):
        for name in TREE:
            assert os.path.isdir(img.path(name)), name


def test_a_loss_before_any_acknowledgement_is_not_reported_as_before_one() -> None:
    report = explore(tree_flag_then_ack, flag_check, setup=flag_setup)
    causes = report.causes()
    assert {c.kind for c in causes} == {"entry-not-durable"}, report.text()
    anchored = [c for c in causes if any(s.role == "acknowledged" for s in c.steps)]
    plain = [c for c in causes if c not in anchored]
    assert len(anchored) == 1 and len(plain) == 1, report.text()
    # Each cause's images are the ones its words describe.
    assert all(f.acked for f in anchored[0].failures)
    assert not any(f.acked for f in plain[0].failures)
    assert "acknowledged" not in plain[0].summary
    assert "before they were acknowledged" in anchored[0].summary
