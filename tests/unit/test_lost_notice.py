"""The lost-turn notice (finding 8 of the s17c outsider review): it never wraps an
earlier notice, lists the turns lost in a row flat, and is bounded in a crash loop."""

from __future__ import annotations

from substrat.lost_notice import MAX_LISTED, lost_turn_notice, split_notice, user_prompt


def test_a_second_notice_lists_both_turns_instead_of_wrapping_the_first() -> None:
    first = lost_turn_notice({"turn_id": "t5", "prompt": "two\nlines"})
    assert first == (
        "[substrat: the daemon restarted. Your turn t5 (prompt: 'two\\nlines') was lost in "
        "flight: none of its tool calls took effect.]\n"
    )
    second = lost_turn_notice({"turn_id": "t6", "prompt": first + 'it\'s "quoted"'})
    assert second.count("[substrat:") == 1 and second.count("\n") == 1
    assert split_notice(second + "next") == (
        [("t5", "two\nlines"), ("t6", 'it\'s "quoted"')],
        False,
        "next",
    )
    assert user_prompt(first + "mine") == "mine"


def test_a_crash_loop_keeps_the_notice_bounded() -> None:
    notice = ""
    for number in range(1, 40):
        notice = lost_turn_notice({"turn_id": f"t{number}", "prompt": notice + "x" * 500})
    turns, more, rest = split_notice(notice + "now")
    assert [t for t, _ in turns] == [f"t{n}" for n in range(40 - MAX_LISTED, 40)]
    assert more and rest == "now"
    assert len(notice) < (MAX_LISTED + 1) * 260


def test_a_doubtful_turn_keeps_its_warning_and_names_the_one_lost_before() -> None:
    first = lost_turn_notice({"turn_id": "t1", "prompt": "a"})
    notice = lost_turn_notice({"turn_id": "t2", "prompt": first + "b", "record_damaged": True})
    assert "Your turn t2 (prompt: 'b') has no intact record" in notice
    assert "Your turn t1 (prompt: 'a') before it was lost in flight" in notice
    assert split_notice(notice + "c")[0] == [("t1", "a"), ("t2", "b")]


def test_a_prompt_that_only_looks_like_a_notice_is_left_whole() -> None:
    for prompt in ("[substrat: the daemon restarted. nothing here]\nhi", "plain", ""):
        assert split_notice(prompt) == ([], False, prompt)
