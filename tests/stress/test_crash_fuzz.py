"""The crash-recovery fuzzer (oracle.machines) on each faultfs profile."""

from __future__ import annotations

import pytest

from oracle.machines import CrashRecoveryMachine

pytestmark = pytest.mark.stress


class Ext4CrashRecoveryMachine(CrashRecoveryMachine):
    profile = "ext4-ordered"


class LazyFSCrashRecoveryMachine(CrashRecoveryMachine):
    profile = "lazyfs"


TestCrashRecoveryPosix = CrashRecoveryMachine.TestCase
TestCrashRecoveryExt4 = Ext4CrashRecoveryMachine.TestCase
TestCrashRecoveryLazyFS = LazyFSCrashRecoveryMachine.TestCase
