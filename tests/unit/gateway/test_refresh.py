"""The gateway's route refresh: every pipeline's record is read only when the pipelines'
version moved (the controller increments it with each deploy and delete), not every 0.5 s."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from eventbus._internal import keys
from eventbus.gateway._server import _REREAD_S, Gateway
from tests.unit.gateway.conftest import MemoryBackend, pipeline_doc


class _Pipe:
    def __init__(self, redis: _Redis) -> None:
        self.redis = redis
        self.calls: list[Any] = []

    async def __aenter__(self) -> _Pipe:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def get(self, key: str) -> None:
        self.calls.append(self.redis.data.get(key))

    def hkeys(self, key: str) -> None:
        self.calls.append(list(self.redis.data.get(key, {})))

    async def execute(self) -> list[Any]:
        return self.calls


class _Redis:
    """The keys the refresh reads; counts the full reads."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {keys.PIPELINES: {}}
        self.full_reads = 0

    def pipeline(self, transaction: bool = True) -> _Pipe:
        return _Pipe(self)

    async def hgetall(self, key: str) -> dict[str, str]:
        self.full_reads += 1
        return dict(self.data[key])

    def deploy(self, name: str, *, bump: bool = True) -> None:
        doc = pipeline_doc(name, [{"http": {"path": f"/{name}"}}])
        self.data[keys.PIPELINES][name] = json.dumps({"document": doc})
        if bump:
            self.data[keys.PIPELINES_VERSION] = str(
                int(self.data.get(keys.PIPELINES_VERSION, 0)) + 1
            )


def test_the_routes_are_read_again_only_when_the_pipelines_version_moves() -> None:
    redis = _Redis()
    gateway = Gateway("b:9092", "redis://unused", backend=MemoryBackend([]), grpc_port=None)
    gateway._redis = redis
    redis.deploy("orders")

    async def refresh(times: int = 1) -> None:
        for _ in range(times):
            await gateway.refresh()

    asyncio.run(refresh())
    assert redis.full_reads == 1 and gateway.ingress.routes.pipelines == {"orders"}
    asyncio.run(refresh(20))
    assert redis.full_reads == 1, "nothing changed: no pipeline record is read"

    redis.deploy("billing")
    redis.data[keys.SCALED_TO_ZERO] = {"orders": "{}"}
    asyncio.run(refresh())
    assert redis.full_reads == 2 and set(gateway.ingress.routes.pipelines) == {"orders", "billing"}
    assert gateway.ingress.scaled_to_zero == {"orders"}, "read at every refresh"

    redis.deploy("audit", bump=False)  # a controller that writes no version (an older one)
    asyncio.run(refresh())
    assert "audit" not in gateway.ingress.routes.pipelines
    gateway._read_at = time.monotonic() - _REREAD_S  # found at the periodic full read
    asyncio.run(refresh())
    assert "audit" in gateway.ingress.routes.pipelines

    del redis.data[keys.PIPELINES_VERSION]  # no version at all: every refresh reads
    asyncio.run(refresh(3))
    assert redis.full_reads == 6
