"""Model applications that scale to zero, without a cluster: the rules, the controller's
watcher on a real Redis (the Serve side replaced by recording callables), and a caller's
wake: a call racing the scale-down, concurrent wakes, a wake that fails, a wake too slow."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from pydantic import ValidationError

from eventbus._internal import keys
from eventbus._internal.redis_client import connect
from eventbus.errors import ModelWakeError
from eventbus.models._zero import Waker, decide
from eventbus.pipelines.steps._model_backends import RemoteModel
from eventbus.pipelines.steps._model_config import ModelServingConfig, ModelStepConfig
from eventbus.serving._model_zero import ModelZero

pytestmark = pytest.mark.redis

NAME = "zero-unit"


class Serve:
    """Stands in for Serve's run and delete: counts them, can block or fail."""

    def __init__(self) -> None:
        self.runs = 0
        self.deletes = 0
        self.fail: Exception | None = None
        self.run_takes_s = 0.0
        self.during_delete: Any = None
        self._lock = threading.Lock()

    def run(self, name: str) -> None:
        time.sleep(self.run_takes_s)  # a serve.run blocks until the application runs
        if self.fail is not None:
            raise self.fail
        with self._lock:
            self.runs += 1

    def delete(self, name: str) -> None:
        if self.during_delete is not None:
            self.during_delete()
        with self._lock:
            self.deletes += 1


@pytest.fixture
def redis(redis_url: str) -> Any:
    r = connect(redis_url, decode_responses=True)
    clean = (keys.MODELS_AT_ZERO, keys.MODEL_WAKE, keys.model(NAME))
    r.delete(*clean)
    yield r
    r.delete(*clean)
    r.close()


@pytest.fixture
def serve() -> Serve:
    return Serve()


@pytest.fixture
def zero(redis: Any, serve: Serve) -> Any:
    z = ModelZero(redis, serve.run, serve.delete, poll_s=0.05)
    yield z
    z.stop()


def idle(zero: ModelZero, redis: Any, idle_s: float = 1.0) -> None:
    """Track the model as running, last started and last called long ago."""
    zero.track(NAME, idle_s)
    zero._up_at[NAME] = time.time() - 100
    redis.hset(keys.model(NAME), "called_at", repr(time.time() - 100))


def wait_for(cond: Any, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.02)


# -- the rules ------------------------------------------------------------------------------
def test_rules() -> None:
    base = {"now": 100.0, "called_at": 0.0, "up_at": 0.0, "wake_at": 0.0, "at_zero_since": None}
    assert decide(idle_s=None, **base) is None  # off by default: never at zero
    assert decide(idle_s=10, **base) == "down"
    # the latest of a call, a start and a wake request counts; exactly idle_s is idle
    for field in ("called_at", "up_at", "wake_at"):
        assert decide(idle_s=10, **{**base, field: 95.0}) is None
        assert decide(idle_s=10, **{**base, field: 90.0}) == "down"
    # at zero: only a wake asked at or after the scale-down began brings it back
    at_zero = {**base, "at_zero_since": 50.0}
    assert decide(idle_s=10, **at_zero) is None
    assert decide(idle_s=10, **{**at_zero, "wake_at": 49.0}) is None
    assert decide(idle_s=10, **{**at_zero, "wake_at": 50.0}) == "up"
    assert decide(idle_s=None, **{**at_zero, "wake_at": 60.0}) == "up"


def test_idle_s_is_off_by_default_and_bounded() -> None:
    assert ModelServingConfig().idle_s is None
    assert ModelServingConfig(idle_s=2).idle_s == 2
    for bad in (0, 0.5, -1, 31 * 86_400):
        with pytest.raises(ValidationError, match="idle_s"):
            ModelServingConfig(idle_s=bad)


# -- the watcher ----------------------------------------------------------------------------
def test_idle_model_goes_to_zero_and_a_wake_brings_it_back(
    zero: ModelZero, redis: Any, serve: Serve
) -> None:
    zero.track(NAME, 1.0)
    assert zero.tick() == []  # just deployed: activity
    idle(zero, redis)
    assert zero.tick() == [(NAME, "down")]
    wait_for(lambda: serve.deletes == 1 and NAME not in zero._busy)
    st = zero.state(NAME)
    assert st["at_zero"] is not None and st["scale_downs"] == 1 and st["wakes"] == 0
    assert json.loads(redis.hget(keys.MODELS_AT_ZERO, NAME))["settled_at"] >= st["at_zero"]
    assert zero.tick() == []  # at zero, nobody asked
    redis.hset(keys.MODEL_WAKE, NAME, repr(time.time()))
    assert zero.tick() == [(NAME, "up")]
    wait_for(lambda: serve.runs == 1 and NAME not in zero._busy)
    st = zero.state(NAME)
    assert st["at_zero"] is None and st["wakes"] == 1 and st["cold_start_s"] is not None
    assert zero.tick() == []  # its idle time starts afresh at the wake


