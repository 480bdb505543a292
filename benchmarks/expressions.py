"""Benchmark: eventbus.cel vs a hand-written lambda vs cel-expr-python (C++), the
EventBridge ``pattern`` filter dialect and eventbus.cesql (CloudEvents SQL) vs a hand-written
lambda; eventbus.jsonata vs a hand-written lambda vs the pure-Python ``jsonata-python``
package (run in its own venv, ``.venv-bench/jsonata``, by
``peer_apps/jsonata_python_rate.py``; skipped when absent).

Run: ``python benchmarks/expressions.py``. Prints a table, then one JSON line
with evaluations/s (medians over repeats) and the ratios per expression. The first three
expressions cannot grow values and pay nothing for the evaluation budget; the last one
charges it (a budget per evaluation, comprehension iterations, concatenations). The
CESQL filter is evaluated as a filter step does (``Program.matches`` on the attributes).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    from eventbus import cel, cesql
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from eventbus import cel, cesql

EVENT: dict[str, Any] = {
    "type": "payment.created",
    "source": "/payments",
    "id": "a1b2c3",
    "data": {
        "amount": 150.0,
        "quantity": 3,
        "currency": "USD",
        "customer": "c-42",
        "tags": ["new", "eu", "card"],
    },
}

CASES: list[tuple[str, str, Callable[[dict[str, Any]], Any]]] = [
    (
        "filter",
        "type == 'payment.created' && data.amount > 100 && data.currency in ['CNY', 'USD']",
        lambda v: (
            v["type"] == "payment.created"
            and v["data"]["amount"] > 100
            and v["data"]["currency"] in ("CNY", "USD")
        ),
    ),
    ("convert_mul", "data.amount * 7.1", lambda v: v["data"]["amount"] * 7.1),
    (
        "convert_string",
        "data.currency + ':' + string(data.quantity)",
        lambda v: v["data"]["currency"] + ":" + str(v["data"]["quantity"]),
    ),
    # A comprehension and a concatenation: the evaluation budget is charged here.
    (
        "budgeted_map",
        "data.tags.map(t, t + '!')",
        lambda v: [t + "!" for t in v["data"]["tags"]],
    ),
]

# EventBridge event patterns (filter: {pattern: ...}) over a CloudEvent, against a lambda
# doing the same checks by hand.
PATTERN_CASES: list[tuple[str, dict[str, Any], Callable[[Any], bool]]] = [
    (
        "pattern_filter",
        {
            "type": ["payment.created"],
            "data": {"amount": [{"numeric": [">", 100]}], "currency": ["CNY", "USD"]},
        },
        lambda e: (
            e.attributes.get("type") == "payment.created"
            and e.data["amount"] > 100
            and e.data["currency"] in ("CNY", "USD")
        ),
    ),
]

#: CloudEvents SQL filters over the attributes, and the hand-written lambda of each.
ATTRIBUTES: dict[str, Any] = {
    "specversion": "1.0",
    "type": "order.created",
    "source": "https://shop.example.com/orders",
    "id": "a1b2c3",
    "subject": "order-42",
    "tier": "gold",
}
SQL_CASES: list[tuple[str, str, Callable[[dict[str, Any]], Any]]] = [
    (
        "cesql_filter",
        "type LIKE 'order.%' AND source LIKE 'https://%' AND tier IN ('gold', 'platinum')",
        lambda a: (
            a["type"].startswith("order.")
            and a["source"].startswith("https://")
            and a["tier"] in ("gold", "platinum")
        ),
    ),
]

#: JSONata over the event as Knative's EventTransform sees it (attributes beside ``data``).
JSONATA_CASES: list[tuple[str, str, Callable[[dict[str, Any]], Any]]] = [
    ("jsonata_path", "data.amount * 7.1", lambda v: v["data"]["amount"] * 7.1),
    (
        "jsonata_event",
        '{"specversion": "1.0", "id": id, "source": source, "type": type & ".large", '
        '"data": {"customer": data.customer, "total": data.amount * data.quantity, '
        '"tags": $join(data.tags, ",")}}',
        lambda v: {
            "specversion": "1.0",
            "id": v["id"],
            "source": v["source"],
            "type": v["type"] + ".large",
            "data": {
                "customer": v["data"]["customer"],
                "total": v["data"]["amount"] * v["data"]["quantity"],
                "tags": ",".join(v["data"]["tags"]),
            },
        },
    ),
    (
        "jsonata_map_filter",
        "data.tags[$ != 'eu'].$uppercase($)",
        lambda v: [t.upper() for t in v["data"]["tags"] if t != "eu"],
    ),
]
#: the venv holding jsonata-python (``JSONATA_PYTHON`` overrides, e.g. from a worktree)
PEER_PYTHON = Path(
    os.environ.get(
        "JSONATA_PYTHON",
        Path(__file__).resolve().parent.parent / ".venv-bench" / "jsonata" / "bin" / "python",
    )
)

REPEATS = 7
TARGET_S = 0.2  # per timing run


def _rate(fn: Callable[[], Any], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return number / (time.perf_counter() - start)


def _calibrate(fn: Callable[[], Any]) -> int:
    number = 1000
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= TARGET_S / 4:
            return max(1000, int(number * TARGET_S / elapsed))
        number *= 4


def _median_rates(fns: list[Callable[[], Any]]) -> list[float]:
    """Median evaluations/s of each callable; runs are interleaved so that
    background load affects all of them alike."""
    numbers = [_calibrate(fn) for fn in fns]
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(REPEATS):
        for i, fn in enumerate(fns):
            samples[i].append(_rate(fn, numbers[i]))
    return [statistics.median(s) for s in samples]


def _reference() -> Callable[[str], Callable[[], Any]] | None:
    try:
        from cel_expr_python import cel as ref
    except ImportError:
        return None
    # cel-expr-python cannot declare a variable named `type` (a builtin there):
    # it gets the CloudEvent type as `ce_type`, and the expression is renamed.
    ref_event = {("ce_type" if k == "type" else k): v for k, v in EVENT.items()}
    env = ref.NewEnv(variables=dict.fromkeys(ref_event, ref.Type.DYN))

    def make(source: str) -> Callable[[], Any]:
        expr = env.compile(re.sub(r"\btype\b(?!\s*\()", "ce_type", source))
        activation = env.Activation(ref_event)

        def run() -> Any:
            value = expr.eval(activation).value()
            # list items come back as accessor objects
            return [x.value() for x in value] if isinstance(value, list) else value

        return run

    return make


def _patterns() -> dict[str, dict[str, float | None]]:
    """The pattern dialect's cases: the compiled matcher vs the lambda, on one CloudEvent."""
    from eventbus import CloudEvent
    from eventbus.pipelines.steps._pattern import compile_event_pattern

    attrs = {k: v for k, v in EVENT.items() if k != "data"}
    event = CloudEvent.create(**attrs, data=EVENT["data"])
    miss = event.replace(data={**EVENT["data"], "currency": "EUR"})
    out: dict[str, dict[str, float | None]] = {}
    for name, pattern, hand in PATTERN_CASES:
        match = compile_event_pattern(pattern)
        assert match(event) is hand(event) is True and match(miss) is hand(miss) is False
        ours_rate, lambda_rate = _median_rates([lambda: match(event), lambda: hand(event)])
        out[name] = {
            "eventbus_pattern_eval_per_s": round(ours_rate),
            "lambda_eval_per_s": round(lambda_rate),
            "ratio_vs_lambda": round(ours_rate / lambda_rate, 3),
        }
    return out


