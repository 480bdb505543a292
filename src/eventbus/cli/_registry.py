"""The schema registry: ``eventbus registry list|get|register|check``.

Speaks the Confluent REST API, so it works against EventBus's own registry (the gateway's
``/registry``, the default) and any Confluent-compatible one (``--url``). ``eventbus schema``
stays the pipeline YAML's JSON Schema.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import typer

from eventbus.cli._common import fail, home, out, plain

__all__ = ["register"]

registry_app = typer.Typer(
    name="registry",
    help="Schemas of the Confluent-compatible schema registry (the gateway's /registry by "
    "default): list, get, register, check.",
    no_args_is_help=True,
)

UrlOpt = typer.Option(
    None,
    "--url",
    envvar="EVENTBUS_REGISTRY_URL",
    help="The registry's base URL; default: the recorded stack's gateway + /registry.",
)
TokenOpt = typer.Option(
    None,
    "--token",
    envvar="EVENTBUS_ADMIN_TOKEN",
    help="Bearer token for changes (EventBus's registry: the gateway's admin token).",
)


def register(app: typer.Typer) -> None:
    """Add the ``registry`` group to the ``eventbus`` app.

    Args:
        app: The root app.
    """
    app.add_typer(registry_app, name="registry")


def _base(url: str | None) -> str:
    if url:
        return url.rstrip("/")
    from eventbus._internal.stack import load_stack

    stack = load_stack(home())
    if stack is None or not stack.gateway_http:
        fail(
            f"no gateway is recorded in {home()}; start the stack with `eventbus up`, or name "
            "a registry with --url (or $EVENTBUS_REGISTRY_URL)"
        )
    return f"{stack.gateway_http}/registry"


def _call(
    method: str, url: str | None, path: str, body: Any = None, token: str | None = None
) -> Any:
    import httpx

    base = _base(url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(method, base + path, json=body, headers=headers, timeout=30)
    except httpx.HTTPError as e:
        fail(f"the schema registry at {base} did not answer: {e}")
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if response.status_code >= 400:
        if isinstance(answer, dict) and "message" in answer:
            fail(f"{answer['message']} (error_code {answer.get('error_code')}; {base})")
        fail(
            f"the schema registry at {base} answered {response.status_code}: {response.text[:500]}"
        )
    return answer


def _schema_body(file: Path, schema_type: str) -> dict[str, Any]:
    try:
        text = file.read_text()
    except OSError as e:
        fail(f"cannot read the schema file {file}: {e}")
    return {"schema": text, "schemaType": schema_type.upper()}


def _s(subject: str) -> str:
    return quote(subject, safe="")


@registry_app.command("list")
def list_(
    subject: str | None = typer.Argument(None, help="A subject: list its versions instead."),
    url: str | None = UrlOpt,
) -> None:
    """Print the subjects, one a line (or a subject's versions)."""
    path = f"/subjects/{_s(subject)}/versions" if subject else "/subjects"
    for item in _call("GET", url, path):
        plain(out, str(item))


@registry_app.command()
def get(
    subject: str = typer.Argument(..., help="The subject."),
    version: str = typer.Option("latest", "--version", help="A version number, or latest."),
    url: str | None = UrlOpt,
) -> None:
    """Print a version of a subject: its id, version and schema (JSON)."""
    answer = _call("GET", url, f"/subjects/{_s(subject)}/versions/{quote(version, safe='')}")
    plain(out, json.dumps(answer, indent=2))


@registry_app.command("register")
def register_(
    subject: str = typer.Argument(..., help="The subject (Confluent's default: TOPIC-value)."),
    file: Path = typer.Argument(
        ..., help="The schema file (.avsc; a JSON Schema .json with --type JSON)."
    ),
    schema_type: str = typer.Option("AVRO", "--type", help="The schema's type: AVRO or JSON."),
    url: str | None = UrlOpt,
    token: str | None = TokenOpt,
) -> None:
    """Register a schema under a subject (checked for compatibility); print its id."""
    body = _schema_body(file, schema_type)
    answer = _call("POST", url, f"/subjects/{_s(subject)}/versions", body, token)
    plain(out, str(answer["id"]))


@registry_app.command()
def check(
    subject: str = typer.Argument(..., help="The subject."),
    file: Path = typer.Argument(
        ..., help="The candidate schema file (.avsc, or .json with --type JSON)."
    ),
    version: str | None = typer.Option(
        None, "--version", help="Check against this version only; default: as the level says."
    ),
    schema_type: str = typer.Option("AVRO", "--type", help="The schema's type: AVRO or JSON."),
    url: str | None = UrlOpt,
) -> None:
    """Would the schema be accepted under the subject's compatibility level? Exit 1 if not."""
    path = f"/compatibility/subjects/{_s(subject)}/versions"
    if version is not None:
        path += f"/{quote(version, safe='')}"
    answer = _call("POST", url, path + "?verbose=true", _schema_body(file, schema_type))
    if answer.get("is_compatible"):
        plain(out, "compatible")
        return
    fail("incompatible:\n" + "\n".join(f"  {m}" for m in answer.get("messages") or ()))
