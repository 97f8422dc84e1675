"""How the CLI and the RPC name agents: id prefixes, and the errors for a bad reference.

An agent is named by its path of names or its id; ``list`` and ``tree`` print
8 characters of each id, and any unambiguous prefix of 4 or more works, as
with ``git``. What a reference that names nothing or several agents is told
lives here, beside the limits it cites.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from substrat.errors import AmbiguousAgentError

MIN_ID_PREFIX_CHARS = 4
"""The shortest id prefix taken for an agent id (``git`` takes 4 too)."""
SHORT_ID_CHARS = 8
"""How many characters of an id ``list`` and ``tree`` show."""
_HEX = re.compile(r"[0-9a-f]+")


def id_prefix_matches(ref: str, ids: Iterable[str]) -> list[str]:
    """The ids ``ref`` is a prefix of (none when ``ref`` is too short to be one)."""
    if len(ref) < MIN_ID_PREFIX_CHARS or not _HEX.fullmatch(ref):
        return []
    return sorted(i for i in ids if i.startswith(ref))


def too_short_note(ref: str) -> str:
    """``"; an id prefix needs at least 4 characters"`` for a reference of 1 to 3 hex
    characters (meant as an id prefix, likely), else ``""``."""
    if len(ref) < MIN_ID_PREFIX_CHARS and _HEX.fullmatch(ref):
        return f"; an id prefix needs at least {MIN_ID_PREFIX_CHARS} characters"
    return ""


def ambiguous(ref: str, candidates: dict[str, str], why: str = "") -> AmbiguousAgentError:
    """The error for a reference that names several agents: ``{agent_id: path}``.

    ``why`` says how it names them; by default, as a prefix their ids start with.
    """
    ids = sorted(candidates)
    # Show each id just long enough to tell it from the others.
    common = min(ids, key=len) if ids else ""
    while any(not i.startswith(common) for i in ids):
        common = common[:-1]
    width = max(SHORT_ID_CHARS, len(common) + 1)
    listed = ", ".join(f"{i[:width]} ({candidates[i]})" for i in ids)
    message = why or f"id prefix {ref} is ambiguous: {len(ids)} agents match"
    return AmbiguousAgentError(
        f"{message} ({listed}); give more characters of the id"
    ).with_details(candidates=[{"agent_id": i, "path": candidates[i]} for i in ids])


def did_you_mean(ref: str, names: Iterable[str]) -> str:
    """``"; did you mean X?"`` for names close to ``ref`` (difflib), else ``""``."""
    import difflib  # only for a name that names nothing: not part of every daemon's start

    names = list(names)
    close = difflib.get_close_matches(ref, names, n=3, cutoff=0.6)
    if not close:  # "scout" for "lead/scout": a child's own name is close enough
        close = [n for n in names if n.rsplit("/", 1)[-1] == ref.rsplit("/", 1)[-1]][:3]
    if not close:
        return ""
    return f"; did you mean {' or '.join(close)}?"
