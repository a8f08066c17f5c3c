"""Planned transfers of `gxpc make` (issue 16) on 8 test-bed hosts at 100 Mbit/s,
in the session's GMount, as an ordinary user: before a recipe runs on a node,
an input at or above the pull threshold that the node lacks is pushed there by
the head, a smaller one pulled by the node; the copy lands in the mount's
replica store (reading the file through the mount there then moves no data:
bytes counted on the host's interface), the catalog records the node, and the
recipe starts only after the copy is complete (the trace says when). A holder
killed while the others pull from it: they go on from the other holder.

The inputs are put into the hosts' exports (through their /tmp backing
directories) before the mount, so the catalog's scan finds them: `mid` in two
exports, with the same content and mtime (two replicas of one file).
"""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import signal
import tempfile
import time
import uuid

import pytest
from conftest import Gxp, _finish, module_bed

pytestmark = pytest.mark.testbed

HOSTS = ["tp%02d" % i for i in range(1, 9)]
MIB = 1 << 20
SIZES = {"big": 8 * MIB, "small": 64 << 10, "mid": 24 * MIB}
HOLDERS = {"big": ["tp01"], "small": ["tp01"], "mid": ["tp01", "tp02"]}


@pytest.fixture(scope="module")
def bed():
    with module_bed(HOSTS, "gxptp", fuse=True, bw="100mbit") as b:
        yield b


@pytest.fixture(scope="module")
def mounted(bed):
    """(session, mountpoint, {file: sha256}, trace directory): the inputs in
    the exports of their holders, then every host explored and mounted."""
    user = next(iter(bed.users))
    pw = pwd.getpwnam(user)
    g = Gxp(bed, user, "/tmp/gxpt-%s/session" % uuid.uuid4().hex[:10])
    suffix = uuid.uuid4().hex[:6]
    export, mnt = "/tmp/gxtexp-%s" % suffix, "/tmp/gxtmnt-%s" % suffix
    traces = tempfile.mkdtemp(prefix="gxptrace-")
    os.chown(traces, pw.pw_uid, pw.pw_gid)
    digests = {}
    try:
        g.ok("use", "ssh", "head", "tp*")
        g.ok("explore", *HOSTS)
        g.ok("e", "mkdir -p %s/work %s" % (export, mnt))
        stamp = time.time() - 3600
        for name, size in SIZES.items():
            data = os.urandom(size)
            digests[name] = hashlib.sha256(data).hexdigest()
            for h in HOLDERS[name]:
                p = os.path.join(bed.host(h).tmp_dir, export[len("/tmp/"):], "work", name)
                with open(p, "wb") as f:
                    f.write(data)
                os.chown(p, pw.pw_uid, pw.pw_gid)
                os.utime(p, (stamp, stamp))
        g.ok("mount", export, mnt)
        yield g, mnt, digests, traces
    finally:
        g.run("umount", mnt, timeout=90)
        _finish(g)
        shutil.rmtree(traces, ignore_errors=True)
        for d in (export, mnt):
            shutil.rmtree(d, ignore_errors=True)


def _as_user(g, argv, cwd=None, timeout=240, **kw):
    return g.bed.run_as(g.user, g._in_dir(cwd, argv) if cwd else argv, env=g.env(kw.pop("env", None)),
                        capture_output=True, timeout=timeout, **kw)


def _catalog_ready(g, mnt, names):
    """Wait until the mount's scan has put the inputs into the catalog."""
    deadline = time.monotonic() + 30
    paths = [os.path.join(mnt, "work", n) for n in names]
    while time.monotonic() < deadline:
        r = g.run("where", *paths)
        if r.returncode == 0 and "\t-" not in r.stdout and r.stdout.count("\n") >= len(paths):
            return
        time.sleep(0.2)
    pytest.fail("the catalog never listed %s: %s" % (paths, r.stdout + r.stderr))


def _makefile(g, work: str, text: str) -> None:
    r = _as_user(g, ["sh", "-c", 'cat > "$1/Makefile"', "sh", work], input=text.encode())
    assert r.returncode == 0, r.stderr


def _trace(path: str) -> list:
    with open(path) as f:
        return [json.loads(line) for line in f]


def _rx_bytes(host, field: int = 0) -> int:
    """Bytes received (field 8: sent) on the host's network interfaces (its namespace)."""
    r = host.exec(["cat", "/proc/net/dev"], capture_output=True, text=True, timeout=30)
    total = 0
    for line in r.stdout.splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() != "lo":
            total += int(rest.split()[field])
    return total


def _where(g, path) -> set:
    r = g.ok("where", path)
    reps = r.stdout.strip().partition("\t")[2]
    return {x.split(":")[0] for x in reps.split(",")} if reps and reps != "-" else set()


# u8 comes 0.5 s after the others (its gate): it joins the push under way.
USE = "".join("u%d: GXP_ON = tp0%d\nu%d: GXP_PLACE = hard\nu%d: big small%s\n"
              "\tsha256sum big small > $@\n" % (i, i, i, i, " gate" if i == 8 else "")
              for i in range(2, 9))
USE = ("all: " + " ".join("u%d" % i for i in range(2, 9)) + "\n" + USE
       + "gate: GXP_ON = tp08\ngate:\n\tsleep 0.5\n")


