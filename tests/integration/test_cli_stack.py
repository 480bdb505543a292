"""The CLI on its own embedded stack: up, deploy, publish, tail, status, list, delete, down.

This starts a second, separate local stack (its own Ray head, Tansu, Redis) in a temporary
EVENTBUS_HOME, exactly as a newcomer's `eventbus up` does. The model commands on such a stack
are the model-stage tutorial's (``test_tutorials.py``: deploy, push with validation, list,
split); their refusals and outputs against direct torch calls are ``test_model.py``'s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.ray,
    pytest.mark.redis,
    pytest.mark.slow,
]

ROOT = Path(__file__).resolve().parents[2]


def eb(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "EVENTBUS_"))}
    env.update(
        {"EVENTBUS_HOME": str(home), "COLUMNS": "200", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    )
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "eventbus.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )
    # shown with a failure (and under -s): where a slow flow spent its time
    print(f"eventbus {' '.join(args)[:60]}: exit {done.returncode}, {time.monotonic() - t0:.1f} s")
    return done


def listening_ports() -> str:
    return subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=False).stdout


# the payments flow and a full restart
@pytest.mark.timeout(600)
def test_newcomer_flow_on_the_embedded_stack(tmp_path: Path) -> None:
    home = tmp_path / "eb"
    t0 = time.monotonic()

    def phase(what: str) -> None:
        print(f"newcomer flow: {what} {time.monotonic() - t0:.1f} s")

    try:
        up = eb(home, "up", "--num-cpus", "1")
        assert up.returncode == 0, up.stderr
        phase("up")
        stack = json.loads((home / "stack.json").read_text())
        assert set(stack["owned"]) == {"ray", "kafka", "redis", "gateway"}
        for addr in (stack["ray_address"], stack["kafka_bootstrap"]):
            assert addr.startswith("127.0.0.1:")
        # Everything the stack started listens on loopback only.
        ray_port = stack["ray_address"].split(":")[1]
        gw_port = stack["gateway_http"].rsplit(":", 1)[1]
        ports = listening_ports()
        for port in (ray_port, gw_port, stack["gateway_grpc"].rsplit(":", 1)[1]):
            assert re.search(rf"127\.0\.0\.1\]?:{port}\s", ports), ports
            assert not re.search(rf"(0\.0\.0\.0|\*|\[::\]):{port}\s", ports), ports
        # the documented default port unless taken (then `up` says so); `url` prints it
        assert gw_port == "8080" or "gateway HTTP port 8080 (its default) is taken" in up.stderr
        assert eb(home, "url", "gateway").stdout.strip() == stack["gateway_http"]
        assert eb(home, "url", "dashboard").stdout.strip() == stack["gateway_http"] + "/dashboard"

        # a misspelled topic is refused at deploy and by publish, naming the close one
        typo = tmp_path / "typo.yaml"
        (tmp_path / "fraud.py").write_text((ROOT / "examples/payments/fraud.py").read_text())
        typo.write_text(
            (ROOT / "examples/payments/payments.yaml")
            .read_text()
            .replace("{topic: payments-large, create: {partitions: 1}}", "{topic: payments-lrage}")
        )
        bad = eb(home, "deploy", str(typo))
        assert bad.returncode == 1, bad.stdout
        assert "topic 'payments-lrage' does not exist" in " ".join(bad.stderr.split()), bad.stderr

        dep = eb(home, "deploy", "examples/payments/payments.yaml")
        assert dep.returncode == 0, dep.stderr
        assert "deployed large-payments version 1" in dep.stdout

        nope = eb(home, "publish", "paymnets", "--file", "examples/payments/events.jsonl")
        assert nope.returncode == 1
        assert "(did you mean 'payments'?)" in " ".join(nope.stderr.split()), nope.stderr
        pub = eb(home, "publish", "payments", "--file", "examples/payments/events.jsonl")
        assert pub.returncode == 0, pub.stderr
        tail = eb(
            home,
            "tail",
            "payments-large",
            "--from-beginning",
            "--max",
            "3",
            "--timeout",
            "60",
            "--json",
        )
        assert tail.returncode == 0, tail.stderr
        events = [json.loads(line) for line in tail.stdout.splitlines()]
        assert sorted(e["id"] for e in events) == ["demo-1", "demo-3", "demo-5"]
        assert all(
            e["type"] == "payment.large" and 0 <= e["data"]["fraud_score"] <= 1 for e in events
        )

        dlq = eb(
            home,
            "tail",
            "payments-dlq",
            "--from-beginning",
            "--max",
            "1",
            "--timeout",
            "60",
            "--json",
        )
        [dead] = [json.loads(line) for line in dlq.stdout.splitlines()]
        assert dead["id"] == "demo-6" and dead["ebstep"] == "score"
        assert "account_age_days must be an integer" in dead["eberror"]

        # The same pipeline over HTTP at the gateway `up` started: sync and async.
        st_json = json.loads(eb(home, "status", "--json").stdout)
        gw = st_json["parts"]["gateway"]["url"]
        assert gw == stack["gateway_http"] and st_json["parts"]["gateway"]["up"]
        r = httpx.post(
            f"{gw}/payments?wait=true", json={"amount": 900, "currency": "EUR"}, timeout=60
        )
        assert r.status_code == 200, r.text
        assert r.headers["ce-type"] == "payment.large" and r.headers["ce-source"] == "/shop/web"
        assert r.json()["amount_cny"] == 900 * 7.7 and 0 <= r.json()["fraud_score"] <= 1
        r = httpx.post(
            f"{gw}/v1/pipelines/large-payments/events?wait=false",
            json={"amount": 450, "currency": "USD"},
            timeout=60,
        )
        assert r.status_code == 202, r.text
        http_id = r.json()["ids"][0]
        tail = eb(
            home,
            "tail",
            "payments-large",
            "--from-beginning",
            "--max",
            "4",
            "--timeout",
            "60",
            "--json",
        )
        assert http_id in [json.loads(line)["id"] for line in tail.stdout.splitlines()]

        st = eb(home, "status", "large-payments")
        assert st.returncode == 0, st.stderr
        assert "only_large (filter) → to_cny (convert) → score (function)" in st.stdout
        totals = json.loads(eb(home, "status", "large-payments", "--json").stdout)["figures"][
            "totals"
        ]
        # the six published events, the async HTTP one and the sync one
        assert (totals["consumed"], totals["outputs"], totals["dead_lettered"]) == (8, 5, 1), totals

        ls = eb(home, "list")
        assert "large-payments" in ls.stdout and "RUNNING" in ls.stdout
        # the logs the errors point to
        for what, expect in (
            ("gateway", "gateway: HTTP on"),
            ("controller", ""),
            ("large-payments", ""),
        ):
            logs = eb(home, "logs", what, "--files")
            assert logs.returncode == 0 and logs.stdout.strip(), (what, logs.stderr)
            shown = eb(home, "logs", what, "-n", "200")
            assert shown.returncode == 0 and expect in shown.stdout, (what, shown.stdout[-2000:])

        # The admin API on the gateway, with the token `up` wrote (CLI parity: list, versions).
        token = (home / "admin_token").read_text().strip()
        assert (home / "admin_token").stat().st_mode & 0o077 == 0
        assert httpx.get(f"{gw}/v1/admin/pipelines", timeout=30).status_code == 401
        r = httpx.get(
            f"{gw}/v1/admin/pipelines", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        assert r.status_code == 200 and [p["name"] for p in r.json()] == ["large-payments"], r.text
        r = httpx.get(
            f"{gw}/v1/admin/pipelines/large-payments/versions",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert [(v["version"], v["serving"]) for v in r.json()] == [(1, True)], r.text
        vs = eb(home, "versions", "large-payments")
        assert vs.returncode == 0 and "payments.yaml" in vs.stdout, vs.stderr
        got = eb(home, "get", "large-payments")
        assert (
            got.returncode == 0
            and got.stdout == (ROOT / "examples/payments/payments.yaml").read_text()
        ), got.stderr

        phase("payments flow")

        # A full restart: the whole stack goes down; `up` redeploys every pipeline from Redis
        # (the embedded broker lost its topics: they are created again).
        assert eb(home, "down").returncode == 0
        phase("down")
        up = eb(home, "up", "--num-cpus", "1")
        assert up.returncode == 0, up.stderr
        phase("up again")
        assert "restored 1 of 1 pipeline(s): large-payments" in up.stdout, up.stdout
        # the same addresses as before the restart (the ports had been freed by `down`)
        again = json.loads((home / "stack.json").read_text())
        assert (again["gateway_http"], again["gateway_grpc"], again["kafka_bootstrap"]) == (
            stack["gateway_http"],
            stack["gateway_grpc"],
            stack["kafka_bootstrap"],
        ), up.stderr
        ls = eb(home, "list")
        assert "large-payments" in ls.stdout and "RUNNING" in ls.stdout
        pub = eb(home, "publish", "payments", "--file", "examples/payments/events.jsonl")
        assert pub.returncode == 0, pub.stderr
        tail = eb(
            home,
            "tail",
            "payments-large",
            "--from-beginning",
            "--max",
            "3",
            "--timeout",
            "60",
            "--json",
        )
        assert sorted(json.loads(line)["id"] for line in tail.stdout.splitlines()) == [
            "demo-1",
            "demo-3",
            "demo-5",
        ]

        bad = eb(home, "delete", "no-such")
        assert bad.returncode == 1 and "no pipeline named 'no-such' is deployed" in bad.stderr
        assert eb(home, "delete", "large-payments").returncode == 0
        assert "no pipelines deployed" in eb(home, "list").stdout
    finally:
        phase("restart checked")
        down = eb(home, "down")
        phase("down")
    assert down.returncode == 0 and "stopped: gateway, ray, kafka, redis" in down.stdout
    assert not (home / "stack.json").exists()
    assert not re.search(rf":{ray_port}\s", listening_ports())


def test_up_adopts_given_addresses_and_starts_nothing(
    tmp_path: Path, kafka_bootstrap: str, redis_url: str
) -> None:
    home = tmp_path / "eb"
    import ray

    ray_address = ray.get_runtime_context().gcs_address if ray.is_initialized() else "127.0.0.1:1"
    res = eb(
        home,
        "up",
        "--kafka-bootstrap",
        kafka_bootstrap,
        "--redis-url",
        redis_url,
        "--ray-address",
        ray_address,
        "--no-gateway",
    )
    stack = json.loads((home / "stack.json").read_text())
    assert stack["owned"] == {}
    assert stack["kafka_bootstrap"] == kafka_bootstrap and stack["redis_url"] == redis_url
    assert res.returncode == 0, res.stderr
    down = eb(home, "down")
    assert down.returncode == 0 and down.stdout.strip() == "nothing to stop"
