"""CloudEvents SQL conformance: every case of the CESQL v1 TCK (data/*.yaml, copied from
cloudevents/spec with its license; see data/NOTICE.md).

Each case is compiled; a compile error must be the case's expected ``parse`` or
``missingFunction`` error. Otherwise the expression is evaluated on the case's event (or a
minimal valid event with the case's overrides) in the spec's complete mode: the value must
equal the expected one *with its type* (a Boolean is not an Integer) and the first error
must be the expected kind (none when none is expected). The fail-fast path must agree: the
same value, or the same error kind raised, by the generated code and by the closures.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from eventbus import cesql
from eventbus.cesql._compile import compile_node, share_budget
from eventbus.cesql._parser import parse

_DATA = Path(__file__).parent / "data"
_BASE_EVENT = {"specversion": "1.0", "id": "tck-id", "source": "tck/source", "type": "tck.type"}


def _cases() -> list[Any]:
    out = []
    for path in sorted(_DATA.glob("*.yaml")):
        text = path.read_text("utf-8")
        # the expression as written (YAML would read `expression: TRUE` as a bool)
        raw = yaml.load(text, Loader=yaml.BaseLoader)["tests"]
        for case, as_written in zip(yaml.safe_load(text)["tests"], raw, strict=True):
            case = {**case, "expression": as_written["expression"]}
            out.append(pytest.param(case, id=f"{path.stem}::{as_written['name']}"))
    return out


CASES = _cases()


def _value(v: Any) -> Any:
    # YAML reads 2018-04-26T14:48:09+02:00 as a datetime; CloudEvents carry its string form
    if isinstance(v, datetime.datetime):
        return v.isoformat()
    return v


def _event(case: dict[str, Any]) -> dict[str, Any]:
    event = dict(case["event"]) if "event" in case else dict(_BASE_EVENT)
    event.update(case.get("eventOverrides") or {})
    return {k: _value(v) for k, v in event.items()}


def test_the_tck_is_complete() -> None:
    assert len(CASES) == 275
    assert len(list(_DATA.glob("*.yaml"))) == 18


@pytest.mark.parametrize("case", CASES)
def test_tck_case(case: dict[str, Any]) -> None:
    expected_error = case.get("error")
    try:
        program = cesql.compile(case["expression"])
    except cesql.CESQLError as err:
        assert expected_error == err.kind, f"compile error {err} (kind {err.kind})"
        assert err.line is not None and err.column is not None
        return
    assert expected_error not in ("parse", "missingFunction"), "compiled, expected an error"
    event = _event(case)
    value, errors = program.evaluate(event)
    expected = _value(case["result"])
    assert (value, type(value)) == (expected, type(expected))
    tree = parse(case["expression"])
    share_budget(tree, 10_000_000)
    closure = compile_node(tree)
    if expected_error is None:
        assert errors == []
        assert program.value(event) == expected
        assert closure(event) == expected
    else:
        assert errors and errors[0].kind == expected_error, errors
        for fast in (program.value, closure):
            with pytest.raises(cesql.CESQLError) as info:
                fast(event)
            assert info.value.kind == expected_error
