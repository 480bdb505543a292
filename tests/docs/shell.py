"""The shell of README.md and the docs site's pages: the ``eventbus`` and ``make`` command
lines of their shell blocks, the ``eventbus`` commands their prose names, and the CLI's own
parser run over them (``test_shell_examples.py``)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from tests.docs.blocks import ROOT, Block, pages


def cli() -> Any:
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


def commands(block: Block) -> list[list[str]]:
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

    root = cli()  # typer's click: its exceptions are typer.TyperException's
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


_FENCED = re.compile(r"^ *```.*?^ *```", re.M | re.S)
_INLINE = re.compile(r"(?<!`)`(eventbus [^`\n]+)`")


def inline_commands() -> list[tuple[str, str]]:
    """The prose's ``eventbus ...`` code spans: (page, span)."""
    out = []
    for page in pages():
        text = _FENCED.sub("", page.read_text(encoding="utf-8"))
        out += [(str(page.relative_to(ROOT)), m[1]) for m in _INLINE.finditer(text)]
    return out


def inline_problem(span: str) -> str | None:
    """None when the commands a prose span names exist and have the ``--options`` it names.
    A span names a command, not a whole command line: arguments may be left out, ``a/b`` or
    ``a|b`` names several subcommands, an upper-case word (``NAME``) is a placeholder."""
    cmds = [cli()]
    for token in shlex.split(span.replace("[", " ").replace("]", " "))[1:]:
        if token.startswith("-"):
            name = token.split("=", 1)[0]
            options = {o for c in cmds for p in c.params for o in (*p.opts, *p.secondary_opts)}
            if name.startswith("--") and name not in options:
                return f"no option {name}"
        elif all(hasattr(c, "list_commands") for c in cmds) and not token.isupper():
            subs = [(c, n) for c in cmds for n in re.split(r"[/|]", token)]
            missing = [n for c, n in subs if c.get_command(None, n) is None]
            if missing:
                return f"no command {missing[0]!r}"
            cmds = [c.get_command(None, n) for c, n in subs]
        elif token.isupper() and all(hasattr(c, "list_commands") for c in cmds):
            return None  # `eventbus COMMAND --help`: any command
    return None
