"""The ``allocate`` step: pick an item per request at the latest dual prices, within budgets.

For each request event the step evaluates its revenue per item (``revenue:``, a CEL list), its
segment (``segment:``) and, for each named weight of the catalogue's resources (``weights:``, e.g.
a redemption probability per item, so that a money budget counts expected spend), that weight
per item; then it picks ``argmax_j (c_j - λ·m_j)`` or nothing when every reduced
cost is negative (:func:`eventbus.solver.decide`, vectorised over the batch), and then asks the
safeguard: a Lua script in Redis adds the item's consumption to the used amounts only if no
budget would go past its limit, so no budget is ever exceeded, whichever replica decides.

λ is read from Redis (``eventbus:duals:<pipeline>:<step>``, a JSON list of K numbers, written
by :func:`publish_duals` or ``eventbus solve --publish``) at most every ``refresh_s``; until
one is published λ is 0 (greedy by revenue, the safeguard still holding every budget).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TypeGuard

from eventbus import cel
from eventbus.errors import ConfigError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.pipelines._activation import activation_builder, check_identifiers
from eventbus.pipelines._step import Step, StepContext, Timer
from eventbus.pipelines.steps._allocate_config import (
    AllocateConfig,
    PlanConfig,
    duals_key,
    effective_rows,
    example,
    expressions,
    publish_duals,
)
from eventbus.pipelines.steps._allocate_pacer import Pacer
from eventbus.pipelines.steps._allocate_planner import AllocatePlanner
from eventbus.pipelines.steps._allocate_store import AllocateStore
from eventbus.registry import steps

__all__ = [
    "AllocateConfig",
    "AllocatePlanner",
    "AllocateStep",
    "PlanConfig",
    "duals_key",
    "publish_duals",
]


class AllocateStep(Step):
    """Runtime of an ``allocate`` step (see the module docstring).

    Args:
        step_id: the step id.
        spec: its configuration.
        pipeline: the pipeline name (Redis keys).
        redis_url: where duals and used budgets live; None keeps them in memory (tests).
        base_dirs: where a relative ``catalogue`` path is looked up.
    """

    kind = "allocate"

    def __init__(
        self,
        step_id: str,
        spec: AllocateConfig,
        *,
        pipeline: str,
        redis_url: str | None = None,
        base_dirs: list[str] | None = None,
    ) -> None:
        import torch

        from eventbus.solver import load_problem
        from eventbus.solver._problem import FactorisedConsumption

        self.id = step_id
        self.errors = 0
        self.spec = spec
        path = Path(spec.catalogue)
        if not path.is_absolute():
            for d in [*(base_dirs or []), "."]:
                if (Path(d) / path).exists():
                    path = Path(d) / path
                    break
        problem = load_problem(path)
        cons = problem.consumption
        if not isinstance(cons, FactorisedConsumption):
            msg = f"step {step_id!r}: catalogue {spec.catalogue!r} holds a sparse problem; allocate needs the factorised form (item_cost, segment_mask)"
            raise ConfigError(msg)
        self._item_cost = cons.item_cost.to(torch.float64)
        self._mask = cons.segment_mask.to(torch.float64)
        self.budget = problem.budget.to(torch.float64)
        self.num_items = int(self._item_cost.shape[1])
        self.num_resources = int(self._item_cost.shape[0])
        self._rows = effective_rows(step_id, spec, tuple(cons.row_weight or ()))
        self._revenue = self._compile(spec.revenue)
        self._segment = self._compile(spec.segment)
        self._weights = {name: self._compile(expr) for name, expr in sorted(spec.weights.items())}
        variables = self._revenue.variables | self._segment.variables
        for program in self._weights.values():
            variables |= program.variables
        self._build = activation_builder(variables)
        self.pipeline = pipeline
        self.redis_url = redis_url
        self.store = AllocateStore(step_id, pipeline, redis_url, self.num_resources)
        self.duals = torch.zeros(self.num_resources, dtype=torch.float64)
        self.memory_duals: list[float] | None = None  # in-memory mode: set by tests
        self._read_at = 0.0
        self.counters = {"allocated": 0, "declined": 0, "refused_by_budget": 0}
        self._row_groups: dict[str, Any] = {}
        for k, name in enumerate(self._rows):
            self._row_groups.setdefault(name, []).append(k)
        self._row_groups = {
            name: torch.tensor(ks, dtype=torch.long)
            for name, ks in self._row_groups.items()
            if name in self._weights
        }
        self.pacer: Pacer | None = None
        if spec.pacing is not None:
            self.pacer = Pacer(self, spec.pacing, self._mask)

    @staticmethod
    def _compile(source: str) -> cel.Program:
        program = cel.compile(source)
        check_identifiers(program)
        return program

    def _refresh_duals(self) -> None:
        import torch

        now = time.monotonic()
        if now - self._read_at < self.spec.refresh_s:
            return
        self._read_at = now
        raw: Any = self.memory_duals
        if self.store.redis is not None:
            raw = self.store.read_duals()
        if raw is not None and len(raw) == self.num_resources:
            self.duals = torch.tensor(raw, dtype=torch.float64).clamp_min(0)

    def publish(self, duals: Any) -> None:
        """Publish re-solved duals (to Redis, or in memory in process); the next batch reads them."""
        if self.store.redis is not None:
            publish_duals(self.redis_url or "", self.pipeline, self.id, duals)
        else:
            self.memory_duals = duals.tolist()
        self.expire_duals()

    def expire_duals(self) -> None:
        """Read the duals again at the next batch, whatever ``refresh_s`` says."""
        self._read_at = float("-inf")

    def process(self, events: list[CloudEvent]) -> list[Any]:
        """The events with ``data[output]`` set to the item, or None when declined or when no
        budget can take it; failures for requests whose revenue or segment does not evaluate."""
        import torch

        from eventbus.solver import decide

        self._refresh_duals()
        results: list[Any] = [None] * len(events)
        pacer = self.pacer
        requests = None
        if pacer is not None:
            pacer.expire()
            requests = pacer.split(events, results)
        rows, segs, wrows, idx = self._evaluate(events, results, requests)
        if not idx:
            return results
        raw: list[Any] = [None] * len(idx)
        if pacer is not None:
            pacer.observe(segs)
            raw = pacer.calibrate(segs, wrows)
        revenue = torch.tensor(rows, dtype=torch.float64)
        segment = torch.tensor(segs, dtype=torch.long)
        if self.spec.plan is not None:
            self._record(rows, segs, wrows)
        weights = {name: torch.tensor(w, dtype=torch.float64) for name, w in wrows.items()}
        batch = self.consumption(segment, weights)
        items = decide(self.duals, revenue, batch).tolist()
        cons = []
        for b, (j, s) in enumerate(zip(items, segs)):
            if j < 0:
                cons.append([0.0] * self.num_resources)
                continue
            use = self._item_cost[:, j] * self._mask[:, s]
            for name, rows_k in batch.groups:
                w = batch.weight_of(name)
                if w is not None:
                    use[rows_k] *= w[b, j]
            cons.append(use.tolist())
        limits = pacer.caps() if pacer is not None else self.budget.tolist()
        granted = self.store.reserve([c for c, j in zip(cons, items) if j >= 0], limits)
        g = iter(granted)
        decided = []
        feedback = self.spec.pacing.feedback if self.spec.pacing is not None else None
        for b, (i, j) in enumerate(zip(idx, items)):
            e = events[i]
            chosen = None
            if j < 0:
                self.counters["declined"] += 1
            elif next(g):
                chosen = j
                self.counters["allocated"] += 1
                if feedback is not None:
                    w = {name: v[b][j] for name, v in wrows.items()}
                    predicted = raw[b][j] if raw[b] is not None else 0.0
                    decided.append((str(e.id), segs[b], j, w, predicted))
            else:
                self.counters["refused_by_budget"] += 1
            data = dict(e.data) if isinstance(e.data, dict) else {"value": e.data}
            data[self.spec.output] = chosen
            results[i] = e.replace(data=data)
        if pacer is not None:
            pacer.decided(decided)
        return results

    def _evaluate(
        self, events: list[CloudEvent], results: list[Any], only: list[int] | None = None
    ) -> tuple[list[list[float]], list[int], dict[str, list[list[float]]], list[int]]:
        """Each request's revenue row, segment and weight rows, and the indices of those that
        evaluated (of ``only``, when given); a failure in ``results`` for each that did not."""
        rows, segs, idx = [], [], []
        wrows: dict[str, list[list[float]]] = {name: [] for name in self._weights}
        for i in range(len(events)) if only is None else only:
            e = events[i]
            try:
                act = self._build(e)
                rev = self._revenue.evaluate(act)
                seg = self._segment.evaluate(act)
                if not _numbers(rev, self.num_items):
                    msg = f"revenue must be a list of {self.num_items} numbers (one per item); got {rev!r:.80}"
                    raise TypeError(msg)
                got: dict[str, list[float]] = {}
                for name, program in self._weights.items():
                    w = program.evaluate(act)
                    if not _numbers(w, self.num_items) or min(w, default=0) < 0:
                        msg = f"weights.{name} must be a list of {self.num_items} non-negative numbers (one per item); got {w!r:.80}"
                        raise TypeError(msg)
                    got[name] = w
                if (
                    not isinstance(seg, int)
                    or isinstance(seg, bool)
                    or not 0 <= seg < self._mask.shape[1]
                ):
                    msg = f"segment must be an integer in [0, {self._mask.shape[1]}); got {seg!r}"
                    raise ValueError(msg)
                rows.append([float(x) for x in rev])
                segs.append(int(seg))
                for name, w in got.items():
                    wrows[name].append([float(x) for x in w])
                idx.append(i)
            except (cel.CELError, ValueError, TypeError) as exc:
                self.errors += 1
                results[i] = Failure(self.id, type(exc).__name__, str(exc))
        return rows, segs, wrows, idx

    def consumption(self, segment: Any, weights: dict[str, Any]) -> Any:
        """The :class:`~eventbus.solver.FactorisedConsumption` of requests with these segments
        and weights (a ``(B, m)`` tensor per name of ``weights:``)."""
        from eventbus.solver import FactorisedConsumption

        return FactorisedConsumption(
            self._item_cost, self._mask, segment, weights=weights, row_weight=self._rows
        )

    def use_of(self, segment: int, item: int, weights: dict[str, float]) -> Any:
        """The consumption (a K-vector) of ``item`` for a request of ``segment`` with these
        weights (of the chosen item, per name of ``weights:``)."""
        use = self._item_cost[:, item] * self._mask[:, segment]
        for name, rows_k in self._row_groups.items():
            if name in weights:
                use[rows_k] *= weights[name]
        return use

    def _record(
        self, rows: list[list[float]], segs: list[int], wrows: dict[str, list[list[float]]]
    ) -> None:
        """Keep the latest requests (revenue row, segment, weights) for the planner."""
        assert self.spec.plan is not None
        entries = [
            json.dumps([r, g, {k: v[i] for k, v in wrows.items()}] if wrows else [r, g])
            for i, (r, g) in enumerate(zip(rows, segs))
        ]
        self.store.record(entries, self.spec.plan.window)

    def used_budget(self) -> list[float]:
        """What has been allocated so far, per resource."""
        return self.store.used_budget()

    def stats(self) -> dict[str, Any]:
        if self.pacer is not None:
            return {**self.counters, **self.pacer.figures()}
        return dict(self.counters)

    def timers(self) -> list[Timer]:
        """The nearline planner, when the step has ``plan:``."""
        return [AllocatePlanner(self)] if self.spec.plan is not None else []


def _numbers(value: object, m: int) -> TypeGuard[list[float]]:
    return (
        isinstance(value, list)
        and len(value) == m
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
    )


@steps.register(
    "allocate",
    config=AllocateConfig,
    description="Pick an item per request at dual prices, within budgets.",
    expressions=expressions,
    timers=True,
    example=example,
)
def build_allocate(step_id: str, config: AllocateConfig, context: StepContext) -> AllocateStep:
    """An allocate step (budgets in Redis on the platform, in memory in process)."""
    return AllocateStep(
        step_id,
        config,
        pipeline=context.pipeline,
        redis_url=context.redis_url,
        base_dirs=context.base_dirs or None,
    )
