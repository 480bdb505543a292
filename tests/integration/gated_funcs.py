"""A function whose module import waits for a file where ``EB_GATE_FILE`` names one: a replica
deployed with that variable in its runtime_env stays starting (its deploy in progress) until
the test creates the file (``EB_GATE_FILE.waiting`` says the replica waits). Elsewhere (the test process, the controller's validation) the
import does not wait."""

from __future__ import annotations

import os
import time
from pathlib import Path

import eventbus
from eventbus import CloudEvent

_GATE = os.environ.get("EB_GATE_FILE")
if _GATE:
    Path(_GATE + ".waiting").touch()  # the replica started and waits
    _deadline = time.monotonic() + 120
    while not Path(_GATE).exists() and time.monotonic() < _deadline:
        time.sleep(0.05)  # polling the condition the replica's start waits for


@eventbus.function
def passed(event: CloudEvent) -> CloudEvent:
    return event
