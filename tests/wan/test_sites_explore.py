"""The session's tree on the sites bed (issue 28): explored through the
gateways as README shows, a command on every node, a file to every node."""
from __future__ import annotations

import os
import socket

import pytest
from sites_bed import ALL, explore_sites, sites_bed
from test_bcast_testbed import make_file

from testbed import sha256_of

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def bed():
    with sites_bed("gxpw") as b:
        yield b


def test_explore_through_the_gateways_then_e_and_bcast_reach_every_node(bed, make_gxp):
    user = next(iter(bed.users))
    g = make_gxp(bed=bed, user=user)
    explore_sites(g)
    out = g.ok("stat").stdout.splitlines()
    assert out[0].split(";")[0] == "%d nodes up, 0 lost" % (len(ALL) + 1), out
    parent = {}
    stack: list = []
    for line in out[1:]:
        depth = (len(line) - len(line.lstrip())) // 2
        stack[depth:] = [line.split()[1]]
        parent[stack[-1]] = stack[depth - 1] if depth else None
    assert parent["ga"] == parent["gb"] == "head"
    assert all(parent[h] == "g" + h[1] for h in ALL[2:]), parent
    names = g.ok("e", "hostname").stdout.split()
    assert sorted(names) == sorted(ALL + [socket.gethostname()])
    src = "/tmp/wansrc-%s" % g.new_tag()
    want = make_file(src, 4 << 20, user)
    dest = os.path.join(bed.scratch, "copy-" + g.new_tag())
    r = g.run("bcast", "--hosts", "*", src, dest, timeout=300)
    assert r.returncode == 0, r.stderr
    for h in ALL:
        assert sha256_of(os.path.join(bed.host(h).scratch_dir, os.path.basename(dest))) == want, h
