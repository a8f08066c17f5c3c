"""`gxpc bcast` on 8 real sshd hosts with 100 Mbit/s links: complete and identical
everywhere, never a partial file under DEST, bounded memory, and the failures of
issue 16 (the source killed while a replica exists, a middle node killed, a
corrupted chunk, a full disk). The hosts' scratch directories are read from the
head through their backing directories, while the transfer runs."""
from __future__ import annotations

import hashlib
import os
import signal
import threading
import time

import pytest
from conftest import module_bed
from test_flow_backpressure import RssSampler

from testbed import sha256_of

pytestmark = pytest.mark.testbed

HOSTS = ["tc%02d" % i for i in range(1, 9)]
MIB = 1 << 20


@pytest.fixture(scope="module")
def bed():
    with module_bed(HOSTS, "gxpc", bw="100mbit") as b:
        yield b


def scratch_of(bed, host: str) -> str:
    """The backing directory of `host`'s scratch directory, seen from here."""
    return os.path.join(bed.dir, "hosts", host, "scratch")


def make_file(path: str, size: int, owner: str) -> str:
    import pwd
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    pw = pwd.getpwnam(owner)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    return sha256_of(path)


def explore(g, fanout: int = 8) -> dict:
    """The 8 hosts explored (a tree of `fanout` per node); {name: pid} of every node."""
    g.ok("use", "ssh", "head", "tc*")
    g.ok("use", "ssh", "tc*", "tc*")
    g.ok("explore", "--fanout", str(fanout), "tc[[01-08]]")
    pids = {}
    for line in g.ok("stat").stdout.splitlines()[1:]:
        pids[line.split()[1]] = int(line.split("pid=")[1].split()[0])
    assert sorted(pids) == ["head"] + HOSTS
    return pids


class PartialWatch:
    """Polls DEST on every host while the transfer runs: whenever it exists it
    must be complete (its SHA-256 the source's, checked once per host)."""

    def __init__(self, bed, rel: str, want: str) -> None:
        self.paths = {h: os.path.join(scratch_of(bed, h), rel) for h in HOSTS}
        self.want = want
        self.seen: dict = {}
        self.bad: list = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.polls += 1
            for h, p in self.paths.items():
                if h in self.seen or not os.path.exists(p):
                    continue
                got = sha256_of(p)
                self.seen[h] = got
                if got != self.want:
                    self.bad.append((h, os.path.getsize(p)))
            time.sleep(0.005)

    def __enter__(self) -> PartialWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def temps_left(bed, rel_dir: str) -> list:
    return [(h, n) for h in HOSTS for n in os.listdir(os.path.join(scratch_of(bed, h), rel_dir))
            if ".gxp-bcast-" in n]


def wait_until_receiving(bed, host: str, rel_dir: str) -> None:
    """Until `host` has its hidden temporary of a broadcast in `rel_dir` (the
    copy is under way there); fails if none appears within a minute."""
    temp = os.path.join(scratch_of(bed, host), rel_dir)
    deadline = time.monotonic() + 60
    while not any(".gxp-bcast-" in n for n in os.listdir(temp)):
        assert time.monotonic() < deadline, "%s never started receiving" % host
        time.sleep(0.01)


def setup_dirs(bed, user: str, name: str) -> str:
    import pwd
    pw = pwd.getpwnam(user)
    for h in HOSTS:
        d = os.path.join(scratch_of(bed, h), name)
        os.makedirs(d, exist_ok=True)
        os.chown(d, pw.pw_uid, pw.pw_gid)
    return os.path.join(bed.scratch, name)


