"""Every shell example of README.md and the docs site: each ``eventbus`` command line of a
shell block (bash, sh, shell, console; ``$(...)`` included) parses with the CLI's own parser
(the command exists; its options, arguments and values are right; the ``examples/`` files it
names exist), every ``make`` target exists, the commands the prose names exist, and the
``eventbus validate|test examples/...`` lines pass."""

from __future__ import annotations

import shlex

import pytest

from tests.docs.blocks import ROOT, Block, blocks
from tests.docs.shell import commands, inline_commands, inline_problem, parse_eventbus
from tests.docs.tutorial import SHELL_LANGS


def _ids(items: list[Block]) -> list[str]:
    return [b.where for b in items]


SHELL = [b for b in blocks() if b.lang in SHELL_LANGS and b.mark != "skip"]


def test_the_pages_have_shell_commands() -> None:
    found = [argv for b in SHELL for argv in commands(b) if argv[0] == "eventbus"]
    assert len(found) >= 50
    assert ["eventbus", "url", "gateway"] in found  # from GW=$(eventbus url gateway)


@pytest.mark.parametrize("block", SHELL, ids=_ids(SHELL))
def test_shell_commands_parse(block: Block) -> None:
    targets = {
        line.split(":", 1)[0]
        for line in (ROOT / "Makefile").read_text().splitlines()
        if line and not line[0].isspace() and ":" in line and "=" not in line.split(":", 1)[0]
    }
    for argv in commands(block):
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
    [argv] = commands(Block(ROOT / "README.md", 1, "bash", line + "\n"))
    found = parse_eventbus(argv[1:])
    assert found is not None and problem in found, found


def test_a_console_block_s_prompts_are_the_commands() -> None:
    console = "$ eventbus list\nNAME  STATUS\n$ time eventbus status # the stack\n"
    block = Block(ROOT / "README.md", 1, "console", console)
    assert commands(block) == [["eventbus", "list"], ["eventbus", "status"]]
    assert all(parse_eventbus(argv[1:]) is None for argv in commands(block))


INLINE = inline_commands()


def test_the_pages_name_commands_in_prose() -> None:
    assert len(INLINE) >= 100


@pytest.mark.parametrize(("page", "span"), INLINE)
def test_commands_named_in_prose_exist(page: str, span: str) -> None:
    problem = inline_problem(span)
    assert problem is None, f"{page}: `{span}`: {problem}"


@pytest.mark.parametrize(
    ("span", "problem"),
    [
        ("eventbus deploi", "no command 'deploi'"),
        ("eventbus topics list|creat", "no command 'creat'"),
        ("eventbus rollback NAME [--too V]", "no option --too"),
    ],
)
def test_a_wrong_command_in_prose_is_caught(span: str, problem: str) -> None:
    assert inline_problem(span) == problem
    assert inline_problem("eventbus topics list|create NAME --partitions N") is None


def _example_runs() -> list[tuple[str, str]]:
    """``eventbus validate|test examples/...`` as the pages write them: (command, file)."""
    runs = set()
    for block in SHELL:
        for argv in commands(block):
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
