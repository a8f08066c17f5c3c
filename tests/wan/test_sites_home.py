"""Results home on the sites bed (issue 28, MFS's property): with sites,
`gxpc make` returns once every goal its recipes made is also in the head's
own export (no --home needed), so a site lost after make returns leaves
every goal readable at home, with plain make's content, and `make -q` finds
them up to date. A file only the lost site held (no goal) is gone with it:
the loss is real.

The site is lost as a crashed cluster is: everything on its gateway and its
hosts killed (sshd included); the session notices (its nodes no longer up)
before anything is read. A bed of its own: the killed hosts do not come back."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest
from sites_bed import SITES, sites_bed
from test_site_cache import wait_visible
from test_sites_mount import mounted_sites, on, put

pytestmark = pytest.mark.testbed

# recipes on both sites; goals made on site b read site a's and home's, and the
# other way round; one in a subdirectory
MAKEFILE = """\
all: total.txt sub/b3.out
a1.out: GXP_ON = sa01
a1.out: in1.txt
\ttr a-z A-Z < in1.txt > $@
a2.out: GXP_ON = sa02
a2.out: b1.out
\trev b1.out > $@
b1.out: GXP_ON = sb01
b1.out: in2.txt
\tseq 1 20000 | cat in2.txt - > $@
sub/b3.out: GXP_ON = sb03
sub/b3.out: a1.out
\tmkdir -p sub && sort -r a1.out > $@
total.txt: GXP_ON = sb02
total.txt: a1.out a2.out b1.out sub/b3.out
\tcat $^ | md5sum > $@
\twc -c $^ >> $@
"""
INPUTS = {"in1.txt": "alpha at home\nsecond line\n", "in2.txt": "beta at home\n"}
GOALS = ("a1.out", "a2.out", "b1.out", "sub/b3.out", "total.txt")
SITE_B = ["gb"] + SITES["sb"]


@pytest.fixture(scope="module")
def bed():
    with sites_bed("gxpwh", fuse=True) as b:
        yield b


def plain_make() -> dict:
    """name -> content of each goal as plain make makes it here."""
    local = tempfile.mkdtemp(prefix="wanhome-", dir="/var/tmp")
    try:
        for name, text in list(INPUTS.items()) + [("Makefile", MAKEFILE)]:
            with open(os.path.join(local, name), "w") as f:
                f.write(text)
        subprocess.run(["make", "-s"], cwd=local, check=True, capture_output=True)
        out = {}
        for name in GOALS:
            with open(os.path.join(local, name)) as f:
                out[name] = f.read()
        return out
    finally:
        shutil.rmtree(local)


def as_user(bed, user, script, cwd, timeout=120):
    return bed.run_as(user, ["sh", "-c", 'cd "$0" && ' + script, cwd], capture_output=True,
                      text=True, timeout=timeout)


def up_nodes(g) -> set:
    """Names of the session's explored hosts that are up (`gxpc stat`)."""
    r = g.ok("stat")
    rows = [re.match(r"\s*\S+ (\S+)(?: \(\S+\))? \[\S+\] (\S+)", line) for line in r.stdout.splitlines()]
    return {m.group(1) for m in rows if m and m.group(2) == "up"}


def test_a_site_lost_after_make_leaves_every_goal_at_home(bed):
    want = plain_make()
    with mounted_sites(bed) as (g, export, mnt):
        work = os.path.join(mnt, "work")
        for name, text in list(INPUTS.items()) + [("Makefile", MAKEFILE)]:
            r = bed.run_as(g.user, ["sh", "-c", 'mkdir -p "$0" && cat > "$0/$1"', work, name],
                           input=text, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
        put(bed, "sb04", export, "only_sb04.txt", "held on site b only\n")
        wait_visible(bed, ["sa01"], os.path.join(mnt, "only_sb04.txt"))
        r = g.run("make", "-j", "4", cwd=work, timeout=300)     # no --home: the session has sites
        assert r.returncode == 0, r.stdout + r.stderr
        for name in GOALS:
            # in the head's own export, the disk that outlives the sites
            with open(os.path.join(export, "work", name)) as f:
                assert f.read() == want[name], name
        assert not os.path.exists(os.path.join(export, "only_sb04.txt"))
        r = as_user(bed, g.user, "cat only_sb04.txt", mnt)
        assert r.returncode == 0 and r.stdout == "held on site b only\n", r.stderr
        before = up_nodes(g)
        assert set(SITE_B) <= before, before
        for host in SITE_B:
            bed.host(host).kill()
        deadline = time.monotonic() + 60
        while set(SITE_B) & up_nodes(g):
            assert time.monotonic() < deadline, "the session did not notice site b's loss"
            time.sleep(0.2)
        for name in GOALS:
            r = as_user(bed, g.user, "cat " + name, work)
            assert r.returncode == 0 and r.stdout == want[name], (name, r.stderr)
        r = as_user(bed, g.user, "make -q", work)
        assert r.returncode == 0, r.stdout + r.stderr
        r = as_user(bed, g.user, "cat only_sb04.txt", mnt)
        assert r.returncode != 0 and "held on site b" not in r.stdout
        # site a still reads them too
        r = on(bed, "sa02", "cd %s && cat total.txt" % work)
        assert r.returncode == 0 and r.stdout == want["total.txt"], r.stderr
