"""Steps after a commit point that fail (an injected OSError at the seam: a read-only
remount or a full disk cannot be made in a test): the operation is reported committed
and undecided (``OutcomeUnknownError`` with ``committed``), never as a plain failure,
and the orchestrator finishes the rest itself (``unfinished``, ``roll_forward``) before
the agents are next used, skipping the steps already applied."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from substrat.errors import AgentTerminatedError, DurabilityError, OutcomeUnknownError
from substrat.orchestrator import Orchestrator
from substrat.rpc import protocol
from tests.support.orch_api import registry, run


def _erofs(*_: Any, **__: Any) -> None:
    raise OSError(errno.EROFS, "Read-only file system", "roots/events.jsonl")


def test_a_root_created_but_not_registered_is_committed_and_finished_by_the_orchestrator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(tmp_path / "root", registry=registry())
        monkeypatch.setattr(orch.roots, "register", _erofs)
        with pytest.raises(OutcomeUnknownError) as failed:
            await orch.create_root("lead")
        assert failed.value.details["committed"] is True
        code, message, _ = protocol.error_for_exception(failed.value)
        assert code == protocol.OUTCOME_UNKNOWN
        assert "remount it read-write" in message
        assert [u.what for u in orch.unfinished] == ["agent lead was created"]
        assert "read-only" in orch.unfinished[0].error
        with pytest.raises(DurabilityError, match="agent lead was created, but"):
            await orch.run_turn("lead", "hi")  # its record is not ACTIVE yet: no turn
        monkeypatch.undo()
        assert orch.roll_forward() == [] and orch.unfinished == []
        assert list(orch.roots.read.roots) == [orch.tree.find("lead").session_id]
        assert (await orch.run_turn("lead", "hi")).turn_id == "t1"
        await orch.close()
        # the log has it: the next open serves it
        again = await Orchestrator.open(tmp_path / "root", registry=registry())
        assert [a.name for a in again.agents()] == ["lead"]
        await again.close()

    run(go())


def test_a_cascade_cut_after_its_commit_is_committed_and_finished_by_the_orchestrator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(tmp_path / "root", registry=registry())
        await orch.create_root("lead")
        await orch.run_turn("lead", "@spawn kid help")
        monkeypatch.setattr(orch.store, "transition", _erofs)
        with pytest.raises(OutcomeUnknownError) as failed:
            await orch.terminate("lead", cascade=True)
        assert failed.value.details["committed"] is True
        assert [u.what for u in orch.unfinished] == ["agent lead was terminated"]
        # not forgotten yet, but terminated: refused as such, not run
        with pytest.raises(AgentTerminatedError, match="agent lead was terminated, but"):
            await orch.run_turn("lead", "hi")
        monkeypatch.undo()
        assert orch.roll_forward() == [] and orch.unfinished == []
        assert orch.agents() == []
        with pytest.raises(AgentTerminatedError):
            orch.resolve_live("lead/kid")
        await orch.close()
        again = await Orchestrator.open(tmp_path / "root", registry=registry())
        assert again.agents() == []  # recovery finished the cascade
        await again.close()

    run(go())


def _fail_on_call(calls_before_failing: int, real: Any) -> Any:
    """``real``, except that its call number ``calls_before_failing + 1`` raises EMFILE."""
    count = 0

    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal count
        count += 1
        if count == calls_before_failing + 1:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(*args, **kwargs)

    return call


def test_a_retried_turn_does_not_bring_back_a_child_terminated_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(tmp_path / "root", registry=registry())
        await orch.create_root("lead")
        # the second child's session record fails: the first child exists, the turn is committed
        monkeypatch.setattr(orch.store, "save", _fail_on_call(1, orch.store.save))
        with pytest.raises(OutcomeUnknownError):
            await orch.run_turn("lead", "@spawn kid1 a\n@spawn kid2 b")
        monkeypatch.undo()
        assert sorted(a.name for a in orch.agents()) == ["kid1", "lead"]
        await orch.terminate("lead/kid1")  # the user ends it before the retry
        assert orch.roll_forward() == []
        assert sorted(a.name for a in orch.agents()) == ["kid2", "lead"]
        await orch.close()
        again = await Orchestrator.open(tmp_path / "root", registry=registry())
        assert sorted(a.name for a in again.agents()) == ["kid2", "lead"]
        await again.close()

    run(go())


def test_a_retried_turn_does_not_deliver_a_message_already_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(tmp_path / "root", registry=registry())
        await orch.create_root("lead")
        await orch.create_root("other")
        # the message to the user is enqueued, the one to "other" is not
        monkeypatch.setattr(orch, "enqueue", _fail_on_call(1, orch.enqueue))
        with pytest.raises(OutcomeUnknownError):
            await orch.run_turn("lead", "@send user hello\n@send other hi")
        monkeypatch.undo()
        first = await orch.collect_user_inbox()
        assert [m.payload for m in first] == ["hello"]
        assert orch.roll_forward() == []
        assert await orch.collect_user_inbox() == []  # "hello" is not delivered twice
        assert [m.payload for m in orch.inboxes.inbox(orch.tree.find("other").agent_id).all()] == [
            "hi"
        ]
        await orch.close()
        again = await Orchestrator.open(tmp_path / "root", registry=registry())
        assert await again.collect_user_inbox() == []
        other = again.tree.find("other").agent_id
        assert [m.payload for m in again.inboxes.inbox(other).all()] == ["hi"]
        await again.close()

    run(go())
