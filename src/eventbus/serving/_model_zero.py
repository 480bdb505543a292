"""Model applications that scale to zero (a model's ``serving.idle_s``): one watcher thread in
the controller, beside the pipelines' (``_scale_to_zero``), applying
:func:`eventbus.models._zero.decide`.

* Down: no call recorded by the model's replicas for ``idle_s`` since its application last
  started. Under the model's lock the decision is taken again on fresh figures (a call that
  raced it keeps the application), the model is recorded in ``MODELS_AT_ZERO`` first (a call
  failing from then on asks for a wake instead of failing), then its Serve application is
  deleted (blocking: calls in flight drain on the replicas, as at any Serve scale-down), which
  releases the replica processes. As for a pipeline at zero, the application goes, not just its
  replicas (Serve's controller spends CPU on every application it holds).
* Up: a caller recorded a wake request (``MODEL_WAKE``) after the scale-down began. Under the
  same lock the application runs again with its stored options; only then is it removed from
  ``MODELS_AT_ZERO``, which the waiting callers watch. Concurrent requests make one
  application (the lock, and the state read under it). A wake that fails is recorded
  (``wake_error``; the waiting callers fail with a retriable error) and tried again on the
  next request.

Scale-downs and wakes are counted in the model's hash (``zero_downs``, ``zero_wakes``,
``zero_wake_failures``), which ``eventbus model list`` shows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from eventbus._internal import keys
from eventbus.models._zero import decide

__all__ = ["ModelZero"]

log = logging.getLogger("eventbus.serving.model_zero")


class ModelZero:
    """The watcher (see the module docstring).

    Args:
        redis: a sync Redis client (``decode_responses=True``).
        run_app: runs a model's application with its stored options (blocking until it runs).
        delete_app: deletes a model's application (blocking until it is gone).
        poll_s: how often the figures are read (a waiting caller's wake starts within this).
    """

    def __init__(
        self,
        redis: Any,
        run_app: Callable[[str], None],
        delete_app: Callable[[str], None],
        poll_s: float = 0.25,
    ) -> None:
        self._r = redis
        self._run_app = run_app
        self._delete_app = delete_app
        self.poll_s = poll_s
        self._idle: dict[str, float | None] = {}  # tracked model -> idle_s
        self._up_at: dict[str, float] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._busy: set[str] = set()
        self._guard = threading.Lock()
        self._stop = threading.Event()
        # no model with idle_s and none at zero: nothing to watch until one is tracked (the
        # controller's idle cost: no Redis round trip every poll_s for nothing)
        self._has_work = True
        self._changed = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="eventbus-model-zero")

    # -- the controller's side ----------------------------------------------------------------
    def track(self, name: str, idle_s: float | None, *, fresh: bool = True) -> None:
        """Watch a model (``fresh``: its application was just run, which counts as activity;
        otherwise it is unchanged and its idle time goes on)."""
        with self._guard:
            self._idle[name] = idle_s
            if fresh or name not in self._up_at:
                self._up_at[name] = time.time()
        if idle_s is not None:
            self._changed.set()

    def ran(self, name: str) -> None:
        """A deploy ran the model's application (under :meth:`lock`): it is not at zero."""
        self._r.hdel(keys.MODELS_AT_ZERO, name)

    def forget(self, name: str) -> None:
        """Stop watching a model (its application was deleted: no pipeline uses it)."""
        with self._guard:
            self._idle.pop(name, None)
        with self.lock(name):
            self._r.hdel(keys.MODELS_AT_ZERO, name)
            self._r.hdel(keys.MODEL_WAKE, name)

    def lock(self, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    def start(self) -> None:
        threading.Thread(target=self._main, name="eventbus-model-zero", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()

    # -- the thread ---------------------------------------------------------------------------
    def _main(self) -> None:
        failing = False
        while not self._stop.is_set():
            if self._has_work:
                self._stop.wait(self.poll_s)
            else:  # woken by a model tracked with idle_s; a look every 5 s all the same
                self._changed.wait(5.0)
                self._changed.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
                failing = False
            except Exception as exc:  # noqa: BLE001 - Redis away: next tick
                # once per outage, not every poll_s
                (log.debug if failing else log.warning)(
                    "model scale to zero: a check failed (%s)", exc
                )
                failing = True

    def tick(self) -> list[tuple[str, str]]:
        """Read the figures once and start the actions they call for (on the pool's threads);
        returns them."""
        with self._guard:
            idle = dict(self._idle)
            busy = set(self._busy)
        zero = self._r.hgetall(keys.MODELS_AT_ZERO)
        self._has_work = bool(zero) or any(v is not None for v in idle.values())
        # a model at zero wakes even untracked (the controller restarted since its scale-down)
        names = [
            n for n in {**idle, **zero} if n not in busy and (n in zero or idle.get(n) is not None)
        ]
        if not names:
            return []
        # one round trip for every model's figures, however many models are watched
        wakes = self._r.hgetall(keys.MODEL_WAKE)
        pipe = self._r.pipeline(transaction=False)
        for name in names:
            pipe.hget(keys.model(name), "called_at")
        called = pipe.execute()
        actions = []
        for name, called_at in zip(names, called, strict=True):
            action = self._rule(name, idle.get(name), zero.get(name), wakes.get(name), called_at)
            if action is not None:
                with self._guard:
                    self._busy.add(name)
                actions.append((name, action))
                self._pool.submit(self._apply, name, action)
        return actions

    def _decide(self, name: str, idle_s: float | None, zero_raw: str | None) -> str | None:
        """The rule on figures read now (one model)."""
        wake_at = self._r.hget(keys.MODEL_WAKE, name)
        return self._rule(
            name, idle_s, zero_raw, wake_at, self._r.hget(keys.model(name), "called_at")
        )

    def _rule(
        self,
        name: str,
        idle_s: float | None,
        zero_raw: str | None,
        wake_at: str | None,
        called_at: str | None,
    ) -> str | None:
        since = float(json.loads(zero_raw)["since"]) if zero_raw else None
        return decide(
            idle_s=idle_s,
            now=time.time(),
            called_at=float(called_at or 0),
            up_at=self._up_at.get(name, 0.0),
            wake_at=float(wake_at or 0),
            at_zero_since=since,
        )

    def _apply(self, name: str, action: str) -> None:
        try:
            if action == "down":
                self.down(name)
            else:
                self.up(name)
        except Exception:
            log.exception("model %r: scaling %s failed", name, action)
        finally:
            with self._guard:
                self._busy.discard(name)

    def down(self, name: str) -> bool:
        """Scale the model's application to zero when the rule still says so (figures read
        again under its lock). False: a call or a wake came meanwhile, or it is untracked."""
        with self.lock(name):
            with self._guard:
                if name not in self._idle:
                    return False
                idle_s = self._idle[name]
            if self._decide(name, idle_s, self._r.hget(keys.MODELS_AT_ZERO, name)) != "down":
                return False
            since = time.time()
            self._r.hset(keys.MODELS_AT_ZERO, name, json.dumps({"since": since}))
            self._r.hincrby(keys.model(name), "zero_downs", 1)
            log.info("model %r: no call for %g s, scaling its application to zero", name, idle_s)
            try:
                self._delete_app(name)
            except Exception:
                # still running: back to running, and a caller's wake does not wait on it
                self._r.hdel(keys.MODELS_AT_ZERO, name)
                raise
            settled = {"since": since, "settled_at": time.time()}
            with contextlib.suppress(Exception):
                if self._r.hexists(keys.MODELS_AT_ZERO, name):
                    self._r.hset(keys.MODELS_AT_ZERO, name, json.dumps(settled))
            return True

    def up(self, name: str) -> bool:
        """Run the model's application again. False: it was not at zero (another wake ran it).

        Raises:
            Exception: the application did not run (recorded in ``wake_error``).
        """
        with self.lock(name):
            raw = self._r.hget(keys.MODELS_AT_ZERO, name)
            if raw is None:
                return False
            state = json.loads(raw)
            started = time.time()
            log.info("model %r: a call waits, running its application again", name)
            try:
                self._run_app(name)
            except Exception as exc:
                failed = {**state, "wake_error": f"{type(exc).__name__}: {exc}"}
                self._r.hset(
                    keys.MODELS_AT_ZERO, name, json.dumps({**failed, "wake_failed_at": time.time()})
                )
                self._r.hincrby(keys.model(name), "zero_wake_failures", 1)
                raise
            with self._guard:
                self._up_at[name] = time.time()
            self._r.hdel(keys.MODELS_AT_ZERO, name)
            self._r.hincrby(keys.model(name), "zero_wakes", 1)
            self._r.hset(keys.model(name), "zero_cold_start_s", repr(time.time() - started))
            return True

    def state(self, name: str) -> dict[str, Any]:
        """``{"at_zero": since | None, "scale_downs", "wakes", "wake_failures",
        "cold_start_s"}`` of a model."""
        raw = self._r.hget(keys.MODELS_AT_ZERO, name)
        downs, wakes, failures, cold = self._r.hmget(
            keys.model(name), "zero_downs", "zero_wakes", "zero_wake_failures", "zero_cold_start_s"
        )
        return {
            "at_zero": json.loads(raw)["since"] if raw else None,
            "scale_downs": int(downs or 0),
            "wakes": int(wakes or 0),
            "wake_failures": int(failures or 0),
            "cold_start_s": float(cold) if cold else None,
        }
