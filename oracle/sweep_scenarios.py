"""The sweep's named scenarios: fixed lists of workload steps (see :mod:`oracle.sweep`).

Each is run, crashed at every boundary and checked by the sweep; the crash fuzzer's
machines reuse their checkpoint policies.
"""

from __future__ import annotations

from dataclasses import dataclass

from oracle.workload import Step
from substrat.checkpointer import CheckpointPolicy


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: tuple[Step, ...]
    slots: int = 2
    checkpoints: CheckpointPolicy | None = None
    """The checkpoint policy the scenario runs under (None: the orchestrator's default)."""


SMALL_CHECKPOINTS = CheckpointPolicy(every_entries=6, segment_bytes=1500, compaction="archive")
"""Thresholds small enough that a short scenario checkpoints often, seals segments and
archives them (see substrat.checkpointer)."""


DELETING_CHECKPOINTS = CheckpointPolicy(every_entries=4, segment_bytes=500, compaction="delete")
"""The same under the ``delete`` compaction policy, small enough that a short scenario
deletes an agent's first segments (its base written first: see substrat.logbase)."""


SUMMARY_CHECKPOINTS = CheckpointPolicy(every_entries=1000)
"""Checkpoints only when a step asks (or an eviction), no segment sealed: the start summary
that a clean stop after a checkpoint of every log writes holds every agent (see
substrat.start_summary)."""


def _s(*parts: str) -> Step:
    return Step(*parts)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("roots", (_s("create_root", "ada"), _s("create_root", "bob"), _s("turn", "ada"))),
        Scenario(
            "children",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("spawn", "ada/bob", "cy"),
                _s("turn", "ada/bob/cy"),
            ),
        ),
        Scenario(
            "messages both ways",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("send", "ada", "bob"),
                _s("pending"),
                _s("complete", "ada/bob"),
                _s("inbox", "ada"),
                _s("send", "ada", "user"),
                _s("user_inbox"),
            ),
        ),
        Scenario(
            "stranded reply",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("ask", "ada", "bob"),
                _s("pending"),
            ),
        ),
        Scenario(
            "broadcast",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("spawn", "ada", "cy"),
                _s("broadcast", "ada/bob"),
                _s("pending"),
            ),
        ),
        Scenario(
            "evictions",
            (
                _s("create_root", "ada"),
                _s("turn", "ada"),
                _s("create_root", "bob"),
                _s("turn", "bob"),
                _s("turn", "ada"),
                _s("evict", "ada"),
                _s("turn", "ada"),
            ),
            slots=1,
        ),
        Scenario(
            "terminations",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("spawn", "ada/bob", "cy"),
                _s("send", "ada", "ada/bob/cy"),
                _s("terminate_by_parent", "ada", "bob"),
                _s("create_root", "dee"),
                _s("terminate", "dee"),
            ),
        ),
        Scenario(
            "checkpoints and compaction",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("ask", "ada", "ada/bob"),
                _s("pending"),
                _s("send", "ada/bob", "user"),
                _s("checkpoint"),
                _s("user_inbox"),
                _s("turn", "ada"),
                _s("evict", "ada"),
                _s("turn", "ada"),
            ),
            slots=1,
            checkpoints=SMALL_CHECKPOINTS,
        ),
        Scenario(
            "checkpoints and the start summary",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("spawn", "ada", "cy"),
                _s("send", "ada", "ada/bob"),
                _s("pending"),
                _s("checkpoint"),  # every log checkpointed: the summary can hold every agent
                _s("stop"),  # a clean stop writes it, the start takes them and retires it
                _s("turn", "ada/bob"),
                _s("checkpoint"),
                _s("send", "ada/cy", "user"),
                _s("evict", "ada"),
            ),
            slots=1,
            checkpoints=SUMMARY_CHECKPOINTS,
        ),
        Scenario(
            "checkpoints and deletion",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("ask", "ada", "ada/bob"),
                _s("pending"),
                _s("turn", "ada"),
                _s("send", "ada/bob", "user"),
                _s("turn", "ada"),
                _s("checkpoint"),
                _s("evict", "ada"),
                _s("turn", "ada"),
            ),
            slots=1,
            checkpoints=DELETING_CHECKPOINTS,
        ),
    )
}
