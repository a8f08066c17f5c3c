#!/usr/bin/env python3
"""How fast `gxpc make` hands trivial recipes to nodes, against plain make.

Run as root (the bench user is made by tests/testbed/), from the checkout,
after `scripts/install`:

    /opt/gxpstyle/venv/bin/python benchmarks/dispatch.py                 # 2,000 and 10,000 recipes, 3 reps
    /opt/gxpstyle/venv/bin/python benchmarks/dispatch.py --recipes 2000 --reps 1 --hosts 0   # about 30 s
    /opt/gxpstyle/venv/bin/python benchmarks/dispatch.py --recipes 2000 --reps 3   # issue 26's figures

GNU parallel is an anchor (installed with apt-get when missing; without it
those rows are left out and the report says so).

What it does:

* Makes one ordinary user and a test bed of HOSTS hosts (--hosts, default 8;
  0: none) that runs everything of the product from the installed venv; starts
  a session with `gxpc explore --local AGENTS` (default 4) and, with hosts, a
  second one that explores them and mounts a GMount of their /tmp (not measured).
* For each count N (--recipes, default 2000 and 10000), a makefile of N trivial
  recipes, `t%: ; @echo $@ >/dev/null`, and, interleaved, --reps times each:
    make          `make -j32` (plain GNU make, every recipe on this machine): the anchor;
    gxpc make     `gxpc make -j32` (every recipe on one of the local agents);
    parallel      `parallel -j32 'echo {} >/dev/null'` over the same N names, here;
  and with hosts:
    mount make    plain `make -j32` in the GMount (what the mount itself costs make);
    bindfs make   plain `make -j32` in bindfs (a C FUSE file system, the ceiling of
                  any FUSE mount here) over a directory of the head's /tmp, the
                  file system the head's export is on (installed like parallel);
    hosts gmount  `gxpc make -j32` in the GMount, every recipe on a test-bed host;
    hosts shared  `gxpc make --shared -j32` in a directory of the root file system, which
                  the hosts share with the head (only their /tmp and scratch are
                  their own): the dispatch to 8 hosts without the mount's cost;
    wide gmount   `gxpc make -j32` in the GMount of a session of --wide hosts
                  (default 32; 0: none): what more nodes cost a miss and a change;
    parallel ssh  `parallel -j4 -S td01,...,td08 --controlmaster` (4 a host, 32
                  in all), the same commands over ssh to the same hosts (up to
                  --ssh-max recipes: an ssh session a job is slow).
  Each is spawned and reaped with wait4 by one measuring process of the user:
  its rusage is the CPU of the command and everything it waited for (make, its
  recipe processes, our relay, parallel's ssh clients). The user's long-lived
  processes (our daemon and agents, the hosts' sshd sessions and the shells
  they reaped) are measured from /proc before and after: "session" CPU.
* Prints medians: wall seconds, recipes/s, CPU ms per recipe (own and session),
  and the ratio to plain make (recipes/s of the case / plain make's).
  The goal of issue 14: at least 1,000/s and 0.5x plain make (0.25x the floor),
  and 500/s on 8 hosts. Issue 26's: hosts gmount at least 0.8x hosts shared;
  mount make at least 0.8x bindfs make and 0.3x make; wide gmount at least
  0.8x hosts gmount. All of it shares this machine's CPUs (with anything
  else running on it: the report shows the load average before each count).

The session is quit and the user removed whatever happens (Ctrl-C, SIGTERM,
errors). Standard library only, plus tests/testbed/ and benchmarks/bench_harness.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import uuid

from bindfs_anchor import BindfsMount

from bench_harness import (
    GXPC,
    Bench,
    BenchError,
    ensure_anchor,
    holds_text,
    log,
    main_driver,
    ratio_text,
    session_cpu,
)

# isort: split
import testbed  # noqa: E402  (bench_harness put tests/ on the path)

JOBS = 32
CASES = ("make", "gxpc make", "parallel", "mount make", "bindfs make", "hosts gmount", "hosts shared",
         "wide gmount", "parallel ssh")
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

    def __init__(self, counts: list, reps: int, agents: int, hosts: int, ssh_max: int,
                 wide: int = 0) -> None:
        super().__init__(log)
        self.counts, self.reps, self.agents, self.hosts = counts, reps, agents, hosts
        self.wide = wide if hosts else 0
        self.bindfs = ensure_anchor("bindfs", "bindfs") if hosts else False
        self.bindfs_mount = None
        self.wide_session = self.wide_mnt = self.bindfs_dir = None
        self.ssh_max = ssh_max
        self.parallel = ensure_anchor("parallel", "parallel")
        self.host_names: list = []
        self.local_session = self.host_session = None
        self.mnt = None

    def setup(self) -> None:
        self.check_installed()
        if not shutil.which("make"):
            raise BenchError("GNU make is not installed")
        tag = uuid.uuid4().hex[:8]
        every = ["td%02d" % i for i in range(1, max(self.hosts, self.wide) + 1)]
        names = self.host_names = every[:self.hosts]
        if names:
            self.open_fuse()
            log("%s: test bed of %d hosts" % (self.name, len(every)))
            self.bed_up(every, "gxpdsp")
        else:
            self.bed = testbed.TestBed()
            self.user = self.bed.add_user("gxpdsp" + uuid.uuid4().hex[:6])
        self.top = self.make_dir("/var/tmp/gxpdsp-" + tag)
        self.session = self.local_session = os.path.join(self.top, "session")
        log("%s: explore --local %d" % (self.name, self.agents))
        self.gxpc("explore", "--local", self.agents)
        if names:
            self.session = self.host_session = os.path.join(self.top, "hsession")
            export, self.mnt = "/tmp/gxpdsp-exp-" + tag, "/tmp/gxpdsp-mnt-" + tag
            self.mount_tag = "gxpdsp-mnt-" + tag
            log("%s: explore %d hosts, mount" % (self.name, len(names)))
            self.gxpc("use", "ssh", "head", "td*")
            self.gxpc("explore", *names)
            self.gxpc("e", "mkdir -p %s %s" % (export, self.mnt))
            self.made_dirs += [export, self.mnt]   # the head's own, removed after the teardown
            self.gxpc("mount", export, self.mnt)
        if self.wide:
            self._wide_gmount(every, tag)
        if self.bindfs:
            # after the bed's hosts: a namespace made later would hold a copy of it
            src, mnt = "/tmp/gxpdsp-bsrc-" + tag, "/tmp/gxpdsp-bmnt-" + tag
            for d in (src, mnt):
                self.make_dir(d)
            self.bindfs_mount = BindfsMount(self, src, mnt)
            self.bindfs_dir = mnt
        elif names:
            self.odd.append("bindfs could not be installed: no bindfs anchor")
        if not self.parallel:
            self.odd.append("GNU parallel could not be installed: no parallel anchor")

    def _wide_gmount(self, every: list, tag: str) -> None:
        """A third session: every host of the bed explored, a GMount of theirs."""
        self.session = self.wide_session = os.path.join(self.top, "wsession")
        export, self.wide_mnt = "/tmp/gxpdsp-wexp-" + tag, "/tmp/gxpdsp-wmnt-" + tag
        log("%s: explore %d hosts, mount" % (self.name, len(every)))
        self.gxpc("use", "ssh", "head", "td*")
        self.gxpc("explore", *every)
        self.gxpc("e", "mkdir -p %s %s" % (export, self.wide_mnt))
        self.made_dirs += [export, self.wide_mnt]
        self.gxpc("mount", export, self.wide_mnt)

    def _dir(self, n: int) -> str:
        d = os.path.join(self.top, "n%d" % n)
        if not os.path.isdir(d):
            self.make_dir(d)
            for name, text in (("Makefile", MAKEFILE % n),
                               ("names", "".join("t%d\n" % i for i in range(1, n + 1)))):
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
        return d

    def _mounted_dir(self, n: int, mnt: str) -> str:
        """The makefile in a FUSE mount, written by the user (root may not enter it)."""
        d = os.path.join(mnt, "n%d" % n)
        r = self.bed.run_as(self.user.name, ["sh", "-c", 'mkdir -p "$1" && cat > "$1/Makefile"', "sh", d],
                            env=self.env(), input=MAKEFILE % n, capture_output=True, text=True,
                            timeout=self.call_timeout)
        if r.returncode != 0:
            raise BenchError("cannot write %s: %s" % (d, r.stderr.strip()))
        return d

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
            make = ["/usr/bin/env", "make", "-j%d" % JOBS]
            cases = [("make", make, "", d),
                     ("gxpc make", [GXPC, "--session", self.local_session, "make", "-j%d" % JOBS], "", d)]
            if self.parallel:
                cases.append(("parallel", [self.parallel, "-j%d" % JOBS, "echo {} >/dev/null"],
                              os.path.join(d, "names"), d))
            if self.host_session:
                mounted = self._mounted_dir(n, self.mnt)
                on_hosts = [GXPC, "--session", self.host_session, "make", "-j%d" % JOBS]
                cases.append(("mount make", make, "", mounted))
                if self.bindfs_dir:
                    cases.append(("bindfs make", make, "", self._mounted_dir(n, self.bindfs_dir)))
                cases += [("hosts gmount", on_hosts, "", mounted),
                          ("hosts shared", on_hosts[:-1] + ["--shared"] + on_hosts[-1:], "", d)]
                if self.wide_session:
                    cases.append(("wide gmount", [GXPC, "--session", self.wide_session, "make",
                                                  "-j%d" % JOBS], "", self._mounted_dir(n, self.wide_mnt)))
                if self.parallel and n <= self.ssh_max:
                    per_host = max(1, JOBS // len(self.host_names))
                    cases.append(("parallel ssh", [self.parallel, "-j%d" % per_host, "--controlmaster",
                                                   "-S", ",".join(self.host_names), "echo {} >/dev/null"],
                                  os.path.join(d, "names"), d))
            log("%s: %d recipes, %d reps of %s" % (self.name, n, self.reps, ", ".join(c[0] for c in cases)))
            for _rep in range(self.reps):
                for name, argv, stdin, cwd in cases:
                    before = session_cpu(self.user.uid)
                    m = self._measure(argv, cwd, stdin)
                    key = "%s %d" % (name, n)
                    session = self.cpu_since(before, key)
                    self.add(key + " wall", m["wall"])
                    self.add(key + " rate", n / m["wall"])
                    self.add(key + " cpu ms", m["cpu"] * 1000.0 / n)
                    self.add(key + " session ms", session * 1000.0 / n)

    def release(self) -> None:
        if self.bindfs_mount is not None:
            self.guarded("unmounting bindfs", self.bindfs_mount.unmount)
            self.bindfs_mount = None
        if self.wide_session is not None:
            self.session = self.wide_session
            if self.wide_mnt:
                self.gxpc("umount", self.wide_mnt, check=False)
            self.quit_session()
        if self.host_session is not None:
            self.session = self.host_session
            if self.mnt:
                self.gxpc("umount", self.mnt, check=False)
            self.quit_session()
        if self.local_session is not None:
            self.session = self.local_session
            self.quit_session()
        left = self.settle(0)
        if left:
            self.kill_survivors(left)

    def _namespace_goals(self, n: int, anchor: float) -> list:
        """Issue 26's ratios, where both sides were measured."""
        out = []
        rate = {c: self.med("%s %d rate" % (c, n)) for c in CASES}
        rate["make"] = anchor
        for ours, base, goal, what in (
                ("hosts gmount", "hosts shared", 0.8, "gxpc make in the GMount / in a shared directory"),
                ("mount make", "bindfs make", 0.8, "plain make in the GMount / in bindfs"),
                ("mount make", "make", 0.3, "plain make in the GMount / on local disk"),
                ("wide gmount", "hosts gmount", 0.8,
                 "gxpc make in the GMount of %d hosts / of %d" % (self.wide, self.hosts))):
            if rate.get(ours) and rate.get(base):
                x = rate[ours] / rate[base]
                out.append("%d recipes, %s: %.2fx (goal at least %.1fx: %s)"
                           % (n, what, x, goal, holds_text(x >= goal)))
        return out

    def report(self) -> None:
        print("trivial recipes at -j%d, %d local agents, median of %d; CPU per recipe in ms "
              "(own: the command and what it waited for; session: daemon, agents and their recipe shells)"
              % (JOBS, self.agents, self.reps))
        print("%-12s %7s %6s %8s %10s %9s %10s %9s" % ("case", "recipes", "load", "wall s", "recipes/s",
                                                      "own ms", "session ms", "x make"))
        verdicts = []
        for n in self.counts:
            anchor = self.med("make %d rate" % n)
            for name in CASES:
                key = "%s %d" % (name, n)
                if self.med(key + " wall") is None:
                    continue
                session = self.med(key + " session ms") if name not in ("make", "parallel") else None
                print("%-12s %7d %6s %8.2f %10.0f %9.2f %10s %9s" % (
                    name, n, self.info.get("load %d" % n, "-"), self.med(key + " wall"),
                    self.med(key + " rate"), self.med(key + " cpu ms"),
                    "%.2f" % session if session is not None else "-",
                    ratio_text(anchor, self.med(key + " rate"))))
            for name in ("hosts shared", "hosts gmount"):
                hosts = self.med("%s %d rate" % (name, n))
                if hosts is not None:
                    verdicts.append("%d recipes on %d hosts (%s): %.0f/s (goal 500/s: %s)"
                                    % (n, self.hosts, name.split()[1], hosts, holds_text(hosts >= 500)))
            verdicts += self._namespace_goals(n, anchor)
            ours = self.med("gxpc make %d rate" % n)
            ratio = ours / anchor if ours and anchor else 0.0
            verdicts.append("%d recipes: %.0f/s (goal %.0f/s: %s), %.2fx plain make (goal %.2fx: %s; "
                            "floor %.2fx: %s)"
                            % (n, ours or 0, GOAL_RATE, holds_text((ours or 0) >= GOAL_RATE),
                               ratio, GOAL_RATIO, holds_text(ratio >= GOAL_RATIO),
                               FLOOR_RATIO, holds_text(ratio >= FLOOR_RATIO)))
        print()
        for n in self.counts:
            for name in CASES[1:]:
                prefix = "%s %d by " % (name, n)
                parts = sorted(((sum(v) / len(self.samples["%s %d wall" % (name, n)]), k[len(prefix):])
                                for k, v in self.samples.items() if k.startswith(prefix)), reverse=True)
                shown = ["%s %.2f" % (what, s * 1000.0 / n) for s, what in parts[:6]
                         if s * 1000.0 / n >= 0.01]
                if shown:
                    print("session CPU of %s, %d recipes, ms per recipe: %s" % (name, n, ", ".join(shown)))
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
    p.add_argument("--hosts", type=int, default=8,
                   help="test-bed hosts for a second session (default 8; 0: none)")
    p.add_argument("--wide", type=int, default=32,
                   help="test-bed hosts of a third session, a wider GMount (default 32; 0: none)")
    p.add_argument("--ssh-max", type=int, default=2000,
                   help="parallel over ssh only up to this many recipes (default 2000: about 10 "
                        "jobs a second here, 10,000 would take a quarter of an hour)")
    a = p.parse_args(argv)
    counts = a.recipes or [2000, 10000]
    if not all(1 <= n <= 1000000 for n in counts) or not 1 <= a.reps <= 100 or not 1 <= a.agents <= 256 \
            or not 0 <= a.hosts <= 64 or not 0 <= a.wide <= 64:
        p.error("--recipes from 1 to 1000000, --reps from 1 to 100, --agents from 1 to 256, "
                "--hosts and --wide from 0 to 64")
    return main_driver(Dispatch, counts, a.reps, a.agents, a.hosts, a.ssh_max, a.wide)


if __name__ == "__main__":
    sys.exit(main())
