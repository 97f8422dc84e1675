"""The ``delete`` compaction policy: covered segments go, nothing anyone relies on does.

A workload runs with a small checkpoint policy that deletes: every agent's first
segments are removed once a durable checkpoint covers them, the log's base
(``events.base``) keeping the covering checkpoint and the turns they held. Then:

* a restart gives the state the same workload gives under ``keep`` (tree,
  turn counters, inboxes, every conversation turn for turn);
* a conversation the provider rebuilds from the log continues exactly (the
  scripted reply's digest chains over every turn, deleted ones included);
* deletion waits for the checkpoint's fsync and writes the base first; a
  crash between the base and the removals loses nothing;
* a deleted prefix whose base is gone (and no other checkpoint) holds the
  agent back and refuses its conversation: never a wrong one;
* ``substrat compact --policy delete`` (and its ``--dry-run``).
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from oracle.kill import exit_without_close
from substrat import compaction, fsck, logbase
from substrat.checkpointer import CheckpointPolicy
from substrat.checkpoints import CHECKPOINTS_DIR
from substrat.conversation import ConversationGone, conversation_from_log
from substrat.errors import DurabilityError
from substrat.eventlog import read_log
from substrat.orchestrator import Orchestrator
from substrat.providers.scripted import chain_digest, reply_digest
from substrat.segments import list_sealed
from substrat.session.store import AGENTS_DIR
from tests.integration.test_checkpoints import snapshot

T = TypeVar("T")
DELETE = CheckpointPolicy(every_entries=4, segment_bytes=1500, compaction="delete")
KEEP = CheckpointPolicy(every_entries=4, segment_bytes=1500, compaction="keep")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def _workload(root: Path, policy: CheckpointPolicy, rounds: int = 5) -> None:
    orch = await Orchestrator.open(root, checkpoints=policy, slots=1)
    await orch.create_root("lead", "You coordinate.")
    await orch.run_turn("lead", "@spawn a worker\n@spawn b worker")
    for i in range(rounds):
        await orch.run_turn("lead", f"@ask a question {i}\n@send b note {i} " + "x" * 120)
        await orch.run_pending()
        await orch.run_turn("lead/a", f"@send user hello {i}")
    await orch.close()


def build(tmp_path: Path, policy: CheckpointPolicy, name: str) -> Path:
    root = tmp_path / name
    run(_workload(root, policy))
    return root


def _masked(text: str) -> str:
    return re.sub(r"[0-9a-f]{16,}", "<id>", text)


def comparable(snap: dict[str, Any]) -> dict[str, Any]:
    """A snapshot without the ids that differ from one run to the next."""
    return {
        "agents": {
            path: {
                "state": a["state"],
                "waiting": len(a["waiting_on"]),
                "inbox": len(a["inbox"]),
                "turns": a["turns"],
                "history": [(_masked(p), _masked(r)) for _, p, r in a["history"]],
            }
            for path, a in snap["agents"].items()
        },
        "user": len(snap["user"]),
    }


def agent_dirs(root: Path) -> dict[str, Path]:
    """Agent path -> its directory, from a recovery (the logs' first entries may be gone)."""

    async def go() -> dict[str, Path]:
        orch = await Orchestrator.open(root, checkpoints=CheckpointPolicy.off())
        out = {
            orch.tree.path(n.agent_id): root / AGENTS_DIR / n.session_id for n in orch.tree.walk()
        }
        exit_without_close(orch)
        return out

    return run(go())


def reopen(root: Path, policy: CheckpointPolicy = DELETE) -> tuple[dict[str, Any], Any]:
    async def go() -> tuple[dict[str, Any], Any]:
        orch = await Orchestrator.open(root, checkpoints=policy)
        snap, report = snapshot(orch), orch.recovery_report
        exit_without_close(orch)
        return snap, report

    return run(go())


def test_delete_removes_covered_segments_and_a_restart_is_whole(tmp_path: Path) -> None:
    deleted = build(tmp_path, DELETE, "deleted")
    kept = build(tmp_path, KEEP, "kept")
    log = agent_dirs(deleted)["lead"] / "events.jsonl"
    sealed = list_sealed(log)
    assert sealed and sealed[0].first > 1, "the lead's first segments were deleted"
    base = logbase.read_base(log)
    assert base is not None and base.deleted_through == sealed[0].first - 1
    assert base.turns, "the deleted segments' turns are in the base"
    # what is left on disk is a suffix: the log's entries start right after the base
    assert read_log(log).entries[0]["seq"] == base.deleted_through + 1
    snap, report = reopen(deleted)
    assert report.unreadable == [] and report.checkpoints_rejected == {}
    assert comparable(snap) == comparable(reopen(kept, KEEP)[0])
    assert fsck.check(deleted).problems == []


def test_a_conversation_rebuilt_from_the_log_continues_after_deletion(tmp_path: Path) -> None:
    root = build(tmp_path, DELETE, "root")
    lead_dir = agent_dirs(root)["lead"]
    assert list_sealed(lead_dir / "events.jsonl")[0].first > 1
    history = conversation_from_log(lead_dir / "events.jsonl")
    kept = comparable(reopen(build(tmp_path, KEEP, "kept"), KEEP)[0])
    # every turn, the deleted ones too
    assert [(_masked(t.prompt), _masked(t.response)) for t in history] == kept["agents"]["lead"][
        "history"
    ]

    async def go() -> str:
        orch = await Orchestrator.open(root, checkpoints=DELETE)
        node = orch.tree.resolve("lead")
        orch.sessions[node.session_id].provider_state = b""  # the log is the only copy
        result = await orch.run_turn("lead", "one more")
        await orch.close()
        return str(result.response)

    digest = ""
    for turn in history:
        digest = chain_digest(digest, turn.prompt)
    assert reply_digest(run(go())) == chain_digest(digest, "one more")


def test_deletion_waits_for_the_checkpoint_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from substrat.checkpoints import CheckpointStore

    def broken(self: CheckpointStore, checkpoints: list[Any]) -> list[Any]:
        raise DurabilityError("fsync failed")

    monkeypatch.setattr(CheckpointStore, "append", broken)
    root = build(tmp_path, DELETE, "root")
    for directory in (root / AGENTS_DIR).iterdir():
        sealed = list_sealed(directory / "events.jsonl")
        assert not sealed or sealed[0].first == 1
        assert not (directory / logbase.BASE_NAME).exists()


def test_a_crash_between_the_base_and_the_removals_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []

    def killed(segment: Any) -> None:
        calls.append(segment.path)
        raise OSError("killed after the base was written, before the removals")

    monkeypatch.setattr(logbase, "delete_segment", killed)
    root = build(tmp_path, DELETE, "root")
    monkeypatch.undo()
    assert calls, "a removal was attempted"
    lead = agent_dirs(root)["lead"] / "events.jsonl"
    base = logbase.read_base(lead)
    assert base is not None and list_sealed(lead)[0].first == 1  # both there
    snap, report = reopen(root)
    assert report.unreadable == []
    history = [t.turn_id for t in conversation_from_log(lead)]
    assert history == [f"t{n}" for n in range(1, len(history) + 1)]  # none twice or missing
    assert len(history) == len(snap["agents"]["lead"]["history"]) > len(base.turns)
    assert fsck.check(root).problems == []


def test_a_deleted_prefix_without_its_base_is_held_back_never_guessed(tmp_path: Path) -> None:
    root = build(tmp_path, DELETE, "root")
    lead = agent_dirs(root)["lead"]
    shutil.rmtree(root / CHECKPOINTS_DIR)
    snap, report = reopen(root)  # the base's checkpoint still holds
    assert "lead" in snap["agents"] and report.unreadable == []
    base = lead / logbase.BASE_NAME
    base.write_bytes(base.read_bytes()[:-20] + b"x" * 19 + b"\n")  # damaged
    with pytest.raises(ConversationGone):
        conversation_from_log(lead / "events.jsonl")
    assert "missing_segment" in fsck.check(root).kinds()
    snap, report = reopen(root)
    assert lead.name in {u.session_id for u in report.unreadable}
    assert "lead" not in snap["agents"]


def test_compact_delete_dry_run_shows_what_goes_and_changes_nothing(tmp_path: Path) -> None:
    root = build(tmp_path, KEEP, "root")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    planned = compaction.plan(root, compaction="delete")
    assert sum(len(p.to_delete) for p in planned.logs) >= 1
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    history = comparable(reopen(root, KEEP)[0])
    done = compaction.compact(root, compaction="delete")
    assert done.deleted >= 1 and done.bytes_after < done.bytes_before
    assert comparable(reopen(root, KEEP)[0]) == history
    assert fsck.check(root).problems == []


def test_the_daemon_reads_the_delete_policy_from_its_environment() -> None:
    policy = CheckpointPolicy.from_env({"SUBSTRAT_COMPACTION": "delete"})
    assert policy.compaction == "delete" and policy.background
    with pytest.raises(ValueError, match="keep, archive, delete"):
        CheckpointPolicy(compaction="shred")


def test_cli_compact_policy_delete_dry_run_then_delete(tmp_path: Path) -> None:
    from tests.support.cli import run as cli

    root = build(tmp_path, KEEP, "root")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    shown = cli(root, "compact", "--policy", "delete", "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "to delete" in shown.stdout and "nothing was changed" in shown.stdout
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    done = cli(root, "compact", "--policy", "delete")
    assert done.returncode == 0, done.stderr
    assert " deleted" in done.stdout and not done.stdout.startswith("compact: 0 deleted")
    again = cli(root, "compact", "--policy", "delete", "--dry-run")
    assert "deleted)" in again.stdout  # what the earlier deletion removed, per log


def test_log_shows_the_deleted_prefix_and_every_turn(tmp_path: Path) -> None:
    from tests.support.cli import as_json, stop_or_kill
    from tests.support.cli import run as cli

    root = build(tmp_path, DELETE, "root")
    kept = comparable(reopen(build(tmp_path, KEEP, "kept"), KEEP)[0])
    lead_log = agent_dirs(root)["lead"] / "events.jsonl"
    gone = logbase.deleted_through(lead_log)
    assert gone > 0
    try:
        shown = cli(root, "log", "lead")
        assert shown.returncode == 0, shown.stderr
        assert f"entries 1-{gone} of lead's log were deleted by the compaction policy" in (
            " ".join(shown.stdout.split())
        )
        doc = as_json(cli(root, "log", "lead", "--json"))
        assert doc["deleted_through"] == gone
        assert doc["total"] == len(kept["agents"]["lead"]["history"])
        assert [(_masked(t["prompt"]), _masked(t["response"])) for t in doc["turns"]] == kept[
            "agents"
        ]["lead"]["history"]
        # a terminated agent whose agent.created was deleted is still known by its base
        assert cli(root, "agent", "rm", "lead/a").returncode == 0
        listed = as_json(cli(root, "agent", "list", "--all", "--json"))
        dead = [a for a in listed if a["name"] == "a"]
        assert dead and dead[0]["state"] == "terminated"
        assert as_json(cli(root, "log", dead[0]["agent_id"], "--json"))["deleted_through"] > 0
    finally:
        stop_or_kill(root)


def test_an_openai_conversation_is_sent_whole_after_its_first_segments_are_deleted(
    tmp_path: Path,
) -> None:
    from tests.support.chat_server import ChatServer
    from tests.support.directive_chat import directive_responder, openai_registry

    root = tmp_path / "root"
    prompts = [f"@send user hello {i}\nand some words " + "y" * 80 for i in range(8)]
    with ChatServer(directive_responder) as server:

        async def first_run() -> None:
            orch = await Orchestrator.open(
                root, registry=openai_registry(server), checkpoints=DELETE, slots=1
            )
            await orch.create_root("lead", "You coordinate.", provider="openai")
            for prompt in prompts:
                await orch.run_turn("lead", prompt)
            await orch.close()

        async def after_deletion() -> None:
            orch = await Orchestrator.open(
                root, registry=openai_registry(server), checkpoints=DELETE, slots=1
            )
            node = orch.tree.resolve("lead")
            orch.sessions[node.session_id].provider_state = b""  # the log is the only copy
            await orch.run_turn("lead", "final")
            await orch.close()

        run(first_run())
        lead = agent_dirs(root)["lead"] / "events.jsonl"
        assert logbase.deleted_through(lead) > 0, "the lead's first segments were deleted"
        before = len(server.accepted())
        run(after_deletion())
        sent = server.accepted()[before].messages
        assert not server.rejected()
    assert sent[0] == {"role": "system", "content": "You coordinate."}
    assert [m["content"] for m in sent if m["role"] == "user"] == [*prompts, "final"]
    assert sum(1 for m in sent if m["role"] == "tool") == len(prompts)  # each @send's result


def test_the_oracle_accepts_a_covered_deleted_prefix_and_nothing_else(tmp_path: Path) -> None:
    from oracle.checks import check_invariants
    from oracle.errors import OracleViolation

    root = build(tmp_path, DELETE, "root")
    lead = agent_dirs(root)["lead"]

    async def check(policy: CheckpointPolicy) -> None:
        orch = await Orchestrator.open(root, checkpoints=policy)
        try:
            check_invariants(orch)
        finally:
            exit_without_close(orch)

    run(check(DELETE))  # deleted by the policy, covered by a base that holds: fine
    with pytest.raises(OracleViolation, match="without the delete policy"):
        run(check(KEEP))
    base = (lead / logbase.BASE_NAME).read_bytes()
    (lead / logbase.BASE_NAME).unlink()  # the store's checkpoint still serves the agent
    with pytest.raises(OracleViolation, match="has no base: entries 1-"):
        run(check(DELETE))
    (lead / logbase.BASE_NAME).write_bytes(base)
    short = logbase.read_base(lead / "events.jsonl")
    assert short is not None
    short.deleted_through -= 1  # a base that does not cover every missing entry
    logbase.write_base(lead / "events.jsonl", short)
    with pytest.raises(OracleViolation, match="its base covers only"):
        run(check(DELETE))


def test_a_checkpoint_is_never_built_from_a_log_without_its_start(tmp_path: Path) -> None:
    from substrat.checkpoints import Settled
    from substrat.checkpoints import build as build_checkpoint

    root = build(tmp_path, DELETE, "root")
    lead = agent_dirs(root)["lead"] / "events.jsonl"
    assert logbase.first_kept(lead) > 1
    end = read_log(lead).entries[-1]["seq"]
    with pytest.raises(ValueError, match="are not in the log"):
        build_checkpoint(
            "lead", lead, None, upto_seq=end, active_end=lead.stat().st_size, settled=Settled()
        )
    base = logbase.read_base(lead)
    assert base is not None  # from the base's checkpoint it builds
    built = build_checkpoint(
        "lead",
        lead,
        base.checkpoint,
        upto_seq=end,
        active_end=lead.stat().st_size,
        settled=Settled(),
    )
    assert built is None or built.at.seq == end
