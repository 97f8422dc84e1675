"""What the CLI says when a turn it showed is not committed: never the opposite of the truth."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from substrat.cli.turns import TurnView
from substrat.errors import DaemonDiedError, RpcError


def verdict(exc: BaseException, *, text_shown: bool) -> str:
    err = io.StringIO()
    view = TurnView(Console(file=io.StringIO()), Console(file=err, width=400), "lead")
    view.turn_id = "t2"
    view.text_shown = text_shown
    view.not_committed(exc)
    return " ".join(err.getvalue().split())


@pytest.mark.parametrize(
    ("text_shown", "said"),
    [
        (True, "the text above is not part of lead's conversation"),
        (False, "none of it is part of lead's conversation"),
    ],
)
def test_a_failed_turn_is_never_said_to_be_part_of_the_conversation(
    text_shown: bool, said: str
) -> None:
    assert verdict(RpcError(-32000, "turn failed"), text_shown=text_shown) == (
        f"✗ not committed: {said}"
    )
    died = verdict(DaemonDiedError("gone"), text_shown=text_shown)
    assert died == (
        f"? outcome unknown: the daemon died before confirming turn t2; {said} unless "
        "`substrat log lead` shows turn t2 after the restart"
    )
