"""The 15-minute history: what a writer adds per bucket, and the chart columns read back."""

from __future__ import annotations

from typing import Any

from eventbus._internal import keys
from eventbus.observability._history import (
    BUCKET_S,
    TTL_S,
    WINDOW_S,
    HistoryRecorder,
    bucket_keys,
    history_columns,
)
from eventbus.observability._metrics import LATENCY_BOUNDS_S, Histogram

T0 = 1_700_000_000.0  # a multiple of BUCKET_S


def replica_body(consumed: int, outputs: int, failed: int, lag: int, latencies: list[float]):
    h = Histogram(LATENCY_BOUNDS_S)
    for v in latencies:
        h.observe(v)
    return {
        "sources": [{"consumed": consumed, "outputs": outputs, "failed": failed}],
        "metrics": {"sources": [{"latency": h.snapshot(), "lag": {"t[0]": lag}}]},
    }


def apply(store: dict[str, dict[str, str]], cmds: list[tuple[Any, ...]]) -> None:
    """What Redis does with the commands (HINCRBY, HSET, EXPIRE)."""
    for method, key, *args in cmds:
        h = store.setdefault(key, {})
        if method == "hincrby":
            h[args[0]] = str(int(h.get(args[0], 0)) + args[1])
        elif method == "hset":
            h[args[0]] = str(args[1])
        else:
            assert (method, args) == ("expire", [TTL_S])


def buckets(store: dict[str, dict[str, str]], pipeline: str) -> list[tuple[int, dict[str, str]]]:
    prefix = keys.history(pipeline, 0)[:-1]
    return [(int(k[len(prefix) :]), h) for k, h in store.items() if k.startswith(prefix)]


def test_a_writer_adds_only_what_is_new_to_the_current_bucket() -> None:
    r = HistoryRecorder("orders", "replica-a")
    first = r.commands(replica_body(10, 8, 1, 5, [0.003] * 8), now=T0 + 1)
    key = keys.history("orders", int(T0))
    assert ("hincrby", key, "in", 10) in first and ("hincrby", key, "out", 8) in first
    assert ("hincrby", key, "failed", 1) in first
    assert ("hset", key, "lag:replica-a", 5) in first and ("hset", key, "up:replica-a", 1) in first
    assert first[-1] == ("expire", key, TTL_S)
    # 3 s later: 4 more in, 4 more out, lag down to 2 (the bucket keeps its highest, 5)
    second = r.commands(replica_body(14, 12, 1, 2, [0.003] * 12), now=T0 + 4)
    assert [c for c in second if c[0] == "hincrby"] == [
        ("hincrby", key, "in", 4),
        ("hincrby", key, "out", 4),
        ("hincrby", key, "h2", 4),  # 3 ms falls in the (2.5 ms, 5 ms] bucket
    ]
    assert ("hset", key, "lag:replica-a", 5) in second
    # the next bucket starts from the lag it sees
    third = r.commands(replica_body(14, 12, 1, 2, [0.003] * 12), now=T0 + BUCKET_S + 1)
    nxt = keys.history("orders", int(T0) + BUCKET_S)
    assert third == [
        ("hset", nxt, "lag:replica-a", 2),
        ("hset", nxt, "up:replica-a", 1),
        ("expire", nxt, TTL_S),
    ]


def test_an_idle_gateway_writes_nothing_and_a_reset_counts_from_zero() -> None:
    r = HistoryRecorder("orders", "gateway-1")
    body = {"role": "gateway", "sync": {"consumed": 3, "outputs": 2, "failed": 1}}
    assert len(r.commands(body, now=T0)) == 4  # in, out, failed, expire; no lag, not a replica
    assert r.commands(body, now=T0 + 5) == []  # the heartbeat of unchanged counts: nothing
    # the gateway forgot a deleted pipeline's counts; the new one's are all new
    reset = r.commands({"role": "gateway", "sync": {"consumed": 1}}, now=T0 + 6)
    assert ("hincrby", keys.history("orders", int(T0)), "in", 1) in reset


def test_columns_sum_writers_and_show_zero_replicas_where_none_ran() -> None:
    store: dict[str, dict[str, str]] = {}
    a, b = HistoryRecorder("p", "replica-a"), HistoryRecorder("p", "replica-b")
    src = HistoryRecorder("p", "source0-x")
    # bucket 0: two replicas; bucket 1: one; bucket 2: none (scaled to zero); bucket 3: back
    apply(store, a.commands(replica_body(100, 90, 0, 40, [0.004] * 90), now=T0 + 1))
    apply(store, b.commands(replica_body(50, 50, 0, 10, [0.2] * 50), now=T0 + 2))
    apply(store, a.commands(replica_body(120, 110, 0, 0, [0.004] * 110), now=T0 + 11))
    source_body = {"role": "source", **replica_body(5, 5, 0, 7, [])}
    apply(store, src.commands(source_body, now=T0 + 12))
    c = HistoryRecorder("p", "replica-c")
    apply(store, c.commands(replica_body(30, 30, 0, 300, [1.5] * 30), now=T0 + 31))
    cols = history_columns(buckets(store, "p"), now=T0 + 4 * BUCKET_S + 3, window_s=40)
    assert cols["t"] == [T0 + i * BUCKET_S for i in range(4)]
    assert cols["in_per_s"] == [15.0, 2.5, 0.0, 3.0]
    assert cols["out_per_s"] == [14.0, 2.5, 0.0, 3.0]
    assert cols["replicas"] == [2, 1, 0, 1]  # a source actor is not a replica
    assert cols["lag"] == [50, 7, None, 300]
    assert cols["p50_s"][0] is not None and 0.0025 < cols["p50_s"][0] <= 0.005
    assert 0.1 < cols["p99_s"][0] <= 0.25  # replica b's 50 slow ones
    assert cols["p50_s"][2] is None and 1.0 < cols["p99_s"][3] <= 2.5
    assert cols["window_s"] == 40 and cols["bucket_s"] == BUCKET_S


def test_the_bucket_in_progress_is_left_out_and_the_window_is_bounded() -> None:
    cols = history_columns([], now=T0 + BUCKET_S + 1.0)  # bucket T0 ended 1 s ago: unsettled
    assert cols["t"][-1] == T0 - BUCKET_S and len(cols["t"]) == WINDOW_S // BUCKET_S
    assert cols["replicas"] == [0] * len(cols["t"]) and set(cols["lag"]) == {None}
    assert history_columns([], now=T0 + BUCKET_S + 2.5)["t"][-1] == T0
    # bytes from a client without decode_responses read the same
    cols = history_columns([(int(T0), {b"in": b"20", b"up:r": b"1"})], now=T0 + 13, window_s=10)
    assert (cols["in_per_s"], cols["replicas"]) == ([2.0], [1])


def test_bucket_keys_cover_every_live_bucket_in_one_slot() -> None:
    names = bucket_keys("orders", now=T0 + 3)
    assert keys.history("orders", int(T0)) in names
    assert keys.history("orders", int(T0) - WINDOW_S) in names
    assert len(names) >= TTL_S // BUCKET_S + 1
    assert {keys.hash_tag(n) for n in names} == {keys.hash_tag(keys.stats("orders"))}
