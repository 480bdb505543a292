"""The generated fast path, the closures and the complete evaluation agree on random
expressions: the same value, or the same first error kind."""

from __future__ import annotations

import random

import pytest

from eventbus import cesql
from eventbus.cesql._compile import compile_node, share_budget
from eventbus.cesql._parser import parse

ATTRS = {"type": "order.created", "n": "5", "flag": "TRUE", "word": "gold", "num": 7, "yes": True}
LEAVES = ["type", "n", "flag", "word", "num", "yes", "missing", "3", "0", "-2", "'5'", "'gold'",
          "'true'", "TRUE", "FALSE", "''"]  # fmt: skip
PATTERNS = ["'order.%'", "'%d'", "'g_ld'", "'%o%'", "'gold'", "'%'", "'_%_'"]


def _expr(rng: random.Random, depth: int) -> str:
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(LEAVES)
    pick = rng.randrange(9)
    a = _expr(rng, depth - 1)
    if pick == 0:
        return f"NOT {a}"
    if pick == 1:
        return f"-{a}" if not a.startswith("-") else f"- ({a})"
    if pick == 2:
        return f"{a} {rng.choice(['AND', 'OR', 'XOR'])} {_expr(rng, depth - 1)}"
    if pick == 3:
        return f"{a} {rng.choice(['=', '!=', '<>', '<', '<=', '>', '>='])} {_expr(rng, depth - 1)}"
    if pick == 4:
        return f"{a} {rng.choice(['+', '-', '*', '/', '%'])} {_expr(rng, depth - 1)}"
    if pick == 5:
        return f"{a} {rng.choice(['', 'NOT '])}LIKE {rng.choice(PATTERNS)}"
    if pick == 6:
        items = ", ".join(_expr(rng, depth - 1) for _ in range(rng.randint(1, 3)))
        return f"{a} {rng.choice(['', 'NOT '])}IN ({items})"
    if pick == 7:
        fn = rng.choice(["LENGTH", "UPPER", "ABS", "INT", "BOOL", "STRING", "IS_INT", "TRIM"])
        return f"{fn}({a})"
    return f"({a})"


def _outcome(fn: object, attrs: dict[str, object]) -> tuple[str, object]:
    try:
        value = fn(attrs)  # type: ignore[operator]
    except cesql.CESQLError as e:
        return ("error", e.kind)
    return ("value", (value, type(value)))


@pytest.mark.parametrize("seed", range(4))
def test_fast_paths_agree_with_each_other_and_the_complete_evaluation(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        source = _expr(rng, 4)
        prog = cesql.compile(source)
        tree = parse(source)
        share_budget(tree, 10_000_000)
        closure = compile_node(tree)
        fast = _outcome(prog.value, ATTRS)
        assert fast == _outcome(closure, ATTRS), source
        value, errors = prog.evaluate(ATTRS)
        if fast[0] == "value":
            assert errors == [] and (value, type(value)) == fast[1], source
        else:
            assert errors and errors[0].kind == fast[1], source
            assert type(value) in (bool, int, str), source


@pytest.mark.parametrize(
    ("source", "value", "kinds"),
    [
        ("'a' + 1", 1, ["cast"]),  # the root's own cast: the zero value, and on
        ("'a' + 1 + 1", 0, ["cast"]),  # an inner node's error: the root's zero value
        ("TRUE XOR 10", True, ["cast"]),
        ("NOT 10 = TRUE", False, ["cast"]),
        ("2147483647 + 1", -2147483648, ["math"]),
        ("-(-2147483647 - 1)", -2147483648, ["math"]),  # wrapped, as 32-bit integers do
        ("LENGTH(missing) + 1", 0, ["missingAttribute"]),
        ("1 IN ('x', 1)", True, ["cast"]),
    ],
)
def test_complete_evaluation_semantics(source: str, value: object, kinds: list[str]) -> None:
    got, errors = cesql.compile(source).evaluate({})
    assert (got, type(got)) == (value, type(value))
    assert [e.kind for e in errors] == kinds
