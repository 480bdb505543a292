"""``eventbus status NAME``: the dashboard's figures as rich tables in the terminal."""

from __future__ import annotations

import time
from typing import Any

from eventbus.observability._metrics import STEP_COUNTERS

__all__ = ["TOTALS", "print_figures"]

#: The pipeline's totals shown, the steps' vocabulary (see ``pipeline_view``).
TOTALS = STEP_COUNTERS


def _ms(s: float | None) -> str:
    return "–" if s is None else f"{s * 1000:.1f} ms"


def _clock(t: float | None) -> str:
    return "–" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


def print_figures(console: Any, v: dict[str, Any]) -> None:
    """Print one pipeline view (:func:`~eventbus.observability._view.pipeline_view`)."""
    from rich.table import Table

    topo = v["topology"]
    sources = ", ".join(f"{s['kind']} {s['detail']}".strip() for s in topo["sources"])
    steps = " → ".join(f"{s['id']} ({s['template']})" for s in topo["steps"])
    sink = f"{topo['sink']['kind']} {topo['sink']['detail']}" if topo["sink"] else "–"
    line = f"{sources} → {steps + ' → ' if steps else ''}{sink}"
    if topo["dead_letter"]:
        line += f"  (dead letters: {topo['dead_letter']['kind']} {topo['dead_letter']['detail']})"
    console.print(line, markup=False, highlight=False)
    if v.get("degraded_reason"):
        console.print(f"DEGRADED: {v['degraded_reason']}", style="red", markup=False)
    t = v["totals"]
    title = f"{v['name']}: version {v['version']}, {v['replicas']} live replicas"
    figures = Table(title=title)
    for col in (*TOTALS, "dead letters"):
        figures.add_column(col, justify="right")
    figures.add_row(*(str(t.get(k, 0)) for k in TOTALS), str(t["dead_lettered"]))
    console.print(figures)
    timing = Table()
    for col in ("p50", "p99", "lag", "mean batch", "last event"):
        timing.add_column(col, justify="right")
    mean = v["batch_size"]["mean"]
    timing.add_row(
        _ms(v["latency"]["p50_s"]),
        _ms(v["latency"]["p99_s"]),
        str(v["lag_total"]),
        "–" if mean is None else f"{mean:.1f}",
        _clock(v.get("last_event_at")),
    )
    console.print(timing)
    table = Table(title="steps")
    for col in ("step", "template", *STEP_COUNTERS, "ms / batch"):
        table.add_column(col, justify="left" if col in ("step", "template") else "right")
    for s in topo["steps"]:
        st = v["steps"].get(s["id"], {})
        per = f"{st['seconds'] * 1000 / st['batches']:.3f}" if st.get("batches") else "–"
        table.add_row(s["id"], s["template"], *(str(st.get(k, 0)) for k in STEP_COUNTERS), per)
    console.print(table)
    extra = []
    if v["lag"]:
        extra.append("lag: " + ", ".join(f"{p}={n}" for p, n in sorted(v["lag"].items())))
    for sid, n in v["join_state"].items():
        extra.append(f"join state {sid}: {n} keys")
    for sid, a in v.get("aggregate_state", {}).items():
        extra.append(
            f"aggregate {sid}: {a['open_windows']} open windows, {a['state_bytes']} bytes of state, "
            f"{a['late_events']} late events"
        )
    for sid, ver in v["models"].items():
        extra.append(f"model {sid}: version {ver}")
    for sid, f in v.get("model_pools", {}).items():
        extra.append(
            f"model pool {f['pool']} (step {sid}): {f['models']} models held, {f['loads']} loads, "
            f"{f['evictions']} evictions, {f['failed_loads']} failed loads"
        )
    for sid, sh in v.get("model_shadows", {}).items():
        parts = [f"{sh['rows'] or 0:g} rows compared"]
        if sh.get("agreement") is not None:
            parts.append(f"agreement {sh['agreement']:.1%}")
        if sh.get("mad") is not None:
            parts.append(f"mad {sh['mad']:.4g}")
        parts.append(f"{sh['errors'] or 0:g} errors, {sh['dropped_rows'] or 0:g} rows dropped")
        share = sh.get("share")
        extra.append(
            f"model {sh['model']} (step {sid}): shadow version {sh['version']}"
            f"{f' ({share:.0%} mirrored)' if isinstance(share, float | int) else ''}: "
            + ", ".join(parts)
        )
    for line in extra:
        console.print(line, markup=False, highlight=False)
