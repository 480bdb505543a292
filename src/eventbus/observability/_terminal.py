"""``eventbus status NAME``: the dashboard's figures as rich tables in the terminal."""

from __future__ import annotations

from typing import Any

__all__ = ["print_figures"]


def _ms(s: float | None) -> str:
    return "–" if s is None else f"{s * 1000:.1f} ms"


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
    figures = Table(title=f"{v['name']}: version {v['version']}, {v['replicas']} live replicas")
    for col in (
        "in",
        "out",
        "filtered",
        "failed",
        "dead letters",
        "p50",
        "p99",
        "lag",
        "mean batch",
    ):
        figures.add_column(col, justify="right")
    mean = v["batch_size"]["mean"]
    figures.add_row(
        str(t["consumed"]),
        str(t["outputs"]),
        str(t["dropped"]),
        str(t["failed"]),
        str(t["dead_lettered"]),
        _ms(v["latency"]["p50_s"]),
        _ms(v["latency"]["p99_s"]),
        str(v["lag_total"]),
        "–" if mean is None else f"{mean:.1f}",
    )
    console.print(figures)
    table = Table(title="steps")
    for col in ("step", "template", "in", "out", "filtered", "failed", "ms / batch"):
        table.add_column(col, justify="left" if col in ("step", "template") else "right")
    for s in topo["steps"]:
        st = v["steps"].get(s["id"], {})
        per = f"{st['seconds'] * 1000 / st['batches']:.3f}" if st.get("batches") else "–"
        table.add_row(
            s["id"],
            s["template"],
            *(str(st.get(k, 0)) for k in ("in", "out", "filtered", "failed")),
            per,
        )
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
    for line in extra:
        console.print(line, markup=False, highlight=False)
