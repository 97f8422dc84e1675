"""A path as one shell word, for the commands that messages tell a user to run.

A root under a directory with a space (`--root /srv/my roots/r`) was printed as is,
and the command copied from the message ran on `/srv/my` with a stray argument.
shlex.quote's rule, without importing shlex into every command's start.
"""

from __future__ import annotations

import os

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_")


def shell_word(path: str | os.PathLike[str]) -> str:
    """``path`` as the shell reads it back: bare when every character is safe, else in
    single quotes (a quote inside as '"'"')."""
    text = os.fspath(path)
    if text and all(char in _SAFE for char in text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"
