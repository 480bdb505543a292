"""User functions deployed by the integration tests."""

from __future__ import annotations

import eventbus
from eventbus import CloudEvent


@eventbus.function(batch=True)
def score(events: list[CloudEvent]) -> list[CloudEvent]:
    out = []
    for e in events:
        n = e.data["n"]
        if n % 500 == 7:
            msg = f"cannot score n={n}"
            raise ValueError(msg)
        out.append(e.replace(data={**e.data, "score": n % 10}))
    return out


@eventbus.function(batch=True)
def fails_one_percent(events: list[CloudEvent]) -> list[CloudEvent]:
    """Raises on events whose ``data.n % 100 == 42``; the others pass with a mark."""
    out = []
    for e in events:
        if e.data["n"] % 100 == 42:
            msg = f"refusing n={e.data['n']}"
            raise RuntimeError(msg)
        out.append(e.replace(data={**e.data, "ok": True}))
    return out
