"""Where a command prints for people: rich, imported only when it changes what is printed.

A command's messages are rich markup (``created [bold]lead[/] ...``). On a terminal
rich draws the styles; into a pipe or a file (a script, a log, every test) it writes
the bare text, and importing rich for that was a quarter of a command's CPU (about
22 ms of 80-110, docs/benchmarks.md). :class:`Output` writes such a line itself when
rich's output would be exactly that text, and hands everything else to rich: tables
and other renderables, a terminal (or ``FORCE_COLOR``/``TTY_COMPATIBLE``, which make
rich treat a pipe as one), and a line rich would change or refuse (an emoji code, a
tab, blanks at a line's end, markup it does not parse). tests/unit/test_cli_output.py
holds each rule against rich itself.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
from typing import TYPE_CHECKING, Any

from substrat.shellword import rooted

if TYPE_CHECKING:
    from rich.console import Console

EXIT_CLOSED_STDOUT = 141

# rich.markup's grammar: a tag is "[" + a letter, "#", "/" or "@" + anything up to "]"
# without another "["; backslashes before it escape it in pairs.
_TAG = re.compile(r"(\\*)\[([a-z#/@][^[]*?)]")
_ESCAPABLE = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")
_SIMPLE_STYLE = re.compile(r"[a-z]+(?: [a-z]+)*")
"""The tags this writer takes (``bold``, ``dim``, ``bold red``): any other (a colour by
number, a link, ``@click``) goes to rich, which judges it."""
_EMOJI_CODE = re.compile(r":(\S*?)(?:-(?:emoji|text))?:")
"""rich replaces ``:name:`` by its emoji when the name is one of its codes."""
_NUMBER = re.compile(r"[0-9]+")
NUMBERED_EMOJI = frozenset({"100", "1234"})
"""rich's emoji codes made of digits only: ``:55:`` in a time (``13:22:55``) is none of
them, so it is known as no emoji without loading rich's table of ~3,600 codes."""
_STRIPPED = dict.fromkeys((7, 8, 11, 12, 13))
"""The control characters rich's Text drops (bell, backspace, vertical tab, form feed,
carriage return)."""
_BLANK_END = re.compile(r"\s+$")


def leave_quietly() -> None:
    """Exit 141 with no message once standard output's reader has gone (the recipe of
    Python's signal docs: what is still buffered goes to /dev/null, not to a traceback
    at exit)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(EXIT_CLOSED_STDOUT)


def escape(text: str) -> str:
    """``text`` made literal in markup, as ``rich.markup.escape`` does: a backslash
    before each tag-like ``[...]`` (and its own backslashes doubled), and one more after
    a single trailing backslash, which would otherwise escape what follows."""
    escaped = _ESCAPABLE.sub(lambda m: f"{m[1]}{m[1]}\\{m[2]}", text)
    if escaped.endswith("\\") and not escaped.endswith("\\\\"):
        escaped += "\\"
    return escaped


def plain_text(markup: str) -> str | None:
    """What rich prints for ``markup`` where it draws no styles (soft wrap, no
    highlighting), or None where only rich can tell."""
    if "[" not in markup:
        pieces = [markup]
    else:
        pieces = []
        opened: list[str] = []
        position = 0
        for match in _TAG.finditer(markup):
            backslashes, tag = match[1], match[2]
            start, end = match.span()
            if start > position:
                pieces.append(markup[position:start].replace("\\[", "["))
            pairs, escaped = divmod(len(backslashes), 2)
            position = end
            if pairs:
                pieces.append("\\" * pairs)
            if escaped:  # "\[bold]" is the text "[bold]"
                pieces.append(match[0][len(backslashes) :])
                continue
            closes = tag.startswith("/")
            name = tag[1:].strip() if closes else tag.strip()
            if name and _SIMPLE_STYLE.fullmatch(name) is None:
                return None
            if not closes:
                opened.append(name)
            elif not name and opened:
                opened.pop()
            elif name in opened:
                del opened[len(opened) - 1 - opened[::-1].index(name)]
            else:  # rich raises MarkupError: let it
                return None
        if position < len(markup):
            pieces.append(markup[position:].replace("\\[", "["))
    if any(_may_be_emoji(piece) for piece in pieces):
        return None
    text = "".join(pieces).translate(_STRIPPED)
    if "\t" in text or any(_BLANK_END.search(line) for line in text.split("\n")):
        return None  # rich expands tabs and may cut blanks at a line's end
    return text


def _may_be_emoji(text: str) -> bool:
    codes = [m[1].lower() for m in _EMOJI_CODE.finditer(text)]
    unsure = [code for code in codes if not _NUMBER.fullmatch(code) or code in NUMBERED_EMOJI]
    if not unsure:
        return False
    from rich._emoji_codes import EMOJI

    return any(code in EMOJI for code in unsure)


def is_terminal(stream: Any) -> bool:
    """Whether rich takes ``stream`` for a terminal, by the environment variables rich
    reads first (``TTY_COMPATIBLE``, then ``FORCE_COLOR``) and then ``isatty``."""
    compatible = os.environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "1"
    force = os.environ.get("FORCE_COLOR")
    if force is not None:
        return force != ""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Output:
    """Standard output (or error) for people: ``print`` takes what rich's Console does.

    A single markup string into a stream that is no terminal is written here when
    :func:`plain_text` knows rich's result; anything else, and every other attribute
    (``width``, ``status``), is rich's Console's, made on first use.
    """

    def __init__(self, stderr: bool = False, root_word: str | None = None) -> None:
        self.stderr = stderr
        self._console: Console | None = None
        self._root_word = None if root_word is None else escape(root_word)
        """The root a command named in the output is to act on (None: the default root
        does; see :func:`substrat.shellword.rooted`), escaped for markup."""

    @property
    def file(self) -> Any:
        # rich's choice: while a spinner runs, sys.stdout is its proxy of the real one
        file = sys.stderr if self.stderr else sys.stdout
        return getattr(file, "rich_proxied_file", file)

    @property
    def console(self) -> Console:
        if self._console is None:
            self._console = _console_class()(stderr=self.stderr, highlight=False, soft_wrap=True)
        return self._console

    @property
    def is_terminal(self) -> bool:
        # rich's own answer where it may differ from this one's (an IDLE shell)
        return is_terminal(self.file) and self.console.is_terminal

    def print(self, *objects: Any, **options: Any) -> None:
        if self._root_word is not None:
            word = self._root_word
            objects = tuple(rooted(o, word) if isinstance(o, str) else o for o in objects)
        if len(objects) == 1 and not options and isinstance(objects[0], str):
            file = self.file
            if file is None:  # started with the descriptor closed (`2>&-`): rich writes nowhere
                return
            text = None if is_terminal(file) else plain_text(objects[0])
            if text is not None:
                _write(file, text + "\n")
                return
        self.console.print(*objects, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


def _write(file: Any, text: str) -> None:
    """Write and flush as rich does: a closed output exits 141, an encoding error says
    how to set one."""
    try:
        try:
            file.write(text)
        except UnicodeEncodeError as error:
            error.reason = (
                f"{error.reason}\n*** You may need to add PYTHONIOENCODING=utf-8 "
                "to your environment ***"
            )
            raise
        file.flush()
    except BrokenPipeError:
        leave_quietly()


@functools.cache
def _console_class() -> type[Console]:
    """rich's Console, but a closed output exits 141 as every command does (rich's own
    exits 1, which reads as a failure)."""
    from rich.console import Console

    class QuietOnClosedPipe(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            leave_quietly()

    return QuietOnClosedPipe
