"""`gxpc mount -o cache_size=` on 3 test-bed hosts, as an ordinary user, with
`gxpc make` pushing every input (--pull-threshold 0) into a 2 MiB store on
tq02: a running recipe's input (pinned for its life) is not evicted for the
next file, whose copy then fails with ENOSPC naming the node and the store
(the recipe reads that file through the mount and still succeeds, and no
partial copy is left); once that recipe has ended, its input is the least
recently used replica and goes for the next one.
"""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import tempfile
import time
import uuid

import pytest
from conftest import Gxp, _finish, module_bed

pytestmark = pytest.mark.testbed

HOSTS = ["tq01", "tq02", "tq03"]
SIZE = 1536 << 10          # two do not fit in 2 MiB
MAKEFILE = """\
all: a b c
a: GXP_ON = tq02
a: GXP_PLACE = hard
a: f1
\tsleep 6; sha256sum f1 > $@
gate: GXP_ON = tq03
gate:
\tsleep 2
b: GXP_ON = tq02
b: GXP_PLACE = hard
b: f2 gate
\tsha256sum f2 > $@
c: GXP_ON = tq02
c: GXP_PLACE = hard
c: f2 a
\tsha256sum f2 > $@
"""


@pytest.fixture(scope="module")
def bed():
    with module_bed(HOSTS, "gxptq", fuse=True) as b:
        yield b


def _store(host) -> str:
    """The replica store of the session's mount on `host` (in its /tmp)."""
    for d, _, _ in os.walk(host.tmp_dir):
        if d.endswith("/replicas"):
            return d
    pytest.fail("no replica store on %s" % host)


def test_a_running_recipes_input_is_never_evicted_and_a_copy_that_cannot_fit_says_enospc(bed):
    user = next(iter(bed.users))
    pw = pwd.getpwnam(user)
    g = Gxp(bed, user, "/tmp/gxpt-%s/session" % uuid.uuid4().hex[:10])
    suffix = uuid.uuid4().hex[:6]
    export, mnt = "/tmp/gxqexp-%s" % suffix, "/tmp/gxqmnt-%s" % suffix
    traces = tempfile.mkdtemp(prefix="gxptrace-")
    os.chown(traces, pw.pw_uid, pw.pw_gid)
    trace = os.path.join(traces, "t.json")
    try:
        g.ok("use", "ssh", "head", "tq*")
        g.ok("explore", *HOSTS)
        g.ok("e", "mkdir -p %s/work %s" % (export, mnt))
        digests = {}
        for name in ("f1", "f2"):
            data = os.urandom(SIZE)
            digests[name] = hashlib.sha256(data).hexdigest()
            p = os.path.join(bed.host("tq01").tmp_dir, export[len("/tmp/"):], "work", name)
            with open(p, "wb") as f:
                f.write(data)
            os.chown(p, pw.pw_uid, pw.pw_gid)
        r = g.run("mount", "-o", "cache_size=100K", export, mnt)
        assert (r.returncode, r.stderr) == (2, "gxpc: mount: cache_size must be from 1M to 1024P, "
                                               "got '100K'\n")
        g.ok("mount", "-o", "cache_size=2M", export, mnt)
        work = os.path.join(mnt, "work")
        deadline = time.monotonic() + 30
        while g.run("where", work + "/f1", work + "/f2").stdout.count("tq01") < 2:
            assert time.monotonic() < deadline, "the catalog never listed the inputs"
            time.sleep(0.2)
        r = bed.run_as(user, ["sh", "-c", 'cat > "$1/Makefile"', "sh", work], input=MAKEFILE.encode(),
                       capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        r = bed.run_as(user, g._in_dir(work, g.argv(["make", "-j4", "--pull-threshold", "0",
                                                      "--trace=" + trace])),
                       env=g.env(None), capture_output=True, timeout=240)
        assert r.returncode == 0, r.stderr
        for out, name in (("a", "f1"), ("b", "f2"), ("c", "f2")):
            got = bed.run_as(user, ["cat", os.path.join(work, out)], capture_output=True).stdout
            assert got.decode().split()[0] == digests[name], (out, got)
        # b's copy of f2 did not fit beside a's pinned f1: refused by name
        with open(os.path.join(g.session_dir, "gxpd.log")) as f:
            log = f.read()
        store = _store(bed.host("tq02"))
        refused = [line for line in log.splitlines() if "/work/f2 to tq02:" in line]
        assert refused and "No space left on device (ENOSPC)" in refused[0], log[-2000:]
        assert "replica store " in refused[0] and "cache_size 2.0 MiB" in refused[0], refused
        # the trace: f1 copied for a, f2 copied for c (after a ended, f1 evicted)
        with open(trace) as f:
            lines = [json.loads(line) for line in f]
        xfer = [(t["node"], os.path.basename(t["file"])) for t in lines if t["kind"] == "transfer"]
        assert xfer == [("tq02", "f1"), ("tq02", "f2")], lines
        recipes = {t["recipe"].rsplit("> ", 1)[-1]: t for t in lines if t["kind"] == "recipe"}
        assert recipes["b"]["start"] < recipes["a"]["end"], recipes   # b ran while a held f1
        # one complete replica is left, f2's; nothing partial
        names = os.listdir(store)
        assert len(names) == 1 and not names[0].startswith("."), names
        assert os.path.getsize(os.path.join(store, names[0])) == SIZE
    finally:
        g.run("umount", mnt, timeout=90)
        _finish(g)
        shutil.rmtree(traces, ignore_errors=True)
        for d in (export, mnt):          # the head's own export and mountpoint
            shutil.rmtree(d, ignore_errors=True)
