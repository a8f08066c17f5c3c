#!/usr/bin/env python3
"""A real C project nobody here wrote, built in a GMount against local disk and bindfs (issue 26).

Run as root (the test bed needs it), from the checkout, after `scripts/install`
(it installs bindfs, the anchor, with apt-get when missing):

    /opt/gxpstyle/venv/bin/python benchmarks/real_project.py                      # GNU hello, all steps
    /opt/gxpstyle/venv/bin/python benchmarks/real_project.py --project patch --upto build --timeout 600

What it does:

* Fetches the upstream source tarball of a Debian source package (--project: GNU
  hello by default, or patch or sed; all autotools with a test target) with
  `apt-get source --download-only`, using a deb-src line and package lists of its
  own under a temporary directory in /var/cache (the system's apt configuration
  is not touched), and removes it at the end. --tarball FILE takes a local
  *.orig.tar.* instead.
* Builds a test bed (tests/testbed/) of --hosts hosts (default 8; unshaped links)
  and one ordinary user that runs everything of the product from the installed
  venv; a session of the user explores the hosts and mounts a GMount of every
  node's EXPORT (the head's included) at MNT, with the head masked out so that
  every recipe of `gxpc make` runs on a host (not timed). /dev/fuse is 0666 for
  the run (restored afterwards).
* For each case, in a new directory, as the user on the head, each step timed:
    unpack     `tar -xf TARBALL`
    configure  `./configure -q`
    build      `make -jJOBS` (local, bindfs); `gxpc make -jJOBS` (the others)
    check      `make -jJOBS check`; `gxpc make -jJOBS check` (the others)
  in the cases:
    local      a directory of the head's own disk (/var/tmp): the anchor;
    bindfs     `bindfs --no-allow-other` over a local directory (a C FUSE file
               system: the ceiling of any FUSE mount here); bindfs 1.14 drops
               tar's mtimes, so they are set again after the unpack (not timed);
    shared     a directory of the head's own disk that every test-bed host sees
               at the same path (/var/tmp is not private to them), unpacked and
               configured on the head, built and checked with `gxpc make --shared`
               by the same session: the distribution of recipes to the hosts with
               no mount at all (the floor of any shared namespace here);
    gmount     the head's mount of the GMount;
    nodebindfs the shared case with `bindfs --no-allow-other` over the shared
               directory on every node (the head and each host, at one path):
               the ceiling of any design that puts a FUSE mount on every node
               of this bed (a C passthrough, no namespace, no transfers);
    nodesshfsm the same with `sshfsm` over the shared directory on every node
               (our Python mount with one local branch, a GMount node's path to
               its own export: the ceiling of a Python FUSE mount on every node);
               up to the build (LAST_STEP says why).
  --upto STEP stops each case after STEP; --cases picks cases. A step that runs
  past --timeout is interrupted (SIGINT to its process group, then SIGKILL) and
  reported as timed out; the later steps of that case are not run. A step that
  fails is reported with its exit status, the tests that failed and the end of
  its output; --logs DIR keeps every step's output and job log.
* Counts, from `gxpc make --joblog`, the compiles (recipes of automake's C
  compile rule) and the hosts they ran on; and the tests make check reports (automake's summary).
* Prints seconds per step and case, the ratios to local, bindfs and shared, the load
  average before each case, and issue 26's goals: unpack at most 2x bindfs;
  configure, build and check each at most 1.5x local; compiles on at least 4 hosts.

Everything is cleaned up whatever happens (Ctrl-C, SIGTERM, errors): bindfs and the
GMount unmounted, the session quit, the bed torn down, the downloaded source and
every directory removed, /dev/fuse's mode restored. Standard library only, plus
tests/testbed/ and benchmarks/bench_harness.py.
"""
from __future__ import annotations

import argparse
import glob
import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from bindfs_anchor import BindfsMount
from real_project_report import CASES, NODE_MOUNTS, ON_HOSTS, PROJECTS, STEPS, ProjectReport

