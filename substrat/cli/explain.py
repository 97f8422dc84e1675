"""The daemon's refusals, said in the command line's own terms.

The daemon words its errors for any client (``cascade``, an agent's path);
the facts ride along in the error's ``data`` (see ``SubstratError.details``).
Here they become what a CLI user types: ``--cascade``, ``--wait``, ``substrat
daemon restart``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from substrat.errors import RpcError
from substrat.words import plural


def _q(text: object) -> str:
    import shlex  # (only for a refusal's advice: not part of every command's start)

    return shlex.quote(str(text))


def reword(exc: RpcError, command: str) -> RpcError:
    """``exc`` with a message that names the CLI's options (same code and data)."""
    data: dict[str, Any] = exc.data if isinstance(exc.data, dict) else {}
    kind = data.get("type")
    agent = data.get("agent")
    message: str | None = None
    if kind == "HasChildrenError" and agent:
        children = list(data.get("children") or [])
        message = (
            f"agent {agent} has {plural(len(children), 'live child', 'live children')} "
            f"({', '.join(children)}); `substrat agent rm {_q(agent)} --cascade` terminates "
            f"it together with {'its child' if len(children) == 1 else 'its children'}"
        )
    elif kind == "AgentBusyError" and agent:
        if command == "send":
            message = (
                f"agent {agent} is running a turn; add --wait to send when it is idle "
                f"(`substrat agent send --wait {_q(agent)} ...`)"
            )
        else:
            message = f"agent {agent} is running a turn; try again when it is idle"
    elif kind == "AgentTerminatedError" and agent:
        message = f"{exc.message} (`substrat log {_q(agent)}` shows its conversation)"
    elif kind == "ProviderConfigError":
        hint = _daemon_environment(data, exc.message)
        message = f"{exc.message}\n{hint}" if hint else None
    if message is None:
        return exc
    return RpcError(exc.code, message, exc.data)


def _daemon_environment(data: dict[str, Any], message: str) -> str:
    """Providers read the daemon's environment, not this shell's: say so, and what to do.

    Empty when the daemon's message already says it and this shell has nothing to add.
    """
    settings = [s for s in data.get("settings") or [] if isinstance(s, str)]
    here = [s for s in settings if os.environ.get(s)]
    if not here and "substrat daemon restart" in message:
        return ""
    if here:
        return (
            f"This shell has {', '.join(here)} set, but the daemon was started before (or "
            "elsewhere) and reads only its own environment: run `substrat daemon restart` "
            "from this shell to start it with these settings."
        )
    what = f" ({', '.join(settings)})" if settings else ""
    return (
        f"Providers read their settings{what} from the daemon's environment: export them, "
        "then run `substrat daemon restart` from that shell."
    )


@contextlib.contextmanager
def cli_terms(command: str) -> Iterator[None]:
    """Re-raise the daemon's refusals inside the block in the CLI's terms."""
    try:
        yield
    except RpcError as exc:
        better = reword(exc, command)
        if better is exc:
            raise
        raise better from None
