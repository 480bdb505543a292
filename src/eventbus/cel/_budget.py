"""The evaluation budget: comprehension iterations and the size of what is produced.

CEL has no loops, but comprehensions iterate over input-sized ranges and nest, and
string functions turn small inputs into large outputs: ``items.map(i, data.s).join('')``
makes 100 MB out of 110 KB. A :class:`Budget` is created per evaluation, only by
expressions that can grow values (comprehensions, ``cel.bind``/``cel.block``, ``join``,
``replace``, ``format``); the generated code charges it where sizes grow. Expressions
without those (typical filters and conversions) evaluate each node once, so their values
are bounded by the input and the expression itself, and they pay nothing.

Exceeding the budget raises :class:`BudgetError`, which CEL's error absorption (``||``,
``&&``, ``exists``...) does not swallow: the evaluation fails with a ``CELError``.
"""

from __future__ import annotations

from typing import Any, Final, NoReturn

from eventbus.cel import _ext_strings as strs
from eventbus.cel._errors import EvalError

__all__ = [
    "DEFAULT_MAX_ITERATIONS",
    "DEFAULT_MAX_OUTPUT_SIZE",
    "Budget",
    "BudgetError",
    "format_",
    "join",
    "replace",
    "split",
]

#: Comprehension iterations per evaluation (nested comprehensions multiply).
DEFAULT_MAX_ITERATIONS: Final = 1_000_000
#: Characters of strings, bytes of bytes and elements of lists and maps produced per
#: evaluation by concatenation, string functions and ``join``/``replace``/``format``.
DEFAULT_MAX_OUTPUT_SIZE: Final = 10_000_000


class BudgetError(EvalError):
    """Internal: an evaluation exceeded its budget (never absorbed by ``||``/``&&``)."""


class Budget:
    """What one evaluation may still spend. Charges count down; below zero is an error."""

    __slots__ = ("iterations_left", "max_iterations", "max_output_size", "size_left")

    def __init__(self, max_iterations: int, max_output_size: int) -> None:
        self.max_iterations = max_iterations
        self.max_output_size = max_output_size
        self.iterations_left = max_iterations
        self.size_left = max_output_size

    def iterations(self, rng: Any) -> Any:
        """Charge a comprehension over ``rng`` for all its elements, before it starts."""
        try:
            n = len(rng)
        except TypeError:  # not a list or map: the comprehension reports the error
            return rng
        self.iterations_left -= n
        if self.iterations_left < 0:
            reached = self.max_iterations - self.iterations_left
            msg = (
                f"CEL evaluation exceeded its budget of {self.max_iterations:,} comprehension "
                f"iterations (reached {reached:,}); iterate over smaller lists or maps, or "
                "raise max_iterations in cel.compile()"
            )
            raise BudgetError(msg)
        return rng

    def grow(self, value: Any) -> Any:
        """Charge a produced string, bytes, list or map for its size; return it."""
        t = type(value)
        if t is str or t is bytes or t is list or t is dict:
            self.size_left -= len(value)
            if self.size_left < 0:
                self._over_size()
        return value

    def reserve(self, size: int) -> None:
        """Charge ``size`` before producing it (for functions whose output can be large)."""
        self.size_left -= size
        if self.size_left < 0:
            self._over_size()

    def _over_size(self) -> NoReturn:
        reached = self.max_output_size - self.size_left
        msg = (
            f"CEL evaluation exceeded its budget of {self.max_output_size:,} characters, "
            f"bytes or elements produced (reached {reached:,}); build smaller strings and "
            "lists, or raise max_output_size in cel.compile()"
        )
        raise BudgetError(msg)


# -- growth functions, charged before they build their result ----------------------------


def join(budget: Budget, lst: Any, sep: Any = "") -> str:
    """``list.join([sep])``, its output size reserved first."""
    if type(lst) in (list, tuple) and type(sep) is str:
        total = len(sep) * max(len(lst) - 1, 0)
        for item in lst:
            if type(item) is str:
                total += len(item)
        budget.reserve(total)
    return strs.join(lst, sep)


def replace(budget: Budget, s: Any, old: Any, new: Any, n: Any = -1) -> str:
    """``s.replace(old, new[, n])``, its output size reserved first."""
    if type(s) is str and type(old) is str and type(new) is str and type(n) is int:
        count = s.count(old) if old else len(s) + 1
        if n >= 0:
            count = min(count, n)
        budget.reserve(len(s) + count * max(len(new) - len(old), 0))
    return strs.replace(s, old, new, n)


def format_(budget: Budget, template: Any, args: Any) -> str:
    """``template.format(list)``, each piece reserved before it is built."""
    return strs.format_(template, args, reserve=budget.reserve)


def split(budget: Budget, s: Any, sep: Any, n: Any = -1) -> list[str]:
    """``s.split(sep[, n])``: the parts (at most ``s`` again) and the list are charged."""
    parts = strs.split(s, sep, n)
    budget.reserve(len(parts) + len(s))
    return parts


#: Implementations replaced by their budgeted versions (called with the budget first).
BUDGETED: Final[dict[Any, Any]] = {
    strs.join: join,
    strs.replace: replace,
    strs.format_: format_,
    strs.split: split,
}
