"""Exact-semantics helpers for the slow path: error-absorbing logic and macros.

The generated fast path evaluates ``&&``, ``||``, ``all`` and ``exists`` with
Python's short-circuit operators; when anything raises, the program re-runs
the slow path, where these helpers absorb errors as CEL requires
(``error && false`` is ``false``, ``exists`` is true if any element is true...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from eventbus.cel._arith import check_bool
from eventbus.cel._budget import BudgetError
from eventbus.cel._containers import iter_pairs, iter_range, make_map
from eventbus.cel._errors import EvalError
from eventbus.cel._runtime import kind, no_overload, type_name
from eventbus.cel._values import NONE, Optional

__all__ = [
    "all_",
    "and_",
    "exists_",
    "lookup_var",
    "opt_flat_map",
    "opt_map",
    "or_",
    "transform_map_entry",
]

Thunk = Callable[[], Any]


def lookup_var(variables: Mapping[str, Any], name: str) -> Any:
    """A top-level variable, or the CEL "undeclared reference" error."""
    try:
        return variables[name]
    except KeyError:
        msg = f"undeclared reference to '{name}'"
        raise EvalError(msg) from None
    except TypeError:
        msg = f"variables must be a mapping; got {type(variables).__name__}"
        raise EvalError(msg) from None


def _logic(thunks: tuple[Thunk, ...], decisive: bool, op: str) -> bool:
    error: Exception | None = None
    for thunk in thunks:
        try:
            value: object = thunk()
        except BudgetError:
            raise  # the evaluation is over budget: not a CEL value error to absorb
        except Exception as exc:  # noqa: BLE001 - CEL absorbs any error here
            error = error or exc
            continue
        if value is decisive:
            return decisive
        if value is not (not decisive) and error is None:
            try:
                no_overload(op, value)
            except EvalError as exc:
                error = exc
    if error is not None:
        raise error
    return not decisive


def and_(*thunks: Thunk) -> bool:
    """``a && b && ...``: false if any operand is false, else error if any, else true."""
    return _logic(thunks, False, "_&&_")


def or_(*thunks: Thunk) -> bool:
    """``a || b || ...``: true if any operand is true, else error if any, else false."""
    return _logic(thunks, True, "_||_")


def _quantifier(rng: Any, pred: Callable[..., Any], two: bool, decisive: bool, op: str) -> bool:
    items: Iterable[Any] = iter_pairs(rng) if two else iter_range(rng)
    error: Exception | None = None
    for item in items:
        try:
            value: object = pred(*item) if two else pred(item)
            check_bool(value, op)
        except BudgetError:
            raise
        except Exception as exc:  # noqa: BLE001 - CEL absorbs any error here
            error = error or exc
            continue
        if value is decisive:
            return decisive
    if error is not None:
        raise error
    return not decisive


def all_(rng: Any, pred: Callable[..., Any], two: bool = False) -> bool:
    """The ``all`` macro with error absorption."""
    return _quantifier(rng, pred, two, False, "all")


def exists_(rng: Any, pred: Callable[..., Any], two: bool = False) -> bool:
    """The ``exists`` macro with error absorption."""
    return _quantifier(rng, pred, two, True, "exists")


def opt_map(opt: Any, fn: Callable[[Any], Any]) -> Optional:
    """``opt.optMap(x, expr)``."""
    if type(opt) is not Optional:
        no_overload("optMap", opt)
    return Optional(fn(opt.value)) if opt.has else NONE


def opt_flat_map(opt: Any, fn: Callable[[Any], Any]) -> Any:
    """``opt.optFlatMap(x, expr)``: ``expr`` must return an optional."""
    if type(opt) is not Optional:
        no_overload("optFlatMap", opt)
    if not opt.has:
        return NONE
    result = fn(opt.value)
    if type(result) is not Optional:
        no_overload("optFlatMap", result)
    return result


def transform_map_entry(entries: Iterable[Any]) -> dict[Any, Any]:
    """Merge the one-entry maps of ``transformMapEntry``; duplicate keys are errors."""
    pairs: list[tuple[Any, Any]] = []
    for entry in entries:
        if kind(entry) != "map":
            msg = f"transformMapEntry expects a map; got {type_name(entry)}"
            raise EvalError(msg)
        pairs.extend(entry.items())
    return make_map(pairs)
