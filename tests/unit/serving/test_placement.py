"""``serving.placement``: the config's checks, Ray's label-selector rules, the deploy's check
against the live nodes, and what reaches Serve (``label_selector``, ``max_replicas_per_node``)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from eventbus.cli import app
from eventbus.pipelines import PipelineConfig
from eventbus.pipelines._placement_config import label_matches
from eventbus.serving._deployment import _actor_options
from eventbus.serving._placement import placement_problems


def config(serving: dict[str, Any]) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": "placed"},
            "spec": {
                "sources": [{"kafka": {"topic": "in"}}],
                "sink": {"kafka": {"topic": "out"}},
                "serving": serving,
            },
        }
    )


def node(address: str, **labels: str) -> dict[str, Any]:
    return {"id": address, "address": address, "labels": labels}


NODES = [node("10.0.0.1", zone="a"), node("10.0.0.2", zone="b"), node("10.0.0.3", zone="b")]


@pytest.mark.parametrize(
    ("selector", "labels", "hit"),
    [
        ({"zone": "b"}, {"zone": "b"}, True),
        ({"zone": "b"}, {"zone": "a"}, False),
        ({"zone": "b"}, {}, False),
        ({"zone": "!b"}, {"zone": "a"}, True),
        ({"zone": "!b"}, {}, True),  # Ray: a node without the key is not 'b'
        ({"zone": "!b"}, {"zone": "b"}, False),
        ({"zone": "in(a, c)"}, {"zone": "c"}, True),
        ({"zone": "in(a,c)"}, {"zone": "b"}, False),
        ({"zone": "!in(a,c)"}, {"zone": "b"}, True),
        ({"zone": "b", "gpu": "h200"}, {"zone": "b"}, False),
        ({}, {"zone": "b"}, True),
    ],
)
def test_label_selector_rules(selector: dict[str, str], labels: dict[str, str], hit: bool) -> None:
    assert label_matches(selector, labels) is hit


def test_what_fits_is_accepted() -> None:
    spread = config({"replicas": 2, "placement": {"spread": True, "node_labels": {"zone": "b"}}})
    assert placement_problems(spread.spec.serving, NODES) == []
    assert placement_problems(config({"replicas": 5}).spec.serving, NODES) == []  # no placement
    # autoscaling past the nodes there are: only replicas.min must fit now
    grow = {"replicas": {"min": 2, "max": 9}, "placement": {"spread": True}}
    assert placement_problems(config(grow).spec.serving, NODES) == []


def test_labels_no_live_node_has_are_refused_naming_the_nodes() -> None:
    cfg = config({"placement": {"node_labels": {"zone": "eu-9"}}})
    [problem] = placement_problems(cfg.spec.serving, NODES)
    assert problem.startswith(
        "spec.serving.placement.node_labels: no live Ray node has labels {zone: eu-9}"
    )
    assert "10.0.0.2 {zone: b}" in problem and "ray start --address HEAD --labels" in problem


def test_spread_wider_than_the_matching_nodes_is_refused() -> None:
    cfg = config({"replicas": 3, "placement": {"spread": True, "node_labels": {"zone": "b"}}})
    [problem] = placement_problems(cfg.spec.serving, NODES)
    assert "asks at least 3 and 2 live Ray node(s) with labels {zone: b} can take one" in problem
    assert "lower replicas to 2, or drop spread" in problem
    # no nodes at all (a cluster whose only node just died)
    assert placement_problems(config({"placement": {"spread": True}}).spec.serving, [])


@pytest.mark.parametrize(
    ("placement", "expect"),
    [
        ({"node_labels": {"zone": "eu 1"}}, "node_labels.zone is 'eu 1': not a label selector"),
        ({"node_labels": {"zone": "in(a,"}}, "not a label selector"),
        ({"node_labels": {"zone": "x" * 64}}, "not a label selector"),
        ({"node_labels": {"bad key!": "a"}}, "node_labels.bad key!"),
        ({"spread": "sometimes"}, "spread"),
        ({"hosts": ["a"]}, "hosts"),  # a misspelled field is an error, not ignored
    ],
)
def test_malformed_placement_is_refused(placement: dict[str, Any], expect: str) -> None:
    with pytest.raises(ValidationError) as info:
        config({"placement": placement})
    assert expect in str(info.value)


def test_a_shared_host_refuses_placement() -> None:
    with pytest.raises(ValidationError) as info:
        config({"host": "edge", "placement": {"spread": True}})
    assert (
        "serving.placement is {'spread': True, 'node_labels': {}} but serving.host is 'edge'"
        in (str(info.value))
    )


def test_serve_gets_the_label_selector() -> None:
    cfg = config({"placement": {"node_labels": {"zone": "in(a,b)"}}})
    assert _actor_options(cfg.spec.serving, [])["label_selector"] == {"zone": "in(a,b)"}
    assert "label_selector" not in _actor_options(config({}).spec.serving, [])


@pytest.mark.parametrize("bad", ["zone", "zone=", "=b", "zone=a b", "zone=a,=c"])
def test_up_refuses_malformed_labels(bad: str, tmp_path: Any) -> None:
    res = CliRunner().invoke(app, ["up", "--labels", bad], env={"EVENTBUS_HOME": str(tmp_path)})
    assert res.exit_code == 2 and "give KEY=VALUE" in res.output, res.output
