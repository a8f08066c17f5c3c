"""GMount's per-node service (role "gmount"): an export server on EXPORT and, once
the head sends the peers, the merged FUSE mount at MOUNTPOINT.

It runs as a child node of the node's agent, started by the same bootstrap and
loaded from memory (the head pushed these modules). FUSE takes the main thread;
the node's event loop runs beside it. GMountNode holds the node's state and
answers the head's calls (one method each: mount, umount, scan, changed,
adopt, pin, drop_peers, changes); work that may block (FUSE, the peers, the
disk) runs on a thread of its own and answers through the loop. Shutdown
(quit, or the agent going away) unmounts and closes.

Standard library plus modules the head pushes (sshfsmux, mfusepy).
"""
from __future__ import annotations

import errno
import os
import stat
import subprocess
import threading
import zlib

from gxpstyle.api.node_side import NodeSide

# The host's addresses and the pick of a peer's: the core's (its transfers' direct links use them too).
from gxpstyle.transport.link_auth import local_addresses, pick_address
from sshfsmux.fs.namespace_copy import NamespaceCopy
from sshfsmux.gmount import replica_trust
from sshfsmux.gmount.change_feed import ChangeFeed, ChangesWaiting
from sshfsmux.gmount.change_report import copies_of
from sshfsmux.gmount.generation import Generation
from sshfsmux.gmount.mount_settings import MountSettings, fuse_conf_allows_other, is_mounted  # noqa: F401
from sshfsmux.gmount.serial_work import SerialWork

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Set, Tuple

    from sshfsmux.branches.branch import Branch

    Reply = Callable[..., None]

MOUNT_WAIT = 20.0
# Adoptions run on this many threads, a file always on the same one: each asks
# the holder for the file's version, and a holder across a WAN (a first
# contact: its data channel set up along the tree) costs a second, so one at
# a time a merge's inputs from another site waited 8 s in a row (issue 28).
ADOPT_LANES = 8
# What the head pushes to a node for this service, dependencies first.
NODE_MODULES = [
    "gxpstyle.node.tree_streams",    # the data channel's way where no direct one exists
    "gxpstyle.node.node_calls",      # a recipe's node asks its mount itself (recipe_changes.py)
    "sshfsmux.branches.branch", "sshfsmux.branches.confined_paths", "sshfsmux.direct.transport",
    "sshfsmux.direct.protocol",
    "sshfsmux.branches.local_syscalls", "sshfsmux.branches.local_branch",
    "sshfsmux.branches.replica_cache", "sshfsmux.direct.channel",
    "sshfsmux.direct.files", "sshfsmux.direct.branch",
    "sshfsmux.fs.mount_nesting", "sshfsmux.fs.fuse_glue", "sshfsmux.fs.access_memo",
    "sshfsmux.fs.merged_handles",
    "sshfsmux.fs.link_names", "sshfsmux.fs.merged_changes", "sshfsmux.fs.merged_xattrs",
    "sshfsmux.fs.namespace_copy", "sshfsmux.fs.merged_namespace", "sshfsmux.fs.merged_fs",
    "sshfsmux.direct.peer_relay",
    "sshfsmux.direct.export_server", "sshfsmux.gmount.export_scan", "sshfsmux.fs.kernel_cache",
    "sshfsmux.gmount.export_watch", "sshfsmux.gmount.change_report", "sshfsmux.gmount.change_feed",
    "sshfsmux.gmount.serial_work", "sshfsmux.gmount.generation", "sshfsmux.gmount.replica_trust",
    "sshfsmux.gmount.mount_settings", "sshfsmux.gmount.site_cache",
    "sshfsmux.gmount.node", "mfusepy",
]


def fusermount() -> str:
    for name in ("fusermount3", "fusermount"):
        for d in os.environ.get("PATH", "/usr/bin:/bin").split(":") + ["/usr/bin", "/bin"]:
            path = os.path.join(d, name)
            if os.access(path, os.X_OK):
                return path
    return "fusermount"


