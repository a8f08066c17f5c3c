#!/usr/bin/env python3
"""How long `gxpc mount` and `gxpc umount` take on 8, 16 and 32 hosts.

Run as root (the multi-host test bed needs it), from the checkout:

    /opt/gxpstyle/venv/bin/python benchmarks/gmount.py [--reps 5] [--quick]

What it does:

* Builds a test bed (tests/testbed.py) of 32 sshd hosts in network namespaces,
  links shaped to 100 Mbit/s (--bw; "none" for unshaped), the checkout and the venv
  hidden on every host, and one ordinary user that runs everything of the product,
  from the installed venv. /dev/fuse is made 0666 for the run (restored afterwards).
* For N = 8, 16, 32: a new session, `gxpc use ssh head 'tb*'`, `gxpc explore
  'tb[[01-NN]]'` (not timed), the export directory made on every node, then --reps
  times (default 5), interleaved with the anchor:
    ours     `gxpc mount EXPORT MNT` (timed): every node, the head included (N+1),
             exports EXPORT and mounts the merge of all N+1 exports at MNT; then
             checked (not timed): a FUSE mount at MNT on every host and the head;
             `gxpc umount` (timed), then checked: no mount left, and the service
             processes gone (the user's process count back to the agents').
             The first mount of a session also pushes the mount code into every
             agent (once per link): it is reported on its own row; the "mount" row
             is the median of the later ones.
    anchor   what one does with plain tools for the all-to-one layout: all N hosts
             at once `ssh h sshfs tb01:DIR MNT` (timed together), then all at once
             `ssh h fusermount3 -u MNT`. (A merged all-to-all view with sshfs would
             take N-1 mounts per host; not attempted.)
    also     `gxpc e true` (one round trip to every node through the tree).
* Medians; --quick: 2 reps.

Prints a table (case, anchor, anchor median s, ours median s, ratio ours/anchor:
lower is better), where the CPU went, and whether the goal of the issue holds:
"under 2 s for 32 hosts" (the paper: under 10 s for 300 nodes).

Everything is cleaned up whatever happens (Ctrl-C, SIGTERM, errors): GMounts are
unmounted, anchor mounts unmounted, sessions quit, the bed torn down, /dev/fuse's
mode restored. Standard library only, plus tests/testbed.py.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

import testbed  # noqa: E402

VENV = os.environ.get("GXP_VENV", "/opt/gxpstyle/venv")
GXPC = os.path.join(VENV, "bin", "gxpc")
N_HOSTS = 32
HOST_CASES = (8, 16, 32)
GOAL_S = 2.0
CALL_TIMEOUT = 180
A2O_SERVER = "tb01"

# Runs as the bench user: all the ssh commands at once, timed inside.
ANCHOR = r"""
import subprocess, sys, time
cmd, hosts = sys.argv[1], sys.argv[2:]
dn = subprocess.DEVNULL
t0 = time.monotonic()
procs = [subprocess.Popen(["ssh", h, cmd], stdin=dn, stdout=dn, stderr=subprocess.PIPE) for h in hosts]
errs = [(h, p.communicate()[1], p.returncode) for h, p in zip(hosts, procs)]
dt = time.monotonic() - t0
bad = [(h, e, rc) for h, e, rc in errs if rc != 0]
if bad:
    sys.exit("%d of %d failed (first: %s %d %r)" % (len(bad), len(hosts), bad[0][0], bad[0][2], bad[0][1]))