def _jsonata_python_round() -> dict[str, Any]:
    """One timing run of every JSONata case in jsonata-python (its own venv, a subprocess)."""
    import subprocess

    spec = {"data": EVENT, "cases": [[n, s] for n, s, _ in JSONATA_CASES], "repeats": 1,
            "target_s": TARGET_S}  # fmt: skip
    peer = Path(__file__).resolve().parent / "peer_apps" / "jsonata_python_rate.py"
    proc = subprocess.run(
        [str(PEER_PYTHON), str(peer)], input=json.dumps(spec), capture_output=True, text=True,
        check=True, timeout=600,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def _jsonata_results() -> dict[str, dict[str, float | None]]:
    """Rounds alternate: each round times every case here (ours, the lambda) and then in
    jsonata-python, so that the machine's load falls on both alike; medians over the rounds."""
    from eventbus import jsonata

    evaluates = []
    for name, source, hand in JSONATA_CASES:
        evaluate = jsonata.compile(source).evaluate
        assert evaluate(EVENT) == hand(EVENT), (name, evaluate(EVENT), hand(EVENT))
        evaluates.append(evaluate)
    fns = [
        f
        for evaluate, (_, _, hand) in zip(evaluates, JSONATA_CASES, strict=True)
        for f in (lambda e=evaluate: e(EVENT), lambda h=hand: h(EVENT))
    ]
    numbers = [_calibrate(fn) for fn in fns]
    samples: list[list[float]] = [[] for _ in fns]
    peer_samples: dict[str, list[float]] = {name: [] for name, _, _ in JSONATA_CASES}
    with_peer = PEER_PYTHON.exists()
    for _ in range(REPEATS):
        for i, fn in enumerate(fns):
            samples[i].append(_rate(fn, numbers[i]))
        if with_peer:
            for name, r in _jsonata_python_round().items():
                assert r["result"] == evaluates[[n for n, _, _ in JSONATA_CASES].index(name)](EVENT)
                peer_samples[name].append(r["rate"])
    results: dict[str, dict[str, float | None]] = {}
    for n, (name, _, _) in enumerate(JSONATA_CASES):
        ours_rate = statistics.median(samples[2 * n])
        lambda_rate = statistics.median(samples[2 * n + 1])
        peer_rate = statistics.median(peer_samples[name]) if with_peer else None
        results[name] = {
            "eventbus_jsonata_eval_per_s": round(ours_rate),
            "lambda_eval_per_s": round(lambda_rate),
            "jsonata_python_eval_per_s": None if peer_rate is None else round(peer_rate),
            "ratio_vs_lambda": round(ours_rate / lambda_rate, 3),
            "ratio_vs_jsonata_python": None
            if peer_rate is None
            else round(ours_rate / peer_rate, 2),
        }
    return results


def main() -> None:
    reference = _reference()
    results: dict[str, dict[str, float | None]] = {}
    for name, source, hand in CASES:
        prog = cel.compile(source)
        ours = prog.evaluate(EVENT)
        assert ours == hand(EVENT), (name, ours, hand(EVENT))
        evaluate = prog.evaluate
        fns: list[Callable[[], Any]] = [lambda: evaluate(EVENT), lambda: hand(EVENT)]
        if reference is not None:
            ref_fn = reference(source)
            assert ref_fn() == ours, (name, ref_fn(), ours)
            fns.append(ref_fn)
        rates = _median_rates(fns)
        ours_rate, lambda_rate = rates[0], rates[1]
        ref_rate = rates[2] if reference is not None else None
        results[name] = {
            "eventbus_cel_eval_per_s": round(ours_rate),
            "lambda_eval_per_s": round(lambda_rate),
            "cel_expr_python_eval_per_s": None if ref_rate is None else round(ref_rate),
            "ratio_vs_lambda": round(ours_rate / lambda_rate, 3),
            "ratio_vs_cel_expr_python": None
            if ref_rate is None
            else round(ours_rate / ref_rate, 2),
        }
    results.update(_patterns())
    for name, source, hand in SQL_CASES:
        prog = cesql.compile(source)
        matches = prog.matches
        assert matches(ATTRIBUTES) is hand(ATTRIBUTES) is True, name
        ours_rate, lambda_rate = _median_rates(
            [lambda: matches(ATTRIBUTES), lambda: hand(ATTRIBUTES)]
        )
        results[name] = {
            "eventbus_cel_eval_per_s": round(ours_rate),  # eventbus.cesql here
            "lambda_eval_per_s": round(lambda_rate),
            "cel_expr_python_eval_per_s": None,
            "ratio_vs_lambda": round(ours_rate / lambda_rate, 3),
            "ratio_vs_cel_expr_python": None,
        }
    header = f"{'expression':<16}{'eventbus.cel':>14}{'lambda':>14}{'cel-expr-py':>14}{'vs lambda':>11}{'vs C++':>9}"
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        ref = r.get("cel_expr_python_eval_per_s")
        ratio_ref = r.get("ratio_vs_cel_expr_python")
        ours_rate = r.get("eventbus_cel_eval_per_s", r.get("eventbus_pattern_eval_per_s"))
        print(
            f"{name:<16}{ours_rate:>14,.0f}{r['lambda_eval_per_s']:>14,.0f}"
            f"{(f'{ref:,.0f}' if ref else 'n/a'):>14}{r['ratio_vs_lambda']:>10.2f}x"
            f"{(f'{ratio_ref:.1f}x' if ratio_ref else 'n/a'):>9}"
        )
    print("(evaluations/s, median of %d runs; python %s)" % (REPEATS, sys.version.split()[0]))
    jsonata_results = _jsonata_results()
    header = f"{'expression':<20}{'jsonata':>12}{'lambda':>12}{'jsonata-py':>12}{'vs lambda':>11}{'vs j-py':>9}"
    print(header)
    print("-" * len(header))
    for name, r in jsonata_results.items():
        peer = r["jsonata_python_eval_per_s"]
        ratio_peer = r["ratio_vs_jsonata_python"]
        print(
            f"{name:<20}{r['eventbus_jsonata_eval_per_s']:>12,.0f}{r['lambda_eval_per_s']:>12,.0f}"
            f"{(f'{peer:,.0f}' if peer else 'n/a'):>12}{r['ratio_vs_lambda']:>10.2f}x"
            f"{(f'{ratio_peer:.1f}x' if ratio_peer else 'n/a'):>9}"
        )
    print(
        json.dumps(
            {"unit": "evaluations_per_s", "expressions": results, "jsonata": jsonata_results}
        )
    )


if __name__ == "__main__":
    main()
