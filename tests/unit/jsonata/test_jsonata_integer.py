"""``$formatInteger`` and ``$parseInteger``: each picture kind (decimal digits with grouping,
other digit families, words, roman numerals, letters, ordinals), their errors and limits, and
parsing as the inverse of formatting."""

from __future__ import annotations

import random
from typing import Any

import pytest

from eventbus import jsonata


def _eval(expr: str, data: Any = None) -> Any:
    return jsonata.compile(expr).evaluate(data)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("$formatInteger(7, '000')", "007"),
        ("$formatInteger(-42, '0000')", "-0042"),
        ("$formatInteger(9.99, '#0')", "9"),
        ("$formatInteger(-2.5, '0')", "-3"),  # floor, as jsonata-js
        ("$formatInteger(9876543, '#,##0')", "9,876,543"),
        ("$formatInteger(9876543, '# ##0')", "9 876 543"),
        ("$formatInteger(9876543210, '#|###.##0')", "9876|543.210"),
        ("$formatInteger(9876543210, '##-##-##0')", "98765-43-210"),
        ("$formatInteger(305, '##٠')", "٣٠٥"),
        ("$formatInteger(2, '0;o')", "2nd"),
        ("$formatInteger(13, '0;o')", "13th"),
        ("$formatInteger(101, '0;o')", "101st"),
        ("$formatInteger(0, 'w')", "zero"),
        ("$formatInteger(15, 'W')", "FIFTEEN"),
        ("$formatInteger(40, 'w;o')", "fortieth"),
        ("$formatInteger(108, 'w')", "one hundred and eight"),
        ("$formatInteger(2002, 'Ww')", "Two Thousand and Two"),
        ("$formatInteger(61000, 'w;o')", "sixty-one thousandth"),
        ("$formatInteger(5000017, 'w')", "five million and seventeen"),
        ("$formatInteger(-3, 'w')", "-three"),
        ("$formatInteger(2024, 'I')", "MMXXIV"),
        ("$formatInteger(49, 'i')", "xlix"),
        ("$formatInteger(52, 'A')", "AZ"),
        ("$formatInteger(703, 'a')", "aaa"),
        ("$formatInteger(nothing, '0')", jsonata.UNDEFINED),
        ("$parseInteger('007', '000')", 7),
        ("$parseInteger('9 876 543', '# ##0')", 9876543),
        ("$parseInteger('98765-43-210', '##-##-##0')", 9876543210),
        ("$parseInteger('٣٠٥', '##٠')", 305),
        ("$parseInteger('22nd', '0;o')", 22),
        ("$parseInteger('one hundred and eight', 'w')", 108),
        ("$parseInteger('Sixty-One Thousandth', 'Ww;o')", 61000),
        ("$parseInteger('MMXXIV', 'I')", 2024),
        ("$parseInteger('xlix', 'i')", 49),
        ("$parseInteger('AZ', 'A')", 52),
        ("$parseInteger('12x', '0')", jsonata.UNDEFINED),  # not digits of the family
        ("$parseInteger('twelvety', 'w')", jsonata.UNDEFINED),
        ("$parseInteger('MXQ', 'I')", jsonata.UNDEFINED),
        ("$parseInteger(nothing, '0')", jsonata.UNDEFINED),
    ],
)
def test_pictures(expr: str, expected: Any) -> None:
    assert _eval(expr, {}) == expected


@pytest.mark.parametrize(
    ("expr", "code"),
    [
        ("$formatInteger(1, '#')", "D3130"),  # no digit: a numbering sequence
        ("$formatInteger(1, 'Z')", "D3130"),
        ("$formatInteger(1, '#0٠')", "D3131"),  # two digit families
        ("$parseInteger('1', '##')", "D3130"),
        ("$formatInteger('1', '0')", "T0410"),  # the signature: a number
        ("$formatInteger(1, 2)", "T0410"),
        ("$formatInteger(1, '" + "0" * 20_000 + "')", "U1003"),  # padding past the budget
        ("$formatInteger(1e300, 'I')", "U1003"),  # an M per thousand
    ],
)
def test_errors(expr: str, code: str) -> None:
    with pytest.raises(jsonata.JSONataError) as err:
        _eval(expr, {})
    assert err.value.code == code


@pytest.mark.parametrize(
    ("text", "picture"),
    [("9" * 400, "0"), ("Z" * 300, "A"), ("one" + " trillion" * 30, "w")],
)
def test_parsing_a_number_json_cannot_hold_fails(text: str, picture: str) -> None:
    with pytest.raises(jsonata.JSONataError) as err:
        _eval(f"$parseInteger(t, '{picture}')", {"t": text})
    assert err.value.code == "D1001"


def test_parsing_long_inputs_stays_linear() -> None:
    assert _eval("$parseInteger(t, '0')", {"t": "0" * 1_000_000 + "42"}) == 42
    assert _eval("$parseInteger(t, 'I')", {"t": "M" * 100_000}) == 100_000_000
    assert _eval("$parseInteger(t, 'w')", {"t": "one " * 100_000}) == 100_000
    assert _eval("$parseInteger(t, '#,##0')", {"t": ","}) is jsonata.UNDEFINED


def test_largest_numbers_in_words_and_digits() -> None:
    assert _eval("$formatInteger(1e21, 'w')") == "one billion trillion"
    big = _eval("$formatInteger(1.7e308, '#,##0')")
    assert big.startswith("169,999,999") and len(big.replace(",", "")) == 309
    assert _eval("$formatInteger(1e300, 'A')").isalpha()


def test_parse_is_the_inverse_of_format() -> None:
    rng = random.Random(7)
    pictures = ["0", "#,##0", "0000", "#:###,##0", "w", "W", "Ww", "w;o", "I", "i", "A", "a",
                "#0;o", "##,##,##0"]  # fmt: skip
    for _ in range(600):
        n = rng.choice([rng.randint(0, 120), rng.randint(0, 10**6), rng.randint(0, 10**15)])
        picture = rng.choice(pictures)
        if picture in ("I", "i") and n > 10**6:
            continue
        text = _eval(f"$formatInteger({n}, '{picture}')")
        back = _eval(f"$parseInteger(t, '{picture}')", {"t": text})
        assert back == n, (n, picture, text, back)
