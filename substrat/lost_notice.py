"""The notice an agent gets at its next turn when a turn of its was lost in a crash.

The notice is prepended to the prompt of the agent's next turn, and logged with it
(``turn.start``): the agent reads it, and a crash during *that* turn makes its
logged prompt, notice and all, the prompt of the next lost turn. So the notice is
one line (``repr`` escapes the prompts' newlines) that :func:`split_notice` can
take off again: a report shows the user's own prompt, and the next notice lists
every turn lost in a row, flat (oldest first), instead of wrapping the last notice.
"""

from __future__ import annotations

import ast
import re
from typing import Any

NOTICE_PROMPT_CHARS = 200
"""How much of a lost prompt a notice quotes."""
MAX_LISTED = 5
"""Turns one notice lists (the newest): a crash loop must not grow prompts without end."""

_PREFIX = "[substrat: the daemon restarted. "
_ITEM = re.compile(r"\b(t\d+) \(prompt: ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\)")
_EARLIER = "and turns before them"

LostTurn = tuple[str, str]
"""(turn id, prompt as the user wrote it)."""


def split_notice(prompt: str) -> tuple[list[LostTurn], bool, str]:
    """``(turns a leading notice names, whether it said there were more, the rest)``.

    A prompt that does not start with a notice comes back whole, with no turns.
    """
    line, newline, rest = prompt.partition("\n")
    if not (newline and line.startswith(_PREFIX) and line.endswith("]")):
        return [], False, prompt
    turns: list[LostTurn] = []
    for match in _ITEM.finditer(line):
        try:
            quoted = ast.literal_eval(match.group(2))
        except (ValueError, SyntaxError):
            return [], False, prompt
        turns.append((match.group(1), str(quoted)))
    if not turns:
        return [], False, prompt
    turns.sort(key=lambda turn: int(turn[0][1:]))  # a doubtful turn's notice names it first
    return turns, _EARLIER in line, rest


def user_prompt(prompt: str) -> str:
    """The prompt without substrat's own leading notice: what the user (or sender) wrote."""
    return split_notice(prompt)[2]


def lost_turn_notice(lost: dict[str, Any]) -> str:
    """The note prepended to an agent's first prompt after it lost a turn (or turns)."""
    earlier, more, own = split_notice(str(lost.get("prompt", "")))
    turns = [*earlier, (str(lost.get("turn_id")), own)]
    if len(turns) > MAX_LISTED:
        turns, more = turns[-MAX_LISTED:], True
    listed = [f"{turn_id} (prompt: {_quote(text)!r})" for turn_id, text in turns]
    if lost.get("record_damaged"):  # its end may be the damaged line: nothing is certain
        before = ""
        if len(listed) > 1:
            one = len(listed) == 2 and not more
            before = (
                f" {_turns(listed[:-1], more)} before it {'was' if one else 'were'} lost in "
                f"flight: none of {'its' if one else 'their'} tool calls took effect."
            )
        return (
            f"{_PREFIX}Your turn {listed[-1]} has no intact record of how it ended: a damaged "
            "log line follows its start, so it may have completed and some of its tool calls "
            f"may have taken effect. Check before repeating them.{before}]\n"
        )
    if len(listed) == 1 and not more:
        return (
            f"{_PREFIX}Your turn {listed[0]} was lost in flight: none of its tool calls took "
            "effect.]\n"
        )
    return (
        f"{_PREFIX}{_turns(listed, more)} were lost in flight, one after the other (the "
        "daemon restarted after each): none of their tool calls took effect.]\n"
    )


def _quote(text: str) -> str:
    return text[:NOTICE_PROMPT_CHARS] + "..." if len(text) > NOTICE_PROMPT_CHARS else text


def _turns(items: list[str], more: bool) -> str:
    """ "Your turn A", "Your turns A and B", "Your turns A, B and C (and turns before them)"."""
    if len(items) == 1 and not more:
        return f"Your turn {items[0]}"
    text = items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    return f"Your turns {text} ({_EARLIER})" if more else f"Your turns {text}"
