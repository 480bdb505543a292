"""Every example of README.md and the docs site runs: pipeline YAML (whole, or a block marked
``<!-- docs-test: fragment -->`` inside a minimal pipeline) passes the loader, Kafka client
settings their model, Python compiles (and the marked blocks run), and every ``eventbus``
command line of a shell block (``$(...)`` included) parses with the CLI's own parser: the
command exists, its options and arguments are right, the ``examples/`` files it names exist."""

from __future__ import annotations

import re
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
from tests.docs.tutorial import SHELL_LANGS

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


# -- shell ----------------------------------------------------------------------------------


def _cli() -> Any:
    import typer

    from eventbus.cli import app

    return typer.main.get_command(app)


_SUBSHELL = re.compile(r"\$\(([^()]*)\)|`([^`]*)`")
_WRAPPERS = {"time", "exec", "nohup", "env", "sudo"}  # run the command that follows
_REDIRECT = re.compile(r"\d*(<|>|>>|&>)")  # then a file: `< secret.txt`, `2> err.log`


def _unredirected(argv: list[str]) -> list[str]:
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif _REDIRECT.fullmatch(token):
            skip = True
        elif not re.match(r"\d*(<|>|&>)", token):  # 2>&1, >out.log
            out.append(token)
    return out


def _command_lines(block: Block) -> list[str]:
    """The command lines of a shell block: continuations joined, comments and a console's
    ``$ `` prompts and output lines dropped, each ``$(...)`` a command line of its own."""
    text = block.text.replace("\\\n", " ")
    lines = text.splitlines()
    if block.lang == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    out = []
    for line in lines:
        line = line.split(" #", 1)[0] if not line.startswith("#") else ""
        for m in _SUBSHELL.finditer(line):
            out.append(m[1] if m[1] is not None else m[2])
        out.append(_SUBSHELL.sub("SUBST", line))
    return out


def _commands(block: Block) -> list[list[str]]:
    """The ``eventbus`` and ``make`` command lines of a shell block, as argv lists."""
    out = []
    for line in _command_lines(block):
        for part in line.replace("&&", ";").replace("||", ";").replace("|", ";").split(";"):
            try:
                argv = _unredirected(shlex.split(part))
            except ValueError:
                continue
            while argv and (argv[0] in _WRAPPERS or ("=" in argv[0] and argv[0][0] != "-")):
                argv = argv[1:]  # VAR=value or a wrapper before the command
            if argv and Path(argv[0]).name in ("eventbus", "make"):
                out.append([Path(argv[0]).name, *argv[1:]])
    return out


def parse_eventbus(argv: list[str]) -> str | None:
    """None when ``eventbus ARGV...`` parses with the CLI's parser (the command exists; its
    options, arguments and their values are right), else click's message."""
    import typer

    root = _cli()  # typer's click: its exceptions are typer.TyperException's
    ctx = root.make_context("eventbus", [], resilient_parsing=True)
    cmd, rest, name = root, list(argv), "eventbus"
    while rest and hasattr(cmd, "list_commands") and not rest[0].startswith("-"):
        sub = cmd.get_command(ctx, rest[0])
        if sub is None:
            return f"no command {rest[0]!r} under {ctx.command_path!r}"
        cmd, name, rest = sub, rest[0], rest[1:]
        ctx = typer.Context(cmd, info_name=name, parent=ctx)
    try:
        with cmd.make_context(name, rest, parent=ctx.parent):
            pass
    except typer.Exit:  # --help, --version
        return None
    except typer.TyperException as exc:
        return str(getattr(exc, "format_message", exc.__str__)())
    return None


SHELL = [b for b in blocks() if b.lang in SHELL_LANGS and b.mark != "skip"]


def test_the_pages_have_shell_commands() -> None:
    commands = [argv for b in SHELL for argv in _commands(b) if argv[0] == "eventbus"]
    assert len(commands) >= 50
    assert ["eventbus", "url", "gateway"] in commands  # from GW=$(eventbus url gateway)


@pytest.mark.parametrize("block", SHELL, ids=_ids(SHELL))
def test_shell_commands_parse(block: Block) -> None:
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
        problem = parse_eventbus(argv[1:])
        assert problem is None, f"{block.where}: {shlex.join(argv)!r}: {problem}"
        for token in argv[1:]:
            if token.startswith("examples/") and "*" not in token:
                assert (ROOT / token).exists(), f"{block.where}: {token} does not exist"


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("eventbus deploi x.yaml", "no command 'deploi'"),
        ("eventbus model push fraud", "Missing argument"),
        ("eventbus tail topic --max many", "Invalid value for '--max'"),
        ("eventbus up --brokr kafka", "No such option: --brokr"),
        ("eventbus up -z", "No such option: -z"),
        ("eventbus list extra", "unexpected extra argument(s) (extra)"),
        ('curl "$(eventbus url gateway --nope)/x"', "No such option: --nope"),
        ("eventbus secret set A B < secret.txt 2>&1", "unexpected extra argument(s) (B)"),
    ],
)
def test_a_broken_command_line_is_caught(line: str, problem: str) -> None:
    [argv] = _commands(Block(ROOT / "README.md", 1, "bash", line + "\n"))
    found = parse_eventbus(argv[1:])
    assert found is not None and problem in found, found


def test_a_console_block_s_prompts_are_the_commands() -> None:
    console = "$ eventbus list\nNAME  STATUS\n$ time eventbus status # the stack\n"
    block = Block(ROOT / "README.md", 1, "console", console)
    assert _commands(block) == [["eventbus", "list"], ["eventbus", "status"]]
    assert all(parse_eventbus(argv[1:]) is None for argv in _commands(block))


def _example_runs() -> list[tuple[str, str]]:
    """``eventbus validate|test examples/...`` as the pages write them: (command, file)."""
    runs = set()
    for block in SHELL:
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
