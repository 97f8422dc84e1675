"""A stand-in for the Claude Code CLI: print mode, stream-json output, its own session files.

It behaves like the real CLI where substrat depends on it:

* ``-p`` with ``--output-format stream-json`` (which needs ``--verbose``); the
  prompt comes from stdin (or a trailing argument);
* an ``init`` event with the session id, ``assistant`` events, ``user`` events
  carrying tool results, a final ``result`` event;
* sessions kept as files under ``$FAKE_CLAUDE_HOME/sessions``; ``--resume ID``
  continues one, failing with "No conversation found with session ID" if it
  does not exist; ``--fork-session`` continues in a copy under a new id;
* ``--mcp-config FILE`` starts the MCP servers it names and speaks MCP stdio
  to them (initialize, tools/list, tools/call), refusing tools that
  ``--allowedTools`` does not allow.

The answer is deterministic: it names the turn number and a digest chained
over every prompt of the session, so a test can tell a correctly resumed
conversation from a fresh or wrong one. Prompt lines steer it:
``@tool NAME {json}`` calls an MCP tool, ``@say TEXT`` streams text at once,
``@fail TEXT`` ends with an error result, ``@die`` exits mid-turn with no
result, ``@sleep S`` waits, and ``@overflow`` reports a prompt that is too long.
Every invocation's argv is appended to ``$FAKE_CLAUDE_HOME/invocations.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def digest(prompts: list[str]) -> str:
    value = ""
    for prompt in prompts:
        value = hashlib.sha256(f"{value}\x00{prompt}".encode()).hexdigest()[:12]
    return value


def answer_for(prompts: list[str]) -> str:
    return f"turn {len(prompts)} digest {digest(prompts)}"


class Args:
    def __init__(self, argv: list[str]) -> None:
        self.print_mode = False
        self.verbose = False
        self.fork = False
        self.options: dict[str, str] = {}
        self.positional: list[str] = []
        takes_value = {
            "--output-format",
            "--resume",
            "--mcp-config",
            "--allowedTools",
            "--model",
            "--append-system-prompt",
            "--session-id",
            "--permission-mode",
        }
        index = 0
        while index < len(argv):
            arg = argv[index]
            if arg in ("-p", "--print"):
                self.print_mode = True
            elif arg == "--verbose":
                self.verbose = True
            elif arg == "--fork-session":
                self.fork = True
            elif arg in takes_value:
                index += 1
                self.options[arg] = argv[index]
            elif arg.startswith("-"):
                fail_usage(f"error: unknown option '{arg}'")
            else:
                self.positional.append(arg)
            index += 1


def fail_usage(message: str) -> None:
    sys.stderr.write(message + "\n")
    raise SystemExit(1)


class McpClient:
    """Starts one MCP stdio server and talks JSON-RPC to it."""

    def __init__(self, spec: dict[str, Any]) -> None:
        env = dict(os.environ)
        env.update(spec.get("env") or {})
        self.process = subprocess.Popen(
            [spec["command"], *spec.get("args", [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.next_id = 0
        init = self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
        assert "protocolVersion" in init, init
        self.notify("notifications/initialized")

    def notify(self, method: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}) + "\n")
        self.process.stdin.flush()

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        reply = json.loads(self.process.stdout.readline())
        assert reply.get("id") == self.next_id, reply
        if "error" in reply:
            raise RuntimeError(f"MCP error: {reply['error']}")
        result: dict[str, Any] = reply["result"]
        return result

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=10)


def load_servers(path: str | None) -> dict[str, McpClient]:
    if not path:
        return {}
    config = json.loads(Path(path).read_text())
    return {name: McpClient(spec) for name, spec in config.get("mcpServers", {}).items()}


def save(path: Path, session: dict[str, Any]) -> None:
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps(session))
    os.replace(temp, path)


def main(argv: list[str]) -> int:
    home = Path(os.environ["FAKE_CLAUDE_HOME"])
    sessions = home / "sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    with open(home / "invocations.jsonl", "a") as log:
        log.write(json.dumps(argv) + "\n")
    args = Args(argv)
    if not args.print_mode:
        fail_usage("this fake only supports print mode (-p)")
    if args.options.get("--output-format") != "stream-json":
        fail_usage("this fake only supports --output-format stream-json")
    if not args.verbose:
        fail_usage("Error: When using --print, --output-format=stream-json requires --verbose")
    prompt = " ".join(args.positional) if args.positional else sys.stdin.read()

    resume = args.options.get("--resume")
    if resume:
        path = sessions / f"{resume}.json"
        if not path.exists():
            # As the real CLI (2.1) does: the message on stderr, and a failed result that
            # names the unknown id as its session.
            sys.stderr.write(f"No conversation found with session ID: {resume}\n")
            failed = {
                "type": "result",
                "subtype": "error_during_execution",
                "is_error": True,
                "num_turns": 0,
                "session_id": resume,
            }
            sys.stdout.write(json.dumps(failed) + "\n")
            return 1
        session = json.loads(path.read_text())
        if args.fork:
            session = {**session, "id": str(uuid.uuid4()), "forked_from": resume}
    else:
        session = {"id": args.options.get("--session-id") or str(uuid.uuid4()), "prompts": []}
    path = sessions / f"{session['id']}.json"
    session_id = session["id"]

    servers = load_servers(args.options.get("--mcp-config"))
    allowed = set(filter(None, args.options.get("--allowedTools", "").split(",")))
    tool_names = []
    for name, client in servers.items():
        for tool in client.request("tools/list", {})["tools"]:
            tool_names.append(f"mcp__{name}__{tool['name']}")
    emit(
        {
            "type": "system",
            "subtype": "init",
            "session_id": session_id,
            "model": args.options.get("--model", "fake-default"),
            "tools": tool_names,
            "mcp_servers": [{"name": n, "status": "connected"} for n in servers],
        }
    )
    # Like the real CLI, the prompt is saved before the answer exists: a kill
    # mid-turn leaves it in this session's memory.
    session["prompts"].append(prompt)
    session["system"] = args.options.get("--append-system-prompt", "")
    save(path, session)
    with open(home / "running.pids", "a") as pids:
        pids.write(f"{os.getpid()}\n")  # tests reap strays left by a killed daemon

    results = []
    for line in prompt.splitlines():
        word, _, rest = line.partition(" ")
        if word == "@sleep":
            time.sleep(float(rest))
        elif word == "@say":
            emit({"type": "assistant", "session_id": session_id, "message": text_message(rest)})
        elif word == "@die":
            emit({"type": "assistant", "session_id": session_id, "message": text_message("half")})
            os._exit(3)
        elif word == "@fail":
            emit(result(session_id, rest, error=True))
            return 1
        elif word == "@overflow":
            emit(result(session_id, "Prompt is too long", error=True))
            return 1
        elif word == "@tool":
            name, _, raw = rest.partition(" ")
            server, tool = name.split("__", 1)
            use_id = f"toolu_{uuid.uuid4().hex[:12]}"
            block = {"type": "tool_use", "id": use_id, "name": f"mcp__{name}", "input": {}}
            emit({"type": "assistant", "session_id": session_id, "message": content([block])})
            if f"mcp__{name}" not in allowed:
                output = f"permission to use mcp__{name} was denied"
            else:
                reply = servers[server].request(
                    "tools/call", {"name": tool, "arguments": json.loads(raw or "{}")}
                )
                output = reply["content"][0]["text"]
            results.append(f"{tool} -> {output}")
            emit(
                {
                    "type": "user",
                    "session_id": session_id,
                    "message": content(
                        [{"type": "tool_result", "tool_use_id": use_id, "content": output}],
                        role="user",
                    ),
                }
            )
    answer = "\n".join([answer_for(session["prompts"]), *results])
    emit({"type": "assistant", "session_id": session_id, "message": text_message(answer)})
    session["answers"] = [*session.get("answers", []), answer]
    save(path, session)
    for client in servers.values():
        client.close()
    emit(result(session_id, answer))
    return 0


def content(blocks: list[dict[str, Any]], role: str = "assistant") -> dict[str, Any]:
    return {"role": role, "type": "message", "content": blocks}


def text_message(text: str) -> dict[str, Any]:
    return content([{"type": "text", "text": text}])


def result(session_id: str, text: str, *, error: bool = False) -> dict[str, Any]:
    return {
        "type": "result",
        "subtype": "error_during_execution" if error else "success",
        "is_error": error,
        "result": text,
        "session_id": session_id,
        "num_turns": 1,
    }


def install(directory: Path) -> Path:
    """Write an executable ``claude`` wrapper into ``directory`` and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = directory / "claude"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
