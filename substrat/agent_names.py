"""What an agent may be called: the names the user and the tools keep for themselves.

Apart from :mod:`substrat.agents` (which re-exports them) because ``agent create``
checks a name before anything is sent, and importing the agents' tree, inboxes and
reference matching for that was a few milliseconds of every such command's start.
"""

from __future__ import annotations

import re

USER = "user"
"""The user's endpoint id: it sends prompts and has an inbox like any agent."""
PARENT = "parent"
"""What an agent calls its parent in tool calls (the user, for a root)."""

MAX_NAME_CHARS = 64

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
RESERVED = frozenset({USER, PARENT})


def validate_name(name: object) -> str:
    """An agent name: 1-64 characters of letters, digits, ``_ . -``, not starting with a symbol."""
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not NAME.fullmatch(name):
        raise ValueError(
            f"invalid agent name {name!r}: use 1-{MAX_NAME_CHARS} letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    if name == USER:
        raise ValueError(f"{USER!r} is reserved for the user's endpoint")
    if name == PARENT:
        # the tools read "parent" as the caller's parent: an agent of that name could not
        # be reached by name, and messages meant for it would silently go elsewhere
        raise ValueError(f"{PARENT!r} is reserved: agents use it to address their parent")
    return name
