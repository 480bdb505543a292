"""benchmarks/_peer_windows.py (peers.py's tumbling count): the answer it checks the systems
against, and its reading of each system's output format (it starts nothing)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _peer_windows as w


def test_events_cover_every_key_in_every_window_and_the_answer_counts_them() -> None:
    events = w.make_events(20_000)
    assert events[-1][0] == w.END_KEY  # the closing event, far ahead, is not counted
    times = [t for _, t in events]
    assert times == sorted(times)  # one partition in time order: one watermark
    expect = w.answer(events)
    assert len(expect) == w.KEYS * w.WINDOWS
    assert sum(expect.values()) == 20_000
    by_window = Counter(start for _, start in expect)
    assert sorted(by_window) == [w.T0 + i * w.WINDOW_MS for i in range(w.WINDOWS)]


def test_each_systems_output_format_reads_as_key_window_count() -> None:
    eventbus = {"key": "k1", "window_start": "2023-11-14T22:13:20Z", "window_end": "x", "n": 3}
    quix = {"start": w.T0, "end": w.T0 + 1000, "value": 3}
    written_here = {"key": "k1", "start": w.T0, "n": 3}  # Bytewax's and Faust's apps
    assert w.window_of(None, orjson.dumps(eventbus)) == ("k1", w.T0, 3)
    assert w.window_of(b"k1", orjson.dumps(quix)) == ("k1", w.T0, 3)
    assert w.window_of(b"k1", orjson.dumps(written_here)) == ("k1", w.T0, 3)


def test_report_carries_ratios_and_a_peer_that_could_not_run() -> None:
    results = {
        "eventbus_1": {"events_per_s": 40_000},
        "quixstreams": {"events_per_s": 8_000},
        "faust": {"error": "RuntimeError: faust: 10 windows with a wrong count"},
    }
    out = w.report(results, 100_000)
    assert out["ratios"] == {"eventbus_1_vs_quixstreams": 5.0, "eventbus_1_vs_faust": None}
    assert out["targets"]["eventbus_vs_best_framework"] == 5.0
    assert out["systems"]["faust"]["error"].startswith("RuntimeError")


def test_busy_events_leave_out_what_was_read_before_the_first_window_closed() -> None:
    n = 100_000
    assert w.busy_events(n, "quixstreams") == n * (w.WINDOWS - 1) / w.WINDOWS
    # Bytewax's clock waits BYTEWAX_WAIT_S: its first window closes that many windows later
    later = w.BYTEWAX_WAIT_S * 1000 // w.WINDOW_MS
    assert w.busy_events(n, "bytewax") == n * (w.WINDOWS - 1 - later) / w.WINDOWS
