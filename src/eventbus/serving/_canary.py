"""Canary upgrades: a new version of a pipeline's steps takes a growing share of the events,
is compared with the serving version at each step, and is promoted or rolled back.

The canary runs inside the serving replicas, beside the serving version's steps: each replica
routes ``weight`` % of its events (by a hash of the event's ``partitionkey`` or ``id``, so an
entity stays on one version) to the canary's steps and the rest to the serving ones. Sources,
sinks, offsets and dedupe are shared, so shifting traffic restarts no replica and can lose no
event; only steps may differ between the two versions (a change of sources, sink or serving
settings is an ordinary deploy). Promotion is an ordinary deploy of the canary's YAML: Ray
Serve then replaces at most 20 % of the replicas at a time (at least one).

State lives in Redis, so a restarted controller resumes a canary where it was:

* ``eventbus:canary:<pipeline>``: the canary's YAML, document, schedule, current weight, and
  the figures at the start of the current step;
* ``eventbus:canary-figures:<pipeline>``: per replica, events / failures / step seconds of
  each version, written by the replicas about once a second.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eventbus._internal import keys
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure, Outcome

__all__ = [
    "CanaryRouter",
    "Verdict",
    "judge",
    "sum_figures",
]

log = logging.getLogger("eventbus.serving.canary")

#: Replica figures older than this are left out of the sums (a replica that went away).
FIGURES_STALE_S = 15.0
_REFRESH_S = 1.0


def bucket(event: CloudEvent) -> int:
    """0-99: which share of the traffic an event belongs to (by partitionkey, else id)."""
    a = event.attributes
    key = a.get("partitionkey") or a.get("id") or ""
    return zlib.crc32(str(key).encode()) % 100


class _Figures:
    __slots__ = ("events", "failed", "seconds")

    def __init__(self) -> None:
        self.events = 0
        self.failed = 0
        self.seconds = 0.0

    def add(self, outcomes: Sequence[Outcome], seconds: float) -> None:
        self.events += len(outcomes)
        self.failed += sum(1 for o in outcomes if type(o) is Failure)
        self.seconds += seconds

    def to_dict(self) -> dict[str, float]:
        return {"events": self.events, "failed": self.failed, "seconds": self.seconds}


class CanaryRouter:
    """Wraps a pipeline's runner; while a canary is active, sends its share of each batch to
    a runner of the canary version. Everything else is the serving runner's.

    Args:
        runner: the serving version's :class:`~eventbus.pipelines.PipelineRunner`.
        redis_url: where the canary state is read and the figures written.
        base_dirs: the pipeline's ``python_path`` (for the canary's functions and data files).
    """

    def __init__(self, runner: Any, redis_url: str, base_dirs: list[str] | None = None) -> None:
        from eventbus._internal.redis_client import connect

        self._stable = runner
        self._redis_url = redis_url
        self._redis = connect(redis_url, decode_responses=True)
        self._base_dirs = base_dirs
        self._key = keys.canary(runner.name)
        self._figures_key = keys.canary_figures(runner.name)
        self._replica = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._canary: Any = None
        self._canary_id: str | None = None
        self._weight = 0
        self._checked = 0.0
        self._figures = {"stable": _Figures(), "canary": _Figures()}

    def __getattr__(self, item: str) -> Any:
        return getattr(self._stable, item)

    @property
    def weight(self) -> int:
        """The canary's share of the events in percent (0: no canary)."""
        return self._weight if self._canary is not None else 0

    @property
    def pure(self) -> bool:
        """The next :meth:`run` neither blocks nor does I/O: no canary, the serving version
        pure (see ``PipelineRunner.pure``), and no refresh of the canary state due."""
        return (
            self._canary is None
            and self._stable.pure
            and time.monotonic() - self._checked <= _REFRESH_S
        )

    def run(self, events: list[CloudEvent], **kwargs: Any) -> list[Outcome]:
        """Run a batch: the canary's share through the canary, the rest through the serving
        version; outcomes in input order."""
        now = time.monotonic()
        if now - self._checked > _REFRESH_S:
            self._checked = now
            self._refresh()
        canary, weight = self._canary, self._weight
        if canary is None or not events:
            stable: list[Outcome] = self._stable.run(events, **kwargs)
            return stable
        to_canary = [bucket(e) < weight for e in events]
        parts: dict[bool, list[int]] = {True: [], False: []}
        for i, c in enumerate(to_canary):
            parts[c].append(i)
        outcomes: list[Outcome] = [[] for _ in events]
        for is_canary, idx in parts.items():
            if not idx:
                continue
            runner = canary if is_canary else self._stable
            t0 = time.perf_counter()
            got = runner.run([events[i] for i in idx], **kwargs)
            self._figures["canary" if is_canary else "stable"].add(got, time.perf_counter() - t0)
            for i, o in zip(idx, got):
                outcomes[i] = o
        return outcomes

    def _refresh(self) -> None:
        """Follow the canary state in Redis (about once a second) and report the figures."""
        try:
            raw = self._redis.get(self._key)
            state = json.loads(raw) if raw else None
            if state is None or state.get("status") != "running":
                if self._canary is not None:
                    log.info(
                        "pipeline %r: canary ended; all events on the serving version",
                        self._stable.name,
                    )
                self._canary, self._canary_id, self._weight = None, None, 0
                return
            if state["id"] != self._canary_id:
                from eventbus.pipelines._config import PipelineConfig
                from eventbus.pipelines._runner import PipelineRunner

                config = PipelineConfig.model_validate(state["document"])
                self._canary = PipelineRunner(
                    config, redis_url=self._redis_url, base_dirs=self._base_dirs
                )
                self._canary_id = state["id"]
                self._figures = {"stable": _Figures(), "canary": _Figures()}
                log.info(
                    "pipeline %r: canary version %s loaded", self._stable.name, state["version"]
                )
            self._weight = int(state["weight"])
            entry = {
                "at": time.time(),
                "canary_id": self._canary_id,
                **{k: f.to_dict() for k, f in self._figures.items()},
            }
            self._redis.hset(self._figures_key, self._replica, json.dumps(entry))
        except Exception as exc:  # noqa: BLE001 - Redis away: keep the routing as it was
            log.warning("pipeline %r: canary state not refreshed: %s", self._stable.name, exc)


