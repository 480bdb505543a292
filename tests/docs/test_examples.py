"""Every example of README.md and the docs site runs: pipeline YAML (whole or a fragment in a
pipeline) passes the loader, Kafka client settings their model, Python compiles (and the
marked blocks run), and the shell commands name commands, options and files that exist."""

from __future__ import annotations

import shlex
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
}


def _ids(items: list[Block]) -> list[str]:
    return [b.where for b in items]


def as_pipeline(block: Block) -> str:
    """The block as a whole pipeline: a whole one as it is, a fragment inside a minimal one."""
    if "apiVersion: eventbus/v1" in block.text:
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


YAML = [b for b in blocks("yaml") if b.mark != "skip"]
CLIENT_SETTINGS = [b for b in YAML if b.text.startswith("security_protocol:")]
PIPELINES = [b for b in YAML if b not in CLIENT_SETTINGS]


def test_the_pages_have_examples() -> None:
    assert len(PIPELINES) >= 20 and len(CLIENT_SETTINGS) >= 3


@pytest.mark.parametrize("block", PIPELINES, ids=_ids(PIPELINES))
def test_pipeline_yaml_passes_the_loader(block: Block) -> None:
    _, problems = validate_pipeline_text(as_pipeline(block), block.where, check_functions=False)
    assert problems == [], "\n".join(str(p) for p in problems)


@pytest.mark.parametrize("block", CLIENT_SETTINGS, ids=_ids(CLIENT_SETTINGS))
def test_kafka_client_settings_pass_their_model(block: Block) -> None:
    KafkaClientConfig.model_validate(yaml.safe_load(block.text))


def test_a_broken_example_is_caught() -> None:
    broken = Block(ROOT / "README.md", 1, "yaml", "- id: Bad-Id\n  filter: 'true'\n")
    _, problems = validate_pipeline_text(as_pipeline(broken), "x", check_functions=False)
    assert any("Bad-Id" in str(p) for p in problems)
    with pytest.raises(AssertionError, match="neither a pipeline nor a fragment"):
        as_pipeline(Block(ROOT / "README.md", 1, "yaml", "services: {kafka: {}}\n"))


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


# -- shell ----------------------------------------------------------------------------------


def _cli() -> Any:
    import typer

    from eventbus.cli import app

    return typer.main.get_command(app)


def _commands(block: Block) -> list[list[str]]:
    """The ``eventbus`` and ``make`` command lines of a shell block, as argv lists."""
    out = []
    text = block.text.replace("\\\n", " ")
    for line in text.splitlines():
        for part in line.split("#", 1)[0].replace("&&", ";").replace("|", ";").split(";"):
            try:
                argv = shlex.split(part)
            except ValueError:
                continue
            while argv and "=" in argv[0] and not argv[0].startswith("-"):
                argv = argv[1:]  # VAR=value before the command
            if argv and Path(argv[0]).name in ("eventbus", "make"):
                out.append([Path(argv[0]).name, *argv[1:]])
    return out


SHELL = [b for b in blocks("bash") if b.mark != "skip"]


@pytest.mark.parametrize("block", SHELL, ids=_ids(SHELL))
def test_shell_commands_exist(block: Block) -> None:
    root = _cli()
    targets = {
        line.split(":", 1)[0]
        for line in (ROOT / "Makefile").read_text().splitlines()
        if line and not line[0].isspace() and ":" in line and "=" not in line.split(":", 1)[0]
    }
    for argv in _commands(block):
        if argv[0] == "make":
            missing = [t for t in argv[1:] if not t.startswith("-") and "=" not in t]
            assert set(missing) <= targets, f"{block.where}: no make target {missing}"
            continue
        cmd, rest = root, argv[1:]
        while rest and hasattr(cmd, "list_commands") and not rest[0].startswith("-"):
            sub = cmd.get_command(None, rest[0])
            assert sub is not None, f"{block.where}: no command {' '.join(argv)!r}"
            cmd, rest = sub, rest[1:]
        options = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        for token in rest:
            name = token.split("=", 1)[0]
            if name.startswith("--"):
                assert name in options, f"{block.where}: {' '.join(argv)!r}: no option {name}"
            elif token.startswith("examples/") and "*" not in token:
                assert (ROOT / token).exists(), f"{block.where}: {token} does not exist"


def _example_runs() -> list[tuple[str, str]]:
    """``eventbus validate|test examples/...`` as the pages write them: (command, file)."""
    runs = set()
    for block in blocks("bash"):
        for argv in _commands(block):
            if argv[0] == "eventbus" and len(argv) >= 3 and argv[1] in ("validate", "test"):
                runs.update((argv[1], f) for f in argv[2:] if f.startswith("examples/"))
    return sorted(runs)


EXAMPLE_RUNS = _example_runs()


def test_the_pages_run_the_examples() -> None:
    assert ("test", "examples/payments/payments.yaml") in EXAMPLE_RUNS


@pytest.mark.parametrize(("command", "path"), EXAMPLE_RUNS)
def test_example_commands_pass(command: str, path: str) -> None:
    from typer.testing import CliRunner

    from eventbus.cli import app

    done = CliRunner().invoke(app, [command, str(ROOT / path)])
    assert done.exit_code == 0, done.output


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
