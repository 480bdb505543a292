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


@eventbus.function
def package_version(event: CloudEvent) -> CloudEvent:
    """Tags the event with the replica's ``tabulate`` version and ``EB_TAG`` (isolation test:
    each pipeline installs its own version through its runtime_env)."""
    import os

    import tabulate  # not in the project's environment: only where a runtime_env installs it

    return event.replace(
        data={**event.data, "tabulate": tabulate.__version__, "tag": os.environ.get("EB_TAG")}
    )


@eventbus.function(batch=True)
def io_wait(events: list[CloudEvent]) -> list[CloudEvent]:
    """Waits 2 ms per event (``data.wait_ms`` overrides), modelling an I/O-bound call: its
    cost is time, not CPU, so more replicas add capacity even on two cores."""
    import time

    time.sleep(sum(float((e.data or {}).get("wait_ms", 2.0)) for e in events) / 1000)
    return events


@eventbus.function(batch=True)
def fails_while_flagged(events: list[CloudEvent]) -> list[CloudEvent]:
    """Raises on events whose ``data.flag`` names a file that exists (the test's "bug",
    fixed by removing the file); the others pass with a mark."""
    import os

    out = []
    for e in events:
        flag = (e.data or {}).get("flag")
        if flag and os.path.exists(flag):
            msg = f"flag {flag} is set"
            raise RuntimeError(msg)
        out.append(e.replace(data={**e.data, "ok": True}))
    return out
