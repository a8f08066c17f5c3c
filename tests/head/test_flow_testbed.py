"""Backpressure on real sshd hosts: 1 GB of `e` output from 8 hosts through an
ssh gateway, read slowly; every process (client, daemon, gateway agent, leaf
agents) stays under 100 MB RSS and every byte arrives. The hosts share the
head's pid namespace, so their agents' RSS is read from /proc here."""
from __future__ import annotations

import os

import pytest
from conftest import module_bed
from test_flow_backpressure import letter_command, read_slowly

pytestmark = pytest.mark.testbed

HOSTS = ["tf%02d" % i for i in range(1, 10)]      # tf01 the gateway, tf02-tf09 the leaves


@pytest.fixture(scope="module")
def bed():
    with module_bed(HOSTS, "gxpf") as b:
        yield b


def test_1gb_from_8_hosts_through_an_ssh_gateway_read_slowly(bed, make_gxp):
    g = make_gxp(bed=bed, user=next(iter(bed.users)))
    g.ok("use", "ssh", "head", "tf01")
    g.ok("use", "ssh", "tf01", "tf[[02-09]]")
    g.ok("explore", "tf[[01-09]]")
    pids = {}
    for line in g.ok("stat").stdout.splitlines()[1:]:
        parts = line.split()
        pids["daemon" if parts[1] == "head" else parts[1]] = int(line.split("pid=")[1].split()[0])
    assert sorted(pids) == ["daemon"] + HOSTS
    per_node = int(os.environ.get("GXP_FLOW_BYTES", str(128 << 20)))
    read_slowly(g, pids, "tf[[02-09]]", letter_command(per_node, "23456789", 4), 8, per_node)
