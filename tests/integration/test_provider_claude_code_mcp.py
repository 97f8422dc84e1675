"""The MCP stdio server a CLI launches, spoken to over real pipes, bridged to a real socket."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from substrat.providers.mcp_tools import PROTOCOL_VERSIONS, ToolBridge, mcp_config
from tests.support.context import RecordingContext


class McpPipe:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.next_id = 0

    async def raw(self, line: str) -> dict[str, Any]:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()
        answer: dict[str, Any] = json.loads(await self.process.stdout.readline())
        return answer

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}}
        answer = await self.raw(json.dumps(message))
        assert answer["id"] == self.next_id
        return answer

    async def notify(self, method: str) -> None:
        assert self.process.stdin
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}).encode() + b"\n")
        await self.process.stdin.drain()


async def start(socket_path: Path) -> McpPipe:
    spec = mcp_config(socket_path)["mcpServers"]["substrat"]
    process = await asyncio.create_subprocess_exec(
        spec["command"],
        *spec["args"],
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={"PYTHONPATH": spec["env"]["PYTHONPATH"]},
    )
    return McpPipe(process)


async def finish(pipe: McpPipe) -> int:
    assert pipe.process.stdin
    pipe.process.stdin.close()
    return await asyncio.wait_for(pipe.process.wait(), 10)


def test_the_mcp_server_lists_and_runs_agent_tools() -> None:
    context = RecordingContext()

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="mcp-") as directory:
            bridge = ToolBridge(context, Path(directory) / "tools.sock")
            await bridge.start()
            bridge.new_turn("turnA")
            pipe = await start(bridge.socket_path)
            try:
                init = await pipe.call("initialize", {"protocolVersion": "2024-11-05"})
                assert init["result"]["protocolVersion"] == "2024-11-05"
                assert "tools" in init["result"]["capabilities"]
                await pipe.notify("notifications/initialized")  # no answer expected
                unknown = await pipe.call("initialize", {"protocolVersion": "1999-01-01"})
                assert unknown["result"]["protocolVersion"] == PROTOCOL_VERSIONS[0]
                assert (await pipe.call("ping"))["result"] == {}
                listed = (await pipe.call("tools/list"))["result"]["tools"]
                assert [t["name"] for t in listed] == ["echo", "add"]
                assert listed[1]["inputSchema"]["required"] == ["a", "b"]
                done = await pipe.call("tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}})
                assert done["result"] == {
                    "content": [{"type": "text", "text": "3"}],
                    "isError": False,
                }
                bad = await pipe.call("tools/call", {"name": "nope", "arguments": {}})
                assert bad["result"]["isError"] is True
                assert "unknown tool" in bad["result"]["content"][0]["text"]
                missing = await pipe.call("resources/list")
                assert missing["error"]["code"] == -32601
                garbage = await pipe.raw("{not json")
                assert garbage["error"]["code"] == -32700
                await bridge.close()  # the daemon went away mid-session
                lost = await pipe.call("tools/call", {"name": "echo", "arguments": {"text": "x"}})
                assert lost["result"]["isError"] is True
                assert "unreachable" in lost["result"]["content"][0]["text"]
            finally:
                assert await finish(pipe) == 0
                await bridge.close()

    asyncio.run(main())
    assert [(n, a, c) for n, a, c in context.calls] == [
        ("add", {"a": 1, "b": 2}, "turnA-1"),
        ("nope", {}, "turnA-2"),
    ]


def test_mcp_config_points_at_this_interpreter() -> None:
    spec = mcp_config(Path("/tmp/x.sock"))["mcpServers"]["substrat"]
    assert spec["command"] == sys.executable
    assert spec["args"][-2:] == ["--socket", "/tmp/x.sock"]
