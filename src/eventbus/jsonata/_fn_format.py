"""``$formatNumber`` (the XPath F&O 3.1 picture string, as jsonata-js), ``$formatBase``, and
the clock and date functions (``$now``/``$millis`` fixed per evaluation, ISO 8601 only)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from eventbus.jsonata._datetime import parse_picture_time
from eventbus.jsonata._errors import fail
from eventbus.jsonata._values import UNDEFINED, Frame

__all__ = ["FORMAT_FUNCTIONS"]

U = UNDEFINED
_DEFAULTS = {"decimal-separator": ".", "grouping-separator": ",", "exponent-separator": "e",
             "infinity": "Infinity", "minus-sign": "-", "NaN": "NaN", "percent": "%",
             "per-mille": "\u2030", "zero-digit": "0", "digit": "#", "pattern-separator": ";"}  # fmt: skip


def _round_half_even(v: float, dp: int) -> float:
    return float(Decimal(repr(v)).quantize(Decimal(1).scaleb(-dp), rounding=ROUND_HALF_EVEN))


def _split_parts(sub: str, props: dict[str, str], active: list[str]) -> dict[str, Any]:
    exp_sep = props["exponent-separator"]
    prefix = next((sub[:i] for i, ch in enumerate(sub) if ch in active and ch != exp_sep), "")
    suffix = next(
        (
            sub[i + 1 :]
            for i in range(len(sub) - 1, -1, -1)
            if sub[i] in active and sub[i] != exp_sep
        ),
        "",
    )
    active_part = sub[len(prefix) : len(sub) - len(suffix)]
    exp_pos = sub.find(exp_sep, len(prefix))
    if exp_pos == -1 or exp_pos > len(sub) - len(suffix):
        mantissa, exponent = active_part, None
    else:
        mantissa, exponent = active_part[:exp_pos], active_part[exp_pos + 1 :]
    dec = mantissa.find(props["decimal-separator"])
    if dec == -1:
        integer, fractional = mantissa, suffix
    else:
        integer, fractional = mantissa[:dec], mantissa[dec + 1 :]
    return {"prefix": prefix, "suffix": suffix, "active": active_part, "mantissa": mantissa,
            "exponent": exponent, "integer": integer, "fractional": fractional, "sub": sub}  # fmt: skip


def _validate(
    p: dict[str, Any], props: dict[str, str], digits: list[str], active: list[str]
) -> None:
    sub = p["sub"]
    err = None
    dsep, gsep, digit = props["decimal-separator"], props["grouping-separator"], props["digit"]
    pct, pm = props["percent"], props["per-mille"]
    dec = sub.find(dsep)
    if dec != sub.rfind(dsep):
        err = "D3081"
    if sub.find(pct) != sub.rfind(pct):
        err = "D3082"
    if sub.find(pm) != sub.rfind(pm):
        err = "D3083"
    if pct in sub and pm in sub:
        err = "D3084"
    if not any(ch in digits or ch == digit for ch in p["mantissa"]):
        err = "D3085"
    if any(ch not in active for ch in p["active"]):
        err = "D3086"
    if dec != -1:
        if (dec > 0 and sub[dec - 1] == gsep) or sub[dec + 1 : dec + 2] == gsep:
            err = "D3087"
    elif p["integer"].endswith(gsep):
        err = "D3088"
    if gsep + gsep in sub:
        err = "D3089"
    pos = p["integer"].find(digit)
    if pos != -1 and any(ch in digits for ch in p["integer"][:pos]):
        err = "D3090"
    pos = p["fractional"].rfind(digit)
    if pos != -1 and any(ch in digits for ch in p["fractional"][pos:]):
        err = "D3091"
    exp = p["exponent"]
    if exp is not None and len(exp) > 0 and (pct in sub or pm in sub):
        err = "D3092"
    if exp is not None and (len(exp) == 0 or any(ch not in digits for ch in exp)):
        err = "D3093"
    if err:
        raise fail(err, f"Invalid picture string {sub!r} for $formatNumber ({err})", 0, sub)


def _analyse(p: dict[str, Any], props: dict[str, str], digits: list[str]) -> dict[str, Any]:
    gsep, digit = props["grouping-separator"], props["digit"]

    def positions(part: str, to_left: bool) -> list[int]:
        out = []
        g = part.find(gsep)
        while g != -1:
            seg = part[:g] if to_left else part[g:]
            out.append(sum(1 for ch in seg if ch in digits or ch == digit))
            g = p["integer"].find(gsep, g + 1)
        return out

    int_pos = positions(p["integer"], False)

    def regular(idx: list[int]) -> int:
        if not idx:
            return 0
        factor = 0
        for i in idx:
            factor = math.gcd(factor, i)
        for k in range(1, len(idx) + 1):
            if k * factor not in idx:
                return 0
        return factor

    frac = p["fractional"]
    min_int = sum(1 for ch in p["integer"] if ch in digits)
    scaling = min_int
    min_frac = sum(1 for ch in frac if ch in digits)
    max_frac = sum(1 for ch in frac if ch in digits or ch == digit)
    exp_present = p["exponent"] is not None
    if min_int == 0 and max_frac == 0:
        if exp_present:
            min_frac = max_frac = 1
        else:
            min_int = 1
    if exp_present and min_int == 0 and digit in p["integer"]:
        min_int = 1
    if min_int == 0 and min_frac == 0:
        min_frac = 1
    min_exp = sum(1 for ch in p["exponent"] if ch in digits) if exp_present else 0
    return {"int_pos": int_pos, "regular": regular(int_pos), "min_int": min_int, "scaling": scaling,
            "prefix": p["prefix"], "frac_pos": positions(frac, True), "min_frac": min_frac,
            "max_frac": max_frac, "min_exp": min_exp, "suffix": p["suffix"], "picture": p["sub"]}  # fmt: skip


def _format_number(env: Frame, value: Any, picture: str, options: Any = U) -> Any:
    if value is U:
        return U
    props = dict(_DEFAULTS)
    if options is not U:
        props.update(options)
    zero = ord(props["zero-digit"][0])
    digits = [chr(c) for c in range(zero, zero + 10)]
    active = [*digits, props["decimal-separator"], props["exponent-separator"], props["grouping-separator"],
              props["digit"], props["pattern-separator"]]  # fmt: skip
    subs = picture.split(props["pattern-separator"])
    if len(subs) > 2:
        raise fail(
            "D3080",
            "The picture string must not contain more than one instance of the pattern-separator character",
            0,
        )
    parts = [_split_parts(s, props, active) for s in subs]
    for p in parts:
        _validate(p, props, digits, active)
    variables = [_analyse(p, props, digits) for p in parts]
    minus, zd, dsep, gsep = (
        props["minus-sign"],
        props["zero-digit"],
        props["decimal-separator"],
        props["grouping-separator"],
    )
    if len(variables) == 1:
        neg = dict(variables[0])
        neg["prefix"] = minus + neg["prefix"]
        variables.append(neg)
    pic = variables[0] if value >= 0 else variables[1]
    if props["percent"] in pic["picture"]:
        adjusted = value * 100
    elif props["per-mille"] in pic["picture"]:
        adjusted = value * 1000
    else:
        adjusted = value
    exponent = None
    if pic["min_exp"] == 0:
        mantissa = adjusted
    else:
        max_m = 10 ** pic["scaling"]
        min_m = 10 ** (pic["scaling"] - 1)
        mantissa, exponent = adjusted, 0
        while 0 < abs(mantissa) < min_m:
            mantissa *= 10
            exponent -= 1
        while abs(mantissa) > max_m and math.isfinite(mantissa):
            mantissa /= 10
            exponent += 1
    rounded = _round_half_even(mantissa, pic["max_frac"])

    def make(v: float, dp: int) -> str:
        s = f"{abs(v):.{dp}f}"
        if zd != "0":
            s = "".join(digits[ord(c) - 48] if "0" <= c <= "9" else c for c in s)
        return s

    s = make(rounded, pic["max_frac"])
    s = s + dsep if "." not in s else s.replace(".", dsep, 1)
    s = s.lstrip(zd).rstrip(zd)
    dp = s.find(dsep)
    pad_left = pic["min_int"] - dp
    pad_right = pic["min_frac"] - (len(s) - dp - 1)
    s = (zd * pad_left if pad_left > 0 else "") + s + (zd * pad_right if pad_right > 0 else "")
    dp = s.find(dsep)
    if pic["regular"] > 0:
        for g in range(1, (dp - 1) // pic["regular"] + 1):
            cut = dp - g * pic["regular"]
            s = s[:cut] + gsep + s[cut:]
    else:
        for pos in pic["int_pos"]:
            s = s[: dp - pos] + gsep + s[dp - pos :]
            dp += 1
    dp = s.find(dsep)
    for pos in pic["frac_pos"]:
        s = s[: pos + dp + 1] + gsep + s[pos + dp + 1 :]
    dp = s.find(dsep)
    if pic["max_frac"] == 0 or dp == len(s) - 1:
        s = s[:-1]
    if exponent is not None:
        se = make(exponent, 0)
        if pic["min_exp"] - len(se) > 0:
            se = zd * (pic["min_exp"] - len(se)) + se
        s = s + props["exponent-separator"] + (minus if exponent < 0 else "") + se
    return pic["prefix"] + s + pic["suffix"]


def _format_base(env: Frame, value: Any, radix: Any = U) -> Any:
    if value is U:
        return U
    n = int(_round_half_even(value, 0))
    r = 10 if radix is U else int(radix)
    if r < 2 or r > 36:
        raise fail(
            "D3100",
            f"The radix of the formatBase function must be between 2 and 36.  It was given {r}",
            0,
            r,
        )
    chars = "0123456789abcdefghijklmnopqrstuvwxyz"
    m = abs(n)
    out = ""
    while True:
        out = chars[m % r] + out
        m //= r
        if m == 0:
            break
    return "-" + out if n < 0 else out


def _from_millis(env: Frame, ms: Any, picture: Any = U, tz: Any = U) -> Any:
    if ms is U:
        return U
    if picture is not U or tz is not U:
        msg = "$fromMillis/$now with a picture string or timezone is not supported by EventBus"
        raise fail("U1010", msg, 0, picture)
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


_ISO = re.compile(
    r"^(\d{4})(?:-(\d{2})(?:-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?(Z|[+-]\d{2}:?\d{2})?)?)?)?$"
)


def _to_millis(env: Frame, s: Any, picture: Any = U) -> Any:
    if s is U:
        return U
    if picture is not U:
        return parse_picture_time(s, picture, env.state.now_millis())
    m = _ISO.match(s)
    if m is None:
        msg = f"The timestamp {s!r} is not in ISO 8601 format; give a picture string"
        raise fail("D3110", msg, 0, s)
    y, mo, d, h, mi, sec, frac, tz = m.groups()
    try:
        dt = datetime(int(y), int(mo or 1), int(d or 1), int(h or 0), int(mi or 0), int(sec or 0),
                      int((frac or "0")[:6].ljust(6, "0")), tzinfo=UTC)  # fmt: skip
    except ValueError as exc:
        raise fail("D3110", f"The timestamp {s!r} is not a valid date", 0, s) from exc
    offset = 0
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        offset = sign * (int(digits[:2]) * 60 + int(digits[2:]))
    return int(dt.timestamp() * 1000) - offset * 60000


def _now(env: Frame, picture: Any = U, tz: Any = U) -> Any:
    return _from_millis(env, env.state.now_millis(), picture, tz)


FORMAT_FUNCTIONS: dict[str, tuple[Any, str]] = {
    "formatNumber": (_format_number, "<n-so?:s>"),
    "formatBase": (_format_base, "<n-n?:s>"),
    "fromMillis": (_from_millis, "<n-s?s?:s>"),
    "toMillis": (_to_millis, "<s-s?:n>"),
    "now": (_now, "<s?s?:s>"),
    "millis": (lambda env: env.state.now_millis(), "<:n>"),
}
