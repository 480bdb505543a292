"""The timer of a ``join`` step: it closes windows that receive no more events."""

from __future__ import annotations

import itertools
from typing import Any, Protocol

from eventbus.eventing._codecs import event_from_json
from eventbus.eventing._event import CloudEvent
from eventbus.pipelines._step import Fired, Timer
from eventbus.pipelines.steps._join_config import JoinConfig
from eventbus.pipelines.steps._join_pairs import PairState, window_key
from eventbus.pipelines.steps._join_state import JoinState
from eventbus.pipelines.steps._join_watermark import PROCESSING, Clock

__all__ = ["JoinSweeper", "SweptJoin", "outer_outputs", "window_events"]


class SweptJoin(Protocol):
    """What a :class:`JoinSweeper` needs of its join step (``JoinStep`` is one)."""

    id: str
    closing: bool
    pipeline: str
    spec: JoinConfig
    state: JoinState
    pairs: PairState
    stream: bool
    side_names: list[str]
    clock: Clock
    counters: dict[str, int]

    def now(self) -> int: ...

    def absorb(self, reason: str, n: int = 1) -> None: ...

    def output(
        self,
        key: str,
        h: dict[str, bytes],
        now: int,
        *,
        id_of: str | None = None,
        basis: str | None = None,
    ) -> CloudEvent: ...


Sweep = tuple[list[CloudEvent], list[CloudEvent], list[Any]]

#: The clock of :meth:`JoinSweeper.sweep` at the end of the input: after every window.
END_MS = 2**52


class JoinSweeper(Timer):
    """Closes the windows of a join step: run :meth:`sweep` every second or so.

    Args:
        step: the join step (its state and output format).
        lease_s: how long a claim holds before another sweeper may take the keys over.
    """

    def __init__(self, step: SweptJoin, lease_s: float = 30.0) -> None:
        self.step = step
        self._lease_ms = int(lease_s * 1000)

    def sweep(self, limit: int = 5000, *, at_end: bool = False) -> Sweep:
        """Claim windows that closed: (outputs for the sink, events for the dead-letter sink,
        the claims to :meth:`forget` once both were delivered).

        Args:
            limit: claims per call.
            at_end: the end of the input (the join step's ``flush``): every window counts as
                closed, whatever the clock or the watermark.

        Raises:
            StateUnavailableError: Redis does not answer.
        """
        step = self.step
        stamp = step.now()  # the outputs' time
        now, clock = (END_MS, PROCESSING) if at_end else (stamp, step.clock)
        if step.stream:
            return self._sweep_windows(limit, now, clock, stamp)
        outputs: list[CloudEvent] = []
        dead: list[CloudEvent] = []
        claimed: list[Any] = []
        for key, h in step.state.claim_due(now, self._lease_ms, limit, clock):
            claimed.append(key)
            if not h:
                continue  # expired already
            present = [n for n in step.side_names if n in h]
            if "__evicted" in h:
                dead += [self._dead(key, h[n]) for n in present]
            elif "__done" in h:
                continue
            elif step.spec.mode == "outer":
                step.counters["timed_out"] += 1
                outputs.append(step.output(key, h, stamp))
            else:
                step.absorb("expired", len(present))
        return outputs, dead, claimed

    def _sweep_windows(self, limit: int, now: int, clock: Clock, stamp: int) -> Sweep:
        step = self.step
        outputs: list[CloudEvent] = []
        dead: list[CloudEvent] = []
        claimed: list[Any] = []
        # an outer join under exactly_once: its batches close the windows (not at the end
        # of an input: eventbus test and run_pipeline keep state in memory)
        closing = step.closing and now != END_MS
        for member, h in step.pairs.claim_due(
            now, self._lease_ms, limit, clock, evicted_only=closing
        ):
            if not h:
                claimed.append((member, ""))
                continue  # expired already
            key, t0 = window_key(member), h["__t0"].decode()
            claimed.append((member, t0))
            by_side = window_events(h)
            complete = all(by_side.get(n) for n in step.side_names)
            if "__evicted" in h:
                # events that came after the eviction (seq 0) never paired; the others paired
                # already when every side was present
                dead += [
                    self._dead(key, p)
                    for events in by_side.values()
                    for _, seq, p in events
                    if seq == 0 or not complete
                ]
            elif complete:
                continue
            elif step.spec.mode == "outer":
                outputs += outer_outputs(step, key, t0, by_side, stamp)
            else:
                step.absorb("expired", sum(len(v) for v in by_side.values()))
        return outputs, dead, claimed

    def _dead(self, key: str, payload: bytes) -> CloudEvent:
        step = self.step
        step.absorb("evicted")
        return event_from_json(payload).replace(
            ebpipeline=step.pipeline,
            ebstep=step.id,
            eberrortype="JoinEvictedError",
            eberror=f"join key {key!r} evicted: more than max_pending ({step.spec.max_pending}) keys were waiting; raise max_pending or shorten window_s",
            ebattempts=1,
        )

    def fire(self) -> Fired | None:
        """One :meth:`sweep`: the claims are the token."""
        outputs, dead, claimed = self.sweep()
        return Fired(outputs, dead, claimed) if claimed else None

    def ack(self, fired: Fired) -> None:
        """Forget the windows of a delivered sweep."""
        self.forget(fired.token)

    def forget(self, claimed: list[Any]) -> None:
        """Forget delivered windows (the claims a :meth:`sweep` returned)."""
        if self.step.stream:
            self.step.pairs.ack(claimed)
        else:
            self.step.state.ack(claimed)


