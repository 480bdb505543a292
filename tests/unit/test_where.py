"""Stable ports (``eventbus up``), ``eventbus url`` and ``eventbus logs`` without a stack:
real sockets, real files in Ray's log format, the CLI through typer's runner."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eventbus._internal.logs import actor_logs, pipeline_logs, tail_lines
from eventbus._internal.ports import pick_port, port_free, remembered_ports
from eventbus.cli import app

runner = CliRunner()


def _listening(reuse: bool = False) -> socket.socket:
    s = socket.socket()
    if reuse:  # as uvicorn's listener: its connections' sockets carry it too
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_port_with_connections_in_time_wait_is_free() -> None:
    # the server side closes first: its end of the connection lingers in TIME_WAIT on the
    # server's port after the server is gone (what `down` leaves after HTTP traffic)
    server = _listening(reuse=True)
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()
    client.recv(1)  # the FIN
    client.close()
    server.close()
    plain = socket.socket()
    with pytest.raises(OSError):  # what the old probe (no SO_REUSEADDR) saw: "taken"
        plain.bind(("127.0.0.1", port))
    plain.close()
    assert port_free(port)


def test_pick_port_keeps_the_last_port_then_the_default_and_says_when_it_moves(
    tmp_path: Path,
) -> None:
    taken = _listening()
    try:
        busy = taken.getsockname()[1]
        # a part with no default and nothing remembered: any free port, no note
        port, note = pick_port(tmp_path, "kafka")
        assert note is None and port_free(port)
        assert remembered_ports(tmp_path)["kafka"] == port
        # the remembered port is kept while free
        assert pick_port(tmp_path, "kafka") == (port, None)
        # taken: another port, and a note naming the part, the port and why
        (tmp_path / "ports.json").write_text(json.dumps({"kafka": busy}))
        moved, note = pick_port(tmp_path, "kafka")
        assert moved != busy
        assert note is not None
        assert f"kafka port {busy} (it had last time) is taken by another process" in note
        assert f"using {moved}" in note
        # an option given and taken: said so too
        _, note = pick_port(tmp_path, "gateway HTTP", busy)
        assert note is not None and "(given with the option)" in note
    finally:
        taken.close()


def test_pick_port_falls_back_to_the_default_before_a_random_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = _listening()
    free = _listening()
    default = free.getsockname()[1]
    free.close()
    try:
        import eventbus._internal.ports as ports

        monkeypatch.setitem(ports.DEFAULT_PORTS, "gateway HTTP", default)
        (tmp_path / "ports.json").write_text(json.dumps({"gateway HTTP": taken.getsockname()[1]}))
        port, note = pick_port(tmp_path, "gateway HTTP")
        assert port == default
        assert note is not None and "(it had last time)" in note
    finally:
        taken.close()


def test_remembered_ports_ignore_a_corrupt_file(tmp_path: Path) -> None:
    (tmp_path / "ports.json").write_text("{not json")
    assert remembered_ports(tmp_path) == {}
    (tmp_path / "ports.json").write_text(json.dumps({"a": "x", "b": 70000, "c": 8080}))
    assert remembered_ports(tmp_path) == {"c": 8080}


def _worker(logs: Path, name: str, actor: str, body: str) -> Path:
    path = logs / f"worker-{name}-01000000-{abs(hash(name)) % 99999}.err"
    path.write_text(f":job_id:01000000\n:actor_name:{actor}\n{body}")
    return path


def test_actor_and_pipeline_logs_are_found_by_rays_markers(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "serve").mkdir(parents=True)
    ctl = _worker(logs, "a", "Controller", "pipeline 'x' is degraded\n")
    rep = _worker(logs, "b", "ServeReplica:eventbus-orders:pipeline", "step failed\n")
    _worker(logs, "c", "ServeReplica:eventbus-orders-2:pipeline", "other\n")
    _worker(logs, "d", "ServeController", "serve\n")
    serve_log = logs / "serve" / "replica_eventbus-orders_pipeline_abc.log"
    serve_log.write_text("INFO replica\n")
    assert actor_logs(logs, "Controller") == [ctl]
    found = pipeline_logs(logs, "eventbus-orders")
    assert set(found) == {rep, serve_log}  # not the pipeline 'orders-2'
    assert tail_lines(ctl, 10) == ["pipeline 'x' is degraded"]  # Ray's markers left out


def test_tail_lines_reads_only_the_end_of_a_large_file(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_text("".join(f"line {i}\n" for i in range(200_000)))
    assert tail_lines(path, 3) == ["line 199997", "line 199998", "line 199999"]
    assert tail_lines(tmp_path / "big.log", 1) == ["line 199999"]


def _stack(home: Path, **extra: object) -> None:
    home.mkdir(parents=True, exist_ok=True)
    doc = {
        "ray_address": "127.0.0.1:6379",
        "kafka_bootstrap": "127.0.0.1:9092",
        "redis_url": "redis://:pw@127.0.0.1:6380/0",
        "gateway_http": "http://127.0.0.1:8080",
        "gateway_grpc": "127.0.0.1:50051",
        **extra,
    }
    (home / "stack.json").write_text(json.dumps(doc))


def test_url_prints_the_recorded_addresses(tmp_path: Path) -> None:
    home = tmp_path / "eb"
    env = {"EVENTBUS_HOME": str(home)}
    none = runner.invoke(app, ["url", "gateway"], env=env)
    assert none.exit_code == 1 and "eventbus up" in none.output
    _stack(home)
    for what, expect in (
        ("gateway", "http://127.0.0.1:8080"),
        ("dashboard", "http://127.0.0.1:8080/dashboard"),
        ("metrics", "http://127.0.0.1:8080/metrics"),
        ("grpc", "127.0.0.1:50051"),
        ("kafka", "127.0.0.1:9092"),
        ("ray", "127.0.0.1:6379"),
    ):
        res = runner.invoke(app, ["url", what], env=env)
        assert res.exit_code == 0 and res.output == expect + "\n", (what, res.output)
    bad = runner.invoke(app, ["url", "gatway"], env=env)
    assert bad.exit_code == 2 and "(did you mean 'gateway'?)" in bad.output
    _stack(home, gateway_http=None, gateway_grpc=None)
    res = runner.invoke(app, ["url", "dashboard"], env=env)
    assert res.exit_code == 1 and "--no-gateway" in res.output


def test_logs_shows_the_gateway_log_and_names_what_is_missing(tmp_path: Path) -> None:
    home = tmp_path / "eb"
    env = {"EVENTBUS_HOME": str(home)}
    none = runner.invoke(app, ["logs", "gateway"], env=env)
    assert none.exit_code == 1 and "no gateway started by `eventbus up`" in none.output
    log = tmp_path / "gateway.log"
    log.write_text("".join(f"l{i}\n" for i in range(100)) + "pipeline 'p': secret MISSING\n")
    _stack(home, owned={"gateway": {"pid": 1, "log": str(log)}})
    res = runner.invoke(app, ["logs", "gateway", "-n", "2"], env=env)
    assert res.exit_code == 0 and res.output == "l99\npipeline 'p': secret MISSING\n"
    ray_logs = tmp_path / "ray-logs"
    ray_logs.mkdir()
    missing = runner.invoke(app, ["logs", "orders", "--ray-logs", str(ray_logs)], env=env)
    assert missing.exit_code == 1
    assert "no log of pipeline 'orders'" in missing.output
    assert "eventbus list" in missing.output
    gone = runner.invoke(app, ["logs", "controller", "--ray-logs", str(tmp_path / "no")], env=env)
    assert gone.exit_code == 1 and "no Ray session logs at" in gone.output
    for hostile in ("../../etc", "x" * 5000, "Orders", "a/b"):
        res = runner.invoke(app, ["logs", hostile, "--ray-logs", str(ray_logs)], env=env)
        assert (
            res.exit_code == 2 and "neither gateway, controller nor a pipeline name" in res.output
        )
        assert len(res.output) < 600


def _host_replica(logs: Path, host: str, body: str) -> Path:
    return _worker(logs, f"host-{host}", f"ServeReplica:eventbus-host-{host}:host", body)


_SHARED = (
    "INFO host 'edge': pipeline 'orders' started\n"
    "INFO host 'edge': pipeline 'orders-eu' started\n"
    "INFO kafka source orders-eu: consuming in as group 'eventbus-orders-eu'\n"
    "ERROR sources of pipeline 'orders' stopped\n"
    "Traceback (most recent call last):\n"
    '  File "x.py", line 1, in run\n'
    "ValueError: bad topic\n"
    "INFO an unrelated line\n"
    '{"level":"warning","message":"step failed","pipeline":"orders","step":"score"}\n'
    "WARNING kafka source orders-eu: commit skipped\n"
)


def test_a_shared_hosts_log_gives_each_member_its_own_lines(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "serve").mkdir(parents=True)
    edge = _host_replica(logs, "edge", _SHARED)
    other = _host_replica(logs, "core", "INFO host 'core': pipeline 'billing' started\n")
    serve_log = logs / "serve" / "replica_eventbus-host-edge_host_abc.log"
    serve_log.write_text("INFO replica\n")
    _worker(logs, "own", "ServeReplica:eventbus-orders:pipeline", "own\n")
    from eventbus._internal.logs import host_logs, member_lines

    assert host_logs(logs) == {"edge": [edge, serve_log], "core": [other]}
    assert host_logs(logs, "core") == {"core": [other]}
    assert host_logs(logs, "nowhere") == {}
    assert member_lines(edge, "orders", 100) == [
        "INFO host 'edge': pipeline 'orders' started",
        "ERROR sources of pipeline 'orders' stopped",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in run',
        "ValueError: bad topic",  # the traceback goes with its line
        '{"level":"warning","message":"step failed","pipeline":"orders","step":"score"}',
    ]  # never orders-eu's
    assert member_lines(edge, "orders-eu", 2) == [
        "INFO kafka source orders-eu: consuming in as group 'eventbus-orders-eu'",
        "WARNING kafka source orders-eu: commit skipped",
    ]
    assert member_lines(edge, "billing", 10) == []


def test_logs_of_a_shared_host_member_shows_its_lines_and_names_the_shared_file(
    tmp_path: Path,
) -> None:
    env = {"EVENTBUS_HOME": str(tmp_path / "eb")}  # no stack recorded: found by the name
    logs = tmp_path / "logs"
    logs.mkdir()
    edge = _host_replica(logs, "edge", _SHARED)
    res = runner.invoke(app, ["logs", "orders-eu", "--ray-logs", str(logs)], env=env)
    assert res.exit_code == 0, res.output
    assert "pipeline 'orders-eu' runs in shared host 'edge'" in res.output
    assert "shared with the host's other members" in res.output
    assert f"==> {edge} (shared host 'edge', lines naming 'orders-eu') <==" in res.output
    assert "WARNING kafka source orders-eu: commit skipped" in res.output
    assert "pipeline 'orders' stopped" not in res.output
    files = runner.invoke(app, ["logs", "orders", "--files", "--ray-logs", str(logs)], env=env)
    assert files.exit_code == 0 and str(edge) in files.output
    assert "runs in shared host 'edge'" in files.output
    missing = runner.invoke(app, ["logs", "billing", "--ray-logs", str(logs)], env=env)
    assert missing.exit_code == 1 and "no log of pipeline 'billing'" in missing.output


@pytest.mark.redis
def test_logs_of_a_member_the_stack_records_is_never_silent(tmp_path: Path, redis_url: str) -> None:
    from eventbus._internal import keys
    from eventbus._internal.redis_client import connect

    home = tmp_path / "eb"
    redis_url = redis_url.rsplit("/", 1)[0] + "/13"  # a database of its own: no stack's records
    _stack(home, redis_url=redis_url)
    env = {"EVENTBUS_HOME": str(home)}
    logs = tmp_path / "logs"
    logs.mkdir()
    edge = _host_replica(logs, "edge", "INFO replica up\n")
    _host_replica(logs, "core", "INFO pipeline 'quiet' named in another host's log\n")
    redis = connect(redis_url, decode_responses=True)
    redis.hset(keys.HOSTS, "edge", json.dumps({"members": {"quiet": {"stamp": "1"}}}))
    try:
        res = runner.invoke(app, ["logs", "quiet", "--ray-logs", str(logs)], env=env)
        assert res.exit_code == 0, res.output
        assert "pipeline 'quiet' runs in shared host 'edge'" in res.output  # the stack's record
        assert f"==> {edge} (shared host 'edge', lines naming 'quiet') <==" in res.output
        assert "(no line names 'quiet' yet; the whole file is the host's log)" in res.output
        assert "another host's log" not in res.output
        redis.hset(keys.HOSTS, "gone", json.dumps({"members": {"lost": {}}}))
        lost = runner.invoke(app, ["logs", "lost", "--ray-logs", str(logs)], env=env)
        assert lost.exit_code == 1
        assert (
            "pipeline 'lost' runs in shared host 'gone', whose replicas have no log" in lost.output
        )
    finally:
        redis.delete(keys.HOSTS)
