"""GMount's per-node service (role "gmount"): an export server on EXPORT and, once
the head sends the peers, the merged FUSE mount at MOUNTPOINT.

It runs as a child node of the node's agent, started by the same bootstrap and
loaded from memory (the head pushed these modules). FUSE takes the main thread;
the node's event loop runs beside it. Service calls: "mount" {peers} and
"umount". Shutdown (quit, or the agent going away) unmounts and closes.

Standard library plus modules the head pushes (sshfsmux, mfusepy).
"""
from __future__ import annotations

import os
import socket
import subprocess
import threading

# The host's addresses and the pick of a peer's: the core's (its transfers' direct links use them too).
from gxpstyle.link_auth import local_addresses, pick_address
from gxpstyle.node_side import NodeSide

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Tuple

    from sshfsmux.branch import Branch

MOUNT_WAIT = 20.0
COALESCE = 0.3          # seconds of changes made through the mount sent as one answer
CHANGES_PAGE = 5000     # paths an answer describes; the rest wait for the next call
MAX_PENDING = 100000    # paths kept between answers (more: the catalog misses some)

# What the head pushes to a node for this service, dependencies first.
NODE_MODULES = [
    "sshfsmux.branch", "sshfsmux.confined_paths", "sshfsmux.fs_transport", "sshfsmux.fs_protocol",
    "sshfsmux.local_branch", "sshfsmux.replica_cache", "sshfsmux.direct_channel",
    "sshfsmux.direct_files", "sshfsmux.direct_branch",
    "sshfsmux.mount_nesting", "sshfsmux.fuse_glue", "sshfsmux.access_memo", "sshfsmux.merged_handles",
    "sshfsmux.link_names", "sshfsmux.merged_changes", "sshfsmux.merged_xattrs", "sshfsmux.merged_fs",
    "sshfsmux.export_server", "sshfsmux.export_scan", "sshfsmux.kernel_cache",
    "sshfsmux.gmount_node", "mfusepy",
]


def fusermount() -> str:
    for name in ("fusermount3", "fusermount"):
        for d in os.environ.get("PATH", "/usr/bin:/bin").split(":") + ["/usr/bin", "/bin"]:
            path = os.path.join(d, name)
            if os.access(path, os.X_OK):
                return path
    return "fusermount"


def fuse_conf_allows_other(path: str = "/etc/fuse.conf") -> bool:
    try:
        with open(path) as f:
            return any(line.strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def is_mounted(mountpoint: str) -> bool:
    try:
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == mountpoint for line in f if len(line.split()) > 1)
    except OSError:
        return False


