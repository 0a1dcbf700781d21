"""SamplingParams validates itself: each bad value names its field and the value."""

from __future__ import annotations

import pytest

from deepinfer import SamplingParams

BAD = [
    ("temperature", -0.5),
    ("temperature", float("nan")),
    ("temperature", float("inf")),
    ("temperature", "hot"),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_k", -2),
    ("top_k", 2.5),
    ("min_p", -0.1),
    ("min_p", 1.01),
    ("max_tokens", 0),
    ("max_tokens", 3.0),
    ("max_tokens", True),
    ("seed", 1.5),
    ("stop", ""),
    ("stop", [1, 2]),
    ("stop", 5),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", ["a"]),
]


@pytest.mark.parametrize("field, value", BAD)
def test_bad_values_name_field_and_value(field, value):
    with pytest.raises(
        ValueError, match=rf"SamplingParams\.{field} .*got {__import__('re').escape(repr(value))}"
    ):
        SamplingParams(**{field: value})


def test_defaults_and_normalisation():
    p = SamplingParams()
    assert p.max_tokens == 16 and p.temperature == 1.0 and p.top_k == 0 and p.stop == []
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(temperature=0).greedy and SamplingParams(top_k=1).greedy
    assert not SamplingParams(temperature=0.7).greedy
    assert SamplingParams(max_tokens=None).max_tokens is None
