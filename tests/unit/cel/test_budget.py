"""The evaluation budget: comprehension iterations and produced size, checked at run time."""

from __future__ import annotations

import pickle
import re
import time

import pytest

from eventbus import cel
from eventbus.cel._codegen import needs_budget
from eventbus.cel._parser import parse

BIG = "x" * 110_000  # ~110 KB of input
ITEMS = list(range(1000))


def _fails_fast(prog: cel.Program, variables: dict[str, object]) -> str:
    start = time.perf_counter()
    with pytest.raises(cel.CELError) as info:
        prog.evaluate(variables)
    assert time.perf_counter() - start < 1.0
    assert info.value.column is None
    return info.value.message


def test_map_join_of_a_large_string_is_over_budget() -> None:
    # Before: 110 KB of input became a 110 MB string.
    prog = cel.compile("items.map(i, data.s).join('')")
    message = _fails_fast(prog, {"items": ITEMS, "data": {"s": BIG}})
    assert message == (
        "CEL evaluation exceeded its budget of 10,000,000 characters, bytes or elements "
        "produced (reached 110,000,000); build smaller strings and lists, or raise "
        "max_output_size in cel.compile()"
    )
    assert prog.evaluate({"items": [1, 2], "data": {"s": "ab"}}) == "abab"


def test_concatenation_in_a_comprehension_is_charged() -> None:
    prog = cel.compile("items.map(i, data.s + '!').size()")
    message = _fails_fast(prog, {"items": ITEMS, "data": {"s": BIG}})
    assert "budget of 10,000,000 characters, bytes or elements" in message
    assert prog.evaluate({"items": ITEMS, "data": {"s": "ab"}}) == 1000


def test_nested_comprehensions_are_over_the_iteration_budget() -> None:
    prog = cel.compile("a.all(x, a.all(y, a.all(z, true)))")
    message = _fails_fast(prog, {"a": list(range(200))})
    assert re.fullmatch(
        r"CEL evaluation exceeded its budget of 1,000,000 comprehension iterations "
        r"\(reached [\d,]+\); iterate over smaller lists or maps, or raise max_iterations "
        r"in cel.compile\(\)",
        message,
    )
    assert prog.evaluate({"a": list(range(50))}) is True


@pytest.mark.parametrize(
    "source",
    [
        "a.map(x, a.map(y, a.map(z, 1))).size() > 0 || true",
        "true || a.map(x, a.map(y, a.map(z, 1))).size() > 0 && false",
        "[1, 2].exists(k, a.map(x, a.map(y, a.map(z, 1))).size() > 0) || true",
        "a.exists(x, a.exists(y, a.exists(z, z < 0)))",
    ],
)
def test_over_budget_is_not_absorbed_by_cel_error_handling(source: str) -> None:
    prog = cel.compile(source)
    if source.startswith("true ||"):
        # short-circuit: the comprehension never runs
        assert prog.evaluate({"a": list(range(200))}) is True
        return
    message = _fails_fast(prog, {"a": list(range(200))})
    assert "comprehension iterations" in message


def test_limits_are_parameters_of_compile_and_survive_pickling() -> None:
    prog = cel.compile("xs.map(x, s).join('')", max_output_size=1000, max_iterations=50)
    assert prog.evaluate({"xs": list(range(10)), "s": "ab"}) == "ab" * 10
    assert "budget of 1,000 characters" in _fails_fast(prog, {"xs": list(range(40)), "s": "a" * 30})
    assert "budget of 50 comprehension" in _fails_fast(prog, {"xs": list(range(51)), "s": ""})
    again = pickle.loads(pickle.dumps(prog))
    assert (again.max_iterations, again.max_output_size) == (50, 1000)
    assert "budget of 50 comprehension" in _fails_fast(again, {"xs": list(range(51)), "s": ""})
    with pytest.raises(ValueError, match="max_iterations must be a non-negative int; got -1"):
        cel.compile("1", max_iterations=-1)


@pytest.mark.parametrize(
    ("source", "variables"),
    [
        ("data.s.replace('', data.t)", {"data": {"s": "a" * 10_000, "t": "b" * 10_000}}),
        ("data.t.format([1.0])", {"data": {"t": "%.100000000f"}}),
        ("'%s'.format([items.map(i, data.s)])", {"items": ITEMS, "data": {"s": BIG}}),
        ("data.s.split('').map(c, data.s).join('')", {"data": {"s": "a" * 10_000}}),
        (
            "cel.bind(a, s + s, cel.bind(b, a + a, cel.bind(c, b + b, cel.bind(d, c + c, "
            "cel.bind(e, d + d, cel.bind(f, e + e, cel.bind(g, f + f, g + g)))))))",
            {"s": BIG},
        ),
    ],
)
def test_growth_functions_reserve_before_building(source: str, variables: dict) -> None:
    message = _fails_fast(cel.compile(source), variables)
    assert "characters, bytes or elements produced" in message


def test_filter_step_expressions_pay_nothing() -> None:
    for source in (
        "type == 'payment.created' && data.amount > 100 && data.currency in ['CNY', 'USD']",
        "data.currency + ':' + string(data.quantity)",
        "data.amount * 7.1",
        "data.s.matches('^a+$') && size(data.s) < 10",
    ):
        assert not needs_budget(parse(source)), source
    for source in ("xs.map(x, x)", "cel.bind(a, 1, a)", "xs.join(',')", "s.replace('a', 'b')"):
        assert needs_budget(parse(source)), source


@pytest.mark.parametrize(
    ("source", "size"),
    [
        ("'%.100000000f'.format([1.0])", None),  # 100 MB if folded
        ("'ab'.replace('', '" + "x" * 40_000 + "')", None),  # 120 KB, over the fold limit
        ("'ab'.replace('', 'xy')", 8),  # small: folded
    ],
)
def test_constant_folding_does_not_build_large_values(source: str, size: int | None) -> None:
    start = time.perf_counter()
    prog = cel.compile(source)
    assert time.perf_counter() - start < 1.0
    if size is None:
        if "format" in source:
            assert "characters, bytes or elements produced" in _fails_fast(prog, {})
        else:
            assert len(prog.evaluate({})) == 2 + 3 * 40_000
    else:
        assert prog.evaluate({}) == "xyaxybxy"
