"""Backpressure end to end: however much a command writes and however slowly
gxpc's output is read, and however much stdin is fed to commands that do not
read it, every process stays small and every byte arrives.

The tree is local agents under one gateway (head -> gw -> leaf1..leaf8), so the
output of eight nodes funnels through one agent, the daemon and one client.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import threading
import time

import pytest

RSS_LIMIT = 100 << 20
LEAVES = 8


def rss(pid: int) -> int:
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class RssSampler:
    """Samples VmRSS of the given processes every 50 ms, in a thread."""

    def __init__(self, pids: dict) -> None:
        self.pids = pids           # name -> pid
        self.peak = {name: 0 for name in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], rss(pid))
            time.sleep(0.05)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def check(self) -> None:
        assert all(v > 0 for v in self.peak.values()), "a process was never sampled: %s" % self.peak
        over = {k: "%.1f MB" % (v / 1e6) for k, v in self.peak.items() if v >= RSS_LIMIT}
        assert not over, "over %d MB RSS: %s" % (RSS_LIMIT >> 20, over)


def gateway_tree(gxp) -> dict:
    """head -> gw -> leaf1..leaf8; returns {name: pid} of the daemon and agents."""
    gxp.ok("use", "local", "head", "gw")
    gxp.ok("use", "local", "gw", "leaf*")
    gxp.ok("explore", "gw", "leaf[[1-%d]]" % LEAVES)
    pids = {}
    for line in gxp.ok("stat").stdout.splitlines()[1:]:
        parts = line.split()
        pids[parts[1]] = int(line.split("pid=")[1].split()[0])
    assert sorted(pids) == sorted(["head", "gw"] + ["leaf%d" % i for i in range(1, LEAVES + 1)])
    # The leaves hang under the gateway.
    assert all(l.startswith("    ") for l in gxp.ok("stat").stdout.splitlines()[1:] if "leaf" in l)
    return {("daemon" if k == "head" else k): v for k, v in pids.items()}


def letter_command(per_node: int, digits: str, column: int) -> str:
    """Each node writes per_node bytes of one letter, picked from its name's
    digit at `column` (digits[i] -> 'a' + i): the byte counts of the merged
    stream then say which node's bytes arrived."""
    letters = "".join(chr(ord("a") + i) for i in range(len(digits)))
    return ("c=$(echo $GXP_HOSTNAME | tr %s %s | cut -c%d); head -c %d /dev/zero | tr '\\0' $c"
            % (digits, letters, column, per_node))


def read_slowly(gxp, pids: dict, hosts: str, cmd: str, nodes: int, per_node: int) -> None:
    """Run cmd on hosts, read gxpc's output slowly, check every byte and every RSS."""
    p = gxp.popen("e", "--hosts", hosts, cmd, text=False, bufsize=0)
    pids = dict(pids, client=p.pid)
    counts = {chr(ord("a") + i): 0 for i in range(nodes)}
    total = 0
    t0 = time.monotonic()
    try:
        with RssSampler(pids) as sampler:
            # Slow: nothing read for 3 s (every queue on the way fills to its
            # bound), then small reads with pauses for the first 64 MB.
            time.sleep(3)
            while True:
                data = p.stdout.read(64 << 10)
                if not data:
                    break
                total += len(data)
                for ch in counts:
                    counts[ch] += data.count(ch.encode())
                if total < (64 << 20):
                    time.sleep(0.002)
            p.wait(timeout=60)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, err
    assert total == nodes * per_node
    assert counts == {ch: per_node for ch in counts}      # nothing else, nothing lost
    sampler.check()
    print("%d MB in %.1f s; peak RSS %s" % (total >> 20, elapsed,
          {k: "%.0f MB" % (v / 1e6) for k, v in sampler.peak.items()}))


def test_slowly_read_output_of_8_nodes_through_a_gateway(gxp):
    per_node = int(os.environ.get("GXP_FLOW_BYTES", str(128 << 20)))
    pids = gateway_tree(gxp)
    read_slowly(gxp, pids, "leaf*", letter_command(per_node, "12345678", 5), LEAVES, per_node)


