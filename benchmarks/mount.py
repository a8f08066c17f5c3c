#!/usr/bin/env python3
"""Throughput and metadata rate of our mounts next to sshfs and local disk.

Run as root (the multi-host test bed needs it), from the checkout:

    /opt/gxpstyle/venv/bin/python benchmarks/mount.py [--size MiB] [--reps N] [--quick]

What it does (all on one test bed of 9 sshd hosts, tb01..tb09, every link shaped
to 100 Mbit/s by tbf at both ends of its veth; the checkout and the venv are
hidden on the hosts; one ordinary user runs everything of the product and of
sshfs; /dev/fuse is made 0666 for the run and restored afterwards):

* Large file, on the head (the machine's own namespaces) against tb01, over tb01's
  100 Mbit link. `dd bs=1M conv=fsync` writes a file (from a random source file,
  so nothing compresses) through
    ours     `sshfsm tb01:DIR MNT` (the SFTP branch of the standalone mount),
    anchor   `sshfs tb01:DIR MNT` (the Debian package, its defaults),
    anchor   the head's local disk (a directory of /var/tmp on a real disk
             filesystem, checked: not tmpfs).
  Then the file is read back with `dd of=/dev/null bs=1M` after unmounting,
  remounting and dropping the page cache (so no cache of ours or the kernel's
  serves it): for ours that is the first, streamed read. A second read (caches
  dropped again) is served from our replica on local disk; it is reported on
  its own row.
* Direct data channel (issue #8): a session explores tb01..tb08 and `gxpc mount`s
  an export on every node (head included). A file written on tb02 (straight
  into its export) is read on tb01 through the GMount: with TLS (`gxpc mount`),
  and with `gxpc mount -o cipher=none`; anchor: `sshfs tb02:EXPORT` on tb01, over
  the same links. Each case reads its own file, so no replica of an earlier case
  can serve it (GMount keeps replicas for the whole session).
* Metadata, on the head: create N files (default 10,000; open O_CREAT|O_EXCL +
  close), stat every one (os.stat), list the directory (os.listdir), each timed
  inside one Python process run as the user, through sshfsm (remote branch on
  tb01), through sshfs (tb01), and on local disk. The mounts are remounted before
  the stat pass and again before the readdir pass, and the page cache is dropped,
  so every pass starts with nothing cached (local disk: caches dropped). Local
  disk is also timed warm (a second stat pass), for scale, and sshfsm is also
  run on a local directory (no network: the cost of FUSE and of our process).
* Locality: the session's GMount again, on a second export. Each of tb01..tb08
  writes files totalling 64 MiB (16 x 4 MiB) into the mount (they land in its own
  export), the page cache is dropped, then all eight read their files back at
  once (`gxpc e`); timed inside each node's reader (the hosts share one clock):
  aggregate MB/s = all bytes / (last end - first start). Anchors:
    local disk   the same files read straight from each node's export directory,
    all-to-one   every node sshfs-mounts one server (tb09, a 100 Mbit link like
                 every other), writes the same amount through it and reads it back.
  The ours/local reads are repeated --reps times (median); all-to-one once.
  Also, for scale, tb01 alone reads its files (ours and local disk) while the
  other nodes idle: all "hosts" share this machine's CPUs, so eight FUSE daemons
  reading at once compete for them, as they would not on eight real nodes.

Prints a table (case, anchor, anchor value, ours value, unit, ratio ours/anchor:
higher is better for every row), where the time went (CPU of the user's long-lived
processes -- mount daemons, ssh, sshd/sftp-server, agents -- and of the whole
machine while each case was timed), and verdicts for the goals of the issue:
remote large-file throughput >= 0.9x sshfs on the same link; locality >= 0.8x
local disk and >= 4x all-to-one; metadata stat >= 30% of local.

Defaults: 1024 MiB large file (--size), 256 MiB direct-channel file
(--direct-size), 10,000 files (--files), 64 MiB per node for locality
(--loc-size); --reps 2 for the metadata case and the locality reads, --reps-large 1
for the large-file and direct-channel cases (each 1 GiB pass takes about 90 s at
100 Mbit). About 11 minutes in all. --quick: 256 MiB, 64 MiB, 2,000 files,
16 MiB per node, one rep of everything (about 3 minutes).

Everything is cleaned up whatever happens (Ctrl-C, SIGTERM, errors): every mount
is unmounted (head and hosts), the session is unmounted and quit, the bed torn
down, the bench directories removed and /dev/fuse's mode restored. Standard
library only, plus tests/testbed/ and benchmarks/bench_harness.py.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid

from bench_harness import (
    VENV,
    Bench,
    BenchError,
    busy_share,
    cpu_busy,
    describe,
    ensure_anchor,
    fuse_mounts,
    log,
    main_driver,
    proc_cmdline,
    proc_cpu,
    ratio_text,
    user_pids,
    value_text,
)

SSHFSM = os.path.join(VENV, "bin", "sshfsm")
FUSERMOUNT = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
SSHFS = shutil.which("sshfs") or "/usr/bin/sshfs"
HEAD = socket.gethostname()

BW = "100mbit"
LINK_MBS = 12.5                      # 100 Mbit/s in MB/s (10^6 bytes)
HOSTS = ["tb%02d" % i for i in range(1, 10)]
NODES = HOSTS[:8]                    # the GMount session and the locality case
NODES_PAT = "tb[[01-08]]"
REMOTE = "tb01"                      # large file and metadata server for the head
DIRECT_FROM, DIRECT_TO = "tb02", "tb01"
A2O_SERVER = "tb09"                  # the one server of the all-to-one layout
LOC_FILE_MIB = 4                     # locality: files of 4 MiB
MiB = 1 << 20
CALL_TIMEOUT = 300

GOAL_LARGE = 0.9       # remote large-file throughput >= 0.9x sshfs
GOAL_LOC_LOCAL = 0.8   # locality >= 0.8x local disk
GOAL_LOC_A2O = 4.0     # locality >= 4x all-to-one
GOAL_STAT = 0.30       # stat >= 30% of local

# Run as the user, on the head or on a host (python3 of the machine). Times
# itself; prints seconds, or "start end bytes" (time.time(): the hosts share the
# head's clock) for write/read.
TOOL = r"""
import os, sys, time
MiB = 1 << 20
mode, d = sys.argv[1], sys.argv[2]

