"""What a turn's prompt must be, checked the same way by the library and the CLI."""

from __future__ import annotations

from substrat.errors import BadInputError
from substrat.rpc.protocol import check_text

MAX_PROMPT_CHARS = 256 * 1024


def check_prompt(prompt: object, source: str = "the prompt") -> None:
    """Refuse a prompt that is not text, is blank, or is over :data:`MAX_PROMPT_CHARS`.

    BadInputError (a ValueError) says what was wrong and that nothing was sent: a
    blank prompt would be logged and answered as a turn the caller never meant. A
    lone surrogate (an undecodable byte read with ``surrogateescape``) cannot be
    logged: it is refused here, naming the byte and its place, before the turn
    takes an id, in the words the CLI and the daemon use for it.
    """
    if not isinstance(prompt, str):
        raise TypeError("prompt must be a string")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise BadInputError(
            f"{source} is longer than {MAX_PROMPT_CHARS} characters, the most one turn takes; "
            "nothing was sent"
        )
    check_text({"prompt": prompt})  # after the length: no 50 MB string is encoded for it
    if not prompt.strip():
        raise BadInputError(f"{source} is empty; nothing was sent (a turn needs a prompt)")


def check_instructions(instructions: object) -> None:
    """Refuse a new root's instructions that are not text or hold a lone surrogate."""
    if not isinstance(instructions, str):
        raise TypeError(f"instructions must be a string, not {type(instructions).__name__}")
    check_text({"instructions": instructions}, "nothing was created")


def check_message_ids(message_ids: object) -> None:
    """Refuse what is not a list of message id strings, before anything is read from it.

    One id passed as a string would be read character by character (nothing
    acknowledged, silently), and a generator would be used up by this check.
    """
    if not isinstance(message_ids, list | tuple) or not all(
        isinstance(m, str) for m in message_ids
    ):
        raise TypeError(
            "message_ids must be a list of message id strings (for one: [message_id]), "
            f"not {message_ids!r:.80}; nothing was acknowledged"
        )
