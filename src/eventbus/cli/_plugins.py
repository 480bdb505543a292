"""``eventbus plugins``: every registered step, source and sink kind, where it comes from,
and the plugins that could not be loaded."""

from __future__ import annotations

import json

import typer

from eventbus.cli._common import err, out, plain

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add this group's commands to the ``eventbus`` app.

    Args:
        app: The root app.
    """
    app.command()(plugins)


def plugins(
    as_json: bool = typer.Option(False, "--json", help="Print JSON (for scripts)."),
) -> None:
    """List the step, source and sink kinds (built-in and from plugins); exit 1 when a plugin
    could not be loaded."""
    from eventbus.registry import all_registries

    kinds = []
    problems = []
    for family, registry in all_registries().items():
        for reg in registry:
            kinds.append(
                {
                    "family": family,
                    "name": reg.name,
                    "origin": reg.origin,
                    "module": reg.module,
                    "description": reg.description,
                }
            )
        for p in registry.problems():
            problems.append(
                {
                    "family": family,
                    "name": p.name,
                    "distribution": p.distribution,
                    "group": p.group,
                    "error": p.error,
                }
            )
    if as_json:
        plain(out, json.dumps({"kinds": kinds, "problems": problems}, indent=2))
    else:
        width = max(len(k["name"]) for k in kinds)
        for family in ("step", "source", "sink"):
            plain(out, f"{family}s:")
            for k in kinds:
                if k["family"] == family:
                    plain(
                        out,
                        f"  {k['name']:<{width}}  {k['origin']:<24}  {k['description']}",
                    )
        for problem in problems:
            plain(
                err,
                f"plugin {problem['distribution']!r} ({problem['group']}: {problem['name']}) "
                f"could not be loaded: {problem['error']}",
            )
    if problems:
        raise typer.Exit(1)
