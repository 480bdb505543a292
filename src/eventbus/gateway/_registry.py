"""The schema registry, served by the gateway under ``/registry``.

``http://<gateway>/registry`` is a Confluent-compatible registry URL (``eventbus.schemas``):
give it to confluent-kafka's ``SchemaRegistryClient({"url": ...})``. Its state is the
``_schemas`` topic of the gateway's broker, read from the first registry request on (a
gateway whose users never ask for it keeps no reader of the topic); every gateway of a
cluster serves the same registry. Changes need the gateway's admin token when one is set
(``Authorization: Bearer``, or the password of basic auth); reads are open.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from eventbus.eventing._kafka_client import KafkaClientConfig

__all__ = ["REGISTRY_PREFIX", "RegistryMount"]

log = logging.getLogger("eventbus.gateway")

REGISTRY_PREFIX = "/registry"


class RegistryMount:
    """ASGI: ``/registry/...`` to the registry (started on first use), the rest to ``app``.

    Args:
        app: the gateway's app.
        bootstrap: the broker whose ``_schemas`` topic holds the registry.
        client: the broker's TLS/SASL settings.
        write_token: the token that changes need (the admin token); None: open.
    """

    def __init__(
        self,
        app: Any,
        bootstrap: str,
        client: KafkaClientConfig | None = None,
        write_token: str | None = None,
    ) -> None:
        self.app = app
        self.bootstrap = bootstrap
        self.client = client
        self.write_token = write_token
        self._registry_app: Any = None
        self._log: Any = None
        self._starting = asyncio.Lock()

    async def _started(self) -> Any:
        if self._registry_app is not None:
            return self._registry_app
        async with self._starting:
            if self._registry_app is None:
                from eventbus.schemas import KafkaSchemaLog, SchemaRegistry, build_registry_app

                schema_log = KafkaSchemaLog(self.bootstrap, client=self.client)
                try:
                    await schema_log.start()
                except BaseException:
                    await schema_log.close()
                    raise
                self._log = schema_log
                self._registry_app = build_registry_app(
                    SchemaRegistry(schema_log), write_token=self.write_token
                )
        return self._registry_app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == REGISTRY_PREFIX or path.startswith(REGISTRY_PREFIX + "/")):
            await self.app(scope, receive, send)
            return
        try:
            registry_app = await self._started()
        except Exception as e:  # noqa: BLE001 - answered to the client, retried next request
            from eventbus.schemas import SCHEMAS_TOPIC

            log.warning("schema registry: reading %s failed: %s", SCHEMAS_TOPIC, e)
            body = {
                "error_code": 50001,
                "message": f"the registry could not read its topic {SCHEMAS_TOPIC!r} on "
                f"{self.bootstrap}: {e}; retry once the broker is reachable",
            }
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"application/vnd.schemaregistry.v1+json")],
                }
            )
            await send({"type": "http.response.body", "body": orjson.dumps(body)})
            return
        child = dict(scope)
        child["root_path"] = scope.get("root_path", "") + REGISTRY_PREFIX
        if path == REGISTRY_PREFIX:
            child["path"] = REGISTRY_PREFIX + "/"
        await registry_app(child, receive, send)

    async def close(self) -> None:
        """Stop reading the topic (the gateway stops)."""
        if self._log is not None:
            await self._log.close()