def test_large_inputs_are_pushed_small_ones_pulled_before_the_recipe(mounted):
    g, mnt, digests, traces = mounted
    work = os.path.join(mnt, "work")
    _catalog_ready(g, mnt, ["big", "small", "mid"])
    _makefile(g, work, USE)
    trace = os.path.join(traces, "push-pull.json")
    sent = _rx_bytes(g.bed.host("tp01"), 8)
    r = _as_user(g, g.argv(["make", "-j8", "--pull-threshold", "1M", "--trace=" + trace]), cwd=work)
    assert r.returncode == 0, r.stderr
    # the push follows the tree: big leaves tp01 once (not once per node, nor
    # again for u8, which came later), plus the small pulls and control traffic
    sent = _rx_bytes(g.bed.host("tp01"), 8) - sent
    assert SIZES["big"] < sent < 1.5 * SIZES["big"], sent
    # every recipe saw both inputs whole
    for i in range(2, 9):
        out = _as_user(g, ["cat", os.path.join(work, "u%d" % i)]).stdout.decode()
        assert out.split()[0::2] == [digests["big"], digests["small"]], out
    # a transfer per node and file, push at or above 1M (from tp01), pull below;
    # each recipe started after its node's copies were in place
    lines = _trace(trace)
    xfer = {(t["node"], os.path.basename(t["file"])): t for t in lines if t["kind"] == "transfer"}
    recipes = {t["recipe"].rsplit("> ", 1)[-1]: t for t in lines if t["kind"] == "recipe"}
    for i in range(2, 9):
        node = "tp0%d" % i
        big, small = xfer[(node, "big")], xfer[(node, "small")]
        assert (big["mode"], big["bytes"], big["source"]) == ("push", SIZES["big"], "tp01"), big
        # pulled from any holder by then: tp01, or a node that got it first
        assert (small["mode"], small["bytes"]) == ("pull", SIZES["small"]), small
        assert small["source"] in HOSTS and small["source"] != node, small
        rec = recipes["u%d" % i]
        assert rec["node"] == node and rec["status"] == 0, rec
        assert rec["start"] >= max(big["end"], small["end"]), (rec, big, small)
    # the catalog names every host as a holder now
    for name in ("big", "small"):
        assert _where(g, os.path.join(work, name)) == set(HOSTS), name
    # reading `big` through the mount on tp05 is local: (much) less than its
    # size crosses tp05's link (the check fails without the adopted replica)
    host = g.bed.host("tp05")
    before = _rx_bytes(host)
    r = host.exec(["sh", "-c", 'sha256sum "$1"', "sh", os.path.join(work, "big")], user=g.user,
                  capture_output=True, text=True, timeout=120)
    got = _rx_bytes(host) - before
    assert r.returncode == 0 and r.stdout.split()[0] == digests["big"], r.stderr
    assert got < SIZES["big"] // 8, got


MID = "all: " + " ".join("v%d" % i for i in range(3, 6)) + "\n" + "".join(
    "v%d: GXP_ON = tp0%d\nv%d: GXP_PLACE = hard\nv%d: mid\n\tsha256sum mid > $@\n"
    % (i, i, i, i) for i in range(3, 6))


def _receiving(host) -> bool:
    """A transfer's temporary file is in a replica store on `host` (its /tmp)."""
    for d, _, names in os.walk(host.tmp_dir):
        if d.endswith("/replicas") and any(".gxp-bcast-" in n for n in names):
            return True
    return False


def _node_ids(g) -> dict:
    """{name: (node id, pid)} from `gxpc stat`."""
    out = {}
    for line in g.ok("stat").stdout.splitlines()[1:]:
        parts = line.split()
        if "pid=" in line:
            out[parts[1]] = (parts[0], int(line.split("pid=")[1].split()[0]))
    return out


def test_a_holder_killed_midway_the_pulls_go_on_from_the_other(mounted):
    g, mnt, digests, traces = mounted
    work = os.path.join(mnt, "work", "mid-" + uuid.uuid4().hex[:6])
    _catalog_ready(g, mnt, ["mid"])
    r = _as_user(g, ["mkdir", work])
    assert r.returncode == 0, r.stderr
    _makefile(g, work, MID.replace(" mid", " ../mid"))
    ids = _node_ids(g)
    # the pulls go in a fixed order: the holder with the lower id feeds first
    first = min(HOLDERS["mid"], key=lambda h: [int(x) for x in ids[h][0].split(".")])
    trace = os.path.join(traces, "fallback.json")
    p = g.popen("make", "-j4", "--pull-threshold", "inf", "--pull-order", "fixed", "--trace=" + trace,
                cwd=work)
    try:
        # 3 pulls of 24 MiB share the first holder's 100 Mbit/s link (~6 s):
        # the holder dies once every copy is under way
        deadline = time.monotonic() + 120
        while not all(_receiving(g.bed.host(h)) for h in ("tp03", "tp04", "tp05")):
            assert time.monotonic() < deadline and p.poll() is None, "the pulls never started"
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(ids[first][1], signal.SIGKILL)
        killed = time.time()
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    for i in range(3, 6):
        got = _as_user(g, ["cat", os.path.join(work, "v%d" % i)]).stdout.decode()
        assert got.split()[0] == digests["mid"], got
    lines = _trace(trace)
    pulls = [t for t in lines if t["kind"] == "transfer"]
    assert sorted(t["node"] for t in pulls) == ["tp03", "tp04", "tp05"], lines
    assert all(t["mode"] == "pull" and t["bytes"] == SIZES["mid"] for t in pulls), pulls
    # they were under way when the holder died, and completed (adopted) after
    assert all(t["start"] < killed < t["end"] for t in pulls), (killed, pulls)
    recipes = {t["recipe"].rsplit("> ", 1)[-1]: t for t in lines if t["kind"] == "recipe"}
    for t in pulls:
        rec = recipes["v%s" % t["node"][-1]]
        assert rec["start"] >= t["end"], (rec, t)
