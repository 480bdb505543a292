"""Every example of README.md and the docs site runs: pipeline YAML (whole, or a block marked
``<!-- docs-test: fragment -->`` inside a minimal pipeline) passes the loader as ``eventbus
validate`` runs it, Kafka client settings their model, Python compiles (and the marked blocks
run). The shell examples: ``test_shell_examples.py``."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from eventbus import CloudEvent
from eventbus.eventing import KafkaClientConfig
from eventbus.pipelines import validate_pipeline_text
from eventbus.testing import run_pipeline
from tests.docs.blocks import ROOT, Block, blocks

_SPEC_KEYS = {
    "sources",
    "steps",
    "sink",
    "sinks",
    "routes",
    "dead_letter",
    "delivery",
    "serving",
    "observability",
    "model_pools",
}


def _ids(items: list[Block]) -> list[str]:
    return [b.where for b in items]


def as_pipeline(block: Block) -> str:
    """The block as a whole pipeline: a whole one as it is, a fragment (marked so: a part
    of a pipeline is not silently taken for one) inside a minimal one."""
    whole = "apiVersion: eventbus/v1" in block.text
    if whole or block.mark != "fragment":
        assert whole, (
            f"{block.where}: a YAML block that is not a whole pipeline (no `apiVersion: "
            "eventbus/v1`): mark it <!-- docs-test: fragment --> to have it validated inside "
            "a minimal pipeline, or <!-- docs-test: skip REASON --> if it is no pipeline"
        )
        assert block.mark != "fragment", f"{block.where}: a whole pipeline marked fragment"
        return block.text
    data = yaml.safe_load(textwrap.dedent(block.text))
    spec: dict[str, Any] = {
        "sources": [{"kafka": {"topic": "docs"}}],
        "steps": [],
        "sink": {"kafka": {"topic": "docs-out"}},
    }
    if isinstance(data, list):  # steps
        spec["steps"] = data
    else:
        assert isinstance(data, dict) and set(data) <= _SPEC_KEYS, (
            f"{block.where}: a YAML block that is neither a pipeline nor a fragment of its "
            f"spec (keys {sorted(data) if isinstance(data, dict) else data!r}); mark it "
            "<!-- docs-test: skip REASON --> if it is no pipeline"
        )
        if "sinks" in data:
            del spec["sink"]
        spec.update(data)
    document = {"apiVersion": "eventbus/v1", "kind": "Pipeline"}
    document["metadata"] = {"name": "docs"}
    document["spec"] = spec
    return yaml.safe_dump(document, sort_keys=False)


YAML = [b for b in blocks() if b.lang in ("yaml", "yml") and b.mark != "skip"]
CLIENT_SETTINGS = [b for b in YAML if b.text.startswith("security_protocol:")]
PIPELINES = [b for b in YAML if b not in CLIENT_SETTINGS]


def test_the_pages_have_examples() -> None:
    assert len(PIPELINES) >= 20 and len(CLIENT_SETTINGS) >= 3


@pytest.mark.parametrize("block", PIPELINES, ids=_ids(PIPELINES))
def test_pipeline_yaml_passes_the_loader(block: Block) -> None:
    """As ``eventbus validate`` checks a file (less what needs the example's own functions
    and secrets): no problem, and no old spelling that validate warns about."""
    from eventbus.serving._secret_check import deprecated_spellings

    config, problems = validate_pipeline_text(
        as_pipeline(block), block.where, check_functions=False
    )
    assert problems == [], "\n".join(str(p) for p in problems)
    assert config is not None and deprecated_spellings(config) == [], block.where


@pytest.mark.parametrize("block", CLIENT_SETTINGS, ids=_ids(CLIENT_SETTINGS))
def test_kafka_client_settings_pass_their_model(block: Block) -> None:
    KafkaClientConfig.model_validate(yaml.safe_load(block.text))


def test_a_broken_example_is_caught() -> None:
    steps = "- id: Bad-Id\n  filter: 'true'\n"
    broken = Block(ROOT / "README.md", 1, "yaml", steps, mark="fragment")
    _, problems = validate_pipeline_text(as_pipeline(broken), "x", check_functions=False)
    assert any("Bad-Id" in str(p) for p in problems)
    with pytest.raises(AssertionError, match="neither a pipeline nor a fragment"):
        as_pipeline(Block(ROOT / "README.md", 1, "yaml", "services: {kafka: {}}\n", "fragment"))
    with pytest.raises(AssertionError, match="mark it <!-- docs-test: fragment -->"):
        as_pipeline(Block(ROOT / "README.md", 1, "yaml", steps))  # a fragment, unmarked
    whole = "apiVersion: eventbus/v1\nkind: Pipeline\n"
    with pytest.raises(AssertionError, match="a whole pipeline marked fragment"):
        as_pipeline(Block(ROOT / "README.md", 1, "yaml", whole, mark="fragment"))


SAME_AS = [b for b in blocks("yaml") if b.mark == "same-as"]


@pytest.mark.parametrize("block", SAME_AS, ids=_ids(SAME_AS))
def test_a_copied_example_matches_its_file(block: Block) -> None:
    assert yaml.safe_load(block.text) == yaml.safe_load((ROOT / block.mark_arg).read_text())


PYTHON = blocks("python")


@pytest.mark.parametrize("block", PYTHON, ids=_ids(PYTHON))
def test_python_compiles(block: Block) -> None:
    compile(block.text, block.where, "exec")


RUN = [b for b in PYTHON if b.mark == "run"]


@pytest.mark.parametrize("block", RUN, ids=_ids(RUN))
def test_marked_python_runs(block: Block) -> None:
    exec(compile(block.text, block.where, "exec"), {"__name__": "docs_example"})


def test_readme_pipeline_runs_with_its_function(tmp_path: Path, monkeypatch: Any) -> None:
    readme = [b for b in blocks() if b.path.name == "README.md"]
    pipeline = next(b for b in readme if b.lang == "yaml" and "function:" in b.text)
    function = next(b for b in readme if b.lang == "python" and "# scoring.py" in b.text)
    (tmp_path / "orders.yaml").write_text(pipeline.text)
    (tmp_path / "scoring.py").write_text(function.text)
    monkeypatch.syspath_prepend(str(tmp_path))

    def order(i: str, amount: int) -> CloudEvent:
        return CloudEvent.create(type="order.created", source="/t", id=i, data={"amount": amount})

    result = run_pipeline(tmp_path / "orders.yaml", [order("a", 50), order("b", 500)])
    assert [(e.id, e.data["score"]) for e in result.outputs] == [("b", 0.5)]
    assert result.dropped == 1


def test_first_tutorial_tells_what_the_sample_payments_give(monkeypatch: Any) -> None:
    import json

    monkeypatch.syspath_prepend(
        str(ROOT / "examples/payments")
    )  # as eventbus deploy resolves fraud:score

    page = (ROOT / "docs" / "tutorials" / "first-pipeline.md").read_text()
    assert "three are large payments" in page and "two are filtered" in page
    lines = (ROOT / "examples/payments/events.jsonl").read_text().splitlines()
    events = []
    for line in lines:
        raw = json.loads(line)
        events.append(
            CloudEvent.create(
                type=raw["type"], source=raw["source"], id=raw["id"], data=raw["data"]
            )
        )
    result = run_pipeline(ROOT / "examples/payments/payments.yaml", events)
    assert [e.type for e in result.outputs] == ["payment.large"] * 3
    assert result.dropped == 2
    assert [d["ebstep"] for d in result.dead_letters] == ["score"]