def test_bcast_reaches_every_host_complete_never_partial_in_bounded_memory(bed, make_gxp, tmp_path):
    user = next(iter(bed.users))
    g = make_gxp(bed=bed, user=user)
    pids = explore(g)
    src = "/tmp/bcsrc-%s" % g.new_tag()
    want = make_file(src, 64 * MIB + 12345, user)
    dest_dir = setup_dirs(bed, user, "b1")
    sampler = RssSampler({("daemon" if k == "head" else k): v for k, v in pids.items()})
    with sampler, PartialWatch(bed, "b1/copy", want) as watch:
        r = g.run("bcast", "--hosts", "tc*", src, dest_dir + "/copy", timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""            # quiet on success
    assert watch.polls > 20 and not watch.bad, watch.bad
    for h in HOSTS:
        assert sha256_of(os.path.join(scratch_of(bed, h), "b1", "copy")) == want, h
    assert temps_left(bed, "b1") == []
    # 64 MiB went through the daemon and every agent: none held it.
    sampler.check()
    assert max(sampler.peak.values()) < 60 * MIB, sampler.peak


def test_a_node_that_falls_behind_stalls_nobody_else(bed, make_gxp):
    """tc04's agent is stopped (SIGSTOP) before the transfer: every other host
    gets the whole file meanwhile (tc05, after it in the chain, from another
    holder once the head sees tc04 still); tc04 gets it once it runs again."""
    user = next(iter(bed.users))
    g = make_gxp(bed=bed, user=user)
    pids = explore(g)
    dest_dir = setup_dirs(bed, user, "b6")
    src = "/tmp/bcsrc-%s" % g.new_tag()
    want = make_file(src, 16 * MIB, user)
    os.kill(pids["tc04"], signal.SIGSTOP)
    try:
        p = g.popen("bcast", "--hosts", "tc*", src, dest_dir + "/copy")
        others = [h for h in HOSTS if h != "tc04"]
        paths = {h: os.path.join(scratch_of(bed, h), "b6", "copy") for h in HOSTS}
        deadline = time.monotonic() + 120
        while not all(os.path.exists(paths[h]) for h in others) and time.monotonic() < deadline:
            time.sleep(0.05)
        for h in others:
            assert sha256_of(paths[h]) == want, h
        assert not os.path.exists(paths["tc04"]) and p.poll() is None
    finally:
        os.kill(pids["tc04"], signal.SIGCONT)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert sha256_of(paths["tc04"]) == want


def test_source_killed_midway_with_a_replica_still_completes(bed, make_gxp):
    user = next(iter(bed.users))
    g = make_gxp(bed=bed, user=user)
    pids = explore(g)
    dest_dir = setup_dirs(bed, user, "b2")
    import shutil
    data = os.urandom(32 * MIB)
    for h in ("tc01", "tc02"):
        p = os.path.join(scratch_of(bed, h), "b2", "src")
        with open(p, "wb") as f:
            f.write(data)
        shutil.chown(p, user)
    want = hashlib.sha256(data).hexdigest()
    p = g.popen("bcast", "-v", "--hosts", "tc*", "tc[[01-02]]:%s/src" % dest_dir, dest_dir + "/copy")
    # Kill the primary source once the copies are under way.
    wait_until_receiving(bed, "tc05", "b2")
    time.sleep(0.7)
    os.kill(pids["tc01"], signal.SIGKILL)
    out, err = p.communicate(timeout=300)
    # tc01 is named (lost); every other host has the whole file.
    assert p.returncode == 1, err
    failed = [line for line in err.splitlines() if not line.startswith("bcast:")]
    assert len(failed) == 1 and failed[0].startswith("tc01: node lost"), err
    for h in HOSTS[1:]:
        assert sha256_of(os.path.join(scratch_of(bed, h), "b2", "copy")) == want, (h, err)
    assert temps_left(bed, "b2") == []


def test_middle_node_killed_the_others_complete(bed, make_gxp):
    """A tree of fan-out 2: tc02 relays to its subtree. Killing it loses that
    subtree (agents end with their parent); every other host completes."""
    user = next(iter(bed.users))
    g = make_gxp(bed=bed, user=user)
    pids = explore(g, fanout=2)
    stat = g.ok("stat").stdout
    dest_dir = setup_dirs(bed, user, "b3")
    src = "/tmp/bcsrc-%s" % g.new_tag()
    want = make_file(src, 32 * MIB, user)
    p = g.popen("bcast", "--hosts", "tc*", src, dest_dir + "/copy")
    wait_until_receiving(bed, "tc02", "b3")
    time.sleep(0.7)
    os.kill(pids["tc02"], signal.SIGKILL)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 1, err
    lost = {line.split(":")[0] for line in err.splitlines()}
    # tc02 and the hosts under it in the explored tree, nobody else.
    under = {line.split()[1] for line in stat.splitlines() if line.split()[0].startswith("0.2.")}
    assert lost == {"tc02"} | under, (err, stat)
    assert len(lost) < len(HOSTS) - 2, stat
    for h in set(HOSTS) - lost:
        assert sha256_of(os.path.join(scratch_of(bed, h), "b3", "copy")) == want, (h, err)
    for h in lost:
        assert not os.path.exists(os.path.join(scratch_of(bed, h), "b3", "copy")), h


def bcast_with_fault(bed, make_gxp, fault: dict, tag: str) -> str:
    """An 8 MiB bcast to every host in a session whose daemon starts with a
    test-only fault in its environment; every copy must be whole. The
    daemon's log."""
    user = next(iter(bed.users))
    g = make_gxp(bed=bed, user=user)
    # The daemon's own environment (from the gxpc that starts it) holds the fault.
    g.ok("use", "ssh", "head", "tc*", env=fault)
    g.ok("explore", "tc[[01-08]]")
    dest_dir = setup_dirs(bed, user, tag)
    src = "/tmp/bcsrc-%s" % g.new_tag()
    want = make_file(src, 8 * MIB, user)
    r = g.run("bcast", "--hosts", "tc*", src, dest_dir + "/copy", timeout=300)
    assert r.returncode == 0, r.stderr
    for h in HOSTS:
        assert sha256_of(os.path.join(scratch_of(bed, h), tag, "copy")) == want, h
    with open(os.path.join(g.session_dir, "gxpd.log")) as f:
        return f.read()


def test_a_corrupted_chunk_is_detected_and_fetched_again(bed, make_gxp):
    # chunk 5 to tc03 has a byte flipped once
    log = bcast_with_fault(bed, make_gxp, {"GXP_TEST_BCAST_CORRUPT": "tc03:5"}, "b4")
    # tc03 is fed by tc02 in the chain of the head's children (0.2 -> 0.3)
    assert "got a bad chunk 5 from 0.2" in log, log[-2000:]


def test_a_full_disk_names_its_node_and_enospc(bed, make_gxp):
    user = next(iter(bed.users))
    g = make_gxp(bed=bed, user=user)
    explore(g)
    dest_dir = setup_dirs(bed, user, "b5")
    host = bed.host("tc05")
    host.exec(["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", dest_dir], check=True)
    try:
        src = "/tmp/bcsrc-%s" % g.new_tag()
        want = make_file(src, 4 * MIB, user)
        r = g.run("bcast", "--hosts", "tc*", src, dest_dir + "/copy", timeout=300)
        assert r.returncode == 1, r.stderr
        assert r.stderr.splitlines() == ["tc05: %s: No space left on device (ENOSPC)" % dest_dir], \
            r.stderr
        for h in HOSTS:
            if h != "tc05":
                assert sha256_of(os.path.join(scratch_of(bed, h), "b5", "copy")) == want, h
        left = host.exec(["ls", "-A", dest_dir], capture_output=True, text=True).stdout
        assert left == "", left
    finally:
        host.exec(["umount", "-l", dest_dir])


def test_a_dest_that_is_not_a_regular_file_is_refused_on_its_node_only(bed, make_gxp):
    """A FIFO at DEST on tc03 stays a FIFO: tc03 says why in one line, every
    other host gets the file (issue 25)."""
    import pwd
    import stat
    user = next(iter(bed.users))
    g = make_gxp(bed=bed, user=user)
    explore(g)
    dest_dir = setup_dirs(bed, user, "b10")
    fifo = os.path.join(scratch_of(bed, "tc03"), "b10", "copy")
    os.mkfifo(fifo)
    pw = pwd.getpwnam(user)
    os.chown(fifo, pw.pw_uid, pw.pw_gid)
    src = "/tmp/bcsrc-%s" % g.new_tag()
    want = make_file(src, 4 * MIB, user)
    r = g.run("bcast", "--hosts", "tc*", src, dest_dir + "/copy", timeout=300)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == ["tc03: %s/copy: not a regular file" % dest_dir], r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    for h in HOSTS:
        if h != "tc03":
            assert sha256_of(os.path.join(scratch_of(bed, h), "b10", "copy")) == want, h
    assert temps_left(bed, "b10") == []


def listeners(bed) -> dict:
    """Listening TCP sockets on each host other than sshd's (port 22)."""
    out = {}
    for h in HOSTS:
        r = bed.host(h).exec(["ss", "-Htln"], capture_output=True, text=True, check=True)
        socks = [line for line in r.stdout.splitlines() if not line.split()[3].endswith(":22")]
        if socks:
            out[h] = socks
    return out


def test_a_site_is_fed_as_a_chain_over_direct_links_that_are_closed_after(bed, make_gxp):
    """The head's 8 children: the head feeds tc01, each feeds the next over a
    direct link (the result's plan says who fed whom); after the transfer no
    listener is left on any host."""
    user = next(iter(bed.users))
    g = make_gxp(bed=bed, user=user)
    explore(g)
    assert listeners(bed) == {}
    dest_dir = setup_dirs(bed, user, "b7")
    src = "/tmp/bcsrc-%s" % g.new_tag()
    want = make_file(src, 16 * MIB, user)
    r = g.run("bcast", "--hosts", "tc*", src, dest_dir + "/copy", timeout=300)
    assert r.returncode == 0, r.stderr
    for h in HOSTS:
        assert sha256_of(os.path.join(scratch_of(bed, h), "b7", "copy")) == want, h
    with open(os.path.join(g.session_dir, "gxpd.log")) as f:
        log = f.read()
    assert "fed along the tree" not in log, log[-2000:]
    deadline = time.monotonic() + 10
    while listeners(bed) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert listeners(bed) == {}


def test_killing_a_middle_node_of_the_chain_completes_for_every_other_node(bed, make_gxp):
    user = next(iter(bed.users))
    g = make_gxp(bed=bed, user=user)
    pids = explore(g)
    dest_dir = setup_dirs(bed, user, "b8")
    src = "/tmp/bcsrc-%s" % g.new_tag()
    want = make_file(src, 32 * MIB, user)
    p = g.popen("bcast", "--hosts", "tc*", src, dest_dir + "/copy")
    wait_until_receiving(bed, "tc05", "b8")
    time.sleep(0.7)
    os.kill(pids["tc04"], signal.SIGKILL)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 1, err
    failed = [line for line in err.splitlines() if not line.startswith("bcast:")]
    assert len(failed) == 1 and failed[0].startswith("tc04: node lost"), err
    for h in HOSTS:
        if h != "tc04":
            assert sha256_of(os.path.join(scratch_of(bed, h), "b8", "copy")) == want, (h, err)
    # only the killed node's hidden temporary stays (SIGKILL: nobody there to remove it)
    assert [h for h, _ in temps_left(bed, "b8")] in ([], ["tc04"])
    assert not os.path.exists(os.path.join(scratch_of(bed, "tc04"), "b8", "copy"))


def test_a_refused_direct_connection_falls_back_to_the_tree_parent(bed, make_gxp):
    """The test-only fault gives tc05's feeder a port nobody listens on: the
    connection is refused, the head feeds tc05 along the tree, and everyone
    (tc06..tc08 after it in the chain too) gets the whole file."""
    log = bcast_with_fault(bed, make_gxp, {"GXP_TEST_BCAST_NO_DIRECT": "tc05"}, "b9")
    assert "tc05: direct link to" in log and "fed along the tree" in log, log[-2000:]
