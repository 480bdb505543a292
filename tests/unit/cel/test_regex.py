"""CEL matches() has RE2 syntax and semantics: linear time, RE2 errors, bounded cache."""

from __future__ import annotations

import re
import time

import pytest

from eventbus import cel

# ^(a+)+$ backtracks exponentially in Python's re: 24 a's and a '!' take ~1 s, each
# further character doubles it. RE2 answers in time linear in the input.
CATASTROPHIC = "^(a+)+$"
HOSTILE = "a" * 100_000 + "!"
# Milliseconds when linear; what these tests guard against takes minutes or forever (a
# backtracking match of HOSTILE, an O(n^2) split of 100,000 digits: ~500 s), so a bound a
# loaded machine cannot trip still catches it.
BOUND_S = 10.0


def _timed(fn: object) -> tuple[object, float]:
    start = time.perf_counter()
    result = fn()  # type: ignore[operator]
    return result, time.perf_counter() - start


def test_literal_pattern_matches_in_linear_time() -> None:
    prog = cel.compile(f"data.s.matches('{CATASTROPHIC}')")
    result, elapsed = _timed(lambda: prog.evaluate({"data": {"s": HOSTILE}}))
    assert result is False
    assert elapsed < BOUND_S
    assert prog.evaluate({"data": {"s": "aaaa"}}) is True


def test_dynamic_pattern_matches_in_linear_time() -> None:
    prog = cel.compile("data.s.matches(data.p)")
    result, elapsed = _timed(lambda: prog.evaluate({"data": {"s": HOSTILE, "p": CATASTROPHIC}}))
    assert result is False
    assert elapsed < BOUND_S


def test_global_matches_form_is_linear_too() -> None:
    prog = cel.compile("matches(s, p)")
    result, elapsed = _timed(lambda: prog.evaluate({"s": HOSTILE, "p": "(x+x+)+y"}))
    assert result is False
    assert elapsed < BOUND_S


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(a)\\1", "invalid escape sequence"),
        ("(?=a)b", "invalid perl operator: (?="),
        ("(?<=a)b", "invalid perl operator: (?<"),
        ("(?!a)", "invalid perl operator: (?!"),
        ("a{1001}", "invalid repetition size"),
        ("[a", "missing ]"),
    ],
)
def test_literal_pattern_that_re2_rejects_is_a_compile_error(pattern: str, reason: str) -> None:
    source = f"data.s.matches('{pattern}')"
    with pytest.raises(cel.CELError) as info:
        cel.compile(source)
    err = info.value
    assert err.column == source.index("'") + 1  # the pattern argument
    assert reason in err.message
    assert "CEL matches() takes RE2 syntax" in err.message
    assert pattern.replace("\\\\", "\\") in err.message.replace("\\\\", "\\")


def test_constant_pattern_is_checked_at_compile_time() -> None:
    with pytest.raises(cel.CELError, match=re.escape("invalid regular expression '(a'")):
        cel.compile("data.s.matches('(' + 'a')")


def test_dynamic_pattern_that_re2_rejects_fails_the_evaluation() -> None:
    prog = cel.compile("data.s.matches(data.p)")
    assert prog.evaluate({"data": {"s": "ab", "p": "a(?:b)"}}) is True
    with pytest.raises(cel.CELError) as info:
        prog.evaluate({"data": {"s": "ab", "p": "(?=a)b"}})
    assert info.value.column is None
    assert "invalid regular expression '(?=a)b'" in info.value.message
    assert "RE2 syntax" in info.value.message


def test_long_dynamic_pattern_in_the_error_is_shortened() -> None:
    prog = cel.compile("'x'.matches(p)")
    with pytest.raises(cel.CELError) as info:
        prog.evaluate({"p": "(" * 10_000})
    assert len(info.value.message) < 400
    assert "10,000 characters" in info.value.message


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # RE2 constructs that Python's re spells differently or lacks.
        (r"'héllo'.matches('^\\pL+$')", True),
        (r"'abc1'.matches('^[[:alpha:]]+$')", False),
        (r"'a.b'.matches('^\\Qa.b\\E$')", True),
        (r"'axb'.matches('^\\Qa.b\\E$')", False),
        (r"'ab'.matches('b\\z')", True),
        ("'AB'.matches('(?i)ab')", True),
        ("'ab'.matches('(?P<x>a)b')", True),
        # $ is the end of text in RE2; Python's re also matches before a final newline.
        ("'a\\n'.matches('a$')", False),
        ("'mañana'.matches('a+ñ+a+')", True),
        ("''.matches('')", True),
    ],
)
def test_re2_semantics(source: str, expected: bool) -> None:
    assert cel.compile(source).evaluate({}) is expected


def test_text_with_a_lone_surrogate_does_not_crash() -> None:
    # JSON allows "\ud800"; json.loads gives a lone surrogate.
    assert cel.compile("s.matches('a')").evaluate({"s": "\ud800a"}) is True


def test_non_string_operands_are_no_overload_errors() -> None:
    with pytest.raises(cel.CELError, match="no matching overload for 'matches'"):
        cel.compile("s.matches('a')").evaluate({"s": 1})
    with pytest.raises(cel.CELError, match="no matching overload for 'matches'"):
        cel.compile("'a'.matches(p)").evaluate({"p": 1})


def test_dynamic_patterns_are_cached_in_a_bounded_cache() -> None:
    from eventbus.cel import _regex

    _regex._cached.cache_clear()
    prog = cel.compile("s.matches(p)")
    for i in range(300):
        assert prog.evaluate({"s": f"x{i}", "p": f"^x{i}$"}) is True
    info = _regex._cached.cache_info()
    assert info.maxsize == 256
    assert info.currsize == 256
    prog.evaluate({"s": "x299", "p": "^x299$"})
    assert _regex._cached.cache_info().hits == info.hits + 1
    long_pattern = "a" * (_regex.MAX_CACHED_PATTERN_LENGTH + 1)
    assert prog.evaluate({"s": long_pattern, "p": long_pattern}) is True
    assert _regex._cached.cache_info().currsize == 256  # long patterns are not kept


def test_compiled_program_with_a_regex_pickles() -> None:
    import pickle

    prog = pickle.loads(pickle.dumps(cel.compile("s.matches('^a+$')")))
    assert prog.evaluate({"s": "aaa"}) is True


@pytest.mark.parametrize(
    ("source", "value"),
    [
        # `[0-9]+\.?[0-9]*` split a digit run n ways: O(n^2), ~500 s for 100,000 digits.
        ("double(s)", "1" * 100_000 + "e5x"),
        ("double(s)", "1" * 100_000 + ".5x"),
        ("int(s)", "1" * 100_000),
        ("uint(s)", "1" * 100_000),
        ("duration(s)", "1" * 100_000 + "s"),
    ],
)
def test_conversions_of_long_strings_fail_fast(source: str, value: str) -> None:
    prog = cel.compile(source)

    def run() -> str:
        with pytest.raises(cel.CELError) as info:
            prog.evaluate({"s": value})
        return info.value.message

    message, elapsed = _timed(run)
    assert elapsed < BOUND_S
    assert "Exceeds the limit" not in str(message)
    assert len(str(message)) < 200
