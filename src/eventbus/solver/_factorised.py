"""Factorised consumption: per-resource item costs and segment masks, each row's own weight.

``m[i, j, k] = W_k[i, j] * item_cost[k, j] * segment_mask[k, segment[i]]`` where ``W_k`` is the
weight resource ``k`` counts in: one of several named ``(n, m)`` weight matrices (a redemption
probability, so that a money budget counts expected spend) or ``"count"`` (coefficient 1: an
inventory counts coupons). One pass over the data costs ``O(n * m)`` per weight in use, whatever
``K``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import torch

from eventbus.errors import SolverError

__all__ = ["COUNT", "FactorisedConsumption"]

COUNT = "count"
"""The ``row_weight`` of a resource that counts units (coefficient 1 per user and item)."""

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _bad(what: str, got: str, fix: str) -> SolverError:
    return SolverError(f"{what}; got {got}; {fix}")


def float_tensor(name: str, value: object, ndim: int) -> torch.Tensor:
    """``value`` if it is a floating-point tensor of ``ndim`` dimensions, else a SolverError."""
    if not isinstance(value, torch.Tensor):
        raise _bad(
            f"{name} must be a torch.Tensor",
            type(value).__name__,
            "convert it with torch.as_tensor(...)",
        )
    if not value.is_floating_point():
        raise _bad(
            f"{name} must be a floating-point tensor",
            f"dtype {value.dtype}",
            "cast it with .float()",
        )
    if value.dim() != ndim:
        raise _bad(
            f"{name} must have {ndim} dimension(s)", f"shape {tuple(value.shape)}", "reshape it"
        )
    return value


def check_finite_nonneg(name: str, value: torch.Tensor, *, positive: bool = False) -> None:
    """A SolverError naming ``name`` unless every entry is finite and ``>= 0`` (``> 0``)."""
    if value.numel() == 0:
        return
    if not bool(torch.isfinite(value).all()):
        raise _bad(
            f"{name} must be finite", "NaN or infinity", "replace them (use 0 for 'no consumption')"
        )
    low = float(value.min())
    if low < 0 or (positive and low <= 0):
        kind = "positive" if positive else "non-negative"
        raise _bad(
            f"{name} must be {kind}",
            f"a minimum of {low!r}",
            f"clip it, e.g. {name}.clamp_min(...)",
        )


@dataclass(frozen=True)
class FactorisedConsumption:
    """Consumption ``m[i, j, k] = W_k[i, j] * item_cost[k, j] * segment_mask[k, segment[i]]``.

    Each resource ``k`` picks its coefficient with ``row_weight[k]``: the name of one of
    ``weights`` (``(n, m)`` matrices, e.g. a redemption probability: a money budget then counts
    expected spend ``face value * probability``) or ``"count"`` (``W_k = 1``: an inventory counts
    coupons). ``weight`` is the single unnamed weight of earlier versions, named ``"weight"``.
    Without ``row_weight`` every row uses the only weight given, or counts when none is.

    Args:
        item_cost: ``(K, m)`` non-negative; resource ``k``'s use per unit of item ``j`` (0 outside
            the resource's item subset).
        segment_mask: ``(K, G)`` non-negative, usually 0/1; whether resource ``k`` applies to users
            of segment ``g``.
        segment: ``(n,)`` integer segment of each user, in ``[0, G)``.
        weight: optional ``(n, m)`` non-negative weight, named ``"weight"``.
        weights: named ``(n, m)`` non-negative weights (names ``^[a-z][a-z0-9_]*$``, not ``count``).
        row_weight: ``K`` names, one per resource: a weight's name or ``"count"``.

    Example:
        >>> import torch
        >>> seg = torch.zeros(2, dtype=torch.long)
        >>> cons = FactorisedConsumption(
        ...     torch.ones(2, 3), torch.ones(2, 1), seg,
        ...     weights={"redeem": torch.full((2, 3), 0.5)}, row_weight=("redeem", "count"))
        >>> cons.num_resources, cons.row_weight
        (2, ('redeem', 'count'))
    """

    item_cost: torch.Tensor
    segment_mask: torch.Tensor
    segment: torch.Tensor
    weight: torch.Tensor | None = None
    weights: Mapping[str, torch.Tensor] = field(default_factory=dict)
    row_weight: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        float_tensor("item_cost", self.item_cost, 2)
        float_tensor("segment_mask", self.segment_mask, 2)
        k_num = self.item_cost.shape[0]
        if self.segment_mask.shape[0] != k_num:
            raise _bad(
                "segment_mask must have one row per resource (item_cost's first dimension)",
                f"{self.segment_mask.shape[0]} rows for {k_num} resources",
                "give segment_mask the shape (K, num_segments)",
            )
        seg = self.segment
        if (
            not isinstance(seg, torch.Tensor)
            or seg.dtype not in (torch.int32, torch.int64)
            or seg.dim() != 1
        ):
            got = f"{getattr(seg, 'dtype', type(seg).__name__)} of shape {tuple(getattr(seg, 'shape', ()))}"
            raise _bad(
                "segment must be a 1-D int64 tensor (one segment per user)",
                got,
                "use torch.as_tensor(..., dtype=torch.long)",
            )
        if seg.numel() and (int(seg.min()) < 0 or int(seg.max()) >= self.segment_mask.shape[1]):
            raise _bad(
                f"segment values must lie in [0, {self.segment_mask.shape[1]}) (segment_mask's columns)",
                f"range [{int(seg.min())}, {int(seg.max())}]",
                "renumber the segments or widen segment_mask",
            )
        named = self._named_weights()
        want = (seg.shape[0], self.item_cost.shape[1])
        for name, w in named.items():
            label = (
                "weight" if name == "weight" and self.weight is not None else f"weights[{name!r}]"
            )
            float_tensor(label, w, 2)
            if tuple(w.shape) != want:
                raise _bad(
                    f"{label} must have shape (num_users, num_items)",
                    f"{tuple(w.shape)}",
                    f"give it shape {want}",
                )
            check_finite_nonneg(label, w)
        object.__setattr__(self, "weights", named)
        object.__setattr__(self, "row_weight", self._rows(named, k_num))
        check_finite_nonneg("item_cost", self.item_cost)
        check_finite_nonneg("segment_mask", self.segment_mask)

    def _named_weights(self) -> dict[str, torch.Tensor]:
        if not isinstance(self.weights, Mapping):
            raise _bad(
                "weights must map names to (n, m) tensors",
                type(self.weights).__name__,
                'pass e.g. weights={"redeem": probability}',
            )
        named = dict(self.weights)
        for name in named:
            if not isinstance(name, str) or not _NAME.match(name) or name == COUNT:
                raise _bad(
                    "weight names must match ^[a-z][a-z0-9_]*$ and not be 'count' (reserved for "
                    "rows with coefficient 1)",
                    repr(name),
                    "rename the weight",
                )
        if self.weight is not None:
            if "weight" in named:
                raise _bad(
                    "weight is the weight named 'weight'; weights may not name another",
                    "both weight= and weights['weight']",
                    "give only one of them",
                )
            named = {"weight": self.weight, **named}
        return named

    def _rows(self, named: dict[str, torch.Tensor], k_num: int) -> tuple[str, ...]:
        rows = self.row_weight
        if rows is None:
            if len(named) > 1:
                raise _bad(
                    "row_weight must say which weight each resource counts in when several are given",
                    f"weights {sorted(named)} and no row_weight",
                    f"pass row_weight with {k_num} names (a weight's name or 'count')",
                )
            return (next(iter(named)) if named else COUNT,) * k_num
        if isinstance(rows, str) or not all(isinstance(r, str) for r in rows):
            raise _bad(
                "row_weight must be a sequence of names, one per resource",
                repr(rows)[:80],
                "e.g. row_weight=('redeem', 'count')",
            )
        rows = tuple(rows)
        if len(rows) != k_num:
            raise _bad(
                "row_weight must have one name per resource",
                f"{len(rows)} names for {k_num} resources",
                f"give {k_num} names",
            )
        unknown = sorted({r for r in rows if r != COUNT and r not in named})
        if unknown:
            raise _bad(
                f"row_weight names weights that are not given (known: {[*sorted(named), COUNT]})",
                f"{unknown}",
                "add them to weights= or use 'count'",
            )
        return rows

    @property
    def num_resources(self) -> int:
        """``K``, the number of resource rows."""
        return int(self.item_cost.shape[0])

    @property
    def num_segments(self) -> int:
        """``G``, the number of user segments."""
        return int(self.segment_mask.shape[1])

    @cached_property
    def groups(self) -> tuple[tuple[str, torch.Tensor], ...]:
        """``(weight name, rows)`` per weight in use, in order of first use (``rows``: int64)."""
        assert self.row_weight is not None
        order: dict[str, list[int]] = {}
        for k, name in enumerate(self.row_weight):
            order.setdefault(name, []).append(k)
        dev = self.item_cost.device
        return tuple(
            (name, torch.tensor(ks, dtype=torch.long, device=dev)) for name, ks in order.items()
        )

    def weight_of(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor | None:
        """Rows ``[start, stop)`` of the weight ``name``; ``None`` for ``"count"``."""
        return None if name == COUNT else self.weights[name][start:stop]

    def _replace(
        self, segment: torch.Tensor, weights: dict[str, torch.Tensor], device: object = None
    ) -> FactorisedConsumption:
        ic, sm = self.item_cost, self.segment_mask
        if device is not None:
            ic, sm = ic.to(device), sm.to(device)  # type: ignore[call-overload]
        return FactorisedConsumption(ic, sm, segment, weights=weights, row_weight=self.row_weight)

    def slice_users(self, start: int, stop: int) -> FactorisedConsumption:
        """The consumption of users ``[start, stop)``."""
        return self._replace(
            self.segment[start:stop], {k: v[start:stop] for k, v in self.weights.items()}
        )

    def to(self, device: torch.device | str) -> FactorisedConsumption:
        """The same consumption with every tensor on ``device``."""
        return self._replace(
            self.segment.to(device), {k: v.to(device) for k, v in self.weights.items()}, device
        )

    def prices(self, lam: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """``(weight name, pi (G, m) float64)`` per group: ``lam . m = sum W * pi[segment]``."""
        lam = lam.to(self.item_cost.device, torch.float64)
        s64, w64 = self.segment_mask.double(), self.item_cost.double()
        return [(name, (s64[rows] * lam[rows, None]).T @ w64[rows]) for name, rows in self.groups]

    def row(self, k: int, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """``m[start:stop, :, k]`` as a dense ``(users, m)`` tensor."""
        assert self.row_weight is not None
        seg = self.segment[start:stop]
        vals = self.item_cost[k][None, :] * self.segment_mask[k][seg][:, None]
        w = self.weight_of(self.row_weight[k], start, stop)
        return vals if w is None else w * vals

    def dense(self) -> torch.Tensor:
        """The dense ``(n, m, K)`` consumption (small problems only: tests, references)."""
        return torch.stack([self.row(k) for k in range(self.num_resources)], dim=2)
