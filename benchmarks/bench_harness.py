"""What the benchmarks (explore.py, mount.py, gmount.py) share.

A test bed (tests/testbed/) with one ordinary user that runs everything of the
product from the installed venv; `gxpc` calls as that user; CPU accounting from
/proc; medians; the "noticed:" lines of the reports; /dev/fuse made 0666 for a run
and restored; and the driver that runs a bench and cleans up whatever happens
(errors, Ctrl-C, SIGTERM/SIGHUP: exit 130).

A script subclasses Bench, fills in setup(), run(), report() and, if it opens
sessions or mounts, release(); its main() parses the options and returns
main_driver(TheBench, its arguments). Standard library only,
plus tests/testbed/.
"""
from __future__ import annotations

import os
import shutil
import signal
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


def ensure_anchor(program: str, package: str) -> str | None:
    """The path of an anchor program, installed with apt-get first when it is
    missing and we are root (benchmarks bring their own anchors, as the tests
    do); None when it cannot be had (the case is then left out and said so)."""
    found = shutil.which(program)
    if found or os.getuid() != 0 or not shutil.which("apt-get"):
        return found
    log("installing %s for the anchor (apt-get install %s)" % (program, package))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "install", "-y", "-qq", package],
                 ["sh", "-c", "apt-get update -qq && apt-get install -y -qq %s" % package]):
        subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=env, check=False)
        found = shutil.which(program)
        if found:
            return found
    return None


class BenchError(RuntimeError):
    pass


class Interrupted(BaseException):
    """SIGTERM/SIGHUP, turned into an exception so that the finally blocks run."""


def _on_term(signum, frame):
    raise Interrupted("signal %d" % signum)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- /proc ---------------------------------------------------------------------
def user_pids(uid: int) -> list:
    """Live processes of uid (any host of the bed shares our pid namespace)."""
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
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    total = sum(v[:8])
    return total - idle, total


def busy_share(before: tuple, after: tuple) -> float:
    """Share of all CPUs busy between two cpu_busy() readings."""
    return (after[0] - before[0]) / max(1, after[1] - before[1])


