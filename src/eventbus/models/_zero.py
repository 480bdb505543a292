"""A model application that scales to zero (``serving.idle_s`` of a model step): the rules
(no Serve, no threads, so each is tested alone) and the caller's side of a wake.

The controller's watcher (:mod:`eventbus.serving._model_zero`) applies :func:`decide`; a
model step's :class:`Waker` asks a model at zero back and waits for it. All times are epoch
seconds, shared through Redis by the replicas (``called_at``), the callers (wake requests) and
the controller:

* ``called_at``: the model's replicas record their latest call (at most every second).
* :data:`~eventbus._internal.keys.MODELS_AT_ZERO`: set by the controller *before* it deletes
  the application, removed once a wake's ``serve.run`` returned (the application runs).
* :data:`~eventbus._internal.keys.MODEL_WAKE`: a caller whose call failed while the model is
  at zero records the time there; the watcher runs the application again.
"""

from __future__ import annotations

import json
import time
from typing import Any

from eventbus._internal import keys
from eventbus.errors import ModelWakeError

__all__ = ["WAKE_POLL_S", "Waker", "decide"]

#: How often a waiting caller looks whether the model runs again.
WAKE_POLL_S = 0.1


def decide(
    *,
    idle_s: float | None,
    now: float,
    called_at: float,
    up_at: float,
    wake_at: float,
    at_zero_since: float | None,
) -> str | None:
    """``"down"``, ``"up"`` or None (nothing to do) for one model application.

    Args:
        idle_s: the model's idle period (None: it never scales to zero).
        now: epoch s.
        called_at: its replicas' latest call (0: none recorded).
        up_at: when its application last started running (a deploy or a wake).
        wake_at: the latest wake request of a caller (0: none).
        at_zero_since: when it went to zero; None: it runs.
    """
    if at_zero_since is not None:
        # a call that asked while the scale-down ran (wake_at after since) brings it back
        return "up" if wake_at >= at_zero_since else None
    if idle_s is None:
        return None
    if now - max(called_at, up_at, wake_at) >= idle_s:
        return "down"
    return None


class Waker:
    """A caller's side: is the model at zero, ask it back, wait for it.

    Args:
        redis_url: the stack's Redis.
        name: the model.
    """

    def __init__(self, redis_url: str, name: str) -> None:
        from eventbus._internal.redis_client import connect

        self.name = name
        self._r = connect(redis_url, decode_responses=True, socket_timeout=10)
        #: wakes this caller waited for (a counter the step reports)
        self.waits = 0

    def at_zero(self) -> bool:
        """Whether the model's application is scaled to zero (or going there)."""
        return bool(self._r.hexists(keys.MODELS_AT_ZERO, self.name))

    def wake(self, deadline: float) -> None:
        """Ask the model back and wait until it runs (``deadline``: monotonic s).

        Raises:
            ModelWakeError: it still is at zero at the deadline, or its wake failed (the
                controller's reason is in the message); retriable: a later call asks again.
        """
        self.waits += 1
        asked = time.time()
        self._r.hset(keys.MODEL_WAKE, self.name, repr(asked))
        while True:
            raw = self._r.hget(keys.MODELS_AT_ZERO, self.name)
            if raw is None:
                return
            state: dict[str, Any] = json.loads(raw)
            failed = state.get("wake_error")
            if failed and float(state.get("wake_failed_at", 0)) >= asked:
                msg = (
                    f"model {self.name!r} is scaled to zero and its wake failed: {failed}; "
                    "the events are retried (a later call asks for the wake again)"
                )
                raise ModelWakeError(msg)
            if time.monotonic() >= deadline:
                msg = (
                    f"model {self.name!r} is scaled to zero and was not running again within the "
                    "step's timeout_s; the events are retried (raise the step's 'timeout_s' to "
                    "wait for longer cold starts)"
                )
                raise ModelWakeError(msg)
            time.sleep(WAKE_POLL_S)