from bench_harness import (
    GXPC,
    Bench,
    BenchError,
    cpu_busy,
    ensure_anchor,
    log,
    main_driver,
    session_cpu,
)

# isort: split
import testbed  # noqa: E402  (bench_harness put tests/ on the path)

SHARED = ("shared",) + tuple(NODE_MOUNTS)     # cases that run `gxpc make --shared`
# sshfsm keeps names and misses 1 s in each node's kernel: a name one host's
# recipe makes in a directory another host looked into a moment before is not
# there for it (automake's test driver: "failed to create tests/hello-1.trs").
# The shared directory changes behind each node's sshfsm; its check is not run.
LAST_STEP = {"nodesshfsm": "build"}
BINDFS = ("bindfs", "nodebindfs")   # cases that unpack through bindfs (tar's mtimes set again)
INTERRUPT_GRACE = 30.0     # seconds a timed-out step gets to stop on SIGINT before SIGKILL


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def fetch_orig_tarball(package: str, into: str, mirror: str) -> str:
    """The upstream tarball of Debian source package `package`, downloaded into
    `into` by apt-get with a deb-src line and lists of its own (nothing of the
    system's apt state is changed)."""
    with open("/etc/os-release") as f:
        codename = re.search(r"^VERSION_CODENAME=\"?(\w+)", f.read(), re.M)
    if not codename:
        raise BenchError("cannot tell the Debian release from /etc/os-release (use --tarball)")
    lists = os.path.join(into, "lists")
    os.makedirs(os.path.join(lists, "partial"))
    os.makedirs(os.path.join(into, "cache", "archives", "partial"))
    with open(os.path.join(into, "sources.list"), "w") as f:
        f.write("deb-src %s %s main\n" % (mirror, codename.group(1)))
    opts = ["-o", "Dir::Etc::SourceList=" + os.path.join(into, "sources.list"),
            "-o", "Dir::Etc::SourceParts=" + os.path.join(into, "none"),
            "-o", "Dir::State::Lists=" + lists, "-o", "Dir::Cache=" + os.path.join(into, "cache"),
            "-o", "APT::Sandbox::User=root", "-o", "Debug::NoLocking=1", "-qq"]
    for argv in (["apt-get"] + opts + ["update"],
                 ["apt-get"] + opts + ["source", "--download-only", package]):
        r = subprocess.run(argv, cwd=into, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=600)
        if r.returncode != 0:
            raise BenchError("%s failed (%d): %s" % (" ".join(argv[:1] + argv[-2:]), r.returncode,
                                                     (r.stderr or r.stdout).strip()[:500]))
    found = [p for p in glob.glob(os.path.join(into, "%s_*.orig.tar.*" % package)) if not p.endswith(".asc")]
    if len(found) != 1:
        raise BenchError("apt-get source %s gave no single upstream tarball: %s"
                         % (package, os.listdir(into)))
    return found[0]


# A compile in the job log, which keeps a recipe's first line: automake's
# .c.o rule starts `depbase=...;\` (the compiler is on the next line) or runs
# `$(COMPILE) ... -c -o $@ $<` at once.
COMPILE_RECIPE = re.compile(r"\s-c\s|\bdepbase=`")

# bindfs (1.14, Debian 12) ignores a utimensat that leaves atime alone
# (UTIME_OMIT), as tar's is: through it every unpacked file gets the time of
# its extraction, and make would run automake. So the bindfs case sets the
# tarball's mtimes again after the timed unpack (not timed).
SET_MTIMES = r"""
import os, sys, tarfile
top, tarball = sys.argv[1], sys.argv[2]
with tarfile.open(tarball) as t:
    for m in t:
        if not m.issym():
            os.utime(os.path.join(top, m.name), (m.mtime, m.mtime), follow_symlinks=False)
"""


# sshfsm for the hosts, which do not see the venv: the project and its
# requirements copied next to it (copy_runtime)
SSHFSM_SCRIPT = """import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "site"))
from sshfsmux.standalone.sshfsm import main
sys.argv[0] = "sshfsm"
sys.exit(main())
"""


