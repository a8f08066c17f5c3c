#!/usr/bin/env python3
"""Where an ssh session's CPU goes on the test bed, and what explore adds to it.

Run as root, from the checkout, after `scripts/install`:

    /opt/gxpstyle/venv/bin/python benchmarks/ssh_costs.py [--hosts 8] [--reps 5] [--trace]

It builds a test bed of N sshd hosts (tests/testbed/: ed25519 host keys, the
user's key ed25519, OpenSSH's defaults otherwise) and one ordinary user, and for
each key exchange (OpenSSH's default, then `KexAlgorithms=curve25519-sha256`,
both set on the client with `-o`, the way a user sets it in ~/.ssh/config or
with `gxpc use ssh -o ...`) measures, rep by rep and interleaved:

    ssh true      `ssh h true` to all N hosts at once
    ssh python    `ssh h python3 -S -c pass` to all N at once (the floor of any
                  design that starts a Python agent over ssh)
    explore       `gxpc use ssh -o OPT head 'tb[[01-NN]]'`, then `gxpc explore`
                  (timed), then `gxpc quit`, a new session each rep

in wall time and in the CPU of every process taking part (ssh clients, the
hosts' sshd and all they start, the session daemon and gxpc), counted by a
cgroup holding this process and the hosts' sshd. And one `ssh -v h true` per
key exchange, its debug lines timed as they arrive: when the TCP connection,
the key exchange, the authentication and the session were done.

Prints medians and the ratios explore / ssh true and explore / ssh python.
Cleans up whatever happens (sessions quit, the bed torn down).
Standard library only, plus tests/testbed/ and benchmarks/bench_harness.py.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid

from bench_harness import Bench, BenchError, CpuMeter, log, main_driver

CALL_TIMEOUT = 300
KEXES = (("OpenSSH default", []), ("curve25519-sha256", ["-o", "KexAlgorithms=curve25519-sha256"]))

# Run as the bench user: all of argv[2:]'s hosts at once, timed inside.
PARALLEL = r"""
import subprocess, sys, time
opts, cmd, hosts = sys.argv[1].split(), sys.argv[2], sys.argv[3:]
t0 = time.monotonic()
procs = [subprocess.Popen(["ssh"] + opts + [h, cmd], stdin=subprocess.DEVNULL) for h in hosts]
bad = [p.args for p in procs if p.wait() != 0]
if bad:
    sys.exit("failed: %r" % bad[0])
