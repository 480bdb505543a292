"""Shadow comparisons and the rollback judge (pure logic and the replica's runtime pieces, no Ray,
no Redis): hostile inputs (NaN outputs, other shapes, empty windows, a candidate that always
errors, unreadable counters, concurrent updates)."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import pytest
import torch

from eventbus.models._compare import BUCKETS, Comparison, bucket_of, quantile_ms, summarize
from eventbus.models._judge import MIN_PASSES, RollbackPolicy, VersionWindow, WindowFigures, judge
from eventbus.models._live import LiveGuard, ShadowMirror, shadow_draws


def _merged(c: Comparison) -> dict[str, Any]:
    ints, abs_sum = c.take()
    return summarize({**{k: str(v) for k, v in ints.items()}, "abs_sum": str(abs_sum)})


# -- comparison ---------------------------------------------------------------------------------
def test_labels_agree_by_equality_and_floats_by_argmax_with_mad() -> None:
    c = Comparison()
    c.compare(np.array([1, 2, 3, 4]), np.array([1, 2, 0, 4]))  # integer labels: 3 of 4
    s = _merged(c)
    assert s["agreement"] == 0.75 and s["mad"] is None and s["rows"] == 4
    live = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]], dtype=np.float32)
    cand = np.array([[0.8, 0.2], [0.6, 0.4], [0.5, 0.5], [0.3, 0.7]], dtype=np.float32)
    c.compare(live, cand)
    s = _merged(c)
    assert s["agreement"] == pytest.approx(0.75)  # row 1 flips; row 2 ties -> argmax 0 both
    assert s["mad"] == pytest.approx(np.abs(live - cand).mean(), rel=1e-6)


def test_single_float_output_has_mad_and_no_agreement() -> None:
    c = Comparison()
    c.compare(np.array([[1.0], [2.0]]), np.array([[1.5], [2.0]]))
    s = _merged(c)
    assert s["agreement"] is None and s["mad"] == pytest.approx(0.25)


def test_nan_and_inf_outputs_count_as_nonfinite_and_stay_out_of_mad() -> None:
    c = Comparison()
    live = np.array([[0.0, 1.0], [1.0, 0.0], [np.nan, 1.0], [1.0, 0.0]])
    cand = np.array([[0.0, 1.0], [np.inf, 0.0], [0.0, 1.0], [1.0, 0.5]])
    c.compare(live, cand)
    s = _merged(c)
    assert s["nonfinite"] == 2 and math.isfinite(s["mad"])
    assert s["mad"] == pytest.approx(0.5 / 4)  # 4 finite elements, one differs by 0.5
    assert s["agreement"] == pytest.approx(0.5)  # non-finite rows disagree


def test_other_shape_and_empty_calls() -> None:
    c = Comparison()
    c.compare(np.zeros((3, 2)), np.zeros((3, 5)))
    c.compare(np.zeros((0, 2)), np.zeros((0, 2)))
    s = _merged(c)
    assert s["mismatched"] == 3 and s["agreement"] == 0.0 and s["calls"] == 2
    empty = summarize({})
    assert empty["agreement"] is None and empty["mad"] is None and empty["live_p99_ms"] is None


def test_summarize_ignores_unreadable_fields() -> None:
    s = summarize(
        {
            b"rows": b"12",
            b"agree": b"x",
            b"labelled": b"4",
            b"abs_sum": b"nan",
            b"abs_n": b"3",
            b"live:3": b"5",
            b"live:999": b"5",
            b"cand:-1": b"2",
            b"cand:2": b"inf",
            b"version": b"7",
            "junk": object(),
        }
    )
    assert s["rows"] == 12 and s["agreement"] == 0.0 and s["mad"] is None
    assert s["live_p50_ms"] is not None and s["candidate_p50_ms"] is None and s["version"] == 7


def test_latency_buckets_take_hostile_durations() -> None:
    assert bucket_of(float("nan")) == 0 and bucket_of(-1.0) == 0
    assert bucket_of(float("inf")) == BUCKETS - 1 and bucket_of(1e9) == BUCKETS - 1
    assert bucket_of(0.001) < bucket_of(0.002) < bucket_of(0.1)
    counts = {bucket_of(0.001): 98, bucket_of(0.5): 2}
    assert quantile_ms(counts, 0.5) == pytest.approx(1.0, rel=0.2)
    assert quantile_ms(counts, 0.99) == pytest.approx(500, rel=0.2)
    assert quantile_ms({}, 0.99) is None and quantile_ms({3: 0}, 0.5) is None


def test_concurrent_counting_loses_nothing_and_give_back_restores() -> None:
    c = Comparison()
    live = np.array([[1.0, 0.0]] * 10)

    def work() -> None:
        for _ in range(200):
            c.compare(live, live)
            c.latency(0.001, 0.002)
            c.dropped(1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    taken = []
    for _ in range(50):  # take while they count: every increment goes to exactly one take
        taken.append(c.take())
    for t in threads:
        t.join()
    taken.append(c.take())
    rows = sum(t[0].get("rows", 0) for t in taken)
    drops = sum(t[0].get("dropped", 0) for t in taken)
    assert rows == 8 * 200 * 10 and drops == 8 * 200
    c.give_back({"rows": 5, "live:3": 2}, 1.5)
    ints, abs_sum = c.take()
    assert ints == {"rows": 5, "live:3": 2} and abs_sum == 1.5


# -- judge --------------------------------------------------------------------------------------
def _window(rows: int, errors: int, ms: float = 1.0, passes: int = 60) -> WindowFigures:
    return WindowFigures(rows, errors, passes, {bucket_of(ms / 1000): passes})


def test_judge_empty_and_thin_windows_prove_nothing() -> None:
    p = RollbackPolicy(min_rows=20)
    assert judge(WindowFigures(), _window(100, 0), p) is None
    assert judge(_window(19, 19), _window(100, 0), p) is None


def test_judge_always_erroring_candidate_is_rolled_back() -> None:
    p = RollbackPolicy()
    reason = judge(_window(100, 100), _window(100, 0), p)
    assert reason is not None and "error rate 100.0% (100 of 100 rows)" in reason
    assert judge(_window(100, 100), None, p) is not None  # no previous figures: taken as 0
    assert "taken as 0" in str(judge(_window(100, 100), _window(3, 0), p))


def test_judge_compares_against_the_previous_error_rate() -> None:
    p = RollbackPolicy(error_rate_margin=0.05)
    assert judge(_window(100, 30), _window(100, 28), p) is None
    assert judge(_window(100, 34), _window(100, 28), p) is not None
    assert judge(_window(100, 100), _window(100, 0), RollbackPolicy(enabled=False)) is None


def test_judge_p99_ratio_floor_and_unknown_latencies() -> None:
    p = RollbackPolicy(p99_ratio=2.0, p99_min_ms=50.0)
    assert RollbackPolicy().p99_ratio == 3.0 and RollbackPolicy().p99_min_ms == 100.0
    assert "p99" in str(judge(_window(100, 0, ms=400), _window(100, 0, ms=100), p))
    assert judge(_window(100, 0, ms=30), _window(100, 0, ms=5), p) is None  # under the floor
    assert judge(_window(100, 0, ms=400), _window(100, 0, ms=100, passes=MIN_PASSES - 1), p) is None
    assert judge(_window(100, 0, ms=400), None, p) is None
    assert (
        judge(_window(100, 0, ms=400), _window(100, 0, 100), RollbackPolicy(p99_ratio=None)) is None
    )
    nan = WindowFigures(100, 0, 60, {bucket_of(float("nan")): 60})
    assert judge(nan, _window(100, 0), p) is None


def test_policy_from_options() -> None:
    assert RollbackPolicy.from_options(None) == RollbackPolicy()
    assert RollbackPolicy.from_options("junk") == RollbackPolicy()
    p = RollbackPolicy.from_options({"window_s": 5, "min_rows": 3, "unknown": 1})
    assert p.window_s == 5 and p.min_rows == 3


def test_version_window_keeps_its_window_and_counts_concurrent_adds() -> None:
    w = VersionWindow()
    w.add(10, 10, 0.001, now=100.0)
    w.add(5, 0, 0.001, now=200.0)
    w.add(-1, 0, 0.001, now=200.0)  # hostile: ignored
    w.add(1, 0, 0.001, now=float("nan"))
    w.add(3, 9, 0.001, now=200.0)  # more failed than run: capped
    f = w.figures(200.5, 60)
    assert (f.rows, f.error_rows, f.passes) == (8, 3, 2)
    assert w.figures(200.5, 1000).rows == 18

    def work() -> None:
        for _ in range(1000):
            w.add(1, 1, 0.002, now=300.0)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert w.figures(300.0, 1).rows == 8000


# -- the replica's guard ------------------------------------------------------------------------
class _Registry:
    """The registry calls the guard makes, in memory; ``win`` says whether a rollback takes."""

    def __init__(self, win: bool = True) -> None:
        self.win = win
        self.calls: list[dict[str, Any]] = []
        self.marked: set[int] = set()

    def rollback(self, name: str, **kw: Any) -> bool:
        self.calls.append(kw)
        if self.win:
            self.marked.add(kw["bad"])
        return self.win

    def rolled_back(self, name: str, version: int) -> bool:
        return version in self.marked


def test_guard_rolls_back_a_version_that_took_all_traffic() -> None:
    reg = _Registry()
    g = LiveGuard("m", reg, RollbackPolicy(min_rows=10))
    g.moved((None, None), (1, None))  # replica start: nothing to judge
    for _ in range(20):
        g.observe(1, 5, 0, 0.001)
    g.moved((1, None), (2, None))
    assert not g.look(2, None)  # no rows of version 2 yet
    for _ in range(4):
        g.observe(2, 5, 5, 0.001)
    assert g.look(2, None) and g.rollbacks == 1
    [call] = reg.calls
    assert call["kind"] == "serving" and call["bad"] == 2 and call["to"] == 1
    assert call["figures"]["version"]["error_rows"] == 20
    assert call["figures"]["previous"]["rows"] == 100
    g.moved((2, None), (1, None))  # back to 1 after the rollback: 1 is not judged
    g.observe(1, 50, 50, 0.001)
    assert not g.look(1, None)


def test_guard_judges_a_split_live_and_loses_a_race_quietly() -> None:
    reg = _Registry(win=False)  # another replica rolled it back first
    g = LiveGuard("m", reg, RollbackPolicy(min_rows=10))
    g.moved((None, None), (1, None))
    g.moved((1, None), (1, 3))
    for _ in range(10):
        g.observe(1, 9, 0, 0.001)
        g.observe(3, 1, 1, 0.001)
    assert not g.look(1, 3) and g.rollbacks == 0
    assert reg.calls[0]["kind"] == "split" and reg.calls[0]["bad"] == 3


def test_guard_counts_concurrent_passes_while_judging() -> None:
    reg = _Registry()
    g = LiveGuard("m", reg, RollbackPolicy(min_rows=1000))
    g.moved((None, None), (1, None))
    g.moved((1, None), (2, None))
    stop = threading.Event()

    def work() -> None:
        for _ in range(500):
            g.observe(2, 1, 1, 0.001)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        g.look(2, None)
    for t in threads:
        t.join()
    stop.set()
    g.look(2, None)
    assert len(reg.calls) == 1 and reg.calls[0]["figures"]["version"]["rows"] == 2000


# -- the shadow mirror --------------------------------------------------------------------------
class _Sink:
    def __init__(self) -> None:
        self.ints: dict[str, int] = {}
        self.abs_sum = 0.0

    def add_comparison(
        self,
        name: str,
        version: int,
        ints: dict[str, int],
        abs_sum: float,
        *,
        started_at: float | None = None,
    ) -> bool:
        for k, v in ints.items():
            self.ints[k] = self.ints.get(k, 0) + v
        self.abs_sum += abs_sum
        return True


def _drain(m: ShadowMirror, sink: _Sink, want_rows: int) -> dict[str, Any]:
    for _ in range(2000):  # wait for the worker to count every mirrored row, not a fixed time
        m.flush(sink)
        done = sink.ints.get("rows", 0) + sink.ints.get("error_rows", 0)
        if done + sink.ints.get("dropped_rows", 0) >= want_rows:
            break
        threading.Event().wait(0.005)
    return summarize({**{k: str(v) for k, v in sink.ints.items()}, "abs_sum": sink.abs_sum})


def test_mirror_compares_the_share_it_picks() -> None:
    x = torch.randn(400, 3)
    u = np.random.default_rng(1).random(400)
    picked = int((shadow_draws(u, 400) < 0.5).sum())
    m = ShadowMirror("m", 2, lambda t: t[:, :2] * 2, share=0.5)
    live = (x[:, :2] * 2).numpy()
    for i in range(0, 400, 50):
        m.offer(x[i : i + 50], live[i : i + 50], u[i : i + 50], 0.001)
    sink = _Sink()
    s = _drain(m, sink, picked)
    m.stop()
    assert s["rows"] + s["dropped_rows"] == picked and s["agreement"] == 1.0
    assert 150 < picked < 250


def test_mirror_of_an_always_failing_candidate_counts_errors() -> None:
    def broken(t: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")

    m = ShadowMirror("m", 2, broken, share=1.0)
    x = torch.ones(10, 2)
    m.offer(x, x.numpy(), None, 0.001)
    s = _drain(m, _Sink(), 10)
    m.stop()
    assert s["errors"] + s["dropped"] == 1 and s["error_rows"] + s["dropped_rows"] == 10


def test_mirror_drops_and_counts_when_the_candidate_falls_behind() -> None:
    gate = threading.Event()

    def slow(t: torch.Tensor) -> torch.Tensor:
        gate.wait(10)
        return t

    m = ShadowMirror("m", 2, slow, share=1.0, max_in_flight=2)
    x = torch.ones(5, 2)
    for _ in range(20):  # never blocks: one runs, two wait, the rest are dropped
        m.offer(x, x.numpy(), None, 0.001)
    gate.set()
    sink = _Sink()
    s = _drain(m, sink, 100)
    m.stop()
    assert s["rows"] + s["dropped_rows"] == 100 and s["dropped"] >= 17


def test_model_step_reports_its_models_shadow_as_the_replica_told() -> None:
    from eventbus.pipelines.steps._model import ModelStep
    from eventbus.pipelines.steps._model_config import ModelStepConfig

    step = ModelStep(
        "score",
        ModelStepConfig(name="fraud", input="data.x", output="data.y"),
        remote=True,
    )
    assert "shadow" not in step.stats()
    step.backends[0].shadow = {**summarize({"rows": "8", "version": "3", "share": "0.2"})}
    shadow = step.stats()["shadow"]
    assert shadow["model"] == "fraud" and shadow["version"] == 3 and shadow["rows"] == 8
    assert shadow["share"] == 0.2 and shadow["agreement"] is None
