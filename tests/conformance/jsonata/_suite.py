"""Loading and running the JSONata test-suite cases (shared by the pytest file and
``python tests/conformance/jsonata/_suite.py``, which prints each failure)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from eventbus import jsonata

HERE = Path(__file__).parent
_DATASETS: dict[str, Any] = {}


def cases() -> list[tuple[str, dict[str, Any]]]:
    """Every case of every group present: ``(group/caseNNN[i], case)``."""
    out = []
    for path in sorted((HERE / "groups").glob("*/*.json")):
        data = json.loads(path.read_text())
        items = data if isinstance(data, list) else [data]
        for i, case in enumerate(items):
            name = f"{path.parent.name}/{path.stem}" + (f"[{i}]" if len(items) > 1 else "")
            if "expr-file" in case:
                case = {**case, "expr": (path.parent / case["expr-file"]).read_text()}
            out.append((name, case))
    return out


def _dataset(name: str | None) -> Any:
    if name is None:
        return jsonata.UNDEFINED
    if name not in _DATASETS:
        _DATASETS[name] = json.loads((HERE / "datasets" / f"{name}.json").read_text())
    return _DATASETS[name]


def same(a: Any, b: Any) -> bool:
    """JSON equality as the suite means it (numbers compared to 1e-13 relative)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or math.isclose(a, b, rel_tol=1e-13)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def run(case: dict[str, Any]) -> str | None:
    """None when the case passes, else what went wrong."""
    if "error" in case and "code" in case["error"]:
        case = {**case, "code": case["error"]["code"]}
    data = case["data"] if "data" in case else _dataset(case.get("dataset"))
    budget = jsonata.Budget(
        max_depth=case.get("depth", 500),
        max_time_ms=case.get("timelimit", 5000),
        max_steps=10_000_000,
    )
    try:
        expr = jsonata.compile(case["expr"], track_depth="depth" in case)
        result = expr.evaluate(data, case.get("bindings") or None, budget)
    except jsonata.JSONataError as exc:
        if "code" in case:
            return (
                None
                if exc.code == case["code"]
                else f"error {exc.code}, expected {case['code']}: {exc}"
            )
        return f"error {exc}"
    if "code" in case:
        return f"no error, expected {case['code']}; got {result!r}"[:300]
    if case.get("undefinedResult"):
        return None if result is jsonata.UNDEFINED else f"expected undefined, got {result!r}"[:300]
    if "result" not in case:
        return None if result is jsonata.UNDEFINED else f"expected undefined, got {result!r}"[:300]
    if result is jsonata.UNDEFINED or not same(result, case["result"]):
        return f"got {result!r}, expected {case['result']!r}"[:300]
    return None


if __name__ == "__main__":
    failed = 0
    all_cases = cases()
    for name, case in all_cases:
        try:
            problem = run(case)
        except Exception as exc:
            problem = f"CRASH {type(exc).__name__}: {exc}"
        if problem:
            failed += 1
            if "-q" not in sys.argv:
                print(f"{name}: {case['expr'][:120]!r}: {problem}")
    print(
        f"passed {len(all_cases) - failed}/{len(all_cases)} = {(len(all_cases) - failed) / len(all_cases):.1%}"
    )
