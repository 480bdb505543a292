"""An in-process ingress: routes from pipeline documents, a backend that records what was
published and runs invokes through the real step runner (no Kafka, no Ray)."""

from __future__ import annotations

from typing import Any

import pytest

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.gateway._ingress import Ingress
from eventbus.gateway._routes import RouteTable
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._runner import PipelineRunner


class MemoryBackend:
    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self.runners = {
            d["metadata"]["name"]: PipelineRunner(PipelineConfig.model_validate(d)) for d in docs
        }
        self.published: dict[str, list[CloudEvent]] = {}
        self.fail_publish: Exception | None = None

    async def publish(self, pipeline: str, events: list[CloudEvent]) -> None:
        if self.fail_publish is not None:
            raise self.fail_publish
        self.published.setdefault(pipeline, []).extend(events)

    async def invoke(self, pipeline: str, events: list[CloudEvent]) -> list[Outcome]:
        return self.runners[pipeline].run(events)


def pipeline_doc(
    name: str, sources: list[dict[str, Any]], steps: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": sources,
            "steps": steps or [],
            "sink": {"kafka": {"topic": f"{name}-out"}},
        },
    }


STEPS = [
    {"id": "large", "filter": "data.amount > 100"},
    {
        "id": "cny",
        "convert": {
            "set": {
                "data.amount_cny": "double(data.amount) * 7.0",
                "data.cents": "data.amount * 100",
                "type": "'payment.large'",
            }
        },
    },
]
SCHEMA = {
    "type": "object",
    "required": ["amount"],
    "properties": {
        "amount": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
}
ENV = {"ORDERS_SECRET": "orders-secret", "PAY_TOKEN": "pay-token"}


def default_docs() -> list[dict[str, Any]]:
    return [
        pipeline_doc("open", [{"http": {"path": "/hooks/open"}}, {"grpc": {}}], STEPS),
        pipeline_doc(  # open too, and it answers (?wait=true, gRPC Invoke): mode sync
            "echo",
            [{"http": {"path": "/hooks/echo", "mode": "sync"}}, {"grpc": {"mode": "sync"}}],
            STEPS,
        ),
        pipeline_doc(
            "orders",
            [
                {
                    "http": {
                        "auth": {"hmac_sha256": {"secret_env": "ORDERS_SECRET"}},
                        "data_schema": SCHEMA,
                        "max_body_bytes": 2048,
                    }
                }
            ],
        ),
        pipeline_doc(
            "payments",
            [
                {"http": {"mode": "sync", "auth": {"bearer": {"token_env": "PAY_TOKEN"}}}},
                {"grpc": {"mode": "sync", "auth": {"bearer": {"token_env": "PAY_TOKEN"}}}},
            ],
            STEPS,
        ),
        pipeline_doc("kafka-only", [{"kafka": {"topic": "x"}}]),
        pipeline_doc("broken", [{"http": {"auth": {"bearer": {"token_env": "UNSET_TOKEN"}}}}]),
    ]


@pytest.fixture
def ingress_factory():
    def make(docs: list[dict[str, Any]] | None = None) -> tuple[Ingress, MemoryBackend]:
        docs = docs if docs is not None else default_docs()
        backend = MemoryBackend(docs)
        return Ingress(backend, RouteTable.from_documents(docs, ENV)), backend

    return make
