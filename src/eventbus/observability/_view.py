"""One pipeline's figures, merged from what its replicas published to Redis.

Replicas write ``eventbus:stats:<pipeline>`` (a hash: replica id -> JSON of ``at``, ``final``,
``sources`` counters and the ``metrics`` snapshot) when they change, or every 5 s; the controller keeps the
pipeline's record in ``eventbus:pipelines``. :func:`pipeline_view` turns both into the JSON
the dashboard, ``/metrics`` and ``eventbus status`` show. Entries of replicas that stopped
cleanly (``final``) keep counting, so totals never drop when a replica is replaced; entries of
replicas that died (not refreshed for :data:`STALE_S`) are left out.

Entries have a ``role``: ``replica`` (the default) publishes step metrics and the counters of
the sources it runs (one per consumed source, in order); ``source`` (a source actor, with
``serving.source_placement: actor``) publishes the counters of consumed source
``source_index`` only; ``gateway`` publishes ``sync``, the events it ran through the pipeline
synchronously (``?wait=true``) and their outcomes, which the totals include.
"""

from __future__ import annotations

import json
import time
from typing import Any

from eventbus.observability._metrics import (
    DROP_REASONS,
    STEP_COUNTERS,
    merge_histograms,
    quantile,
)
from eventbus.observability._model_figures import model_figures
from eventbus.registry import all_registries

__all__ = ["STALE_S", "mark_degraded", "mark_refused_logins", "pipeline_view", "topology"]

#: A replica's entry older than this (and not final) is a dead replica's: ignored.
STALE_S = 15.0

#: Source counters summed into the pipeline's totals.
_TOTALS = (
    "consumed",
    "outputs",
    "dropped",
    "failed",
    "dead_lettered",
    "committed",
    "decode_errors",
    "duplicates",
    "unrouted",
    "retries",
    "batches",
    "poison",
    "too_large",
    "dead_letters_truncated",
    "dead_letters_lost",
    "revoke_timeouts",
)


def _detail(family: str, kind: str, value: Any) -> str:
    """A short description of one component: its kind's ``describe`` trait, else the value
    (a string) or its keys (a mapping)."""
    kinds = all_registries()[family]
    describe = kinds.get(kind).trait("describe") if kind in kinds else None
    if describe is not None:
        return str(describe(value if value is not None else {}))
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return ", ".join(sorted(value))
    return ""


def _label(family: str, kind_and_config: dict[str, Any]) -> dict[str, Any]:
    kind = next(iter(kind_and_config))
    return {"kind": kind, "detail": _detail(family, kind, kind_and_config[kind])}


