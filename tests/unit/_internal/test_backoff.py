"""The one retry backoff: bounds hold, jitter spreads retriers, every retry loop uses it."""

from __future__ import annotations

import random
import re
import statistics
import textwrap

import pytest

from eventbus._internal.backoff import Backoff
from eventbus.eventing._delivery import RetryPolicy
from eventbus.eventing.sources._kafka_settings import DeliveryPolicy
from eventbus.pipelines import load_pipeline_text
from eventbus.serving._outputs import delivery_policy

PIPELINE = textwrap.dedent(
    """\
    apiVersion: eventbus/v1
    kind: Pipeline
    metadata: {name: orders}
    spec:
      sources:
        - kafka: {topic: orders}
      steps:
        - id: big
          filter: "data.amount > 10"
      sink: {kafka: {topic: out}}
    """
)


def test_bounds_hold_for_every_attempt_and_jitter() -> None:
    rng = random.Random(7)
    for jitter in (0.0, 0.2, 0.5, 1.0):
        b = Backoff(initial_s=0.1, max_s=5.0, jitter=jitter)
        for attempt in range(1, 40):
            ceiling = min(0.1 * 2 ** (attempt - 1), 5.0)
            assert b.ceiling(attempt) == pytest.approx(ceiling)
            for _ in range(50):
                d = b.delay(attempt, rng)
                assert (1 - jitter) * ceiling - 1e-12 <= d <= ceiling
                assert d > 0  # even full jitter never retries in the same instant
    # without jitter the schedule is exact: 0.1, 0.2, 0.4, ... capped at max_s
    exact = Backoff(0.1, 0.3, jitter=0)
    assert [exact.delay(n) for n in (1, 2, 3, 4, 9)] == pytest.approx([0.1, 0.2, 0.3, 0.3, 0.3])


def test_two_retriers_with_the_same_settings_do_not_retry_in_lockstep() -> None:
    # Two sources with the same delivery settings fail at the same moment (a shared broker
    # outage) and retry five times: their retry instants differ, spread over the interval.
    a, b = DeliveryPolicy(retry_initial_s=0.1), DeliveryPolicy(retry_initial_s=0.1)
    assert a.retry_jitter == 1.0  # full jitter unless configured otherwise

    def instants(p: DeliveryPolicy) -> list[float]:
        t, out = 0.0, []
        for attempt in range(1, 6):
            t += p.backoff_s(attempt)
            out.append(t)
        return out

    gaps = [abs(x - y) for x, y in zip(instants(a), instants(b))]
    assert all(g > 0 for g in gaps)
    # Over many first retries, full jitter spreads them across (0, initial]: a lockstep
    # schedule (every delay the same) would have a spread of 0.
    firsts = [a.backoff_s(1) for _ in range(2000)]
    assert statistics.pstdev(firsts) > 0.02  # uniform over (0, 0.1]: ~0.029
    assert min(firsts) < 0.02 and max(firsts) > 0.08
    # the same for event retries
    policy = RetryPolicy(retries=3, initial_s=0.1, max_s=1.0)
    assert len({round(policy.delay(2), 9) for _ in range(100)}) > 90


def test_yaml_settings_keep_their_meaning() -> None:
    text = (
        PIPELINE
        + "  delivery: {retries: 4, backoff: {initial_ms: 200, max_ms: 800, jitter: 0.25}}\n"
    )
    config = load_pipeline_text(text, "p.yaml")
    retry = RetryPolicy.from_config(config.spec)
    policy = delivery_policy(config, None)
    assert (retry.retries, retry.initial_s, retry.max_s, retry.jitter) == (4, 0.2, 0.8, 0.25)
    assert policy.dispatch_retries == 4
    assert (policy.retry_initial_s, policy.retry_max_s, policy.retry_jitter) == (0.2, 0.8, 0.25)
    for attempt, ceiling in ((1, 0.2), (2, 0.4), (3, 0.8), (4, 0.8)):
        for _ in range(100):
            assert 0.75 * ceiling - 1e-12 <= policy.backoff_s(attempt) <= ceiling
            assert 0.75 * ceiling - 1e-12 <= retry.delay(attempt) <= ceiling
    # the default is full jitter
    default = load_pipeline_text(PIPELINE, "p.yaml").spec.delivery.backoff
    assert (default.initial_ms, default.max_ms, default.jitter) == (100, 5000, 1.0)


def test_hostile_attempt_counts_and_settings() -> None:
    b = Backoff(0.001, 2.0)
    assert b.ceiling(10**9) == 2.0  # a loop that counted for days: no float overflow
    assert 0 < b.delay(10**9) <= 2.0
    assert b.ceiling(0) == b.ceiling(-5) == 0.001  # a miscounted attempt: the first delay
    assert Backoff(0, 0).delay(3) == 0.0  # no pause at all is a valid choice (tests)
    cases = [
        (
            {"initial_s": -1.0},
            "backoff initial_s must be a finite number of seconds >= 0; got -1.0",
        ),
        ({"max_s": float("inf")}, "backoff max_s must be a finite number of seconds >= 0; got inf"),
        ({"max_s": float("nan")}, "backoff max_s must be a finite number of seconds >= 0; got nan"),
        (
            {"jitter": 1.5},
            "backoff jitter must be a fraction from 0 to 1 (1: full jitter); got 1.5",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            Backoff(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backoff jitter must be a fraction"):
        DeliveryPolicy(retry_jitter=-0.1)
