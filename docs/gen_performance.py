"""The performance page's tables, generated at build time from ``benchmarks/results/``.

Each benchmark prints one JSON object as its last line; ``benchmarks/record.py`` (or
``benchmarks/brokers.py --record``) keeps it in ``benchmarks/results/<benchmark>.jsonl`` with
the broker, the machine, the commit and the date. mkdocs loads this module as a hook
(``hooks:`` in mkdocs.yml): in ``performance/index.md`` each ``<!-- benchmark-table: NAME -->``
becomes one table of NAME's latest record on each broker, the record's machine, commit, date
and command beside its figures. A benchmark with a view below gets its chosen rows; any other
gets every number of its JSON line.

``python docs/gen_performance.py`` prints the tables (to look at them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = "performance/index.md"
MARKER = re.compile(r"^<!-- benchmark-table: (?P<name>[a-z0-9_]+) -->$", re.M)
BROKER_ORDER = ("kafka", "tansu")

Figures = dict[str, Any]
Row = tuple[str, Callable[[Figures], str | None]]


class ResultsError(ValueError):
    """A results file the page cannot be built from; the message names the file and line."""


def load(name: str, results: Path = RESULTS) -> list[dict[str, Any]]:
    """Every record of ``results/<name>.jsonl``, in file order."""
    path = results / f"{name}.jsonl"
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ResultsError(f"{path}:{n}: not JSON ({e}); fix or remove the line") from e
        missing = {"broker", "commit", "date", "machine", "figures"} - set(record)
        if not isinstance(record, dict) or missing:
            raise ResultsError(
                f"{path}:{n}: a record needs broker, commit, date, machine and figures; "
                f"missing {sorted(missing)}; append records with benchmarks/record.py"
            )
        records.append(record)
    return records


def latest(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The latest record of each broker (by date; a later line wins a tie), brokers in order."""
    best: dict[str, dict[str, Any]] = {}
    for record in records:
        old = best.get(record["broker"])
        if old is None or str(record["date"]) >= str(old["date"]):
            best[record["broker"]] = record
    order = {b: i for i, b in enumerate(BROKER_ORDER)}
    return dict(sorted(best.items(), key=lambda kv: (order.get(kv[0], 99), kv[0])))


# -- the cells ------------------------------------------------------------------------------


def get(figures: Figures, path: str) -> Any:
    """The value at a dotted ``path`` of ``figures``, None if any part is missing."""
    value: Any = figures
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def num(value: Any) -> str:
    """A figure as the page writes it: thousands separated, decimals as the JSON has them."""
    if isinstance(value, bool) or value is None:
        return "–" if value is None else str(value)
    if isinstance(value, int | float):
        return f"{value:,}"
    return str(value)


def nums(figures: Figures, *paths: str, sep: str = " / ") -> str | None:
    values = [get(figures, p) for p in paths]
    if all(v is None for v in values):
        return None
    return sep.join(num(v) for v in values)


_NAMES = {"quixstreams": "Quix", "bytewax": "Bytewax", "faust": "Faust"}


def vs_best(scenario: str) -> Callable[[Figures], str | None]:
    def cell(f: Figures) -> str | None:
        ratio = get(f, f"{scenario}.targets.eventbus_vs_best_framework")
        systems = get(f, f"{scenario}.systems") or {}
        rates = {k: v.get("events_per_s") for k, v in systems.items() if k in _NAMES}
        rated = {k: r for k, r in rates.items() if r}
        if ratio is None or not rated:
            return None
        best = max(rated, key=lambda k: rated[k])
        return f"**{ratio:.2f}** ({_NAMES[best]})"

    return cell


def ratio_of(f: Figures) -> str | None:
    eb, base = get(f, "eventbus_events_per_s"), get(f, "baseline_events_per_s")
    if eb is None or base is None:
        return None
    return f"{eb:,} / {base:,} = **{get(f, 'ratio'):.2f}**"


def latency_at(fraction: str) -> Callable[[Figures], str | None]:
    def cell(f: Figures) -> str | None:
        at = f.get(f"at_{fraction}_of_max") or {}  # the key has a dot: not a path
        eb = next((v for k, v in at.items() if k.startswith("eventbus_1")), None)
        if eb is None:
            return None
        loop = get(at, "confluent_loop.p99_ms")
        return f"{num(eb.get('p50_ms'))} / {num(eb.get('p99_ms'))} ms ({num(loop)})"

    return cell


def latency_broker_cpu(f: Figures) -> str | None:
    at = f.get("at_0.1_of_max") or {}
    eb = next((v for k, v in at.items() if k.startswith("eventbus_1")), {})
    return num(get(eb, "cpu_pct_of_one_core.broker")) if eb else None


