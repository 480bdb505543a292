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

from pydantic import BaseModel, ConfigDict, Field

from eventbus import cel
from eventbus._internal import keys
from eventbus.errors import ConfigError, StateUnavailableError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.pipelines._activation import activation_builder, check_identifiers
from eventbus.pipelines._step import Fired, Step, StepContext, Timer
from eventbus.registry import steps

__all__ = [
    "AllocateConfig",
    "AllocatePlanner",
    "AllocateStep",
    "PlanConfig",
    "duals_key",
    "publish_duals",
]


class PlanConfig(BaseModel):
    """Nearline re-planning: re-solve the duals from a window of recent requests."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    every_s: float = Field(
        default=30,
        gt=0,
        le=86400,
        description="Re-solve at most this often (one replica solves; a Redis lock).",
    )
    window: int = Field(
        default=10_000, ge=10, le=10_000_000, description="Most recent requests the re-solve uses."
    )
    expected_requests: int = Field(
        ge=1,
        description="Requests expected over the whole budget period: the window gets the remaining budget "
        "times window / (expected_requests - requests seen so far).",
    )
    gap: float = Field(
        default=1e-3, gt=0, lt=1, description="Certified relative gap of each re-solve."
    )


class AllocateConfig(BaseModel):
    """Online allocation at dual prices (``steps: [{id: ..., allocate: {...}}]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    catalogue: str = Field(
        min_length=1,
        description="A problem file of eventbus.solver (.npz/.pt) giving item_cost (K, m), segment_mask "
        "(K, G) and budget (K,); relative paths are read beside the pipeline file.",
    )
    revenue: str = Field(
        min_length=1, description="CEL: the request's revenue for each of the m items (a list)."
    )
    segment: str = Field(
        default="0", min_length=1, description="CEL: the request's segment, an integer in [0, G)."
    )
    weights: dict[str, str] = Field(
        default_factory=dict,
        description="CEL per named weight of the catalogue (its row_weight): the request's weight for "
        "each of the m items (a list of non-negative numbers). Resources counting in a weight use it; "
        "'count' resources (and the unnamed 'weight' of older catalogues, when not given here) count 1.",
    )
    output: str = Field(
        default="item",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="data field set to the chosen item index, or null.",
    )
    refresh_s: float = Field(
        default=1.0, gt=0, le=3600, description="How often the duals are re-read from Redis."
    )
    plan: PlanConfig | None = Field(
        default=None,
        description="Re-solve the duals nearline from recent requests (without a redeploy).",
    )


def duals_key(pipeline: str, step: str) -> str:
    """The Redis key holding the duals of an ``allocate`` step."""
    return keys.duals(pipeline, step)


def publish_duals(redis_url: str, pipeline: str, step: str, duals: Any) -> None:
    """Publish λ to a pipeline's ``allocate`` step; replicas pick it up within ``refresh_s``."""
    from eventbus._internal.redis_client import connect

    values = [float(x) for x in (duals.tolist() if hasattr(duals, "tolist") else duals)]
    connect(redis_url).set(duals_key(pipeline, step), json.dumps(values))


_RESERVE = """
local used = KEYS[1]
local k = tonumber(ARGV[1])
local out = {}
local current = {}
for j = 1, k do current[j] = tonumber(redis.call('HGET', used, j) or '0') end
local base = 2 + k
local i = base
while i <= #ARGV do
  local ok = 1
  for j = 1, k do
    if current[j] + tonumber(ARGV[i + j - 1]) > tonumber(ARGV[1 + j]) + 1e-9 then ok = 0 break end
  end
  if ok == 1 then
    for j = 1, k do
      local c = tonumber(ARGV[i + j - 1])
      if c ~= 0 then
        current[j] = current[j] + c
        redis.call('HINCRBYFLOAT', used, j, ARGV[i + j - 1])
      end
    end
  end
  out[#out + 1] = ok
  i = i + k
end
return out
"""


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
        self._rows = _effective_rows(step_id, spec, tuple(cons.row_weight or ()))
        self._revenue = self._compile(spec.revenue)
        self._segment = self._compile(spec.segment)
        self._weights = {name: self._compile(expr) for name, expr in sorted(spec.weights.items())}
        variables = self._revenue.variables | self._segment.variables
        for program in self._weights.values():
            variables |= program.variables
        self._build = activation_builder(variables)
        self._redis: Any = None
        self._reserve: Any = None
        self._used_key = keys.allocate_used(pipeline, step_id)
        self._window_key = keys.allocate_window(pipeline, step_id)
        self._seen_key = keys.allocate_seen(pipeline, step_id)
        self._lock_key = keys.allocate_plan_lock(pipeline, step_id)
        self.pipeline = pipeline
        self.redis_url = redis_url
        self.memory_window: list[str] = []
        self.memory_seen = 0
        self._duals_key = duals_key(pipeline, step_id)
        if redis_url:
            from eventbus._internal.redis_client import connect

            self._redis = connect(redis_url, socket_timeout=10)
            self._reserve = self._redis.register_script(_RESERVE)
        self.used = [0.0] * self.num_resources  # in-memory mode
        self.duals = torch.zeros(self.num_resources, dtype=torch.float64)
        self.memory_duals: list[float] | None = None  # in-memory mode: set by tests
        self._read_at = 0.0
        self.counters = {"allocated": 0, "declined": 0, "refused_by_budget": 0}

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
        if self._redis is not None:
            try:
                text = self._redis.get(self._duals_key)
            except Exception as e:  # noqa: BLE001
                msg = (
                    f"allocate step {self.id!r}: Redis unavailable ({e}); the batch will be retried"
                )
                raise StateUnavailableError(msg) from None
            raw = json.loads(text) if text else None
        if raw is not None and len(raw) == self.num_resources:
            self.duals = torch.tensor(raw, dtype=torch.float64).clamp_min(0)

    def process(self, events: list[CloudEvent]) -> list[Any]:
        """The events with ``data[output]`` set to the item, or None when declined or when no
        budget can take it; failures for requests whose revenue or segment does not evaluate."""
        import torch

        from eventbus.solver import decide

        self._refresh_duals()
        results: list[Any] = [None] * len(events)
        rows, segs, idx = [], [], []
        wrows: dict[str, list[list[float]]] = {name: [] for name in self._weights}
        for i, e in enumerate(events):
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
        if not idx:
            return results
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
        granted = self._reserve_budget([c for c, j in zip(cons, items) if j >= 0])
        g = iter(granted)
        for i, j in zip(idx, items):
            e = events[i]
            chosen = None
            if j < 0:
                self.counters["declined"] += 1
            elif next(g):
                chosen = j
                self.counters["allocated"] += 1
            else:
                self.counters["refused_by_budget"] += 1
            data = dict(e.data) if isinstance(e.data, dict) else {"value": e.data}
            data[self.spec.output] = chosen
            results[i] = e.replace(data=data)
        return results

    def consumption(self, segment: Any, weights: dict[str, Any]) -> Any:
        """The :class:`~eventbus.solver.FactorisedConsumption` of requests with these segments
        and weights (a ``(B, m)`` tensor per name of ``weights:``)."""
        from eventbus.solver import FactorisedConsumption

        return FactorisedConsumption(
            self._item_cost, self._mask, segment, weights=weights, row_weight=self._rows
        )

    def _record(
        self, rows: list[list[float]], segs: list[int], wrows: dict[str, list[list[float]]]
    ) -> None:
        """Keep the latest requests (revenue row, segment, weights) for the planner."""
        assert self.spec.plan is not None
        window = self.spec.plan.window
        entries = [
            json.dumps([r, g, {k: v[i] for k, v in wrows.items()}] if wrows else [r, g])
            for i, (r, g) in enumerate(zip(rows, segs))
        ]
        if self._redis is None:
            self.memory_window = (self.memory_window + entries)[-window:]
            self.memory_seen += len(entries)
            return
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.rpush(self._window_key, *entries)
            pipe.ltrim(self._window_key, -window, -1)
            pipe.incrby(self._seen_key, len(entries))
            pipe.execute()
        except Exception as e:  # noqa: BLE001
            msg = f"allocate step {self.id!r}: Redis unavailable ({e}); the batch will be retried"
            raise StateUnavailableError(msg) from None

    def _reserve_budget(self, consumption: list[list[float]]) -> list[bool]:
        if not consumption:
            return []
        budget = self.budget.tolist()
        if self._reserve is None:
            out = []
            for c in consumption:
                ok = all(u + x <= b + 1e-9 for u, x, b in zip(self.used, c, budget))
                if ok:
                    self.used = [u + x for u, x in zip(self.used, c)]
                out.append(ok)
            return out
        args: list[Any] = [self.num_resources, *budget]
        for c in consumption:
            args += c
        try:
            return [bool(x) for x in self._reserve(keys=[self._used_key], args=args)]
        except Exception as e:  # noqa: BLE001
            msg = f"allocate step {self.id!r}: budget safeguard in Redis unavailable ({e}); the batch will be retried"
            raise StateUnavailableError(msg) from None

    def used_budget(self) -> list[float]:
        """What has been allocated so far, per resource."""
        if self._redis is None:
            return list(self.used)
        raw = self._redis.hgetall(self._used_key)
        return [float(raw.get(str(k + 1).encode(), 0)) for k in range(self.num_resources)]

    def stats(self) -> dict[str, Any]:
        return dict(self.counters)

    def timers(self) -> list[Timer]:
        """The nearline planner, when the step has ``plan:``."""
        return [AllocatePlanner(self)] if self.spec.plan is not None else []


class AllocatePlanner(Timer):
    """Re-solves an allocate step's duals from its window of recent requests and publishes
    them; call :meth:`tick` every second or so (at most one replica solves per period).

    The window's problem: its requests as users, the catalogue's item costs and segment mask,
    and budgets equal to the remaining budget scaled by window / remaining expected requests,
    so the duals price what is left for the traffic still to come.
    """

    def __init__(self, step: AllocateStep) -> None:
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
        r = step._redis
        if r is not None:
            if not r.set(step._lock_key, b"1", nx=True, px=int(self.plan.every_s * 1000)):
                return False
            entries = [x.decode() for x in r.lrange(step._window_key, 0, -1)]
            seen = int(r.get(step._seen_key) or 0)
        else:
            entries, seen = list(step.memory_window), step.memory_seen
        if len(entries) < 10:
            return False
        names = sorted(step._weights)
        decoded = [json.loads(x) for x in entries]
        if names:  # entries recorded before the step had these weights are left out
            decoded = [d for d in decoded if len(d) >= 3 and sorted(d[2]) == names]
            if len(decoded) < 10:
                return False
        rows, segs = [d[0] for d in decoded], [d[1] for d in decoded]
        weights = {k: torch.tensor([d[2][k] for d in decoded], dtype=torch.float64) for k in names}
        w = len(rows)
        remaining = (step.budget - torch.tensor(step.used_budget(), dtype=torch.float64)).clamp_min(
            1e-9
        )
        share = w / max(w, self.plan.expected_requests - seen)
        problem = AllocationProblem(
            torch.tensor(rows, dtype=torch.float64),
            remaining * share,
            step.consumption(torch.tensor(segs, dtype=torch.long), weights),
        )
        result = solve(problem, gap=self.plan.gap, warm_start=self._previous, device="cpu")
        self._previous = result
        self.solves += 1
        if r is not None:
            publish_duals(step.redis_url or "", step.pipeline, step.id, result.duals)
        else:
            step.memory_duals = result.duals.tolist()
        step._read_at = 0.0
        return True

    def fire(self) -> Fired | None:
        """One :meth:`tick`; the planner publishes the duals itself, nothing to deliver."""
        self.tick()
        return None


def _numbers(value: object, m: int) -> TypeGuard[list[float]]:
    return (
        isinstance(value, list)
        and len(value) == m
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
    )


def _effective_rows(step_id: str, spec: AllocateConfig, rows: tuple[str, ...]) -> tuple[str, ...]:
    """Each resource's weight as the step applies it; ConfigError for a weight without CEL."""
    from eventbus.solver._factorised import COUNT

    used = sorted({r for r in rows if r != COUNT})
    unknown = sorted(set(spec.weights) - set(used))
    if unknown:
        msg = (
            f"step {step_id!r}: weights {unknown} are not weights of catalogue {spec.catalogue!r} "
            f"(its resources count in {used or 'no weight'}); remove them or fix the names"
        )
        raise ConfigError(msg)
    # the unnamed 'weight' of older catalogues was never applied by this step: it still counts 1
    missing = [r for r in used if r not in spec.weights and r != "weight"]
    if missing:
        msg = (
            f"step {step_id!r}: catalogue {spec.catalogue!r} has resources counting in weights "
            f"{missing} and the step gives no CEL for them; add weights: {{{missing[0]}: <CEL list of "
            f"the request's {missing[0]} per item>}}"
        )
        raise ConfigError(msg)
    return tuple(r if r in spec.weights else COUNT for r in rows)


def _expressions(raw: Any) -> list[tuple[tuple[int | str, ...], str, bool]]:
    if not isinstance(raw, dict):
        return []
    return [
        ((field,), raw[field], False)
        for field in ("revenue", "segment")
        if isinstance(raw.get(field), str) and raw[field]
    ] + [
        (("weights", name), expr, False)
        for name, expr in (raw.get("weights") or {}).items()
        if isinstance(raw.get("weights"), dict) and isinstance(expr, str) and expr
    ]


def _example(folder: Any) -> dict[str, Any]:
    """A working config over a small catalogue written into ``folder`` (behaviour suites)."""
    import torch

    from eventbus.solver import AllocationProblem, FactorisedConsumption, save_problem

    cons = FactorisedConsumption(
        torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0]]), torch.zeros(1, dtype=torch.long)
    )
    save_problem(
        AllocationProblem(torch.tensor([[1.0, 1.0]]), torch.tensor([10.0]), cons),
        Path(folder) / "catalogue.npz",
    )
    return {"catalogue": "catalogue.npz", "revenue": "[1.0, 2.0]"}


@steps.register(
    "allocate",
    config=AllocateConfig,
    description="Pick an item per request at dual prices, within budgets.",
    expressions=_expressions,
    timers=True,
    example=_example,
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
