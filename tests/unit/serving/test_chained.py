"""Deploy-time checks of ``pipeline: NAME`` sinks (the controller's, without Ray): the target
must be deployed and consume its ingress topic; the message names the sink, the target and
the fix."""

from __future__ import annotations

import json
from typing import Any

import pytest

from eventbus.errors import DeployError
from eventbus.pipelines import load_pipeline_text
from eventbus.serving._deploys import check_chained

UPSTREAM = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: orders}
spec:
  sources: [{kafka: {topic: in}}]
  sinks:
    archive: {kafka: {topic: archive}}
    next: {pipeline: billing}
  routes:
    - {when: "data.amount > 100", sinks: [next]}
    - {default: true, sinks: [archive]}
"""


class Deployed:
    """What ``check_chained`` reads of Redis: the deployed pipelines' records."""

    def __init__(self, sources: dict[str, list[dict[str, Any]]]) -> None:
        self.records = {n: {"document": {"spec": {"sources": s}}} for n, s in sources.items()}

    def hget(self, key: str, name: str) -> str | None:
        record = self.records.get(name)
        return json.dumps(record) if record is not None else None

    def hkeys(self, key: str) -> list[str]:
        return list(self.records)


def check(deployed: Deployed) -> None:
    check_chained(deployed, load_pipeline_text(UPSTREAM, "p.yaml"))


def test_a_missing_target_is_refused_naming_the_deployed_ones() -> None:
    with pytest.raises(DeployError) as info:
        check(Deployed({"audit": [{"http": {}}]}))
    assert str(info.value) == (
        "pipeline 'orders' could not be deployed: spec.sinks.next.pipeline names pipeline "
        "'billing', which is not deployed (deployed: audit); deploy 'billing' first, or fix the name"
    )


def test_a_target_that_does_not_consume_its_ingress_topic_is_refused() -> None:
    with pytest.raises(
        DeployError,
        match=r"which has no http, grpc or pipeline source.*add '- pipeline: \{\}' to the sources of 'billing'",
    ):
        check(Deployed({"billing": [{"kafka": {"topic": "x"}}]}))


@pytest.mark.parametrize("source", [{"pipeline": {}}, {"http": {}}, {"grpc": {}}])
def test_a_target_with_an_ingress_source_is_accepted(source: dict[str, Any]) -> None:
    check(Deployed({"billing": [{"kafka": {"topic": "x"}}, source]}))
