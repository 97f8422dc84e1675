"""An openai tool-call turn crashed at every I/O boundary (faultfs), in every crash mode.

The orchestrator runs on a faultfs disk; the endpoint is the real loopback
server. The turn under test has three requests and three tool calls (a
spawn, a message to the user, a listing). For each of its I/O boundaries the
run is crashed there, the crash image is taken in each mode, a fresh
orchestrator recovers on it and sends the agent a new prompt. The request
that reaches the server must be accepted (the server rejects orphan tool
calls, as real endpoints do) and must equal the conversation the recovered log
holds; and that log must be the acknowledged conversation, plus the cut turn
only if its commit record reached the disk.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from faultfs import FaultFS, SimulatedCrash
from substrat.orchestrator import Orchestrator
from substrat.providers.chat_history import conversation_problems, rebuild
from substrat.providers.openai_chat import OpenAIConfig, OpenAIProvider
from substrat.providers.registry import ProviderRegistry
from tests.support.chat_server import ChatServer, Reply, echo, text, tool_call, tools
from tests.support.directive_chat import plain_http_client

ROOT = "/substrat-openai-sweep/root"
SYSTEM = "You lead."
WORK = "Hire a helper, greet the user, list your children."
FAST_MODES = ("process", "power")
ALL_MODES = ("process", "power", "torn", "reorder")
STRESS_SEEDS = range(4)


def responder(body: dict[str, Any]) -> Reply:
    messages = body["messages"]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not messages[users[-1]]["content"].endswith(WORK):
        return echo(body)
    rounds = sum(1 for m in messages[users[-1] :] if m.get("tool_calls"))
    if rounds == 0:
        return tools(
            tool_call("spawn_agent", {"name": "helper"}),
            tool_call("send_message", {"recipient": "user", "text": "hi"}),
            say="On it.",
        )
    if rounds == 1:
        return tools(tool_call("list_children", {}))
    return text("Done.")


class Run:
    """One orchestrator on one faultfs disk, with deterministic ids."""

    def __init__(self, server: ChatServer, fs: FaultFS) -> None:
        self.fs = fs
        self.loop = asyncio.new_event_loop()
        config = OpenAIConfig(base_url=server.base_url, api_key="k", request_timeout_s=5.0)
        registry = ProviderRegistry()
        registry.register("openai", OpenAIProvider(config, http_client=plain_http_client))
        ids = itertools.count(1)
        self.orch = self.within(
            Orchestrator.open(ROOT, registry=registry, new_id=lambda: f"{next(ids):032x}")
        )

    def within(self, coro: Any) -> Any:
        with self.fs:
            return self.loop.run_until_complete(coro)

    def history(self) -> list[Any]:
        with self.fs:
            return self.orch.history("lead")

    def close(self) -> None:
        # Finish abandoned streams (network only; a crashed disk refuses any write).
        self.within(self.loop.shutdown_asyncgens())
        self.loop.close()


def boundaries_of_the_turn(server: ChatServer) -> int:
    fs = FaultFS(ROOT)
    run = Run(server, fs)
    try:
        run.within(run.orch.create_root("lead", SYSTEM, provider="openai", model="m"))
        run.within(run.orch.run_turn("lead", "warm up"))
        start = fs.boundaries
        run.within(run.orch.run_turn("lead", WORK))
        return fs.boundaries - start
    finally:
        run.within(run.orch.close())
        run.close()


BOUNDARIES = 60
"""The I/O boundaries of the WORK turn (:func:`boundaries_of_the_turn` counts them).

