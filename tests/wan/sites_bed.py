"""A sites bed for one test module (issue 28): two sites behind their
gateways, the checkout and the venv hidden on every host, one ordinary user,
/dev/fuse open to users when asked; everything undone at the end."""
from __future__ import annotations

import contextlib

from conftest import REPO, bed_with, venv_dir

import testbed

SITES = {"sa": ["sa%02d" % i for i in range(1, 5)], "sb": ["sb%02d" % i for i in range(1, 5)]}
GATEWAYS = {"sa": "ga", "sb": "gb"}
RULES = [("head", "ga gb"), ("ga", "sa*"), ("gb", "sb*")]
ALL = ["ga", "gb"] + SITES["sa"] + SITES["sb"]


@contextlib.contextmanager
def sites_bed(user_prefix: str, fuse: bool = False, wan_rtt_ms: float = 100, **options):
    def start(b):
        b.up_sites(SITES, gateways=GATEWAYS, wan_rate="20mbit", wan_rtt_ms=wan_rtt_ms,
                   hide_paths=[REPO, venv_dir()], **options)
    with bed_with(start, testbed.sites_requirements_missing, user_prefix, fuse) as b:
        yield b


def explore_sites(g) -> None:
    """`use` rules through the gateways (README), then explore every host."""
    for src, dst in RULES:
        g.ok("use", "ssh", src, dst)
    g.ok("explore", "ga", "gb", "sa[[01-04]]", "sb[[01-04]]", timeout=300)
