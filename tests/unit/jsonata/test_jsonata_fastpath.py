"""The generated fast path of eventbus.jsonata against the closures (``Expression.evaluate`` on
the class always runs them): identical results or identical error codes, over the JSONata
suite's cases and over random expressions of the subset on random documents."""

from __future__ import annotations

import math
import pickle
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from eventbus import jsonata

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "conformance" / "jsonata"))

import _suite


def _identical(a: Any, b: Any) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
                and all(_identical(x, y) for x, y in zip(a, b, strict=True)))  # fmt: skip
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and list(a) == list(b)
                and all(_identical(a[k], b[k]) for k in a))  # fmt: skip
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a is b or a == b)


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except jsonata.JSONataError as exc:
        return "error", exc.code


def _same_outcome(expr: jsonata.Expression, data: Any, *rest: Any) -> tuple[bool, Any, Any]:
    fast = _outcome(expr.evaluate, data, *rest)
    slow = _outcome(jsonata.Expression.evaluate, expr, data, *rest)
    if fast[0] != slow[0]:
        return False, fast, slow
    ok = fast[1] == slow[1] if fast[0] == "error" else _identical(fast[1], slow[1])
    return ok, fast, slow


def test_suite_cases_fast_path_matches_closures() -> None:
    accepted = 0
    mismatches = []
    for name, case in _suite.cases():
        data = case["data"] if "data" in case else _suite._dataset(case.get("dataset"))
        budget = jsonata.Budget(max_depth=case.get("depth", 500), max_steps=10_000_000,
                                max_time_ms=case.get("timelimit", 5000))  # fmt: skip
        try:
            expr = jsonata.compile(case["expr"], track_depth="depth" in case)
        except jsonata.JSONataError:
            continue
        if not expr.fast_path:
            continue
        accepted += 1
        ok, fast, slow = _same_outcome(expr, data, case.get("bindings") or None, budget)
        if not ok:
            mismatches.append(f"{name}: {case['expr']!r}: fast {fast!r}, closures {slow!r}")
    assert not mismatches, "\n".join(mismatches)
    assert accepted >= 150, accepted  # the subset covers a good part of the suite


# -- random expressions of the subset over random documents

_NAMES = ["a", "b", "tags", "n", "s", "Item"]


