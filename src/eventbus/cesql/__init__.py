"""CloudEvents SQL (CESQL v1) for EventBus filters and route conditions.

Expressions are parsed once by :func:`compile` into Python closures over a CloudEvent's
attributes. The language follows the CloudEvents ``cesql`` specification and passes its
TCK: Boolean, Integer (32-bit) and String values with implicit casts, ``AND``/``OR``/
``XOR``/``NOT``, comparisons, arithmetic, ``LIKE`` (matched without backtracking),
``IN``, ``EXISTS`` and the built-in functions. Keywords, function names and attribute
names are case-insensitive.

Evaluation errors follow the spec: :meth:`Program.evaluate` gives the zero value of the
failing operator's type plus the errors; :meth:`Program.matches` (a filter) raises.

Example:
    >>> from eventbus import cesql
    >>> prog = cesql.compile("source LIKE 'https://%' AND type IN ('a', 'b')")
    >>> prog.matches({"source": "https://example.com", "type": "a"})
    True
"""

from __future__ import annotations

from eventbus.cesql._errors import CESQLError
from eventbus.cesql._program import Program, compile

__all__ = ["CESQLError", "Program", "compile"]
