"""The ``pipeline`` sink and source kinds: pipelines chained through ingress topics.

``sink: {pipeline: billing}`` (or a named sink under ``sinks:``) writes the events into
pipeline ``billing``'s ingress topic (``eventbus-ingress-billing``), on the stack's broker,
as the gateway writes its HTTP and gRPC events; ``billing`` consumes that topic when it has an
``http``, ``grpc`` or ``pipeline: {}`` source. No hand-made topic sits between them, and
deploying a pipeline whose ``pipeline:`` sink names a pipeline that is not deployed (or one
that does not consume its ingress topic) fails with the name and the fix.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.eventing.sinks._kafka import KafkaSink, KafkaSinkConfig
from eventbus.eventing.sources._http_config import ingress_topic
from eventbus.eventing.sources._kafka_config import KafkaSourceConfig
from eventbus.registry import sinks, sources

__all__ = ["PipelineSinkConfig", "PipelineSourceConfig", "pipeline_sink"]

_MODEL = ConfigDict(extra="forbid", frozen=True)
_NAME = r"^[a-z][a-z0-9-]{0,47}$"


class PipelineSinkConfig(BaseModel):
    """Into another pipeline: ``pipeline: NAME`` (or ``pipeline: {name: NAME}``).

    Example:
        >>> PipelineSinkConfig.model_validate("billing").topic
        'eventbus-ingress-billing'
    """

    model_config = _MODEL
    name: Annotated[str, StringConstraints(pattern=_NAME)] = Field(
        description="The pipeline whose ingress topic the events go to (deployed before this one)."
    )

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        # the short form, ``pipeline: NAME``, is valid too
        full = handler(core_schema)
        return {"anyOf": [{"type": "string", "pattern": _NAME}, full]}

    @property
    def topic(self) -> str:
        """The target pipeline's ingress topic."""
        return ingress_topic(self.name)


class PipelineSourceConfig(BaseModel):
    """Events other pipelines send with a ``pipeline:`` sink: ``- pipeline: {}``."""

    model_config = _MODEL


@sinks.register(
    "pipeline",
    config=PipelineSinkConfig,
    description="Into another pipeline's ingress topic (pipelines chain).",
    describe=lambda raw: str(raw.get("name") if isinstance(raw, dict) else raw or ""),
)
def pipeline_sink(
    config: PipelineSinkConfig,
    *,
    default_bootstrap: str,
    default_client: KafkaClientConfig | None = None,
) -> KafkaSink:
    """A Kafka sink on the stack's broker writing the target pipeline's ingress topic."""
    return KafkaSink(
        KafkaSinkConfig(topic=config.topic),
        bootstrap_servers=default_bootstrap,
        client=default_client,
    )


@sources.register(
    "pipeline",
    config=PipelineSourceConfig,
    description="Events other pipelines send here with a pipeline: sink.",
    ingress=True,
    describe=lambda raw: "",
)
def pipeline_source(config: PipelineSourceConfig, pipeline: str) -> KafkaSourceConfig:
    """Other pipelines' ``pipeline:`` sinks write to this pipeline's ingress topic."""
    return KafkaSourceConfig(topic=ingress_topic(pipeline))
