"""``eventbus model``: push versions (or watch a directory for them), list them, split traffic,
shadow a candidate version, show the history of rollbacks and experiments.

Ray is imported only when a command runs. Exit codes: 0 ok, 1 invalid input or a rejected
version, 2 usage.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from eventbus.cli._common import (
    EXIT_FAILED,
    EXIT_USAGE,
    Addresses,
    KafkaOpt,
    RayOpt,
    RedisOpt,
    controller_client,
    err,
    fail,
    out,
    plain,
)
from eventbus.errors import EventBusError, ModelValidationError

if TYPE_CHECKING:
    from eventbus.serving import EventBusClient

__all__ = ["register"]

model_app = typer.Typer(
    name="model",
    help="Models served as pipeline stages: push versions, list them, split traffic between two, "
    "shadow a candidate.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add the ``model`` group to the ``eventbus`` app.

    Args:
        app: The root app.
    """
    app.add_typer(model_app, name="model")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def shadow_text(c: dict[str, Any] | None) -> str:
    """A shadow comparison in one line (empty when the version had none)."""
    if not c:
        return ""
    parts = [f"{c.get('share', 0):.0%} mirrored" + ("" if c.get("active") else " (stopped)")]
    parts.append(f"{c['rows']} rows")
    if c.get("agreement") is not None:
        parts.append(f"agree {c['agreement']:.1%}")
    if c.get("mad") is not None:
        parts.append(f"mad {c['mad']:.4g}")
    parts.append(
        f"p50/p99 live {_ms(c.get('live_p50_ms'))}/{_ms(c.get('live_p99_ms'))} ms, "
        f"candidate {_ms(c.get('candidate_p50_ms'))}/{_ms(c.get('candidate_p99_ms'))} ms"
    )
    parts.append(f"errors {c['errors']}")
    parts.append(f"dropped {c['dropped_rows']} rows")
    if c.get("nonfinite"):
        parts.append(f"non-finite {c['nonfinite']}")
    if c.get("mismatched"):
        parts.append(f"other shape {c['mismatched']}")
    return ", ".join(parts)


def _client(ray_address: str | None, kafka: str | None, redis: str | None) -> EventBusClient:
    return controller_client(Addresses(ray_address, kafka, redis))


def _push(
    client: EventBusClient,
    name: str,
    path: Path,
    factory: str | None,
    samples: Path | None,
    min_accuracy: float | None,
    serve: bool = True,
) -> bool:
    try:
        with out.status(f"pushing {path} as a new version of {name}..."):
            info = client.push_model(
                name,
                path,
                factory=factory,
                samples=samples,
                min_accuracy=min_accuracy,
                serve=serve,
            )
    except ModelValidationError as exc:
        err.print("[red]rejected:[/red] ", end="")
        plain(err, str(exc))
        return False
    except EventBusError as exc:
        err.print("[red]error:[/red] ", end="")
        plain(err, str(exc))
        return False
    if info["status"] == "serving":
        out.print(f"model [bold]{name}[/bold] version {info['version']} validated and serving")
    else:
        out.print(
            f"model [bold]{name}[/bold] version {info['version']} validated, a candidate "
            f"(version {info['serving']} serves): `eventbus model shadow {name} "
            f"{info['version']}` compares it on live calls"
        )
    return True