def names(n):
    return [os.path.join(d, "f%05d" % i) for i in range(n)]

if mode == "create":
    paths = names(int(sys.argv[3]))
    t0 = time.monotonic()
    for p in paths:
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    print("%.6f" % (time.monotonic() - t0))
elif mode == "stat":
    paths = names(int(sys.argv[3]))
    t0 = time.monotonic()
    for p in paths:
        os.stat(p)
    print("%.6f" % (time.monotonic() - t0))
elif mode == "readdir":
    n = int(sys.argv[3])
    t0 = time.monotonic()
    got = os.listdir(d)
    dt = time.monotonic() - t0
    if len(got) != n:
        sys.exit("readdir %s: %d names, wanted %d" % (d, len(got), n))
    print("%.6f" % dt)
elif mode == "write":
    prefix, nf, mib, src = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    sfd = os.open(src, os.O_RDONLY)
    span = max(1, os.fstat(sfd).st_size - mib * MiB)
    total = 0
    t0 = time.time()
    for i in range(nf):
        fd = os.open(os.path.join(d, "%s-%03d" % (prefix, i)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        off = (i * mib * MiB) % span
        for k in range(mib):
            buf = memoryview(os.pread(sfd, MiB, off + k * MiB))
            while buf:
                n = os.write(fd, buf)
                buf = buf[n:]
                total += n
        os.fsync(fd)
        os.close(fd)
    print("%.6f %.6f %d" % (t0, time.time(), total))
elif mode == "read":
    prefix, nf = sys.argv[3], int(sys.argv[4])
    total = 0
    t0 = time.time()
    for i in range(nf):
        fd = os.open(os.path.join(d, "%s-%03d" % (prefix, i)), os.O_RDONLY)
        while True:
            b = os.read(fd, MiB)
            if not b:
                break
            total += len(b)
        os.close(fd)
    print("%.6f %.6f %d" % (t0, time.time(), total))
else:
    sys.exit("bad mode " + mode)
"""


def fs_type(path: str) -> str:
    """File system type of the mount holding path (longest mount prefix)."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    with open("/proc/self/mounts") as f:
        for line in f:
            p = line.split()
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), p[1])
            if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
                best, kind = mp, p[2]
    return kind


def dd_seconds(r: subprocess.CompletedProcess, what: str) -> float:
    m = re.search(r"copied, ([0-9.]+) s", r.stderr or "") or re.search(r"copied, ([0-9.]+) s", r.stdout or "")
    if r.returncode != 0 or not m:
        raise BenchError("%s failed (%d): %s%s" % (what, r.returncode, r.stdout, r.stderr))
    return float(m.group(1))


