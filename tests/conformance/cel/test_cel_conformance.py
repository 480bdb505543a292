"""CEL conformance: every case of the cel-spec sample in data/cel-cases.json.

Each case is compiled and evaluated with no variables; the result must equal
the expected value *with its type* (int, uint, double and bool are distinct),
or, for ``error: true`` cases, compiling or evaluating must raise CELError.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from eventbus import cel

_CASES = json.loads((Path(__file__).parent / "data" / "cel-cases.json").read_text("utf-8"))


def _expected(case: dict[str, Any]) -> Any:
    value = case["value"]
    if case.get("special_float"):
        return float(value)
    if case.get("uint"):
        return cel.UInt(value)
    return value


def _same(actual: Any, expected: Any) -> bool:
    """Equality that also requires the same CEL type at every level."""
    if type(expected) is float:
        if type(actual) is not float:
            return False
        if math.isnan(expected):
            return math.isnan(actual)
        return actual == expected and math.copysign(1, actual) == math.copysign(1, expected)
    if type(expected) is list:
        return (
            type(actual) is list
            and len(actual) == len(expected)
            and all(_same(a, e) for a, e in zip(actual, expected, strict=True))
        )
    if type(expected) is dict:
        return (
            type(actual) is dict
            and actual.keys() == expected.keys()
            and all(_same(actual[k], v) for k, v in expected.items())
        )
    return type(actual) is type(expected) and actual == expected


@pytest.mark.parametrize(
    "case", _CASES, ids=[f"{c['file']}/{c['section']}/{c['name']}" for c in _CASES]
)
def test_conformance(case: dict[str, Any]) -> None:
    if case.get("error"):
        with pytest.raises(cel.CELError):
            cel.compile(case["expr"]).evaluate({})
        return
    actual = cel.compile(case["expr"]).evaluate({})
    expected = _expected(case)
    assert _same(actual, expected), f"{case['expr']!r}: got {actual!r}, want {expected!r}"


def test_case_count() -> None:
    assert len(_CASES) == 644
