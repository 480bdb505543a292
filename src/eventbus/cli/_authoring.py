"""Writing pipelines, no stack needed: ``eventbus schema``, ``eventbus test``."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from eventbus.cli._common import err, fail, out, plain
from eventbus.errors import ConfigError, PipelineConfigError

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add this group's commands to the ``eventbus`` app.

    Args:
        app: The root app.
    """
    app.command()(schema)
    app.command("test")(test_)


def schema(
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to this file."),
) -> None:
    """Print the JSON Schema of pipeline YAML."""
    from eventbus.pipelines._schema import pipeline_schema_json

    text = pipeline_schema_json()
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")


def test_(
    paths: list[str] = typer.Argument(
        ..., help="Pipeline files, *_test.yaml files or directories."
    ),
) -> None:
    """Run pipeline unit tests in process (no stack needed)."""
    from eventbus.pipelines._testing import find_test_files, run_test_file

    try:
        files = find_test_files(paths)
    except ConfigError as exc:
        fail(str(exc))
    if not files:
        fail(f"no *_test.yaml files under {', '.join(paths)}")
    passed = failed = 0
    for f in files:
        try:
            results = run_test_file(f)
        except PipelineConfigError as exc:
            for p in exc.problems:
                plain(err, p)
            failed += 1
            continue
        except ConfigError as exc:
            plain(err, str(exc))
            failed += 1
            continue
        for r in results:
            if r.passed:
                passed += 1
                out.print(f"[green]PASS[/green] {r.file}: {r.name}", highlight=False)
            else:
                failed += 1
                out.print(f"[red]FAIL[/red] {r.file}: {r.name}", highlight=False)
                for d in r.diffs:
                    out.print(d, highlight=False, markup=False)
    out.print(f"{passed} passed, {failed} failed")
    if failed:
        raise typer.Exit(1)
