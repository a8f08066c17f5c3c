"""One file to many hosts: `gxpc bcast` against scp, on 100 Mbit/s links; with
--workflows, Confuga's workflows with `gxpc make`'s push, pull and threshold
(benchmarks/transfer_workflows.py says what that measures).

Run as root (the test bed needs it), from the checkout, after scripts/install:

    /opt/gxpstyle/venv/bin/python benchmarks/transfers.py [--size MiB] [--reps N]
                                                           [--hosts 8,16,32] [--quick]
    /opt/gxpstyle/venv/bin/python benchmarks/transfers.py --workflows [--reps N] [--quick]

What it does (one test bed: tb00, the source host, and tb01..tbNN, every link
shaped to 100 Mbit/s by tbf at both ends of its veth; the checkout and the venv
hidden on the hosts; one ordinary user runs everything). A file of --size MiB
(default 96, random so nothing compresses) lies in tb00's scratch directory;
every case copies it to the same path in the scratch directory of the first N
targets (removed between cases), and each copy's SHA-256 is checked:

  S/B        one link: tb01 pulls the file from tb00 with scp (the time a link
             takes to carry the file once; the goal's unit),
  all-pull   every target runs `scp tb00:FILE FILE` at once (tb00's link
             carries the file N times),
  push tree  whole-file pushes with scp, holders doubling each round (round r:
             every holder pushes to one new target; ceil(log2(N+1)) rounds),
  ssh fanout the anchor for bcast, the transport alone: from the head's
             machine (where bcast's relay runs) `ssh TARGET 'cat > FILE' < FILE`
             for every target at once: the same bytes over the same ssh/sshd
             pairs and 100 Mbit links as bcast's chunks, with no agent,
             framing, hashing or coupling between targets. What it costs here
             (seconds, CPU-seconds per MB delivered, by process kind) is what
             any design moving the file from the head over ssh pays on this
             machine,
  tcp chain  the least any pipelined chain can do (when socat is installed):
             tb00 -> tb01 -> ... -> tbN over plain TCP, each host running
             `socat TCP-LISTEN | tee FILE | socat TCP:NEXT` (C programs, no
             encryption, no authentication, no checks, no recovery). Its time
             at 32 hosts says what the machine's two CPUs allow a chain, not
             what a design could,
  bcast      `gxpc bcast --hosts TARGETS tb00:FILE FILE` in a session that has
             explored tb00 and the targets. The explored tree is flat (every
             host is a child of the head): the chunks go tb00 -> head over the
             agent links, and the targets, one site, are fed as a pipelined
             chain: the head feeds tb01, each target feeds the next over a
             direct TLS link while it receives (the head's own link, the
             machine's bridge, is not shaped).

With --chain-len K[,K...], bcast is run again for every N in a session whose
daemon plans chains of at most K nodes (ceil(N/K) interleaved chains per site;
K = 0: no chain, the head feeds every target over its agent link, as before
the chains): "bcast chainK N".

With --fanout F, bcast is run again for every N in a second session explored
with rules head -> tb* and tb* -> tb* and --fanout F: a deeper tree where no
node feeds more than F children (what a tree inside one site would do).

Medians of --reps runs (default 2) for N = 8; for larger N (--hosts, default
8,16,32) S/B, push tree, ssh fanout and bcast once each, and all-pull only when --all-pull-big
is given (it takes N times S/B). Reports seconds, ratios to S/B and to all-pull,
the machine's CPU while each case ran (CPU-seconds per MB delivered), and the
goals of issue 16: bcast within 1.3x S/B and at least 4x faster than all-pull.
All hosts share this machine's two CPUs (and other work may run on it): the
report says how busy it was.

Everything is cleaned up whatever happens (Ctrl-C, SIGTERM, errors): the session
quit, the bed torn down. Standard library only, plus tests/testbed/ and
benchmarks/bench_harness.py.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

from bench_harness import (
    Bench,
    BenchError,
    ensure_anchor,
    log,
    main_driver,
    proc_cmdline,
    proc_cpu,
    ratio_text,
    user_pids,
)
from testbed import sha256_of

BW = "100mbit"
MiB = 1 << 20
GOAL_SB = 1.3
GOAL_PULL = 4.0


KINDS = ("ssh", "sshd", "head", "agents", "other")


def kind_of(cmdline: str) -> str:
    """Which part of the transport a process of the bed's user is."""
    exe = os.path.basename(cmdline.split(" ", 1)[0])
    if exe.startswith("sshd") or cmdline.startswith("sshd"):
        return "sshd"
    if exe == "ssh":
        return "ssh"
    if "gxpstyle.head.daemon" in cmdline:
        return "head"
    if exe.startswith("python"):
        return "agents"
    return "other"


