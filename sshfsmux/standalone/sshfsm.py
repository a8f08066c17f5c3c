"""sshfsm: mount [user@]host:/path branches (SFTP, nothing of ours on the remote)
and local directories as one merged tree.

Like sshfs, the command returns once the mount is usable (exit 0) or has failed
(one line on stderr, exit 1; 2 for a bad command line), and the filesystem then
runs in the background; -f keeps it in the foreground. Paramiko's threads do not
survive fork, so the process forks first (double fork, setsid, stdio to
/dev/null) and connects and mounts in the child, which reports success or the
one-line error to the waiting parent over a pipe. `fusermount -u MOUNTPOINT`
(or SIGTERM to the process) unmounts; the process then closes its SSH
connections, removes its replica cache and exits.
"""
from __future__ import annotations

import errno
import os
import socket
import sys
import tempfile
import threading

from sshfsmux.fs import mount_nesting
from sshfsmux.standalone.mount_options import (
    USAGE,
    VERSION,
    MountError,
    Options,
    UsageError,
    check_allow_other,
    check_mountpoint,
    host_of,
    is_remote,
    parse,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

PROG = "sshfsm"
CHAIN_NAME = ".sshfsmux-chain"


# --------------------------------------------------------------------------
# the chain of cascaded mounts (loop detection: see mount_nesting)
# --------------------------------------------------------------------------

def local_chain(path: str) -> List[str]:
    """The chain of the mount of ours that `path` is in (empty if none)."""
    return mount_nesting.local_lists(path)[0]


def remote_lists(branch: object) -> Tuple[List[str], List[str]]:
    """(chain, branch places) of the remote mount of ours a remote branch is in."""
    root = branch.root  # type: ignore[attr-defined]
    mounts = mount_nesting.our_mounts((branch.read_small(b"/proc/self/mounts") or b"").decode(  # type: ignore
        "utf-8", "replace"), False)
    rootstr = root.decode("utf-8", "surrogateescape")
    top = mount_nesting.containing(mounts, rootstr)
    for d in ([top] if top else []) + [rootstr]:
        data = branch.read_small(os.path.join(d, CHAIN_NAME).encode("utf-8", "surrogateescape"))  # type: ignore
        if data:
            places = branch.read_small(os.path.join(d, mount_nesting.BRANCHES_NAME).encode(  # type: ignore
                "utf-8", "surrogateescape"))
            return mount_nesting.lines(data), mount_nesting.lines(places)
    return [], []


def remote_chain(branch: object) -> List[str]:
    """The chain of the remote mount of ours a remote branch is in (if any)."""
    return remote_lists(branch)[0]


def _nested(e: mount_nesting.NestingError) -> MountError:
    return MountError(str(e))


def _loop(spec: str, me: str) -> MountError:
    return MountError("loop: %s already includes %s" % (spec, me))


# --------------------------------------------------------------------------
# preparation (before fork: no threads, nothing connected)
# --------------------------------------------------------------------------

class Prepared:
    def __init__(self) -> None:
        self.mountpoint = ""
        self.me = ""
        self.local: dict = {}  # spec -> real path
        self.chain: List[str] = []
        self.places: List[str] = []  # host:path of every branch, at any depth


def prepare(o: Options) -> Prepared:
    p = Prepared()
    # exists and is a directory; emptiness is checked after the loop checks,
    # so that stacking on a mount of ours is reported as the loop it is
    mp = check_mountpoint(o.mountpoint, must_be_empty=False)
    p.mountpoint = mp
    host = socket.gethostname()
    p.me = "%s:%s" % (host, mp)
    for spec in o.branches:
        if is_remote(spec):
            continue
        real = os.path.realpath(spec)
        if not os.path.exists(real):
            raise MountError("%s: %s" % (spec, os.strerror(errno.ENOENT)))
        if not os.path.isdir(real):
            raise MountError("%s: %s" % (spec, os.strerror(errno.ENOTDIR)))
        if mount_nesting.inside(real, mp):
            raise _loop(spec, p.me)
        # (a local branch holding the mountpoint is fine: LocalBranch hides it)
        chain, places = mount_nesting.local_lists(real)
        if p.me in chain:
            raise _loop(spec, p.me)
        try:
            mount_nesting.check_places(spec, places, host, mp)
        except mount_nesting.NestingError as e:
            raise _nested(e)
        p.local[spec] = real
        for line in chain:
            if line not in p.chain:
                p.chain.append(line)
        p.places += ["%s:%s" % (host, real)] + places
    check_mountpoint(o.mountpoint, must_be_empty=True)
    check_allow_other(o)
    return p


# --------------------------------------------------------------------------
# running the filesystem
# --------------------------------------------------------------------------

class _Log:
    def __init__(self, to_syslog: bool) -> None:
        self.syslog = None
        if to_syslog:
            try:
                import syslog
                syslog.openlog(PROG, syslog.LOG_PID, syslog.LOG_USER)
                self.syslog = syslog
            except Exception:
                self.syslog = None
        self.lock = threading.Lock()

    def __call__(self, msg: str) -> None:
        if self.syslog is not None:
            try:
                self.syslog.syslog(self.syslog.LOG_INFO, msg)
            except Exception:
                pass
            return
        with self.lock:
            try:
                sys.stderr.write("%s: %s\n" % (PROG, msg))
                sys.stderr.flush()
            except Exception:
                pass


class _StderrCapture:
    """fd 2 goes to a temporary file while libfuse mounts, so that its message
    (e.g. from fusermount3) can be turned into our one line."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()
        sys.stderr.flush()
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        self.active = True

    def stop(self, to: Optional[int] = None) -> None:
        if not self.active:
            return
        self.active = False
        try:
            sys.stderr.flush()
        except Exception:
            pass
        os.dup2(self.saved if to is None else to, 2)
        os.close(self.saved)

    def text(self) -> str:
        self.file.seek(0)
        lines = [x.strip() for x in self.file.read().decode("utf-8", "replace").splitlines()]
        lines = [x for x in lines if x]
        return lines[-1] if lines else ""


def _connect_remotes(o: Options, specs: List[str], cache: object) -> List[object]:
    from sshfsmux.sftp.branch import ConnectError, SftpBranch
    results: dict = {}

    def one(spec: str) -> None:
        try:
            results[spec] = SftpBranch(spec, port=o.port, identity_file=o.identity_file,
                                       reconnect=o.reconnect, cache=cache,
                                       server_alive=o.server_alive, timeout=o.timeout)
        except ConnectError as e:
            results[spec] = MountError("%s: %s" % (host_of(spec), e))
        except OSError as e:
            results[spec] = MountError("%s: %s" % (spec, e.strerror or e))
        except Exception as e:  # paramiko and friends: still one line
            results[spec] = MountError("%s: %s" % (host_of(spec), e or type(e).__name__))

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = []
    failure = None
    for s in specs:
        r = results.get(s)
        if isinstance(r, MountError) or r is None:
            failure = failure or r or MountError("%s: connection failed" % host_of(s))
        else:
            out.append(r)
    if failure is not None:
        for b in out:
            b.close()  # type: ignore[attr-defined]
        raise failure
    return out


def _remote_places(p: Prepared, remote_specs: List[str],
                   remotes: Dict[str, Any]) -> Tuple[List[str], List[str]]:
    """The mount chain and branch places with each remote branch's own added;
    MountError for a remote that is this mount or would contain it."""
    chain = list(p.chain)
    places = list(p.places)
    host = socket.gethostname()
    for spec in remote_specs:
        rb = remotes[spec]
        rc, rplaces = remote_lists(rb)
        if p.me in rc:
            raise _loop(spec, p.me)
        # a remote branch that is this very host and this mountpoint (or below)
        remote_host = mount_nesting.lines(rb.read_small(b"/proc/sys/kernel/hostname"))  # type: ignore
        root = rb.root.decode("utf-8", "surrogateescape")  # type: ignore
        if remote_host == [host] and mount_nesting.inside(root, p.mountpoint):
            raise _loop(spec, p.me)
        if remote_host == [host] and mount_nesting.inside(p.mountpoint, root):
            # over SFTP nothing hides the mountpoint: it would show the mount itself
            raise MountError("%s holds the mountpoint %s: the mount would contain itself"
                             % (spec, p.mountpoint))
        try:
            mount_nesting.check_places(spec, rplaces, host, p.mountpoint)
        except mount_nesting.NestingError as e:
            raise _nested(e)
        for line in rc:
            if line not in chain:
                chain.append(line)
        places += ["%s:%s" % (remote_host[0] if remote_host else host_of(spec), root)] + rplaces
    return chain, places


def run(o: Options, p: Prepared, ready: Callable[[], None],
        fail: Callable[[str], None], log: Callable[[str], None],
        capture_to: Optional[int] = None) -> int:
    """Connect, mount and serve until unmounted. Returns the exit status."""
    os.umask(0)  # the kernel already applied the caller's umask to every mode
    from sshfsmux.branches.local_branch import LocalBranch
    from sshfsmux.branches.replica_cache import ReplicaCache
    from sshfsmux.fs.fuse_glue import ATTR_SECONDS
    from sshfsmux.fs.merged_fs import MergedFS, run_fuse

    cache = None
    branches: List[object] = []
    remotes: dict = {}
    capture = None
    try:
        try:
            cache = ReplicaCache(o.cache_dir, limit=o.cache_size)
        except OSError as e:
            raise MountError("cache_dir %s: %s" % (o.cache_dir or "", e.strerror or e))
        remote_specs = [s for s in o.branches if is_remote(s)]
        remotes = dict(zip(remote_specs, _connect_remotes(o, remote_specs, cache)))
        chain, places = _remote_places(p, remote_specs, remotes)
        for spec in o.branches:
            if spec in remotes:
                branches.append(remotes[spec])
            else:
                try:
                    branches.append(LocalBranch(p.local[spec], exclude=[p.mountpoint, cache.dir],
                                                name=spec))
                except OSError as e:
                    raise MountError("%s: %s" % (spec, e.strerror))
        mounted = threading.Event()

        def on_ready() -> None:
            mounted.set()
            if capture is not None:
                capture.stop(capture_to)
            ready()

        fs = MergedFS(branches, mount_id=p.me, chain=chain, readonly=o.ro, log=log,  # type: ignore
                      debug=o.debug, on_ready=on_ready, branch_places=places)
        # a missing name is trusted as long as a present one: every branch
        # here changes behind our back alike (docs/merge-semantics.md)
        fuse_opts: dict = dict(fsname=_fsname(o.branches), subtype=PROG,
                               negative_seconds=ATTR_SECONDS)
        if o.allow_other:
            fuse_opts["allow_other"] = True
        if o.default_permissions:
            fuse_opts["default_permissions"] = True
        capture = _StderrCapture()
        try:
            run_fuse(fs, p.mountpoint, foreground=True, **fuse_opts)
        except RuntimeError as e:
            # libfuse's status: nonzero also after SIGTERM/SIGINT/SIGHUP, which
            # end a mount that was up (libfuse has unmounted it by now)
            if not mounted.is_set():
                capture.stop()
                why = capture.text() or "libfuse status %s" % e
                raise MountError("cannot mount %s: %s" % (o.mountpoint, why))
        finally:
            if capture.active:
                capture.stop(capture_to)
        return 0
    except MountError as e:
        fail(str(e))
        return 1
    finally:
        for b in set(branches) | set(remotes.values()):
            try:
                b.close()  # type: ignore[attr-defined]
            except Exception:
                pass
        if cache is not None:
            cache.close()


def _fsname(specs: List[str]) -> str:
    return "+".join(specs).replace("\\", "\\\\").replace(",", "\\,")


# --------------------------------------------------------------------------
# foreground and background
# --------------------------------------------------------------------------

def _quiet_logging(debug: bool) -> None:
    import logging
    logging.getLogger("fuse").setLevel(logging.CRITICAL)
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    import warnings
    warnings.simplefilter("ignore")


def _foreground(o: Options, p: Prepared) -> int:
    _quiet_logging(o.debug)
    log = _Log(to_syslog=False)

    def fail(msg: str) -> None:
        sys.stderr.write("%s: %s\n" % (PROG, msg))
        sys.stderr.flush()

    return run(o, p, ready=lambda: None, fail=fail, log=log)


def _background(o: Options, p: Prepared) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        chunks = []
        while True:
            try:
                b = os.read(r, 4096)
            except InterruptedError:
                continue
            if not b:
                break
            chunks.append(b)
        os.close(r)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        msg = b"".join(chunks).decode("utf-8", "replace")
        if msg.startswith("ok"):
            return 0
        line = msg.strip().splitlines()[-1] if msg.strip() else "%s: mount failed" % PROG
        sys.stderr.write(line + "\n")
        return 1
    # first child: new session, then the daemon is the grandchild
    code = 1
    try:
        os.close(r)
        os.setsid()
        if os.fork():
            os._exit(0)
        os.chdir("/")
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        errfile = tempfile.TemporaryFile()  # until mounted: errors end up here
        os.dup2(errfile.fileno(), 2)
        _quiet_logging(False)
        log = _Log(to_syslog=True)
        state = {"w": w}

        def send(msg: str) -> None:
            fd = state.pop("w", None)
            if fd is None:
                return
            try:
                os.write(fd, msg.encode("utf-8", "replace"))
            except OSError:
                pass
            os.close(fd)

        def ready() -> None:
            send("ok\n")

        def fail(msg: str) -> None:
            send("%s: %s\n" % (PROG, msg))

        try:
            code = run(o, p, ready=ready, fail=fail, log=log, capture_to=devnull)
        except BaseException as e:
            fail("internal error: %s: %s" % (type(e).__name__, e))
            code = 1
        finally:
            if "w" in state:
                errfile.seek(0)
                last = [x for x in errfile.read().decode("utf-8", "replace").splitlines() if x.strip()]
                fail(last[-1].strip() if last else "mount failed")
    finally:
        os._exit(code)


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        o = parse(args)
    except UsageError as e:
        sys.stderr.write("%s: %s\n" % (PROG, e))
        return 2
    if o.help:
        sys.stdout.write(USAGE)
        return 0
    if o.version:
        sys.stdout.write("%s %s\n" % (PROG, VERSION))
        return 0
    try:
        p = prepare(o)
    except MountError as e:
        sys.stderr.write("%s: %s\n" % (PROG, e))
        return 1
    try:
        if o.foreground:
            return _foreground(o, p)
        return _background(o, p)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
