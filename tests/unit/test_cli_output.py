"""substrat.cli.output prints a line without rich only where rich would print the same.

Each rule is held against the installed rich: whatever markup text is drawn, the
plain writer's text is rich's own output off a terminal, or it declines (None) and
rich prints.
"""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich._emoji_codes import EMOJI
from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape as rich_escape

from substrat.cli import output
from substrat.cli.common import esc
from substrat.cli.output import NUMBERED_EMOJI, Output, escape, plain_text

# The characters rich's markup, emoji codes, tab and blank rules turn on, and a few others.
MARKUP_TEXT = st.text(
    alphabet=st.sampled_from(list("[]/\\:@#=-_ abdelorstx19\t\r\n\x07\x1b\xa0é✓")), max_size=40
)
TAGS = st.sampled_from(["[bold]", "[/]", "[/bold]", "[red]", "[bold red]", "[/red]", "[dim]"])
MARKUP = st.lists(st.one_of(MARKUP_TEXT, TAGS, st.sampled_from([":smile:", "12:30:45"]))).map(
    "".join
)


def rich_prints(markup: str, width: int) -> str:
    """What the commands' Console prints for ``markup`` into a file (no terminal)."""
    file = io.StringIO()
    console = Console(file=file, highlight=False, soft_wrap=True, width=width, _environ={})
    console.print(markup)
    return file.getvalue()


@settings(max_examples=400, deadline=None)
@given(MARKUP, st.sampled_from([4, 80]))
@example("created [bold]lead[/] (4f2a) with scripted/directives", 80)
@example("a \\[bold] b \\\\[bold]c[/] \\\\\\[x] d\\[1]", 80)
@example("[bold]x[/bold] [/]", 80)
@example("since 2026-11-28T13:22:55 :100: done", 80)
def test_the_plain_text_is_what_rich_prints_or_nothing(markup: str, width: int) -> None:
    try:
        expected = rich_prints(markup, width)
    except MarkupError:
        assert plain_text(markup) is None
        return
    text = plain_text(markup)
    assert text is None or text + "\n" == expected


@settings(max_examples=300, deadline=None)
@given(MARKUP_TEXT)
@example("a [bold] \\[x] \\")
@example("ends in two \\\\")
def test_escape_is_riches_and_escaped_text_prints_as_itself(text: str) -> None:
    assert escape(text) == rich_escape(text)
    printed = plain_text(f"[bold]{esc(text)}[/]")
    assert printed is None or printed + "\n" == rich_prints(f"[bold]{esc(text)}[/]", 80)


def test_the_lines_commands_print_need_no_rich() -> None:
    # the commands' common lines: no emoji, tab or blank end, so no rich to print them
    for markup in (
        "created [bold]lead[/] (4f2a9c1e) with scripted/directives",
        "[green]✓[/] [dim]turn t3 committed · sent 1 message[/]",
        f"[bold red]error:[/] {esc('no agent [x]; `substrat agent list --all` shows every agent')}",
        "[green]running[/] [bold]pid 42[/] on /r",
        "  up 3.2s since 2026-11-28T13:22:55.123+00:00 (v0.1.0)",
    ):
        assert plain_text(markup) == rich_prints(markup, 80)[:-1], markup


def test_numbered_emoji_are_riches() -> None:
    # Only these codes made of digits are looked up in rich's table (a time's ":55:" is not)
    assert {code for code in EMOJI if re.fullmatch(r"[0-9]+", code)} == NUMBERED_EMOJI
    assert plain_text(":100:") is None and plain_text("at 13:22:55") == "at 13:22:55"


def test_a_terminal_or_forced_colour_goes_to_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    printed: list[str] = []

    class Recording:
        is_terminal = True

        def print(self, *objects: object) -> None:
            printed.append(str(objects[0]))

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Output()
    out._console = Recording()  # type: ignore[assignment]
    for name in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    out.print("[bold]a[/]")
    assert printed == [] and out.is_terminal is False
    for name, value in (("FORCE_COLOR", "1"), ("TTY_COMPATIBLE", "1")):
        with monkeypatch.context() as patch:
            patch.setenv(name, value)
            out.print("[bold]b[/]")
    monkeypatch.setattr("sys.stdout", Tty())
    out.print("[bold]c[/]")
    monkeypatch.setenv("TTY_COMPATIBLE", "0")  # rich: no terminal, whatever isatty says
    out.print("[bold]d[/]")
    assert printed == ["[bold]b[/]", "[bold]b[/]", "[bold]c[/]"]


def test_a_closed_output_exits_141_as_riches_does(monkeypatch: pytest.MonkeyPatch) -> None:
    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    monkeypatch.setattr("sys.stdout", Closed())
    monkeypatch.setattr(output.os, "dup2", lambda fd, to: None)
    with pytest.raises(SystemExit) as exited:
        Output().print("line")
    assert exited.value.code == 141


def test_a_stream_closed_at_start_gets_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `substrat ... 2>&-`: Python's sys.stderr is None; rich writes nowhere, and so does this
    monkeypatch.setattr("sys.stderr", None)
    Output(stderr=True).print("[bold red]error:[/] no root")