def _routed(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Named sinks behind routes, as one label: ``N routes`` and each sink's kind and detail."""
    named = spec.get("sinks")
    if not isinstance(named, dict) or not named:
        return None
    parts = []
    for name, sink in named.items():
        label = _label("sink", sink)
        parts.append(f"{name}: {label['kind']} {label['detail']}".rstrip())
    routes = len(spec.get("routes") or [])
    return {"kind": f"{routes} routes", "detail": "; ".join(parts)[:300]}


def topology(document: dict[str, Any]) -> dict[str, Any]:
    """Sources, steps (id, template, a short detail) and sinks of a pipeline document."""
    spec = document.get("spec", {})
    steps = []
    for s in spec.get("steps", []):
        template = next((k for k in s if k not in ("id", "retries")), "?")
        detail = _detail("step", template, s.get(template))
        steps.append({"id": s["id"], "template": template, "detail": detail[:200]})
    dead = spec.get("dead_letter")
    return {
        "sources": [_label("source", s) for s in spec.get("sources", [])],
        "steps": steps,
        "sink": _label("sink", spec["sink"]) if spec.get("sink") else _routed(spec),
        "dead_letter": _label("sink", dead) if dead else None,
    }


#: Gateway ``sync`` counters added to the totals.
_SYNC = ("consumed", "outputs", "dropped", "failed")
#: Step figures of state shared by every replica (one Redis): taken from one replica, not
#: summed (the others are per-replica counters).
_SHARED = frozenset(
    (
        "pending_keys",
        "open_windows",
        "closing_windows",
        "state_fields",
        "state_bytes",
        "applied_ids",
        # a model pool's figures, as its replicas report them to any caller
        "pool_loads",
        "pool_evictions",
        "pool_failed_loads",
        "pool_models",
    )
)
#: What status and the dashboard show of an aggregate step.
_AGGREGATE_FIGURES = ("open_windows", "state_bytes", "late_events")


def _live(entries: list[dict[str, Any]], now: float) -> tuple[list[dict[str, Any]], int]:
    kept = []
    running = 0  # live replicas (source actors and gateways publish too: not counted)
    for e in entries:
        if e.get("final"):
            kept.append(e)
        elif now - e.get("at", 0) <= STALE_S:
            kept.append(e)
            running += e.get("role", "replica") == "replica"
    return kept, running


def pipeline_view(
    record: dict[str, Any],
    raw_entries: list[str | bytes],
    consumed_topics: list[list[str]] | None = None,
    now: float | None = None,
    scale: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The figures of one pipeline.

    Args:
        record: the pipeline's record in ``eventbus:pipelines`` (name, version, document...).
        raw_entries: the values of its ``eventbus:stats:<name>`` hash.
        consumed_topics: per consumed source (the order replicas publish them), its topics.
        now: the current time (tests).
        scale: the pipeline's entry in ``eventbus:scaled-to-zero`` (``since``,
            ``last_event_at``) when its replicas are scaled to zero; None: they run.

    Returns:
        ``name``, ``version``, ``deployed_at``, ``topology``, ``replicas`` (live ones),
        ``totals`` (source counters summed, plus the gateways' ``sync`` calls), ``sync``
        (events run synchronously through the gateways: consumed, outputs, dropped, failed),
        ``sources`` (per consumed source: counters,
        ``p50_s``/``p99_s`` end-to-end latency, ``lag``), ``steps`` (per step: in, out,
        filtered, absorbed, errors, late, emitted, batches, seconds, the step's own stats), ``latency`` (end-to-end histogram
        over every source, ``p50_s``, ``p99_s``), ``batch_size`` (histogram, ``mean``),
        ``lag`` (per partition) and ``lag_total``, ``join_state`` (step -> pending keys),
        ``aggregate_state`` (aggregate step -> ``open_windows``, ``state_bytes``,
        ``late_events``),
        ``models`` (step -> version, for steps reporting one), ``model_pools`` (model step on
        a pool -> ``pool``, ``loads``, ``evictions``, ``failed_loads``, ``models`` held),
        ``model_shadows`` (model step whose model runs a shadow experiment -> ``model``,
        ``version``, ``share`` and :data:`SHADOW_FIGURES`), ``state`` (``RUNNING`` or
        ``SCALED_TO_ZERO``), ``last_event_at`` (when the last event came in), and at zero
        ``scaled_to_zero_since``. ``totals`` holds the sources' counters (``consumed``,
        ``outputs``, ``dropped``, ``failed``...) and the figures shown, named as the steps':
        ``in``, ``out``, ``filtered``, ``absorbed``, ``errors``, ``late``, ``emitted``.
    """
    now = time.time() if now is None else now
    entries = []
    for raw in raw_entries:
        try:
            entries.append(json.loads(raw))
        except ValueError:
            continue
    entries, running = _live(entries, now)
    doc = record.get("document", {})
    n_sources = (
        len(consumed_topics)
        if consumed_topics is not None
        else max((len(e.get("sources", [])) for e in entries), default=0)
    )
    sources: list[dict[str, Any]] = []
    for i in range(n_sources):
        counters: dict[str, int] = {}
        hists = []
        lag: dict[str, int] = {}
        for e in entries:
            j = i - e.get("source_index", 0)  # a source actor's entry holds its one source
            if j < 0:
                continue
            src = e.get("sources", [])
            if j < len(src):
                for k, v in src[j].items():
                    if k == "in_flight" and e.get("final"):
                        continue
                    counters[k] = counters.get(k, 0) + v
            m = (e.get("metrics") or {}).get("sources", [])
            if j < len(m):
                hists.append(m[j]["latency"])
                if not e.get("final"):
                    for part, n in m[j].get("lag", {}).items():
                        lag[part] = max(lag.get(part, 0), n)  # one owner per partition
        latency = merge_histograms(hists)
        sources.append(
            {
                "topics": consumed_topics[i] if consumed_topics is not None else [],
                "counters": counters,
                "latency": latency,
                "p50_s": quantile(latency, 0.5),
                "p99_s": quantile(latency, 0.99),
                "lag": lag,
            }
        )
    totals = {k: sum(s["counters"].get(k, 0) for s in sources) for k in _TOTALS}
    sync = dict.fromkeys(_SYNC, 0)
    for e in entries:
        for k, v in (e.get("sync") or {}).items():
            if k in sync:
                sync[k] += v
    for k, v in sync.items():
        totals[k] += v
    steps: dict[str, Any] = {}
    batch_hists, batch_time_hists = [], []
    for e in entries:
        m = e.get("metrics") or {}
        if m.get("batch_size"):
            batch_hists.append(m["batch_size"])
        if m.get("batch_seconds"):
            batch_time_hists.append(m["batch_seconds"])
        for sid, st in (m.get("steps") or {}).items():
            acc = steps.setdefault(
                sid,
                {
                    "template": st.get("template", ""),
                    **dict.fromkeys(STEP_COUNTERS, 0),
                    "batches": 0,
                    "seconds": 0.0,
                    "stats": {},
                },
            )
            for k in (*STEP_COUNTERS, "batches", "seconds"):
                acc[k] += st.get(k, 0)
            if not e.get("final"):
                for k, v in (st.get("stats") or {}).items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in _SHARED:
                        acc["stats"][k] = acc["stats"].get(k, 0) + v
                    else:  # shared state (pending_keys) and versions: one replica's word
                        acc["stats"][k] = v
    _vocabulary(totals, steps, entries)
    latency = merge_histograms(s["latency"] for s in sources if s["latency"])
    batch = merge_histograms(batch_hists)
    lag = {p: n for s in sources for p, n in s["lag"].items()}
    join_state = {
        sid: st["stats"]["pending_keys"]
        for sid, st in steps.items()
        if "pending_keys" in st["stats"]
    }
    aggregates = {
        sid: {k: st["stats"].get(k, 0) for k in _AGGREGATE_FIGURES}
        for sid, st in steps.items()
        if st["template"] == "aggregate" and "open_windows" in st["stats"]
    }
    models = {
        sid: str(st["stats"].get("model_version", st["stats"].get("version")))
        for sid, st in steps.items()
        if "model_version" in st["stats"] or "version" in st["stats"]
    }
    model_pools, model_shadows = model_figures(steps)
    return {
        "name": record.get("name", doc.get("metadata", {}).get("name")),
        "version": record.get("version"),
        "deployed_at": record.get("deployed_at"),
        "topology": topology(doc),
        "replicas": running,
        "totals": totals,
        "sync": sync,
        "sources": sources,
        "steps": steps,
        "latency": {
            "histogram": latency,
            "p50_s": quantile(latency, 0.5),
            "p99_s": quantile(latency, 0.99),
        },
        "batch_size": {
            "histogram": batch,
            "mean": (batch["sum"] / batch["count"]) if batch and batch["count"] else None,
        },
        "batch_seconds": merge_histograms(batch_time_hists),
        "lag": lag,
        "lag_total": sum(lag.values()),
        "join_state": join_state,
        "aggregate_state": aggregates,
        "models": models,
        "model_pools": model_pools,
        "model_shadows": model_shadows,
        "at": now,
        "last_event_at": _last_event_at(entries, scale),
        **_scale_fields(scale),
    }


def _vocabulary(
    totals: dict[str, Any], steps: dict[str, Any], entries: list[dict[str, Any]]
) -> None:
    """Add the totals that ``eventbus status``, the dashboard and ``/metrics`` show, named as
    the steps' counters: ``in`` (consumed, sync calls included), ``out`` (delivered: the
    sources' outputs and what the steps' timers emitted through the last step: closed
    windows), the inputs that gave no output by reason (``filtered``, ``absorbed``,
    ``errors``, ``late``: summed over the steps) and ``emitted`` (by the steps' timers)."""
    timer_outputs = sum(int((e.get("metrics") or {}).get("timer_outputs") or 0) for e in entries)
    totals["in"] = totals["consumed"]
    totals["out"] = totals["outputs"] + timer_outputs
    for k in (*DROP_REASONS, "emitted"):
        totals[k] = sum(st.get(k, 0) for st in steps.values())


def _last_event_at(entries: list[dict[str, Any]], scale: dict[str, Any] | None) -> float | None:
    """When the last event came in (epoch s): the latest a replica ran, or the one the
    scale-to-zero record keeps; None before the first."""
    times = [
        float(t)
        for e in entries
        if isinstance(t := (e.get("metrics") or {}).get("last_event_at"), (int, float))
    ]
    if scale is not None and isinstance(scale.get("last_event_at"), (int, float)):
        times.append(float(scale["last_event_at"]))
    return max(times, default=None)


def _scale_fields(scale: dict[str, Any] | None) -> dict[str, Any]:
    if scale is None:
        return {"state": "RUNNING"}
    return {"state": "SCALED_TO_ZERO", "scaled_to_zero_since": scale.get("since")}


def mark_degraded(view: dict[str, Any], raw: str | bytes | None) -> None:
    """Add ``degraded_reason`` and ``degraded_since`` to a view, given a pipeline's
    :data:`keys.DEGRADED` entry (None: left as is), and turn a ``RUNNING`` state to
    ``DEGRADED`` (one scaled to zero stays ``SCALED_TO_ZERO``: its replicas are not running)."""
    if not raw:
        return
    mark = json.loads(raw)
    if view.get("state", "RUNNING") == "RUNNING":
        view["state"] = "DEGRADED"
    view["degraded_reason"] = mark.get("reason", "")
    view["degraded_since"] = mark.get("since")


def mark_refused_logins(view: dict[str, Any], sources: list[dict[str, Any]], name: str) -> None:
    """Turn a ``RUNNING`` view ``DEGRADED`` while the Kafka broker refuses the SASL logins of
    the pipeline's clients (``sasl_logins_refused_recent`` of its sources' counters, summed
    over replicas): the reason names what is wrong, the fix and where the error lines are."""
    recent = sum(int(s.get("sasl_logins_refused_recent", 0)) for s in sources if "error" not in s)
    if not recent:
        return
    if view.get("state", "RUNNING") == "RUNNING":
        view["state"] = "DEGRADED"
    reason = (
        f"the Kafka broker refused {recent} SASL login(s) of this pipeline's clients in the "
        "last minute: the password they read is not the broker's; store the broker's new "
        "password (`eventbus secret set NAME` for a {secret: NAME} reference), it is read "
        f"again at the next login, no restart needed (the error: `eventbus logs {name}`)"
    )
    before = view.get("degraded_reason")
    view["degraded_reason"] = f"{before}; {reason}" if before else reason
