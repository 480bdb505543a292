"""User functions as pipeline steps: ``@function``, ``module:attr`` references."""

from __future__ import annotations

from eventbus.functions._function import FunctionSpec, function, function_spec, resolve_function

__all__ = ["FunctionSpec", "function", "function_spec", "resolve_function"]
