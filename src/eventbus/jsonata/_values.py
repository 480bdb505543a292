"""JSONata values in Python: JSON as Python (``None`` is null), :data:`UNDEFINED` for
JavaScript's ``undefined``, :class:`Seq` for result sequences (jsonata-js's arrays flagged
``sequence``), :class:`Cons` for constructed arrays, functions, frames and the budget."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

from eventbus.jsonata._errors import fail

__all__ = [
    "UNDEFINED",
    "Builtin",
    "Cons",
    "Frame",
    "Lambda",
    "Seq",
    "State",
    "append",
    "deep_equal",
    "is_function",
    "is_number",
    "js_number",
    "stringify",
    "to_boolean",
]


class _Undefined:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNDEFINED"

    def __bool__(self) -> bool:
        return False


#: JavaScript's ``undefined``: no value (a missing field, an empty sequence).
UNDEFINED: Any = _Undefined()


class Seq(list):  # type: ignore[type-arg]
    """A result sequence: flattened into paths, a singleton unwrapped to its value."""

    # flags as class defaults, set per instance where they differ: a Seq is then built at the
    # speed of a list (no __init__ of its own), which every path step does
    keep_singleton = False
    outer_wrapper = False
    tuple_stream = False


class Cons(list):  # type: ignore[type-arg]
    """An array built by an array constructor ``[...]``: a path never flattens it."""

    __slots__ = ()


class State:
    """Per evaluation: the budget left and the fixed clock (``$now()``, ``$millis()``)."""

    __slots__ = ("call_weight", "deadline", "depth", "max_depth", "max_length", "millis", "steps")

    def __init__(self, max_steps: int, max_depth: int, max_length: int, max_time_ms: float) -> None:
        self.steps = max_steps
        self.depth = 0
        self.call_weight = 1  # 0 where every expression counts its own depth
        self.max_depth = max_depth
        self.max_length = max_length
        self.millis = -1  # read on the first $now()/$millis(), then fixed
        self.deadline = time.monotonic() + max_time_ms / 1000

    def now_millis(self) -> int:
        """The evaluation's clock, in ms since the epoch: the same for every call."""
        if self.millis < 0:
            self.millis = int(time.time() * 1000)
        return self.millis

    def charge(self, n: int) -> None:
        """Spend ``n`` steps; raise once the budget or the time is spent."""
        self.steps -= n
        if self.steps < 0:
            msg = "Expression evaluation exceeded its step budget (max_steps); check for an infinite loop"
            raise fail("U1001", msg)
        if self.steps & 0x3FF < n and time.monotonic() > self.deadline:
            msg = "Expression evaluation timeout (max_time_ms); check for an infinite loop"
            raise fail("U1001", msg)

    def check_length(self, n: int, what: str) -> None:
        """Refuse a string or array longer than the output budget."""
        if n > self.max_length:
            msg = f"{what} of {n} items/characters exceeds the output budget (max_length {self.max_length})"
            raise fail("U1003", msg, 0, n)


class Frame:
    """Variable bindings; lookups walk the parents."""

    __slots__ = ("parent", "state", "vars")

    def __init__(self, parent: Frame | None, state: State | None = None) -> None:
        self.vars: dict[str, Any] = {}
        self.parent = parent
        self.state: State = state if state is not None else parent.state  # type: ignore[union-attr]

    def lookup(self, name: str) -> Any:
        """The value bound to ``name`` here or in a parent, else UNDEFINED."""
        f: Frame | None = self
        while f is not None:
            v = f.vars.get(name, UNDEFINED)
            if v is not UNDEFINED or name in f.vars:
                return v
            f = f.parent
        return UNDEFINED


class Lambda:
    """A user function (``function($x) {...}``) closed over its frame and input."""

    __slots__ = ("body", "frame", "input", "params", "position", "signature")

    def __init__(self, params: list[str], body: Any, frame: Frame, input_: Any, signature: Any,
                 position: int) -> None:  # fmt: skip
        self.params = params
        self.body = body
        self.frame = frame
        self.input = input_
        self.signature = signature
        self.position = position

    @property
    def arity(self) -> int:
        """Declared parameter count."""
        return len(self.params)


class Builtin:
    """A native function: ``impl(state, context, *args)`` after the signature check."""

    __slots__ = ("arity", "impl", "name", "signature")

    def __init__(self, name: str, impl: Callable[..., Any], signature: Any, arity: int) -> None:
        self.name = name
        self.impl = impl
        self.signature = signature
        self.arity = arity


def is_function(v: Any) -> bool:
    """True for lambdas, native functions, partial applications and regexes."""
    return hasattr(v, "arity") and not isinstance(v, (dict, list))


