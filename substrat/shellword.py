"""A path as one shell word, for the commands that messages tell a user to run, and a
path as a message names it (:func:`shown`).

A root under a directory with a space (`--root /srv/my roots/r`) was printed as is,
and the command copied from the message ran on `/srv/my` with a stray argument.
shlex.quote's rule, without importing shlex into every command's start.

A path holding a character that prints nothing or that a terminal acts on (a newline, a
tab, ESC, a carriage return, a byte that is no UTF-8) would split a one-line message, or
recolour or overwrite it: such a path is written as bash's ``$'...'`` word (what ``ls``
prints for it), with those characters escaped as Python's repr does, on one line and
unambiguous. An ordinary path is printed as it always was.

A command a message tells the user to run (`` `substrat fsck --repair` ``) acts on the
default root when run as shown: for a user of ``--root R`` that is another root, where a
repair or a restart is not harmless. :func:`rooted` names R in each such command.
"""

from __future__ import annotations

import os
import re

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


def shell_word(path: str | os.PathLike[str]) -> str:
    """``path`` as the shell reads it back: bare when every character is safe, else in
    single quotes (a quote inside as '"'"'), or as ``$'...'`` when it holds a character
    that does not print (see :func:`shown`)."""
    text = os.fspath(path)
    if text and all(char in _SAFE for char in text):
        return text
    if not text.isprintable():
        return _quoted(text)
    return "'" + text.replace("'", "'\"'\"'") + "'"


def shown(path: str | os.PathLike[str]) -> str:
    """``path`` as a message names it: its text as it is when every character prints and
    it neither starts nor ends with a blank, else as :func:`shell_word` quotes it (the
    ``$'...'`` word bash reads back as it: one line, nothing a terminal obeys; a pasted
    trailing space in quotes, where it can be seen)."""
    text = os.fspath(path)
    return text if _plain(text) else shell_word(text)


def shown_in(message: str, path: str | os.PathLike[str]) -> str:
    """``message`` with each bare mention of ``path`` (a root, or a path under it) in the
    ``$'...'`` word when it holds a character that does not print: for the messages of
    code that names the root as it is. (Not for blanks at its ends: the single quotes
    of a word in the message hold the bare text too.)"""
    text = os.fspath(path)
    return message if text.isprintable() else message.replace(text, _quoted(text))


_COMMAND = re.compile(r"`(substrat [^`\n]*)`")
"""A command in a message, between backquotes."""


def rooted(message: str, root_word: str) -> str:
    """``message`` with ``--root ROOT_WORD`` added to each `` `substrat ...` `` command in
    it that names no root (``demo`` picks its own). ``root_word`` is the root as the
    shell reads it (:func:`shell_word`), escaped for where the message goes."""

    def add(match: re.Match[str]) -> str:
        command = match[1]
        if "--root" in command or command.startswith("substrat demo"):
            return match[0]
        return f"`{command} --root {root_word}`"

    return _COMMAND.sub(add, message)


def _plain(text: str) -> bool:
    return text.isprintable() and text.strip() == text


def _quoted(text: str) -> str:
    out = []
    for char in text:
        code = ord(char)
        if char in _NAMED:
            out.append(_NAMED[char])
        elif char.isprintable():
            out.append(char)
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that is no UTF-8 (os.fsdecode's escape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x80:
            out.append(f"\\x{code:02x}")  # bash reads \xHH as one byte: UTF-8 only below 0x80
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "$'" + "".join(out) + "'"
