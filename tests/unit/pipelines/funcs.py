"""User functions used by the unit tests."""

from __future__ import annotations

import eventbus
from eventbus import CloudEvent

FLAKY_CALLS: list[str] = []


@eventbus.function
def split_items(event: CloudEvent) -> list[CloudEvent]:
    return [
        event.replace(id=f"{event.id}-{i}", data={"item": x})
        for i, x in enumerate(event.data["items"])
    ]


@eventbus.function(batch=True)
def tag_batch(events: list[CloudEvent]) -> list[CloudEvent]:
    return [e.replace(data={**e.data, "tag": True}) for e in events]


@eventbus.function(batch=True)
def fail_on_negative(events: list[CloudEvent]) -> list[CloudEvent]:
    out = []
    for e in events:
        if e.data["n"] < 0:
            msg = f"negative: {e.data['n']}"
            raise ValueError(msg)
        out.append(e.replace(data={"n": e.data["n"] * 2}))
    return out


def returns_dict(event: CloudEvent) -> dict[str, int]:
    return {"a": 1}


def flaky(event: CloudEvent) -> CloudEvent:
    FLAKY_CALLS.append(event.id)
    if len(FLAKY_CALLS) < 3:
        msg = "flaky"
        raise RuntimeError(msg)
    return event
