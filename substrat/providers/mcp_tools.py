"""Agent tools for agentic CLIs, over MCP.

An agentic CLI (Claude Code and the like) runs its own tool loop, so substrat
cannot hand it function tools per request. It can, however, start MCP servers.
This module is both halves of that bridge:

* :class:`ToolBridge` runs inside the daemon, one per agent session: a Unix
  socket (in a private temporary directory) that lists the agent's tools and
  runs a call through the session's :class:`AgentContext`.
* ``python -m substrat.providers.mcp_tools --socket PATH`` is the MCP stdio
  server the CLI launches: newline-delimited JSON-RPC 2.0 on stdin/stdout
  (``initialize``, ``tools/list``, ``tools/call``, ``ping``), each tool call
  forwarded over the socket.

The bridge protocol is one JSON line each way per connection:
``{"op": "list"}`` -> ``{"tools": [...]}`` and ``{"op": "call", "name", "arguments"}``
-> ``{"text": ...}``, or ``{"error": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import IO, Any

from substrat.errors import ToolError
from substrat.providers.base import AgentContext

SERVER_NAME = "substrat"
PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")
MAX_BRIDGE_LINE_BYTES = 8 * 1024 * 1024
BRIDGE_TIMEOUT_S = 3600.0  # a tool call may wait on the orchestrator, never forever


class ToolBridge:
    """The daemon side: answers the MCP server's list/call requests for one session."""

    def __init__(self, context: AgentContext, socket_path: Path) -> None:
        self.context = context
        self.socket_path = socket_path
        self.call_prefix = "mcp"
        self.calls = 0
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_unix_server(
                self._handle, path=str(self.socket_path), limit=MAX_BRIDGE_LINE_BYTES
            )

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def new_turn(self, prefix: str) -> None:
        """Name this turn's calls ``<prefix>-<n>``: the ids are the tools' idempotency keys."""
        self.call_prefix, self.calls = prefix, 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            try:
                request = json.loads(line)
                answer = await self._answer(request)
            except (ValueError, TypeError, KeyError) as exc:
                answer = {"error": f"bad bridge request: {exc}"}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("op") == "list":
            specs = self.context.tool_specs()
            return {
                "tools": [
                    {"name": s.name, "description": s.description, "inputSchema": s.parameters}
                    for s in specs
                ]
            }
        if request.get("op") == "call":
            arguments = request.get("arguments") or {}
            if not isinstance(arguments, dict):
                return {"error": "the arguments must be a JSON object"}
            self.calls += 1
            call_id = f"{self.call_prefix}-{self.calls}"
            try:
                text = await self.context.call_tool(str(request["name"]), arguments, call_id)
            except ToolError as exc:
                text = f"error: {exc}"
            return {"text": text}
        return {"error": f"unknown bridge op {request.get('op')!r}"}


def mcp_config(socket_path: Path) -> dict[str, Any]:
    """The ``--mcp-config`` document that makes a CLI start this module's server."""
    package_parent = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)
    return {
        "mcpServers": {
            SERVER_NAME: {
                "type": "stdio",
                "command": sys.executable,
                "args": ["-P", "-m", "substrat.providers.mcp_tools", "--socket", str(socket_path)],
                "env": {"PYTHONPATH": pythonpath},
            }
        }
    }


# -- the MCP stdio server (runs in the process the CLI starts) ------------------------


def _bridge(socket_path: str, request: dict[str, Any]) -> dict[str, Any]:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(BRIDGE_TIMEOUT_S)
            conn.connect(socket_path)
            conn.sendall(json.dumps(request).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                piece = conn.recv(65536)
                if not piece:
                    break
                data += piece
                if len(data) > MAX_BRIDGE_LINE_BYTES:
                    return {"error": "the bridge answer is too large"}
        answer = json.loads(data)
        return answer if isinstance(answer, dict) else {"error": "bad bridge answer"}
    except (OSError, ValueError) as exc:
        return {"error": f"the substrat daemon is unreachable ({exc}); the tool did not run"}


def _handle_rpc(socket_path: str, message: dict[str, Any]) -> dict[str, Any] | None:
    method = message.get("method")
    params = message.get("params") or {}
    if "id" not in message:
        return None  # a notification (initialized, cancelled): nothing to answer
    result: dict[str, Any]
    if method == "initialize":
        asked = params.get("protocolVersion")
        result = {
            "protocolVersion": asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0],
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": SERVER_NAME, "version": "1"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        answer = _bridge(socket_path, {"op": "list"})
        if "error" in answer:
            return _rpc_error(message["id"], -32603, answer["error"])
        result = {"tools": answer["tools"]}
    elif method == "tools/call":
        request = {"op": "call", "name": params.get("name"), "arguments": params.get("arguments")}
        answer = _bridge(socket_path, request)
        text = str(answer.get("text", answer.get("error", "")))
        failed = "error" in answer or text.startswith("error:")
        result = {"content": [{"type": "text", "text": text}], "isError": failed}
    else:
        return _rpc_error(message["id"], -32601, f"method {method!r} not found")
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


def _rpc_error(request_id: Any, code: int, text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": text}}


def serve_stdio(socket_path: str, stdin: IO[str], stdout: IO[str]) -> int:
    """Serve MCP on the given streams until stdin closes."""
    for line in stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
            if not isinstance(message, dict):
                raise ValueError("not an object")
        except ValueError:
            reply: dict[str, Any] | None = _rpc_error(None, -32700, "parse error")
        else:
            reply = _handle_rpc(socket_path, message)
        if reply is not None:
            stdout.write(json.dumps(reply) + "\n")
            stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="substrat agent tools as an MCP stdio server")
    parser.add_argument("--socket", required=True, help="the daemon's tool-bridge socket")
    args = parser.parse_args(argv)
    return serve_stdio(args.socket, sys.stdin, sys.stdout)


if __name__ == "__main__":
    raise SystemExit(main())