@pytest.fixture
def big_input(tmp_path_factory):
    """A file the test's user can read: 500 MB of varied bytes (a stream of
    SHA-256 digests), with its size and digest."""
    size = int(os.environ.get("GXP_FLOW_STDIN", str(500 << 20)))
    d = tmp_path_factory.mktemp("stdin")
    os.chmod(d, 0o755)
    path = d / "input"
    h = hashlib.sha256()
    block = hashlib.sha256(b"seed").digest() * 2048     # 64 KB
    with open(path, "wb") as f:
        left = size
        i = 0
        while left:
            chunk = block[:left] if left < len(block) else block
            chunk = bytes([i & 0xFF]) + chunk[1:] if chunk else chunk
            f.write(chunk)
            h.update(chunk)
            left -= len(chunk)
            i += 1
    os.chmod(path, 0o644)
    yield str(path), size, h.hexdigest()
    os.unlink(path)


def _run_with_stdin(gxp, pids, path, args):
    with open(path, "rb") as f:
        t0 = time.monotonic()
        p = gxp.popen(*args, stdin=f)
        pids = dict(pids, client=p.pid)
        try:
            with RssSampler(pids) as sampler:
                out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        consumed = os.lseek(f.fileno(), 0, os.SEEK_CUR)    # how far gxpc read our stdin
    print("%s: %.1f s, read %d MB of stdin, peak RSS %s" % (
        " ".join(args), time.monotonic() - t0, consumed >> 20,
        {k: "%.0f MB" % (v / 1e6) for k, v in sampler.peak.items()}))
    return p.returncode, out, err, sampler, consumed


def test_stdin_to_commands_that_read_it_and_that_never_do(gxp, big_input):
    path, size, digest = big_input
    pids = gateway_tree(gxp)
    # Readers: every leaf gets all of it, in order.
    rc, out, err, sampler, consumed = _run_with_stdin(
        gxp, pids, path, ["e", "--stdin", "--hosts", "leaf[[1-2]]", "sha256sum"])
    assert rc == 0, err
    assert out.split() == [digest, "-", digest, "-"] and consumed == size
    sampler.check()
    # Never reads: the command ends, and so do we, having read a bounded part of stdin.
    rc, out, err, sampler, consumed = _run_with_stdin(
        gxp, pids, path, ["e", "--stdin", "--hosts", "leaf*", "sleep 3; echo done"])
    assert rc == 0, err
    assert out.split() == ["done"] * LEAVES
    assert consumed <= 4 << 20, "gxpc read %d bytes of stdin nobody wanted" % consumed
    sampler.check()
    # Closes its stdin at once and keeps running: the sender stops too.
    rc, out, err, sampler, consumed = _run_with_stdin(
        gxp, pids, path, ["e", "--stdin", "--hosts", "leaf1", "exec 0<&-; sleep 2; echo done"])
    assert rc == 0, err
    assert out.split() == ["done"]
    assert consumed <= 4 << 20, "gxpc read %d bytes of stdin nobody wanted" % consumed
    sampler.check()


HOG = r"""
import socket, sys
from gxpstyle.protocol import wire
from gxpstyle.gxpc.client import Client
c = Client(sys.argv[1])
assert c.connect(start=False)
rules = [{"channel": "local", "from": "head", "to": "hog%d" % i} for i in range(1000)]
assert c.call("use", {"rules": rules})[0] == 0
c.sock.settimeout(3)
frame = wire.encode_frame(wire.HEAD, "c", {"op": "request", "req": 0, "cmd": "use",
                                           "args": {"rules": []}})
sent = 0
try:
    while sent < 5000:      # each asks for a ~45 KB reply we never read
        c.sock.sendall(frame)
        sent += 1
except socket.timeout:
    pass
print(sent, flush=True)
sys.stdin.read()            # hold the connection, unread, until told to go
"""


def test_a_client_that_never_reads_is_held_alone(gxp):
    """A client sending requests and reading no reply: the daemon stops reading
    it (its memory stays bounded) and still answers everyone else."""
    if gxp.user is None:
        pytest.skip("needs root to run the session as an ordinary user")
    gxp.ok("explore", "--local", "1")
    daemon = gxp.daemon_pids()[0]
    python = os.path.join(os.path.dirname(gxp.gxpc), "python")
    hog = gxp.bed.popen_as(gxp.user, [python, "-c", HOG, gxp.session_dir], env=gxp.env(),
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with RssSampler({"daemon": daemon}) as sampler:
            sent = int(hog.stdout.readline())
            assert sent < 5000, "the daemon read every request of a client that reads nothing"
            t0 = time.monotonic()
            r = gxp.ok("e", "echo still here", timeout=30)
            assert r.stdout.split() == ["still", "here"] * 2
            assert time.monotonic() - t0 < 10
        sampler.check()
    finally:
        hog.stdin.close()
        hog.wait(timeout=10)
