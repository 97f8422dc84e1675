"""A cascade termination a kill cut short is finished by recovery, deterministically.

``terminate(cascade=True)`` commits on the target first (its ``agent.terminated``
names the whole subtree), then terminates the subtree leaves first. A kill right
after the commit leaves the target dead and every descendant live on disk. The
next start must terminate them all: none may come back live, or as a root of its
own. (The SIGKILL campaign reaches this state only when a kill lands in that
window; this test builds it every time.)
"""

from __future__ import annotations

from pathlib import Path

from oracle.kill import exit_without_close
from substrat import events
from substrat.orchestrator import Orchestrator
from substrat.session import SessionState, SessionStore
from tests.integration.test_checkpoints import run


async def _cut_after_the_commit(root: Path) -> dict[str, str]:
    orch = await Orchestrator.open(root)
    await orch.create_root("boss")
    await orch.run_turn("boss", "@spawn a\n@spawn b\n@send a @spawn a1")
    await orch.run_pending()
    await orch.create_root("other")  # outside the cascade: it must stay
    sessions = {i.path: i.session_id for i in orch.agents()}
    assert set(sessions) == {"boss", "boss/a", "boss/b", "boss/a/a1", "other"}
    order = orch.tree.subtree_leaves_first(orch.resolve_live("boss").agent_id)
    top = order[-1]
    # terminate_now's commit, then the kill: nothing after it happens
    orch.logs.get(top.session_id).log(
        events.AGENT_TERMINATED,
        {"agent_id": top.agent_id, "cascade": [n.agent_id for n in order[:-1]]},
    )
    exit_without_close(orch)
    return sessions


def test_recovery_finishes_a_cascade_cut_right_after_its_commit(tmp_path: Path) -> None:
    root = tmp_path / "root"
    sessions = run(_cut_after_the_commit(root))

    async def reopen() -> list[str]:
        orch = await Orchestrator.open(root)
        paths = [i.path for i in orch.agents()]
        await orch.close()
        return paths

    assert run(reopen()) == ["other"]
    store = SessionStore(root)
    for path in ("boss", "boss/a", "boss/b", "boss/a/a1"):
        assert store.load(sessions[path]).state is SessionState.TERMINATED, path
    assert run(reopen()) == ["other"]  # and it stays so