print("%.6f" % dt)
"""


class BenchError(RuntimeError):
    pass


class Interrupted(BaseException):
    """SIGTERM/SIGHUP, turned into an exception so that the finally blocks run."""


def _on_term(signum, frame):
    raise Interrupted("signal %d" % signum)


def user_pids(uid: int) -> list:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/status" % entry) as f:
                status = f.read()
        except OSError:
            continue
        state = uids = None
        for line in status.splitlines():
            if line.startswith("State:"):
                state = line.split()[1]
            elif line.startswith("Uid:"):
                uids = [int(x) for x in line.split()[1:4]]
        if state and uids and state not in "ZX" and uid in uids:
            out.append(int(entry))
    return out


def cpu_busy() -> tuple:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    total = sum(v[:8])
    return total - idle, total


def proc_cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def fuse_at(lines, mp: str) -> bool:
    return any(len(l.split()) > 2 and l.split()[1] == mp and l.split()[2].startswith("fuse") for l in lines)


class Bench:
    def __init__(self, a, log) -> None:
        self.a = a
        self.log = log
        self.tag = uuid.uuid4().hex[:8]
        self.top = "/tmp/gxpbench-" + self.tag
        self.bed: "testbed.TestBed | None" = None
        self.user = None
        self.fuse_mode = None
        self.session = None
        self.gmounted = None          # mountpoint of the open session's GMount
        self.anchor_mounted: list = []  # hosts that may have the anchor's sshfs mount
        self.anchor_mp = None
        self.samples: dict = {}
        self.info: dict = {}
        self.odd: list = []

    def add(self, key, value):
        self.samples.setdefault(key, []).append(value)

    def med(self, key):
        v = self.samples.get(key)
        return statistics.median(v) if v else None

    def env(self) -> dict:
        return {"PATH": os.path.join(VENV, "bin") + ":/usr/local/bin:/usr/bin:/bin"}

    def gxpc(self, *args, check=True, timeout=CALL_TIMEOUT):
        argv = [GXPC, "--session", self.session] + [str(a) for a in args]
        t0 = time.monotonic()
        r = self.bed.run_as(self.user.name, argv, env=self.env(), capture_output=True, text=True,
                            timeout=timeout)
        dt = time.monotonic() - t0
        if check and r.returncode != 0:
            raise BenchError("gxpc %s failed (%d):\n%s%s" % (" ".join(map(str, args)), r.returncode,
                                                            r.stdout, r.stderr))
        return dt, r

    def timed(self, key, fn):
        b0, t0 = cpu_busy()
        out = fn()
        b1, t1 = cpu_busy()
        self.add(key + " busy", (b1 - b0) / max(1, t1 - t0))
        self.add(key + " cpu s", (b1 - b0) / os.sysconf("SC_CLK_TCK"))
        return out

    def anchor(self, cmd: str, hosts) -> float:
        r = self.bed.run_as(self.user.name, ["python3", "-c", ANCHOR, cmd] + list(hosts),
                            capture_output=True, text=True, timeout=CALL_TIMEOUT)
        if r.returncode != 0:
            raise BenchError("anchor %r failed (%d): %s%s" % (cmd, r.returncode, r.stdout, r.stderr))
        return float(r.stdout.split()[-1])

    def hosts_dir(self, name: str) -> str:
        """/tmp/gxpbench-TAG/NAME on every host (private /tmp), owned by the user."""
        for h in self.bed.hosts.values():
            base = os.path.join(h.tmp_dir, "gxpbench-" + self.tag)
            for p in (base, os.path.join(base, name)):
                os.makedirs(p, exist_ok=True)
                os.chown(p, self.user.uid, self.user.gid)
        return "%s/%s" % (self.top, name)

    def mounted_on(self, names, mp) -> list:
        """Names (and 'head') that have a FUSE mount at mp."""
        out = [n for n in names if fuse_at(self.bed.host(n).mounts(), mp)]
        with open("/proc/mounts") as f:
            if fuse_at(f.read().splitlines(), mp):
                out.append("head")
        return out

    def settle(self, want: int, timeout=10.0) -> int:
        """Wait until the user has at most `want` processes; return the count."""
        t0 = time.monotonic()
        while len(user_pids(self.user.uid)) > want and time.monotonic() - t0 < timeout:
            time.sleep(0.05)
        return len(user_pids(self.user.uid))

    # -- one size ------------------------------------------------------------
    def case(self, n: int) -> None:
        names = ["tb%02d" % i for i in range(1, n + 1)]
        pat = "tb[[01-%02d]]" % n
        c = "hosts%d" % n
        export = "%s/exp%d" % (self.top, n)
        mnt = "%s/mnt%d" % (self.top, n)
        amnt = self.anchor_mp = self.hosts_dir("amnt%d" % n)
        server_dir = self.hosts_dir("a2o")
        self.session = "%s/session%d" % (self.top, n)
        try:
            self.gxpc("use", "ssh", "head", "tb*")
            dt, r = self.gxpc("explore", pat)
            self.info[c + " explore"] = dt
            if r.stderr.strip():
                self.odd.append("%s: explore said: %s" % (c, r.stderr.strip()[:300]))
            self.gxpc("e", "mkdir -p %s" % export)
            base = len(user_pids(self.user.uid))    # the daemon and the agents
            for rep in range(self.a.reps):
                # anchor: all-to-one with plain tools
                spec = "%s:%s" % (A2O_SERVER, server_dir)
                self.anchor_mounted = list(names)
                self.add(c + " ssh sshfs", self.timed(c + " ssh sshfs", lambda: self.anchor(
                    "sshfs %s %s </dev/null >/dev/null 2>&1" % (spec, amnt), names)))
                got = self.mounted_on(names, amnt)
                if sorted(got) != sorted(names):
                    raise BenchError("%s: anchor mounts on %d of %d hosts" % (c, len(got), n))
                self.add(c + " ssh fusermount", self.timed(c + " ssh fusermount", lambda: self.anchor(
                    "fusermount3 -u %s" % amnt, names)))
                self.anchor_mounted = []
                left = self.mounted_on(names, amnt)
                if left:
                    raise BenchError("%s: anchor mounts left on %s" % (c, left))
                # ours
                key = c + (" mount first" if rep == 0 else " mount")
                self.gmounted = mnt
                dt, r = self.timed(key, lambda: self.gxpc("mount", export, mnt))
                self.add(key, dt)
                if (r.stdout + r.stderr).strip():
                    self.odd.append("%s: gxpc mount said: %s" % (c, (r.stdout + r.stderr).strip()[:300]))
                got = self.mounted_on(names, mnt)
                if len(got) != n + 1:
                    raise BenchError("%s: GMount present on %d of %d nodes (missing: %s)"
                                     % (c, len(got), n + 1, sorted(set(names + ["head"]) - set(got))[:5]))
                self.add(c + " procs mounted", len(user_pids(self.user.uid)) - base)
                dt, r = self.timed(c + " umount", lambda: self.gxpc("umount"))
                self.add(c + " umount", dt)
                self.gmounted = None
                left = self.mounted_on(names, mnt)
                if left:
                    raise BenchError("%s: GMount left on %s after umount" % (c, left))
                now = self.settle(base)
                if now > base:
                    self.odd.append("%s: %d processes of the user more than before the mount, 10 s after "
                                    "umount" % (c, now - base))
                dt, _ = self.timed(c + " e", lambda: self.gxpc("e", "true"))
                self.add(c + " e", dt)
                self.log("  rep %d %-7s mount %.2fs umount %.2fs  (ssh+sshfs par %.2fs, fusermount par %.2fs;"
                         " e true %.2fs)" % (rep + 1, c, self.samples[key][-1], self.samples[c + " umount"][-1],
                                             self.samples[c + " ssh sshfs"][-1],
                                             self.samples[c + " ssh fusermount"][-1], self.samples[c + " e"][-1]))
        finally:
            self.close_session()

    def close_session(self) -> None:
        if self.session is None:
            return
        try:
            for h in list(self.anchor_mounted):
                self.bed.host(h).exec(["fusermount3", "-u", "-z", self.anchor_mp],
                                      user=self.user.name, capture_output=True, timeout=30)
            self.anchor_mounted = []
            if self.gmounted:
                dt, r = self.gxpc("umount", check=False)
                if r.returncode != 0:
                    self.odd.append("gxpc umount exited %d: %s" % (r.returncode, (r.stderr or r.stdout).strip()))
                self.gmounted = None
            dt, r = self.gxpc("quit", check=False)
            if r.returncode != 0:
                self.odd.append("gxpc quit exited %d: %s" % (r.returncode, (r.stderr or r.stdout).strip()))
        finally:
            self.session = None
            if self.settle(0) > 0:
                left = user_pids(self.user.uid)
                self.odd.append("%d processes of the user survived quit by 10 s (killed): %s" % (
                    len(left), "; ".join("%d %s" % (p, proc_cmdline(p)[:80]) for p in left[:5])))
                for p in left:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    # -- driver ------------------------------------------------------------
    def setup(self) -> None:
        missing = testbed.requirements_missing()
        if missing:
            raise BenchError(missing)
        if not os.access(GXPC, os.X_OK):
            raise BenchError("%s is not installed (run scripts/install)" % GXPC)
        if not shutil.which("sshfs"):
            raise BenchError("sshfs is not installed (for the anchor)")
        self.fuse_mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
        os.chmod("/dev/fuse", 0o666)
        self.bed = testbed.TestBed()
        t0 = time.monotonic()
        self.bed.up(["tb%02d" % i for i in range(1, N_HOSTS + 1)], bw=self.a.bw,
                    hide_paths=[REPO, VENV])
        self.user = self.bed.add_user("gxpgm" + uuid.uuid4().hex[:6])
        os.makedirs(self.top, 0o755)
        os.chown(self.top, self.user.uid, self.user.gid)
        self.log("test bed of %d hosts (links %s) and user %s up in %.1fs"
                 % (N_HOSTS, self.a.bw or "unshaped", self.user.name, time.monotonic() - t0))
        # warm-up, not counted: first ssh to every host
        self.anchor("true", ["tb%02d" % i for i in range(1, N_HOSTS + 1)])

    def run(self) -> None:
        for n in HOST_CASES:
            self.case(n)

    def cleanup(self) -> None:
        try:
            if self.bed is not None and self.user is not None:
                self.close_session()
        except BaseException as e:
            print("gmount.py: closing the session failed: %s" % e, file=sys.stderr)
        with open("/proc/mounts") as f:
            for line in f:
                if "gxpbench-" + self.tag in line:
                    self.odd.append("mount left on the head (lazily unmounted): " + line.strip())
                    subprocess.run(["umount", "-l", line.split()[1]], capture_output=True)
        if self.bed is not None:
            self.bed.teardown()
        shutil.rmtree(self.top, ignore_errors=True)
        if self.fuse_mode is not None:
            os.chmod("/dev/fuse", self.fuse_mode)

    # -- report ------------------------------------------------------------
    def report(self) -> None:
        o = []
        w = 44
        o.append("%-*s %-22s %10s %10s %8s" % (w, "case", "anchor", "anchor s", "ours s", "ratio"))
        o.append("-" * (w + 54))
        for n in HOST_CASES:
            c = "hosts%d" % n
            lab = "%d hosts (%d nodes)" % (n, n + 1)
            for what, anchor, akey, okey in (
                    ("mount, first of session", "ssh h sshfs, parallel", " ssh sshfs", " mount first"),
                    ("mount", "ssh h sshfs, parallel", " ssh sshfs", " mount"),
                    ("umount", "ssh h fusermount -u par", " ssh fusermount", " umount"),
                    ("e true", "-", None, " e")):
                a = self.med(c + akey) if akey else None
                v = self.med(c + okey)
                ratio = "%.2f" % (v / a) if (a and v is not None) else "-"
                o.append("%-*s %-22s %10s %10s %8s" % (w, lab + " " + what, anchor,
                                                       "%.3f" % a if a is not None else "-",
                                                       "%.3f" % v if v is not None else "-", ratio))
        o.append("  (ratio = ours / anchor, lower is better; medians over %d reps, 'mount' over reps 2..%d)"
                 % (self.a.reps, self.a.reps))
        o.append("")
        o.append("where the time goes (machine has %d CPUs; busy = share of all CPUs while timed):" % os.cpu_count())
        for n in HOST_CASES:
            c = "hosts%d" % n
            parts = []
            for k, lab in ((" mount first", "first mount"), (" mount", "mount"), (" umount", "umount"),
                           (" ssh sshfs", "anchor mount")):
                if self.med(c + k) is not None:
                    parts.append("%s busy %.0f%% cpu %.2fs" % (lab, 100 * self.med(c + k + " busy"),
                                                               self.med(c + k + " cpu s")))
            o.append("  %-7s %s" % (c, "; ".join(parts)))
            if self.med(c + " mount cpu s") is not None:
                o.append("  %-7s mount: %.0f ms CPU per node; %d more processes of the user while mounted; "
                         "explore (not timed above) %.2fs" % (
                             "", 1000 * self.med(c + " mount cpu s") / (n + 1),
                             self.med(c + " procs mounted") or 0, self.info.get(c + " explore", 0)))
        o.append("")
        t32, f32, u32 = self.med("hosts32 mount"), self.med("hosts32 mount first"), self.med("hosts32 umount")
        o.append('goal (from the issue): "gxpc mount and gxpc umount under 2 s for 32 hosts" '
                 '(the paper: under 10 s for 300 nodes)')

        def yn(v):
            return "yes" if v is not None and v < GOAL_S else "NO"
        o.append("  mount 32 hosts (median of later mounts) %.2fs: %s" % (t32 or 0, yn(t32)))
        o.append("  mount 32 hosts, first of the session (pushes the code) %.2fs: %s" % (f32 or 0, yn(f32)))
        o.append("  umount 32 hosts %.2fs: %s" % (u32 or 0, yn(u32)))
        t8 = self.med("hosts8 mount")
        if t8 and t32:
            o.append("  growth 8 -> 32 hosts: mount x%.2f (anchor x%.2f)" % (
                t32 / t8, (self.med("hosts32 ssh sshfs") or 0) / (self.med("hosts8 ssh sshfs") or 1)))
        holds = all(yn(v) == "yes" for v in (t32, f32, u32))
        o.append("  GOAL HOLDS" if holds else "  GOAL DOES NOT HOLD")
        if self.odd:
            o.append("")
            o.append("noticed:")
            seen = set()
            for x in self.odd:
                if x not in seen:
                    seen.add(x)
                    o.append("  - " + x)
        print("\n".join(o))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5, help="mount/umount reps per size (default 5)")
    p.add_argument("--bw", default="100mbit", help="tbf rate of every link (default 100mbit; none: unshaped)")
    p.add_argument("--quick", action="store_true", help="2 reps")
    a = p.parse_args(argv)
    if a.quick:
        a.reps = 2
    if a.reps < 2:
        p.error("--reps must be >= 2 (the first mount of a session is reported apart)")
    if a.bw in ("none", ""):
        a.bw = None
    if os.geteuid() != 0:
        print("gmount.py: run as root (the test bed needs it)", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_term)

    def log(text):
        print(text, file=sys.stderr, flush=True)

    bench = Bench(a, log)
    t0 = time.monotonic()
    status = 0
    try:
        bench.setup()
        bench.run()
    except (KeyboardInterrupt, Interrupted) as e:
        log("gmount.py: interrupted (%s); cleaning up" % (str(e) or "Ctrl-C"))
        status = 130
    except (BenchError, testbed.TestBedError, subprocess.TimeoutExpired) as e:
        log("gmount.py: %s" % e)
        status = 1
    finally:
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            bench.cleanup()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
    if status == 0:
        bench.report()
        print("total run time %.0fs" % (time.monotonic() - t0))
    elif bench.odd:
        log("noticed: " + "; ".join(bench.odd))
    return status


if __name__ == "__main__":
    sys.exit(main())