Written down rather than counted as the module is imported: counting runs the turn
(its server, orchestrator and faultfs disk, and the OpenAI SDK's import), which every
pytest process paid at collection, each xdist worker again, whether or not it ran one
of these tests (docs/benchmarks.md, the collection's CPU).
:func:`test_the_sweep_covers_every_boundary_of_the_turn` counts them and fails, with
the new number, when the turn's boundaries change."""

POINTS = list(range(1, BOUNDARIES + 1))


def test_the_sweep_covers_every_boundary_of_the_turn() -> None:
    with ChatServer(responder) as server:
        count = boundaries_of_the_turn(server)
    assert count >= 6, f"the turn has only {count} I/O boundaries"
    assert count == BOUNDARIES, (
        f"the turn now has {count} I/O boundaries, the sweeps cover {BOUNDARIES}: "
        f"set BOUNDARIES = {count}"
    )


STRESS_VARIANT = (
    "tests/integration/test_provider_openai_sweep.py"
    "::test_every_boundary_in_every_crash_mode_and_seed"
)
"""Every boundary in every mode and seed, the commit checks included: it covers the test
below, which skips when it runs (the main job ran both)."""


@pytest.mark.covered_under_stress(STRESS_VARIANT)
@pytest.mark.parametrize("boundary", POINTS)
def test_every_boundary_of_a_tool_round_recovers_to_an_accepted_logged_conversation(
    boundary: int,
) -> None:
    # One mode per boundary, alternating, keeps the default run short; the stress
    # variant below takes every mode and several seeds at every boundary.
    modes = FAST_MODES if boundary in (POINTS[0], POINTS[-1]) else [FAST_MODES[boundary % 2]]
    check_commits(boundary, sweep(boundary, [(mode, 0) for mode in modes]))


@pytest.mark.stress
@pytest.mark.parametrize("boundary", POINTS)
def test_every_boundary_in_every_crash_mode_and_seed(boundary: int) -> None:
    check_commits(
        boundary, sweep(boundary, [(mode, seed) for mode in ALL_MODES for seed in STRESS_SEEDS])
    )


def check_commits(boundary: int, committed: dict[tuple[str, int], bool]) -> None:
    """What the cut turn left: nothing at the first boundary, the commit record at the last."""
    if boundary == POINTS[0]:  # cut before turn.start
        assert not any(committed.values()), committed
    if boundary == POINTS[-1]:  # the commit record was written by then
        assert committed[("process", 0)], committed


def sweep(boundary: int, images: list[tuple[str, int]]) -> dict[tuple[str, int], bool]:
    """Crash the WORK turn at ``boundary``; recover and check every image; which committed.

    An image with the same files and bytes as one already checked takes its verdict
    (``content_fingerprint`` is that key: the check reads nothing else, and the endpoint
    answers the same conversation the same way). Process and power images do not depend
    on the seed, so of the stress variant's 16 images per boundary at least 6 are such
    repeats; torn and reorder images with nothing unsynced to cut are the power image.
    """
    committed: dict[tuple[str, int], bool] = {}
    verdicts: dict[tuple[tuple[str, bytes | None], ...], bool] = {}
    with ChatServer(responder) as server:
        fs = FaultFS(ROOT)
        run = Run(server, fs)
        run.within(run.orch.create_root("lead", SYSTEM, provider="openai", model="m"))
        run.within(run.orch.run_turn("lead", "warm up"))
        acknowledged = run.history()
        fs.arm(boundary)
        with pytest.raises(SimulatedCrash):
            run.within(run.orch.run_turn("lead", WORK))
        fs.disarm()
        run.close()
        for mode, seed in images:
            image = fs.crash_image(mode, seed=seed)
            key = image.content_fingerprint()
            if key in verdicts:
                committed[(mode, seed)] = verdicts[key]
                continue
            recovered = Run(server, image)
            try:
                history = recovered.history()
                # The acknowledged conversation survives; the cut turn is all or nothing.
                assert history[: len(acknowledged)] == acknowledged, mode
                assert len(history) in (len(acknowledged), len(acknowledged) + 1), mode
                committed[(mode, seed)] = len(history) > len(acknowledged)
                assert conversation_problems(SYSTEM, history) == [], mode
                before = len(server.requests)
                recovered.within(recovered.orch.run_turn("lead", "go on"))
                sent = server.requests[before:]
                after = recovered.history()
            finally:
                recovered.within(recovered.orch.close())
                recovered.close()
            assert [r.status for r in sent] == [200], (mode, [r.problem for r in sent])
            assert sent[0].messages == rebuild(SYSTEM, after[:-1]) + [after[-1].transcript[0]]
            assert after[:-1] == history, mode
            verdicts[key] = committed[(mode, seed)]
    return committed
