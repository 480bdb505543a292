"""The test hosts fixture itself (``tests/fixtures/netns_hosts.py``): hosts reach each other
and are reached from the root namespace over the bridge, a cut stops their traffic and a heal
restores it (an open TCP connection survives), netem delays it, ``kill_all`` ends every process
of a host, and teardown (and the stale-run cleanup) leaves no namespace, link or process."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from tests.fixtures import netns_hosts
from tests.fixtures.netns_hosts import TestHosts, make_hosts_now

pytestmark = [pytest.mark.integration]

# A TCP echo server on the given address and port: one line per connection is echoed back,
# connections served one after another; "ready" on stdout once it listens.
_ECHO = """
import socket, sys
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    with conn, conn.makefile("rwb") as f:
        for line in f:
            f.write(line); f.flush()
"""
# Connect to address:port, send one line, print what comes back.
_CLIENT = """
import socket, sys
timeout = float(sys.argv[4]) if len(sys.argv) > 4 else 10
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=timeout) as s:
    s.sendall(b"hello from " + sys.argv[3].encode() + b"\\n")
    print(s.makefile("rb").readline().decode().strip())
"""
PORT = 7400


@pytest.fixture(scope="module")
def hosts(make_hosts: Callable[[int], TestHosts]) -> TestHosts:
    return make_hosts(2)


@pytest.fixture(scope="module")
def echo(hosts: TestHosts) -> Iterator[subprocess.Popen[bytes]]:
    """An echo server on host 1."""
    proc = hosts[1].popen(
        [sys.executable, "-c", _ECHO, hosts[1].address, str(PORT)], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"
    yield proc
    proc.kill()
    proc.wait()
    proc.stdout.close()


def _roundtrip(sock: socket.socket, text: bytes, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    sock.sendall(text + b"\n")
    got = b""
    while not got.endswith(b"\n"):
        chunk = sock.recv(100)
        if not chunk:
            raise ConnectionError("closed")
        got += chunk
    return got.strip()


def test_hosts_have_their_own_addresses_in_a_private_subnet(hosts: TestHosts) -> None:
    assert hosts.subnet.is_private
    assert [h.address for h in hosts] == [str(hosts.subnet.network_address + i) for i in (1, 2)]
    for host in hosts:
        out = subprocess.run(
            ["ip", "-n", host.name, "-4", "-o", "addr"], capture_output=True, text=True, check=True
        ).stdout
        assert f"{host.address}/24" in out
        assert re.search(r"\blo\b.*127\.0\.0\.1", out)  # loopback up inside the host
    # the root namespace holds none of the hosts' addresses, only the bridge's
    root = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    assert hosts.gateway in root and hosts[0].address + "/" not in root


def test_host_to_host_and_root_to_host(hosts: TestHosts, echo: subprocess.Popen[bytes]) -> None:
    out = hosts[0].run([sys.executable, "-c", _CLIENT, hosts[1].address, str(PORT), "h0"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "hello from h0"
    # the echo server is bound to host 1's address, not reachable on host 0's loopback
    out = hosts[0].run([sys.executable, "-c", _CLIENT, "127.0.0.1", str(PORT), "h0"])
    assert out.returncode != 0 and "ConnectionRefused" in out.stderr
    with socket.create_connection((hosts[1].address, PORT), timeout=10) as s:
        assert _roundtrip(s, b"root", 10) == b"root"


def test_cut_stops_traffic_and_heal_restores_it(
    hosts: TestHosts, echo: subprocess.Popen[bytes]
) -> None:
    with socket.create_connection((hosts[1].address, PORT), timeout=10) as s:
        assert _roundtrip(s, b"before", 10) == b"before"
        hosts[1].cut()
        try:
            with pytest.raises(TimeoutError):  # the line is in flight, nothing comes back
                _roundtrip(s, b"during", 1.5)
            with pytest.raises(OSError):  # nor does a new connection get through
                socket.create_connection((hosts[1].address, PORT), timeout=1.5)
            argv = [sys.executable, "-c", _CLIENT, hosts[1].address, str(PORT), "x", "1.5"]
            out = hosts[0].run(argv)
            assert out.returncode != 0
        finally:
            hosts[1].heal()
        # the open connection survives the cut: TCP retransmits "during" after the heal
        s.settimeout(30)
        assert s.makefile("rb").readline().strip() == b"during"
    assert echo.poll() is None  # a cut host's processes keep running


def test_netem_loss_drops_and_clears(hosts: TestHosts, echo: subprocess.Popen[bytes]) -> None:
    with socket.create_connection((hosts[1].address, PORT), timeout=10) as s:
        hosts[1].netem(loss_pct=100)
        try:
            with pytest.raises(TimeoutError):
                _roundtrip(s, b"lost", 1.5)
            # the host's own loopback is spared
            out = hosts[1].run([sys.executable, "-c", _CLIENT, "127.0.0.1", "1", "x", "1"])
            assert "ConnectionRefused" in out.stderr
        finally:
            hosts[1].netem()
        s.settimeout(30)
        assert s.makefile("rb").readline().strip() == b"lost"  # retransmitted once cleared
        hosts[1].netem(loss_pct=30)  # lossy, not cut: retransmissions get every line through
        try:
            for i in range(5):
                assert _roundtrip(s, b"%d" % i, 30) == b"%d" % i
        finally:
            hosts[1].netem()
    with pytest.raises(ValueError, match="loss"):
        hosts[1].netem(loss_pct=101)


def test_netem_delays_each_way_or_names_the_missing_qdisc(
    hosts: TestHosts, echo: subprocess.Popen[bytes]
) -> None:
    with socket.create_connection((hosts[1].address, PORT), timeout=10) as s:
        try:
            hosts[1].netem(delay_ms=150)
        except RuntimeError as e:  # a kernel without netem (this CI's): the error says so
            assert "CONFIG_NET_SCH_NETEM" in str(e)
            assert _roundtrip(s, b"no delay", 10) == b"no delay"  # and nothing was left set
            return
        try:
            start = time.monotonic()
            assert _roundtrip(s, b"slow", 30) == b"slow"
            assert time.monotonic() - start >= 0.3  # 150 ms out and 150 ms back, at least
        finally:
            hosts[1].netem()
        assert _roundtrip(s, b"fast", 10) == b"fast"


def test_kill_all_ends_every_process_of_a_host(hosts: TestHosts) -> None:
    procs = [hosts[0].popen(["sleep", "600"]) for _ in range(2)]
    # a grandchild in its own session too: kill_all finds it by namespace, not by parent
    sh = hosts[0].popen(["sh", "-c", "setsid sleep 600 & wait"])
    deadline = time.monotonic() + 30
    while len(hosts[0].pids()) < 4:  # the two sleeps, sh and its setsid sleep
        assert time.monotonic() < deadline, hosts[0].pids()
        time.sleep(0.05)
    hosts[0].kill_all()
    assert hosts[0].pids() == []
    for p in [*procs, sh]:
        assert p.wait(10) == -9


def _leftovers(names: list[str]) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [n for n in names if re.search(rf"\b{n}\b", listed + links)]


def test_teardown_leaves_nothing_behind() -> None:
    hosts = make_hosts_now(2)
    names = [hosts.bridge, *(h.name for h in hosts), *(h.link for h in hosts)]
    assert _leftovers(names) == names
    proc = hosts[1].popen(["sleep", "600"])
    hosts.teardown()
    assert proc.wait(10) == -9
    assert _leftovers(names) == []
    hosts.teardown()  # twice is harmless


def test_a_crashed_runs_leftovers_are_cleaned() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process holds now: the "crashed" pytest's
    tag = f"{netns_hosts.PREFIX}{dead.pid}s0"
    subprocess.run(["ip", "netns", "add", f"{tag}h0"], check=True)
    subprocess.run(["ip", "link", "add", f"{tag}br", "type", "bridge"], check=True)
    veth = ["ip", "link", "add", f"{tag}v0", "type", "veth", "peer", "name", f"{tag}p0"]
    subprocess.run(veth, check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", f"{tag}h0", "sleep", "600"])
    removed = netns_hosts.cleanup_stale()
    assert {f"{tag}h0", f"{tag}br", f"{tag}v0"} <= set(removed)
    assert _leftovers([f"{tag}h0", f"{tag}br", f"{tag}v0", f"{tag}p0"]) == []
    assert sleeper.wait(10) == -9
    # this run's own hosts (a live pid) are not touched
    mine = make_hosts_now(1)
    try:
        assert mine[0].name.startswith(f"{netns_hosts.PREFIX}{os.getpid()}s")
        assert mine[0].name not in netns_hosts.cleanup_stale()
        assert _leftovers([mine[0].name]) == [mine[0].name]
    finally:
        mine.teardown()


def test_missing_root_fails_naming_the_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.fail.Exception, match="CAP_NET_ADMIN.*fix: run the suite as root"):
        make_hosts_now(1)
    monkeypatch.setattr(netns_hosts.shutil, "which", lambda tool: None)
    with pytest.raises(pytest.fail.Exception, match="`ip` is not installed.*iproute2"):
        make_hosts_now(1)


@pytest.mark.parametrize("n", [0, -1, 251])
def test_a_host_count_out_of_range_is_refused(n: int) -> None:
    with pytest.raises(ValueError, match=rf"make_hosts\({n}\): between 1 and 250 hosts"):
        make_hosts_now(n)