def test_a_call_racing_the_scale_down_keeps_the_application(
    zero: ModelZero, redis: Any, serve: Serve
) -> None:
    idle(zero, redis)
    assert zero._decide(NAME, 1.0, None) == "down"
    redis.hset(keys.model(NAME), "called_at", repr(time.time()))  # a call lands meanwhile
    assert zero.down(NAME) is False
    assert serve.deletes == 0 and zero.state(NAME)["at_zero"] is None


def test_a_call_failing_during_the_delete_sees_zero_and_its_wake_is_honoured(
    zero: ModelZero, redis: Any, serve: Serve, redis_url: str
) -> None:
    waker = Waker(redis_url, NAME)
    seen: list[bool] = []

    def caller() -> None:  # a call that failed as the application went away
        seen.append(waker.at_zero())
        redis.hset(keys.MODEL_WAKE, NAME, repr(time.time()))

    serve.during_delete = caller
    idle(zero, redis)
    assert zero.down(NAME) is True
    assert seen == [True]  # recorded at zero before the delete began
    assert zero.tick() == [(NAME, "up")]
    wait_for(lambda: serve.runs == 1 and not waker.at_zero())


def test_a_failed_delete_leaves_the_model_running(
    zero: ModelZero, redis: Any, serve: Serve
) -> None:
    def broken() -> None:
        raise RuntimeError("serve controller away")

    serve.during_delete = broken
    idle(zero, redis)
    with pytest.raises(RuntimeError):
        zero.down(NAME)
    assert zero.state(NAME)["at_zero"] is None


def test_concurrent_wakes_make_one_application(
    zero: ModelZero, redis: Any, serve: Serve, redis_url: str
) -> None:
    idle(zero, redis)
    assert zero.down(NAME)
    serve.run_takes_s = 0.3
    zero.start()
    errors: list[BaseException] = []

    def call() -> None:
        try:
            Waker(redis_url, NAME).wake(time.monotonic() + 20)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    # and direct wakes racing the watcher's
    ups = [zero.up(NAME) for _ in range(3)]
    for t in threads:
        t.join(30)
    assert errors == []
    assert serve.runs == 1 and zero.state(NAME)["wakes"] == 1
    assert ups.count(True) <= 1


def test_a_wake_that_fails_fails_its_callers_retriably_then_the_next_wake_works(
    zero: ModelZero, redis: Any, serve: Serve, redis_url: str
) -> None:
    idle(zero, redis)
    assert zero.down(NAME)
    serve.fail = RuntimeError("no resources for the replica")
    zero.start()
    waker = Waker(redis_url, NAME)
    with pytest.raises(ModelWakeError, match="wake failed: RuntimeError: no resources"):
        waker.wake(time.monotonic() + 20)
    st = zero.state(NAME)
    assert st["at_zero"] is not None and st["wake_failures"] >= 1 and st["wakes"] == 0
    serve.fail = None
    waker.wake(time.monotonic() + 20)  # asks again: this time it runs
    assert serve.runs == 1 and zero.state(NAME)["wakes"] == 1 and waker.waits == 2


def test_a_wake_too_slow_for_the_deadline_is_a_retriable_error(
    zero: ModelZero, redis: Any, redis_url: str
) -> None:
    idle(zero, redis)
    assert zero.down(NAME)  # no watcher runs: nobody wakes it
    with pytest.raises(ModelWakeError, match=r"zero-unit.*timeout_s"):
        Waker(redis_url, NAME).wake(time.monotonic() + 0.3)
    assert float(redis.hget(keys.MODEL_WAKE, NAME)) > 0  # the request stays for the watcher


def test_forget_clears_the_state(zero: ModelZero, redis: Any) -> None:
    idle(zero, redis)
    assert zero.down(NAME)
    zero.forget(NAME)
    assert zero.state(NAME)["at_zero"] is None and zero.tick() == []


# -- the caller -----------------------------------------------------------------------------
class Unavailable(Exception):
    pass


