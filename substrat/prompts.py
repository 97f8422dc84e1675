"""What a turn's prompt must be, checked the same way by the library and the CLI."""

from __future__ import annotations

from substrat.errors import BadInputError

MAX_PROMPT_CHARS = 256 * 1024


def check_prompt(prompt: object, source: str = "the prompt") -> None:
    """Refuse a prompt that is not text, is blank, or is over :data:`MAX_PROMPT_CHARS`.

    BadInputError (a ValueError) says what was wrong and that nothing was sent: a
    blank prompt would be logged and answered as a turn the caller never meant.
    """
    if not isinstance(prompt, str):
        raise TypeError("prompt must be a string")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise BadInputError(
            f"{source} is longer than {MAX_PROMPT_CHARS} characters, the most one turn takes; "
            "nothing was sent"
        )
    if not prompt.strip():
        raise BadInputError(f"{source} is empty; nothing was sent (a turn needs a prompt)")
