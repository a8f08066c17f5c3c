#!/usr/bin/env python3
"""The CPU the `gxpc` client itself spends on `gxpc e true`, against a bare Python.

Run as root (the bench user is made by tests/testbed/), from the checkout:

    /opt/gxpstyle/venv/bin/python benchmarks/client_cpu.py [--reps 40] [--agents 4]

What it does:

* Makes one ordinary user (a test bed without hosts) that runs everything of
  the product from the installed venv; starts a session with `gxpc explore
  --local AGENTS` (not measured).
* As that user, one measuring process starts, --reps times and interleaved:
    ours     `gxpc --session S e true` (the client: parse, connect, one request,
             every node's exit status back);
    also     `gxpc --session S stat`;
    anchor   `python3 -I -c pass` (the interpreter's own start, no site).
  Each is started with posix_spawn and reaped with wait4, whose rusage is the
  user + system CPU of that process alone: the daemon and the agents, which do
  the work on the other side, are not counted (the client starts no process).
* Medians in milliseconds, the ratio ours/anchor, and whether the goal of the
  issue holds: the client's CPU for `gxpc e true` at most 2x the anchor.

The session is quit and the user removed whatever happens (Ctrl-C, SIGTERM,
errors). Standard library only, plus tests/testbed/ and benchmarks/bench_harness.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

from bench_harness import GXPC, Bench, BenchError, log, main_driver, ratio_text, value_text

# isort: split
import testbed  # noqa: E402  (bench_harness put tests/ on the path)

GOAL_RATIO = 2.0

# Runs as the bench user: each command spawned and reaped alone, interleaved.
MEASURE = r"""
import json, os, sys
reps, cases = int(sys.argv[1]), json.loads(sys.argv[2])
out = {name: [] for name in cases}
null = os.open(os.devnull, os.O_RDWR)
for rep in range(reps + 1):                       # the first round warms the caches
    for name, argv in cases.items():
        pid = os.posix_spawn(argv[0], argv, dict(os.environ), file_actions=[
            (os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, null, 1)])
        _, status, ru = os.wait4(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit("%s exited %d" % (" ".join(argv), os.waitstatus_to_exitcode(status)))
        if rep:
            out[name].append((ru.ru_utime + ru.ru_stime) * 1000.0)
print(json.dumps(out))
"""


class ClientCpu(Bench):
    name = "client_cpu.py"
    call_timeout = 120

    def __init__(self, reps: int, agents: int) -> None:
        super().__init__(log)
        self.reps, self.agents = reps, agents

    def setup(self) -> None:
        self.check_installed()
        self.bed = testbed.TestBed()
        self.user = self.bed.add_user("gxpcpu" + uuid.uuid4().hex[:6])
        top = self.make_dir("/tmp/gxpcpu-" + uuid.uuid4().hex[:8])
        self.session = os.path.join(top, "session")
        log("%s: explore --local %d" % (self.name, self.agents))
        self.gxpc("explore", "--local", self.agents)

    def run(self) -> None:
        cases = {"gxpc e true": [GXPC, "--session", self.session, "e", "true"],
                 "gxpc stat": [GXPC, "--session", self.session, "stat"],
                 "python3 -I -c pass": ["/usr/bin/python3", "-I", "-c", "pass"]}
        log("%s: %d reps of %s" % (self.name, self.reps, ", ".join(cases)))
        r = self.bed.run_as(self.user.name, ["/usr/bin/python3", "-I", "-c", MEASURE, str(self.reps),
                                             json.dumps(cases)], env=self.env(), capture_output=True,
                            text=True, timeout=self.call_timeout + 2 * self.reps)
        if r.returncode != 0:
            raise BenchError("measuring failed (%d): %s" % (r.returncode, r.stderr.strip()))
        for name, values in json.loads(r.stdout).items():
            for v in values:
                self.add(name, v)

    def release(self) -> None:
        if self.session is not None:
            self.quit_session()
            left = self.settle(0)
            if left:
                self.kill_survivors(left)

    def report(self) -> None:
        anchor = self.med("python3 -I -c pass")
        print("client CPU (user + system), median of %d, ms; %d local agents" % (self.reps, self.agents))
        print("%-22s %10s %8s" % ("case", "ms", "x anchor"))
        for case in ("python3 -I -c pass", "gxpc e true", "gxpc stat"):
            print("%-22s %10s %8s" % (case, value_text("%.1f", self.med(case)),
                                       ratio_text(anchor, self.med(case))))
        ours = self.med("gxpc e true")
        holds = anchor is not None and ours is not None and ours <= GOAL_RATIO * anchor
        print("goal: gxpc e true at most %.0fx python3 -I -c pass: %s (%s x)"
              % (GOAL_RATIO, "holds" if holds else "DOES NOT HOLD", ratio_text(anchor, ours)))
        for line in self.noticed_lines():
            print(line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=40, help="runs of each case (default 40)")
    p.add_argument("--agents", type=int, default=4, help="local agents in the session (default 4)")
    a = p.parse_args(argv)
    if not 1 <= a.reps <= 10000 or not 1 <= a.agents <= 256:
        p.error("--reps from 1 to 10000, --agents from 1 to 256")
    return main_driver(ClientCpu, a.reps, a.agents)


if __name__ == "__main__":
    sys.exit(main())
