"""A model replica's live experiments: the shadow mirror and the rollback guard.

:class:`ShadowMirror` takes the chosen share of each answered group's rows (by each row's event
draw, so a retried event is mirrored again or not at all; rows without a draw are picked at
random) and queues them, fire and forget, for one worker thread that runs the candidate and
counts the comparison; at most ``max_in_flight`` groups wait, and a group that finds the queue
full is dropped and counted. Its outputs go nowhere but the comparison.

:class:`LiveGuard` counts each version's passes (:class:`VersionWindow`), and on every look
judges the version that took a split (against the serving one, live) or all traffic (against
the previous version's last window, kept when it took over, for ``probation_s``); a regression
rolls it back in the registry, which every replica follows.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from eventbus.models._compare import Comparison
from eventbus.models._judge import RollbackPolicy, VersionWindow, WindowFigures, judge

__all__ = ["LiveGuard", "ShadowMirror", "shadow_draws"]

log = logging.getLogger("eventbus.models")


def shadow_draws(u: Any, n: int) -> Any:
    """Each row's draw for the shadow: the split draw's low digits (independent of which side
    of a split the row took), or random draws when rows have none."""
    import numpy as np

    if u is None or len(u) != n:
        return np.random.default_rng().random(n)
    return (np.asarray(u, dtype=np.float64) * 65536.0) % 1.0


class ShadowMirror:
    """Mirrors rows to a candidate version (see the module docstring).

    Args:
        name: the model.
        version: the candidate's version.
        model: the loaded candidate (``fn(tensor) -> tensor``).
        share: the fraction of rows mirrored, (0, 1].
        max_in_flight: groups waiting at most; more are dropped and counted.
        started_at: the experiment's start (its registry setting's ``started_at``): counters
            flushed after another experiment of the same version started are not added to it.
    """

    def __init__(
        self,
        name: str,
        version: int,
        model: Any,
        share: float,
        max_in_flight: int = 4,
        started_at: float | None = None,
    ) -> None:
        self.name, self.version, self.model, self.share = name, version, model, share
        self.started_at = started_at
        self.comparison = Comparison()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, max_in_flight))
        self._stop = threading.Event()
        self._worker = threading.Thread(
            target=self._run, name=f"eventbus-shadow-{name}-{version}", daemon=True
        )
        self._worker.start()

    def offer(self, x: Any, y: Any, u: Any, live_s: float) -> None:
        """On the live path: pick this group's mirrored rows and queue them; never blocks."""
        try:
            n = int(x.shape[0])
            pick = shadow_draws(u, n) < self.share
            k = int(pick.sum())
            if k == 0 or self._stop.is_set():
                return
            item = (x if k == n else x[pick]).clone(), y[pick].copy(), live_s
            try:
                self._queue.put_nowait(item)
            except queue.Full:
                self.comparison.dropped(k)
        except Exception:
            log.warning(
                "model %r: mirroring to version %s failed", self.name, self.version, exc_info=True
            )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                x, live, live_s = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            start = time.perf_counter()
            try:
                out = self.model(x).detach().cpu().numpy()
            except Exception:  # noqa: BLE001 - the candidate's errors are counted
                self.comparison.error(int(x.shape[0]))
                continue
            self.comparison.latency(live_s, time.perf_counter() - start)
            self.comparison.compare(live, out)

    def flush(self, registry: Any) -> None:
        """Add this replica's counters to the experiment's in the registry (not to a later
        experiment of the same version: those of an experiment since replaced are let go)."""
        ints, abs_sum = self.comparison.take()
        try:
            registry.add_comparison(
                self.name, self.version, ints, abs_sum, started_at=self.started_at
            )
        except Exception:
            self.comparison.give_back(ints, abs_sum)
            raise

    def stop(self) -> None:
        """Stop the worker; rows still queued are counted as dropped."""
        self._stop.set()
        while True:
            try:
                x, _, _ = self._queue.get_nowait()
            except queue.Empty:
                return
            self.comparison.dropped(int(x.shape[0]))


class LiveGuard:
    """Per-version live figures and the rollback judge of one replica (see the module
    docstring). ``observe`` is thread-safe; ``moved`` and ``look`` run on one thread."""

    def __init__(self, name: str, registry: Any, policy: RollbackPolicy) -> None:
        self.name, self.registry, self.policy = name, registry, policy
        self._windows: dict[int, VersionWindow] = {}
        self._lock = threading.Lock()
        # version that took all traffic -> (previous version, its figures, judged until)
        self._baselines: dict[int, tuple[int, WindowFigures, float]] = {}
        self.rollbacks = 0

    def window(self, version: int) -> VersionWindow:
        with self._lock:
            w = self._windows.get(version)
            if w is None:
                w = self._windows[version] = VersionWindow()
            return w

    def observe(self, version: int, rows: int, failed: int, seconds: float) -> None:
        self.window(version).add(rows, failed, seconds, time.monotonic())

    def moved(
        self, before: tuple[int | None, int | None], after: tuple[int | None, int | None]
    ) -> None:
        """What serves changed from ``before`` to ``after`` (serving version, split version)."""
        now = time.monotonic()
        (old, old_b), (new, new_b) = before, after
        if new_b is not None and new_b != old_b:
            self.window(new_b).clear()  # judged on its split traffic from now on
        if new is None or new == old or old is None:
            return
        with self._lock:
            for v in [v for v in self._windows if v not in (old, new, new_b)]:
                del self._windows[v]
        if self._was_rolled_back(old):
            return  # back to the version before a rollback: nothing to judge
        previous = self.window(old).figures(now, self.policy.window_s)
        self.window(new).clear()
        self._baselines = {new: (old, previous, now + self.policy.probation_s)}

    def _was_rolled_back(self, version: int) -> bool:
        try:
            return bool(self.registry.rolled_back(self.name, version))
        except Exception:  # noqa: BLE001 - unknown: judge as usual
            return False

    def look(self, serving: int | None, split: int | None) -> bool:
        """Judge what serves now; roll back on a regression. True when a rollback was made."""
        if not self.policy.enabled or serving is None:
            return False
        now = time.monotonic()
        w = self.policy.window_s
        if split is not None:
            verdict = judge(
                self.window(split).figures(now, w),
                self.window(serving).figures(now, w),
                self.policy,
            )
            if verdict:
                return self._roll("split", split, serving, verdict, now)
        base = self._baselines.get(serving)
        if base is None:
            return False
        previous, figures, until = base
        if now > until:
            del self._baselines[serving]
            return False
        verdict = judge(self.window(serving).figures(now, w), figures, self.policy)
        return bool(verdict) and self._roll("serving", serving, previous, str(verdict), now)

    def _roll(self, kind: str, bad: int, to: int, reason: str, now: float) -> bool:
        w = self.policy.window_s
        base = self._baselines.get(bad)
        figures = {
            "version": self.window(bad).figures(now, w).as_dict(),
            "previous": (base[1] if base else self.window(to).figures(now, w)).as_dict(),
            "window_s": w,
        }
        done = bool(
            self.registry.rollback(
                self.name, kind=kind, bad=bad, to=to, reason=reason, figures=figures
            )
        )
        if done:
            self.rollbacks += 1
            self._baselines.pop(bad, None)
            log.warning("model %r version %s rolled back to %s: %s", self.name, bad, to, reason)
        return done
