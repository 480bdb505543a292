"""HTTP ingress: the EventBus gateway against a bare uvicorn endpoint and Ray Serve's HTTP proxy.

wrk (Debian's; ``make bench`` installs it) drives each target for ``--seconds`` at ``-c16``
and ``-c64`` (one wrk thread), ``--rounds`` times, alternating targets:

* ``bare``: uvicorn + FastAPI, one worker, an endpoint that reads the body and answers 202;
* ``serve_proxy``: Ray Serve's own HTTP proxy in front of a deployment doing the same
  filter + convert on the JSON body (the path Ray Serve users take);
* ``async``: ``POST /v1/pipelines/<p>/events`` on the gateway, binary-mode CloudEvents,
  answered 202 once written to the pipeline's ingress topic and acked (the replica consumes
  that topic meanwhile, on the same two cores);
* ``sync``: the same with ``?wait=true``: micro-batched into one Serve call, the output event
  in the response.

Last line: one JSON object with req/s and p50/p99 per target and concurrency (medians of
rounds) and the ratios the targets are set on.

Run: ``.venv/bin/python benchmarks/http_ingress.py [--seconds 8] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault(
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", "0"
)  # as `eventbus up` runs Ray
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import httpx

from eventbus._internal.redis_service import start_redis
from eventbus._internal.services import free_port, start_tansu

BODY = '{"amount": 500, "currency": "USD", "order": 1}'
CE_HEADERS = {
    "content-type": "application/json",
    "ce-specversion": "1.0",
    "ce-id": "w1",
    "ce-source": "/wrk",
    "ce-type": "payment.created",
}

BARE_APP = """
from fastapi import FastAPI, Request
from fastapi.responses import Response
app = FastAPI()

@app.post("/noop")
async def noop(request: Request) -> Response:
    await request.body()
    return Response(b'{"accepted": 1}', status_code=202, media_type="application/json")
"""

PIPELINE = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  sources: [{{http: {{mode: sync}}}}]  # sync answers ?wait=true; ?wait=false: 202
  steps:
    - id: only_large
      filter: "type == 'payment.created' && data.amount > 100 && data.currency in ['CNY', 'USD']"
    - id: to_cny
      convert: {{set: {{data.amount_cny: "double(data.amount) * 7.1", type: "'payment.large'"}}}}
  sink: {{kafka: {{topic: {sink}, create: {{partitions: 4}}}}}}
  serving: {{replicas: 1}}
"""


def wrk(url: str, connections: int, seconds: int, work: Path) -> dict[str, float]:
    script = work / "post.lua"
    lines = ['wrk.method = "POST"', f"wrk.body = '{BODY}'"]
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in CE_HEADERS.items()]
    script.write_text("\n".join(lines) + "\n")
    proc = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    out = proc.stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]

    def pct(label: str) -> float:
        m = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        assert m, out
        value, unit = float(m.group(1)), m.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    socket_errors = re.search(r"Socket errors:.*", out)
    return {
        "rps": rps,
        "p50_ms": pct("50"),
        "p99_ms": pct("99"),
        "non_2xx": int(errors.group(1)) if errors else 0,
        "socket_errors": socket_errors.group(0) if socket_errors else "",  # type: ignore[dict-item]
    }


def wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def check(url: str, expect: int) -> None:
    r = httpx.post(url, content=BODY, headers=CE_HEADERS, timeout=30)
    if r.status_code != expect:
        msg = f"{url} answered {r.status_code} ({r.text[:200]}); expected {expect}"
        raise RuntimeError(msg)