def proc_cpu(pid: int) -> float | None:
    """CPU time of pid in seconds: the scheduler's nanoseconds where the kernel
    keeps them (an agent forked in 2 ms is 0 or 10 ms in clock ticks), else
    utime + stime."""
    try:
        with open("/proc/%d/schedstat" % pid) as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def has_fuse(pid: int) -> bool:
    """pid holds /dev/fuse open (a mount service)."""
    try:
        return any(os.readlink("/proc/%d/fd/%s" % (pid, fd)) == "/dev/fuse"
                   for fd in os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return False


def session_cpu(uid: int) -> dict:
    """pid -> (CPU seconds so far, what it is) of the user's long-lived
    processes (daemons, agents, sshd, mount services), with the children
    they reaped (the recipes' shells on the nodes)."""
    out = {}
    for pid in user_pids(uid):
        try:
            with open("/proc/%d/stat" % pid) as f:
                head, rest = f.read().rsplit(")", 1)
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        fields = rest.split()
        what = head.split("(", 1)[1]
        for word in cmd[1:4]:
            if word.startswith(b"gxpstyle.") or word.startswith(b"sshfsmux."):
                what = word.decode()
        if b"zlib" in b" ".join(cmd):
            what = "mount service" if has_fuse(pid) else "agent"
        out[pid] = (sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK"), what)
    return out


def proc_cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def describe(pids) -> str:
    """The first five of pids with their command lines, for a report line."""
    return "; ".join("%d %s" % (pid, proc_cmdline(pid)[:80]) for pid in pids[:5])


def fuse_mounts(mounts_text: str) -> list:
    """The FUSE lines of a mount table (/proc/mounts format)."""
    return [l for l in mounts_text.splitlines() if len(l.split()) > 2 and l.split()[2].startswith("fuse")]


def fuse_at(lines, mp: str) -> bool:
    """Whether the mount table lines have a FUSE mount at mp."""
    return any(len(l.split()) > 2 and l.split()[1] == mp and l.split()[2].startswith("fuse") for l in lines)


def holds_text(ok: bool) -> str:
    """A goal's verdict as the reports print it."""
    return "holds" if ok else "DOES NOT HOLD"


def ratio_text(anchor, ours) -> str:
    return "%.2f" % (ours / anchor) if (anchor and ours is not None) else "-"


def value_text(fmt: str, v) -> str:
    return fmt % v if v is not None else "-"


class CpuMeter:
    """The CPU of every process of a group, whatever exits meanwhile: a cgroup of
    its own (cgroup v1's cpuacct, else v2), which the processes added and all
    their descendants (forked later) join. CPU-seconds from usage()."""

    ROOTS = (("/sys/fs/cgroup/cpuacct", "cpuacct.usage", 1e-9),
             ("/sys/fs/cgroup/unified", "cpu.stat", 1e-6),
             ("/sys/fs/cgroup", "cpu.stat", 1e-6))

    def __init__(self, name: str) -> None:
        self.path = self.file = None
        self.unit = 1.0
        for root, file, unit in self.ROOTS:
            if os.path.exists(os.path.join(root, file if file != "cpu.stat" else "cgroup.procs")):
                path = os.path.join(root, "%s-%s" % (name, uuid.uuid4().hex[:8]))
                try:
                    os.mkdir(path)
                except OSError:
                    continue
                if os.path.exists(os.path.join(path, file)):
                    self.root, self.path, self.file, self.unit = root, path, file, unit
                    return
                os.rmdir(path)

    def add(self, pid: int) -> None:
        if self.path is not None:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write("%d\n" % pid)

    def usage(self) -> float | None:
        if self.path is None:
            return None
        with open(os.path.join(self.path, self.file)) as f:
            text = f.read()
        if self.file == "cpu.stat":
            text = text.split("usage_usec")[1].split()[0]
        return int(text) * self.unit

    def close(self) -> None:
        """Every process back in the root group, and the group removed."""
        if self.path is None:
            return
        for _ in range(100):
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                pids = f.read().split()
            for pid in pids:
                try:
                    with open(os.path.join(self.root, "cgroup.procs"), "w") as f:
                        f.write(pid + "\n")
                except OSError:      # gone meanwhile
                    pass
            try:
                os.rmdir(self.path)
                break
            except OSError:          # a process forked in while we moved them
                time.sleep(0.01)
        self.path = None


# -- the bench ---------------------------------------------------------------------
class Bench:
    """A test bed and its user, samples, and the clean-up of what a run leaves."""

    name = "bench.py"         # the script, for messages
    call_timeout = 180        # seconds for any single command
    leftover_fuse_only = False  # on clean-up, unmount only FUSE mounts of mount_tag (else any)

    def __init__(self, log) -> None:
        self.log = log
        self.bed: testbed.TestBed | None = None
        self.user = None
        self.session = None          # the session currently open (a dir), if any
        self.fuse_token = None       # this run's hold on /dev/fuse 0666
        self.mount_tag = None        # head mounts containing this are unmounted on clean-up
        self.made_dirs: list = []    # removed on clean-up, after the teardown
        self.samples: dict = {}      # key -> [values]
        self.info: dict = {}         # key -> anything for the report
        self.odd: list = []          # things worth reporting

    # -- samples -------------------------------------------------------------
    def add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    def med(self, key: str):
        v = self.samples.get(key)
        return statistics.median(v) if v else None

    def add_cpu(self, key: str, before: tuple, after: tuple | None = None) -> None:
        """key busy (share of all CPUs) and key cpu s (CPU-seconds of the machine)
        between two cpu_busy() readings (after: now)."""
        after = after if after is not None else cpu_busy()
        self.add(key + " busy", busy_share(before, after))
        self.add(key + " cpu s", (after[0] - before[0]) / os.sysconf("SC_CLK_TCK"))

    def timed(self, key: str, fn):
        """fn(), with the machine's CPU while it ran added under key."""
        b0 = cpu_busy()
        out = fn()
        self.add_cpu(key, b0)
        return out

    def cpu_since(self, before: dict, key: str) -> float:
        """Seconds the user's processes (session_cpu) spent since `before`; by
        kind into key."""
        total = 0.0
        for pid, (cpu, what) in session_cpu(self.user.uid).items():
            d = cpu - before.get(pid, (0.0, ""))[0]
            if d > 0:
                total += d
                self.add("%s by %s" % (key, what), d)
        return total

    def noticed_lines(self) -> list:
        """The report's "noticed:" block (empty if nothing was)."""
        if not self.odd:
            return []
        out = ["", "noticed:"]
        seen = set()
        for x in self.odd:
            if x not in seen:
                seen.add(x)
                out.append("  - " + x)
        return out

    # -- the user --------------------------------------------------------------
    def env(self) -> dict:
        return {"PATH": os.path.join(VENV, "bin") + ":/usr/local/bin:/usr/bin:/bin"}

    def gxpc(self, *args, check: bool = True, timeout=None):
        """`gxpc --session SESSION ARGS` as the user: (seconds, CompletedProcess)."""
        argv = [GXPC, "--session", self.session] + [str(a) for a in args]
        t0 = time.monotonic()
        r = self.bed.run_as(self.user.name, argv, env=self.env(), capture_output=True, text=True,
                            timeout=self.call_timeout if timeout is None else timeout)
        dt = time.monotonic() - t0
        if check and r.returncode != 0:
            raise BenchError("gxpc %s failed (%d):\n%s%s" % (" ".join(map(str, args)), r.returncode,
                                                            r.stdout, r.stderr))
        return dt, r

    def settle(self, want: int = 0, timeout: float = 10.0) -> list:
        """Wait until the user has at most `want` processes; return those left."""
        t0 = time.monotonic()
        while len(user_pids(self.user.uid)) > want and time.monotonic() - t0 < timeout:
            time.sleep(0.05)
        return user_pids(self.user.uid)

    def kill_survivors(self, left) -> None:
        """Note and SIGKILL the user's processes that outlived `gxpc quit`."""
        self.odd.append("%d processes of the user survived quit by 10 s (killed): %s"
                        % (len(left), describe(left)))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def quit_session(self) -> tuple:
        """`gxpc quit` of the open session, a failure noted: (seconds, CompletedProcess)."""
        dt, r = self.gxpc("quit", check=False)
        if r.returncode != 0:
            self.odd.append("gxpc quit exited %d: %s" % (r.returncode, (r.stderr or r.stdout).strip()))
        return dt, r

    # -- setup -------------------------------------------------------------------
    def check_installed(self, *more) -> None:
        """The bed's requirements, and gxpc (and `more` programs) of the venv."""
        missing = testbed.requirements_missing()
        if missing:
            raise BenchError(missing)
        for p in (GXPC,) + more:
            if not os.access(p, os.X_OK):
                raise BenchError("%s is not installed (run scripts/install)" % p)

    def open_fuse(self) -> None:
        """/dev/fuse 0666 for the run, as on real systems (users may mount); restored on clean-up."""
        self.fuse_token = testbed.open_fuse_to_users()   # shared with concurrent runs

    def bed_up(self, names, user_prefix: str, **up_args) -> float:
        """The bed's hosts up (checkout and venv hidden) and a new user; returns the seconds."""
        self.bed = testbed.TestBed()
        t0 = time.monotonic()
        self.bed.up(names, hide_paths=[REPO, VENV], **up_args)
        self.user = self.bed.add_user(user_prefix + uuid.uuid4().hex[:6])
        return time.monotonic() - t0

    def make_dir(self, path: str) -> str:
        """A new directory owned by the user, removed on clean-up."""
        self.made_dirs.append(path)
        os.makedirs(path, 0o755)
        os.chown(path, self.user.uid, self.user.gid)
        return path

    # -- clean-up ----------------------------------------------------------------
    def guarded(self, what: str, fn, *args) -> bool:
        """fn(*args) during clean-up: a failure is said on stderr, and clean-up goes on."""
        try:
            fn(*args)
            return True
        except BaseException as e:   # keep going: the bed must go
            print("%s: %s failed: %s" % (self.name, what, e), file=sys.stderr)
            return False

    def release(self) -> None:
        """Unmount and quit what the run left open (bed and user exist)."""

    def cleanup(self) -> None:
        if self.bed is not None and self.user is not None:
            self.release()
        if self.mount_tag is not None:
            with open("/proc/mounts") as f:
                text = f.read()
            for line in (fuse_mounts(text) if self.leftover_fuse_only else text.splitlines()):
                if self.mount_tag in line:
                    self.odd.append("mount left on the head (lazily unmounted): " + line.strip())
                    subprocess.run(["umount", "-l", line.split()[1]], capture_output=True)
        if self.bed is not None:
            self.bed.teardown()   # kills every process of the user and removes it
        for d in self.made_dirs:
            shutil.rmtree(d, ignore_errors=True)
        if self.fuse_token is not None:
            testbed.close_fuse_to_users(self.fuse_token)

    # -- to fill in ----------------------------------------------------------------
    def setup(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        raise NotImplementedError

    def report(self):
        raise NotImplementedError


class GMountBench(Bench):
    """A session of the head and `hosts` on the test bed, one GMount across
    them (export and mountpoint under /tmp, named by `prefix`), recipes kept
    off the head. Subclasses set `hosts`, `host_glob` and `bandwidth`."""

    leftover_fuse_only = True
    call_timeout = 1800
    hosts: list[str] = []
    host_glob = ""
    bandwidth = None

    def __init__(self, log, prefix: str) -> None:
        super().__init__(log)
        tag = uuid.uuid4().hex[:6]
        self.prefix = prefix
        self.top = "/var/tmp/%s-%s" % (prefix, tag)
        self.export, self.mnt = "/tmp/%s-exp-%s" % (prefix, tag), "/tmp/%s-mnt-%s" % (prefix, tag)
        self.mount_tag = "%s-mnt-%s" % (prefix, tag)
        self.mounted = False

    def setup(self) -> None:
        self.check_installed()
        self.open_fuse()
        dt = self.bed_up(self.hosts, self.prefix, bw=self.bandwidth)
        self.make_dir(self.top)
        self.session = os.path.join(self.top, "session")
        self.gxpc("use", "ssh", "head", self.host_glob)
        self.gxpc("explore", *self.hosts)
        self.gxpc("e", "mkdir -p %s %s" % (self.export, self.mnt))
        self.gxpc("mount", self.export, self.mnt)
        self.mounted = True
        # the head runs no recipe: its mask leaves it out
        self.gxpc("e", 'test "$GXP_NODE_ID" != 0', check=False)
        self.gxpc("smask")
        self.log("test bed of %d hosts (%s links) up in %.1fs; GMount at %s"
                 % (len(self.hosts), self.bandwidth, dt, self.mnt))

    def release(self) -> None:
        if self.session is None:
            return
        if self.mounted:
            self.guarded("unmounting", self.gxpc, "umount", self.mnt)
        self.guarded("quitting", self.quit_session)
        # `gxpc e mkdir` made them on the head too (the hosts' go with the
        # bed); the mountpoint only if empty: never through a mount
        self.guarded("removing " + self.export, shutil.rmtree, self.export, True)
        if os.path.isdir(self.mnt):
            self.guarded("removing " + self.mnt, os.rmdir, self.mnt)


def main_driver(bench_class, *args, odd_on_failure: bool = True) -> int:
    """As root only (else 2): SIGTERM/SIGHUP made exceptions, then bench_class(*args)
    set up and run, cleaned up whatever happens, and its report printed on success.
    Returns the exit status: 0, 1 (the bench failed), 130 (interrupted), 2 (not root).
    odd_on_failure: on failure, log what was noticed."""
    if os.geteuid() != 0:
        print("%s: run as root (the test bed needs it)" % bench_class.name, file=sys.stderr)
        return 2
    # Our own handlers first: the bed then leaves them alone, and the clean-up
    # below (unmount, quit, teardown) runs on SIGTERM/SIGHUP as on Ctrl-C.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_term)
    bench = bench_class(*args)
    t0 = time.monotonic()
    status = 0
    try:
        bench.setup()
        bench.run()
    except (KeyboardInterrupt, Interrupted) as e:
        bench.log("%s: interrupted (%s); cleaning up" % (bench.name, str(e) or "Ctrl-C"))
        status = 130
    except (BenchError, testbed.TestBedError, subprocess.TimeoutExpired) as e:
        bench.log("%s: %s" % (bench.name, e))
        status = 1
    finally:
        # No second interruption half way through the clean-up.
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            bench.cleanup()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
    if status == 0:
        bench.report()   # a goal not holding is a result, not a failure of the benchmark
        print("total run time %.0fs" % (time.monotonic() - t0))
    elif odd_on_failure and bench.odd:
        bench.log("noticed: " + "; ".join(bench.odd))
    return status
