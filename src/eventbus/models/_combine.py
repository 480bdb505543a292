"""Combiners of an ensemble's outputs: ``fn(outputs: list[Tensor], weights: list[float]) -> Tensor``.

Built in: ``mean``, ``weighted`` (weights normalised to sum 1), ``max``, ``min``. Others are
registered by name (:func:`register_combiner`) or named by import path ``module:attr``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventbus.errors import ConfigError

__all__ = ["Combiner", "combiner", "register_combiner"]

Combiner = Callable[[list[Any], list[float]], Any]
_REGISTERED: dict[str, Combiner] = {}


def _mean(outputs: list[Any], weights: list[float]) -> Any:
    import torch

    return torch.stack(outputs).mean(dim=0)


def _weighted(outputs: list[Any], weights: list[float]) -> Any:
    import torch

    w = torch.tensor(weights, dtype=outputs[0].dtype)
    w = w / w.sum()
    return (torch.stack(outputs) * w.reshape(-1, *([1] * outputs[0].dim()))).sum(dim=0)


def _max(outputs: list[Any], weights: list[float]) -> Any:
    import torch

    return torch.stack(outputs).amax(dim=0)


def _min(outputs: list[Any], weights: list[float]) -> Any:
    import torch

    return torch.stack(outputs).amin(dim=0)


_BUILTIN: dict[str, Combiner] = {"mean": _mean, "weighted": _weighted, "max": _max, "min": _min}


def register_combiner(name: str) -> Callable[[Combiner], Combiner]:
    """Register an ensemble combiner under ``name`` (``combine: name`` in the step).

    Example:
        >>> import eventbus.models
        >>> @eventbus.models.register_combiner("median")
        ... def median(outputs, weights):
        ...     import torch
        ...     return torch.stack(outputs).median(dim=0).values
    """

    def deco(fn: Combiner) -> Combiner:
        _REGISTERED[name] = fn
        return fn

    return deco


def combiner(name: str) -> Combiner:
    """The combiner of a name: built in, registered, or ``module:attr``.

    Raises:
        ConfigError: unknown name, or an import path that does not resolve.
    """
    if name in _BUILTIN:
        return _BUILTIN[name]
    if name in _REGISTERED:
        return _REGISTERED[name]
    if ":" in name:
        from eventbus.models._artifact import import_ref

        try:
            return import_ref(name, what="ensemble combiner")  # type: ignore[no-any-return]
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(str(exc)) from None
    known = ", ".join([*_BUILTIN, *sorted(_REGISTERED)])
    msg = f"unknown ensemble combiner {name!r}; use one of {known}, or 'module:attr' of fn(outputs, weights)"
    raise ConfigError(msg)
