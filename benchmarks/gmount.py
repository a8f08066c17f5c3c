#!/usr/bin/env python3
"""How long `gxpc mount` and `gxpc umount` take on 8, 16 and 32 hosts.

Run as root (the multi-host test bed needs it), from the checkout:

    /opt/gxpstyle/venv/bin/python benchmarks/gmount.py [--reps 5] [--quick]

What it does:

* Builds a test bed (tests/testbed/) of 32 sshd hosts in network namespaces,
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
mode restored. Standard library only, plus tests/testbed/ and benchmarks/bench_harness.py.
"""
from __future__ import annotations

import argparse
import os
import sys
import uuid

from bench_harness import (
    Bench,
    BenchError,
    ensure_anchor,
    fuse_at,
    log,
    main_driver,
    ratio_text,
    user_pids,
    value_text,
)

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


class GMountBench(Bench):
    name = "gmount.py"
    call_timeout = CALL_TIMEOUT

    def __init__(self, a, log) -> None:
        super().__init__(log)
        self.a = a
        self.tag = uuid.uuid4().hex[:8]
        self.top = "/tmp/gxpbench-" + self.tag
        self.mount_tag = "gxpbench-" + self.tag   # head mounts left with it are unmounted on clean-up
        self.gmounted = None          # mountpoint of the open session's GMount
        self.anchor_mounted: list = []  # hosts that may have the anchor's sshfs mount
        self.anchor_mp = None

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
                self.add(c + " ssh sshfs", self.timed(c + " ssh sshfs", lambda spec=spec: self.anchor(
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
                now = len(self.settle(base))
                if now > base:
                    self.odd.append("%s: %d processes of the user more than before the mount, 10 s after "
                                    "umount" % (c, now - base))
                dt, _ = self.timed(c + " e", lambda: self.gxpc("e", "true"))
                self.add(c + " e", dt)
                self.log("  rep %d %-7s mount %.2fs umount %.2fs  (ssh+sshfs par %.2fs, fusermount par %.2fs;"
                         " e true %.2fs)" % (rep + 1, c, self.samples[key][-1],
                                             self.samples[c + " umount"][-1],
                                             self.samples[c + " ssh sshfs"][-1],
                                             self.samples[c + " ssh fusermount"][-1],
                                             self.samples[c + " e"][-1]))
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
                    self.odd.append("gxpc umount exited %d: %s"
                                    % (r.returncode, (r.stderr or r.stdout).strip()))
                self.gmounted = None
            self.quit_session()
        finally:
            self.session = None
            left = self.settle()
            if left:
                self.kill_survivors(left)

    # -- driver ------------------------------------------------------------
    def setup(self) -> None:
        self.check_installed()
        if not ensure_anchor("sshfs", "sshfs"):
            raise BenchError("sshfs is not installed and apt-get could not install it (the anchor)")
        self.open_fuse()
        dt = self.bed_up(["tb%02d" % i for i in range(1, N_HOSTS + 1)], "gxpgm", bw=self.a.bw)
        self.make_dir(self.top)
        self.log("test bed of %d hosts (links %s) and user %s up in %.1fs"
                 % (N_HOSTS, self.a.bw or "unshaped", self.user.name, dt))
        # warm-up, not counted: first ssh to every host
        self.anchor("true", ["tb%02d" % i for i in range(1, N_HOSTS + 1)])

    def run(self) -> None:
        for n in HOST_CASES:
            self.case(n)

    def release(self) -> None:
        self.guarded("closing the session", self.close_session)

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
                o.append("%-*s %-22s %10s %10s %8s" % (w, lab + " " + what, anchor, value_text("%.3f", a),
                                                       value_text("%.3f", v), ratio_text(a, v)))
        o.append("  (ratio = ours / anchor, lower is better; medians over %d reps, 'mount' over reps 2..%d)"
                 % (self.a.reps, self.a.reps))
        o.append("")
        o.append("where the time goes (machine has %d CPUs; busy = share of all CPUs while timed):"
                 % os.cpu_count())
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
        o += self.noticed_lines()
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
    return main_driver(GMountBench, a, log)


if __name__ == "__main__":
    sys.exit(main())
