"""Site caches: each file another site holds crosses the WAN once per site
(issue 28, Hawk's migratory proxies).

A site is the head's notion (gxpstyle/head/sites.py: the hosts behind a
gateway, derived from the `use` rules explore followed); the head tells each
mount its own site and every peer's. A mount reading a file whose holder is in
another site (or at home, in no site) does not fetch it itself: it asks its
site's proxy for that file, a mount of its own site, with the data channel's
`read_peer` call (sshfsmux/direct/peer_relay.py). The proxy reads the file
through its own branch to the holder, so it is fetched over the WAN once, kept
in the proxy's replica store, and every later reader of the site gets it from
there, inside the site; readers that come while the fetch is under way join it
(DirectBranch.open_versioned). The reader files what it got under the holder's
name and version, as if it had come from the holder: its later opens check it
the same way.

Why these choices:
- Proxies are the site's own mounts, every one of them, not a few chosen
  nodes: they exist already (no agents to start or replace), their replica
  stores are bounded and evict by themselves, and the site's storage and
  links share the load. Hawk sizes an active pool from capacity misses and a
  backup pool from failures because its proxies are extra batch jobs; ours
  come and go with the nodes, and a proxy that is gone costs one fetch from
  the holder (below), never a failed read.
- A file goes to one proxy by rendezvous hashing (highest SHA-256 of proxy,
  holder and path): every reader of the site computes the same proxy from the
  same list with no table to share or keep in step, and a proxy added or
  removed moves only the files it wins or held, the property Hawk gets from
  extendible hashing, which would need a directory that every reader agrees
  on.
- Proxying only across sites: inside a site, or on a flat network, a reader
  fetches from the holder itself, as before.

A proxy that does not answer, refuses (an older mount) or fails is passed
over: the reader fetches from the holder itself, so a proxy lost costs WAN
bytes, never a read. The head and hosts in no site read as before.

Standard library only, Python 3.8 syntax (pushed to the nodes).
"""
from __future__ import annotations

import errno
import hashlib
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional


def direct_way(own_id: str, own_site: str, peer_id: str, peer_site: str) -> bool:
    """Whether this mount may try a direct connection to a peer's export: both
    in one site (or both in none), or both outside every site's inside (a
    gateway, a node in no site: they share the WAN). A site's other hosts
    answer their gateway only: a try there fails (on a real network often by
    its timeout, a private address that nobody answers) before the tree carries
    the channel anyway. Sites unknown (a mount with site_cache=off): always."""
    def outside(nid: str, site: str) -> bool:
        return not site or site == nid
    return own_site == peer_site or (outside(own_id, own_site) and outside(peer_id, peer_site))


def pick_proxy(proxies: List[str], holder: str, rel: str) -> Optional[str]:
    """The proxy (by name) that caches file `rel` of `holder` for its site:
    the highest hash of (proxy, holder, rel); None without proxies."""
    best, best_score = None, b""
    for name in proxies:
        score = hashlib.sha256(("%s\0%s\0%s" % (name, holder, rel)).encode()).digest()
        if best is None or score > best_score:
            best, best_score = name, score
    return best


class SiteProxies:
    """One mount's proxies: the mounts of its own site (itself included), by
    name, with their branches; it says which proxy reads a file for it."""

    def __init__(self, own_name: str, own_site: str, peers: List[Dict[str, Any]],
                 branches: Dict[str, Any]) -> None:
        self.own = own_name
        self.site = own_site
        self.lock = threading.Lock()
        site_of = {str(p.get("node")): str(p.get("site") or "") for p in peers}
        self.branches = {name: b for name, b in branches.items()
                         if own_site and site_of.get(name) == own_site}
        self.names = sorted(set(self.branches) | {own_name})
        # peers in other sites (or at home): their files come through the proxies
        self.remote = set(name for name, site in site_of.items() if own_site and site != own_site)

    def chooser(self, holder: str) -> Optional[Callable[[str], Any]]:
        """For the branch of `holder`: rel -> the proxy's branch, or None
        (this mount is the proxy, or there is none); None when `holder` is in
        this mount's own site or this mount is in no site."""
        if holder not in self.remote:
            return None

        def choose(rel: str) -> Any:
            with self.lock:
                name = pick_proxy(self.names, holder, rel)
                return None if name is None or name == self.own else self.branches.get(name)
        return choose

    def drop(self, gone: List[str]) -> None:
        """Proxies the head saw lost: their files go to the others."""
        with self.lock:
            self.names = [n for n in self.names if n not in gone or n == self.own]


def attach(branches: List[Any], own_name: str, own_site: str,
           peers: List[Dict[str, Any]]) -> SiteProxies:
    """Give each branch of a holder in another site the site proxy's way."""
    by_name = {str(b.node): b for b in branches if hasattr(b, "site_proxy")}
    proxies = SiteProxies(own_name, own_site, peers, by_name)
    for name, b in by_name.items():
        b.site_proxy = proxies.chooser(name)
    return proxies


def peer_source(fs_of: Callable[[], Any]) -> Callable[[str, str, Any], Any]:
    """The export server's read_peer source (peer_relay.py): this mount's
    branch to `node` reads `path` (from the replica store, or one fetch that
    the site's readers share); never through another proxy. A reader that
    holds the file already (a copy make's transfers placed there) while this
    store does not is answered from the holder's version alone: no fetch of
    a file nobody here reads."""
    def source(node: str, path: str, have: Any) -> Any:
        fs = fs_of()
        for b in (fs.branches if fs is not None else []):
            if not b.local and str(b.node) == node and hasattr(b, "open_versioned"):
                if have is not None and b.cache.current(b.replica_key(path)) is None:
                    version = b.version("/" + path)
                    if tuple(version) == tuple(have):
                        return None, version, None
                return b.open_versioned("/" + path)
        raise OSError(errno.ENOENT, "no branch of %s here" % node)
    return source
