"""One state machine run as several pytest items that share the profile's examples.

``pytest -n 64`` is only as fast as its longest item, and one state machine
under the default profile is minutes of CPU. A test module parametrizes a test
over ``range(shards)`` and calls :func:`run_shard`; each item runs
``ceil(max_examples / shards)`` examples, so the campaign runs at least as
many examples as one item did, spread over as many workers as there are.

Under a derandomized profile (``ci``) every item would draw the same examples,
so each shard gets its own fixed seed (:func:`shard_seed`: from the machine's
name and the shard's number): the run stays reproducible, and the shards differ
from each other and from the shards of the other machines. (Machines that share
their rules, such as the crash fuzzer on three profiles, would otherwise draw the
same rule sequences with the same seed, which made the campaign's examples less
diverse than its item count says.) One shard runs exactly as the machine's
own ``TestCase`` would. Under a randomized profile each item
draws its own random seed, as any test does, and a failure reports the seed
(or the ``@reproduce_failure`` blob) to replay it with.
"""

from __future__ import annotations

import zlib

from hypothesis import seed, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test


def examples_per_shard(shards: int, profile: settings | None = None) -> int:
    """The examples one of ``shards`` items runs: the profile's, divided and rounded up."""
    assert shards >= 1, "at least one shard"
    total = (profile or settings()).max_examples
    return max(1, -(-total // shards))


def shard_seed(machine: type[RuleBasedStateMachine], shard: int) -> int:
    """The fixed seed of ``machine``'s item ``shard`` under a derandomized profile."""
    return zlib.crc32(f"{machine.__module__}.{machine.__qualname__}#{shard}".encode())


def run_shard(machine: type[RuleBasedStateMachine], shard: int, shards: int) -> None:
    """Run ``machine`` as item ``shard`` of ``shards`` under the active profile."""
    assert 0 <= shard < shards, f"shard {shard} is not in range({shards})"
    profile = settings()
    if profile.derandomize and shards > 1:
        # A subclass, so the seed does not stick to the machine class itself.
        machine = seed(shard_seed(machine, shard))(
            type(f"{machine.__name__}Shard{shard}", (machine,), {})
        )
    run_state_machine_as_test(
        machine,
        settings=settings(profile, max_examples=examples_per_shard(shards, profile)),
    )