def remote(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> RemoteModel:
    step = ModelStepConfig.model_validate({"name": NAME, "input": "[1.0]", "output": "data.y"})
    model = RemoteModel(step, redis_url)
    monkeypatch.setattr(model, "_h", lambda: "handle")
    return model


def test_a_call_failing_at_zero_waits_for_the_wake_and_is_sent_again(
    zero: ModelZero, redis: Any, serve: Serve, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = remote(redis_url, monkeypatch)
    idle(zero, redis)
    assert zero.down(NAME)
    zero.start()
    sent: list[str] = []

    def first(h: Any, t: float) -> Any:
        raise Unavailable("deployment unavailable")

    def again(h: Any, t: float) -> Any:
        sent.append(h)
        return "answer"

    assert model._ask(first, 20.0, again=again) == "answer"
    assert sent == ["handle"] and serve.runs == 1 and model.waker is not None
    assert model.waker.waits == 1


def test_a_failure_while_running_is_not_a_wake(
    redis: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = remote(redis_url, monkeypatch)

    def first(h: Any, t: float) -> Any:
        raise Unavailable("replica died")

    with pytest.raises(Unavailable):
        model._ask(first, 5.0)
    assert redis.hget(keys.MODEL_WAKE, NAME) is None


# -- eventbus model list ----------------------------------------------------------------------
def test_model_list_shows_at_zero_with_the_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import eventbus.cli._models as cli_models
    from eventbus.cli import app

    base = {"format": "export", "size": 10, "pushed_at": 0.0, "error": None, "traffic": 1.0}
    scale = {"at_zero": 1.0, "scale_downs": 3, "wakes": 2, "wake_failures": 1}
    rows = [
        {
            **base,
            "name": "rare",
            "version": 1,
            "status": "serving",
            "shadow": None,
            "scale": {**scale, "cold_start_s": 6.2},
        },
        {
            **base,
            "name": "hot",
            "version": 1,
            "status": "serving",
            "shadow": None,
            "scale": {
                "at_zero": None,
                "scale_downs": 0,
                "wakes": 0,
                "wake_failures": 0,
                "cold_start_s": None,
            },
        },
    ]

    class Client:
        def list_models(self, name: str | None) -> list[dict[str, Any]]:
            return rows

    monkeypatch.setattr(cli_models, "_client", lambda *a: Client())
    monkeypatch.setenv("COLUMNS", "250")
    out = CliRunner().invoke(app, ["model", "list"]).output
    assert "scale to zero" in out
    line = next(x for x in out.splitlines() if "rare" in x)
    assert "at zero" in line and "3 down, 2 wakes" in line and "cold start 6.2 s" in line
    assert "1 failed wakes" in line
    assert "running · 0 down, 0 wakes" in next(x for x in out.splitlines() if "hot" in x)
    # no model ever went to zero: no column
    rows[0]["scale"] = rows[1]["scale"]
    assert "scale to zero" not in CliRunner().invoke(app, ["model", "list"]).output


def test_a_stale_handle_after_another_callers_wake_is_renewed(
    redis: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from ray.serve.exceptions import DeploymentUnavailableError

    model = remote(redis_url, monkeypatch)

    def first(h: Any, t: float) -> Any:  # the application went and came back meanwhile
        deployment = SimpleNamespace(name="model", app_name="eventbus-model-x")
        raise DeploymentUnavailableError(deployment)  # type: ignore[arg-type]

    assert model._ask(first, 5.0, again=lambda h, t: "answer") == "answer"
    assert model.waker is not None and model.waker.waits == 0


def test_hundreds_of_models_in_one_tick(redis: Any, serve: Serve) -> None:
    names = [f"zero-many-{i}" for i in range(300)]
    zero = ModelZero(redis, serve.run, serve.delete, poll_s=0.05)
    try:
        now = time.time()
        for i, name in enumerate(names):
            zero.track(name, 1.0 if i % 3 else None)  # every third never goes to zero
            zero._up_at[name] = now - 100
            redis.hset(keys.model(name), "called_at", repr(now if i % 2 else now - 100))
        actions = zero.tick()
        expected = {n for i, n in enumerate(names) if i % 3 and not i % 2}
        assert {n for n, a in actions if a == "down"} == expected and len(actions) == len(expected)
        wait_for(lambda: serve.deletes == len(expected), 30)
        assert set(redis.hkeys(keys.MODELS_AT_ZERO)) == expected
    finally:
        zero.stop()
        redis.delete(*(keys.model(n) for n in names))
        redis.hdel(keys.MODELS_AT_ZERO, *names)