@model_app.command()
def push(
    name: str = typer.Argument(
        ..., help="The model's name (its deployment is eventbus-model-NAME)."
    ),
    path: Path = typer.Argument(
        ..., help="TorchScript file, torch.export program (.pt2), or state_dict with --factory."
    ),
    factory: str | None = typer.Option(
        None, "--factory", help="module:attr building the module of a state_dict."
    ),
    samples: Path | None = typer.Option(
        None, "--samples", help=".npz of labelled x, y scored on every new version."
    ),
    min_accuracy: float | None = typer.Option(
        None,
        "--min-accuracy",
        min=0,
        max=1,
        help="Reject versions below this accuracy on --samples.",
    ),
    candidate: bool = typer.Option(
        False,
        "--candidate",
        help="Validate it but keep the serving version: a candidate for `model shadow` or "
        "`model split`.",
    ),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Push a new version: validated on recent requests, swapped in, or rejected (exit 1)."""
    client = _client(ray_address, kafka_bootstrap, redis_url)
    if not _push(client, name, path, factory, samples, min_accuracy, serve=not candidate):
        raise typer.Exit(1)


@model_app.command()
def watch(
    name: str = typer.Argument(..., help="The model's name."),
    directory: Path = typer.Argument(
        ..., help="Push each model file written here (online learning exports)."
    ),
    factory: str | None = typer.Option(None, "--factory", help="module:attr for state_dict files."),
    every_s: float = typer.Option(2.0, "--every", min=0.1, help="How often to look, in seconds."),
    existing: bool = typer.Option(
        False, "--existing/--only-new", help="Also push the files already there."
    ),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Watch a directory and push every new model file as a version (Ctrl-C stops)."""
    from eventbus.models import new_model_files

    if not directory.is_dir():
        fail(
            f"{directory} is not a directory; give the folder your training job exports models to",
            EXIT_FAILED,
        )
    client = _client(ray_address, kafka_bootstrap, redis_url)
    seen: dict[str, tuple[float, int]] = {}
    if not existing:
        for p in directory.iterdir():
            if p.is_file():
                st = p.stat()
                seen[p.name] = (st.st_mtime, st.st_size)
    out.print(f"watching {directory} for new versions of {name} (Ctrl-C stops)")
    try:
        while True:
            for p in new_model_files(directory, seen):
                _push(client, name, p, factory, None, None)
            time.sleep(every_s)  # a polling period, not a wait for a condition
    except KeyboardInterrupt:
        pass


@model_app.command("list")
def list_(
    name: str | None = typer.Argument(None, help="One model (default: all)."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Show model versions, which one serves, and the traffic split."""
    try:
        rows = _client(ray_address, kafka_bootstrap, redis_url).list_models(name)
    except EventBusError as exc:
        fail(str(exc))
    table = Table(title="Models")
    shadowed = any(r.get("shadow") for r in rows)  # the column shows once a shadow ran
    # the column shows once a model scaled to zero (serving.idle_s)
    zeroed = any((r.get("scale") or {}).get("scale_downs") for r in rows)
    cols = ["model", "version", "status", "traffic", "format", "size", "pushed"]
    extra = [*(["shadow comparison"] if shadowed else []), *(["scale to zero"] if zeroed else [])]
    for col in [*cols, *extra, "error"]:
        table.add_column(col)
    for r in rows:
        # a retired version that `model split` sends a share to is live again: say so
        shown = "split" if r["traffic"] and r["status"] != "serving" else r["status"]
        if (r.get("shadow") or {}).get("active") and shown != "serving":
            shown = "shadow"
        colour = {
            "serving": "green",
            "split": "yellow",
            "shadow": "cyan",
            "rejected": "red",
            "rolled-back": "red",
        }.get(shown, "")
        status = f"[{colour}]{shown}[/{colour}]" if colour else shown
        cells = [
            r["name"],
            str(r["version"]),
            status,
            f"{r['traffic']:.0%}" if r["traffic"] else "",
            r["format"],
            f"{r['size']:,} B",
            datetime.fromtimestamp(r["pushed_at"]).strftime("%Y-%m-%d %H:%M:%S"),
        ]
        if shadowed:
            cells.append(shadow_text(r.get("shadow")))
        if zeroed:
            cells.append(_zero_text(r.get("scale")))
        table.add_row(*cells, r["error"] or "")
    out.print(table if rows else "no models pushed; `eventbus model push NAME PATH` adds one")


def _zero_text(scale: dict[str, Any] | None) -> str:
    """``at zero`` (or ``running``) with the scale-downs, wakes and the last cold start."""
    if not scale:
        return ""
    state = "[cyan]at zero[/cyan]" if scale.get("at_zero") else "running"
    text = f"{state} · {scale.get('scale_downs', 0)} down, {scale.get('wakes', 0)} wakes"
    if scale.get("cold_start_s") is not None:
        text += f" · cold start {scale['cold_start_s']:.1f} s"
    if scale.get("wake_failures"):
        text += f" · [red]{scale['wake_failures']} failed wakes[/red]"
    return text


@model_app.command()
def split(
    name: str = typer.Argument(..., help="The model's name."),
    version: int | None = typer.Argument(
        None, help="The version to send a share to (omit with --off)."
    ),
    weight: float = typer.Option(
        0.1, "--weight", min=0, max=1, help="Its share of the events (by event id)."
    ),
    off: bool = typer.Option(
        False, "--off", help="End the split: the serving version takes everything."
    ),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """A/B: send a share of a model's events to another version."""
    if (version is None) != off:
        fail("give a VERSION (and --weight), or --off to end the split", EXIT_USAGE)
    try:
        st = _client(ray_address, kafka_bootstrap, redis_url).split_model(
            name, None if off else version, weight
        )
    except EventBusError as exc:
        fail(str(exc))
    if st["split"]:
        out.print(
            f"model {name}: version {st['split']['version']} takes {st['split']['weight']:.0%}, version {st['serving']} the rest"
        )
    else:
        out.print(f"model {name}: version {st['serving']} takes all events")


@model_app.command()
def shadow(
    name: str = typer.Argument(..., help="The model's name."),
    version: int | None = typer.Argument(
        None, help="The candidate version to mirror calls to (omit with --off)."
    ),
    share: float = typer.Option(
        0.2, "--share", min=0, max=1, help="Share of the rows (by event id) mirrored, (0, 1]."
    ),
    off: bool = typer.Option(
        False, "--off", help="Stop the experiment (its comparison stays in `model list`)."
    ),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Shadow: mirror a share of a model's calls to a candidate version, compared with the
    served outputs (`model list` shows the comparison) and never delivered."""
    if (version is None) != off:
        fail("give a VERSION (and --share), or --off to stop the experiment", EXIT_USAGE)
    try:
        st = _client(ray_address, kafka_bootstrap, redis_url).shadow_model(
            name, None if off else version, share
        )
    except EventBusError as exc:
        fail(str(exc))
    if st["shadow"]:
        out.print(
            f"model {name}: {st['shadow']['share']:.0%} of the calls mirrored to version "
            f"{st['shadow']['version']}; `eventbus model list {name}` shows the comparison"
        )
        if st.get("mirroring") is False:
            out.print(
                f"model {name}: its replica does not mirror to version {st['shadow']['version']} "
                "(the version did not load there; its log says why)"
            )
    else:
        out.print(f"model {name}: no shadow experiment")


@model_app.command()
def history(
    name: str = typer.Argument(..., help="The model's name."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Show a model's automatic rollbacks (reason, figures) and shadow experiments."""
    try:
        entries = _client(ray_address, kafka_bootstrap, redis_url).model_history(name)
    except EventBusError as exc:
        fail(str(exc))
    table = Table(title=f"History of model {name}")
    for col in ("time", "event", "version", "details"):
        table.add_column(col)
    for e in entries:
        at = e.get("at")
        when = datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S") if at else "?"
        kind = str(e.get("kind", "?"))
        if kind == "rollback":
            f = e.get("figures") or {}
            now, prev = f.get("version") or {}, f.get("previous") or {}
            details = (
                f"{e.get('from')} -> version {e.get('to')}: {e.get('reason')} "
                f"(version: {now.get('error_rows')}/{now.get('rows')} rows failed, p99 "
                f"{_ms(now.get('p99_ms'))} ms; previous: {prev.get('error_rows')}/"
                f"{prev.get('rows')}, p99 {_ms(prev.get('p99_ms'))} ms)"
            )
        elif kind == "shadow-start":
            details = f"{float(e.get('share') or 0):.0%} mirrored"
        else:
            details = str(e.get("raw", ""))
        table.add_row(when, kind, str(e.get("version", "")), details)
    out.print(table if entries else f"model {name}: no rollbacks or shadow experiments yet")
