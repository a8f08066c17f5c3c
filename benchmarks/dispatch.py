#!/usr/bin/env python3
"""How fast `gxpc make` hands trivial recipes to nodes, against plain make.

Run as root (the bench user is made by tests/testbed.py), from the checkout,
after `scripts/install`:

    /opt/gxpstyle/venv/bin/python benchmarks/dispatch.py                 # 2,000 and 10,000 recipes, 3 reps
    /opt/gxpstyle/venv/bin/python benchmarks/dispatch.py --recipes 2000 --reps 1   # about 20 s

GNU parallel is an anchor when installed (`apt-get install parallel`; not needed).

What it does:

* Makes one ordinary user (a test bed without hosts) that runs everything of the
  product from the installed venv; starts a session with `gxpc explore --local
  AGENTS` (default 4; not measured).
* For each count N (--recipes, default 2000 and 10000), a makefile of N trivial
  recipes, `t%: ; @echo $@ >/dev/null`, and, interleaved, --reps times each:
    anchor    `make -j32` (plain GNU make, every recipe on this machine);
    ours      `gxpc make -j32` (every recipe on one of the agents, or the head);
    parallel  `parallel -j32 'echo {} >/dev/null'` over the same N names, if installed.
  Each is spawned and reaped with wait4 by one measuring process of the user:
  its rusage is the CPU of the command and everything it waited for (make, its
  recipe processes, our relay). The session's daemon and agents are measured
  from /proc before and after, and added for ours.
* Prints medians: wall seconds, recipes/s, CPU ms per recipe (ours: the command's
  own and the session's), and the ratio to plain make (recipes/s ours / plain).
  The goal of issue 14: at least 1,000/s and 0.5x plain make (0.25x the floor).
  All of it shares this machine's CPUs (with anything else running on it: the
  report shows the load average before each count).

The session is quit and the user removed whatever happens (Ctrl-C, SIGTERM,
errors). Standard library only, plus tests/testbed.py and benchmarks/bench_harness.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import uuid

from bench_harness import GXPC, Bench, BenchError, log, main_driver, ratio_text, user_pids

import testbed  # noqa: E402  (bench_harness put tests/ on the path)

JOBS = 32
GOAL_RATE, GOAL_RATIO, FLOOR_RATIO = 1000.0, 0.5, 0.25

MAKEFILE = """N := $(shell seq 1 %d)
all: $(addprefix t,$(N))
t%%: ; @echo $@ >/dev/null
"""

# Runs as the bench user: each command spawned and reaped alone.
MEASURE = r"""
import json, os, sys, time
argv, cwd, stdin_path = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
os.chdir(cwd)
null = os.open(os.devnull, os.O_RDWR)
src = os.open(stdin_path, os.O_RDONLY) if stdin_path else null
t0 = time.monotonic()
pid = os.posix_spawn(argv[0], argv, dict(os.environ), file_actions=[
    (os.POSIX_SPAWN_DUP2, src, 0), (os.POSIX_SPAWN_DUP2, null, 1)])
_, status, ru = os.wait4(pid, 0)
wall = time.monotonic() - t0
code = os.waitstatus_to_exitcode(status)
if code != 0:
    sys.exit("%s exited %d" % (" ".join(argv), code))