def is_number(v: Any) -> bool:
    """A finite JSON number (not a boolean)."""
    cls = v.__class__
    return cls is int or (cls is float and math.isfinite(v))


def to_boolean(v: Any) -> Any:
    """JSONata's ``$boolean`` (UNDEFINED stays UNDEFINED)."""
    if v is UNDEFINED:
        return UNDEFINED
    cls = v.__class__
    if cls is bool:
        return v
    if cls is str:
        return len(v) > 0
    if cls is int or cls is float:
        return v != 0
    if isinstance(v, list):
        if len(v) == 1:
            return to_boolean(v[0])
        for x in v:  # noqa: SIM110 - a loop, not any(): deep values stay off the C stack
            if to_boolean(x) is True:
                return True
        return False
    if isinstance(v, dict):
        return len(v) > 0
    return False


def deep_equal(a: Any, b: Any) -> bool:
    """JSON equality; booleans are not numbers."""
    if a is b:
        return True
    ca, cb = a.__class__, b.__class__
    if ca is bool or cb is bool:
        return ca is cb and a == b
    # loops, not all(map(...)): deep values recurse in Python frames only, never the C stack
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            return False
        for x, y in zip(a, b, strict=True):  # noqa: SIM110
            if not deep_equal(x, y):
                return False
        return True
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return False
        for k, x in a.items():  # noqa: SIM110
            if not deep_equal(x, b[k]):
                return False
        return True
    if isinstance(b, (list, dict)):
        return False
    return bool(a == b)


def append(a: Any, b: Any) -> Any:
    """``$append``: join two values or sequences into one sequence."""
    if a is UNDEFINED:
        return b
    if b is UNDEFINED:
        return a
    out = Seq(a) if isinstance(a, list) else Seq([a])
    if isinstance(b, list):
        out.extend(b)
    else:
        out.append(b)
    return out


def js_number(v: Any) -> str:
    """A number as JavaScript prints it (``1e+21``, ``1e-7``, ``0.1``)."""
    if v.__class__ is int:
        if abs(v) < 10**21:
            return str(v)
        v = float(v)
    if v == int(v) and abs(v) < 1e21:
        return str(int(v))
    r = repr(v)
    mant, _, exp_s = r.partition("e")
    neg = mant.startswith("-")
    mant = mant.lstrip("-")
    ip, _, fp = mant.partition(".")
    digits = (ip + fp).lstrip("0")
    exp = (int(exp_s) if exp_s else 0) + len(ip) - (len(ip + fp) - len((ip + fp).lstrip("0")))
    # now value = 0.digits * 10**exp
    digits = digits.rstrip("0") or "0"
    n = exp
    k = len(digits)
    if k <= n <= 21:
        s = digits + "0" * (n - k)
    elif 0 < n <= 21:
        s = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        s = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        sign = "+" if e >= 0 else "-"
        s = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + sign + str(abs(e))
    return ("-" if neg else "") + s


def _precise(v: Any) -> Any:
    if v.__class__ is float:
        return float(f"{v:.15g}")
    return v


def stringify(v: Any, indent: int | None = None, level: int = 0) -> str:
    """JSON text as JavaScript's ``JSON.stringify`` with jsonata's 15-digit numbers."""
    if v is None:
        return "null"
    cls = v.__class__
    if cls is str:
        return json.dumps(v, ensure_ascii=False)
    if cls is bool:
        return "true" if v else "false"
    if cls is int or cls is float:
        if not math.isfinite(v):
            raise fail("D1001", f"Number out of range: {v} cannot be represented in JSON", 0, v)
        return js_number(_precise(v))
    if is_function(v):
        return '""'
    if isinstance(v, list):
        items = ["null" if x is UNDEFINED else stringify(x, indent, level + 1) for x in v]
        if not items:
            return "[]"
        if indent is None:
            return "[" + ",".join(items) + "]"
        pad = "\n" + " " * (indent * (level + 1))
        return "[" + ",".join(pad + i for i in items) + "\n" + " " * (indent * level) + "]"
    if isinstance(v, dict):
        pairs = [(k, x) for k, x in v.items() if x is not UNDEFINED]
        if not pairs:
            return "{}"
        colon = ":" if indent is None else ": "
        parts = [
            json.dumps(k, ensure_ascii=False) + colon + stringify(x, indent, level + 1)
            for k, x in pairs
        ]
        if indent is None:
            return "{" + ",".join(parts) + "}"
        pad = "\n" + " " * (indent * (level + 1))
        return "{" + ",".join(pad + p for p in parts) + "\n" + " " * (indent * level) + "}"
    return json.dumps(str(v))
