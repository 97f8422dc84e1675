"""oracle.model.canonical: one string per transcript, equal exactly when the transcripts are."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from oracle.model import canonical


def _json_form(transcript: Any) -> str:
    return json.dumps(transcript, sort_keys=True, separators=(",", ":"))


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_transcripts = st.lists(st.dictionaries(st.text(max_size=6), _values, max_size=4), max_size=3)


@given(_transcripts, _transcripts)
def test_two_transcripts_get_one_string_exactly_when_json_gives_them_one(a: Any, b: Any) -> None:
    # json's sorted compact form was the canonical form: what it tells apart stays apart
    # and what it equates stays equated (NaN aside: json writes every NaN the same)
    assert (canonical(a) == canonical(b)) == (_json_form(a) == _json_form(b))


def test_key_order_does_not_matter() -> None:
    assert canonical([{"role": "user", "content": "hé"}]) == canonical(
        [{"content": "hé", "role": "user"}]
    )


def test_values_orjson_writes_alike_stay_apart() -> None:
    # orjson writes NaN and the infinities as null; json does not
    forms = {canonical([{"x": v}]) for v in (None, math.nan, math.inf, -math.inf)}
    assert len(forms) == 4
    assert canonical([{"x": 1}]) != canonical([{"x": 1.0}]) != canonical([{"x": True}])
    assert canonical([{"x": 2**64}]) == _json_form([{"x": 2**64}])  # orjson refuses it
