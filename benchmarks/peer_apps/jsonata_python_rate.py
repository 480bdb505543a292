"""Evaluations/s of the pure-Python ``jsonata-python`` package, for ``benchmarks/expressions.py``.

Run with ``.venv-bench/jsonata/bin/python`` (``python -m venv .venv-bench/jsonata &&
.venv-bench/jsonata/bin/pip install jsonata-python``): reads ``{"data": ..., "cases":
[[name, expression], ...], "repeats": N, "target_s": S}`` on stdin, prints one JSON object
``{name: {"rate": evaluations/s, "result": value}}``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import jsonata  # the jsonata-python distribution


def _rate(fn, number):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return number / (time.perf_counter() - start)


def main() -> None:
    spec = json.load(sys.stdin)
    data = spec["data"]
    out = {}
    for name, source in spec["cases"]:
        expr = jsonata.Jsonata(source)

        def run(expr=expr):  # type: ignore[no-untyped-def]
            return expr.evaluate(data)

        number = 100
        while True:
            start = time.perf_counter()
            for _ in range(number):
                run()
            elapsed = time.perf_counter() - start
            if elapsed >= spec["target_s"] / 4:
                number = max(100, int(number * spec["target_s"] / elapsed))
                break
            number *= 4
        rates = [_rate(run, number) for _ in range(spec["repeats"])]
        out[name] = {"rate": statistics.median(rates), "result": run()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
