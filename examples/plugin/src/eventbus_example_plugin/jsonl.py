"""The ``jsonl`` sink: append each event, in the CloudEvents JSON format, as one line of a
local file (flushed and fsynced before ``send`` returns, so offsets commit only after).

```yaml
  sink: {jsonl: {path: /var/lib/events/out.jsonl}}
```
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from eventbus import CloudEvent
from eventbus.eventing import event_to_json
from eventbus.eventing.sinks import Sink, SinkEncodeError
from eventbus.registry import sinks


class JsonlSinkConfig(BaseModel):
    """Where the lines go."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    path: str = Field(min_length=1, description="The file events are appended to.")


class JsonlSink(Sink):
    """Appends events to a file; durable (fsynced) when :meth:`send` returns."""

    def __init__(self, config: JsonlSinkConfig) -> None:
        self.path = config.path

    async def send(self, items: Sequence[tuple[CloudEvent, bytes | None]]) -> None:
        if not items:
            return
        lines: list[bytes] = []
        failures: dict[int, tuple[str, str]] = {}
        for i, (event, _) in enumerate(items):
            try:
                lines.append(event_to_json(event) + b"\n")
            except (TypeError, ValueError) as exc:
                failures[i] = (type(exc).__name__, str(exc))
        if failures:  # nothing is written: the source dead-letters these and sends the rest
            raise SinkEncodeError(self.path, failures)
        await asyncio.to_thread(self._append, b"".join(lines))

    def _append(self, lines: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())


@sinks.register(
    "jsonl",
    config=JsonlSinkConfig,
    description="Append events as JSON lines to a local file.",
    describe=lambda raw: str(raw.get("path") or ""),
)
def build(config: JsonlSinkConfig, *, default_bootstrap: str) -> JsonlSink:
    """A jsonl sink."""
    return JsonlSink(config)
