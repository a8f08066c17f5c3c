"""Site caches on the sites bed (issue 28): a file only site a holds, read
at once by the 4 hosts of site b, crosses the WAN about once (through site
b's proxy: sshfsmux/gmount/site_cache.py), not 4 times; every reader gets
the same bytes; `gxpc stat` counts what crossed. With `-o site_cache=off`
the router carries 4 copies (each reader fetches it along the tree). A
proxy killed in the middle of a read leaves the rest to the holder: the read
completes with the right bytes."""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import signal
import subprocess
import threading
import time

import pytest
from sites_bed import SITES, sites_bed
from test_sites_mount import mounted_sites, on

from sshfsmux.gmount.site_cache import pick_proxy

pytestmark = pytest.mark.testbed

MIB = 1 << 20
SIZE = 4 * MIB


@pytest.fixture(scope="module")
def bed():
    with sites_bed("gxpwc", fuse=True) as b:
        yield b


def put_bytes(bed, host, export, rel, data):
    """A file in `host`'s export, written there directly (only that host holds it)."""
    pw = pwd.getpwnam(next(iter(bed.users)))
    path = os.path.join(bed.host(host).tmp_dir, os.path.basename(export), rel)
    if not os.path.isdir(os.path.dirname(path)):
        os.makedirs(os.path.dirname(path))
        os.chown(os.path.dirname(path), pw.pw_uid, pw.pw_gid)
    with open(path, "wb") as f:
        f.write(data)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def router_tx_bytes(bed) -> int:
    """Bytes the WAN's router sent on all its links (as benchmarks/wan.py counts)."""
    r = subprocess.run(["ip", "-n", bed.router_ns, "-s", "-j", "link"],
                       capture_output=True, text=True, check=True)
    return sum(link.get("stats64", {}).get("tx", {}).get("bytes", 0) for link in json.loads(r.stdout))


def stat_wan_bytes(g) -> int:
    r = g.ok("stat")
    m = re.search(r"; WAN: (\d+) bytes between sites \(site ga: .*site gb: .*\)$", r.stdout, re.M)
    assert m, r.stdout
    return int(m.group(1))


def wait_visible(bed, hosts, path, seconds=30.0):
    deadline = time.monotonic() + seconds
    for host in hosts:
        while on(bed, host, "test -s %s" % path).returncode != 0:
            assert time.monotonic() < deadline, "%s not visible on %s" % (path, host)
            time.sleep(0.2)