def _doc(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.3:
        return {k: _doc(rng, depth + 1) for k in rng.sample(_NAMES, rng.randint(0, 4))}
    if depth < 3 and roll < 0.5:
        return [_doc(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return rng.choice([0, 1, 2, -3, 2.5, 1e300, "x", "eu", "A b", "", True, False, None,
                       "12", 10**20])  # fmt: skip


def _literal(rng: random.Random) -> str:
    return rng.choice(["1", "2.5", "0", "-4", "'x'", "'eu'", '"a,b"', "true", "false", "null"])


def _path(rng: random.Random, depth: int) -> str:
    steps = []
    for _ in range(rng.randint(1, 3)):
        step = rng.choice(_NAMES)
        if rng.random() < 0.25:
            pred = rng.choice(["$ != 'eu'", "n > 1", "0", "-1", "$", "a", "n = 2 or s",
                               "$exists(a)", f"{_expr(rng, depth + 1)}"])  # fmt: skip
            step += f"[{pred}]"
        steps.append(step)
    if rng.random() < 0.2:
        steps.append(rng.choice(["$uppercase($)", "$string($)", "$length($)", "$number($)"]))
    return ".".join(steps)


_FUNCS = [("uppercase", 1), ("lowercase", 1), ("string", 1), ("number", 1), ("join", 2),
          ("join", 1), ("length", 1), ("sum", 1), ("count", 1), ("exists", 1),
          ("substring", 2), ("substring", 3), ("contains", 2), ("trim", 1)]  # fmt: skip
_OPS = ["+", "-", "*", "/", "%", "&", "=", "!=", "<", "<=", ">", ">=", "and", "or"]


def _expr(rng: random.Random, depth: int = 0) -> str:
    roll = rng.random() if depth < 4 else rng.random() * 0.5
    if roll < 0.25:
        return _literal(rng)
    if roll < 0.5:
        return _path(rng, depth)
    if roll < 0.55:
        return "$"
    if roll < 0.75:
        return f"({_expr(rng, depth + 1)} {rng.choice(_OPS)} {_expr(rng, depth + 1)})"
    if roll < 0.77:
        return f"-{_expr(rng, depth + 1)}"
    if roll < 0.8:
        other = f" : {_expr(rng, depth + 1)}" if rng.random() < 0.7 else ""
        return f"({_expr(rng, depth + 1)} ? {_expr(rng, depth + 1)}{other})"
    if roll < 0.87:
        return "[" + ", ".join(_expr(rng, depth + 1) for _ in range(rng.randint(0, 3))) + "]"
    if roll < 0.93:
        keys = rng.sample(["k", "j", "name with space", "x"], rng.randint(0, 3))
        return "{" + ", ".join(f'"{k}": {_expr(rng, depth + 1)}' for k in keys) + "}"
    name, arity = rng.choice(_FUNCS)
    return f"${name}(" + ", ".join(_expr(rng, depth + 1) for _ in range(arity)) + ")"


def test_random_expressions_fast_path_matches_closures() -> None:
    rng = random.Random(41)
    docs = [_doc(rng) for _ in range(40)] + [{k: _doc(rng, 1) for k in _NAMES} for _ in range(40)]
    accepted = 0
    mismatches = []
    for _ in range(1500):
        source = _expr(rng)
        try:
            expr = jsonata.compile(source)
        except jsonata.JSONataError:
            continue
        if not expr.fast_path:
            continue
        accepted += 1
        for data in rng.sample(docs, 6):
            ok, fast, slow = _same_outcome(expr, data)
            if not ok:
                mismatches.append(f"{source!r} on {data!r}: fast {fast!r}, closures {slow!r}")
    assert not mismatches, "\n".join(mismatches[:20])
    assert accepted >= 1000, accepted


_SHAPES: list[Any] = [
    {},
    {"data": None},
    {"data": []},
    {"data": "s"},
    {"data": {}},
    {"data": [{"amount": 2, "tags": ["x"]}, {"amount": 3.5, "tags": "eu"}]},
    {"data": {"amount": True, "quantity": 2, "tags": [1, "eu", None]}},
    {"data": {"amount": 1e308, "quantity": 10, "tags": ["eu", ["a", "b"], {"k": "v"}]}},
    {"data": {"amount": 2**62, "quantity": 4, "tags": "single"}},
    {"data": {"amount": float("nan"), "quantity": "3", "tags": ["eu"]}},
    {"data": {"amount": "7", "customer": ["a"], "tags": ["b", "eu", "c"]}, "id": 5, "type": 1},
    {"data": {"amount": 1.5, "quantity": 2, "customer": {"n": 1}, "tags": []}, "source": None},
    {"data": {"tags": ["eu", "eu"]}, "id": "x", "source": "s", "type": "t"},
    ["not", "an", "object"],
    "text",
]


@pytest.mark.parametrize("name", ["jsonata_path", "jsonata_event", "jsonata_map_filter"])
def test_benchmark_expressions_match_the_closures_on_odd_shapes(name: str) -> None:
    """The benchmark's expressions (whose generated code has the most specialised forms: the
    subscripts, a filter fused with the call after it, literal constants) on inputs of every
    shape those forms leave to a fallback: missing keys, arrays on the way, non-strings
    among the strings, overflow, non-finite numbers, bindings."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    from expressions import EVENT, JSONATA_CASES

    source = next(s for n, s, _ in JSONATA_CASES if n == name)
    expr = jsonata.compile(source)
    assert expr.fast_path
    mismatches = []
    for data in [EVENT, *_SHAPES]:
        for bindings in (None, {"x": 1}):
            ok, fast, slow = _same_outcome(expr, data, bindings)
            if not ok:
                mismatches.append(f"{data!r} {bindings}: fast {fast!r}, closures {slow!r}")
    assert not mismatches, "\n".join(mismatches)


def test_literal_constants_never_fold() -> None:
    """Literals become constants of the generated code; operations on two literals keep
    them as names, so nothing is folded at compile time into a value the patch misses."""
    for source in ['"a" & "b"', "1 + 2", "2 * 3.5", '"x" = "x"', "-(1)", '{"k": "v" & "w"}',
                   '$join(["a", "b"], "-")', "'eu' != 'eu'"]:  # fmt: skip
        expr = jsonata.compile(source)
        assert expr.fast_path, source
        assert _same_outcome(expr, {"a": 1})[0], source


# -- the subset's edges


@pytest.mark.parametrize(
    ("source", "fast"),
    [
        ("data.amount * 7.1", True),
        ("data.tags[$ != 'eu'].$uppercase($)", True),
        ('{"a": $join(data.tags, ",")}', True),
        ("data.items^(price)", False),  # a sort
        ("$x := 1", False),
        ("data.{'k': v}", False),  # a grouping step
        ("$map(data.tags, function($t) { $t })", False),
        ("data.items#$i.price", False),
    ],
)
def test_which_expressions_take_the_fast_path(source: str, fast: bool) -> None:
    assert jsonata.compile(source).fast_path is fast


def test_no_expression_text_in_the_generated_source() -> None:
    hostile = "'); import os; os.system(1); ('"
    expr = jsonata.compile(f'{{"{hostile}": `{hostile}` & "{hostile}"}}')
    assert expr.fast_path
    source = expr.evaluate.__doc__ or ""
    assert "import os" not in source and "system" not in source
    assert expr.evaluate({hostile: "v"}) == {hostile: "v" + hostile}


def test_output_budget_holds_on_the_fast_path() -> None:
    expr = jsonata.compile("s & s & s")
    assert expr.fast_path
    with pytest.raises(jsonata.JSONataError) as err:
        expr.evaluate({"s": "x" * 400}, None, jsonata.Budget(max_length=1000))
    assert err.value.code == "U1003"
    join = jsonata.compile('$join(tags, "-----")')
    with pytest.raises(jsonata.JSONataError) as err:
        join.evaluate({"tags": ["x"] * 300}, None, jsonata.Budget(max_length=1000))
    assert err.value.code == "U1003"


def test_step_budget_holds_on_the_fast_path() -> None:
    expr = jsonata.compile("items[n > 1].n")
    assert expr.fast_path
    data = {"items": [{"n": i} for i in range(5000)]}
    assert len(expr.evaluate(data)) == 4998
    with pytest.raises(jsonata.JSONataError) as err:
        expr.evaluate(data, None, jsonata.Budget(max_steps=1000))
    assert err.value.code == "U1001"


def test_bindings_and_array_inputs_run_the_closures() -> None:
    expr = jsonata.compile("a + 1")
    assert expr.evaluate({"a": 1}, {"a": 5}) == 2
    assert jsonata.compile("$.a").evaluate([{"a": 1}, {"a": 2}]) == [1, 2]
    assert expr.evaluate([{"a": 1}]) == 2


def test_fast_expression_pickles() -> None:
    expr = pickle.loads(pickle.dumps(jsonata.compile("data.tags[$ != 'eu'].$uppercase($)")))
    assert expr.fast_path
    assert expr.evaluate({"data": {"tags": ["eu", "de"]}}) == "DE"


def test_large_and_deep_expressions_run_the_closures() -> None:
    wide = jsonata.compile("[" + ", ".join(["a"] * 3000) + "]")
    assert not wide.fast_path
    assert wide.evaluate({"a": 1}) == [1] * 3000
    deep = jsonata.compile(" and ".join(f"(a = {i} or" for i in range(60)) + " true" + ")" * 60)
    assert not deep.fast_path
    assert deep.evaluate({"a": 0}) is True
    blocks = jsonata.compile("a.b" + "[c.d" * 12 + " = 1" + "]" * 12)  # > 20 nested loops
    assert not blocks.fast_path
    assert blocks.evaluate({"a": {"b": 1}}) is jsonata.UNDEFINED
    nested = jsonata.compile("a" + "[b" * 30 + "]" * 30)
    assert not nested.fast_path
    assert nested.evaluate({"a": {"b": True}}) is jsonata.UNDEFINED  # b[b] on true: nothing