def idle_cpu(kind: str) -> Callable[[Figures], str | None]:
    """An ``idle.py`` CPU figure (``warm_10``, ``zero_50``...), its target, without doorbell."""

    def cell(f: Figures) -> str | None:
        key = next((k for k in f if re.fullmatch(rf"{kind}_\d+", k) and k != f"{kind}_1"), None)
        if key is None:
            return None
        text = num(get(f, f"{key}.cpu_pct"))
        target = get(f, f"targets.{key}_cpu_pct")
        off = get(f, f"no_doorbell.{key}.cpu_pct")
        return (
            f"{text}"
            + (f" (target < {num(target)})" if target is not None else "")
            + (f"; no doorbell {num(off)}" if off is not None else "")
        )

    return cell


def idle_scalar(key: str, target: str) -> Callable[[Figures], str | None]:
    def cell(f: Figures) -> str | None:
        value = get(f, key)
        if value is None:
            return None
        limit, off = get(f, f"targets.{target}"), get(f, f"no_doorbell.{key}")
        return (
            num(value)
            + (f" (target < {num(limit)})" if limit is not None else "")
            + (f"; no doorbell {num(off)}" if off is not None else "")
        )

    return cell


def _count(f: Figures, kind: str) -> str:
    key = next((k for k in f if re.fullmatch(rf"{kind}_\d+", k) and k != f"{kind}_1"), "")
    return key.rsplit("_", 1)[-1] if key else "N"


def verdict(figure: str, key: str) -> Callable[[Figures], str | None]:
    """A ``models_many`` target: its figure, then pass or miss."""

    def cell(f: Figures) -> str | None:
        value, ok = get(f, f"targets.{key}.{figure}"), get(f, f"targets.{key}.pass")
        if ok is None:
            return None
        return f"{num(value)} ({'pass' if ok else 'miss'})"

    return cell


#: The rows each benchmark's table shows (any other benchmark: every number of its JSON).
VIEWS: dict[str, list[Row]] = {
    "kafka_pipeline": [
        ("EventBus / aiokafka loop, events/s", ratio_of),
        (
            "p50 / p99 at half of EventBus's max (loop's)",
            lambda f: (
                None
                if get(f, "eventbus_p50_ms") is None
                else f"{nums(f, 'eventbus_p50_ms', 'eventbus_p99_ms')} ms "
                f"({nums(f, 'baseline_p50_ms', 'baseline_p99_ms')})"
            ),
        ),
        ("events a round, rounds", lambda f: nums(f, "events", "rounds", sep=", ")),
    ],
    "peers": [
        (
            "filter + convert, events/s: EventBus 1 replica",
            lambda f: nums(f, "filter_convert.systems.eventbus_1.events_per_s"),
        ),
        (
            "… EventBus 2 replicas",
            lambda f: nums(f, "filter_convert.systems.eventbus_2.events_per_s"),
        ),
        (
            "… Quix Streams / Bytewax / Faust",
            lambda f: nums(
                f,
                *(f"filter_convert.systems.{s}.events_per_s" for s in _NAMES),
            ),
        ),
        (
            "… aiokafka loop / confluent loop",
            lambda f: nums(
                f,
                "filter_convert.systems.aiokafka_loop.events_per_s",
                "filter_convert.systems.confluent_loop.events_per_s",
            ),
        ),
        ("EventBus vs the best framework (target 2.0)", vs_best("filter_convert")),
        (
            "… EventBus 1 replica p50 / p99 at half its max, ms",
            lambda f: nums(
                f,
                "filter_convert.systems.eventbus_1.p50_ms",
                "filter_convert.systems.eventbus_1.p99_ms",
            ),
        ),
        (
            "tumbling count, events/s: EventBus / Quix / Bytewax / Faust",
            lambda f: nums(
                f,
                *(f"tumbling_count.systems.{s}.events_per_s" for s in ("eventbus_1", *_NAMES)),
            ),
        ),
        ("… EventBus vs the best framework", vs_best("tumbling_count")),
    ],
    "latency": [
        ("EventBus's max, events/s", lambda f: nums(f, "eventbus_1_max_events_per_s")),
        *(
            (f"p50 / p99 at {x} of it (confluent loop's p99)", latency_at(x))
            for x in ("0.1", "0.25", "0.5")
        ),
        ("the broker's CPU at 0.1 of max, % of a core", latency_broker_cpu),
    ],
    "idle": [
        ("the stack alone, % of a core", lambda f: nums(f, "idle_0.cpu_pct")),
        ("idle pipelines in their own replicas, % of a core", idle_cpu("warm")),
        ("idle pipelines on one host, % of a core", idle_cpu("host")),
        ("pipelines at zero, % of a core", idle_cpu("zero")),
        ("first event after idleness, ms", idle_scalar("first_event_ms", "first_event_ms")),
        ("… on a host, ms", idle_scalar("host_first_event_ms", "first_event_ms")),
        ("cold start from zero, s", idle_scalar("cold_start_s", "cold_start_s")),
    ],
    "models_many": [
        (
            "models, events at events/s offered",
            lambda f: nums(f, "models", "events", "offered_events_per_s", sep=", "),
        ),
        (
            "pool: events/s, hot p50 / p99, cold p50 / p99 ms",
            lambda f: nums(
                f, "events_per_s", "hot_p50_ms", "hot_p99_ms", "cold_p50_ms", "cold_p99_ms"
            ),
        ),
        (
            "pool: loads / evictions, replica RSS MB",
            lambda f: nums(f, "pool_loads", "pool_evictions", "pool_replica_rss_mb"),
        ),
        ("single model: p50 / p99 ms", lambda f: nums(f, "single_p50_ms", "single_p99_ms")),
        ("hot p99 / single p99 (target <= 1.5)", verdict("ratio", "hot_p99_vs_single")),
        (
            "cold model's first answer, largest ms (target < 1,000)",
            verdict("max", "cold_first_answer_ms"),
        ),
        (
            "CPU s per 1,000 events: no shadow / shadow 100%",
            lambda f: nums(f, "cpu_s_per_1k_no_shadow", "cpu_s_per_1k_shadow"),
        ),
        ("shadow CPU ratio (target <= 1.3)", verdict("ratio", "shadow_cpu_ratio")),
        (
            "one application per model: fit, RSS MB (per model)",
            lambda f: nums(f, "apps_fit", "apps_rss_mb", "apps_rss_mb_per_model"),
        ),
        (
            "pool replica RSS MB (target: 300 models in 4 GB; a miss below 300 models)",
            verdict("replica_rss_mb", "models_within_4gb"),
        ),
    ],
}


