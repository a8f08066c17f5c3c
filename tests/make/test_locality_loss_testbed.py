"""A node lost while it held the only replica of an intermediate file: the
catalog drops its replicas, the survivors' mounts drop its branch (its files
are absent, not EIO), and the next `gxpc make` runs the recipe that produced
the intermediate again; the outputs are plain make's.

On a bed of its own (the killed host does not come back), as an ordinary user.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid

import pytest
from conftest import Gxp, _finish, module_bed

pytestmark = pytest.mark.testbed

HOSTS = ["tn01", "tn02", "tn03", "tn04"]

MAKEFILE = """\
all: final
mid: GXP_ON = tn03
mid: GXP_PLACE = soft
mid: src
\tseq 1 200000 | sed "s/^/$$(cat src) /" > $@
final: GXP_ON = tn01
final: mid
\twc -l < mid > $@ && md5sum < mid >> $@
"""


@pytest.fixture(scope="module")
def bed():
    with module_bed(HOSTS, "gxpnl", fuse=True) as b:
        yield b


def _as_user(g, argv, cwd=None, **kw):
    return g.bed.run_as(g.user, g._in_dir(cwd, argv) if cwd else argv, env=g.env(kw.pop("env", None)),
                        capture_output=True, timeout=180, **kw)


def test_a_lost_only_replica_is_rebuilt(bed):
    user = next(iter(bed.users))
    g = Gxp(bed, user, "/tmp/gxpt-%s/session" % uuid.uuid4().hex[:10])
    tag = uuid.uuid4().hex[:6]
    export, mnt = "/tmp/gxnexp-" + tag, "/tmp/gxnmnt-" + tag
    plain = tempfile.mkdtemp(prefix="gxpnl-", dir="/var/tmp")
    try:
        g.ok("use", "ssh", "head", "tn*")
        g.ok("explore", *HOSTS)
        g.ok("e", "mkdir -p %s %s" % (export, mnt))
        g.ok("mount", export, mnt)
        work = os.path.join(mnt, "w")
        r = _as_user(g, ["sh", "-c", 'mkdir "$1" && cd "$1" && cat > Makefile && echo sample > src',
                         "sh", work], input=MAKEFILE.encode())
        assert r.returncode == 0, r.stderr
        r = _as_user(g, g.argv(["make"]), cwd=work)
        assert r.returncode == 0, r.stderr
        assert "tn03:" in g.ok("where", os.path.join(work, "mid")).stdout
        assert g.run("where", os.path.join(work, "final")).stdout.split("\t")[1].startswith("tn01:")

        bed.host("tn03").kill()
        deadline = time.monotonic() + 60
        while g.stat_nodes().get("tn03") == "up":
            assert time.monotonic() < deadline, "tn03 was never seen lost"
            time.sleep(0.5)
        r = g.run("where", os.path.join(work, "mid"))
        assert r.returncode == 1 and r.stdout.endswith("\t-\n"), r.stdout
        deadline = time.monotonic() + 30   # the survivors' mounts drop tn03's branch
        while _as_user(g, ["test", "-e", os.path.join(work, "mid")]).returncode == 0:
            assert time.monotonic() < deadline, "mid still visible after tn03 was lost"
            time.sleep(0.5)

        r = _as_user(g, g.argv(["make", "--explain-placement"]), cwd=work)
        assert r.returncode == 0, r.stderr
        assert b"seq 1 200000" in r.stderr, r.stderr          # mid's recipe ran again
        # the same files as plain make's, from scratch
        os.chown(plain, *[int(x) for x in _as_user(g, ["sh", "-c", "id -u; id -g"]).stdout.split()])
        r = _as_user(g, ["sh", "-c", 'cd "$1" && printf "%s" "$2" > Makefile && echo sample > src && make -s',
                         "sh", plain, MAKEFILE])
        assert r.returncode == 0, r.stderr
        for name in ("mid", "final"):
            ours = _as_user(g, ["cat", os.path.join(work, name)]).stdout
            theirs = _as_user(g, ["cat", os.path.join(plain, name)]).stdout
            assert ours == theirs and ours, name
    finally:
        g.run("umount", mnt, timeout=90)
        _finish(g)
        for d in (export, mnt, plain):
            shutil.rmtree(d, ignore_errors=True)
