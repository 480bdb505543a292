"""The nearline planner of an ``allocate`` step: re-solves its duals from the window of recent
requests and publishes them (``plan:``)."""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from eventbus.pipelines._step import Fired, Timer
from eventbus.pipelines.steps._allocate_config import AllocateConfig
from eventbus.pipelines.steps._allocate_store import AllocateStore

__all__ = ["AllocatePlanner", "PlannedStep"]


class PlannedStep(Protocol):
    """What the planner needs of its step (:class:`~._allocate.AllocateStep` is one)."""

    spec: AllocateConfig
    budget: Any
    store: AllocateStore
    pacer: Any  # a Pacer with ``pacing:``, else None

    def consumption(self, segment: Any, weights: dict[str, Any]) -> Any: ...

    def publish(self, duals: Any) -> None: ...


class AllocatePlanner(Timer):
    """Re-solves an allocate step's duals from its window of recent requests and publishes
    them; call :meth:`tick` every second or so (at most one replica solves per period).

    The window's problem: its requests as users, the catalogue's item costs and segment mask,
    and budgets equal to the remaining budget scaled by window / remaining expected requests,
    so the duals price what is left for the traffic still to come; with ``pacing:``, the
    current interval's paced allowance scaled by the window's share of the interval's
    forecast traffic (:meth:`~._allocate_pacer.Pacer.window_budget`).
    """

    def __init__(self, step: PlannedStep) -> None:
        assert step.spec.plan is not None
        self.step = step
        self.plan = step.spec.plan
        self._last = 0.0
        self._previous: Any = None
        self.solves = 0

    def tick(self) -> bool:
        """Re-solve if the period passed and this replica holds the lock; True when it did."""
        import torch

        from eventbus.solver import AllocationProblem, solve

        now = time.monotonic()
        if now - self._last < self.plan.every_s:
            return False
        self._last = now
        step = self.step
        if not step.store.take_plan_lock(self.plan.every_s):
            return False
        entries, seen = step.store.window()
        if len(entries) < 10:
            return False
        names = sorted(step.spec.weights)
        decoded = [json.loads(x) for x in entries]
        if names:  # entries recorded before the step had these weights are left out
            decoded = [d for d in decoded if len(d) >= 3 and sorted(d[2]) == names]
            if len(decoded) < 10:
                return False
        rows, segs = [d[0] for d in decoded], [d[1] for d in decoded]
        weights = {k: torch.tensor([d[2][k] for d in decoded], dtype=torch.float64) for k in names}
        w = len(rows)
        remaining = (
            step.budget - torch.tensor(step.store.used_budget(), dtype=torch.float64)
        ).clamp_min(1e-9)
        if step.pacer is not None:
            # the interval's paced allowance for the share of its traffic the window stands for
            counts = torch.bincount(
                torch.tensor(segs, dtype=torch.long), minlength=int(step.pacer.plan.mask.shape[1])
            ).to(torch.float64)
            budget = step.pacer.window_budget(remaining, counts, seen).clamp_min(1e-9)
        else:
            assert self.plan.expected_requests is not None  # the config requires it
            budget = remaining * (w / max(w, self.plan.expected_requests - seen))
        problem = AllocationProblem(
            torch.tensor(rows, dtype=torch.float64),
            budget,
            step.consumption(torch.tensor(segs, dtype=torch.long), weights),
        )
        result = solve(problem, gap=self.plan.gap, warm_start=self._previous, device="cpu")
        self._previous = result
        self.solves += 1
        step.publish(result.duals)
        return True

    def fire(self) -> Fired | None:
        """One :meth:`tick`; the planner publishes the duals itself, nothing to deliver."""
        self.tick()
        return None
