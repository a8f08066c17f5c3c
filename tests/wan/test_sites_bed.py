"""The wide-area bed (tests/testbed/sites.py, issue 28): sites behind gateways
whose hosts reach nothing outside but through them, a WAN with its own latency
(the relay in the router namespace) and bandwidth (tbf), everything removed.

Needs root, iproute2, nftables and openssh-server; skipped otherwise.
"""
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid

import pytest

import testbed

pytestmark = pytest.mark.testbed

RTT_MS = 100
RATE_MBIT = 20
SITES = {"sa": ["sa01", "sa02"], "sb": ["sb01", "sb02"]}
GATEWAYS = {"sa": "ga", "sb": "gb"}

# Run on a host: connect, and print errno name and seconds taken (or OK and
# the seconds until the server's first bytes, e.g. sshd's banner).
PROBE = r"""
import errno, socket, sys, time
t = time.monotonic()
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
    s.recv(64)
    print("OK", time.monotonic() - t)
except OSError as e:
    print(errno.errorcode.get(e.errno, "timeout"), time.monotonic() - t)
"""

# Run on a gateway against the head's measuring server: round trips, then a
# bulk send; prints the round trip times and the seconds the bulk took.
CLIENT = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(5):
    t = time.monotonic(); s.sendall(b"p"); s.recv(1); rtts.append(time.monotonic() - t)
size = int(sys.argv[3])
t = time.monotonic()
s.sendall(b"b" * size)
s.recv(1)
print(" ".join("%.4f" % r for r in rtts), time.monotonic() - t)
"""


@pytest.fixture(scope="module")
def bed():
    if os.getuid() != 0:
        pytest.skip("the test bed needs root")
    missing = testbed.sites_requirements_missing()
    if missing:
        pytest.skip(missing)
    b = testbed.TestBed()
    try:
        b.up_sites(SITES, gateways=GATEWAYS, wan_rate="%dmbit" % RATE_MBIT, wan_rtt_ms=RTT_MS)
        b.add_user("gxpw" + uuid.uuid4().hex[:6])
        yield b
    finally:
        b.teardown()


def probe(bed, src, ip, port=22):
    r = bed.host(src).exec(["python3", "-c", PROBE, ip, str(port)], capture_output=True,
                           text=True, timeout=60)
    what, seconds = r.stdout.split()
    return what, float(seconds)


def test_a_site_host_reaches_its_gateway_and_nothing_else(bed):
    ip = {n: h.ip for n, h in bed.hosts.items()}
    assert probe(bed, "sa01", ip["sa02"])[0] == "OK"
    assert probe(bed, "sa01", ip["ga"])[0] == "OK"
    for target in (ip["sb01"], ip["gb"], bed.gateway_ip):
        what, seconds = probe(bed, "sa01", target)
        assert what == "ENETUNREACH" and seconds < 2, (target, what, seconds)


def test_gateways_reach_each_other_and_the_head_but_no_other_site(bed):
    ip = {n: h.ip for n, h in bed.hosts.items()}
    what, seconds = probe(bed, "ga", ip["gb"])
    # sshd's banner comes half a round trip after connect(): the relay's delay
    assert what == "OK" and seconds >= 0.8 * RTT_MS / 2000, seconds
    what, seconds = probe(bed, "ga", ip["sb01"])
    assert what == "ENETUNREACH" and seconds < 0.5, (what, seconds)
    what, _ = probe(bed, "ga", bed.gateway_ip, 9)    # nothing listens: refused at once
    assert what in ("ECONNRESET", "ECONNREFUSED")


def test_the_head_reaches_gateways_only(bed):
    for name in ("sa01", "sb02"):
        t = time.monotonic()
        with pytest.raises(OSError):
            socket.create_connection((bed.host(name).ip, 22), timeout=20)
        assert time.monotonic() - t < 2
    user = next(iter(bed.users))
    r = bed.run_as(user, ["ssh", "sa01", "hostname"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 255 and "unreachable" in r.stderr.lower(), r.stderr
    r = bed.run_as(user, ["ssh", "ga", "ssh sa01 hostname"], capture_output=True, text=True,
                   timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "sa01", r.stderr


def _measuring_server(sock, size):
    conn, _ = sock.accept()
    with conn:
        for _ in range(5):
            conn.sendall(conn.recv(1))
        got = 0
        while got < size:
            data = conn.recv(1 << 16)
            if not data:
                return
            got += len(data)
        conn.sendall(b"k")


def test_a_round_trip_takes_the_rtt_and_a_stream_the_rate(bed):
    size = RATE_MBIT * 1000 * 1000 // 8      # one second's worth at the WAN rate
    sock = socket.socket()
    sock.bind((bed.gateway_ip, 0))
    sock.listen(1)
    server = threading.Thread(target=_measuring_server, args=(sock, size), daemon=True)
    server.start()
    try:
        r = bed.host("ga").exec(["python3", "-c", CLIENT, bed.gateway_ip,
                                 str(sock.getsockname()[1]), str(size)],
                                capture_output=True, text=True, timeout=120)
    finally:
        server.join(60)
        sock.close()
    assert r.returncode == 0, r.stderr
    *rtts, bulk = [float(x) for x in r.stdout.split()]
    rtt = statistics.median(rtts)
    assert 0.8 * RTT_MS / 1000 <= rtt <= 3 * RTT_MS / 1000, rtts
    mbit = size * 8 / (bulk - rtt) / 1e6
    assert 0.5 * RATE_MBIT <= mbit <= 1.3 * RATE_MBIT, (mbit, bulk)


def _links_of(tag):
    return [d for d in os.listdir("/sys/class/net") if tag in d]


def _netns_of(tag):
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if tag in line]


def test_teardown_and_sweep_remove_everything():
    """A sites bed torn down, and one whose owner died (swept): no namespace,
    link, route or relay of it is left."""
    if os.getuid() != 0 or testbed.sites_requirements_missing():
        pytest.skip("the test bed needs root")
    for crash in (False, True):
        code = ("import os, sys; sys.path.insert(0, %r); import testbed\n"
                "b = testbed.TestBed()\n"
                "b.up_sites({'sa': ['sa01'], 'sb': ['sb01']}, gateways={'sa': 'ga', 'sb': 'gb'})\n"
                "print(b.tag, b.wan['subnet'], b._procs[0].pid, flush=True)\n"
                "os._exit(0) if %r else b.teardown()\n") % (os.path.dirname(testbed.__file__) + "/..",
                                                            crash)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        tag, subnet, relay = r.stdout.split()
        if crash:
            assert _netns_of(tag) and _links_of(tag)
            testbed.sweep()
        assert _netns_of(tag) == [] and _links_of(tag) == []
        assert not os.path.exists("/proc/%s" % relay) or \
            open("/proc/%s/stat" % relay).read().split(") ")[1][0] in "ZX"
        routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
        assert subnet + "." not in routes
        assert not os.path.exists(os.path.join(testbed.BASE_DIR, testbed.DIR_PREFIX + tag))
