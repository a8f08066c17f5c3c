"""Fixtures shared by the suite.

The product runs as an ordinary user that the tests create (root is for the test
bed only), from the installed venv (`scripts/install`), never from the checkout.
Every session a test opens is quit at the end, and the test errors if any agent
of that session is still alive afterwards. The run as a whole fails when it
leaves anything behind (leaks.py: files in /tmp and /var/tmp, FUSE mounts,
network namespaces, test-bed users, processes); GXP_LEAK_CHECK=report only
reports, for a machine where several runs share /tmp.
"""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import leaks  # noqa: E402
import testbed  # noqa: E402
from gxpstyle.head import session as gxsession  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IS_ROOT = os.getuid() == 0


_LEAKS_KEY = pytest.StashKey[dict]()


def pytest_sessionstart(session) -> None:
    session.config.stash[_LEAKS_KEY] = leaks.snapshot()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the run when it left a file, directory, process, mount, network
    namespace or user behind (after every fixture's teardown: trylast)."""
    before = session.config.stash.get(_LEAKS_KEY, None)
    if before is None:
        return
    left = leaks.leftovers(before)
    if not left:
        return
    report_only = os.environ.get("GXP_LEAK_CHECK") == "report"
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    write = reporter.write_line if reporter else (lambda line: print(line, file=sys.stderr))
    if reporter:
        reporter.write_sep("=", "the run left %d thing%s behind" % (len(left), "s" * (len(left) != 1)),
                           red=not report_only)
    for line in left:
        write("  " + line)
    if not report_only and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def venv_dir() -> str:
    return os.environ.get("GXP_VENV", "/opt/gxpstyle/venv")


def gxpc_path() -> str:
    path = os.path.join(venv_dir(), "bin", "gxpc")
    if not os.path.exists(path):
        pytest.skip("gxpc is not installed in %s (run scripts/install)" % venv_dir())
    return path


class Gxp:
    """Runs gxpc for one session, as one user."""

    def __init__(self, bed: testbed.TestBed | None, user: str | None, session_dir: str) -> None:
        self.bed = bed
        self.user = user
        self.session_dir = session_dir
        self.tag = "gxp-agent:" + gxsession.session_name(session_dir)
        self.gxpc = gxpc_path()
        self.tags: list = []

    def new_tag(self) -> str:
        """A fresh tag for the test's own scratch paths on the head, /tmp/<name>-<tag>:
        they are removed when the session is quit."""
        tag = uuid.uuid4().hex[:6]
        self.tags.append(tag)
        return tag

    def argv(self, args) -> list:
        return [self.gxpc, "--session", self.session_dir] + list(args)

    def env(self, extra=None) -> dict:
        env = {"PATH": os.path.join(venv_dir(), "bin") + ":/usr/local/bin:/usr/bin:/bin"}
        env.update(extra or {})
        return env

    def run(self, *args, input=None, timeout=120, env=None, cwd=None) -> subprocess.CompletedProcess:
        kw = dict(input=input, capture_output=True, text=True, timeout=timeout)
        if self.user:
            return self.bed.run_as(self.user, self._in_dir(cwd, self.argv(args)), env=self.env(env), **kw)
        full = dict(os.environ)
        full.update(self.env(env))
        return subprocess.run(self.argv(args), env=full, cwd=cwd, **kw)

    __call__ = run

    @staticmethod
    def _in_dir(cwd, argv) -> list:
        # The user enters cwd itself: root may not enter the user's FUSE mount.
        if cwd is None:
            return argv
        return ["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", str(cwd)] + list(argv)

    def popen(self, *args, **kw) -> subprocess.Popen:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        if self.user:
            return self.bed.popen_as(self.user, self._in_dir(kw.pop("cwd", None), self.argv(args)),
                                     env=self.env(), **kw)
        full = dict(os.environ)
        full.update(self.env())
        return subprocess.Popen(self.argv(args), env=full, **kw)

    def ok(self, *args, **kw) -> subprocess.CompletedProcess:
        r = self.run(*args, **kw)
        assert r.returncode == 0, "gxpc %s failed (%d):\n%s%s" % (" ".join(args), r.returncode,
                                                                  r.stdout, r.stderr)
        return r

    def agent_pids(self) -> list:
        r = subprocess.run(["pgrep", "-f", self.tag], capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]

    def daemon_pids(self) -> list:
        r = subprocess.run(["pgrep", "-f", "gxpstyle.head.daemon --session %s" % self.session_dir],
                           capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]

    def stat_nodes(self) -> dict:
        """{name: state} from `gxpc stat`."""
        out = self.ok("stat").stdout.splitlines()[1:]
        nodes = {}
        for line in out:
            parts = line.split()
            name = parts[1]
            state = "up" if " up pid=" in line else line.split("] ", 1)[1].split(":")[0].lower()
            nodes[name] = state
        return nodes


def _finish(g: Gxp) -> None:
    g.run("quit", timeout=60)
    deadline = time.monotonic() + 10
    while (g.agent_pids() or g.daemon_pids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    leaked = g.agent_pids() + g.daemon_pids()
    for pid in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(os.path.dirname(g.session_dir), ignore_errors=True)
    mounted = _remove_scratch(g.tags)
    if mounted:
        pytest.fail("mounts of session %s survived quit: %s" % (g.session_dir, mounted))
    if leaked:
        pytest.fail("processes of session %s survived quit: %s" % (g.session_dir, leaked))


def _remove_scratch(tags: list) -> list:
    """Remove /tmp/*-<tag> for every tag; return the ones still mounted (kept: a
    recursive removal would go through the mount into the exports)."""
    with open("/proc/mounts") as f:
        mountpoints = {line.split()[1] for line in f}
    mounted = []
    for tag in tags:
        for path in glob.glob("/tmp/*-" + tag):
            if path in mountpoints:
                mounted.append(path)
            elif os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
    return mounted


@pytest.fixture(scope="module")
def cert_files(tmp_path_factory):
    """A session certificate as files: (certfile, keyfile, SHA-256 pin)."""
    cert, key, pin = gxsession.make_certificate()
    d = tmp_path_factory.mktemp("tls")
    (d / "cert.pem").write_text(cert)
    (d / "key.pem").write_text(key)
    return str(d / "cert.pem"), str(d / "key.pem"), pin


@contextlib.contextmanager
def module_bed(hosts, user_prefix: str, fuse: bool = False, **up_options):
    """A test bed for one test module: `hosts` up with the checkout and the venv
    hidden on them (nothing of ours preinstalled), one ordinary user, and with
    `fuse` /dev/fuse open to users as on real systems (0600 on this machine).
    Everything is undone at the end, also when a test failed."""
    with bed_with(lambda b: b.up(hosts, hide_paths=[REPO, venv_dir()], **up_options),
                  testbed.requirements_missing, user_prefix, fuse) as b:
        yield b


@contextlib.contextmanager
def bed_with(start, requirements_missing, user_prefix: str, fuse: bool = False):
    """A bed that start(bed) brings up (skipped without root or what
    requirements_missing() names), one ordinary user, /dev/fuse open to
    users when asked; everything undone at the end, also when a test failed."""
    if os.getuid() != 0:
        pytest.skip("the test bed needs root")
    missing = requirements_missing()
    if missing:
        pytest.skip(missing)
    fuse_token = testbed.open_fuse_to_users() if fuse else None
    b = testbed.TestBed()
    try:
        start(b)
        b.add_user(user_prefix + uuid.uuid4().hex[:6])
        yield b
    finally:
        b.teardown()
        if fuse_token is not None:
            testbed.close_fuse_to_users(fuse_token)


def explore_and_mount(g, hosts, pattern: str, env=None) -> str:
    """The session of `g` explores `hosts` (`use ssh head PATTERN`, the daemon
    started with `env`) and GMounts a fresh /tmp/gxpexp-TAG at /tmp/gxpmnt-TAG
    on every one; returns the mountpoint (the test unmounts it)."""
    g.ok("use", "ssh", "head", pattern, env=env)
    g.ok("explore", *hosts)
    tag = g.new_tag()
    export, mnt = "/tmp/gxpexp-" + tag, "/tmp/gxpmnt-" + tag
    g.ok("e", "mkdir -p %s %s" % (export, mnt))
    g.ok("mount", export, mnt)
    return mnt


@contextlib.contextmanager
def gmount_session(bed, hosts, pattern: str, tag: str):
    """(session, mountpoint): the bed's user explores `hosts` over ssh (`use ssh
    head PATTERN`) and GMounts /tmp/<tag>exp-X at /tmp/<tag>mnt-X on every one;
    unmounted, quit and removed at the end, also when a test failed (the
    hosts' /tmp goes with the bed)."""
    user = next(iter(bed.users))
    g = Gxp(bed, user, "/tmp/gxpt-%s/session" % uuid.uuid4().hex[:10])
    suffix = uuid.uuid4().hex[:6]
    export, mnt = "/tmp/%sexp-%s" % (tag, suffix), "/tmp/%smnt-%s" % (tag, suffix)
    try:
        g.ok("use", "ssh", "head", pattern)
        g.ok("explore", *hosts)
        g.ok("e", "mkdir -p %s %s" % (export, mnt))
        g.ok("mount", export, mnt)
        yield g, mnt
    finally:
        g.run("umount", mnt, timeout=90)
        _finish(g)
        for d in (export, mnt):
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def user_bed():
    """A bed with no hosts, holding one ordinary user (root only)."""
    if not IS_ROOT:
        yield None
        return
    missing = testbed.requirements_missing()
    if missing:
        pytest.skip(missing)
    bed = testbed.TestBed()
    try:
        bed.add_user("gxpu" + uuid.uuid4().hex[:6])
        yield bed
    finally:
        bed.teardown()


def _user_of(bed) -> str | None:
    return next(iter(bed.users)) if bed is not None else None


@pytest.fixture
def gxp(user_bed):
    """A fresh session run as an ordinary user; quit and checked at the end."""
    top = "/tmp/gxpt-" + uuid.uuid4().hex[:10]
    g = Gxp(user_bed, _user_of(user_bed), os.path.join(top, "session"))
    try:
        yield g
    finally:
        _finish(g)


@pytest.fixture
def make_gxp(user_bed):
    """Factory for more sessions in one test (all quit at the end)."""
    made = []

    def make(bed=None, user=None) -> Gxp:
        top = "/tmp/gxpt-" + uuid.uuid4().hex[:10]
        g = Gxp(bed or user_bed, user or _user_of(bed or user_bed), os.path.join(top, "session"))
        made.append(g)
        return g

    try:
        yield make
    finally:
        for g in made:
            _finish(g)
