"""`gxpc bcast` from home to the hosts of two sites (issue 28): the first
gateway is fed from home, the second by the first over a direct link between
the gateways, so home's WAN link carries the file once, not once per site; every
host gets it intact. When the gateways cannot reach each other (an nftables
drop between them in the router's namespace), the second is fed from home along
the tree, as before: the file still arrives everywhere, at the cost of a second
copy on home's link."""
from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from conftest import Gxp, _finish
from sites_bed import SITES, explore_sites, sites_bed
from test_bcast_testbed import make_file

from testbed import sha256_of

pytestmark = pytest.mark.testbed

SIZE = 8 << 20
HOSTS = SITES["sa"] + SITES["sb"]
DROP_TABLE = "gxwan_test_drop"


@pytest.fixture(scope="module")
def bed():
    with sites_bed("gxpwb") as b:
        yield b


@pytest.fixture(scope="module")
def g(bed):
    """One session for the module, explored through the gateways."""
    g = Gxp(bed, next(iter(bed.users)), "/tmp/gxpt-%s/session" % uuid.uuid4().hex[:10])
    try:
        explore_sites(g)
        yield g
    finally:
        _finish(g)


def home_link_sent(bed) -> int:
    """Bytes home sent into the WAN: what the router received on home's link."""
    r = subprocess.run(["ip", "-n", bed.router_ns, "-s", "-j", "link", "show", "head0"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)[0]["stats64"]["rx"]["bytes"]


def bcast_home(bed, g) -> int:
    """A new file of home's to every site host, checked on each; the bytes home's
    WAN link carried for it."""
    user = next(iter(bed.users))
    tag = g.new_tag()
    src = os.path.join(bed.scratch, "wanbc-src-%s" % tag)
    want = make_file(src, SIZE, user)
    dest = "/tmp/wanbc-%s" % tag
    before = home_link_sent(bed)
    try:
        r = g.run("bcast", "--hosts", " ".join(HOSTS), src, dest, timeout=300)
        sent = home_link_sent(bed) - before
        assert r.returncode == 0, r.stderr
        for h in HOSTS:
            assert sha256_of(os.path.join(bed.host(h).tmp_dir, os.path.basename(dest))) == want, h
    finally:
        os.unlink(src)
        g.run("e", "--hosts", " ".join(HOSTS), "rm -f %s" % dest)
    return sent


def test_a_bcast_from_home_crosses_homes_wan_link_once(bed, g):
    sent = bcast_home(bed, g)
    assert sent < 1.4 * SIZE, "home's link carried %.2f copies" % (sent / SIZE)


def test_gateways_that_cannot_reach_each_other_are_fed_along_the_tree(bed, g):
    ga, gb = bed.host("ga").ip, bed.host("gb").ip
    r = bed.wan_shell("\n".join([
        "nft -f - <<'EOF'",
        "table ip %s {" % DROP_TABLE,
        "  chain prerouting {",
        "    type filter hook prerouting priority raw; policy accept;",
        "    ip saddr %s ip daddr %s drop" % (ga, gb),
        "    ip saddr %s ip daddr %s drop" % (gb, ga),
        "  }",
        "}",
        "EOF"]))
    assert r.returncode == 0, r.stderr
    try:
        sent = bcast_home(bed, g)
    finally:
        bed.wan_shell("nft delete table ip %s" % DROP_TABLE)
    # the second gateway fed from home after all: two copies on home's link
    assert sent > 1.8 * SIZE, "home's link carried %.2f copies" % (sent / SIZE)
