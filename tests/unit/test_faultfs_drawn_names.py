"""A file name drawn anew in each of explore's runs reads once in the causes (review s27d).

mailbox.Maildir names each message ``time.M<microseconds>P<pid>Q<counter>.<host>``, and
its counter goes on across explore's runs of the workload. A cause merges the runs that
found it, so it listed every name any run drew: three links for the two messages of
this workload, in the cause, its steps and the fix. The n-th operation of every run is
the same operation (same kind, same site), so a path that differs there was drawn: it
is named as the longest run drew it. Two messages of one run stay two.
"""

from __future__ import annotations

import mailbox
import os
import re

from faultfs import FaultFS, explore
from faultfs._report import DRAWN_NOTE, drawn_names
from tests.support.faultfs_classic import fsync_dir


def two_messages(fs: FaultFS) -> None:
    box = mailbox.Maildir(fs.path("mail"), create=True)
    for i in range(2):
        box.add(f"Subject: m{i}\n\nbody {i}\n")
        fs.ack(i)


def subjects_acked(img: FaultFS) -> None:
    if not os.path.exists(img.path("mail")):
        assert not img.acked
        return
    subjects = {message["Subject"] for message in mailbox.Maildir(img.path("mail"), create=False)}
    for i in img.acked:
        assert f"m{i}" in subjects


def test_maildir_s_links_read_once_per_message() -> None:
    report = explore(two_messages, subjects_acked)
    text = report.text()
    delivered = set(re.findall(r"mail/new/[^ ,)]+\.M[^ ,)]+", text))
    assert len(delivered) == 2, text  # one per message, not one per message and run
    (links,) = [c for c in report.causes() if {s.kind for s in c.steps} >= {"link"}]
    assert sum(step.kind == "link" for step in links.steps) == 2
    assert f"\n  {DRAWN_NOTE}\n" in text
    # Every cause stays: the four entries never made durable, the mkdirs' intermediate state.
    assert len(report.causes()) == 5, text


def test_chosen_names_are_not_drawn_names() -> None:
    def numbered(fs: FaultFS) -> None:
        for i in range(3):  # q00000, q00001, ...: the same in every run
            with open(fs.path(f"q{i:05}"), "w") as handle:
                handle.write("x")
                handle.flush()
                os.fsync(handle.fileno())
            fs.ack(i)
        fsync_dir(fs.root)

    def check(img: FaultFS) -> None:
        for i in img.acked:
            assert os.path.exists(img.path(f"q{i:05}"))

    report = explore(numbered, check, modes=("power",))
    assert report.failures
    assert drawn_names(report.failures) == {}
    text = report.text()
    assert DRAWN_NOTE not in text
    assert all(f"q{i:05}" in text for i in range(3)), text


def test_a_fix_for_many_entries_names_the_first_few() -> None:
    # Maildir's messages are one link each: the group's title and fix listed every one (40
    # messages, 40 names on one line); each cause under it still names its own.
    def six_messages(fs: FaultFS) -> None:
        box = mailbox.Maildir(fs.path("mail"), create=True)
        for i in range(6):
            box.add(f"Subject: m{i}\n\nbody {i}\n")
            fs.ack(i)

    text = explore(six_messages, subjects_acked, modes=("power",)).text()
    fix_line = next(line for line in text.splitlines() if line.startswith("    fix: fsync the dir"))
    assert "mail, mail/cur, mail/new, mail/new/" in fix_line
    assert fix_line.count("mail/new/") == 1 and " and 5 more, before anything" in fix_line, text
    assert ".vm and 2 more created at" in text, text  # the links cause: six, one per message