def sum_figures(
    raw: Mapping[Any, str | bytes], canary_id: str, now: float | None = None
) -> dict[str, dict[str, float]]:
    """Sum the replicas' figures for one canary (fresh entries only): ``raw`` is the
    ``eventbus:canary-figures:<pipeline>`` hash, replica -> JSON entry."""
    now = time.time() if now is None else now
    total = {v: {"events": 0.0, "failed": 0.0, "seconds": 0.0} for v in ("stable", "canary")}
    for value in raw.values():
        entry = json.loads(value)
        if entry.get("canary_id") != canary_id or now - entry.get("at", 0) > FIGURES_STALE_S:
            continue
        for v in ("stable", "canary"):
            for k in ("events", "failed", "seconds"):
                total[v][k] += entry[v][k]
    return total


@dataclass(frozen=True)
class Verdict:
    """What to do with a canary step: ``advance``, ``rollback`` or ``wait``, and why."""

    action: str
    reason: str


def judge(
    delta: dict[str, dict[str, float]],
    *,
    elapsed_s: float,
    step_s: float,
    min_events: int = 20,
    max_error_increase: float = 0.01,
    max_latency_ratio: float = 1.5,
) -> Verdict:
    """Compare a step's figures (events, failures, step seconds per version since the step
    began) and decide.

    A regression (rolled back at once, even mid-step): the canary's error rate above both
    twice the serving version's and the serving rate + ``max_error_increase``; or its step
    time per event above ``max_latency_ratio`` times the serving version's (+ 50 µs, so that
    noise on trivial steps does not count). Otherwise the step advances once ``step_s`` has
    passed and the canary saw ``min_events`` events.
    """
    s, c = delta["stable"], delta["canary"]
    if c["events"] >= min_events:
        c_err = c["failed"] / c["events"]
        s_err = s["failed"] / s["events"] if s["events"] else 0.0
        if c_err > max(2 * s_err, s_err + max_error_increase):
            return Verdict(
                "rollback", f"error rate {c_err:.1%} against the serving version's {s_err:.1%}"
            )
        if s["events"] >= min_events:
            c_lat, s_lat = c["seconds"] / c["events"], s["seconds"] / s["events"]
            if c_lat > max_latency_ratio * s_lat + 50e-6:
                return Verdict(
                    "rollback",
                    f"{c_lat * 1e3:.3f} ms per event in the steps against the serving version's {s_lat * 1e3:.3f} ms",
                )
    if elapsed_s < step_s:
        return Verdict("wait", "step running")
    if c["events"] < min_events:
        return Verdict(
            "wait", f"the canary saw {int(c['events'])} events; it needs {min_events} to be judged"
        )
    return Verdict("advance", "no regression")
