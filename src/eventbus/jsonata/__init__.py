"""JSONata (the query and transformation language of Knative's EventTransform) for EventBus
converts.

An expression is parsed once by :func:`compile` (a Pratt parser after jsonata-js), reshaped
into paths and stages, and compiled into nested Python closures; :meth:`Expression.evaluate`
runs the closures against each event, within a :class:`Budget` (steps, call depth, output
length, time). Regexes run on RE2, so they stay linear.

Example:
    >>> from eventbus import jsonata
    >>> expr = jsonata.compile('{"total": $sum(lines.(price * qty))}')
    >>> expr.evaluate({"lines": [{"price": 2, "qty": 3}, {"price": 1, "qty": 4}]})
    {'total': 10}
"""

from __future__ import annotations

from eventbus.jsonata._errors import JSONataError
from eventbus.jsonata._program import UNSUPPORTED_FUNCTIONS, Budget, Expression, compile
from eventbus.jsonata._values import UNDEFINED

__all__ = ["Budget", "Expression", "JSONataError", "UNDEFINED", "UNSUPPORTED_FUNCTIONS", "compile"]