class MountBench(Bench):
    name = "mount.py"
    call_timeout = CALL_TIMEOUT
    leftover_fuse_only = True

    def __init__(self, a, log) -> None:
        super().__init__(log)
        self.a = a
        self.tag = uuid.uuid4().hex[:8]
        self.mount_tag = "gxpbench-" + self.tag         # head mounts left with it are unmounted on clean-up
        self.top = "/tmp/gxpbench-" + self.tag          # head: session, mountpoints, exports
        self.work = "/var/tmp/gxpbench-" + self.tag     # real disk: source file, tool, local dir
        self.gmounted: list = []         # mountpoints of the session's GMount
        self.head_mounts: list = []      # our/sshfs mounts on the head
        self.host_mounts: list = []      # (host, mountpoint) sshfs mounts on hosts

    # -- helpers -----------------------------------------------------------
    @property
    def src(self) -> str:
        return os.path.join(self.work, "src")

    @property
    def tool(self) -> str:
        return os.path.join(self.work, "tool.py")

    def env(self) -> dict:
        return dict(super().env(), LANG="C")

    def as_user(self, argv, timeout=CALL_TIMEOUT, check=True, what=None):
        r = self.bed.run_as(self.user.name, argv, env=self.env(), capture_output=True, text=True,
                            timeout=timeout)
        if check and r.returncode != 0:
            raise BenchError("%s failed (%d): %s%s" % (what or " ".join(map(str, argv)), r.returncode,
                                                       r.stdout, r.stderr))
        return r

    def on_host(self, host: str, argv, timeout=CALL_TIMEOUT, check=True, what=None, root=False):
        r = self.bed.host(host).exec(argv, user=None if root else self.user.name,
                                     env=None if root else self.env(),
                                     capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise BenchError("%s: %s failed (%d): %s%s" % (host, what or argv, r.returncode, r.stdout,
                                                           r.stderr))
        return r

    def drop_caches(self) -> None:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")

    def mkdir_user(self, path: str) -> str:
        """A directory owned by the user (parents made as root, 0755)."""
        os.makedirs(path, exist_ok=True)
        os.chown(path, self.user.uid, self.user.gid)
        return path

    def host_dir(self, host: str, name: str) -> str:
        """/tmp/gxpbench-TAG/NAME on `host` (its private /tmp), owned by the user;
        returns the path as the host sees it."""
        base = os.path.join(self.bed.host(host).tmp_dir, "gxpbench-" + self.tag)
        for p in (base, os.path.join(base, name)):
            os.makedirs(p, exist_ok=True)
            os.chown(p, self.user.uid, self.user.gid)
        return "%s/%s" % (self.top, name)

    def host_side(self, host: str, path: str) -> str:
        """The root-side path of a path in `host`'s /tmp."""
        assert path.startswith("/tmp/")
        return os.path.join(self.bed.host(host).tmp_dir, path[len("/tmp/"):])

    def snap(self):
        """CPU snapshot: machine jiffies and the user's processes' CPU."""
        return cpu_busy(), {p: proc_cpu(p) for p in user_pids(self.user.uid)}, time.monotonic()

    def account(self, key: str, before) -> None:
        """CPU used since `before`: the user's processes alive at the end (long-lived
        ones: mount daemons, ssh, sshd/sftp-server, agents; short commands like dd
        that already exited are not in it) and the machine's busy share."""
        busy0, cpu0, _ = before
        busy1 = cpu_busy()
        used = 0.0
        for p in user_pids(self.user.uid):
            c = proc_cpu(p)
            if c is None:
                continue
            used += c - (cpu0.get(p) or 0.0)
        self.add(key + " ucpu", used)
        self.add(key + " busy", busy_share(busy0, busy1))

    # -- mounts --------------------------------------------------------------
    def head_mount(self, kind: str, spec: str, mp: str) -> None:
        if kind in ("ours", "ourslocal"):
            cache = self.mkdir_user(os.path.join(self.top, "cache"))
            argv = [SSHFSM, "-o", "cache_dir=" + cache, spec, mp]
        elif kind == "bindfs":
            # an ordinary user: bindfs adds -o allow_other unless told not to,
            # and fusermount refuses it without user_allow_other in fuse.conf
            argv = ["bindfs", "--no-allow-other", spec, mp]
        else:
            argv = [SSHFS, spec, mp]
        # sshfs daemonizes; its ssh child would keep a captured pipe open: no pipes.
        errf = os.path.join(self.top, "mount.err")
        with open(errf, "w") as err:
            os.chown(errf, self.user.uid, self.user.gid)
            r = self.bed.run_as(self.user.name, argv, env=self.env(), stdout=subprocess.DEVNULL,
                                stderr=err, timeout=60)
        text = open(errf).read()
        self.head_mounts.append(mp)
        if r.returncode != 0 or mp not in [l.split()[1] for l in fuse_mounts(open("/proc/mounts").read())]:
            raise BenchError("%s %s %s failed (%d): %s" % (kind, spec, mp, r.returncode, text))
        if text.strip():
            self.odd.append("%s %s said: %s" % (kind, spec, text.strip()[:200]))

    def head_umount(self, mp: str) -> None:
        r = self.as_user([FUSERMOUNT, "-u", mp], check=False)
        if r.returncode != 0:
            time.sleep(0.5)
            r = self.as_user([FUSERMOUNT, "-u", mp], check=False)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", mp], capture_output=True)
            self.odd.append("fusermount -u %s failed: %s (lazily unmounted as root)" % (mp, r.stderr.strip()))
        if mp in self.head_mounts:
            self.head_mounts.remove(mp)
        # sshfsm/sshfs exit after the unmount; wait so their CPU is not in the next case
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10 and any(mp in proc_cmdline(p) for p in user_pids(self.user.uid)):
            time.sleep(0.05)

    def host_sshfs(self, host: str, spec: str, mp: str) -> None:
        errf = os.path.join(self.work, "mount-%s.err" % host)
        with open(errf, "w") as err:
            os.chown(errf, self.user.uid, self.user.gid)
            r = self.bed.host(host).exec([SSHFS, spec, mp], user=self.user.name, env=self.env(),
                                         stdout=subprocess.DEVNULL, stderr=err, timeout=60)
        self.host_mounts.append((host, mp))
        if r.returncode != 0:
            raise BenchError("%s: sshfs %s %s failed (%d): %s" % (host, spec, mp, r.returncode,
                                                                   open(errf).read()))

    def host_umount(self, host: str, mp: str) -> None:
        r = self.on_host(host, [FUSERMOUNT, "-u", mp], check=False)
        if r.returncode != 0:
            self.on_host(host, ["umount", "-l", mp], check=False, root=True)
            self.odd.append("%s: fusermount -u %s failed: %s (lazily unmounted as root)"
                            % (host, mp, r.stderr.strip()))
        if (host, mp) in self.host_mounts:
            self.host_mounts.remove((host, mp))

    def dd_head(self, src: str, dst: str, mib: int | None, what: str) -> float:
        argv = ["dd", "if=" + src, "of=" + dst, "bs=1M"]
        if mib is not None:
            argv += ["count=%d" % mib, "conv=fsync"]
        return dd_seconds(self.as_user(argv, timeout=max(CALL_TIMEOUT, (mib or self.a.size) * 2),
                                       check=False), what)

    # -- large file ----------------------------------------------------------
    def large(self, rep: int) -> None:
        S = self.a.size
        mb = S * MiB / 1e6
        rate = lambda s: mb / s  # noqa: E731
        # local disk
        f = os.path.join(self.work, "local", "big")
        b = self.snap()
        self.add("large local write", rate(self.dd_head(self.src, f, S, "local write")))
        self.account("large local write", b)
        self.drop_caches()
        b = self.snap()
        self.add("large local read", rate(self.dd_head(f, "/dev/null", None, "local read")))
        self.account("large local read", b)
        os.unlink(f)
        self.log("  rep %d large local: write %.1f MB/s, read %.1f MB/s"
                 % (rep + 1, self.samples["large local write"][-1], self.samples["large local read"][-1]))
        for kind in ("ours", "sshfs"):
            name = "lf-%s-%d" % (kind, rep)
            rdir = self.host_dir(REMOTE, name)
            spec = "%s:%s" % (REMOTE, rdir)
            mp = self.mkdir_user(os.path.join(self.top, "m-" + name))
            self.head_mount(kind, spec, mp)
            b = self.snap()
            self.add("large %s write" % kind, rate(self.dd_head(self.src, mp + "/big", S, kind + " write")))
            self.account("large %s write" % kind, b)
            self.head_umount(mp)
            self.head_mount(kind, spec, mp)
            self.drop_caches()
            b = self.snap()
            self.add("large %s read" % kind,
                     rate(self.dd_head(mp + "/big", "/dev/null", None, kind + " read")))
            self.account("large %s read" % kind, b)
            msg = "  rep %d large %-5s: write %.1f MB/s, first read %.1f MB/s" % (
                rep + 1, kind, self.samples["large %s write" % kind][-1],
                self.samples["large %s read" % kind][-1])
            if kind == "ours":
                r = self.as_user(["getfattr", "--only-values", "-n", "user.sshfsmux.location", mp + "/big"],
                                 check=False)
                self.info["large ours location"] = r.stdout.strip() or r.stderr.strip()
                if HEAD not in r.stdout.split(","):
                    self.odd.append("after the first read, location of the large file is %r: no replica on %s"
                                    % (r.stdout.strip(), HEAD))
                self.drop_caches()
                b = self.snap()
                self.add("large ours reread",
                         rate(self.dd_head(mp + "/big", "/dev/null", None, "ours re-read")))
                self.account("large ours reread", b)
                msg += ", re-read (replica) %.1f MB/s" % self.samples["large ours reread"][-1]
            self.head_umount(mp)
            os.unlink(os.path.join(self.host_side(REMOTE, rdir), "big"))
            self.log(msg)

    # -- metadata -------------------------------------------------------------
    def meta_pass(self, key: str, mode: str, d: str) -> None:
        b = self.snap()
        r = self.as_user(["python3", self.tool, mode, d, str(self.a.files)], timeout=1800,
                         what=mode + " " + d)
        dt = float(r.stdout.split()[-1])
        self.account(key, b)
        self.add(key, self.a.files / dt)

    def metadata(self, rep: int) -> None:
        n = self.a.files
        d = self.mkdir_user(os.path.join(self.work, "local", "md-%d" % rep))
        self.meta_pass("meta local create", "create", d)
        self.drop_caches()
        self.meta_pass("meta local stat", "stat", d)
        self.meta_pass("meta local stat warm", "stat", d)
        self.drop_caches()
        self.meta_pass("meta local readdir", "readdir", d)
        shutil.rmtree(d)
        msg = "  rep %d metadata %d files: local create %.0f/s stat %.0f/s readdir %.0f/s" % (
            rep + 1, n, self.samples["meta local create"][-1], self.samples["meta local stat"][-1],
            self.samples["meta local readdir"][-1])
        # bindfs (a C FUSE file system) over a local directory: the anchor for ourslocal
        for kind in ("ours", "sshfs", "ourslocal") + (("bindfs",) if shutil.which("bindfs") else ()):
            name = "md-%s-%d" % (kind, rep)
            if kind in ("ourslocal", "bindfs"):   # a local branch: the FUSE cost alone
                rdir = spec = self.mkdir_user(os.path.join(self.work, "local", name))
            else:
                rdir = self.host_dir(REMOTE, name)
                spec = "%s:%s" % (REMOTE, rdir)
            mp = self.mkdir_user(os.path.join(self.top, "m-" + name))
            self.head_mount(kind, spec, mp)
            self.meta_pass("meta %s create" % kind, "create", mp)
            for mode in ("stat", "readdir"):
                self.head_umount(mp)
                self.drop_caches()
                self.head_mount(kind, spec, mp)
                self.meta_pass("meta %s %s" % (kind, mode), mode, mp)
            self.head_umount(mp)
            shutil.rmtree(rdir if kind in ("ourslocal", "bindfs") else self.host_side(REMOTE, rdir))
            msg += "; %s %.0f/%.0f/%.0f" % (kind, self.samples["meta %s create" % kind][-1],
                                           self.samples["meta %s stat" % kind][-1],
                                           self.samples["meta %s readdir" % kind][-1])
        self.log(msg)

    # -- the session: direct channel and locality -------------------------------
    def open_session(self) -> None:
        self.session = os.path.join(self.top, "session")
        self.gxpc("use", "ssh", "head", "tb*")
        dt, r = self.gxpc("explore", NODES_PAT)
        self.info["explore"] = dt
        if r.stderr.strip():
            self.odd.append("explore said on stderr: %s" % r.stderr.strip()[:300])

    def gmount(self, export: str, mnt: str, *opts) -> float:
        self.gmounted.append(mnt)
        dt, r = self.gxpc("mount", *(list(opts) + [export, mnt]))
        if r.stderr.strip() or r.stdout.strip():
            self.odd.append("gxpc mount %s said: %s" % (" ".join(opts), (r.stdout + r.stderr).strip()[:300]))
        self.add("gmount mount s", dt)
        return dt

    def gumount(self, mnt: str) -> None:
        dt, r = self.gxpc("umount", mnt)
        self.gmounted.remove(mnt)
        self.add("gmount umount s", dt)

    def e_on(self, hosts: str, cmd: str, timeout=CALL_TIMEOUT):
        _, r = self.gxpc("e", "-H", "--hosts", hosts, cmd, timeout=timeout)
        return r

    def direct(self, rep: int) -> None:
        D = self.a.direct_size
        mb = D * MiB / 1e6
        export, mnt = "%s/dexp" % self.top, "%s/dmnt" % self.top
        self.gxpc("e", "mkdir -p %s %s" % (export, mnt))
        files = {k: "big-%s-%d" % (k, rep) for k in ("tls", "none", "sshfs")}
        for f in files.values():
            self.e_on(DIRECT_FROM, "dd if=%s of=%s/%s bs=1M count=%d conv=fsync 2>&1"
                      % (self.src, export, f, D))
        timeout = max(CALL_TIMEOUT, D * 2)
        for kind, opts in (("tls", []), ("none", ["-o", "cipher=none"])):
            self.gmount(export, mnt, *opts)
            self.drop_caches()
            b = self.snap()
            r = self.e_on(DIRECT_TO, "dd if=%s/%s of=/dev/null bs=1M 2>&1" % (mnt, files[kind]),
                          timeout=timeout)
            self.account("direct " + kind, b)
            self.add("direct " + kind, mb / dd_seconds(r, "direct %s read" % kind))
            self.gumount(mnt)
        # anchor: sshfs on DIRECT_TO of DIRECT_FROM's export, same links
        smp = "%s/dsshfs" % self.top
        self.on_host(DIRECT_TO, ["mkdir", "-p", smp])
        self.host_sshfs(DIRECT_TO, "%s:%s" % (DIRECT_FROM, export), smp)
        self.drop_caches()
        b = self.snap()
        r = self.on_host(DIRECT_TO, ["dd", "if=%s/%s" % (smp, files["sshfs"]), "of=/dev/null", "bs=1M"],
                         timeout=timeout, check=False)
        self.account("direct sshfs", b)
        self.add("direct sshfs", mb / dd_seconds(r, "sshfs read on " + DIRECT_TO))
        self.host_umount(DIRECT_TO, smp)
        for f in files.values():
            os.unlink(os.path.join(self.host_side(DIRECT_FROM, export), f))
        self.log("  rep %d direct %s <- %s, %d MiB: TLS %.1f MB/s, cipher=none %.1f MB/s, sshfs %.1f MB/s"
                 % (rep + 1, DIRECT_TO, DIRECT_FROM, D, self.samples["direct tls"][-1],
                    self.samples["direct none"][-1], self.samples["direct sshfs"][-1]))

    def parallel(self, key: str, cmd: str, timeout=CALL_TIMEOUT, nodes=None) -> None:
        """Run cmd (a TOOL write/read) on every node at once; aggregate MB/s."""
        nodes = nodes or NODES
        b = self.snap()
        r = self.e_on(NODES_PAT if nodes == NODES else ",".join(nodes), cmd, timeout=timeout)
        self.account(key, b)
        rows = {}
        for line in r.stdout.splitlines():
            host, _, rest = line.partition(": ")
            p = rest.split()
            if len(p) == 3:
                rows[host] = (float(p[0]), float(p[1]), int(p[2]))
        if sorted(rows) != sorted(nodes):
            raise BenchError("%s: output from %s, wanted %s:\n%s%s"
                             % (key, sorted(rows), nodes, r.stdout, r.stderr))
        t0 = min(v[0] for v in rows.values())
        t1 = max(v[1] for v in rows.values())
        total = sum(v[2] for v in rows.values())
        want = len(nodes) * self.nfiles * LOC_FILE_MIB * MiB
        if total != want:
            raise BenchError("%s: %d bytes, wanted %d" % (key, total, want))
        self.add(key, total / 1e6 / (t1 - t0))
        self.add(key + " per node", statistics.median(v[2] / 1e6 / (v[1] - v[0]) for v in rows.values()))
        self.add(key + " s", t1 - t0)

    @property
    def nfiles(self) -> int:
        return max(1, self.a.loc_size // LOC_FILE_MIB)

    def locality(self) -> None:
        nf = self.nfiles
        export, mnt = "%s/lexp" % self.top, "%s/lmnt" % self.top
        self.gxpc("e", "mkdir -p %s %s" % (export, mnt))
        self.gmount(export, mnt)
        tool = "python3 %s" % self.tool
        tmo = max(CALL_TIMEOUT, self.a.loc_size * len(NODES))
        self.parallel("loc ours write",
                      "%s write %s $GXP_HOSTNAME %d %d %s" % (tool, mnt, nf, LOC_FILE_MIB, self.src),
                      timeout=tmo)
        self.parallel("loc local write", "%s write %s L$GXP_HOSTNAME %d %d %s"
                      % (tool, export, nf, LOC_FILE_MIB, self.src), timeout=tmo)
        # the files written through the mount landed in each node's own export
        for h in NODES:
            have = sorted(os.listdir(self.host_side(h, export)))
            want = sorted(["%s-%03d" % (h, i) for i in range(nf)] + ["L%s-%03d" % (h, i) for i in range(nf)])
            if have != want:
                raise BenchError("%s: its export holds %s, wanted %s" % (h, have[:5], want[:5]))
        for rep in range(self.a.reps):
            self.drop_caches()
            self.parallel("loc ours read", "%s read %s $GXP_HOSTNAME %d" % (tool, mnt, nf), timeout=tmo)
            self.drop_caches()
            self.parallel("loc local read", "%s read %s $GXP_HOSTNAME %d" % (tool, export, nf), timeout=tmo)
            # one node alone: no other reader competes for the machine's CPUs
            self.drop_caches()
            self.parallel("loc1 ours read", "%s read %s $GXP_HOSTNAME %d" % (tool, mnt, nf), timeout=tmo,
                          nodes=NODES[:1])
            self.drop_caches()
            self.parallel("loc1 local read", "%s read %s $GXP_HOSTNAME %d" % (tool, export, nf), timeout=tmo,
                          nodes=NODES[:1])
            self.log("  rep %d locality %d x %d MiB: ours read %.0f MB/s, local %.0f MB/s; "
                     "%s alone: ours %.0f, local %.0f MB/s"
                     % (rep + 1, len(NODES), self.a.loc_size, self.samples["loc ours read"][-1],
                        self.samples["loc local read"][-1], NODES[0], self.samples["loc1 ours read"][-1],
                        self.samples["loc1 local read"][-1]))
        self.gumount(mnt)
        # all-to-one: every node sshfs-mounts A2O_SERVER's directory
        sdir = self.host_dir(A2O_SERVER, "a2o")
        amp = "%s/a2om" % self.top
        self.gxpc("e", "mkdir -p %s" % amp)
        for h in NODES:
            self.host_sshfs(h, "%s:%s" % (A2O_SERVER, sdir), amp)
        tmo = max(CALL_TIMEOUT, 3 * self.a.loc_size * len(NODES) * MiB / 1e6 / LINK_MBS)
        self.parallel("loc a2o write",
                      "%s write %s $GXP_HOSTNAME %d %d %s" % (tool, amp, nf, LOC_FILE_MIB, self.src),
                      timeout=tmo)
        for h in NODES:        # a fresh mount: nothing of sshfs's caches left
            self.host_umount(h, amp)
            self.host_sshfs(h, "%s:%s" % (A2O_SERVER, sdir), amp)
        self.drop_caches()
        self.parallel("loc a2o read", "%s read %s $GXP_HOSTNAME %d" % (tool, amp, nf), timeout=tmo)
        for h in NODES:
            self.host_umount(h, amp)
        self.log("  locality all-to-one (%s): write %.1f MB/s, read %.1f MB/s"
                 % (A2O_SERVER, self.samples["loc a2o write"][-1], self.samples["loc a2o read"][-1]))

    def close_session(self) -> None:
        if self.session is None:
            return
        try:
            for mnt in list(self.gmounted):
                dt, r = self.gxpc("umount", mnt, check=False)
                if r.returncode != 0:
                    self.odd.append("gxpc umount %s exited %d: %s"
                                    % (mnt, r.returncode, (r.stderr or r.stdout).strip()))
                self.gmounted.remove(mnt)
            self.quit_session()
        finally:
            self.session = None

    # -- driver ------------------------------------------------------------
    def setup(self) -> None:
        self.check_installed(SSHFSM)
        if not os.access(SSHFS, os.X_OK) and not ensure_anchor("sshfs", "sshfs"):
            raise BenchError("sshfs is not installed and apt-get could not install it")
        if not os.path.exists("/dev/fuse"):
            raise BenchError("no /dev/fuse")
        kind = fs_type("/var/tmp")
        self.info["local fs"] = "/var/tmp (%s)" % kind
        if kind in ("tmpfs", "ramfs", "overlay"):
            raise BenchError("/var/tmp is %s, not a disk: no local-disk anchor here" % kind)
        self.info["head /tmp fs"] = fs_type("/tmp")
        self.open_fuse()
        dt = self.bed_up(HOSTS, "gxpmb", bw=BW)
        self.info["hosts fs"] = fs_type(self.bed.host(HOSTS[0]).tmp_dir)
        for d in (self.top, self.work):
            self.make_dir(d)
        self.mkdir_user(os.path.join(self.work, "local"))
        with open(self.tool, "w") as f:
            f.write(TOOL)
        # the random source: big enough for every writer
        need = max(self.a.size, self.a.direct_size, self.a.loc_size) * MiB
        with open(self.src, "wb") as f:
            left = need
            while left > 0:
                n = min(left, 16 * MiB)
                f.write(os.urandom(n))
                left -= n
        os.chown(self.src, self.user.uid, self.user.gid)
        self.log("test bed of %d hosts (%s links) and user %s up in %.1fs; local disk %s"
                 % (len(HOSTS), BW, self.user.name, dt, self.info["local fs"]))
        # warm-up, not counted: first ssh to the hosts in use
        self.as_user(["ssh", REMOTE, "true"])

    def run(self) -> None:
        t = time.monotonic()
        for rep in range(self.a.reps):
            self.metadata(rep)
        self.info["t metadata"] = time.monotonic() - t
        t = time.monotonic()
        for rep in range(self.a.reps_large):
            self.large(rep)
        self.info["t large"] = time.monotonic() - t
        t = time.monotonic()
        self.open_session()
        for rep in range(self.a.reps_large):
            self.direct(rep)
        self.info["t direct"] = time.monotonic() - t
        t = time.monotonic()
        self.locality()
        self.info["t locality"] = time.monotonic() - t
        self.close_session()

    def release(self) -> None:
        for mp in list(self.head_mounts):
            if not self.guarded("unmounting %s" % mp, self.head_umount, mp):
                subprocess.run(["umount", "-l", mp], capture_output=True)
        for host, mp in list(self.host_mounts):
            self.guarded("unmounting %s on %s" % (mp, host), self.host_umount, host, mp)
        self.guarded("quitting the session", self.close_session)
        left = self.settle()
        if left:
            self.odd.append("%d processes of the user were left after unmount and quit (killed by the "
                            "teardown): %s" % (len(left), describe(left)))

    # -- report ------------------------------------------------------------
    def rows(self) -> list:
        S, D = self.a.size, self.a.direct_size
        out = []

        def row(case, what, anchor_key, ours_key, unit):
            out.append((case, what, self.med(anchor_key), self.med(ours_key), unit))

        lf = "large %d MiB head<-%s" % (S, REMOTE)
        row(lf + " write", "sshfs", "large sshfs write", "large ours write", "MB/s")
        row(lf + " write", "local disk", "large local write", "large ours write", "MB/s")
        row(lf + " read (streamed)", "sshfs", "large sshfs read", "large ours read", "MB/s")
        row(lf + " read (streamed)", "local disk", "large local read", "large ours read", "MB/s")
        row(lf + " re-read (replica)", "sshfs read", "large sshfs read", "large ours reread", "MB/s")
        row(lf + " re-read (replica)", "local disk", "large local read", "large ours reread", "MB/s")
        dc = "GMount %d MiB %s<-%s" % (D, DIRECT_TO, DIRECT_FROM)
        row(dc + " TLS", "sshfs", "direct sshfs", "direct tls", "MB/s")
        row(dc + " cipher=none", "sshfs", "direct sshfs", "direct none", "MB/s")
        row(dc + " cipher=none", "ours TLS", "direct tls", "direct none", "MB/s")
        md = "%d files" % self.a.files
        for op in ("create", "stat", "readdir"):
            row("%s %s" % (md, op), "sshfs", "meta sshfs " + op, "meta ours " + op, "ops/s")
            row("%s %s" % (md, op), "local disk", "meta local " + op, "meta ours " + op, "ops/s")
        row(md + " stat", "local warm", "meta local stat warm", "meta ours stat", "ops/s")
        for op in ("create", "stat", "readdir"):
            row("%s %s, sshfsm of a local dir" % (md, op), "local disk", "meta local " + op,
                "meta ourslocal " + op, "ops/s")
            row("%s %s, sshfsm of a local dir" % (md, op), "bindfs (C FUSE)", "meta bindfs " + op,
                "meta ourslocal " + op, "ops/s")
        lc = "locality %dx%d MiB" % (len(NODES), self.a.loc_size)
        row(lc + " read", "local disk", "loc local read", "loc ours read", "MB/s")
        row(lc + " read", "all-to-one", "loc a2o read", "loc ours read", "MB/s")
        row("locality %s alone, %d MiB read" % (NODES[0], self.a.loc_size), "local disk", "loc1 local read",
            "loc1 ours read", "MB/s")
        row(lc + " write", "local disk", "loc local write", "loc ours write", "MB/s")
        row(lc + " write", "all-to-one", "loc a2o write", "loc ours write", "MB/s")
        return out

    def report(self) -> None:
        o = []
        w = 44
        o.append("%-*s %-12s %10s %10s %6s %7s" % (w, "case", "anchor", "anchor", "ours", "unit", "ratio"))
        o.append("-" * (w + 52))
        for case, what, a, v, unit in self.rows():
            fmt = "%.1f" if unit == "MB/s" else "%.0f"
            o.append("%-*s %-12s %10s %10s %6s %7s" % (w, case, what, value_text(fmt, a), value_text(fmt, v),
                                                      unit, ratio_text(a, v)))
        o.append("  (ratio = ours / anchor, higher is better; medians; links %s = %.1f MB/s; MB = 10^6 bytes)"
                 % (BW, LINK_MBS))
        o.append("")
        o.append("where the time went (user CPU = CPU-seconds of the user's long-lived processes "
                 "while timed:")
        o.append(" mount daemons, ssh, sshd/sftp-server, agents; busy = share of the machine's %d CPUs):"
                 % os.cpu_count())
        keys = [("large local write", "large local write"), ("large local read", "large local read"),
                ("large ours write", "sshfsm write"), ("large sshfs write", "sshfs write"),
                ("large ours read", "sshfsm streamed read"), ("large ours reread", "sshfsm replica re-read"),
                ("large sshfs read", "sshfs read"),
                ("direct tls", "GMount TLS read"), ("direct none", "GMount cipher=none read"),
                ("direct sshfs", "sshfs read (hosts)"),
                ("meta ours create", "sshfsm create"), ("meta sshfs create", "sshfs create"),
                ("meta ours stat", "sshfsm stat"), ("meta sshfs stat", "sshfs stat"),
                ("meta ours readdir", "sshfsm readdir"), ("meta sshfs readdir", "sshfs readdir"),
                ("meta ourslocal stat", "sshfsm(local dir) stat"),
                ("loc ours read", "locality ours read"), ("loc local read", "locality local read"),
                ("loc a2o read", "locality all-to-one read"), ("loc ours write", "locality ours write"),
                ("loc a2o write", "locality all-to-one write")]
        for k, label in keys:
            if self.med(k) is None:
                continue
            o.append("  %-26s user CPU %6.1fs  busy %3.0f%%" % (label, self.med(k + " ucpu") or 0,
                                                              100 * (self.med(k + " busy") or 0)))
        for k in ("loc ours read", "loc local read", "loc a2o read"):
            if self.med(k + " per node") is not None:
                o.append("  %-26s %.2fs wall, per node %.1f MB/s (median)" % (
                    k.replace("loc ", "locality "), self.med(k + " s"), self.med(k + " per node")))
        if self.med("gmount mount s") is not None:
            o.append("  gxpc mount %.2fs, gxpc umount %.2fs (medians, %d nodes); explore %.2fs"
                     % (self.med("gmount mount s"), self.med("gmount umount s") or 0, len(NODES) + 1,
                        self.info.get("explore", 0)))
        if "large ours location" in self.info:
            o.append("  location of the large file after its first read: %s"
                     % self.info["large ours location"])
        o.append("  local disk: %s; the hosts' /tmp: %s; head /tmp: %s" % (
            self.info.get("local fs"), self.info.get("hosts fs"), self.info.get("head /tmp fs")))
        o.append("  phases: metadata %.0fs, large file %.0fs, direct channel %.0fs, locality %.0fs" % (
            self.info.get("t metadata", 0), self.info.get("t large", 0), self.info.get("t direct", 0),
            self.info.get("t locality", 0)))
        o.append("  reps: %d (metadata, locality reads), %d (large file, direct channel); all-to-one once"
                 % (self.a.reps, self.a.reps_large))
        o.append("")

        def ratio(a, b):
            x, y = self.med(a), self.med(b)
            return x / y if x and y else None

        def yn(ok):
            return "yes" if ok else "NO"

        o.append('goals (from the issue): remote large-file throughput >= %.1fx sshfs on the same link; '
                 'locality >= %.1fx local disk and >= %.0fx all-to-one on 100 Mbit links; metadata stat '
                 '>= %.0f%% of local' % (GOAL_LARGE, GOAL_LOC_LOCAL, GOAL_LOC_A2O, 100 * GOAL_STAT))
        holds = []
        for what, a, b in (("write", "large ours write", "large sshfs write"),
                           ("first (streamed) read", "large ours read", "large sshfs read")):
            r = ratio(a, b)
            ok = r is not None and r >= GOAL_LARGE
            holds.append(ok)
            o.append("  large file %-22s %.2fx sshfs (%.1f vs %.1f MB/s): %s" % (
                what, r or 0, self.med(a) or 0, self.med(b) or 0, yn(ok)))
        for what, a in (("TLS", "direct tls"), ("cipher=none", "direct none")):
            r = ratio(a, "direct sshfs")
            o.append("  (also) GMount direct channel %-11s %.2fx sshfs (%.1f vs %.1f MB/s): %s" % (
                what, r or 0, self.med(a) or 0, self.med("direct sshfs") or 0,
                yn(r is not None and r >= GOAL_LARGE)))
        r1, r2 = ratio("loc ours read", "loc local read"), ratio("loc ours read", "loc a2o read")
        ok1, ok2 = r1 is not None and r1 >= GOAL_LOC_LOCAL, r2 is not None and r2 >= GOAL_LOC_A2O
        holds += [ok1, ok2]
        o.append("  locality read vs local disk %.2fx (%.0f vs %.0f MB/s, need >= %.1fx): %s" % (
            r1 or 0, self.med("loc ours read") or 0, self.med("loc local read") or 0, GOAL_LOC_LOCAL,
            yn(ok1)))
        r1n = ratio("loc1 ours read", "loc1 local read")
        o.append("    (one node reading alone, no competition for the CPUs: %.2fx local disk, "
                 "%.0f vs %.0f MB/s)"
                 % (r1n or 0, self.med("loc1 ours read") or 0, self.med("loc1 local read") or 0))
        o.append("  locality read vs all-to-one %.1fx (%.0f vs %.1f MB/s, need >= %.0fx): %s" % (
            r2 or 0, self.med("loc ours read") or 0, self.med("loc a2o read") or 0, GOAL_LOC_A2O, yn(ok2)))
        r = ratio("meta ours stat", "meta local stat")
        rw = ratio("meta ours stat", "meta local stat warm")
        ok = r is not None and r >= GOAL_STAT
        holds.append(ok)
        o.append("  metadata stat %.0f%% of local disk, both cold (%.0f vs %.0f stat/s, "
                 "need >= %.0f%%): %s" % (
                     100 * (r or 0), self.med("meta ours stat") or 0, self.med("meta local stat") or 0,
                     100 * GOAL_STAT, yn(ok)))
        o.append("    (against a warm local stat, %.0f/s: %.1f%%)" % (self.med("meta local stat warm") or 0,
                                                                     100 * (rw or 0)))
        rl = ratio("meta ourslocal stat", "meta local stat")
        o.append("    (sshfsm of a local directory, no network: %.0f stat/s, %.0f%% of local disk: the FUSE "
                 "cost alone)" % (self.med("meta ourslocal stat") or 0, 100 * (rl or 0)))
        rb = ratio("meta ourslocal stat", "meta bindfs stat")
        if rb is not None:
            o.append("    (the same against bindfs, a C FUSE file system: %.2fx, %.0f stat/s)"
                     % (rb, self.med("meta bindfs stat") or 0))
        o.append("  ALL GOALS HOLD" if all(holds) else
                 "  GOALS DO NOT ALL HOLD (%d of %d)" % (sum(holds), len(holds)))
        o += self.noticed_lines()
        print("\n".join(o))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=1024, help="large file in MiB (default 1024)")
    p.add_argument("--direct-size", type=int, default=256, help="direct-channel file in MiB (default 256)")
    p.add_argument("--files", type=int, default=10000, help="files for the metadata case (default 10000)")
    p.add_argument("--loc-size", type=int, default=64, help="MiB each node writes and reads in the "
                   "locality case (default 64, in 4 MiB files)")
    p.add_argument("--reps", type=int, default=2, help="reps of the metadata case and the locality reads "
                   "(default 2; medians)")
    p.add_argument("--reps-large", type=int, default=1, help="reps of the large-file and direct-channel "
                   "cases (default 1: about 90 s per pass of 1 GiB at 100 Mbit)")
    p.add_argument("--quick", action="store_true", help="256 MiB, 64 MiB direct, 2,000 files, 16 MiB per "
                   "node, one rep")
    a = p.parse_args(argv)
    if a.quick:
        a.size, a.direct_size, a.files, a.loc_size, a.reps, a.reps_large = 256, 64, 2000, 16, 1, 1
    if min(a.size, a.direct_size, a.files, a.loc_size, a.reps, a.reps_large) < 1:
        p.error("sizes, counts and reps must be >= 1")
    if a.loc_size % LOC_FILE_MIB:
        p.error("--loc-size must be a multiple of %d" % LOC_FILE_MIB)
    return main_driver(MountBench, a, log)


if __name__ == "__main__":
    sys.exit(main())
