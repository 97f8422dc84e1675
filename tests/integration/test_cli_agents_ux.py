"""The CLI's agents as a user meets them: removed agents, ids, names, 80 columns.

Each test drives the ``substrat`` command as a real process against a real
daemon (issue 14, items 2, 3 and the 80-column layout of item 6).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.orchestrator import Orchestrator
from tests.support.cli import (
    SUBSTRAT,
    as_json,
    cli_root,
    kill_daemon,
    run,
    spawn,
    wait_busy,
)

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")
HEX_ID = re.compile(r"\b[0-9a-f]{32}\b")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def test_terminated_agents_stay_listed_shown_and_logged(root: Path) -> None:
    lead = as_json(run(root, "agent", "create", "lead", "--json"))
    run(root, "agent", "send", "lead", "plan\n@spawn scout look around")
    removed = run(root, "agent", "rm", "lead", "--cascade")
    assert removed.returncode == 0, removed.stderr
    assert "terminated 2 agents: lead/scout, lead" in removed.stdout

    assert "no agents yet" in run(root, "agent", "list").stdout
    for phase in ("live daemon", "after a restart"):
        everyone = as_json(run(root, "agent", "list", "--all", "--json"))
        assert {(a["path"], a["state"]) for a in everyone} == {
            ("lead", "terminated"),
            ("lead/scout", "terminated"),
        }, phase
        assert all(a["terminated_at"] for a in everyone), phase
        table = run(root, "agent", "list", "--all").stdout
        assert "lead/scout" in table and "TERMINATED" in table, phase

        shown = run(root, "agent", "show", "lead")
        assert shown.returncode == 0, shown.stderr
        assert "terminated at " in shown.stdout and "turn t1" in shown.stdout, phase
        for ref in ("lead", lead["agent_id"], lead["agent_id"][:8]):
            logged = run(root, "log", ref)
            assert logged.returncode == 0, (phase, ref, logged.stderr)
            assert "── turn t1 (#1)" in logged.stdout and "@spawn scout" in logged.stdout
        history = as_json(run(root, "log", "lead/scout", "--json"))
        assert history["agent"]["state"] == "terminated" and history["total"] == 0

        refused = run(root, "agent", "send", "lead", "are you there?")
        assert refused.returncode == 1
        message = refused.stderr.strip()
        assert message.startswith("error: agent lead was terminated at "), message
        assert "substrat log lead" in message
        removed_again = run(root, "agent", "rm", "lead/scout")
        assert "agent lead/scout was terminated at" in removed_again.stderr
        run(root, "daemon", "restart")


def _root_with_look_alike_ids(root: Path) -> dict[str, str]:
    """Three agents whose ids share prefixes, made offline through the public API."""
    agent_ids = ["abcd1234" + "0" * 24, "abcd5678" + "0" * 24, "ef01" + "1" * 28]
    session_ids = [f"{n:032x}" for n in range(1, 4)]
    # create_root draws the agent id, then the session id
    ids = iter(itertools.chain.from_iterable(zip(agent_ids, session_ids, strict=True)))

    def new_id() -> str:
        return next(ids)

    async def build() -> dict[str, str]:
        orch = await Orchestrator.open(root, new_id=new_id)
        made = {}
        for name in ("lead", "helper", "scribe"):
            made[name] = (await orch.create_root(name)).agent_id
        await orch.close()
        return made

    return asyncio.run(build())


def test_id_prefixes_like_git_and_names_with_suggestions(root: Path) -> None:
    made = _root_with_look_alike_ids(root)
    lead, helper = made["lead"], made["helper"]
    # The 8-character ids that list and tree print are accepted everywhere.
    listed = run(root, "agent", "list").stdout
    assert lead[:8] in listed and helper[:8] in listed
    assert as_json(run(root, "agent", "show", lead[:8], "--json"))["agent"]["name"] == "lead"
    assert as_json(run(root, "agent", "show", "abcd5", "--json"))["agent"]["name"] == "helper"
    sent = as_json(run(root, "agent", "send", "abcd56", "hi", "--json"))
    assert sent["agent_id"] == helper
    # An ambiguous prefix lists the candidates, by id and path.
    ambiguous = run(root, "agent", "show", "abcd")
    assert ambiguous.returncode == 1
    assert "ambiguous" in ambiguous.stderr
    assert "abcd1234 (lead)" in ambiguous.stderr and "abcd5678 (helper)" in ambiguous.stderr
    # An unknown name: a plain message (no KeyError quotes) that suggests the close one.
    typo = run(root, "agent", "send", "laed", "hello")
    assert typo.returncode == 1
    line = typo.stderr.strip()
    assert line.startswith("error: no agent laed; did you mean lead? `substrat agent list"), line
    assert "'" not in line
    # 1 to 3 characters of an id: not taken as a prefix, and the message says why.
    for ref in ("abc", "e"):
        short = run(root, "agent", "show", ref)
        assert short.returncode == 1
        assert f"no agent {ref}; an id prefix needs at least 4 characters" in short.stderr
    assert "at least 4 characters" not in typo.stderr  # not said of a name


def test_names_not_raw_ids_in_tool_lines_and_recovery_plans(root: Path) -> None:
    run(root, "agent", "create", "lead")
    sent = run(root, "agent", "send", "lead", "go\n@spawn scout map it\n@send scout map the river")
    assert sent.returncode == 0, sent.stderr
    tool_line = next(line for line in sent.stdout.splitlines() if "send_message" in line)
    assert tool_line.endswith(" to lead/scout"), tool_line
    run(root, "agent", "create", "slow", "--provider", "paced", "--model", "3000ms")
    doomed = spawn(root, "agent", "send", "slow", "never finishes")
    wait_busy(root)
    kill_daemon(root)
    doomed.communicate(timeout=30)
    plan = as_json(run(root, "recover", "--dry-run", "--json"))
    assert {a["path"] for a in plan["agents"]} == {"lead", "lead/scout", "slow"}
    human = run(root, "recover", "--dry-run").stdout
    assert re.search(r"^lead/scout \(session", human, re.MULTILINE), human


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_tables_fit_80_columns_without_wrapping_or_cutting_names(root: Path) -> None:
    long_child = "surveyor-of-the-northern-rivers"
    run(root, "agent", "create", "coordinator", "-i", "lead the expedition")
    run(
        root,
        "agent",
        "send",
        "coordinator",
        f"plan\n@spawn {long_child} map\n@spawn cartographer draw\n"
        f"@send {long_child} start at the delta, then go upstream and map every tributary",
    )
    run(root, "agent", "create", "slowpoke", "--provider", "paced", "--model", "3000ms")
    doomed = spawn(root, "agent", "send", "slowpoke", "a long prompt " * 20)
    wait_busy(root)
    kill_daemon(root)
    doomed.communicate(timeout=30)
    paths = ["coordinator", f"coordinator/{long_child}", "coordinator/cartographer", "slowpoke"]

    plan = run(root, "recover", "--dry-run", columns=80)
    rows = _table_rows(plan.stdout)
    assert all(len(line) <= 80 for line in rows), plan.stdout
    assert rows[0].split()[:3] == ["STATUS", "LAST", "COMPLETED"], plan.stdout
    titles = [line for line in rows[1:] if not line.startswith(" ")]
    assert sorted(t.split(" (session ")[0] for t in titles) == sorted(paths), plan.stdout
    assert len(rows) == 1 + 2 * len(paths), plan.stdout  # a name line and one line of facts
    assert "t1: a long prompt" in plan.stdout  # the turn lost in flight

    checked = run(root, "fsck", columns=80)
    findings = json.loads(run(root, "fsck", "--json").stdout)["findings"]
    # The summary lines name the root (a long path); the table is in between.
    table = _table_rows(checked.stdout)[1:-1]
    assert all(len(line) <= 80 for line in table), checked.stdout
    assert table[0].split() == ["SEVERITY", "KIND", "FILE", "DETAIL", "REPAIR"], checked.stdout
    agents = {f["agent"] for f in findings if f["agent"]}
    assert agents == set(paths), findings  # each agent left a pending file
    titles = [line for line in table[1:] if not line.startswith(" ")]
    assert {t.split(" (session ")[0] for t in titles} == agents | {"the root"}, checked.stdout
    # one row each (a row may fold onto more lines, its SEVERITY cell then blank)
    severities = {"damage", "leftover", "notice"}
    starts = [line for line in table[1:] if line.split()[:1] and line.split()[0] in severities]
    assert len(starts) == len(findings), checked.stdout

    run(root, "daemon", "start")
    listed = run(root, "agent", "list", columns=80)
    rows = _table_rows(listed.stdout)
    assert all(len(line) <= 80 for line in rows), listed.stdout
    assert len(rows) == 1 + len(paths), listed.stdout
    for path in paths:
        assert any(line.split()[0] == path for line in rows[1:]), (path, listed.stdout)
    tree = run(root, "agent", "tree", columns=80)
    rows = _table_rows(tree.stdout)
    assert all(len(line) <= 80 for line in rows), tree.stdout
    assert len(rows) == 1 + len(paths), tree.stdout
    for name in ("coordinator", long_child, "cartographer", "slowpoke"):
        assert any(f" {name} " in f"{line} " for line in rows), (name, tree.stdout)


def test_a_name_that_is_another_agents_id_prefix_is_refused_not_guessed(root: Path) -> None:
    # `agent create ef01` beside an agent whose id starts with ef01: `send ef01` went to
    # the new agent silently, whoever the user meant.
    made = _root_with_look_alike_ids(root)
    created = run(root, "agent", "create", "ef01")
    assert created.returncode == 0, created.stderr
    sent = run(root, "agent", "send", "ef01", "hi")
    assert sent.returncode == 1
    message = sent.stderr.strip()
    assert "ef01 is both the name of agent ef01 and the start of another agent's id" in message
    assert "ef011111 (scribe)" in message, message
    full = as_json(run(root, "agent", "send", made["scribe"], "hi", "--json"))
    assert full["agent_id"] == made["scribe"]  # the whole id still names one agent


def test_two_terminated_agents_of_one_name_are_named_as_such(root: Path) -> None:
    for _ in range(2):
        assert run(root, "agent", "create", "lead").returncode == 0
        assert run(root, "agent", "rm", "lead").returncode == 0
    shown = run(root, "agent", "show", "lead")
    assert shown.returncode == 1
    message = shown.stderr.strip()
    assert "2 terminated agents were named lead" in message, message
    assert "id prefix" not in message, message
