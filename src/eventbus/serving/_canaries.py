"""The controller's canary reconciler: start a canary of a pipeline's new steps, judge it
about once a second, advance its weight, promote it (an ordinary deploy) or roll it back.

The replicas' side (``CanaryRouter``, the figures, ``judge()``) is ``_canary``. The state is
``keys.canary(name)`` in Redis, so a restarted controller resumes the canaries where they
were. Every change of a pipeline's canary runs under the pipeline's lock (``_locks``): a tick
does not promote across a deploy of the same pipeline, and others' ticks wait for nothing
but their own pipeline.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from eventbus._internal import keys
from eventbus.errors import DeployError, PipelineNotFoundError
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._loader import load_pipeline_text
from eventbus.serving._locks import PipelineLocks

__all__ = ["Canaries", "check_weights"]

log = logging.getLogger("eventbus.serving.controller")

#: How long an ended canary's state stays readable (``eventbus canary NAME``).
ENDED_TTL_S = 7 * 86400


def check_weights(weights: list[int]) -> None:
    """Canary weights rise from above 0 to 100 (percent).

    Raises:
        DeployError: naming the weights and an example.
    """
    if (
        not weights
        or any(not 0 < w <= 100 for w in weights)
        or weights != sorted(weights)
        or weights[-1] != 100
    ):
        msg = (
            f"canary weights must rise from above 0 to 100 (percent), e.g. 10,50,100; got {weights}"
        )
        raise DeployError(msg)


class Canaries:
    """Canaries of the deployed pipelines.

    Args:
        redis: the controller's Redis client (``decode_responses=True``).
        locks: the pipelines' locks.
        current: a deployed pipeline's record by name (raises PipelineNotFoundError).
        deploy: ``deploy(text, filename, python_path)`` deploys a promoted canary (under
            the pipeline's lock, which the caller holds) and returns its info.
    """

    def __init__(
        self,
        redis: Any,
        locks: PipelineLocks,
        current: Callable[[str], dict[str, Any]],
        deploy: Callable[[str, str, list[str]], dict[str, Any]],
    ) -> None:
        self._redis = redis
        self.locks = locks
        self._current = current
        self._deploy = deploy

    def start(
        self,
        text: str,
        filename: str,
        python_path: list[str],
        *,
        weights: list[int],
        step_s: float,
        min_events: int,
    ) -> dict[str, Any]:
        """Start a canary (see ``Controller.deploy_canary``)."""
        check_weights(weights)
        config = load_pipeline_text(
            text, filename, check_functions=False, base_dir=python_path[0] if python_path else ""
        )
        name = config.name
        with self.locks.of(name):
            current = self._current(name)
            old = PipelineConfig.model_validate(current["document"])
            differ = [
                k
                for k in type(old.spec).model_fields
                if k != "steps" and getattr(old.spec, k) != getattr(config.spec, k)
            ]
            if differ:
                msg = f"a canary of {name!r} may change its steps only, and {', '.join(differ)} differ; deploy it without --canary"
                raise DeployError(msg)
            if old.spec.steps == config.spec.steps:
                msg = f"the canary's steps are those of {name!r} version {current['version']}; there is nothing to compare"
                raise DeployError(msg)
            running = self.status(name)
            if running is not None and running["status"] == "running":
                msg = f"a canary of {name!r} is running (at {running['weight']}%); `eventbus promote {name}` or `eventbus rollback {name}` first"
                raise DeployError(msg)
            now = time.time()
            state = {
                "id": uuid.uuid4().hex[:12],
                "name": name,
                "version": current["version"] + 1,
                "yaml": text,
                "filename": filename,
                "python_path": python_path,
                "document": config.to_document(),
                "weights": weights,
                "step": 0,
                "weight": weights[0],
                "step_s": step_s,
                "min_events": min_events,
                "status": "running",
                "started_at": now,
                "step_started_at": now,
                "baseline": None,
                "history": [],
                "reason": "",
            }
            self._redis.set(keys.canary(name), json.dumps(state))
        return {
            "name": name,
            "canary_version": state["version"],
            "weight": weights[0],
            "weights": weights,
        }

    def status(self, name: str) -> dict[str, Any] | None:
        """The pipeline's canary (running or how the last one ended), or None."""
        state = self._state(name)
        if state is None:
            return None
        hidden = ("yaml", "document", "python_path", "baseline")
        return {k: v for k, v in state.items() if k not in hidden}

    def promote(self, name: str) -> dict[str, Any]:
        """Deploy the running canary as the serving version now.

        Raises:
            PipelineNotFoundError: no canary of that pipeline is running.
        """
        with self.locks.of(name):
            state = self._state(name)
            if state is None or state["status"] != "running":
                msg = f"no canary of {name!r} is running; start one with `eventbus deploy FILE --canary 10`"
                raise PipelineNotFoundError(msg)
            return self._promote(state, "promoted by request")

    def roll_back(self, name: str) -> dict[str, Any] | None:
        """End the running canary (nothing else changes): what ``rollback`` answers, or None
        when none runs."""
        with self.locks.of(name):
            canary = self.status(name)
            if canary is None or canary["status"] != "running":
                return None
            self.end(name, "rolled_back", "by request")
            return {
                "name": name,
                "version": self._current(name)["version"],
                "canary_rolled_back": canary["version"],
            }

    def end(self, name: str, status: str, reason: str, **extra: Any) -> None:
        """End the pipeline's running canary (if one runs) as ``status`` for ``reason``; its
        state stays readable for a week, its figures go."""
        key = keys.canary(name)
        state = self._state(name)
        if state is None or state["status"] != "running":
            return
        state.update(status=status, reason=reason, ended_at=time.time(), weight=0, **extra)
        log.info("canary of %r %s: %s", name, status, reason)
        with self._redis.pipeline(transaction=True) as tx:
            tx.set(key, json.dumps(state), ex=ENDED_TTL_S)
            tx.delete(keys.canary_figures(name))
            tx.execute()

    def run_forever(self, every_s: float = 1.0) -> None:
        """Judge every running canary about every ``every_s`` (the controller's own timer)."""
        while True:
            time.sleep(every_s)
            self.tick_all()

    def tick_all(self) -> None:
        """Judge every running canary once, each under its pipeline's lock."""
        try:
            # one SCAN round trip per 1,000 keys, not per 10 (Redis's default COUNT): the
            # keyspace grows with pipelines (stats, history buckets), and this runs every
            # second (600 keys: 2.5 ms of CPU a look with the default, 0.06 ms with 1,000)
            canaries = self._redis.scan_iter(keys.CANARY_PATTERN, count=1000)
            names = [keys.canary_pipeline(k) for k in canaries]
        except Exception:  # noqa: BLE001 - Redis away: try again next tick
            log.warning("canary loop: Redis did not answer")
            return
        for name in names:
            try:
                with self.locks.of(name):
                    self.tick(name)
            except Exception:
                log.exception("canary of %r: tick failed", name)

    def tick(self, name: str) -> None:
        """Judge one canary's step: wait, advance, promote or roll back."""
        from eventbus.serving._canary import judge, sum_figures

        key = keys.canary(name)
        state = self._state(name)
        if state is None or state["status"] != "running":
            return
        figures = sum_figures(self._redis.hgetall(keys.canary_figures(name)), state["id"])
        if state["baseline"] is None:
            state["baseline"] = figures
            self._redis.set(key, json.dumps(state))
            return
        base = state["baseline"]
        delta = {v: {k: figures[v][k] - base[v][k] for k in figures[v]} for v in figures}
        verdict = judge(
            delta,
            elapsed_s=time.time() - state["step_started_at"],
            step_s=state["step_s"],
            min_events=state["min_events"],
        )
        if verdict.action == "wait":
            return
        state["history"].append(
            {
                "weight": state["weight"],
                "figures": delta,
                "verdict": verdict.action,
                "reason": verdict.reason,
            }
        )
        if verdict.action == "rollback":
            self._redis.set(key, json.dumps(state))
            self.end(name, "rolled_back", f"at {state['weight']}%: {verdict.reason}")
            return
        if state["step"] + 1 >= len(state["weights"]):
            self._redis.set(key, json.dumps(state))
            passed = ", ".join(f"{w}%" for w in state["weights"])
            self._promote(state, f"passed every step ({passed})")
            return
        state["step"] += 1
        state["weight"] = state["weights"][state["step"]]
        state["step_started_at"] = time.time()
        state["baseline"] = figures
        self._redis.set(key, json.dumps(state))
        log.info("canary of %r: %s%% of the events (%s)", name, state["weight"], verdict.reason)

    def _state(self, name: str) -> dict[str, Any] | None:
        raw = self._redis.get(keys.canary(name))
        return json.loads(raw) if raw else None

    def _promote(self, state: dict[str, Any], reason: str) -> dict[str, Any]:
        info = self._deploy(state["yaml"], state["filename"], state["python_path"])
        self.end(state["name"], "promoted", reason, version=info["version"])
        return {**info, "promoted": True}