print("%.6f" % (time.monotonic() - t0))
"""

# `ssh -v`, each debug line with the seconds since start when it arrived.
VERBOSE = r"""
import subprocess, sys, time
t0 = time.monotonic()
p = subprocess.Popen(["ssh", "-v"] + sys.argv[1].split() + [sys.argv[2], "true"],
                     stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
for line in p.stderr:
    print("%.4f %s" % (time.monotonic() - t0, line.decode(errors="replace").rstrip()))
print("%.4f done: exit %d" % (time.monotonic() - t0, p.wait()))
"""

# (label, text of the first `ssh -v` line that ends the phase)
PHASES = (("TCP connected", "Connection established"),
          ("key exchange done", "SSH2_MSG_NEWKEYS received"),
          ("authenticated", "Authenticated to"),
          ("session open", "Sending command"),
          ("exit", "done: exit"))


class SshCosts(Bench):
    name = "ssh_costs.py"
    call_timeout = CALL_TIMEOUT

    def __init__(self, hosts: int, reps: int, trace: bool, log) -> None:
        super().__init__(log)
        self.n, self.reps, self.trace = hosts, reps, trace
        self.traces: dict = {}
        self.meter: CpuMeter | None = None
        self.phases: dict = {}

    def setup(self) -> None:
        self.check_installed()
        hosts = ["tb%02d" % i for i in range(1, self.n + 1)]
        dt = self.bed_up(hosts, "gxpssh")
        self.log("test bed of %d hosts and user %s up in %.1fs" % (self.n, self.user.name, dt))
        self.hosts = hosts
        self.meter = CpuMeter("gxpssh")
        if self.meter.path is None:
            raise BenchError("no cgroup to count every process's CPU in")
        self.meter.add(os.getpid())
        for name in hosts:
            self.meter.add(self.bed.hosts[name].pid)
        self.parallel([], "true")       # warm-up: sshd's first forks, the page cache

    def parallel(self, opts, cmd: str) -> tuple:
        return self.measured(lambda: self.bed.run_as(
            self.user.name, ["python3", "-c", PARALLEL, " ".join(opts), cmd] + self.hosts,
            capture_output=True, text=True, timeout=CALL_TIMEOUT))

    def measured(self, call) -> tuple:
        """(wall s, CPU-s of every process) of call(), a CompletedProcess."""
        assert self.meter is not None
        m0, t0 = self.meter.usage(), time.monotonic()
        r = call()
        dt, m1 = time.monotonic() - t0, self.meter.usage()
        if r.returncode != 0:
            raise BenchError("%s failed (%d): %s%s" % (r.args[:3], r.returncode, r.stdout, r.stderr))
        return dt, (m1 or 0.0) - (m0 or 0.0)

    def explore(self, opts) -> tuple:
        self.session = os.path.join(self.make_dir("/tmp/gxpssh-" + uuid.uuid4().hex[:10]), "session")
        try:
            pattern = "tb[[01-%02d]]" % self.n
            rule = ["ssh", "head", pattern] + [a for o in opts[1::2] for a in ("--ssh-option", o)]
            self.gxpc("use", *rule)
            return self.measured(lambda: self.gxpc("explore", pattern)[1])
        finally:
            self.quit_session()
            self.session = None
            left = self.settle()
            if left:
                self.kill_survivors(left)

    def verbose(self, opts) -> dict:
        r = self.bed.run_as(self.user.name, ["python3", "-c", VERBOSE, " ".join(opts), self.hosts[0]],
                            capture_output=True, text=True, timeout=CALL_TIMEOUT)
        got = {}
        self.traces[opts[-1] if opts else ""] = r.stdout
        for line in r.stdout.splitlines():
            t, text = line.split(" ", 1)
            for label, marker in PHASES:
                if label not in got and marker in text:
                    got[label] = float(t)
        return got

    def run(self) -> None:
        for rep in range(self.reps):
            for label, opts in KEXES:
                for case in ("ssh true", "ssh python", "explore"):
                    if case == "explore":
                        dt, cpu = self.explore(opts)
                    else:
                        dt, cpu = self.parallel(opts, "true" if case == "ssh true" else "python3 -S -c pass")
                    self.add("%s|%s wall" % (label, case), dt)
                    self.add("%s|%s cpu" % (label, case), cpu)
                for phase, t in self.verbose(opts).items():
                    self.add("%s|ssh -v %s" % (label, phase), t)
            self.log("  rep %d done" % (rep + 1))

    def report(self) -> bool:
        med = {k: statistics.median(v) for k, v in self.samples.items()}
        print("%d hosts, %d reps, medians; CPU of every process taking part (cgroup); load "
              "average %.1f at the end" % (self.n, self.reps, os.getloadavg()[0]))
        print("%-20s %-12s %10s %10s %12s %12s" % ("key exchange", "case", "wall s", "CPU-s",
                                                   "CPU / host", "CPU ratio"))
        for label, _ in KEXES:
            base = med["%s|ssh true cpu" % label]
            for case in ("ssh true", "ssh python", "explore"):
                cpu = med["%s|%s cpu" % (label, case)]
                print("%-20s %-12s %10.3f %10.3f %9.1f ms %11.2fx" % (
                    label, case, med["%s|%s wall" % (label, case)], cpu, 1000 * cpu / self.n,
                    cpu / base))
            phases = ", ".join("%s %.1f ms" % (p, 1000 * med["%s|ssh -v %s" % (label, p)])
                               for p, _ in PHASES if "%s|ssh -v %s" % (label, p) in med)
            print("%-20s one `ssh -v h true`, since start: %s" % ("", phases))
        for opt, text in self.traces.items() if self.trace else ():
            print("\n`ssh -v %s h true` of the last rep, seconds since start:\n%s" % (opt, text))
        return True

    def cleanup(self) -> None:
        try:
            super().cleanup()
        finally:
            if self.meter is not None:
                self.meter.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=8, help="test-bed hosts (default 8, at most 32)")
    p.add_argument("--reps", type=int, default=5, help="repetitions (default 5); medians are reported")
    p.add_argument("--trace", action="store_true", help="print the last rep's `ssh -v` lines, timed")
    a = p.parse_args(argv)
    if not 1 <= a.hosts <= 32 or a.reps < 1:
        p.error("--hosts must be 1 to 32, --reps at least 1")
    return main_driver(SshCosts, a.hosts, a.reps, a.trace, log)


if __name__ == "__main__":
    sys.exit(main())