def start_serve_baseline() -> str:
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    port = free_port()
    serve.start(
        http_options={"host": "127.0.0.1", "port": port},
        logging_config={"log_level": "WARNING", "enable_access_log": False},
    )

    @serve.deployment(
        ray_actor_options={"num_cpus": 0},
        logging_config={"log_level": "WARNING", "enable_access_log": False},
    )
    class FilterConvert:
        async def __call__(self, request: Request) -> Response:
            import orjson

            data = orjson.loads(await request.body())
            if (
                request.headers.get("ce-type") == "payment.created"
                and data["amount"] > 100
                and data["currency"] in ("CNY", "USD")
            ):
                data["amount_cny"] = float(data["amount"]) * 7.1
                return Response(
                    orjson.dumps(data), status_code=200, headers={"ce-type": "payment.large"}
                )
            return Response(status_code=204)

    serve.run(FilterConvert.bind(), name="serve-baseline", route_prefix="/rs")
    return f"http://127.0.0.1:{port}/rs"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, nargs="+", default=[16, 64])
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: `apt-get install -y wrk` (make bench does it)")
    work = Path(tempfile.mkdtemp(prefix="eb-http-bench-"))
    tansu = start_tansu(log_dir=work)
    redis = start_redis(data_dir=work / "redis")
    procs: list[subprocess.Popen[bytes]] = []
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        namespace="eventbus",
        logging_level="ERROR",
        log_to_driver=False,
    )
    results: dict[str, dict[int, list[dict[str, float]]]] = {}
    try:
        # Ray Serve's own proxy first: the EventBus controller runs Serve without a proxy.
        from ray import serve

        rs_url = start_serve_baseline()
        check(rs_url, 200)
        for _ in range(args.rounds):
            for c in args.connections:
                results.setdefault("serve_proxy", {}).setdefault(c, []).append(
                    wrk(rs_url, c, args.seconds, work)
                )
        print(
            "serve_proxy:",
            {c: [round(r["rps"]) for r in v] for c, v in results["serve_proxy"].items()},
            flush=True,
        )
        serve.shutdown()

        (work / "bare_app.py").write_text(BARE_APP)
        bare_port = free_port()
        with open(work / "bare.log", "ab") as log:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "uvicorn",
                        "bare_app:app",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(bare_port),
                        "--log-level",
                        "warning",
                        "--no-access-log",
                    ],
                    cwd=work,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        bare_url = f"http://127.0.0.1:{bare_port}/noop"
        wait_http(f"http://127.0.0.1:{bare_port}/docs")

        from eventbus.serving import EventBusClient

        client = EventBusClient(None, tansu.address, redis.address)
        path = work / "httpbench.yaml"
        path.write_text(PIPELINE.format(name="httpbench", sink="httpbench-out"))
        client.deploy(path)
        gw_port = free_port()
        with open(work / "gateway.log", "ab") as log:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "eventbus.cli",
                        "gateway",
                        "--host",
                        "127.0.0.1",
                        "--http-port",
                        str(gw_port),
                        "--grpc-port",
                        "0",
                        "--ray-address",
                        ray.get_runtime_context().gcs_address,
                        "--kafka-bootstrap",
                        tansu.address,
                        "--redis-url",
                        redis.address,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        wait_http(f"http://127.0.0.1:{gw_port}/healthz")
        events_url = f"http://127.0.0.1:{gw_port}/v1/pipelines/httpbench/events"
        async_url = events_url + "?wait=false"
        sync_url = events_url + "?wait=true"
        check(bare_url, 202)
        check(async_url, 202)
        check(sync_url, 200)
        for rnd in range(args.rounds):
            for name, url in (("bare", bare_url), ("async", async_url), ("sync", sync_url)):
                for c in args.connections:
                    results.setdefault(name, {}).setdefault(c, []).append(
                        wrk(url, c, args.seconds, work)
                    )
            print(
                f"round {rnd}:",
                {
                    n: {c: round(v[c][-1]["rps"]) for c in v}
                    for n, v in results.items()
                    if n != "serve_proxy"
                },
                flush=True,
            )
    finally:
        for p in procs:
            p.terminate()
            p.wait(15)
        ray.shutdown()
        tansu.stop()
        redis.stop()

    summary: dict[str, Any] = {}
    for name, by_c in results.items():
        for c, runs in by_c.items():
            summary[f"{name}_c{c}"] = {
                "rps": round(statistics.median(r["rps"] for r in runs)),
                "p50_ms": round(statistics.median(r["p50_ms"] for r in runs), 2),
                "p99_ms": round(statistics.median(r["p99_ms"] for r in runs), 2),
                "non_2xx": sum(int(r["non_2xx"]) for r in runs),
            }
    ratios = {}
    for c in args.connections:
        bare = summary[f"bare_c{c}"]["rps"]
        ratios[f"async_vs_bare_c{c}"] = round(summary[f"async_c{c}"]["rps"] / bare, 3)
        ratios[f"sync_vs_bare_c{c}"] = round(summary[f"sync_c{c}"]["rps"] / bare, 3)
        ratios[f"sync_vs_serve_proxy_c{c}"] = round(
            summary[f"sync_c{c}"]["rps"] / summary[f"serve_proxy_c{c}"]["rps"], 1
        )
    print(
        json.dumps(
            {
                "benchmark": "http_ingress",
                "seconds": args.seconds,
                "rounds": args.rounds,
                **summary,
                "ratios": ratios,
            }
        )
    )


if __name__ == "__main__":
    main()