def unmount(mountpoint: str) -> str:
    """Unmount; a busy mount is detached lazily. Returns '' or the error line."""
    fm = fusermount()
    r = subprocess.run([fm, "-u", mountpoint], stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
    if r.returncode != 0 and is_mounted(mountpoint):
        r = subprocess.run([fm, "-u", "-z", mountpoint], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        if r.returncode != 0 and is_mounted(mountpoint):
            return r.stderr.decode("utf-8", "replace").strip() or "fusermount failed"
    return ""


def copies_of(fs: "Any", rels: "List[str]") -> "Tuple[List[List[Any]], List[str]]":
    """What the merged view says of changed names: ([rel, size, mtime, node]
    for every complete copy, the very list the location xattr names
    (Xattrs.copies), [rel with no file: gone from every branch, or not a
    regular file]). A write through this mount goes to the branches holding
    the file, so "not in this export" is not "gone". A name some branch
    cannot answer for (a peer that errs) is in neither list: the catalog
    keeps what it knew."""
    import errno
    copies: "List[List[Any]]" = []
    gone: "List[str]" = []
    for rel in rels:
        try:
            if fs is None:
                raise OSError(errno.ENOENT, "not mounted")
            found = fs.file_copies("/" + rel)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                gone.append(rel)
            continue
        if not found:
            gone.append(rel)
        copies.extend([rel, size, mtime, node] for node, size, mtime in found)
    return copies, gone


def start(node: "Any", config: "Dict[str, Any]"
          ) -> "Tuple[Dict[str, Any], Callable[[], None], CallSide]":
    from sshfsmux.direct_branch import CALL_SECONDS, MAX_CALL_SECONDS, DirectBranch
    from sshfsmux.export_server import ExportServer
    from sshfsmux.kernel_cache import KernelCache
    from sshfsmux import export_scan
    from sshfsmux.fs_protocol import data_channel_key
    from sshfsmux.local_branch import LocalBranch
    from sshfsmux.replica_cache import ReplicaCache
    from sshfsmux import merged_fs, mount_nesting

    export = os.path.abspath(config["export"])
    mountpoint = os.path.abspath(config["mountpoint"])
    ro = bool(config.get("ro"))
    cipher = bool(config.get("cipher", True))
    # how long a peer may leave a request unanswered before its files give EIO
    timeout = config.get("timeout", CALL_SECONDS)
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not 1 <= timeout <= MAX_CALL_SECONDS):
        raise ValueError("timeout %r: give a number of seconds from 1 to %d"
                         % (timeout, MAX_CALL_SECONDS))
    allow_other = bool(config.get("allow_other"))
    # bytes of replicas this host's store keeps (-o cache_size=); None: half the free space
    cache_size = config.get("cache_size")
    if allow_other and os.getuid() != 0 and not fuse_conf_allows_other():
        raise ValueError("allow_other needs 'user_allow_other' in /etc/fuse.conf on %s"
                         % socket.gethostname())
    if not os.path.isdir(export):
        raise ValueError("export %s: no such directory" % export)
    if not os.path.isdir(mountpoint):
        # as mount(8) and sshfs: the mountpoint is the user's directory, never made here
        raise ValueError("mountpoint %s: %s" % (mountpoint, "not a directory" if os.path.lexists(
            mountpoint) else "no such directory (make it first, e.g. gxpc e mkdir -p DIR)"))
    if is_mounted(mountpoint):
        raise ValueError("mountpoint %s: already a mount point" % mountpoint)
    try:
        places = mount_nesting.check_export(export, mountpoint, socket.gethostname())
    except mount_nesting.NestingError as e:
        raise ValueError(str(e))
    # The name peers and the location attribute know this host by (as explored).
    host_name = str(config.get("node") or node.name)
    certfile, keyfile = node.tls_files()
    pin = node.opts["pin"]
    key = data_channel_key(node.secret)
    cache_dir = os.path.join(node.ensure_session_dir(), "replicas")

    def log(text: str) -> None:
        node.loop.call_soon_threadsafe(lambda: node.log(text))

    server = ExportServer(export, ro, key, certfile, keyfile, pin, cipher=cipher, log=log)
    own = local_addresses()
    state: "Dict[str, Any]" = {"fs": None, "stop": False, "reply": None}
    go = threading.Event()
    settled = threading.Event()

    def on_ready() -> None:
        # FUSE's init callback: the one place the mount's `struct fuse *` is
        # visible, kept for the "changed" call (kernel_cache.py)
        state["kcache"] = KernelCache.capture()
        state["up"] = True
        settled.set()

    def in_loop(fn: "Callable[..., None]", *args: "Any") -> None:
        node.loop.call_soon_threadsafe(lambda: fn(*args))

    def mount_call(args: "Dict[str, Any]", reply: "Callable[..., None]") -> None:
        if state["fs"] is not None:
            reply(False, "already mounted")
            return

        def work() -> None:
            try:
                # one replica store for every peer, kept for the session
                cache = state["cache"] = ReplicaCache.persistent(cache_dir, limit=cache_size)
                branches: "List[Branch]" = [LocalBranch(export, node=host_name)]
                for p in args.get("peers", []):
                    host = pick_address(list(p.get("addrs") or []), own)
                    branches.append(DirectBranch(host, int(p["port"]), key, pin, node=str(p["node"]),
                                                 cipher=cipher, cache=cache,
                                                 timeout=float(timeout)))
                state["fs"] = merged_fs.MergedFS(branches, mountpoint=mountpoint, read_only=ro,
                                                 node=host_name, log=log, branch_places=places,
                                                 on_ready=on_ready)
                state["fs"].on_change = on_change
            except OSError as e:
                in_loop(reply, False, "cannot mount %s: %s" % (mountpoint, e.strerror or e))
                return
            except Exception as e:
                in_loop(reply, False, "cannot mount %s: %s" % (mountpoint, e))
                return
            state["reply"] = reply
            go.set()
            # FUSE's init callback (the mount is up) or the runner's end (it
            # failed) sets `settled`; the bound only covers a libfuse that hangs
            settled.wait(MOUNT_WAIT)
            if state.get("up"):
                in_loop(reply, True, "", {"mountpoint": mountpoint})
                return
            in_loop(reply, False, state.get("error") or ("mount stopped" if state["stop"] else
                                                         "mount did not appear within %gs" % MOUNT_WAIT))
        threading.Thread(target=work, daemon=True).start()

    def umount_call(args: "Dict[str, Any]", reply: "Callable[..., None]") -> None:
        with changes_lock:
            waiting, changes["reply"] = changes["reply"], None
        if waiting is not None:
            waiting(False, "unmounted", {})

        def work() -> None:
            err = unmount(mountpoint) if is_mounted(mountpoint) else ""
            in_loop(reply, not err, err)
        threading.Thread(target=work, daemon=True).start()

    def scan_call(args: "Dict[str, Any]", reply: "Callable[..., None]") -> None:
        """A page of this node's export for the head's replica catalog."""
        def work() -> None:
            try:
                files, more = export_scan.scan_page(export, int(args.get("offset") or 0))
            except Exception as e:
                in_loop(reply, False, "cannot scan %s: %s" % (export, e))
                return
            in_loop(reply, True, "", {"files": files, "more": more})
        threading.Thread(target=work, daemon=True).start()

    def in_export(path: str) -> bool:
        """A name of the mount is in this node's export (no peer asked)."""
        return os.path.lexists(os.path.join(export, path.lstrip("/")))

    def changed_call(args: "Dict[str, Any]", reply: "Callable[..., None]") -> None:
        """Files (relative to the mount's root) another node or this one just
        wrote: drop this mount's kernel caches for them and, with "describe",
        say what this node's export holds of them. Answered once done, so the
        head can hold make's exit status until every mount has acted."""
        rels = [str(p) for p in args.get("paths") or []]

        def work() -> None:
            try:
                files = export_scan.describe(export, rels) if args.get("describe") else []
                kc = state.get("kcache")
                paths = ["/" + r.lstrip("/") for r in rels]
                fs = state.get("fs")
                if fs is not None:
                    fs.forget_access(paths)
                dropped = kc.invalidate_paths(paths, exists=in_export) if kc else 0
            except Exception as e:
                in_loop(reply, False, "cannot act on changed files: %s" % e)
                return
            in_loop(reply, True, "", {"files": files, "invalidated": dropped})
        threading.Thread(target=work, daemon=True).start()

    def adopt_call(args: "Dict[str, Any]", reply: "Callable[..., None]") -> None:
        """A complete, verified copy of a file of the mount (a transfer the head
        planned before a recipe runs here) sits at `file` in the replica store's
        directory: make it the replica the mount reads that file from (keyed by
        the first branch holding it, at the version that export has now), so reading it
        through the mount moves no data. Answers {"kept": "store"|"local"}."""
        rel = "/" + str(args.get("path") or "").lstrip("/")
        file = str(args.get("file") or "")

        def work() -> None:
            try:
                if os.path.dirname(os.path.abspath(file)) != cache_dir:
                    raise ValueError("not in the replica store")
                fs = state["fs"]
                if fs is None:
                    raise ValueError("not mounted")
                v = fs._file_view(rel)
                if v.is_dir:
                    raise ValueError("a directory")
                if any(b.local for b, _ in v.replicas):
                    os.unlink(file)         # this host's export holds it already
                    in_loop(reply, True, "", {"kept": "local"})
                    return
                # keyed by the branch the merged tree reads the file from
                # (merged_fs._reader: the first holder, with no local one)
                cands = [b for b, _ in v.replicas if hasattr(b, "adopt")]
                if not cands or cands[0].adopt(rel, file) is None:
                    raise ValueError("the copy does not match the file's current version")
            except Exception as e:
                try:
                    os.unlink(file)
                except OSError:
                    pass
                in_loop(reply, False, "cannot adopt %s: %s" % (rel, getattr(e, "strerror", None) or e))
                return
            in_loop(reply, True, "", {"kept": "store"})
        threading.Thread(target=work, daemon=True).start()

    def pin_call(args: "Dict[str, Any]", reply: "Callable[..., None]") -> None:
        """The head pins (or unpins) a recipe's inputs for the recipe's life:
        their replicas here are not evicted meanwhile (replica_cache.py)."""
        fs, cache = state["fs"], state.get("cache")
        if fs is None or cache is None:
            reply(False, "not mounted", {})
            return
        # keyed as DirectBranch.adopt and its reads key them: branch and wire path ("a/b")
        rels = [str(p).strip("/") for p in args.get("paths") or []]
        keys = [b._key(r) for r in rels for b in fs.branches if hasattr(b, "_key")]
        (cache.pin if args.get("pin") else cache.unpin)(keys)
        reply(True, "", {})

    def drop_peers_call(args: "Dict[str, Any]", reply: "Callable[..., None]") -> None:
        """Peers the head saw lost: their files leave the merged tree at once
        (make then rebuilds what only they held) instead of failing with EIO
        on every access. The list is replaced whole: a lookup under way keeps
        the list it started with."""
        gone = set(str(n) for n in args.get("nodes") or [])
        fs = state["fs"]
        if fs is not None:
            fs.branches = [b for b in fs.branches if b.local or b.node not in gone]
        reply(True, "", {})

    # Changes made through this mount (a write handle closed, an unlink, a
    # rename), for the head's replica catalog: the head keeps one "changes"
    # call waiting here, answered once something changed (after COALESCE
    # seconds, so that a burst is one answer).
    changes: "Dict[str, Any]" = {"paths": set(), "reply": None, "armed": False}
    changes_lock = threading.Lock()

    def flush_changes() -> None:
        with changes_lock:
            changes["armed"] = False
            reply, paths = changes["reply"], changes["paths"]
            if reply is None or not paths:
                return
            changes["reply"], changes["paths"] = None, set()
        every = sorted(p.lstrip("/") for p in paths)
        rels = every[:CHANGES_PAGE]
        if len(every) > CHANGES_PAGE:     # the rest go with the next answer
            with changes_lock:
                changes["paths"].update("/" + r for r in every[CHANGES_PAGE:])

        def work() -> None:
            copies, gone = copies_of(state["fs"], rels)
            in_loop(reply, True, "", {"copies": copies, "gone": gone})
        # the merged view asks the peers: not on the node's loop
        threading.Thread(target=work, daemon=True).start()

    def arm() -> None:
        with changes_lock:
            if changes["armed"] or changes["reply"] is None or not changes["paths"]:
                return
            changes["armed"] = True
        node.loop.call_later(COALESCE, flush_changes)

    def on_change(path: str) -> None:      # a FUSE thread
        with changes_lock:
            if len(changes["paths"]) < MAX_PENDING:
                changes["paths"].add(path)
        node.loop.call_soon_threadsafe(arm)

    def changes_call(args: "Dict[str, Any]", reply: "Callable[..., None]") -> None:
        with changes_lock:
            old, changes["reply"] = changes["reply"], reply
        if old is not None:
            old(False, "superseded", {})
        arm()

    def cleanup() -> None:
        state["stop"] = True
        go.set()
        settled.set()
        if is_mounted(mountpoint):
            unmount(mountpoint)
        server.close()

    def runner() -> None:
        go.wait()
        if state["stop"] or state["fs"] is None:
            return
        try:
            extra = dict(allow_other=True, default_permissions=True) if allow_other else {}
            merged_fs.run_fuse(state["fs"], mountpoint, foreground=True, **extra)
        except Exception as e:
            state["error"] = "cannot mount %s: %s" % (mountpoint, e)
        finally:
            settled.set()

    # the role node's side (gxpstyle/node_side.py): its calls, and cleanup at its stop
    side = CallSide({"mount": mount_call, "umount": umount_call, "scan": scan_call,
                     "changed": changed_call, "drop_peers": drop_peers_call,
                     "changes": changes_call, "adopt": adopt_call, "pin": pin_call}, cleanup)
    return {"port": server.port, "addrs": own, "node": host_name, "store": cache_dir}, runner, side


class CallSide(NodeSide):
    """The role node's side (gxpstyle/node_side.py): the head's calls, and a
    cleanup when the node stops."""

    def __init__(self, calls: "Dict[str, Callable[..., None]]", cleanup: "Callable[[], None]") -> None:
        super().__init__()
        self.handlers, self.cleanup = calls, cleanup

    def calls(self) -> "Dict[str, Callable[..., None]]":
        return self.handlers

    def stop(self) -> None:
        self.cleanup()
        super().stop()
