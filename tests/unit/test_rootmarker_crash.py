"""Raising a root's marker from format 1 to 2 (``rootmarker.upgrade``) at every crash point.

The raise is the one durable step this format change added: the first process that
writes to an older root makes it before its first write, so that an older substrat
refuses the root from then on. A crash anywhere in it must leave a marker that reads,
of format 1 (the raise never happened: nothing of the new format was written yet) or 2,
with the root's original ``created_at``/``created_by``; once ``upgrade`` returned, only
format 2 (the first write that follows relies on it).
"""

from __future__ import annotations

import json
import os

import pytest

from faultfs import PROFILES, FaultFS, explore
from substrat import rootmarker
from substrat.rootnest import MARKER_NAME

OLD = {
    "format": rootmarker.MARKER_FORMAT,
    "version": 1,
    "created_at": "2026-11-26T10:20:00+00:00",
    "created_by": "substrat 0.1.0 (older)",
}
UPGRADED = 1


def _old_root(fs: FaultFS) -> None:
    with open(os.path.join(fs.root, MARKER_NAME), "wb") as handle:
        handle.write(json.dumps(OLD).encode() + b"\n")


def _upgrade(fs: FaultFS) -> None:
    assert rootmarker.upgrade(fs.root)
    fs.ack(UPGRADED)


def _check(img: FaultFS) -> None:
    body = rootmarker.read(img.root)
    assert body is not None, f"the marker does not read after a crash at {img.origin}"
    version = rootmarker.version_of(body)
    allowed = {2} if UPGRADED in img.acked else {1, 2}
    assert version in allowed, f"format {version} after a crash at {img.origin}, not {allowed}"
    assert body["created_at"] == OLD["created_at"], body
    assert body["created_by"] == OLD["created_by"], body
    if version == 2:
        assert body["upgraded_from"] == 1, body


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_marker_raise_cut_anywhere_leaves_format_1_or_2_and_2_once_returned(
    profile: str,
) -> None:
    report = explore(_upgrade, _check, setup=_old_root, profile=profile, root="/marker-root")
    report.assert_ok()
    assert report.boundaries >= 4, report.boundaries  # temp write, fsync, rename, dir fsync
