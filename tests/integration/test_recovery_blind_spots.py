"""Recovery's answers that only show across restarts, after a provider failure or after EIO.

Each test here kills a mutant that the stress suite let through (see
docs/mutants.md): the lost turn's closing entry (without it the same lost turn
is reported at every restart), the ``turn.failed`` of a provider failure
(without it a crash turns the failure into a turn "lost in flight"), and the
take-back of a ``turn.complete`` whose fsync failed (without it a turn reported
as failed comes back committed after a power loss). Every test runs the real
orchestrator on a faultfs disk and checks what a restart makes of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from faultfs import FaultFS
from oracle.faults import failing_fsync
from oracle.harness import CrashHarness
from oracle.workload import Step
from substrat import events
from substrat.errors import DurabilityError, OutcomeUnknownError
from substrat.eventlog import read_log
from substrat.providers.fake import FakeProvider
from substrat.providers.registry import ProviderRegistry

MAX_TURN_BOUNDARIES = 40
LOST_NOTICE = "[substrat: the daemon restarted. Your turn t2"


def _last_prompt(harness: CrashHarness, agent: str) -> str:
    with harness.fs:
        return harness.orch.history(agent)[-1].prompt


def _harness_with_a_lost_turn() -> CrashHarness:
    """ada, one completed turn, then a turn cut where ``turn.start`` is durable and
    ``turn.complete`` is not, and one restart (whose report lists the lost turn)."""
    for boundary in range(1, MAX_TURN_BOUNDARIES):
        harness = CrashHarness()
        harness.run(Step("create_root", "ada"))
        harness.run(Step("turn", "ada"))
        if not harness.run(Step("turn", "ada"), crash_at=boundary).crashed:
            break
        harness.crash_and_recover("power")
        report = harness.orch.recovery_report
        assert report is not None
        if report.lost_turns:
            return harness
        harness.close()
    raise AssertionError("no crash point of a turn left it lost in flight")


def test_a_lost_turn_is_reported_by_one_restart_and_told_to_the_agent_once() -> None:
    harness = _harness_with_a_lost_turn()
    first = harness.orch.recovery_report
    assert first is not None and [t["turn_id"] for t in first.lost_turns] == ["t2"]
    for _ in range(2):  # restart twice more before the agent runs again
        harness.crash_and_recover("process")
        again = harness.orch.recovery_report
        assert again is not None
        assert again.lost_turns == [], "a restart reported the same lost turn again"
        assert harness.orch.tree.resolve("ada").lost_turn is not None, "the notice was dropped"
    harness.run(Step("turn", "ada"))
    assert _last_prompt(harness, "ada").startswith(LOST_NOTICE)
    harness.crash_and_recover("power")
    assert harness.orch.tree.resolve("ada").lost_turn is None
    harness.run(Step("turn", "ada"))
    assert "the daemon restarted" not in _last_prompt(harness, "ada"), "told twice"
    harness.close()


def _serving(provider: FakeProvider) -> Callable[[], ProviderRegistry]:
    """A registry factory (one per recovery) that serves ``provider`` as "fake"."""

    def registry() -> ProviderRegistry:
        made = ProviderRegistry()
        made.register("fake", provider)
        return made

    return registry


def test_a_turn_the_provider_failed_is_not_reported_lost_after_a_crash() -> None:
    provider = FakeProvider()

    harness = CrashHarness(registry=_serving(provider), provider="fake")
    harness.run(Step("create_root", "ada"))
    harness.run(Step("turn", "ada"))
    provider.fail_send = 1
    harness.run(Step("turn", "ada"))  # fails: turn.failed is logged, the model drops it
    assert provider.fail_send == 0, "the provider was not asked"
    for mode in ("process", "power"):
        harness.crash_and_recover(mode)
        report = harness.orch.recovery_report
        assert report is not None
        assert report.lost_turns == [], f"{mode}: a failed turn was reported lost in flight"
        assert harness.orch.tree.resolve("ada").lost_turn is None
    harness.run(Step("turn", "ada"))
    assert "the daemon restarted" not in _last_prompt(harness, "ada")
    harness.close()


class _NotingSession:
    """A fake session that, as the OpenAI and Claude Code sessions do, asks for a provider
    note (``AgentContext.note``) to be logged during the turn."""

    def __init__(self, inner: Any, context: Any) -> None:
        self._inner = inner
        self._context = context

    async def send(self, prompt: str) -> AsyncIterator[str]:
        self._context.note(events.PROVIDER_SESSION, {"provider": "fake", "reason": "new"})
        async for chunk in self._inner.send(prompt):
            yield chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _NotingProvider(FakeProvider):
    async def create(self, model: str, system_prompt: str, context: Any) -> Any:
        return _NotingSession(await super().create(model, system_prompt, context), context)


def test_a_provider_note_is_in_the_log_after_a_power_loss() -> None:
    """``note`` promises a durable entry: a power loss after the turn keeps it."""
    provider = _NotingProvider()

    harness = CrashHarness(registry=_serving(provider), provider="fake")
    harness.run(Step("create_root", "ada"))
    harness.run(Step("turn", "ada"))
    harness.crash_and_recover("power")
    with harness.fs:
        ada = harness.orch.tree.resolve("ada")
        logged = read_log(harness.orch.logs.path(ada.session_id)).entries
    assert [e["event"] for e in logged].count(events.PROVIDER_SESSION) == 1, (
        "the provider's note is not in the log after a power loss"
    )
    harness.close()


def test_an_eviction_and_the_restore_after_it_are_in_the_log_after_a_power_loss() -> None:
    """``suspend.result`` (the blob saved, logged when a session is evicted) and
    ``session.restored`` (the next turn's restore and its source) are durable log
    entries (docs/events.md): a power loss afterwards keeps both."""
    harness = CrashHarness()
    harness.run(Step("create_root", "ada"))
    harness.run(Step("turn", "ada"))
    harness.run(Step("evict", "ada"))
    harness.run(Step("turn", "ada"))
    harness.crash_and_recover("power")
    with harness.fs:
        ada = harness.orch.tree.resolve("ada")
        logged = [e["event"] for e in read_log(harness.orch.logs.path(ada.session_id)).entries]
    assert events.SUSPEND_RESULT in logged, "the eviction's suspend.result is gone"
    assert logged.count(events.SESSION_RESTORED) == 1, f"the restore is gone: {logged}"
    assert logged.index(events.SUSPEND_RESULT) < logged.index(events.SESSION_RESTORED), logged
    harness.close()


# -- the EIO contract: a turn reported failed never comes back --------------------------


def _turn_with_failing_commit(harness: CrashHarness, failures: int) -> BaseException:
    """Run a turn of ada whose fsyncs fail from the commit on: ``failures`` in a row,
    the first one written back anyway (writeback raced the error)."""
    armed: list[contextlib.AbstractContextManager[Any]] = []

    def arm(_chunk: str) -> None:  # turn.start is durable; the provider is answering
        if not armed:
            armed.append(failing_fsync(harness.fs, 1, failures, written=True))
            armed[0].__enter__()

    with harness.fs:
        try:
            harness.loop.run_until_complete(harness.orch.run_turn("ada", "hello", on_chunk=arm))
        except DurabilityError as exc:
            return exc
        finally:
            for context in armed:
                context.__exit__(None, None, None)
    raise AssertionError("the turn succeeded although its commit's fsync failed")


def _recovered_turns(harness: CrashHarness, image: FaultFS) -> int:
    orch = harness._orchestrator_on(image)
    with image:
        return len(orch.history("ada"))


@pytest.mark.parametrize("failures", [1, 2, 3])
def test_a_turn_reported_failed_never_comes_back_and_an_undecided_one_says_so(
    failures: int,
) -> None:
    harness = CrashHarness()
    harness.run(Step("create_root", "ada"))
    harness.run(Step("turn", "ada"))
    error = _turn_with_failing_commit(harness, failures)
    undecided = isinstance(error, OutcomeUnknownError)
    for mode in ("process", "power"):
        turns = _recovered_turns(harness, harness.fs.crash_image(mode))
        if not undecided:
            assert turns == 1, f"{mode}: the turn reported as failed came back committed"
        else:
            assert turns in (1, 2), f"{mode}: {turns} turns"
    if failures == 1:
        # the take-back worked: a definite answer, and the entry is gone for good
        assert not undecided, f"a taken-back commit was reported as undecided: {error}"
    else:
        # the take-back's own fsync failed: the written-back entry is on the disk
        assert undecided, f"a commit that may survive was reported as failed: {error}"
    harness.close()