print(json.dumps({"wall": wall, "cpu": ru.ru_utime + ru.ru_stime}))
"""


class Dispatch(Bench):
    name = "dispatch.py"
    call_timeout = 600

    def __init__(self, counts: list, reps: int, agents: int) -> None:
        super().__init__(log)
        self.counts, self.reps, self.agents = counts, reps, agents
        self.parallel = shutil.which("parallel")

    def setup(self) -> None:
        self.check_installed()
        if not shutil.which("make"):
            raise BenchError("GNU make is not installed")
        self.bed = testbed.TestBed()
        self.user = self.bed.add_user("gxpdsp" + uuid.uuid4().hex[:6])
        self.top = self.make_dir("/var/tmp/gxpdsp-" + uuid.uuid4().hex[:8])
        self.session = os.path.join(self.top, "session")
        log("%s: explore --local %d" % (self.name, self.agents))
        self.gxpc("explore", "--local", self.agents)
        if not self.parallel:
            self.odd.append("GNU parallel is not installed: no parallel anchor (apt-get install parallel)")

    def _dir(self, n: int) -> str:
        d = os.path.join(self.top, "n%d" % n)
        if not os.path.isdir(d):
            self.make_dir(d)
            for name, text in (("Makefile", MAKEFILE % n),
                               ("names", "".join("t%d\n" % i for i in range(1, n + 1)))):
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
        return d

    def _session_cpu(self) -> float:
        """CPU seconds so far of the user's long-lived processes (daemon, agents),
        with the children they reaped (the recipes' shells on the nodes)."""
        total = 0.0
        for pid in user_pids(self.user.uid):
            try:
                with open("/proc/%d/stat" % pid) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        return total

    def _measure(self, argv: list, cwd: str, stdin: str = "") -> dict:
        r = self.bed.run_as(self.user.name, ["/usr/bin/python3", "-I", "-c", MEASURE, json.dumps(argv),
                                             cwd, stdin], env=self.env(), capture_output=True,
                            text=True, timeout=self.call_timeout)
        if r.returncode != 0:
            raise BenchError("measuring failed (%d): %s" % (r.returncode, r.stderr.strip()))
        return json.loads(r.stdout)

    def run(self) -> None:
        for n in self.counts:
            d = self._dir(n)
            with open("/proc/loadavg") as f:
                self.info["load %d" % n] = f.read().split()[0]
            cases = [("make", ["/usr/bin/env", "make", "-j%d" % JOBS], "")]
            cases.append(("gxpc make", [GXPC, "--session", self.session, "make", "-j%d" % JOBS], ""))
            if self.parallel:
                cases.append(("parallel", [self.parallel, "-j%d" % JOBS, "echo {} >/dev/null"],
                              os.path.join(d, "names")))
            log("%s: %d recipes, %d reps of %s" % (self.name, n, self.reps, ", ".join(c[0] for c in cases)))
            for rep in range(self.reps):
                for name, argv, stdin in cases:
                    before = self._session_cpu()
                    m = self._measure(argv, d, stdin)
                    session = self._session_cpu() - before
                    key = "%s %d" % (name, n)
                    self.add(key + " wall", m["wall"])
                    self.add(key + " rate", n / m["wall"])
                    self.add(key + " cpu ms", m["cpu"] * 1000.0 / n)
                    self.add(key + " session ms", session * 1000.0 / n)

    def release(self) -> None:
        if self.session is not None:
            self.quit_session()
            left = self.settle(0)
            if left:
                self.kill_survivors(left)

    def report(self) -> None:
        print("trivial recipes at -j%d, %d local agents, median of %d; CPU per recipe in ms "
              "(own: the command and what it waited for; session: daemon, agents and their recipe shells)"
              % (JOBS, self.agents, self.reps))
        print("%-10s %7s %6s %8s %10s %9s %10s %9s" % ("case", "recipes", "load", "wall s", "recipes/s",
                                                      "own ms", "session ms", "x make"))
        verdicts = []
        for n in self.counts:
            anchor = self.med("make %d rate" % n)
            for name in ("make", "gxpc make", "parallel"):
                key = "%s %d" % (name, n)
                if self.med(key + " wall") is None:
                    continue
                session = self.med(key + " session ms") if name == "gxpc make" else None
                print("%-10s %7d %6s %8.2f %10.0f %9.2f %10s %9s" % (
                    name, n, self.info.get("load %d" % n, "-"), self.med(key + " wall"),
                    self.med(key + " rate"), self.med(key + " cpu ms"),
                    "%.2f" % session if session is not None else "-",
                    ratio_text(anchor, self.med(key + " rate"))))
            ours = self.med("gxpc make %d rate" % n)
            ratio = ours / anchor if ours and anchor else 0.0
            verdicts.append("%d recipes: %.0f/s (goal %.0f/s: %s), %.2fx plain make (goal %.2fx: %s; "
                            "floor %.2fx: %s)" % (n, ours or 0, GOAL_RATE,
                                                   "holds" if (ours or 0) >= GOAL_RATE else "DOES NOT HOLD",
                                                   ratio, GOAL_RATIO, "holds" if ratio >= GOAL_RATIO else "DOES NOT HOLD",
                                                   FLOOR_RATIO, "holds" if ratio >= FLOOR_RATIO else "DOES NOT HOLD"))
        print()
        for v in verdicts:
            print("goal: " + v)
        for line in self.noticed_lines():
            print(line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", type=int, action="append",
                   help="recipes per make (repeatable; default 2000 and 10000)")
    p.add_argument("--reps", type=int, default=3, help="runs of each case (default 3)")
    p.add_argument("--agents", type=int, default=4, help="local agents in the session (default 4)")
    a = p.parse_args(argv)
    counts = a.recipes or [2000, 10000]
    if not all(1 <= n <= 1000000 for n in counts) or not 1 <= a.reps <= 100 or not 1 <= a.agents <= 256:
        p.error("--recipes from 1 to 1000000, --reps from 1 to 100, --agents from 1 to 256")
    return main_driver(Dispatch, counts, a.reps, a.agents)


if __name__ == "__main__":
    sys.exit(main())
