"""CEL (Common Expression Language) for EventBus filters, conversions and keys.

Expressions are parsed and checked once by :func:`compile`, which generates
Python source for them; :meth:`Program.evaluate` runs that code, at a cost
close to a hand-written lambda. The implementation follows the CEL spec
(cel-spec ``langdef.md``) with the standard library, heterogeneous numeric
equality and ordering, the strings, math, bindings, block, network and
optionals extensions, and two-variable comprehensions.

Identifier ``type``: a bare ``type`` is always a variable lookup (the
CloudEvent ``type`` attribute), so ``type == 'payment.created'`` works as
expected; the call form ``type(x)`` stays CEL's builtin function. Other type
names (``int``, ``string``, ``bool``...) denote CEL type values unless they
are declared as variables.

Values map to Python as: int, :class:`UInt`, float, bool, str, bytes, None
(null), list (tuples accepted), dict, ``datetime.datetime`` (timestamp, UTC)
and ``datetime.timedelta`` (duration).

Example:
    >>> from eventbus import cel
    >>> prog = cel.compile("type == 'payment.created' && data.amount > 100")
    >>> prog.evaluate({"type": "payment.created", "data": {"amount": 150}})
    True
    >>> sorted(prog.variables)
    ['data', 'type']
"""

from __future__ import annotations

from eventbus.cel._errors import CELError
from eventbus.cel._program import Program, compile
from eventbus.cel._values import UInt

__all__ = ["CELError", "Program", "UInt", "compile"]
