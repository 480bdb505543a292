"""The pacing loop of an ``allocate`` step (``pacing:``), as the step calls it per batch: count
the traffic, cap each budget at the interval's paced share, calibrate the predicted rates,
record the decisions, and settle them from feedback events (or their timeout), correcting the
used budgets. The plan's arithmetic is in :mod:`._allocate_pacing`, the ledger in
:mod:`._allocate_feedback`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Protocol

from eventbus import cel
from eventbus.errors import ConfigError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.pipelines._activation import activation_builder, check_identifiers
from eventbus.pipelines.steps._allocate_feedback import DecisionLedger, encode, settle_outcome
from eventbus.pipelines.steps._allocate_pacing import Calibration, PacingPlan
from eventbus.pipelines.steps._allocate_pacing_config import PacingConfig
from eventbus.pipelines.steps._allocate_store import AllocateStore

__all__ = ["PacedStep", "Pacer"]


class PacedStep(Protocol):
    """What the pacer needs of its step (:class:`~._allocate.AllocateStep` is one)."""

    id: str
    pipeline: str
    budget: Any
    store: AllocateStore

    def use_of(self, segment: int, item: int, weights: dict[str, float]) -> Any: ...


def _compile(step_id: str, field: str, source: str) -> cel.Program:
    try:
        program = cel.compile(source)
        check_identifiers(program)
    except cel.CELError as e:
        msg = f"step {step_id!r}: pacing.feedback.{field}: {e}"
        raise ConfigError(msg) from None
    return program


class Pacer:
    """The pacing loop of one allocate step (see the module docstring).

    Args:
        step: the step.
        config: its ``pacing:``.
        mask: the catalogue's segment mask ``(K, G)``.
        clock: epoch seconds (tests drive it).
    """

    def __init__(
        self,
        step: PacedStep,
        config: PacingConfig,
        mask: Any,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.step = step
        self.config = config
        self.clock = clock
        self.plan = PacingPlan(config, mask)
        self.feedback = config.feedback
        self.calibration = (
            Calibration(config.calibration, int(mask.shape[1]))
            if config.calibration is not None
            else None
        )
        self.ledger = DecisionLedger(step.id, step.pipeline, step.store.redis)
        self.counters = {
            "feedback_settled": 0,
            "feedback_unknown": 0,
            "feedback_expired": 0,
            "feedback_errors": 0,
        }
        self.seen = 0  # requests this replica counted (the forecast's units)
        self.in_flight: Any = None  # the in-flight decisions' recalibration, this interval
        self._when = self._decision = self._outcome = None
        if self.feedback is not None:
            self._when = _compile(step.id, "when", self.feedback.when)
            self._decision = _compile(step.id, "decision", self.feedback.decision)
            self._outcome = _compile(step.id, "outcome", self.feedback.outcome)
            self._build = activation_builder(
                self._when.variables | self._decision.variables | self._outcome.variables
            )

    # -- per batch -----------------------------------------------------------------------------

    def split(self, events: list[CloudEvent], results: list[Any]) -> list[int]:
        """Settle the feedback events among ``events`` (their results: None, absorbed, or a
        Failure); the indices of the requests, the others."""
        if self._when is None:
            return list(range(len(events)))
        requests: list[int] = []
        feedback: list[tuple[int, str, float]] = []
        assert self._decision is not None and self._outcome is not None
        for i, e in enumerate(events):
            field = "when"
            try:
                act = self._build(e)
                if self._when.evaluate(act) is not True:
                    requests.append(i)
                    continue
                field = "decision"
                decision = self._decision.evaluate(act)
                if not isinstance(decision, str) or not decision:
                    msg = f"feedback decision must be a request id (a non-empty string); got {decision!r:.80}"
                    raise ValueError(msg)
                field = "outcome"
                feedback.append((i, decision, settle_outcome(self._outcome.evaluate(act))))
            except (cel.CELError, ValueError, TypeError) as exc:
                self.counters["feedback_errors"] += 1
                message = f"pacing.feedback.{field}: {exc}"
                results[i] = Failure(self.step.id, type(exc).__name__, message)
        if feedback:
            records = self.ledger.take([d for _, d, _ in feedback])
            settled = []
            for (i, _, outcome), record in zip(feedback, records):
                results[i] = None  # absorbed into the used budgets
                if record is None:
                    self.counters["feedback_unknown"] += 1
                else:
                    settled.append((record, outcome))
            self.counters["feedback_settled"] += len(settled)
            self._settle(settled)
        return requests

    def expire(self) -> None:
        """Settle decisions whose feedback did not come within ``timeout_s``."""
        if self.feedback is None:
            return
        records = self.ledger.expired(self.clock() - self.feedback.timeout_s)
        self.counters["feedback_expired"] += len(records)
        self._settle([(r, self.feedback.missing_outcome) for r in records])

    def _settle(self, settled: list[tuple[str, float]]) -> None:
        import torch

        if not settled:
            return
        assert self.feedback is not None
        name = self.feedback.weight
        delta = torch.zeros_like(self.step.budget)
        # with a weight, the correction is linear in (outcome - reserved weight) on that weight's
        # rows: summed per (segment, item), one consumption vector per pair, not per decision
        by_pair: dict[tuple[int, int], float] = {}
        for record, outcome in settled:
            segment, item, weights, predicted = json.loads(record)
            if name is None:
                delta += self.step.use_of(segment, item, weights) * (outcome - 1.0)
                continue
            if self.calibration is not None:
                self.calibration.update(segment, predicted, outcome)
            change = outcome - weights.get(name, 1.0)
            by_pair[segment, item] = by_pair.get((segment, item), 0.0) + change
        for (segment, item), change in by_pair.items():
            if change != 0:
                one = self.step.use_of(segment, item, {name: 1.0})  # type: ignore[dict-item]
                none = self.step.use_of(segment, item, {name: 0.0})  # type: ignore[dict-item]
                delta += change * (one - none)
        self.step.store.adjust(delta.tolist())

    def observe(self, segments: list[int]) -> None:
        """Count the batch's requests in the current interval's traffic."""
        self.seen += len(segments)
        self.plan.forecast.observe(self.plan.interval(self.clock()), segments)

    def caps(self) -> list[float]:
        """What each budget's used amount may reach in the current interval."""
        import torch

        plan = self.plan
        index = plan.interval(self.clock())
        if plan.index != index or self.in_flight is None:
            used = torch.tensor(self.step.store.used_budget(), dtype=torch.float64)
            self.in_flight = self._recalibrated()
            plan.roll(index, used + self.in_flight, self.step.budget)
        return [float(x) for x in plan.caps - self.in_flight]

    def _recalibrated(self) -> Any:
        """What the decisions in flight are expected to consume beyond what they reserved, at
        each segment's current calibration factor (a scan of the ledger, once per interval)."""
        import torch

        extra = torch.zeros_like(self.step.budget)
        if self.calibration is None or self.feedback is None or self.feedback.weight is None:
            return extra
        name = self.feedback.weight
        by_pair: dict[tuple[int, int], float] = {}
        for record in self.ledger.records():
            segment, item, weights, predicted = json.loads(record)
            change = predicted * self.calibration.factor(segment) - weights[name]
            by_pair[segment, item] = by_pair.get((segment, item), 0.0) + change
        for (segment, item), change in by_pair.items():
            if change != 0:
                one = self.step.use_of(segment, item, {name: 1.0})
                none = self.step.use_of(segment, item, {name: 0.0})
                extra += change * (one - none)
        return extra

    def calibrate(self, segments: list[int], wrows: dict[str, list[list[float]]]) -> list[Any]:
        """Scale the feedback's weight (the predicted rate) of each request by its segment's
        factor, in place; each request's raw row (for the decision record)."""
        if self.calibration is None or self.feedback is None or self.feedback.weight is None:
            return [None] * len(segments)
        rows = wrows[self.feedback.weight]
        raw = [list(r) for r in rows]
        for b, f in enumerate(self.calibration.factors(segments)):
            if f != 1.0:
                rows[b] = [x * f for x in rows[b]]
        return raw

    def decided(
        self,
        decisions: list[tuple[str, int, int, dict[str, float], float]],
    ) -> None:
        """Record granted decisions (id, segment, item, weights reserved at, raw predicted rate)
        awaiting feedback."""
        if self.feedback is None or not decisions:
            return
        self.ledger.add([(d, encode(s, j, w, p)) for d, s, j, w, p in decisions], self.clock())

    # -- the planner's budget and the dashboard ------------------------------------------------

    def window_budget(self, remaining: Any, window_segments: Any, seen_total: int) -> Any:
        """The budget of a re-solve over a window of requests (``window_segments``: how many of
        each segment): the remaining budget (in-flight decisions recalibrated) times the
        window's requests in each resource's segments over the requests the forecast expects in
        them for the rest of the period; the duals then price the budget for the traffic to
        come, and the interval's cap holds off bursts."""
        import torch

        self.caps()  # roll the plan into the current interval
        plan = self.plan
        remaining = (remaining - self.in_flight).clamp_min(0.0)
        scale = max(1.0, seen_total / max(self.seen, 1))  # all replicas' requests per ours
        # late in the period the window may hold more requests than are still to come: it then
        # gets more than what remains, at the same budget per request
        window = plan.mask @ window_segments
        ahead = plan.ahead * scale
        base = torch.where(ahead > 0, remaining * window / ahead.clamp_min(1e-300), remaining)
        # the spend-vs-plan correction, never past what remains (unless the window already is)
        return torch.minimum(base * plan.correction, torch.maximum(base, remaining))

    def figures(self) -> dict[str, Any]:
        """Budget spent vs plan in the current interval, and the feedback counters."""
        out: dict[str, Any] = dict(self.counters)
        out.update(self.plan.figures(self.step.budget))
        if self.plan.start_used is not None:
            import torch

            used = torch.tensor(self.step.store.used_budget(), dtype=torch.float64)
            out["pacing_spent"] = float((used - self.plan.start_used).sum())
            out["budget_used_fraction"] = float(
                used.sum() / self.step.budget.sum().clamp_min(1e-300)
            )
        if self.feedback is not None:
            out["feedback_pending"] = self.ledger.pending()
        return out