class CpuSampler:
    """CPU-seconds of one user's processes by kind (kind_of) while a case runs:
    every process is read every PERIOD s and its last reading counts, so the
    short-lived ones (ssh, cat, sshd sessions) are counted too, up to their
    last PERIOD."""
    PERIOD = 0.2

    def __init__(self, uid: int) -> None:
        import threading
        self.uid = uid
        self.first: dict = {}
        self.last: dict = {}
        self.kind: dict = {}
        self.stop_ev = threading.Event()
        self.sample(initial=True)
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def sample(self, initial: bool = False) -> None:
        for pid in user_pids(self.uid):
            c = proc_cpu(pid)
            if c is None:
                continue
            if pid not in self.kind:
                self.kind[pid] = kind_of(proc_cmdline(pid))
                self.first[pid] = c if initial else 0.0
            self.last[pid] = c

    def loop(self) -> None:
        while not self.stop_ev.wait(self.PERIOD):
            self.sample()

    def stop(self) -> dict:
        self.stop_ev.set()
        self.thread.join()
        self.sample()
        out = dict.fromkeys(KINDS, 0.0)
        for pid, k in self.kind.items():
            out[k] += self.last[pid] - self.first[pid]
        return out


class TransfersBench(Bench):
    name = "transfers.py"
    call_timeout = 1800

    def __init__(self, opts: argparse.Namespace) -> None:
        super().__init__(log)
        self.opts = opts
        self.counts = sorted(set(opts.hosts))
        self.targets = ["tb%02d" % i for i in range(1, max(self.counts) + 1)]
        self.rel = "bench.bin"
        self.daemon_env: dict = {}
        self.socat = False

    def env(self) -> dict:
        return dict(super().env(), **self.daemon_env)

    # -- helpers ---------------------------------------------------------------
    def scratch(self, host: str) -> str:
        return os.path.join(self.bed.dir, "hosts", host, "scratch")

    def path(self) -> str:
        return os.path.join(self.bed.scratch, self.rel)

    def ssh_all(self, cmds: list) -> float:
        """[(host, shell command)] run at once, each by ssh as the user; seconds."""
        t0 = time.monotonic()
        procs = [(h, c, self.bed.popen_as(self.user.name, ["ssh", h, c], env=self.env(),
                                          stdout=-1, stderr=-1, text=True)) for h, c in cmds]
        for h, c, p in procs:
            out, err = p.communicate(timeout=self.call_timeout)
            if p.returncode != 0:
                raise BenchError("ssh %s %s failed (%d): %s" % (h, c, p.returncode, err.strip()))
        return time.monotonic() - t0

    def clear(self, hosts: list) -> None:
        for h in hosts:
            try:
                os.unlink(os.path.join(self.scratch(h), self.rel))
            except FileNotFoundError:
                pass

    def verify(self, hosts: list, case: str) -> None:
        bad = [h for h in hosts if not os.path.exists(os.path.join(self.scratch(h), self.rel))
               or sha256_of(os.path.join(self.scratch(h), self.rel)) != self.want]
        if bad:
            raise BenchError("%s: wrong or missing copy on %s" % (case, ", ".join(bad)))
        self.clear(hosts)

    def case(self, key: str, hosts: list, fn, *args) -> float:
        self.clear(hosts)
        os.sync()
        sampler = CpuSampler(self.user.uid)
        try:
            dt = self.timed(key, lambda: fn(*args))
        finally:
            by_kind = sampler.stop()
        for k, v in by_kind.items():
            self.add("%s cpu %s" % (key, k), v)
        self.add(key, dt)
        self.verify(hosts, key)
        log("  %-22s %6.2f s" % (key, dt))
        return dt

    # -- the cases -------------------------------------------------------------------
    def single(self) -> float:
        return self.ssh_all([("tb01", "scp -q tb00:%s %s" % (self.path(), self.path()))])

    def all_pull(self, hosts: list) -> float:
        return self.ssh_all([(h, "scp -q tb00:%s %s" % (self.path(), self.path())) for h in hosts])

    def push_tree(self, hosts: list) -> float:
        t0 = time.monotonic()
        holders, left = ["tb00"], list(hosts)
        while left:
            pairs = list(zip(holders, left))
            left = left[len(pairs):]
            self.ssh_all([(a, "scp -q %s %s:%s" % (self.path(), b, self.path())) for a, b in pairs])
            holders += [b for _, b in pairs]
        return time.monotonic() - t0

    def ssh_fanout(self, hosts: list) -> float:
        """The transport alone: from here (the head's machine, where bcast's
        relay runs) one `ssh TARGET 'cat > FILE' < FILE` per target, all at
        once, each reading its own descriptor of the file: the bytes bcast
        sends over the same ssh/sshd pairs and 100 Mbit links, with no agent,
        framing, hashing or coupling between targets (a lower bound for any
        design that moves the file from here over ssh)."""
        import subprocess
        t0 = time.monotonic()
        src = os.path.join(self.scratch("tb00"), self.rel)
        procs = []
        try:
            for h in hosts:
                with open(src, "rb") as f:
                    procs.append((h, self.bed.popen_as(self.user.name, ["ssh", h, "cat > %s" % self.path()],
                                                       env=self.env(), stdin=f,
                                                       stderr=subprocess.PIPE)))
        finally:
            bad = [h for h, p in procs if p.wait(timeout=self.call_timeout) != 0]
        if bad:
            raise BenchError("ssh fan-out: ssh failed on %s" % ", ".join(bad))
        return time.monotonic() - t0

    def tcp_chain(self, hosts: list) -> float:
        """tb00 -> hosts[0] -> ... -> hosts[-1] over plain TCP with socat and
        tee: every host listens, writes what arrives and passes it on while
        it receives; the time until the last host has all of it."""
        port = 20000 + int.from_bytes(os.urandom(2), "big") % 30000
        cmds = []
        for i, h in enumerate(hosts):
            listen = "socat -u TCP-LISTEN:%d,reuseaddr STDOUT" % port
            if i + 1 < len(hosts):
                cmds.append((h, "%s | tee %s | socat -u STDIN TCP:%s:%d,retry=400,interval=0.05"
                             % (listen, self.path(), hosts[i + 1], port)))
            else:
                cmds.append((h, "%s > %s" % (listen, self.path())))
        cmds.append(("tb00", "socat -u OPEN:%s TCP:%s:%d,retry=400,interval=0.05"
                     % (self.path(), hosts[0], port)))
        return self.ssh_all(cmds)

    def bcast(self, hosts: list) -> float:
        pat = "tb[[01-%02d]]" % len(hosts)
        dt, r = self.gxpc("bcast", "--hosts", pat, "tb00:" + self.path(), self.path())
        return dt

    # -- the run ---------------------------------------------------------------------
    def setup(self) -> None:
        self.check_installed()
        self.socat = ensure_anchor("socat", "socat") is not None
        if not self.socat:
            log("  no socat, and apt-get could not install it: the tcp chain case is left out")
        log("%s: test bed of %d hosts at %s ..." % (self.name, len(self.targets) + 1, BW))
        dt = self.bed_up(["tb00"] + self.targets, "gxpx", bw=BW)
        log("  up in %.0f s" % dt)
        src = os.path.join(self.scratch("tb00"), self.rel)
        with open(src, "wb") as f:
            for _ in range(self.opts.size):
                f.write(os.urandom(MiB))
        os.chown(src, self.user.uid, self.user.gid)
        self.want = sha256_of(src)
        self.session = "/tmp/gxpx-%s/session" % os.urandom(4).hex()
        self.made_dirs.append(os.path.dirname(self.session))
        self.gxpc("use", "ssh", "head", "tb*")
        dt, _ = self.gxpc("explore", "tb[[00-%02d]]" % len(self.targets))
        log("  explored %d hosts in %.1f s" % (len(self.targets) + 1, dt))

    def run(self) -> None:
        reps = self.opts.reps
        for n in self.counts:
            hosts = self.targets[:n]
            big = n > 8
            log("N = %d" % n)
            for _ in range(1 if big else reps):
                if n == self.counts[0]:
                    self.case("S/B", ["tb01"], self.single)
                if not big or self.opts.all_pull_big:
                    self.case("all-pull %d" % n, hosts, self.all_pull, hosts)
                if not self.opts.no_push_tree:
                    self.case("push tree %d" % n, hosts, self.push_tree, hosts)
                self.case("ssh fanout %d" % n, hosts, self.ssh_fanout, hosts)
                if self.socat:
                    self.case("tcp chain %d" % n, hosts, self.tcp_chain, hosts)
                self.case("bcast %d" % n, hosts, self.bcast, hosts)
        if self.opts.fanout:
            log("a deeper tree: --fanout %d" % self.opts.fanout)
            self.deep_tree()
        for k in self.opts.chain_len:
            log("chains of at most %d nodes" % k)
            self.chains(k)

    def chains(self, k: int) -> None:
        """bcast again in a session whose daemon plans chains of at most k
        nodes per site (GXP_BCAST_CHAIN_LEN, read at the daemon's start)."""
        self.guarded("quit", self.quit_session)
        self.session = "/tmp/gxpx-%s/session" % os.urandom(4).hex()
        self.made_dirs.append(os.path.dirname(self.session))
        self.daemon_env = {"GXP_BCAST_CHAIN_LEN": str(k)}
        try:
            self.gxpc("use", "ssh", "head", "tb*")
        finally:
            self.daemon_env = {}
        self.gxpc("explore", "tb[[00-%02d]]" % len(self.targets))
        for n in self.counts:
            hosts = self.targets[:n]
            self.case("bcast chain%d %d" % (k, n), hosts, self.bcast, hosts)

    def deep_tree(self) -> None:
        """bcast again in a session explored with --fanout F (rules head -> tb*
        and tb* -> tb*): a deeper tree, each node feeding at most F children,
        as a doubling tree inside one site would; the same N as the flat runs."""
        f = self.opts.fanout
        self.guarded("quit", self.quit_session)
        self.session = "/tmp/gxpx-%s/session" % os.urandom(4).hex()
        self.made_dirs.append(os.path.dirname(self.session))
        self.gxpc("use", "ssh", "head", "tb*")
        self.gxpc("use", "ssh", "tb*", "tb*")
        dt, _ = self.gxpc("explore", "--fanout", str(f), "tb[[00-%02d]]" % len(self.targets))
        log("  explored %d hosts with --fanout %d in %.1f s" % (len(self.targets) + 1, f, dt))
        for n in self.counts:
            hosts = self.targets[:n]
            self.case("bcast fanout%d %d" % (f, n), hosts, self.bcast, hosts)

    def release(self) -> None:
        if self.session is not None:
            self.guarded("quit", self.quit_session)

    def report(self) -> None:
        sb = self.med("S/B")
        mb = self.opts.size * MiB / 1e6
        print()
        print("one %d MiB file from tb00 to N hosts, 100 Mbit/s per host link, medians of %d "
              "(N = 8) or 1 run" % (self.opts.size, self.opts.reps))
        print("%-16s %9s %9s %9s %12s %12s" % ("case", "seconds", "x S/B", "MB/s/host",
                                               "machine busy", "CPU s/MB"))
        for key in sorted(self.samples, key=lambda k: (int(k.split()[-1]) if k[-1].isdigit() else 0, k)):
            if key.endswith(" busy") or " cpu " in key:
                continue
            v = self.med(key)
            n = int(key.split()[-1]) if key[-1].isdigit() else 1
            cpu = self.med(key + " cpu s")
            print("%-16s %9.2f %9s %9.1f %11.0f%% %12.4f" % (
                key, v, ratio_text(sb, v) if sb else "-", mb / v,
                100 * (self.med(key + " busy") or 0), (cpu or 0) / (mb * n)))
        print()
        print("CPU-seconds per MB delivered, of the bed user's processes only (other work on "
              "the machine left out)")
        print("%-16s" % "case" + "".join("%9s" % k for k in KINDS) + "%9s" % "total")
        for key in sorted(self.samples, key=lambda k: (int(k.split()[-1]) if k[-1].isdigit() else 0, k)):
            if " busy" in key or " cpu " in key or self.med(key + " cpu ssh") is None:
                continue
            n = int(key.split()[-1]) if key[-1].isdigit() else 1
            per = [(self.med("%s cpu %s" % (key, k)) or 0) / (mb * n) for k in KINDS]
            print("%-16s" % key + "".join("%9.4f" % v for v in per) + "%9.4f" % sum(per))
        print()
        for n in self.counts:
            b, p = self.med("bcast %d" % n), self.med("all-pull %d" % n)
            if b is None or sb is None:
                continue
            line = "N = %d: bcast %.2fx S/B (goal <= %.1f: %s)" % (
                n, b / sb, GOAL_SB, "met" if b / sb <= GOAL_SB else "NOT met")
            if p is not None:
                line += "; all-pull / bcast = %.1fx (goal >= %.0f: %s)" % (
                    p / b, GOAL_PULL, "met" if p / b >= GOAL_PULL else "NOT met")
            a = self.med("ssh fanout %d" % n)
            if a is not None:
                line += "; ssh fan-out (the transport alone) %.2fx S/B, bcast / ssh fan-out = %.2fx" % (
                    a / sb, b / a)
            c = self.med("tcp chain %d" % n)
            if c is not None:
                line += "; plain TCP chain %.2fx S/B, bcast / it = %.2fx" % (c / sb, b / c)
            for k in self.opts.chain_len:
                c = self.med("bcast chain%d %d" % (k, n))
                if c is not None:
                    line += "; chains of <= %d: %.2fx S/B" % (k, c / sb)
            d = self.med("bcast fanout%d %d" % (self.opts.fanout, n))
            if d is not None:
                line += "; bcast with --fanout %d %.2fx S/B (%.2fx the flat tree)" % (
                    self.opts.fanout, d / sb, d / b)
            t = self.med("push tree %d" % n)
            if t is not None:
                line += "; push tree / bcast = %.1fx (%d rounds)" % (t / b, math.ceil(math.log2(n + 1)))
            print(line)
        print("the machine's CPUs are shared by every host (and by other work): see 'machine busy'")
        for line in self.noticed_lines():
            print(line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=96, help="MiB (default 96)")
    p.add_argument("--reps", type=int, default=2, help="runs of each case for N = 8 (default 2)")
    p.add_argument("--hosts", default="8,16,32", help="target counts (default 8,16,32)")
    p.add_argument("--all-pull-big", action="store_true", help="all-pull for N > 8 too")
    p.add_argument("--no-push-tree", action="store_true", help="leave out the scp push tree")
    p.add_argument("--fanout", type=int, default=0,
                   help="then bcast again in a tree explored with --fanout F (e.g. 2)")
    p.add_argument("--chain-len", default="",
                   help="then bcast again with chains of at most K nodes, e.g. 8 or 0,8")
    p.add_argument("--quick", action="store_true", help="32 MiB, N = 8, one run")
    p.add_argument("--workflows", action="store_true",
                   help="Confuga's workflows with gxpc make instead (transfer_workflows.py)")
    import transfer_workflows
    transfer_workflows.add_arguments(p)
    a = p.parse_args(argv)
    if a.workflows:
        if a.quick:
            transfer_workflows.quick(a)
        return main_driver(transfer_workflows.WorkflowsBench, a)
    a.hosts = [int(x) for x in a.hosts.split(",")]
    a.chain_len = [int(x) for x in a.chain_len.split(",") if x.strip()]
    if a.quick:
        a.size, a.reps, a.hosts = 32, 1, [8]
    return main_driver(TransfersBench, a)


if __name__ == "__main__":
    sys.exit(main())
