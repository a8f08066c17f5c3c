"""A site proxy on 127.0.0.1 (sshfsmux/direct/peer_relay.py, gmount/site_cache.py):
readers of one site read a holder's file through their proxy's export with
read_peer; the holder streams it once however many read it at once, every
reader gets the same bytes filed under the holder's version, a reader that
holds the file already costs the holder a version check and no data (also when
the proxy has no copy), and an export that is no proxy makes the reader go to
the holder itself (issue 28). In-process, as any user."""
from __future__ import annotations

import hashlib
import os
import threading
from types import SimpleNamespace

import pytest
from test_export_server import KEY

from sshfsmux.branches.replica_cache import ReplicaCache
from sshfsmux.direct import branch as direct_branch
from sshfsmux.direct import export_server
from sshfsmux.direct import protocol as fs_protocol
from sshfsmux.gmount import site_cache

MiB = 1 << 20


@pytest.fixture
def site(tmp_path, cert_files, monkeypatch):
    """(holder's export server, make_proxy(), make_reader(proxy)), all closed at the end;
    a file's copy may be kept once its times are in the past (2 s in real use)."""
    monkeypatch.setattr(fs_protocol, "SETTLE_SECONDS", 0.0)
    certfile, keyfile, pin = cert_files
    made: list = []

    def server(root):
        os.makedirs(root, exist_ok=True)
        s = export_server.ExportServer(str(root), False, KEY, certfile, keyfile, pin,
                                       host="127.0.0.1", log=lambda line: None)
        made.append(s)
        return s

    def branch(srv, node, cache):
        b = direct_branch.DirectBranch("127.0.0.1", srv.port, KEY, pin, node, cache=cache)
        made.append(b)
        return b

    def store(name):
        c = ReplicaCache.persistent(str(tmp_path / name))
        made.append(c)
        return c

    holder = server(tmp_path / "holder")

    def make_proxy(serving=True):
        n = len(made)
        proxy = server(tmp_path / ("proxy%d" % n))
        to_holder = branch(holder, "holder", store("pstore%d" % n))
        proxy.to_holder = to_holder
        if serving:
            proxy.peer_source = site_cache.peer_source(lambda: SimpleNamespace(branches=[to_holder]))
        return proxy

    def make_reader(proxy):
        n = len(made)
        cache = store("rstore%d" % n)
        to_holder, to_proxy = branch(holder, "holder", cache), branch(proxy, "proxy", cache)
        to_holder.site_proxy = lambda rel: to_proxy
        return to_holder
    yield holder, make_proxy, make_reader
    for x in reversed(made):
        x.close()


def read_all(branch, path):
    h = branch.open_read(path)
    try:
        out, off = [], 0
        while True:
            piece = h.read(128 << 10, off)
            if not piece:
                return b"".join(out)
            out.append(piece)
            off += len(piece)
    finally:
        h.close()


def settled_file(root, name, data):
    with open(os.path.join(root, name), "wb") as f:
        f.write(data)


def test_readers_at_once_cost_the_holder_one_stream_and_get_the_same_bytes(site):
    holder, make_proxy, make_reader = site
    data = os.urandom(6 * MiB)
    settled_file(holder.root, "big", data)
    proxy = make_proxy()
    readers = [make_reader(proxy) for _ in range(4)]
    got: dict = {}
    threads = [threading.Thread(target=lambda r=r: got.update({id(r): read_all(r, "/big")}))
               for r in readers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [hashlib.sha256(got[id(r)]).digest() for r in readers] == [hashlib.sha256(data).digest()] * 4
    assert proxy.to_holder.stats["streams"] == 1 and holder.stats["calls"]["read_file"] == 1
    assert proxy.stats["calls"]["read_peer"] == 4
    assert all(r.stats.get("proxied") == 1 for r in readers)
    # each reader filed it under the holder's version: reopening moves no data
    assert read_all(readers[0], "/big") == data
    assert proxy.to_holder.stats["streams"] == 1 and proxy.to_holder.stats["reused"] == 1
    assert readers[0].stats["reused"] == 1


def test_a_reader_holding_the_file_costs_a_version_check_where_the_proxy_has_none(site):
    holder, make_proxy, make_reader = site
    data = os.urandom(MiB)
    settled_file(holder.root, "f", data)
    reader = make_reader(make_proxy())
    assert read_all(reader, "/f") == data
    fresh = make_proxy()            # a proxy with an empty store
    reader.site_proxy = make_reader(fresh).site_proxy
    assert read_all(reader, "/f") == data
    assert holder.stats["calls"]["read_file"] == 1 and holder.stats["calls"]["version"] == 1
    assert fresh.to_holder.stats["streams"] == 0 and reader.stats["reused"] == 1


def test_an_export_that_is_no_proxy_leaves_the_read_to_the_holder(site):
    holder, make_proxy, make_reader = site
    data = os.urandom(MiB)
    settled_file(holder.root, "f", data)
    reader = make_reader(make_proxy(serving=False))
    assert read_all(reader, "/f") == data
    assert reader.stats["proxy_failed"] == 1 and reader.stats["streams"] == 1