def copy_runtime(into: str, project: str = "gxpstyle") -> None:
    """The installed `project` and the closure of its requirements (extras left
    out), copied file by file from this interpreter's site-packages into `into`."""
    seen: set = set()
    todo = [project]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        dist = importlib.metadata.distribution(name)
        for req in dist.requires or []:
            if "extra ==" not in req:
                todo.append(re.match(r"[A-Za-z0-9_.-]+", req).group(0))
        for f in dist.files or []:
            if f.parts[0] == "..":
                continue                  # console scripts, outside site-packages
            dst = os.path.join(into, *f.parts)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(dist.locate_file(f), dst)


def compiles_by_host(joblog_text: str) -> dict:
    """host -> compiles (COMPILE_RECIPE) in a `gxpc make --joblog` file."""
    out: dict = {}
    for line in joblog_text.splitlines()[1:]:
        row = line.split("\t")
        if len(row) > 1 and COMPILE_RECIPE.search(row[0]):
            out[row[1]] = out.get(row[1], 0) + 1
    return out


class RealProject(ProjectReport, Bench):
    name = "real_project.py"
    call_timeout = 1800
    leftover_fuse_only = True

    def __init__(self, a) -> None:
        super().__init__(log)
        self.a = a
        self.tag = "realproj-" + uuid.uuid4().hex[:6]
        self.mount_tag = self.tag            # head mounts left with it are unmounted on clean-up
        self.top = "/var/tmp/" + self.tag
        self.dirs: dict = {}                 # case -> the directory the case unpacks into
        self.bindfs: BindfsMount | None = None
        self.node_mounts: list = []          # mount points on every node (NODE_MOUNTS), once mounted
        self.gmount = None
        self.tarball = ""
        self.results: dict = {}              # (case, step) -> "ok" | "timeout" | "failed (N)" | "not run"

    # -- setup -------------------------------------------------------------------
    def setup(self) -> None:
        self.check_installed()
        for prog in ("make", "cc", "tar"):
            if not shutil.which(prog):
                raise BenchError("%s is not installed" % prog)
        if set(BINDFS) & set(self.a.cases) and not ensure_anchor("bindfs", "bindfs"):
            raise BenchError("bindfs is not installed and apt-get could not install it (the anchor)")
        tarball = self.a.tarball
        if not tarball:
            cache = tempfile.mkdtemp(prefix="gxpstyle-real-project-", dir="/var/cache")
            self.made_dirs.append(cache)
            log("%s: fetching the source of %s (apt-get source)" % (self.name, self.a.project))
            tarball = fetch_orig_tarball(self.a.project, cache, self.a.mirror)
        self.open_fuse()
        on_hosts = set(ON_HOSTS) & set(self.a.cases)
        names = ["tb%02d" % i for i in range(1, self.a.hosts + 1)] if on_hosts else []
        if names:
            dt = self.bed_up(names, "gxprp")
            log("%s: test bed of %d hosts up in %.1fs" % (self.name, len(names), dt))
        else:
            self.bed = testbed.TestBed()
            self.user = self.bed.add_user("gxprp" + uuid.uuid4().hex[:6])
        self.make_dir(self.top)
        self.tarball = os.path.join(self.top, os.path.basename(tarball))
        shutil.copyfile(tarball, self.tarball)
        os.chmod(self.tarball, 0o644)
        self.make_dir(os.path.join(self.top, "logs"))
        for case in self.a.cases:
            self._prepare(case, names)

    def _explore(self, names: list) -> None:
        """The session of the hosts (once, for the cases on the hosts)."""
        if self.session:
            return
        self.session = os.path.join(self.top, "session")
        self.gxpc("use", "ssh", "head", "tb*")
        dt, _ = self.gxpc("explore", *names)
        export, mnt = self._gmount_dirs()
        self.made_dirs += [export, mnt]      # the head's (the hosts' go with the bed)
        self.gxpc("e", "mkdir -p %s %s" % (export, mnt))
        # the head runs no recipe: its mask leaves it out
        self.gxpc("e", 'test "$GXP_NODE_ID" != 0', check=False)
        self.gxpc("smask")
        log("%s: %d hosts explored in %.1fs" % (self.name, len(names), dt))

    def _prepare(self, case: str, names: list) -> None:
        if case == "local":
            self.dirs[case] = self.make_dir(os.path.join(self.top, "local"))
        elif case == "bindfs":
            src = self.make_dir(os.path.join(self.top, "bindfs-src"))
            mnt = self.make_dir("/tmp/%s-bindfs" % self.tag)
            self.bindfs = BindfsMount(self, src, mnt)
            self.dirs[case] = mnt
        elif case == "shared":
            self._explore(names)
            self.dirs[case] = self.make_dir(os.path.join(self.top, "shared"))
        elif case in NODE_MOUNTS:
            self._explore(names)
            self.dirs[case] = self._mount_on_nodes(case)
        else:
            self._explore(names)
            export, mnt = self._gmount_dirs()
            self.gxpc("mount", export, mnt)
            self.gmount = self.dirs[case] = mnt
            log("%s: GMount at %s" % (self.name, mnt))

    def _mount_on_nodes(self, case: str) -> str:
        """The case's mount (NODE_MOUNTS) over one shared directory on the head
        and on every host, at one path (the hosts' /tmp is their own): that path."""
        src = self.make_dir(os.path.join(self.top, case + "-src"))
        mnt = self.make_dir("/tmp/%s-%s" % (self.tag, case))
        if case == "nodesshfsm":
            script = os.path.join(self.top, "sshfsm.py")
            copy_runtime(os.path.join(self.top, "site"))
            with open(script, "w") as f:
                f.write(SSHFSM_SCRIPT)
            subprocess.run(["chmod", "-R", "a+rX", script, os.path.join(self.top, "site")], check=True)
            command = NODE_MOUNTS[case] % (script, src, mnt)
        else:
            command = NODE_MOUNTS[case] % (src, mnt)
        self.node_mounts.append(mnt)
        self.as_user(["sh", "-c", command])
        # the session's mask leaves the head out: this runs on the hosts
        self.gxpc("e", "mkdir -p %s && %s" % (mnt, command))
        return mnt

    def _gmount_dirs(self) -> tuple:
        """The GMount's export and mount point, on every node."""
        return "/tmp/%s-exp" % self.tag, "/tmp/%s-mnt" % self.tag

    def as_user(self, argv: list) -> str:
        r = self.bed.run_as(self.user.name, argv, env=self.env(), capture_output=True, text=True,
                            timeout=self.call_timeout)
        if r.returncode != 0:
            raise BenchError("%s failed (%d): %s" % (" ".join(argv), r.returncode, r.stderr.strip()[:500]))
        return r.stdout

    # -- one step ------------------------------------------------------------------
    def step_argv(self, case: str, step: str, joblog: str) -> list:
        jobs = "-j%d" % self.a.jobs
        if step == "unpack":
            return ["tar", "-xf", self.tarball]
        if step == "configure":
            return ["./configure", "-q"]
        make = ["make"]
        if case in ON_HOSTS:
            make = [GXPC, "--session", self.session, "make", "--joblog", joblog]
            make += ["--shared"] if case in SHARED else []
        return make + [jobs] + (["check"] if step == "check" else [])

    def run_step(self, argv: list, cwd: str, out_path: str) -> tuple[str, float]:
        """argv as the user in cwd, output to out_path: (outcome, wall seconds). On a
        timeout the step's process group gets SIGINT (make stops its jobs), then SIGKILL."""
        with open(out_path, "wb") as out:
            t0 = time.monotonic()
            # the shell enters cwd as the user: root may not enter the user's FUSE mounts
            p = self.bed.popen_as(self.user.name, ["sh", "-c", 'cd "$0" && exec "$@"', cwd] + argv,
                                  env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
            try:
                code = p.wait(timeout=self.a.timeout)
                return ("ok" if code == 0 else "failed (exit %d)" % code), time.monotonic() - t0
            except subprocess.TimeoutExpired:
                wall = time.monotonic() - t0
                self._stop_group(p)
                return "timeout", wall
            except BaseException:
                self._stop_group(p)
                raise

    @staticmethod
    def _stop_group(p: subprocess.Popen) -> None:
        for sig, grace in ((signal.SIGINT, INTERRUPT_GRACE), (signal.SIGKILL, None)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                return
            try:
                p.wait(timeout=grace)
                if sig == signal.SIGINT:
                    os.killpg(p.pid, signal.SIGKILL)   # whatever of the group outlived make
                return
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                return

    # -- run -----------------------------------------------------------------------
    def run(self) -> None:
        steps = STEPS[:STEPS.index(self.a.upto) + 1]
        for rep in range(self.a.reps):
            for case in (self.a.cases if rep % 2 == 0 else self.a.cases[::-1]):
                self.info["load %s" % case] = _load()
                last = LAST_STEP.get(case, self.a.upto)
                self.run_case(case, rep, steps[:min(len(steps), STEPS.index(last) + 1)])

    def run_case(self, case: str, rep: int, steps: tuple) -> None:
        top = os.path.join(self.dirs[case], "rep%d" % rep)
        self.as_user(["mkdir", top])
        project = None
        stopped = False
        for step in steps:
            if stopped or (project is None and step != "unpack"):
                self.results[(case, step)] = "not run"
                continue
            cwd = top if step == "unpack" else os.path.join(top, project)
            out_path = os.path.join(self.top, "logs", "%s-%d-%s.log" % (case, rep, step))
            joblog = os.path.join(self.top, "logs", "%s-%d-%s.joblog" % (case, rep, step))
            cpu0, session0 = cpu_busy(), session_cpu(self.user.uid)
            outcome, wall = self.run_step(self.step_argv(case, step, joblog), cwd, out_path)
            if outcome == "ok":
                self.add_cpu("%s %s" % (case, step), cpu0)
                self.cpu_since(session0, "%s %s session" % (case, step))
            self.results[(case, step)] = outcome
            log("  %s rep %d %-9s %s %.2fs (load %s)" % (case, rep + 1, step, outcome, wall, _load()))
            if outcome != "ok":
                self.odd.append("%s %s %s after %.0fs; %sthe end of its output:\n%s"
                                % (case, step, outcome, wall, self._failures(out_path), self._tail(out_path)))
                if step == "check":
                    self._count(case, step, out_path, joblog)
                    self.guarded("keeping the test-suite logs", self._keep_suite_logs, cwd,
                                 out_path[:-len(".log")] + "-test-suite.log")
                if outcome == "timeout":
                    self.add("%s %s timeout" % (case, step), wall)
                stopped = True
                continue
            self.add("%s %s" % (case, step), wall)
            if step == "unpack":
                project = self._unpacked(top)
                if case in BINDFS:
                    self.as_user(["/usr/bin/python3", "-I", "-c", SET_MTIMES, top, self.tarball])
            self._count(case, step, out_path, joblog)
        self.as_user(["rm", "-rf", top])

    def _unpacked(self, top: str) -> str:
        found = self.as_user(["ls", top]).split()
        if len(found) != 1:
            raise BenchError("the tarball did not unpack into one directory: %s" % found)
        return found[0]

    def _count(self, case: str, step: str, out_path: str, joblog: str) -> None:
        """Tests make check passed and failed; compiles per host from gxpc make's joblog."""
        if step == "check":
            with open(out_path, errors="replace") as f:
                text = f.read()
            for what in ("TOTAL", "PASS", "FAIL", "SKIP"):
                n = sum(int(x) for x in re.findall(r"^# %s: +(\d+)" % what, text, re.M))
                self.info["%s tests %s" % (case, what)] = n
        if case in ON_HOSTS and step in ("build", "check") and os.path.exists(joblog):
            with open(joblog, errors="replace") as f:
                self.info["%s %s compiles" % (case, step)] = compiles_by_host(f.read())

    def _keep_suite_logs(self, project: str, into: str) -> None:
        """The test-suite.log files of automake's harness (what each failed test
        said), kept with the step's output: the project's tree is removed."""
        text = self.as_user(["sh", "-c", 'cd "$1" && find . -name test-suite.log -exec cat {} +', "sh",
                             project])
        with open(into, "w") as f:
            f.write(text)

    @staticmethod
    def _failures(path: str) -> str:
        """The tests automake's harness says failed, for a note ("" if none)."""
        with open(path, errors="replace") as f:
            failed = re.findall(r"^(?:FAIL|ERROR): (\S+)", f.read(), re.M)
        return "tests failed: %s; " % ", ".join(failed) if failed else ""

    @staticmethod
    def _tail(path: str) -> str:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 1500))
            lines = f.read().decode(errors="replace").splitlines()[-12:]
        return "\n".join("      " + x for x in lines) if lines else "      (none)"

    # -- clean-up ---------------------------------------------------------------------
    def release(self) -> None:
        logs = os.path.join(self.top, "logs")
        if self.a.logs and os.path.isdir(logs):
            self.guarded("keeping the logs in " + self.a.logs, shutil.copytree, logs, self.a.logs)
        if self.bindfs is not None:
            self.guarded("unmounting bindfs", self.bindfs.unmount)
            self.bindfs = None
        for mnt in self.node_mounts:
            self.guarded("unmounting " + mnt, self.as_user, ["fusermount3", "-u", mnt])
        if self.session is not None:
            for mnt in self.node_mounts:
                self.guarded("unmounting the hosts' " + mnt, self.gxpc, "e", "fusermount3 -u " + mnt)
            self.node_mounts = []
            if self.gmount:
                self.guarded("unmounting the GMount", self.gxpc, "umount", self.gmount)
                self.gmount = None
            self.guarded("quitting the session", self.quit_session)
            self.session = None
        left = self.settle(0)
        if left:
            self.kill_survivors(left)

    # -- report -----------------------------------------------------------------------


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--project", default="hello", choices=sorted(PROJECTS),
                   help="the Debian source package whose upstream tarball is built (default hello)")
    p.add_argument("--tarball", help="a local upstream source tarball to use instead of fetching one")
    p.add_argument("--mirror", default="http://deb.debian.org/debian",
                   help="the Debian mirror apt-get source uses (default http://deb.debian.org/debian)")
    p.add_argument("--cases", default=",".join(CASES),
                   help="cases to run, comma-separated, from %s (default all)" % ",".join(CASES))
    p.add_argument("--upto", default="check", choices=STEPS,
                   help="the last step of each case (default check)")
    p.add_argument("--timeout", type=float, default=1200.0,
                   help="seconds a step may take before it is stopped and reported as timed out "
                        "(default 1200)")
    p.add_argument("--logs", help="a new directory to keep every step's output and job log in")
    p.add_argument("--hosts", type=int, default=8, help="test-bed hosts in the GMount (default 8)")
    p.add_argument("--jobs", type=int, default=8, help="make -j (default 8)")
    p.add_argument("--reps", type=int, default=1, help="runs of every case (default 1)")
    a = p.parse_args(argv)
    a.cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    if not a.cases or set(a.cases) - set(CASES):
        p.error("--cases takes %s, separated by commas" % ", ".join(CASES))
    if a.logs and os.path.exists(a.logs):
        p.error("--logs %s: it exists (give a new directory)" % a.logs)
    if a.tarball and not os.path.isfile(a.tarball):
        p.error("--tarball %s: no such file" % a.tarball)
    if not 1 <= a.hosts <= 64 or not 1 <= a.jobs <= 256 or not 1 <= a.reps <= 20 or not a.timeout > 0:
        p.error("--hosts from 1 to 64, --jobs from 1 to 256, --reps from 1 to 20, --timeout above 0")
    return main_driver(RealProject, a)


if __name__ == "__main__":
    sys.exit(main())
