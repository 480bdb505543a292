"""Which pipelines can run ``delivery: {guarantee: exactly_once}`` (Kafka transactions).

A Kafka transaction covers records written to, and offsets committed in, one Kafka cluster. A
pipeline runs exactly once only when everything its batch changes is in that cluster: its
sources are Kafka topics, every sink (routes' sinks and the dead-letter sink included) is a
Kafka topic of the sources' cluster, and no step keeps state elsewhere that a batch consumed
again would change twice. A stateful (``ordered``) step kind may declare the trait
``exactly_once``: a callable of its config giving (setting, reason and fix) when that config
cannot run exactly once, None when it can (a join, an aggregate: their Redis state gives an
event consumed again the outputs it gave the first time, and nothing they emit comes from
outside a consumed batch; see docs/concepts/delivery.md). Stateful kinds without it are
refused. Delivery dedupe is then unnecessary.
"""

from __future__ import annotations

from typing import Any

from eventbus import registry

__all__ = ["guarantee_problems"]

_ALTERNATIVES = (
    "keep guarantee: at_least_once (the default) with delivery.dedupe for effectively-once delivery"
)


def guarantee_problems(spec: Any) -> list[str]:
    """One message per reason ``spec`` (a pipeline's spec) cannot run exactly once; [] when it
    can or does not ask to."""
    if spec.delivery.guarantee != "exactly_once":
        return []
    problems: list[str] = []
    why = "delivery.guarantee is 'exactly_once'"
    if spec.delivery.dedupe is not None:
        problems.append(
            f"delivery.dedupe is set but {why}: the Kafka transaction already delivers each "
            "output once; drop delivery.dedupe"
        )
    clusters: set[tuple[str | None, str]] = set()
    for i, src in enumerate(spec.sources):
        if src.kind != "kafka":
            problems.append(
                f"sources[{i}] is of kind {src.kind!r} but {why}: only events read from a Kafka "
                "topic can be consumed inside a Kafka transaction; move the source to another "
                f"pipeline that writes a Kafka topic, or {_ALTERNATIVES}"
            )
            continue
        clusters.add(_cluster(src.options))
    for path, sink in spec.output_paths().items():
        if sink.kind != "kafka":
            problems.append(
                f"spec.{path} is of kind {sink.kind!r} but {why}: a {sink.kind} sink cannot join a "
                "Kafka transaction; write to a Kafka topic and deliver it from there with an "
                f"at-least-once pipeline, or {_ALTERNATIVES}"
            )
            continue
        clusters.add(_cluster(sink.options))
    if len(clusters) > 1:
        shown = ", ".join(sorted(c[0] or "the stack's broker" for c in clusters))
        problems.append(
            f"the sources and sinks name several Kafka clusters ({shown}) but {why}: a Kafka "
            "transaction covers one cluster; give every source and sink the same "
            f"bootstrap_servers and client, or {_ALTERNATIVES}"
        )
    for step in spec.steps:
        kind = registry.steps.get(step.kind)
        if not kind.trait("ordered", False):
            continue
        accepts = kind.trait("exactly_once")
        if accepts is None:
            problems.append(
                f"step {step.id!r} is of kind {step.kind!r} but {why}: its state lives in Redis, "
                "outside the Kafka transaction, so a batch consumed again would update it "
                f"twice; {_ALTERNATIVES}"
            )
            continue
        refused = accepts(step.options)
        if refused is not None:
            setting, reason = refused
            problems.append(
                f"step {step.id!r} is of kind {step.kind!r} with {setting} but {why}: {reason}; "
                f"or {_ALTERNATIVES}"
            )
    return problems


def _cluster(options: Any) -> tuple[str | None, str]:
    client = getattr(options, "client", None)
    shown = client.model_dump_json() if client is not None else ""
    return getattr(options, "bootstrap_servers", None), shown
