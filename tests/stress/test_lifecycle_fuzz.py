"""The lifecycle fuzzer (oracle.lifecycle): on faultfs, plus a few examples on a real disk.

The faultfs machine takes the profile's examples; the on-disk one keeps real
files and real fsyncs covered with a few examples per run (one under ``ci``).
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from oracle.lifecycle import LifecycleMachine, OnDiskLifecycleMachine

pytestmark = pytest.mark.stress

ON_DISK_SHARE = 50
"""One on-disk example per this many faultfs examples (at least one)."""

TestLifecycle = LifecycleMachine.TestCase


class TestLifecycleOnDisk(OnDiskLifecycleMachine.TestCase):
    settings = settings(max_examples=max(1, settings().max_examples // ON_DISK_SHARE))