def window_events(h: dict[str, bytes]) -> dict[str, list[tuple[str, int, bytes]]]:
    """A window's events by side: (``<side>/<id>`` field, seq, JSON) each."""
    by_side: dict[str, list[tuple[str, int, bytes]]] = {}
    for f, v in h.items():
        if not f.startswith("__"):
            seq, _, payload = v.partition(b",")
            by_side.setdefault(f.partition("/")[0], []).append((f, int(seq), payload))
    return by_side


def outer_outputs(
    step: SweptJoin,
    key: str,
    t0: str,
    by_side: dict[str, list[tuple[str, int, bytes]]],
    stamp: int,
) -> list[CloudEvent]:
    """What an outer join emits for an incomplete window when it closes: one output per
    combination of the sides present (ids from the key, the window and the combination)."""
    lists = [sorted(by_side[n], key=lambda e: e[1]) for n in step.side_names if n in by_side]
    outputs = []
    for combo in itertools.product(*lists):
        step.counters["timed_out"] += 1
        basis = f"{t0}\x00" + "\x00".join(f for f, _, _ in combo) + "\x00partial"
        h2 = {f.partition("/")[0]: p for f, _, p in combo}
        outputs.append(step.output(key, h2, stamp, basis=basis))
    return outputs


def closed_outputs(
    step: SweptJoin, shut: list[tuple[str, dict[str, bytes]]], stamp: int
) -> list[CloudEvent]:
    """Under exactly_once, what the windows a batch closed (given as (name, hash) by its
    closer) emit: an outer join's incomplete ones as :func:`outer_outputs` (``emit: first``:
    the latest event of each side present); an inner join's are counted as expired."""
    out: list[CloudEvent] = []
    for member, h in shut:
        by_side = window_events(h)
        if not h or all(by_side.get(n) for n in step.side_names):
            continue
        if step.spec.emit == "first":
            by_side = {n: [max(v, key=lambda o: o[1])] for n, v in by_side.items()}
        if step.spec.mode == "outer":
            out += outer_outputs(step, window_key(member), h["__t0"].decode(), by_side, stamp)
        else:
            step.absorb("expired", sum(len(v) for v in by_side.values()))
    return out


def first_output(
    step: SweptJoin,
    key: str,
    event: tuple[str, bytes],
    t0: str,
    same: int,
    others: list[tuple[str, int, bytes]],
    stamp: int,
) -> list[CloudEvent]:
    """``emit: first`` on the windows of every event (under exactly_once), for an ``event``
    (side, JSON) stored after ``same`` events of its side and the ``others``: the event that
    makes every side present emits the latest event of each (its id from the key and the
    window, as with :mod:`._join_state`); the events after it are absorbed."""
    side, payload = event
    before = {f.partition("/")[0] for f, _, _ in others}
    if all(n in before or (n == side and same) for n in step.side_names):
        step.absorb("after_match")
        return []
    if not all(n in before or n == side for n in step.side_names):
        step.absorb("superseded" if same else "waiting")
        return []
    latest = {f.partition("/")[0]: p for f, _, p in sorted(others, key=lambda o: o[1])}
    step.counters["joined"] += 1
    return [step.output(key, latest | {side: payload}, stamp, basis=t0)]