def unmount(mountpoint: str) -> str:
    """Unmount; a busy mount is detached lazily. Returns '' or the error line."""
    fm = fusermount()
    r = subprocess.run([fm, "-u", mountpoint], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=30)
    if r.returncode != 0 and is_mounted(mountpoint):
        r = subprocess.run([fm, "-u", "-z", mountpoint], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=30)
        if r.returncode != 0 and is_mounted(mountpoint):
            return r.stderr.decode("utf-8", "replace").strip() or "fusermount failed"
    return ""


class GMountNode(ChangeFeed, NodeSide):
    """One node's GMount: the export server (up from the start), the merged
    FUSE mount (once the head sends the peers), and the answers to the head's
    calls. The role node's side (gxpstyle/api/node_side.py): it stops with the node."""

    def __init__(self, node: Any, config: Dict[str, Any]) -> None:
        from sshfsmux.direct.export_server import ExportServer
        from sshfsmux.direct.protocol import data_channel_key

        super().__init__()
        self.node = node
        self.cfg = MountSettings(config, node.name)
        certfile, keyfile = node.tls_files()
        self.pin = node.opts["pin"]
        self.key = data_channel_key(node.secret)
        self.cache_dir = os.path.join(node.ensure_session_dir(), "replicas")
        # what a recipe's node reads to know the recipe changed nothing here
        self.generation = Generation(os.path.join(node.ensure_session_dir(),
                                                  "gmount-generation-%d" % os.getpid()))
        self.server = ExportServer(self.cfg.export, self.cfg.ro, self.key, certfile, keyfile,
                                   self.pin, cipher=self.cfg.cipher, log=self.log)
        self.own = local_addresses()
        self.fs: Any = None               # the MergedFS, once mounted
        self.cache: Any = None            # the replica store, once mounted
        self.proxies: Any = None          # its site's proxies (site_cache.py), once mounted
        self.kcache: Any = None           # the mount's kernel cache handle (FUSE init)
        self.fuse_context: Any = None     # mfusepy's fuse_get_context, once mounted
        # this node's agent (our parent: role nodes are its children), whose
        # FUSE calls never wait for the head (_may_wait)
        self.agent_pid = os.getppid()
        self.stopping = False
        self.up = False
        self.error = ""
        self.mount_reply: Optional[Reply] = None
        self.go = threading.Event()         # the runner may start FUSE (or give up)
        self.settled = threading.Event()    # FUSE is up, or failed, or stopped
        self.changes_waiting = ChangesWaiting()
        self.ns_seq: Optional[int] = None   # the last `ns` call's number (_gap)
        self.watch: Any = None            # ExportWatch, while mounted with peers
        # off the loop, in order: dropping kernel entries (it may wait for
        # the kernel), and work that may wait for the disk or the peers
        self.kernel_work = SerialWork("kernel caches", self.log)
        self.peer_work = SerialWork("mount work", self.log)
        self.adopt_work = [SerialWork("adopt %d" % i, self.log) for i in range(ADOPT_LANES)]

    def info(self) -> Dict[str, Any]:
        """What the head learns of this node's service when it starts."""
        return {"port": self.server.port, "addrs": self.own, "node": self.cfg.host_name,
                "store": self.cache_dir, "generation": self.generation.path}

    def calls(self) -> Dict[str, Callable[..., None]]:
        return {"mount": self.mount, "umount": self.umount, "scan": self.scan,
                "changed": self.changed, "drop_peers": self.drop_peers,
                "changes": self.changes, "adopt": self.adopt, "pin": self.pin_replicas,
                "listing": self.listing, "ns": self.namespace_changed, "ready": self.ready}

    # -- plumbing ------------------------------------------------------------
    def log(self, text: str) -> None:
        self.node.loop.call_soon_threadsafe(lambda: self.node.log(text))

    def in_loop(self, fn: Callable[..., None], *args: Any) -> None:
        self.node.loop.call_soon_threadsafe(lambda: fn(*args))

    @staticmethod
    def in_thread(work: Callable[[], None]) -> None:
        """Work that may block (FUSE, the peers, the disk): never on the loop."""
        threading.Thread(target=work, daemon=True).start()

    # -- mount, umount ---------------------------------------------------------
    def mount(self, args: Dict[str, Any], reply: Reply) -> None:
        if self.fs is not None:
            reply(False, "already mounted")
            return
        self.in_thread(lambda: self._mount(args, reply))

    def _mount(self, args: Dict[str, Any], reply: Reply) -> None:
        mountpoint = self.cfg.mountpoint
        try:
            self.fs = self._merged_fs(list(args.get("peers", [])), str(args.get("site") or ""))
        except OSError as e:
            self.in_loop(reply, False, "cannot mount %s: %s" % (mountpoint, e.strerror or e))
            return
        except Exception as e:
            self.in_loop(reply, False, "cannot mount %s: %s" % (mountpoint, e))
            return
        self.mount_reply = reply
        if self.fs.namespace is not None:
            self._watch_export()
        self.go.set()
        # FUSE's init callback (the mount is up) or the runner's end (it
        # failed) sets `settled`; the bound only covers a libfuse that hangs
        self.settled.wait(MOUNT_WAIT)
        if self.up:
            self.in_loop(reply, True, "", {"mountpoint": mountpoint})
            return
        self.in_loop(reply, False, self.error or ("mount stopped" if self.stopping else
                                                  "mount did not appear within %gs" % MOUNT_WAIT))

    def _merged_fs(self, peers: List[Dict[str, Any]], site: str) -> Any:
        from sshfsmux.branches.local_branch import LocalBranch
        from sshfsmux.branches.replica_cache import ReplicaCache
        from sshfsmux.direct.branch import DirectBranch, tree_way
        from sshfsmux.fs import merged_fs
        from sshfsmux.gmount import site_cache

        cfg = self.cfg
        # one replica store for every peer, kept for the session
        cache = self.cache = ReplicaCache.persistent(self.cache_dir, limit=cfg.cache_size)
        branches: List[Branch] = [LocalBranch(cfg.export, node=cfg.host_name)]
        own_id = self.host.id.rsplit(".", 1)[0] if self.host is not None else ""   # our agent
        for p in peers:
            # None: along the tree at once (another site's host answers its gateway only)
            host = pick_address(list(p.get("addrs") or []), self.own) if site_cache.direct_way(
                own_id, site, str(p.get("id") or ""), str(p.get("site") or "")) else None
            branches.append(DirectBranch(host, int(p["port"]), self.key, self.pin,
                                         node=str(p["node"]), cipher=cfg.cipher, cache=cache,
                                         timeout=cfg.timeout, via_tree=tree_way(
                                             self.host, p.get("id"), int(p["port"]), self.log)))
        for b in branches[1:]:      # replicas opened without asking (replica_trust.py)
            assert isinstance(b, DirectBranch)
            b.known = replica_trust.known_file(self._copy, b.node)
        self.proxies = site_cache.attach(branches, cfg.host_name, site, peers)  # other sites' files
        self.server.peer_source = site_cache.peer_source(lambda: self.fs)
        fs = merged_fs.MergedFS(branches, mountpoint=cfg.mountpoint, read_only=cfg.ro,
                                node=cfg.host_name, log=self.log, branch_places=cfg.places,
                                on_ready=self._fuse_ready)
        fs.on_change = self._on_change
        fs.generation = self.generation
        self.fuse_context = merged_fs.fuse_get_context
        if len(branches) > 1:
            fs.namespace = NamespaceCopy(self._ask_listings, self._may_wait, cfg.timeout)
        calls = self.server.stats["calls"]
        fs.served = lambda: dict(calls)
        return fs

    def _watch_export(self) -> None:
        """Changes made straight into the export go into the change feed too."""
        from sshfsmux.gmount.export_watch import ExportWatch
        try:
            self.watch = ExportWatch(self.cfg.export, self._on_export_changes, self.log)
        except OSError as e:
            self.log("changes made straight into %s show only through the mount: %s"
                     % (self.cfg.export, e.strerror or e))

    def _unwatch(self) -> None:
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.close()

    # -- the namespace copy (sshfsmux/fs/namespace_copy.py, gmount/namespace_feed.py) ---
    def _may_wait(self) -> bool:
        """Whether this FUSE call may wait for the head's listing: not when
        the caller is this node's agent (the listing comes through its loop;
        its chdir for a job would wait for itself), nor off FUSE's threads."""
        try:
            _uid, _gid, pid = self.fuse_context()
        except Exception:
            return False
        return bool(pid) and pid != self.agent_pid

    def _copy(self) -> Any:
        """The mount's namespace copy, or None."""
        return self.fs.namespace if self.fs is not None else None

    def _ask_listings(self, keys: List[str]) -> None:      # a FUSE thread
        from gxpstyle.protocol import wire
        host = self.host
        if host is None:
            raise OSError(errno.EIO, "not started")
        self.node.loop.call_soon_threadsafe(lambda: host.send(wire.HEAD, "dirs", {"dirs": keys}))

    def listing(self, args: Dict[str, Any], reply: Reply) -> None:
        """Listings the head sends for directories this mount asked for."""
        fs = self.fs
        if fs is not None and fs.namespace is not None:
            # the changes made while this mount held no listing reached no one
            replica_trust.drop_announced(fs.branches, fs.namespace, args.get("dirs"))
            self._drop_kernel_entries(fs.namespace.fill(args.get("dirs") or {}))
        reply(True, "", {})
        self._arm()         # changes that waited for these listings

    def _drop_kernel_entries(self, paths: List[str],
                             then: Optional[Callable[[], None]] = None,
                             own: Optional[Set[str]] = None) -> None:
        """Drop the kernel's caches of `paths` on the kernel cache thread (never
        in a FUSE call), then then() (also when that fails: logged). With
        `own` (names this mount changed lately), a file of this export that
        is not among them was made there by a peer (a rename through this
        export's server) or behind the mount: the kernel's miss of it goes
        too (kernel_cache.py keeps the entries of names in the export)."""
        kc = self.kcache
        if kc is None or not paths:
            if then is not None:
                then()
            return
        # a directory is never taken for a miss where entries are dropped, not
        # expired: dropping one that exists leaves its processes without a cwd
        def made_here(p: str) -> bool:
            kind = self._export_kind(p)
            return (kind == "dir" and not kc.expires) or (kind != "" and (own is None or p in own))

        def work() -> None:
            try:
                kc.invalidate_paths(paths, exists=made_here, gone=self._gone)
            except Exception as e:
                self.log("cannot drop kernel caches: %s" % e)
            if then is not None:
                then()
        self.kernel_work.put(work)

    def namespace_changed(self, args: Dict[str, Any], reply: Reply) -> None:
        """Changes the head saw under directories this mount holds: into the
        copy at once, then out of the kernel's caches (on a thread: never
        inside a FUSE call); answered once both are done."""
        fs = self.fs
        if fs is None or fs.namespace is None:
            reply(True, "", {})
            return
        # names this mount changed that the head's word may predate keep
        # the copy's (this mount's own) state
        keep = self._unsettled(args.get("taken"))
        replica_trust.drop_announced(fs.branches, fs.namespace, args.get("dirs"))
        paths = self._gap(args.get("seq")) + fs.namespace.update(args.get("dirs") or {}, keep)
        fs.forget_access(paths)
        if self.kcache is None:
            reply(True, "", {})
            return
        # after the kernel work of the calls before it, even with none of its
        # own: answers in order (namespace_feed.py counts them)
        def answer() -> None:
            self.in_loop(reply, True, "", {})
        if paths:
            self._drop_kernel_entries(paths, answer, keep)
        else:
            self.kernel_work.put(answer)

    def ready(self, args: Dict[str, Any], reply: Reply) -> None:
        """A job on this host is about to start (its node asks: node_calls.py):
        answered once every change and listing the head sent before it, which
        came first down the same links, is in the copy and out of the
        kernel's caches (that work is done in order). `pin`: the job's
        inputs, kept in the replica store until its end (pin_replicas)."""
        self._pin(args.get("pin") or [], True)
        if args.get("job"):
            self.recipe_started(str(args["job"]))
        if args.get("notice"):      # its node does not wait: no answer (node_calls.py)
            return
        if self.kcache is None:
            reply(True, "", {})
            return
        self.kernel_work.put(lambda: self.in_loop(reply, True, "", {}))

    def _gap(self, seq: Any) -> List[str]:
        """The head numbers its `ns` calls: one skipped (a change this copy
        never heard of) makes the copy start over (namespace_copy.forget_all);
        returns the names whose kernel entries go with it."""
        if not isinstance(seq, int) or isinstance(seq, bool):
            return []
        last, self.ns_seq = self.ns_seq, seq
        if last is None or seq == last + 1:
            return []
        self.log("gmount: namespace changes %d to %d never came: every listing is fetched "
                 "again" % (last + 1, seq - 1))
        return self.fs.namespace.forget_all()

    def _gone(self, path: str) -> bool:
        """`path` ("/a/b") is in no export: not in ours, and the copy holds
        its directory without it."""
        ns = self.fs.namespace if self.fs is not None else None
        return ns is not None and ns.known_gone(path) and not self.in_export(path)

    def _dir_held(self, path: str) -> bool:
        ns = self.fs.namespace if self.fs is not None else None
        return ns is not None and ns.held(path.strip("/"))

    def _fuse_ready(self) -> None:
        from sshfsmux.fs.kernel_cache import KernelCache
        # FUSE's init callback: the one place the mount's `struct fuse *` is
        # visible, kept for the "changed" call (kernel_cache.py)
        self.kcache = KernelCache.capture(self.cfg.mountpoint, self._dir_held)
        if self.fs is not None:
            self.fs.dirs_moved = self.kcache.forget_dirs
        self.up = True
        self.settled.set()

    def umount(self, args: Dict[str, Any], reply: Reply) -> None:
        w = self.changes_waiting
        with w.lock:
            waiting, w.reply = w.reply, None
        if waiting is not None:
            waiting(False, "unmounted", {})
        mountpoint = self.cfg.mountpoint

        def work() -> None:
            self._unwatch()
            err = unmount(mountpoint) if is_mounted(mountpoint) else ""
            self.in_loop(reply, not err, err)
        self.in_thread(work)

    # -- the replica catalog's calls ---------------------------------------------
    def scan(self, args: Dict[str, Any], reply: Reply) -> None:
        """A page of this node's export for the head's replica catalog."""
        from sshfsmux.gmount import export_scan
        export = self.cfg.export

        def work() -> None:
            try:
                files, more = export_scan.scan_page(export, int(args.get("offset") or 0))
            except Exception as e:
                self.in_loop(reply, False, "cannot scan %s: %s" % (export, e))
                return
            self.in_loop(reply, True, "", {"files": files, "more": more})
        self.peer_work.put(work)

    def _export_kind(self, path: str) -> str:
        """The export's `path`: "dir" (or a link to one), "other", "" (nothing)."""
        full = os.path.join(self.cfg.export, path.lstrip("/"))
        try:
            mode = os.lstat(full).st_mode
        except OSError:
            return ""
        if stat.S_ISDIR(mode) or (stat.S_ISLNK(mode) and os.path.isdir(full)):
            return "dir"
        return "other"

    def in_export(self, path: str) -> bool:
        """A name of the mount is in this node's export (no peer asked)."""
        return os.path.lexists(os.path.join(self.cfg.export, path.lstrip("/")))

    def changed(self, args: Dict[str, Any], reply: Reply) -> None:
        """Files (relative to the mount's root) another node or this one just
        wrote: drop this mount's kernel caches for them and, with "describe",
        say what this node's export holds of them. Answered once done, so the
        head can hold make's exit status until every mount has acted."""
        from sshfsmux.gmount import export_scan
        rels = [str(p) for p in args.get("paths") or []]
        pending, seq = self._take_pending() if args.get("describe") or args.get("feed") \
            else ([], 0)
        self._pin(args.get("unpin") or [], False)      # a job's inputs, pinned by `ready`
        # `writer`: the recipe ran on this node, through this mount: the
        # kernel here saw its changes to names only this export holds; a
        # name others hold too (`>> build.log` from several nodes) may have
        # changed meanwhile there: its kernel entry goes. With none such,
        # nothing of the feed to describe (no peer asked) and small files
        # (hashed here), the answer needs no thread: most recipes' end
        writer = bool(args.get("writer"))
        if writer and args.get("job"):
            self.recipe_ended(str(args["job"]))
        shared = [r for r in rels if not (writer and self._ours_alone(r))]

        def work(answer: Reply) -> None:
            try:
                files = export_scan.describe(self.cfg.export, rels) if args.get("describe") else []
                # the feed's changes not sent yet (a recipe's side files) go
                # with its targets, so make hears of both at once; a name gone
                # from every branch waits for the feed (the other mounts drop
                # it first)
                copies, gone = copies_of(self.fs, pending) if pending else ([], [])
                self._requeue(gone)
                if self.fs is not None:
                    self.fs.forget_access(["/" + r.lstrip("/") for r in rels])
                kc, drop = self.kcache, ["/" + r.lstrip("/") for r in shared]
                dropped = kc.invalidate_paths(drop, exists=self.in_export) if kc and drop else 0
            except Exception as e:
                answer(False, "cannot act on changed files: %s" % e)
                return
            answer(True, "", {"files": files, "invalidated": dropped, "copies": copies,
                              "seq": seq})
        if not shared and self._no_peer_asked(pending) and export_scan.small(self.cfg.export, rels):
            work(reply)         # on the loop: no peer asked, no kernel entry to drop
        else:
            self.peer_work.put(lambda: work(lambda *a: self.in_loop(reply, *a)))

    def _ours_alone(self, rel: str) -> bool:
        """The copy names no other holder of `rel` (in this export, or nowhere)."""
        fs = self.fs
        return fs is not None and fs.namespace is not None and \
            fs._remote_holders("/" + rel.lstrip("/")) == []

    def _no_peer_asked(self, rels: List[str]) -> bool:
        """Describing `rels` for the feed asks no peer: the copy holds each
        one's directory and names no other holder of it (a recipe's new
        files, most of the time)."""
        fs = self.fs
        if not rels:
            return True
        if fs is None or fs.namespace is None:
            return False
        return all(fs._remote_holders("/" + r.lstrip("/")) == [] for r in rels)

    def adopt(self, args: Dict[str, Any], reply: Reply) -> None:
        """A complete, verified copy of a file of the mount (a transfer the head
        planned before a recipe runs here) sits at `file` in the replica store's
        directory: make it the replica the mount reads that file from (keyed by
        the first branch holding it, at the version that export has now), so reading it
        through the mount moves no data. Answers {"kept": "store"|"local"}."""
        rel = "/" + str(args.get("path") or "").lstrip("/")
        file = str(args.get("file") or "")

        def work() -> None:
            try:
                kept = self._adopt(rel, file)
            except Exception as e:
                try:
                    os.unlink(file)
                except OSError:
                    pass
                self.in_loop(reply, False, "cannot adopt %s: %s"
                             % (rel, getattr(e, "strerror", None) or e))
                return
            self.in_loop(reply, True, "", {"kept": kept})
        self.adopt_work[zlib.crc32(rel.encode("utf-8", "surrogateescape")) % ADOPT_LANES].put(work)

    def _adopt(self, rel: str, file: str) -> str:
        if os.path.dirname(os.path.abspath(file)) != self.cache_dir:
            raise ValueError("not in the replica store")
        fs = self.fs
        if fs is None:
            raise ValueError("not mounted")
        v = fs.file_view(rel)
        if v.is_dir:
            raise ValueError("a directory")
        if any(b.local for b, _ in v.replicas):
            os.unlink(file)         # this host's export holds it already
            return "local"
        # keyed by the branch the merged tree reads the file from
        # (merged_fs._reader: the first holder, with no local one)
        cands = [b for b, _ in v.replicas if hasattr(b, "adopt")]
        if not cands or cands[0].adopt(rel, file) is None:
            raise ValueError("the copy does not match the file's current version")
        return "store"

    def pin_replicas(self, args: Dict[str, Any], reply: Reply) -> None:
        """The head pins (or unpins) a recipe's inputs for the recipe's life:
        their replicas here are not evicted meanwhile (replica_cache.py)."""
        if self.fs is None or self.cache is None:
            reply(False, "not mounted", {})
            return
        self._pin(args.get("paths") or [], bool(args.get("pin")))
        reply(True, "", {})

    def _pin(self, paths: List[Any], pin: bool) -> None:
        from sshfsmux.direct.branch import DirectBranch
        fs, cache = self.fs, self.cache
        if fs is None or cache is None or not paths:
            return
        # keyed as DirectBranch.adopt and its reads key them: branch and wire path ("a/b")
        rels = [str(p).strip("/") for p in paths]
        keys = [b.replica_key(r) for r in rels for b in fs.branches if isinstance(b, DirectBranch)]
        (cache.pin if pin else cache.unpin)(keys)

    def drop_peers(self, args: Dict[str, Any], reply: Reply) -> None:
        """Peers the head saw lost: their files leave the merged tree at once
        (make then rebuilds what only they held) instead of failing with EIO
        on every access. The list is replaced whole: a lookup under way keeps
        the list it started with."""
        gone = set(str(n) for n in args.get("nodes") or [])
        fs = self.fs
        if fs is not None:
            fs.branches = [b for b in fs.branches if b.local or b.node not in gone]
            self.proxies.drop(list(gone))
        reply(True, "", {})

    # -- the node's lifetime ------------------------------------------------------
    def stop(self) -> None:
        self.stopping = True
        self.go.set()
        self.settled.set()
        self._unwatch()
        if is_mounted(self.cfg.mountpoint):
            unmount(self.cfg.mountpoint)
        self.server.close()
        self.kernel_work.close()
        self.peer_work.close()
        for lane in self.adopt_work:
            lane.close()
        self.generation.close()
        super().stop()

    def runner(self) -> None:
        """The main thread's work: FUSE serves the mount until it is unmounted."""
        from sshfsmux.fs import kernel_cache, merged_fs
        self.go.wait()
        if self.stopping or self.fs is None:
            return
        try:
            extra: Dict[str, Any] = dict(allow_other=True, default_permissions=True) \
                if self.cfg.allow_other else {}
            if self.fs.namespace is not None:
                # the kernel keeps misses: each name the head announces loses its
                # negative entry (kernel_cache.py) off the FUSE threads (a drop
                # waits for the directory's lock a lookup holds until answered)
                extra["negative_seconds"] = merged_fs.ATTR_SECONDS
                self.fs.miss_seconds = kernel_cache.MISS_SECONDS    # where entries expire
            merged_fs.run_fuse(self.fs, self.cfg.mountpoint, foreground=True, **extra)
        except Exception as e:
            self.error = "cannot mount %s: %s" % (self.cfg.mountpoint, e)
        finally:
            self.settled.set()


def start(node: Any, config: Dict[str, Any]
          ) -> Tuple[Dict[str, Any], Callable[[], None], GMountNode]:
    """The role's entry point: what the head learns, the runner that takes the
    main thread, and the node side the agent hosts (its calls; it stops with
    the node)."""
    gmount = GMountNode(node, config)
    return gmount.info(), gmount.runner, gmount