def generic_rows(records: list[Figures]) -> list[Row]:
    """Every number of the records' JSON lines, by its dotted path (at most 40)."""
    paths: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(value, int | float) and not isinstance(value, bool) and path not in paths:
            paths.append(path)

    for figures in records:
        walk(figures, "")
    return [(f"`{p}`", lambda f, p=p: nums(f, p)) for p in paths[:40]]


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def table(name: str, results: Path = RESULTS) -> str:
    """The Markdown table of ``name``'s latest record on each broker, with where it ran."""
    if not (results / f"{name}.jsonl").is_file():
        return (
            f"*No run of `{name}` recorded yet: run it and keep its last line with "
            f"`benchmarks/record.py` (figures from earlier runs: the "
            "[appendix](appendix.md)).*\n"
        )
    runs = latest(load(name, results))
    figures = [r["figures"] for r in runs.values()]
    rows = VIEWS.get(name) or generic_rows(figures)
    head = " | ".join(_cell(r.get("broker_version") or b) for b, r in runs.items())
    out = [f"| figure | {head} |\n", "| --- |" + " --- |" * len(runs) + "\n"]
    for label, cell in rows:
        cells = [cell(f) for f in figures]
        if any(c is not None for c in cells):
            out.append(f"| {label} | " + " | ".join(_cell(c or "–") for c in cells) + " |\n")
    for key in ("date", "commit", "command"):
        label = "date (UTC)" if key == "date" else key
        vals = [_cell(r.get(key) or "–") for r in runs.values()]
        vals = [f"`{v}`" if key == "command" and v != "–" else v for v in vals]
        out.append(f"| *{label}* | " + " | ".join(vals) + " |\n")
    out.append("\n")
    for key, label in (("machine", "Machine"), ("note", "Note")):
        seen = dict.fromkeys(str(r[key]) for r in runs.values() if r.get(key))
        for text in seen:
            which = [b for b, r in runs.items() if r.get(key) == text]
            whose = "" if len(which) == len(runs) else f" ({', '.join(which)})"
            out.append(f"*{label}{whose}:* {_cell(text)}\n\n")
    return "".join(out)


def render(markdown: str, results: Path = RESULTS) -> str:
    """``markdown`` with each ``<!-- benchmark-table: NAME -->`` replaced by NAME's table."""
    return MARKER.sub(lambda m: table(m["name"], results), markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: the performance page's tables from ``benchmarks/results/``."""
    if page.file.src_uri != PAGE:
        return markdown
    return render(markdown)


if __name__ == "__main__":
    for path in sorted(RESULTS.glob("*.jsonl")):
        print(f"## {path.stem}\n\n{table(path.stem)}")
