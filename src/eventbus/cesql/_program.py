"""A compiled CESQL expression: :func:`compile` and :class:`Program`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from eventbus.cesql._apply import ChildFailed, Recording, apply
from eventbus.cesql._codegen import generate
from eventbus.cesql._compile import compile_node, share_budget
from eventbus.cesql._errors import CESQLError, EvalError
from eventbus.cesql._parser import Node, parse
from eventbus.cesql._values import ZERO

__all__ = ["DEFAULT_MAX_OUTPUT_SIZE", "Program", "compile"]

#: Characters the string functions of one evaluation may produce in all.
DEFAULT_MAX_OUTPUT_SIZE: Final = 10_000_000


def _public(e: EvalError, source: str) -> CESQLError:
    return CESQLError(e.message, e.kind, source)


class Program:
    """A compiled CESQL expression over a mapping of CloudEvent attributes.

    Attribute names are matched lower-cased (CloudEvents names are); values that are not
    ``bool``, ``int`` or ``str`` are read in their string forms. Thread-safe: a program
    holds no per-evaluation state.

    Example:
        >>> from eventbus import cesql
        >>> prog = cesql.compile("type LIKE 'order.%' AND EXISTS subject")
        >>> prog.matches({"type": "order.created", "subject": "o-1"})
        True
        >>> cesql.compile("1 / 0").evaluate({})
        (0, [CESQLError('division by zero (1 / 0); the result is 0', 'math', '1 / 0', None, None)])
    """

    __slots__ = ("_fast", "_kids", "_root", "matches", "source", "type")

    #: Whether the event passes, as a Subscriptions API filter: the value is ``true``.
    #: Raises :class:`CESQLError` on an evaluation error or a value that is not a Boolean.
    matches: Callable[[Mapping[str, Any]], bool]

    def __init__(self, source: str, root: Node) -> None:
        self.source = source
        self._root = root
        self._fast = generate(root)
        self._kids = tuple(compile_node(k) for k in root.args)
        #: the static type of the result: ``bool``, ``int``, ``str`` or ``any`` (an attribute)
        self.type = root.type
        # a Boolean expression is its own predicate: no wrapper on the hot path
        self.matches = self._fast if root.type == "bool" else self._checked

    def value(self, attributes: Mapping[str, Any]) -> Any:
        """The value, failing fast: the first evaluation error raises.

        Raises:
            CESQLError: an evaluation error (its ``kind`` as the TCK names it).
        """
        return self._fast(attributes)

    def _checked(self, attributes: Mapping[str, Any]) -> bool:
        v = self._fast(attributes)
        if v is True or v is False:
            return v
        msg = f"the expression gave {v!r}, not a Boolean; a filter must give TRUE or FALSE"
        raise CESQLError(msg, "generic", self.source)

    def evaluate(self, attributes: Mapping[str, Any]) -> tuple[Any, list[CESQLError]]:
        """The value and the errors, in the spec's complete evaluation mode: an error gives
        the zero value of its operator's type (``false``, ``0``, ``''``) and evaluation goes
        on, as the CESQL TCK expects."""
        try:
            return self._fast(attributes), []
        except EvalError:
            pass
        rec = Recording()
        errors = rec.errors

        def guard(k: Any) -> Any:
            def run(a: Any) -> Any:
                try:
                    return k(a)
                except EvalError as e:
                    raise ChildFailed(e) from None

            return run

        kids = tuple(guard(k) for k in self._kids)
        try:
            value = apply(self._root, attributes, kids, rec)
        except ChildFailed as c:
            value = ZERO[self._root.type]
            errors.append(c.error)
        except EvalError as e:
            value = e.fallback
            errors.append(e)
        return value, [_public(e, self.source) for e in errors]


def compile(source: str, *, max_output_size: int = DEFAULT_MAX_OUTPUT_SIZE) -> Program:
    """Compile a CloudEvents SQL expression.

    Args:
        source: The expression, e.g. ``"type LIKE 'order.%' AND INT(amount) > 100"``.
        max_output_size: Characters the string functions of one evaluation may build.

    Raises:
        CESQLError: a syntax error (kind ``parse``) or an unknown function or arity (kind
            ``missingFunction``), with the line and column of the offending token.
    """
    if not isinstance(source, str):
        msg = f"a CESQL expression is a string; got {type(source).__name__}"
        raise CESQLError(msg, "parse")
    root = parse(source)
    share_budget(root, max_output_size)
    return Program(source, root)
