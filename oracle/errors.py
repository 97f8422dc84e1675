"""The oracle's one exception: a recovered state that breaks a durability rule."""

from __future__ import annotations


class OracleViolation(AssertionError):
    """Recovery lost, duplicated or invented something; the message shows the diff.

    ``trace`` holds the operations leading up to the crash (the last one is the
    one in flight), so a failure reads as a reproduction.
    """

    def __init__(self, message: str, *, trace: list[str] | None = None) -> None:
        self.trace = list(trace or [])
        text = message
        if self.trace:
            text += "\n\noperation trace (oldest first):\n  " + "\n  ".join(self.trace)
        super().__init__(text)


class MutantError(Exception):
    """A planted bug cannot be planted: its snippet is missing or ambiguous.

    The code a mutant targets has changed; update the mutant's ``old`` snippet
    in ``oracle/mutant_catalog.py`` to the new code (it must occur exactly once).
    """
