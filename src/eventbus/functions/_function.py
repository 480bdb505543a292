"""User functions: ``@function`` registration, ``module:attr`` references, batch adapters.

A user function is either *per event* (``fn(event) -> result``) or *batch*
(``fn(events) -> list[result]``, one result per input, in order). A result is a
:class:`~eventbus.CloudEvent` (one output), ``None`` (dropped), or a list of events (zero,
one or many outputs). Batch functions are the fast path; per-event functions are wrapped.

Example:
    >>> import eventbus
    >>> @eventbus.function
    ... def tag(event):
    ...     return event.replace(type="payment.tagged")
    >>> @eventbus.function(batch=True)
    ... def tag_all(events):
    ...     return [e.replace(type="payment.tagged") for e in events]
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast, overload

from eventbus.errors import FunctionError

__all__ = ["FunctionSpec", "function", "resolve_function"]

F = TypeVar("F", bound=Callable[..., Any])

_REF = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_.]*$")
_ATTR = "__eventbus_function__"


@dataclass(frozen=True)
class FunctionSpec:
    """What ``@function`` records about a user function.

    Attributes:
        name: the function's registered name (defaults to its ``__qualname__``).
        batch: True when the function takes a list of events and returns one result each.
    """

    name: str
    batch: bool


@overload
def function(fn: F, /) -> F: ...
@overload
def function(*, name: str | None = None, batch: bool = False) -> Callable[[F], F]: ...
def function(
    fn: F | None = None, /, *, name: str | None = None, batch: bool = False
) -> F | Callable[[F], F]:
    """Register a Python function as an EventBus pipeline function.

    Use it bare (per-event) or with ``batch=True`` for a batch function. A pipeline step
    names it as ``function: "package.module:attr"``.

    Args:
        fn: the function (when used bare).
        name: a name for logs and errors; defaults to the function's qualified name.
        batch: whether the function takes ``list[CloudEvent]`` and returns a list of results
            of the same length.

    Returns:
        The function itself, unchanged but for an ``__eventbus_function__`` marker.

    Raises:
        FunctionError: when the function's signature cannot take one positional argument, or
            it is a coroutine function (not supported yet).
    """

    def decorate(f: F) -> F:
        check_signature(f, where=f"@eventbus.function on {getattr(f, '__qualname__', f)!r}")
        setattr(
            f,
            _ATTR,
            FunctionSpec(name=name or cast(str, getattr(f, "__qualname__", repr(f))), batch=batch),
        )
        return f

    if fn is not None:
        return decorate(fn)
    return decorate


def check_signature(fn: Any, *, where: str) -> None:
    """Check that ``fn`` can be called with exactly one positional argument.

    Raises:
        FunctionError: naming ``where``, the signature and the fix.
    """
    if not callable(fn):
        msg = (
            f"{where}: {fn!r} is not callable; point it at a function taking one event (or a list)"
        )
        raise FunctionError(msg)
    if asyncio.iscoroutinefunction(fn):
        msg = f"{where}: {fn!r} is a coroutine function; EventBus runs functions synchronously on the replica: write it as a plain 'def'"
        raise FunctionError(msg)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust them
    try:
        sig.bind(object())
    except TypeError:
        msg = (
            f"{where}: {getattr(fn, '__qualname__', fn)!r} has signature {sig}; a pipeline function "
            "takes exactly one positional argument: the event (or, with batch=True, the list of events)"
        )
        raise FunctionError(msg) from None


def function_spec(fn: Any) -> FunctionSpec:
    """The :class:`FunctionSpec` of a function (a per-event default when undecorated)."""
    spec = getattr(fn, _ATTR, None)
    if isinstance(spec, FunctionSpec):
        return spec
    return FunctionSpec(name=getattr(fn, "__qualname__", repr(fn)), batch=False)


def resolve_function(ref: str) -> Callable[..., Any]:
    """Import a function named ``"package.module:attr"``.

    Raises:
        FunctionError: when the reference is malformed, the module cannot be imported, the
            attribute is missing, or the object is not a suitable function.
    """
    if not _REF.match(ref):
        msg = f"function reference {ref!r} is not of the form 'package.module:function'"
        raise FunctionError(msg)
    module_name, attr = ref.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        msg = (
            f"function {ref!r}: cannot import module {module_name!r} ({exc}); make sure it is "
            "installed or on PYTHONPATH where the pipeline runs"
        )
        raise FunctionError(msg) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = sorted(n for n in dir(module) if not n.startswith("_"))
            import difflib

            close = difflib.get_close_matches(part, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            msg = f"function {ref!r}: module {module_name!r} has no attribute {part!r}{hint}"
            raise FunctionError(msg) from None
    check_signature(obj, where=f"function {ref!r}")
    return obj  # type: ignore[no-any-return]