def read_at_once(bed, hosts, path):
    """sha256 of `path` as each host read it, all at once."""
    got = {}

    def read(host):
        got[host] = on(bed, host, "sha256sum < %s" % path, timeout=120)
    threads = [threading.Thread(target=read, args=(h,)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for host, r in got.items():
        assert r.returncode == 0, (host, r.stderr)
    return {host: r.stdout.split()[0] for host, r in got.items()}


def test_a_file_read_by_a_whole_site_crosses_the_wan_once(bed):
    readers = SITES["sb"]
    data = os.urandom(SIZE)
    want = hashlib.sha256(data).hexdigest()
    with mounted_sites(bed) as (g, export, mnt):
        put_bytes(bed, "sa01", export, "only_sa01.bin", data)
        path = os.path.join(mnt, "only_sa01.bin")
        wait_visible(bed, readers, path)
        router0, stat0 = router_tx_bytes(bed), stat_wan_bytes(g)
        assert read_at_once(bed, readers, path) == {h: want for h in readers}
        # one copy crosses two WAN links (site a -> head -> site b, the tree's
        # way): about 2 x SIZE on the router; 4 readers fetching it themselves
        # would be 8 x SIZE
        router = router_tx_bytes(bed) - router0
        counted = stat_wan_bytes(g) - stat0
        print("WAN bytes / file size: router %.2f, gxpc stat %.2f" % (router / SIZE, counted / SIZE))
        assert 1.9 * SIZE < router < 3.0 * SIZE, router / SIZE
        assert 1.9 * SIZE < counted < 3.0 * SIZE, counted / SIZE
        # the same on a mount without site caches: every reader's own copy
        export2, mnt2 = export + "-off", mnt + "-off"
        g.ok("e", "mkdir -p %s %s" % (export2, mnt2))
        try:
            g.ok("mount", export2, mnt2, "-o", "site_cache=off", timeout=300)
            put_bytes(bed, "sa01", export2, "only_sa01.bin", data)
            path = os.path.join(mnt2, "only_sa01.bin")
            wait_visible(bed, readers, path)
            router0 = router_tx_bytes(bed)
            assert read_at_once(bed, readers, path) == {h: want for h in readers}
            router = router_tx_bytes(bed) - router0
            print("without site caches: router %.2f" % (router / SIZE))
            assert router > 7.5 * SIZE, router / SIZE
        finally:
            g.run("umount", mnt2, timeout=120)
            g.run("e", "rm -rf %s %s" % (export2, mnt2), timeout=120)


def partial_replica(bed, host, at_least):
    """Whether a replica download of at least `at_least` bytes is under way on `host`."""
    for top, _dirs, files in os.walk(bed.host(host).tmp_dir):
        for name in files:
            if name.startswith(".tmp-") and name.endswith(".part"):
                try:
                    if os.path.getsize(os.path.join(top, name)) >= at_least:
                        return True
                except OSError:
                    pass
    return False


def test_a_proxy_killed_mid_read_leaves_the_rest_to_the_holder(bed):
    size = 8 * MIB
    data = os.urandom(size)
    want = hashlib.sha256(data).hexdigest()
    proxies = ["gb"] + SITES["sb"]
    # a file site b reads through sb02 (every reader picks the same proxy)
    rel = next("killed-%d.bin" % i for i in range(1000)
               if pick_proxy(proxies, "sa01", "killed-%d.bin" % i) == "sb02")
    with mounted_sites(bed) as (g, export, mnt):
        put_bytes(bed, "sa01", export, rel, data)
        path = os.path.join(mnt, rel)
        wait_visible(bed, ["sb01"], path)
        m = re.search(r"gmount@sb02 \(sb02\) \[gmount\] up pid=(\d+)", g.ok("stat").stdout)
        assert m, "no mount service on sb02"
        got = {}
        reader = threading.Thread(target=lambda: got.update(r=on(bed, "sb01", "sha256sum < %s" % path)))
        reader.start()
        deadline = time.monotonic() + 60
        while not partial_replica(bed, "sb02", MIB):
            assert time.monotonic() < deadline and reader.is_alive(), "sb02 never fetched it"
            time.sleep(0.05)
        os.kill(int(m.group(1)), signal.SIGKILL)
        reader.join()
        r = got["r"]
        assert r.returncode == 0 and r.stdout.split()[0] == want, r.stderr


MAKEFILE = """\
all: o1 o2 o3 o4
o%: in% ref
\tcat ref in$* | sha256sum > $@
"""


def test_make_pushes_an_input_to_a_site_across_the_wan_once(bed):
    # 4 recipes placed in site b (each near its own 8 MiB input) read one 4 MiB
    # reference only sa01 holds: the planned transfers bring it over the WAN
    # once, then spread it inside the site
    ref = os.urandom(SIZE)
    ins = {i: os.urandom(2 * SIZE) for i in range(1, 5)}
    with mounted_sites(bed) as (g, export, mnt):
        work = os.path.join(mnt, "work")
        put_bytes(bed, "sa01", export, "work/ref", ref)
        for i, data in ins.items():
            put_bytes(bed, "sb%02d" % i, export, "work/in%d" % i, data)
        wait_visible(bed, ["sb01"], os.path.join(work, "ref"))
        r = bed.run_as(g.user, ["sh", "-c", 'cat > "$0"/Makefile', work], input=MAKEFILE,
                       capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        for i in ins:
            wait_visible(bed, ["sb01"], os.path.join(work, "in%d" % i))
        router0 = router_tx_bytes(bed)
        trace = os.path.join(os.path.dirname(g.session_dir), "trace.jsonl")
        r = g.run("make", "-j", "4", "--explain-placement", "--trace=" + trace, cwd=work,
                  timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        router = router_tx_bytes(bed) - router0
        r_trace = bed.run_as(g.user, ["cat", trace], capture_output=True, text=True, timeout=60)
        wan = [json.loads(line) for line in r_trace.stdout.splitlines() if '"wan"' in line]
        assert len(wan) == 1 and set(wan[0]["sites"]) == {"ga", "gb"}, r_trace.stdout
        print("make: WAN bytes / reference size: router %.2f, trace %.2f"
              % (router / SIZE, wan[0]["bytes"] / SIZE))
        assert 1.9 * SIZE < wan[0]["bytes"] < 3.0 * SIZE
        for i, data in ins.items():
            want = hashlib.sha256(ref + data).hexdigest()
            got = on(bed, "sb01", "cat %s/o%d" % (work, i))
            assert got.returncode == 0 and got.stdout.split()[0] == want, (i, got.stderr)
        assert all("sb%02d" % i in r.stderr for i in ins), r.stderr
        assert router < 3.0 * SIZE, router / SIZE
