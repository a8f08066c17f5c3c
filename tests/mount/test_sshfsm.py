"""sshfsm: merged FUSE mounts of SFTP branches (stock sshd, nothing of ours on the
remote) and local directories.

Everything that mounts runs the installed product (/opt/gxpstyle/venv/bin/sshfsm)
as an ordinary user created by the test bed, against a module-scoped bed of three
hosts on which our code is hidden. /dev/fuse is made 0666 for the module (as on
real systems) and its mode restored afterwards. Every test unmounts what it
mounted; the last test checks that no mount or process of ours is left.

A few tests at the top exercise the pieces in-process (no bed needed).
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import testbed  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.environ.get("GXP_VENV", "/opt/gxpstyle/venv")
SSHFSM = os.path.join(VENV, "bin", "sshfsm")
PY = os.path.join(VENV, "bin", "python")
FUSERMOUNT = shutil.which("fusermount3") or shutil.which("fusermount")
HEAD = socket.gethostname()
TIMEOUT = 60


# --------------------------------------------------------------------------
# in-process tests of the pieces (no bed, no FUSE)
# --------------------------------------------------------------------------

def test_libfuse3_is_chosen_when_libfuse2_is_installed_too():
    """mfusepy alone prefers libfuse 2 (bindfs and many tools install it); ours
    asks for libfuse 3 unless the user set FUSE_LIBRARY_PATH."""
    from ctypes.util import find_library
    if not find_library("fuse3"):
        pytest.skip("libfuse3 is not installed")
    code = ("import os, sys; import sshfsmux.fs.merged_fs, mfusepy; "
            "print(os.environ.get('FUSE_LIBRARY_PATH'), mfusepy.fuse_version_major)")
    env = {k: v for k, v in os.environ.items() if k != "FUSE_LIBRARY_PATH"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [find_library("fuse3"), "3"]
    env["FUSE_LIBRARY_PATH"] = "/nonexistent/libfuse-chosen-by-user.so"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "libfuse-chosen-by-user" in r.stderr   # the user's choice is kept


def test_options_parse_like_sshfs():
    from sshfsmux.standalone.mount_options import UsageError, parse
    o = parse(["-o", "port=2222,IdentityFile=~/k,reconnect", "-oro", "-f",
               "a:/x", "/local", "/mnt"])
    assert (o.port, o.identity_file, o.reconnect, o.ro, o.foreground) == (2222, "~/k", True, True, True)
    assert o.branches == ["a:/x", "/local"] and o.mountpoint == "/mnt"
    o = parse(["-d", "-o", "allow_other,cache_dir=/c", "h:", "/m"])
    assert o.debug and o.foreground and o.allow_other and o.default_permissions
    assert o.cache_dir == "/c"
    for bad, msg in ((["-o", "bogus", "a:", "/m"], "unknown option 'bogus'"),
                     (["-o", "port=x", "a:", "/m"], "bad value for option 'port'"),
                     (["-x", "a:", "/m"], "unknown option 'x'"),
                     (["-o", "transport=direct", "a:", "/m"], "transport=direct needs gxpc mount"),
                     (["/m"], "missing")):
        with pytest.raises(UsageError) as ei:
            parse(bad)
        assert msg in str(ei.value)


def test_local_branch_is_confined(tmp_path):
    from sshfsmux.branches.local_branch import LocalBranch
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("in")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("out")
    os.symlink(str(tmp_path / "outside"), root / "esc")       # leaves the root
    os.symlink("d", root / "inner")                            # stays inside
    b = LocalBranch(str(root), exclude=[str(root / "hidden")])
    (root / "hidden").mkdir()
    for bad in ("/../outside/secret", "/d/../../outside", "/d//f", "/./d"):
        with pytest.raises(OSError) as ei:
            b.getattr(bad)
        assert ei.value.errno == errno.EACCES, bad
    with pytest.raises(OSError) as ei:
        b.open_read("/esc/secret")
    assert ei.value.errno == errno.EACCES
    with pytest.raises(OSError) as ei:
        b.getattr("/esc/secret")
    assert ei.value.errno == errno.EACCES
    assert stat.S_ISLNK(b.getattr("/esc")["st_mode"])      # the link itself is fine
    assert b.open_read("/inner/f").read(10, 0) == b"in"    # inside: followed
    assert sorted(b.readdir("/")) == ["d", "esc", "inner"]  # excluded name gone
    with pytest.raises(OSError) as ei:
        b.getattr("/hidden")
    assert ei.value.errno == errno.ENOENT


def test_merged_fs_in_process(tmp_path):
    """The merge rules on two local branches, without FUSE."""
    from mfusepy import FuseOSError

    from sshfsmux.branches.local_branch import LocalBranch
    from sshfsmux.fs.merged_fs import MergedFS
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "sub").mkdir(parents=True)
        (d / "rep").write_text("same")
        os.utime(d / "rep", (1000, 1000))
    (a / "con").write_text("one")
    (b / "con").write_text("other")
    (b / "sub" / "only-b").write_text("b")
    fs = MergedFS([LocalBranch(str(a), node="na"), LocalBranch(str(b), node="nb")],
                  mountpoint=str(tmp_path / "mp"), read_only=False)
    assert fs.chain.decode() == "%s:%s\n" % (HEAD, tmp_path / "mp")
    assert fs.readdir("/", 0) == [".", "..", "con", "rep", "sub"]
    assert fs.readdir("/sub", 0) == [".", "..", "only-b"]
    assert fs.getxattr("/rep", "user.sshfsmux.location") == b"na,nb"
    assert fs.getxattr("/con", "user.sshfsmux.conflict") == str(b).encode()
    fh = fs.create("/sub/new", 0o644, os.O_WRONLY)
    fs.write("/sub/new", b"x", 0, fh)
    fs.release("/sub/new", fh)
    assert (a / "sub" / "new").read_text() == "x" and not (b / "sub" / "new").exists()
    fs.rename("/sub/only-b", "/con")      # the target goes from a, the source moves in b
    assert not (a / "con").exists() and (b / "con").read_text() == "b"
    with pytest.raises(FuseOSError) as ei:
        fs.rmdir("/sub")
    assert ei.value.errno == errno.ENOTEMPTY
    ro = MergedFS([LocalBranch(str(a))], read_only=True)
    with pytest.raises(FuseOSError) as ei:
        ro.mkdir("/x", 0o755)
    assert ei.value.errno == errno.EROFS


def test_chain_of_a_remote_branch():
    from sshfsmux.standalone import sshfsm

    class FakeRemote:
        root = b"/srv/m/sub"

        def read_small(self, path):
            return {b"/proc/self/mounts": b"a /srv/m fuse.sshfsm rw 0 0\nb / ext4 rw 0 0\n",
                    b"/srv/m/.sshfsmux-chain": b"tb01:/srv/m\nvm:/x\n"}.get(path)
    assert sshfsm.remote_chain(FakeRemote()) == ["tb01:/srv/m", "vm:/x"]
    FakeRemote.root = b"/elsewhere"
    assert sshfsm.remote_chain(FakeRemote()) == []


def test_replica_cache_complete_or_invisible(tmp_path):
    from sshfsmux.branches.replica_cache import ReplicaCache
    c = ReplicaCache(str(tmp_path))
    assert stat.S_IMODE(os.stat(c.dir).st_mode) == 0o700
    d = c.begin("k", 5, 100)
    os.write(d.fd, b"12")
    assert c.get("k", 5, 100) is None and not c.has("k", 5, 100)
    os.write(d.fd, b"345")
    f = d.commit()
    assert open(f, "rb").read() == b"12345" and c.has("k", 5, 100)
    assert c.get("k", 5, 101) is None          # another version: dropped
    d = c.begin("k", 1, 1)
    c.invalidate("k")                          # changed while streaming
    assert d.commit() is None and not c.has("k", 1, 1)
    c.close()
    assert not os.path.exists(c.dir)


# --------------------------------------------------------------------------
# the bed
# --------------------------------------------------------------------------

def _skip_reason():
    if not sys.platform.startswith("linux"):
        return "sshfsm needs Linux"
    why = testbed.requirements_missing()
    if why:
        return why
    if not os.path.exists(SSHFSM):
        return "sshfsm is not installed in %s (scripts/install)" % VENV
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if not FUSERMOUNT:
        return "no fusermount3"
    return None


class Env:
    def __init__(self, bed, user):
        self.bed = bed
        self.user = user
        u = bed.users[user]
        self.uid, self.gid, self.home = u.uid, u.gid, u.home

    # -- running things as the user ----------------------------------------
    def run(self, argv, timeout=TIMEOUT, **kw):
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return self.bed.run_as(self.user, argv, timeout=timeout, **kw)

    def sh(self, script, **kw):
        r = self.run(["/bin/sh", "-ec", script], **kw)
        assert r.returncode == 0, "%s\n--- %s%s" % (script, r.stdout, r.stderr)
        return r.stdout

    def py(self, code, **kw):
        r = self.run([PY, "-c", textwrap.dedent(code)], **kw)
        assert r.returncode == 0, "%s\n--- %s%s" % (code, r.stdout, r.stderr)
        return r.stdout

    def sshfsm(self, *args, **kw):
        return self.run([SSHFSM] + [str(a) for a in args], **kw)

    # -- places ----------------------------------------------------------------
    def mkdir(self, name=None):
        """A fresh empty directory in the user's home (mountpoint, local branch)."""
        p = os.path.join(self.home, name or ("d-" + secrets.token_hex(4)))
        os.makedirs(p)
        os.chown(p, self.uid, self.gid)
        return p

    def remote(self, host, files=None, name=None):
        """A fresh directory in `host`'s scratch: (root-side path, branch spec)."""
        name = name or ("r-" + secrets.token_hex(4))
        side = os.path.join(self.bed.host(host).scratch_dir, name)
        os.makedirs(side)
        for rel, content in (files or {}).items():
            p = os.path.join(side, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(content if isinstance(content, bytes) else content.encode())
        for d, dirs, fs in os.walk(side):
            for n in [d] + [os.path.join(d, x) for x in dirs + fs]:
                os.chown(n, self.uid, self.gid)
        return side, "%s:%s/%s" % (host, self.bed.scratch, name)

    # -- mounts ----------------------------------------------------------------
    @contextmanager
    def mount(self, *args, mp=None):
        mp = mp or self.mkdir("m-" + secrets.token_hex(4))
        r = self.sshfsm(*(list(args) + [mp]))
        assert r.returncode == 0, "sshfsm %s failed (%d): %s%s" % (args, r.returncode, r.stdout,
                                                                   r.stderr)
        assert r.stderr == "" and mounted(mp)
        try:
            yield mp
        finally:
            self.unmount(mp)

    def unmount(self, mp):
        pids = sshfsm_pids(mp)
        if mounted(mp):
            r = self.run([FUSERMOUNT, "-u", mp])
            if r.returncode != 0 and mounted(mp):
                time.sleep(0.5)
                r = self.run([FUSERMOUNT, "-u", mp])
            assert r.returncode == 0 or not mounted(mp), r.stderr
        assert wait_gone(pids), "sshfsm processes %s survived the unmount" % pids


def mounts():
    """(mountpoint, fstype, options) of every mount in our namespace."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])
            out.append((mp, parts[sep + 1], parts[sep + 3] if len(parts) > sep + 3 else ""))
    return out


def mounted(mp):
    return any(m == mp and t == "fuse.sshfsm" for m, t, _ in mounts())


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def sshfsm_pids(mp=None, uid=None):
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        argv = _cmdline(int(e))
        if not any(a.endswith(b"/sshfsm") for a in argv[:2]):
            continue
        if mp is not None and mp.encode() not in argv:
            continue
        if uid is not None:
            try:
                if os.stat("/proc/" + e).st_uid != uid:
                    continue
            except OSError:
                continue
        if _alive(int(e)):
            out.append(int(e))
    return out


def wait_gone(pids, timeout=10):
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_for(cond, timeout=10):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@contextlib.contextmanager
def sshfsm_bed(hosts, user_prefix: str):
    """An Env on a new test bed of `hosts` (our code hidden on them) with one
    ordinary user and /dev/fuse open to users as on real systems; the user's
    mounts, the bed and the device's mode are undone even when a test failed.
    Skips where the bed or FUSE is missing."""
    why = _skip_reason()
    if why:
        pytest.skip(why)
    fuse_token = testbed.open_fuse_to_users()
    bed = testbed.TestBed()
    e = None
    try:
        bed.up(hosts, hide_paths=[REPO, VENV])
        e = Env(bed, bed.add_user(user_prefix + secrets.token_hex(3)).name)
        yield e
    finally:
        try:
            for mp, t, _opts in mounts():     # never leave a mount behind
                if e is not None and t == "fuse.sshfsm" and mp.startswith(e.home + "/"):
                    subprocess.run(["umount", "-l", mp], capture_output=True)
        finally:
            bed.teardown()
            testbed.close_fuse_to_users(fuse_token)


@pytest.fixture(scope="module")
def env():
    with sshfsm_bed(["tb01", "tb02", "tb03"], "sfm") as e:
        yield e


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------

def test_command_line_errors_are_one_line(env):
    mp = env.mkdir()
    r = env.sshfsm("-o", "nosuch", "tb01:/", mp)
    assert (r.returncode, r.stderr) == (2, "sshfsm: unknown option 'nosuch'\n")
    r = env.sshfsm("-o", "transport=direct", "tb01:/", mp)
    assert (r.returncode, r.stderr) == (2, "sshfsm: transport=direct needs gxpc mount\n")
    r = env.sshfsm("-h")
    assert r.returncode == 0 and "usage: sshfsm" in r.stdout
    r = env.sshfsm("-V")
    assert r.returncode == 0 and r.stdout.startswith("sshfsm ")
    r = env.sshfsm("tb01:/", mp + "/nope")
    assert (r.returncode, r.stderr) == (1, "sshfsm: mountpoint %s/nope does not exist\n" % mp)
    with open(os.path.join(mp, "f"), "w"):
        pass
    r = env.sshfsm("tb01:/", mp + "/f")
    assert (r.returncode, r.stderr) == (1, "sshfsm: mountpoint %s/f is not a directory\n" % mp)
    r = env.sshfsm("tb01:/", mp)
    assert (r.returncode, r.stderr) == (1, "sshfsm: mountpoint %s is not empty\n" % mp)
    r = env.sshfsm(env.home + "/no-such-dir", env.mkdir())
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "No such file" in r.stderr


def test_unknown_host_and_missing_path_are_one_line(env):
    mp = env.mkdir()
    r = env.sshfsm("tb09:/tmp", mp)
    assert r.returncode == 1
    assert r.stderr.startswith("sshfsm: tb09: ") and r.stderr.count("\n") == 1, r.stderr
    r = env.sshfsm("tb01:/no/such/dir", mp)
    assert (r.returncode, r.stderr) == (1, "sshfsm: tb01:/no/such/dir: No such file or directory\n")
    r = env.sshfsm("nosuchuser@tb01:/tmp", mp)
    assert (r.returncode, r.stderr) == (1, "sshfsm: tb01: permission denied (publickey) for "
                                           "nosuchuser\n")
    r = env.sshfsm("-o", "port=2222", "tb02:/tmp", mp)
    assert (r.returncode, r.stderr) == (1, "sshfsm: tb02: connect to %s port 2222: Connection "
                                           "refused\n" % env.bed.host("tb02").ip)
    # a host key that is not in known_hosts is refused, like ssh -o BatchMode=yes
    cfg = os.path.join(env.home, ".ssh", "config")
    old = open(cfg).read()
    try:
        with open(cfg, "w") as f:
            f.write("Host tbalias\n    HostName %s\n    HostKeyAlias tbalias\n\n%s"
                    % (env.bed.host("tb01").ip, old))
        r = env.sshfsm("tbalias:/tmp", mp)
        assert r.returncode == 1 and r.stderr.count("\n") == 1
        assert r.stderr.startswith("sshfsm: tbalias: host key for tbalias is not known"), r.stderr
    finally:
        with open(cfg, "w") as f:
            f.write(old)
    # -o IdentityFile= is used
    key = os.path.join(env.home, "other-key")
    shutil.copy(os.path.join(env.home, ".ssh", "id_ed25519"), key)
    os.chown(key, env.uid, env.gid)
    with env.mount("-o", "IdentityFile=" + key, "tb03:/tmp"):
        pass
    assert not mounted(mp) and sshfsm_pids(mp) == []


def test_allow_other_needs_fuse_conf(env):
    from sshfsmux.standalone.mount_options import fuse_conf_allows_other
    if fuse_conf_allows_other():
        pytest.skip("/etc/fuse.conf has user_allow_other here")
    _, spec = env.remote("tb01")
    r = env.sshfsm("-o", "allow_other", spec, env.mkdir())
    assert r.returncode == 1
    assert r.stderr == ("sshfsm: allow_other needs 'user_allow_other' in /etc/fuse.conf "
                        "(ask your administrator)\n")


# --------------------------------------------------------------------------
# merge semantics
# --------------------------------------------------------------------------

def test_union_of_three_branches_and_create_goes_local(env):
    a_side, a = env.remote("tb01", {"only-a": "A", "both/x-a": "xa", "same": "from a"})
    b_side, b = env.remote("tb02", {"only-b": "B", "both/x-b": "xb"})
    loc = env.mkdir()
    with open(os.path.join(loc, "only-local"), "w") as f:
        f.write("L")
    os.makedirs(os.path.join(loc, "both"))
    os.chown(os.path.join(loc, "both"), env.uid, env.gid)
    os.chown(os.path.join(loc, "only-local"), env.uid, env.gid)
    with env.mount(a, b, loc) as mp:
        out = env.sh("cd %s && ls -A && echo --- && ls both && cat only-a only-b only-local" % mp)
        top, rest = out.split("---\n")
        assert top.split() == ["both", "only-a", "only-b", "only-local", "same"]
        assert rest.split() == ["x-a", "x-b", "ABL"]
        assert ".sshfsmux-chain" not in top
        env.sh("cd %s && echo new > created && mkdir -p newdir/sub && echo s > newdir/sub/f"
               " && echo deep > both/made-here" % mp)
        assert open(os.path.join(loc, "created")).read() == "new\n"
        assert open(os.path.join(loc, "newdir/sub/f")).read() == "s\n"
        assert open(os.path.join(loc, "both/made-here")).read() == "deep\n"
        for side in (a_side, b_side):
            assert not os.path.exists(os.path.join(side, "created"))
            assert not os.path.exists(os.path.join(side, "newdir"))
        # a file created in a directory that only a remote branch has: the
        # directory is made in the local branch with the merged view's mode
        os.makedirs(os.path.join(a_side, "remote-only"))
        os.chmod(os.path.join(a_side, "remote-only"), 0o750)
        os.chown(os.path.join(a_side, "remote-only"), env.uid, env.gid)
        time.sleep(0.1)
        env.sh("cd %s && ls remote-only >/dev/null 2>&1 || sleep 6; echo z > remote-only/z" % mp)
        assert open(os.path.join(loc, "remote-only/z")).read() == "z\n"
        assert stat.S_IMODE(os.stat(os.path.join(loc, "remote-only")).st_mode) == 0o750
        # writes to an existing remote file stay in its branch
        env.sh("echo changed > %s/only-a" % mp)
        assert open(os.path.join(a_side, "only-a")).read() == "changed\n"
        assert not os.path.exists(os.path.join(loc, "only-a"))


def test_replicas_are_one_file_with_both_locations(env):
    a_side, a = env.remote("tb01", {"r.txt": "same content\n"})
    b_side, b = env.remote("tb02", {"r.txt": "same content\n"})
    t = int(time.time()) - 100
    for side in (a_side, b_side):
        os.utime(os.path.join(side, "r.txt"), (t, t))
    with env.mount(a, b) as mp:
        f = os.path.join(mp, "r.txt")
        out = env.sh("ls %s; getfattr --only-values -n user.sshfsmux.location %s; echo;"
                     "getfattr -n user.sshfsmux.conflict %s 2>&1 || true" % (mp, f, f))
        lines = out.splitlines()
        assert lines[0] == "r.txt" and lines[1] == "tb01,tb02", out
        assert "No such attribute" in out
        env.sh("cat %s >/dev/null" % f)               # now replicated here too
        loc = env.sh("getfattr --only-values -n user.sshfsmux.location %s" % f)
        assert loc == "tb01,tb02,%s" % HEAD
        # writing a replicated file writes every replica; they stay replicas
        env.sh("echo rewritten >> %s" % f)
        for side in (a_side, b_side):
            assert open(os.path.join(side, "r.txt")).read() == "same content\nrewritten\n"
        sa, sb = (os.stat(os.path.join(s, "r.txt")) for s in (a_side, b_side))
        assert int(sa.st_mtime) == int(sb.st_mtime) and sa.st_size == sb.st_size
        loc = env.sh("getfattr --only-values -n user.sshfsmux.location %s" % f)
        assert loc == "tb01,tb02"                     # the old local replica is gone
        env.sh("chmod 600 %s" % f)
        for side in (a_side, b_side):
            assert stat.S_IMODE(os.stat(os.path.join(side, "r.txt")).st_mode) == 0o600


def test_conflict_shows_first_and_reports_it(env):
    a_side, a = env.remote("tb01", {"c.txt": "version one\n"})
    b_side, b = env.remote("tb02", {"c.txt": "version two, longer\n"})
    mp = env.mkdir()
    # -f: stays in the foreground, logs to stderr
    p = env.bed.popen_as(env.user, [SSHFSM, "-f", a, b, mp], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: mounted(mp)), "foreground mount did not appear"
        f = os.path.join(mp, "c.txt")
        out = env.sh("ls %s; cat %s; getfattr --only-values -n user.sshfsmux.conflict %s" % (mp, f, f))
        assert out == "c.txt\nversion one\n%s" % b
        loc = env.sh("getfattr --only-values -n user.sshfsmux.location %s" % f)
        assert loc in ("tb01", "tb01,%s" % HEAD)
        # writes touch the visible version only
        env.sh("echo more >> %s" % f)
        assert open(os.path.join(a_side, "c.txt")).read() == "version one\nmore\n"
        assert open(os.path.join(b_side, "c.txt")).read() == "version two, longer\n"
    finally:
        env.unmount(mp)
        out, err = p.communicate(timeout=15)
    assert p.returncode == 0
    lines = [x for x in err.splitlines() if "conflict" in x]
    assert len(lines) == 1 and lines[0].startswith("sshfsm: conflict: /c.txt: %s" % b), err


def test_unlink_rmdir_rename_across_branches(env):
    a_side, a = env.remote("tb01", {"dup": "d", "d1/f": "1", "ren": "moving", "t2": "x",
                                    "dd/a": "a"})
    b_side, b = env.remote("tb02", {"dup": "d", "d1/g": "2", "tgt": "old target",
                                    "empty-both/.keep": "", "dd/b": "b"})
    os.unlink(os.path.join(b_side, "empty-both/.keep"))
    os.makedirs(os.path.join(a_side, "empty-both"))
    os.chown(os.path.join(a_side, "empty-both"), env.uid, env.gid)
    t = int(time.time()) - 50
    for side in (a_side, b_side):
        os.utime(os.path.join(side, "dup"), (t, t))
    with env.mount(a, b) as mp:
        code = """
            import errno, os, sys
            os.chdir(%r)
            def err(f, *a):
                try:
                    f(*a)
                except OSError as e:
                    return errno.errorcode[e.errno]
                return "ok"
            print(err(os.unlink, "dup"))
            print(err(os.rmdir, "d1"))
            print(err(os.rmdir, "empty-both"))
            print(err(os.rename, "ren", "tgt"))
            print(open("tgt").read())
            print(err(os.rename, "dd", "dd2"))
            print(sorted(os.listdir("dd2")), sorted(os.listdir(".")))
        """ % mp
        out = env.py(code).splitlines()
        assert out[:4] == ["ok", "ENOTEMPTY", "ok", "ok"], out
        assert out[4] == "moving"
        assert out[5] == "ok"
        assert out[6] == "['a', 'b'] ['d1', 'dd2', 't2', 'tgt']"
    for side in (a_side, b_side):
        assert not os.path.exists(os.path.join(side, "dup"))
        assert not os.path.exists(os.path.join(side, "empty-both"))
        assert not os.path.exists(os.path.join(side, "dd"))
    assert open(os.path.join(a_side, "tgt")).read() == "moving"
    assert not os.path.exists(os.path.join(b_side, "tgt"))    # one meaning afterwards
    assert sorted(os.listdir(os.path.join(a_side, "dd2"))) == ["a"]
    assert sorted(os.listdir(os.path.join(b_side, "dd2"))) == ["b"]


# --------------------------------------------------------------------------
# cascades and loops
# --------------------------------------------------------------------------

def test_cascade_and_loop_refused(env):
    a_side, a = env.remote("tb01", {"from-a": "A"})
    b_side, b = env.remote("tb02", {"from-b": "B"})
    with env.mount(a) as m1:
        with env.mount(m1, b) as m2:
            out = env.sh("ls %s; cat %s/from-a %s/from-b; echo; cat %s/.sshfsmux-chain"
                         % (m2, m2, m2, m2))
            lines = out.splitlines()
            assert lines[:3] == ["from-a", "from-b", "AB"]
            assert lines[3:] == ["%s:%s" % (HEAD, m2), "%s:%s" % (HEAD, m1)]
            env.sh("echo c > %s/via-m2" % m2)                 # M1 is M2's local branch
            assert open(os.path.join(a_side, "via-m2")).read() == "c\n"
            # mounting M2 over M1 would make M1 include itself
            r = env.sshfsm(m2, m1)
            assert (r.returncode, r.stderr) == (
                1, "sshfsm: loop: %s already includes %s:%s\n" % (m2, HEAD, m1))
            r = env.sshfsm(m1, m1)
            assert (r.returncode, r.stderr) == (
                1, "sshfsm: loop: %s already includes %s:%s\n" % (m1, HEAD, m1))
            assert mounted(m1) and mounted(m2)
    # a branch may contain the mountpoint: the mountpoint is not part of it
    outer = env.mkdir()
    inner = os.path.join(outer, "m")
    os.mkdir(inner)
    os.chown(inner, env.uid, env.gid)
    with open(os.path.join(outer, "o"), "w"):
        pass
    with env.mount(outer, mp=inner):
        assert env.sh("ls -A %s" % inner).split() == ["o"]


# --------------------------------------------------------------------------
# whole-file streaming and replicas
# --------------------------------------------------------------------------

def test_whole_file_streaming_and_replicas(env):
    data = os.urandom(64 << 20)
    a_side, a = env.remote("tb01", {"big": data})
    with open(os.path.join(a_side, "huge"), "wb") as f:   # sparse: cheap to make
        f.truncate(256 << 20)
    os.chown(os.path.join(a_side, "huge"), env.uid, env.gid)
    cache_parent = env.mkdir()
    with env.mount("-o", "cache_dir=" + cache_parent, a) as mp:
        (cache,) = os.listdir(cache_parent)
        cache = os.path.join(cache_parent, cache)
        assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
        t0 = time.monotonic()
        env.sh("cat %s/big > /dev/null" % mp)
        dt = time.monotonic() - t0
        print("\nstreamed 64 MiB in %.2f s (%.0f MB/s)" % (dt, 64 * 1.048576 / dt))
        full = [f for f in os.listdir(cache) if not f.endswith(".part")]
        assert len(full) == 1
        with open(os.path.join(cache, full[0]), "rb") as f:
            assert f.read() == data
        loc = env.sh("getfattr --only-values -n user.sshfsmux.location %s/big" % mp)
        assert loc == "tb01,%s" % HEAD
        # readers of one version share one stream
        with open(os.path.join(a_side, "big2"), "wb") as f:
            f.write(data[::-1])
        os.chown(os.path.join(a_side, "big2"), env.uid, env.gid)
        out = env.sh("for i in 1 2 3 4; do md5sum < %s/big2 & done; wait" % mp)
        assert set(out.split()) == {hashlib.md5(data[::-1]).hexdigest(), "-"}
        t0 = time.monotonic()
        env.sh("cat %s/big > /dev/null" % mp)
        print("re-read from the replica in %.2f s" % (time.monotonic() - t0))
        # a partial read: while open only a .part exists and location does not
        # name this node; after close the partial file is gone
        code = """
            import os, sys
            f = open(%r, "rb")
            assert len(f.read(1 << 20)) == 1 << 20
            print(os.getxattr(%r, "user.sshfsmux.location").decode())
            sys.stdout.flush()
            f.close()
        """ % (mp + "/huge", mp + "/huge")
        out = env.py(code)
        assert out.strip() == "tb01"
        full = sorted(f for f in os.listdir(cache) if not f.endswith(".part"))
        assert len(full) == 2
        assert wait_for(lambda: sorted(os.listdir(cache)) == full, timeout=5), os.listdir(cache)
        loc = env.sh("getfattr --only-values -n user.sshfsmux.location %s/huge" % mp)
        assert loc == "tb01"
        # a changed remote file is streamed again, never served stale
        with open(os.path.join(a_side, "big"), "r+b") as f:
            f.write(b"X" * 10)
        os.utime(os.path.join(a_side, "big"), (time.time() + 5, time.time() + 5))
        time.sleep(1.2)   # past the kernel's attribute cache; open itself revalidates
        out = env.sh("head -c 10 %s/big" % mp)
        assert out == "X" * 10
    assert os.listdir(cache_parent) == []     # the cache went with the mount


def test_read_only_mount(env):
    _, a = env.remote("tb01", {"f": "x"})
    with env.mount("-o", "ro", a) as mp:
        code = """
            import errno, os
            out = []
            for f, args in ((lambda: open(%r, "w"), ()), (os.mkdir, (%r,)),
                            (os.unlink, (%r,)), (os.chmod, (%r, 0o600))):
                try:
                    f(*args)
                    out.append("ok")
                except OSError as e:
                    out.append(errno.errorcode[e.errno])
            print(" ".join(out))
            print(open(%r).read())
        """ % (mp + "/f", mp + "/d", mp + "/f", mp + "/f", mp + "/f")
        assert env.py(code).split() == ["EROFS"] * 4 + ["x"]


def test_errno_values(env):
    a_side, a = env.remote("tb01", {"file": "f", "dir/x": "x"})
    loc = env.mkdir()
    with env.mount(a, loc) as mp:
        code = """
            import errno, os
            os.chdir(%r)
            def e(f, *a):
                try:
                    f(*a)
                except OSError as x:
                    return errno.errorcode[x.errno]
                return "ok"
            open("mine", "w").close()
            os.chmod("mine", 0)
            r = [e(os.stat, "nope"), e(os.mkdir, "dir"), e(os.rmdir, "dir"),
                 e(open, "dir", "w"), e(os.listdir, "file"), e(open, "mine"),
                 e(os.setxattr, "file", "user.other", b"v"),
                 e(os.setxattr, "file", "user.sshfsmux.dp", b"far"),
                 e(os.setxattr, "file", "user.sshfsmux.replication", b"0"),
                 e(os.getxattr, "file", "user.nothing"),
                 e(os.rename, "dir", "file"), e(os.rename, "file", "dir"),
                 e(os.unlink, "dir"), e(os.open, "file", os.O_CREAT | os.O_EXCL | os.O_WRONLY),
                 e(os.rmdir, "file"), e(os.stat, "file/x"),
                 e(os.setxattr, "file", "user.sshfsmux.location", b"x"),
                 e(os.unlink, ".sshfsmux-chain")]
            print(" ".join(r))
        """ % mp
        assert env.py(code).split() == [
            "ENOENT", "EEXIST", "ENOTEMPTY", "EISDIR", "ENOTDIR", "EACCES",
            "ENOTSUP", "EINVAL", "EINVAL", "ENODATA", "ENOTDIR", "EISDIR",
            "EISDIR", "EEXIST", "ENOTDIR", "ENOTDIR", "EPERM", "EACCES"]


def test_hints_are_stored_and_reported(env):
    _, a = env.remote("tb01", {"remote-file": "r"})
    loc = env.mkdir()
    with env.mount(a, loc) as mp:
        env.sh("echo l > %s/local-file" % mp)
        for f in ("remote-file", "local-file"):
            p = os.path.join(mp, f)
            env.sh("setfattr -n user.sshfsmux.dp -v local %s && "
                   "setfattr -n user.sshfsmux.replication -v 3 %s" % (p, p))
            out = env.sh("getfattr -d -m - %s" % p)
            assert 'user.sshfsmux.dp="local"' in out and 'user.sshfsmux.replication="3"' in out
            env.sh("setfattr -n user.sshfsmux.dp -v collocation:grp1 %s" % p)
            assert env.sh("getfattr --only-values -n user.sshfsmux.dp %s" % p) == "collocation:grp1"
            r = env.run(["setfattr", "-n", "user.sshfsmux.dp", "-v", "collocation:", p])
            assert r.returncode != 0 and "Invalid argument" in r.stderr
            r = env.run(["setfattr", "-n", "user.sshfsmux.replication", "-v", "-2", p])
            assert r.returncode != 0 and "Invalid argument" in r.stderr
        # on a local branch the hint is a real user xattr of the file
        assert os.getxattr(os.path.join(loc, "local-file"), "user.sshfsmux.dp") == b"collocation:grp1"
        # hints follow renames
        env.sh("mv %s/remote-file %s/moved" % (mp, mp))
        assert env.sh("getfattr --only-values -n user.sshfsmux.replication %s/moved" % mp) == "3"


# --------------------------------------------------------------------------
# POSIX programs
# --------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["remote", "local+remote"])
def test_posix_programs(env, where):
    a_side, a = env.remote("tb01")
    src = env.mkdir()
    env.sh("cd %s && mkdir -p t/sub && echo one > t/a && echo two > t/sub/b && "
           "ln -s a t/link && chmod 640 t/a && touch -d 2001-02-03 t/sub/b" % src)
    args = [a] if where == "remote" else [a, env.mkdir()]
    with env.mount(*args) as mp:
        env.sh("cd %s && cp -a %s/t copy && diff -r %s/t copy && "
               "test \"$(stat -c %%a copy/a)\" = 640 && "
               "test \"$(stat -c %%Y copy/sub/b)\" = \"$(stat -c %%Y %s/t/sub/b)\" && "
               "test \"$(readlink copy/link)\" = a" % (mp, src, src, src))
        env.sh("cd %s && tar cf t.tar copy && mkdir x && tar xf t.tar -C x && diff -r copy x/copy"
               " && tar cf - copy | tar tf - | sort | head -1 | grep -qx copy/" % mp)
        out = env.py("""
            import os, sqlite3
            os.chdir(%r)
            with open("py.txt", "w") as f:
                f.write("hello\\n" * 1000)
            with open("py.txt", "r+") as f:
                f.seek(6); f.write("HELLO\\n"); f.seek(0)
                assert f.read(12) == "hello\\nHELLO\\n"
            with open("big.bin", "wb") as f:       # stat while writing is never behind
                for i in range(40):
                    f.write(os.urandom(100000))
                    f.flush()
                    assert os.fstat(f.fileno()).st_size == (i + 1) * 100000
                    assert os.stat("big.bin").st_size == (i + 1) * 100000
            os.unlink("big.bin")
            os.truncate("py.txt", 12)
            assert open("py.txt").read() == "hello\\nHELLO\\n"
            db = sqlite3.connect("t.db")
            db.execute("create table t (k integer primary key, v text)")
            with db:
                db.executemany("insert into t (v) values (?)", [("v%%d" %% i,) for i in range(500)])
            db.close()
            db = sqlite3.connect("t.db")
            print(db.execute("select count(*), max(v) from t").fetchone())
            with db:
                db.execute("delete from t where k > 10")
            print(db.execute("pragma integrity_check").fetchone()[0])
        """ % mp)
        assert out.split("\n")[:2] == ["(500, 'v99')", "ok"]
        if shutil.which("git"):
            env.sh("cd %s && git init -q repo && cd repo && git config user.email t@e && "
                   "git config user.name t && cp -a ../copy . && git add -A && "
                   "git commit -qm first && echo more >> copy/a && git commit -qam second && "
                   "git log --oneline | wc -l | grep -qx 2 && git fsck --no-dangling 2>/dev/null && "
                   "git status --short" % mp)
        env.sh("cd %s && mv copy copy2 && rm -r copy2 x t.tar && ls -A | sort" % mp)
        if where == "remote":
            assert sorted(os.listdir(a_side)) == sorted(
                ["py.txt", "t.db"] + (["repo"] if shutil.which("git") else []))


def test_permissions_are_kept(env):
    a_side, a = env.remote("tb01", {"f": "x"})
    loc = env.mkdir()
    with env.mount(a, loc) as mp:
        out = env.sh("cd %s && chmod 0640 f && echo l > g && chmod 0604 g && mkdir d && "
                     "chmod 0711 d && stat -c '%%a %%U' f g d" % mp)
        assert out.split("\n")[:3] == ["640 %s" % env.user, "604 %s" % env.user,
                                       "711 %s" % env.user]
        assert stat.S_IMODE(os.stat(os.path.join(a_side, "f")).st_mode) == 0o640
        assert stat.S_IMODE(os.stat(os.path.join(loc, "g")).st_mode) == 0o604
        out = env.sh("cd %s && umask 027 && touch h && mkdir e && stat -c %%a h e" % mp)
        assert out.split() == ["640", "750"]


# --------------------------------------------------------------------------
# lifecycle
# --------------------------------------------------------------------------

def _kill_sessions(env, host):
    """Drop every ssh connection of the user to `host` (SIGKILL its sshd/sftp)."""
    h = env.bed.host(host)
    for p in h.pids():
        try:
            if os.stat("/proc/%d" % p).st_uid == env.uid:
                os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def test_reconnect_after_a_dropped_connection(env):
    _, a = env.remote("tb01", {"f1": "one", "f2": "two", "f3": "three"})
    _, b = env.remote("tb02", {"g": "gee"})
    with env.mount("-o", "reconnect", a) as mp:
        assert env.sh("cat %s/f1" % mp) == "one"
        _kill_sessions(env, "tb01")
        time.sleep(0.2)
        assert env.sh("cat %s/f2" % mp) == "two"
        env.sh("echo w > %s/written" % mp)
    with env.mount(a, b) as mp:
        assert env.sh("cat %s/f1" % mp) == "one"
        _kill_sessions(env, "tb01")
        time.sleep(0.2)
        r = env.run(["cat", mp + "/f3"])       # no reconnect: that branch fails...
        assert r.returncode == 1 and r.stderr.endswith("Input/output error\n"), r.stderr
        assert env.sh("cat %s/g" % mp) == "gee"  # ...the others keep working


def test_debug_logs_operations_and_sigterm_ends_it(env):
    _, a = env.remote("tb01", {"f": "x"})
    loc = env.mkdir()
    mp = env.mkdir()
    p = env.bed.popen_as(env.user, [SSHFSM, "-d", "-o", "cache_dir=" + loc, a, loc, mp],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: mounted(mp)), "-d mount did not appear"
        assert env.sh("ls -A %s; cat %s/f; stat %s/nope 2>/dev/null || true" % (mp, mp, mp)) == "f\nx"
        os.kill(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=15)
    finally:
        env.unmount(mp)
    assert p.returncode == 0, err
    assert "sshfsm: readdir('/', " in err and "sshfsm: getattr('/nope', None) -> ENOENT" in err
    assert "Traceback" not in err
    assert not mounted(mp) and os.listdir(loc) == []   # the cache inside a branch: hidden, gone


def test_unmount_ends_process_and_removes_cache(env):
    _, a = env.remote("tb01", {"f": "data"})
    cache_parent = env.mkdir()
    mp = env.mkdir()
    r = env.sshfsm("-o", "cache_dir=" + cache_parent + ",reconnect", a, mp)
    assert r.returncode == 0, r.stderr
    pids = sshfsm_pids(mp)
    assert len(pids) == 1
    env.sh("cat %s/f >/dev/null" % mp)
    assert len(os.listdir(cache_parent)) == 1
    r = env.run([FUSERMOUNT, "-u", mp])
    assert r.returncode == 0, r.stderr
    assert wait_gone(pids), "the background process did not exit"
    assert not mounted(mp) and os.listdir(cache_parent) == []
    # no ssh connection of ours left on the host either
    def user_procs():
        out = []
        for p in env.bed.host("tb01").pids():
            try:
                if os.stat("/proc/%d" % p).st_uid == env.uid:
                    out.append(p)
            except OSError:
                pass
        return out
    assert wait_for(lambda: not user_procs()), user_procs()


def test_sigterm_unmounts_cleanly(env):
    _, a = env.remote("tb02", {"f": "data"})
    cache_parent = env.mkdir()
    mp = env.mkdir()
    r = env.sshfsm("-o", "cache_dir=" + cache_parent, a, mp)
    assert r.returncode == 0, r.stderr
    (pid,) = sshfsm_pids(mp)
    env.sh("cat %s/f >/dev/null" % mp)
    os.kill(pid, signal.SIGTERM)
    assert wait_gone([pid]), "SIGTERM did not end the process"
    assert wait_for(lambda: not mounted(mp))
    assert os.listdir(cache_parent) == []


def test_zz_nothing_left_behind(env):
    ours = [(m, o) for m, t, o in mounts() if t == "fuse.sshfsm"
            and "user_id=%d," % env.uid in o + ","]
    assert ours == []
    assert sshfsm_pids(uid=env.uid) == []
