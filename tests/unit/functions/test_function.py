"""@eventbus.function, references and signature checks."""

from __future__ import annotations

import re

import pytest

import eventbus
from eventbus.errors import FunctionError
from eventbus.functions import function_spec, resolve_function


def test_decorator_records_batch_flag() -> None:
    @eventbus.function(batch=True, name="b")
    def b(events: list[eventbus.CloudEvent]) -> list[eventbus.CloudEvent]:
        return events

    @eventbus.function
    def p(event: eventbus.CloudEvent) -> eventbus.CloudEvent:
        return event

    assert function_spec(b).batch and function_spec(b).name == "b"
    assert not function_spec(p).batch


def test_bad_signature_is_rejected_at_decoration() -> None:
    expect = "takes exactly one positional argument"
    with pytest.raises(FunctionError, match=re.escape(expect)):

        @eventbus.function
        def two(a: object, b: object) -> None: ...


def test_coroutine_rejected() -> None:
    with pytest.raises(FunctionError, match="coroutine function"):

        @eventbus.function
        async def f(e: object) -> None: ...


def test_resolve_errors_name_the_reference() -> None:
    with pytest.raises(
        FunctionError, match=re.escape("is not of the form 'package.module:function'")
    ):
        resolve_function("nocolon")
    with pytest.raises(
        FunctionError,
        match=re.escape(
            "module 'tests.unit.pipelines.funcs' has no attribute 'tag_bach' (did you mean 'tag_batch'?)"
        ),
    ):
        resolve_function("tests.unit.pipelines.funcs:tag_bach")
    fn = resolve_function("tests.unit.pipelines.funcs:tag_batch")
    assert function_spec(fn).batch
