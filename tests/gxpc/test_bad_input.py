"""What a careless or hostile user types never damages a node nor leaves a
trace (issue 25): bcast and plot write only regular files, inputs are read under
stated caps, a mountpoint or cache directory is never made behind the user's
back, a session path that cannot work is refused before anything is made, masks
never silently empty, a killed make leaves nothing after quit, exit codes keep
to the README's table, and many clients cannot grow the daemon without bound.
Run as an ordinary user where the test bed can make one, from the installed venv."""
from __future__ import annotations

import glob
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import time

import pytest
from conftest import venv_dir

EXCEPTION_NAME = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception)\b|Traceback")


def one_line(r, says: str, status: int) -> None:
    """Exit `status` with one line on stderr that says `says`, in words."""
    assert r.returncode == status, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1, r.stderr
    assert says in r.stderr, r.stderr
    assert not EXCEPTION_NAME.search(r.stderr), r.stderr


def give(gxp, path: str) -> str:
    """Hand a path root made to the test's user."""
    if gxp.user:
        pw = pwd.getpwnam(gxp.user)
        os.lchown(path, pw.pw_uid, pw.pw_gid)
    return path


def user_dir(gxp, prefix: str) -> str:
    """A scratch directory of the test's user, removed when the session is quit."""
    d = "/tmp/%s-%s" % (prefix, gxp.new_tag())
    os.mkdir(d, 0o755)
    return give(gxp, d)


def _python_as_user(gxp, code: str, popen: bool = False, **kw):
    """The venv's python running `code` as the test's user (the daemon serves
    only its own user): a CompletedProcess, or a Popen with `popen`."""
    argv = [os.path.join(venv_dir(), "bin", "python"), "-c", code]
    kw.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if gxp.user:
        how = gxp.bed.popen_as if popen else gxp.bed.run_as
        return how(gxp.user, argv, env={"GXP_SESSION": gxp.session_dir}, **kw)
    how = subprocess.Popen if popen else subprocess.run
    return how(argv, env=dict(os.environ, GXP_SESSION=gxp.session_dir), **kw)


def as_user_python(gxp, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return _python_as_user(gxp, code, timeout=timeout)


# -- 1. bcast ------------------------------------------------------------------------
def test_bcast_never_replaces_a_special_file(gxp):
    gxp.ok("explore", "--local", "2")
    d = user_dir(gxp, "gxpbi-bc")
    src = os.path.join(d, "src")
    with open(src, "w") as f:
        f.write("data\n")
    give(gxp, src)
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo)
    give(gxp, fifo)
    sock_path = os.path.join(d, "sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock_path)
    s.close()
    give(gxp, sock_path)
    for dest, is_kind in ((fifo, stat.S_ISFIFO), (sock_path, stat.S_ISSOCK), ("/dev/null", stat.S_ISCHR)):
        r = gxp.run("bcast", src, dest)
        assert r.returncode == 1, r.stderr
        lines = r.stderr.splitlines()
        assert sorted(lines) == sorted("%s: %s: not a regular file" % (n, dest)
                                       for n in ("head", "local1", "local2")), r.stderr
        assert is_kind(os.lstat(dest).st_mode), dest
    assert sorted(os.listdir(d)) == ["fifo", "sock", "src"]    # no temporary left
    # a regular DEST is still replaced
    gxp.ok("bcast", src, os.path.join(d, "copy"))
    assert open(os.path.join(d, "copy")).read() == "data\n"


# -- 2. plot -------------------------------------------------------------------------
def _plot(tmp_path, *args, limit_mb: int = 512):
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))
    env = {"PATH": os.path.join(venv_dir(), "bin") + ":/usr/bin:/bin", "HOME": str(tmp_path)}
    argv = [os.path.join(venv_dir(), "bin", "gxpc"), "--session", str(tmp_path / "none"), "plot"]
    return subprocess.run(argv + list(args), env=env, capture_output=True, text=True, timeout=60,
                          preexec_fn=limit)


def test_plot_reads_under_a_cap_and_writes_only_a_named_image(tmp_path):
    out = str(tmp_path / "out.png")
    one_line(_plot(tmp_path, "/dev/zero", "-o", out), "/dev/zero: not a regular file", 2)
    big = tmp_path / "big.trace"
    with open(big, "wb") as f:
        f.truncate(17 << 20)            # sparse: refused by its size, never read
    one_line(_plot(tmp_path, str(big), "-o", out), "over the 16 MiB", 2)
    noline = tmp_path / "noline.trace"
    noline.write_bytes(b"{" * (1 << 20))
    one_line(_plot(tmp_path, str(noline), "-o", out), "a line over 64 KiB", 2)
    binary = tmp_path / "bin.trace"
    binary.write_bytes(bytes(range(256)) * 16)
    one_line(_plot(tmp_path, str(binary), "-o", out), "bin.trace:1: not text", 2)
    many = tmp_path / "many.trace"
    many.write_text("".join(json.dumps({"kind": "recipe", "node": "n%d" % i, "start": 1, "end": 2})
                            + "\n" for i in range(20000)))
    one_line(_plot(tmp_path, str(many), "-o", out), "more than 256 nodes", 2)
    for bad in (str(tmp_path / "noext"), "/dev/full", str(tmp_path / "x.txt")):
        one_line(_plot(tmp_path, str(many), "-o", bad), "name the image with .png, .svg or .pdf", 2)
    assert not os.path.exists("/dev/full.png") and not os.path.exists(tmp_path / "noext.png")
    os.mkfifo(tmp_path / "fifo.png")
    one_line(_plot(tmp_path, str(many), "-o", str(tmp_path / "fifo.png")), "not a regular file", 2)
    assert not os.path.exists(out)


# -- 3. sshfsm -o cache_dir ------------------------------------------------------------
def test_sshfsm_cache_dir_is_made_private_under_an_existing_parent(tmp_path):
    if not os.path.exists("/dev/fuse") or os.getuid() != 0:
        pytest.skip("needs /dev/fuse and root")
    sshfsm = os.path.join(venv_dir(), "bin", "sshfsm")
    export, mnt = tmp_path / "export", tmp_path / "mnt"
    export.mkdir()
    mnt.mkdir()

    def mount(cache_dir):
        return subprocess.run([sshfsm, "-o", "cache_dir=%s" % cache_dir, str(export), str(mnt)],
                              capture_output=True, text=True, timeout=60)
    old = os.umask(0o022)
    try:
        r = mount(tmp_path / "a" / "b" / "c")
        assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
        assert "%s: no such directory" % (tmp_path / "a" / "b") in r.stderr, r.stderr
        assert not os.path.exists(tmp_path / "a")
        r = mount(tmp_path / "cache")
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(os.stat(tmp_path / "cache").st_mode) == 0o700
    finally:
        os.umask(old)
        deadline = time.monotonic() + 10
        while os.path.ismount(str(mnt)) and time.monotonic() < deadline:
            subprocess.run(["fusermount", "-u", str(mnt)], capture_output=True, timeout=30)
            time.sleep(0.1)


# -- 4. gxpc mount ---------------------------------------------------------------------
def test_mount_refuses_a_missing_mountpoint_and_makes_nothing(gxp):
    gxp.ok("explore", "--local", "1")
    export = user_dir(gxp, "gxpbi-exp")
    top = "/tmp/gxpbi-nomnt-%s" % gxp.new_tag()
    r = gxp.run("mount", export, top + "/a/b")
    assert r.returncode == 1, r.stderr
    assert "mountpoint %s/a/b: no such directory" % top in r.stderr, r.stderr
    assert not os.path.exists(top)
    assert "mount: head:" in r.stderr and not EXCEPTION_NAME.search(r.stderr)


def test_mount_takes_a_timeout_in_range(gxp):
    one_line(gxp.run("mount", "-o", "timeout=0", "/a", "/b"), "timeout must be from 1 to 3600", 2)
    one_line(gxp.run("mount", "-o", "timeout=x", "/a", "/b"), "timeout takes whole seconds", 2)
    gxp.ok("explore", "--local", "1")
    # accepted and passed on: the node answers about the export, not the option
    r = gxp.run("mount", "-o", "timeout=5", "/nonexistent-gxpbi-exp", "/nonexistent-gxpbi-mnt")
    assert r.returncode == 1 and "export /nonexistent-gxpbi-exp: no such directory" in r.stderr, r.stderr


# -- 5. session path -------------------------------------------------------------------
def test_a_session_path_too_long_for_a_socket_is_refused_and_nothing_made():
    gxpc = os.path.join(venv_dir(), "bin", "gxpc")
    top = "/tmp/gxpt-long-%d" % os.getpid()
    session = os.path.join(top, "d" * 120)
    env = {"PATH": os.path.join(venv_dir(), "bin") + ":/usr/bin:/bin"}
    try:
        for verb in (["explore", "--local", "1"], ["stat"], ["quit"]):
            r = subprocess.run([gxpc, "--session", session] + verb, capture_output=True, text=True,
                               env=env, timeout=60)
            one_line(r, "a session directory may have at most 97", 2)
            assert not os.path.exists(top)
    finally:
        subprocess.run(["pkill", "-f", "gxpstyle.head.daemon --session %s" % session])
        subprocess.run(["rm", "-rf", top])


# -- 6. masks --------------------------------------------------------------------------
def test_smask_and_savemask_never_select_nothing(gxp):
    gxp.ok("explore", "--local", "2")
    one_line(gxp.run("smask"), "smask: no command has run yet", 2)
    one_line(gxp.run("savemask", "m"), "savemask: no command has run yet", 2)
    assert len(gxp.ok("e", "echo x").stdout.split()) == 3          # the selection is unchanged
    gxp.run("e", "false")
    one_line(gxp.run("smask"), "smask: the last command succeeded on no node", 2)
    one_line(gxp.run("savemask", "m"), "savemask: the last command succeeded on no node", 2)
    assert len(gxp.ok("e", "echo x").stdout.split()) == 3
    one_line(gxp.run("gexec", "m", "true"), "no saved mask named 'm'", 2)


# -- 7. a killed make ------------------------------------------------------------------
def test_quit_removes_what_a_killed_make_left(gxp):
    if not subprocess.run(["sh", "-c", "command -v make && command -v cc"], capture_output=True).stdout:
        pytest.skip("needs make and a C compiler (the relay)")
    gxp.ok("explore", "--local", "1")
    d = user_dir(gxp, "gxpbi-mk")
    with open(os.path.join(d, "Makefile"), "w") as f:
        f.write("all:\n\tsleep 30\n")
    before = set(glob.glob("/tmp/gxpmake-*"))
    p = gxp.popen("make", cwd=d, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        left = []
        while time.monotonic() < deadline and not left:
            left = [x for x in set(glob.glob("/tmp/gxpmake-*")) - before
                    if os.path.exists(os.path.join(x, "relay"))]
            time.sleep(0.1)
        assert left, "no relay directory appeared"
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    try:
        assert all(os.path.exists(x) for x in left)     # SIGKILL: nothing could clean up
        gxp.ok("quit")
        assert not any(os.path.exists(x) for x in left), left
    finally:
        for x in left:
            shutil.rmtree(x, ignore_errors=True)


# -- 8. exit codes and words -----------------------------------------------------------
def test_a_joblog_that_is_not_a_regular_file_is_usage_not_no_session(gxp):
    one_line(gxp.run("make", "--joblog", "/dev/full", "-n"), "--joblog /dev/full: not a regular file", 2)
    one_line(gxp.run("make", "--trace=/dev/null", "-n"), "--trace /dev/null: not a regular file", 2)


def test_a_joblog_on_a_full_disk_is_an_io_error(gxp):
    if os.getuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    d = user_dir(gxp, "gxpbi-full")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0777", "tmpfs", d], check=True)
    try:
        fd = os.open(os.path.join(d, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"x" * 4096):
                pass
        except OSError:         # full
            pass
        finally:
            os.close(fd)
        r = gxp.run("make", "--joblog", os.path.join(d, "jobs"), "-n")
        one_line(r, "cannot write the job log: No space left on device", 1)
    finally:
        subprocess.run(["umount", "-l", d])


def test_where_with_a_path_longer_than_path_max_is_usage(gxp):
    one_line(gxp.run("where", "/" + "a" * 5000), "longer than a path can be", 2)


def test_a_deep_or_huge_cluster_file_gets_one_line(gxp):
    d = user_dir(gxp, "gxpbi-cfg")
    cases = {"deep.yaml": "explore:\n  " + "[" * 50000 + "\n",
             "deep.json": '{"explore": ' + '{"a": ' * 50000 + "1" + "}" * 50001 + "\n",
             "huge.yaml": "explore: [h1]\nx: " + "a" * (3 << 20) + "\n"}
    for name, text in cases.items():
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        give(gxp, path)
        t0 = time.monotonic()
        r = gxp.run("explore", "--config", path)
        says = "over the 1 MiB" if name.startswith("huge") else "nested more than 64 levels deep"
        one_line(r, says, 2)
        assert time.monotonic() - t0 < 20
    one_line(gxp.run("explore", "--config", "/dev/zero"), "/dev/zero: not a regular file", 2)


def test_the_daemon_checks_cd_itself(gxp):
    gxp.ok("explore", "--local", "1")
    r = as_user_python(gxp, "from gxpstyle.gxpc.client import Client\n"
                            "c = Client(); c.connect(False)\n"
                            "print(c.call('cd', {'dir': '/nonexistent-gxpbi-dir'}))\n")
    assert r.returncode == 0, r.stderr
    assert "(2, {'error': 'cd: /nonexistent-gxpbi-dir: no such directory on the head'})" in r.stdout
    assert len(gxp.ok("e", "pwd").stdout.split()) == 2


def test_use_refuses_control_characters_in_patterns(gxp):
    one_line(gxp.run("use", "ssh", "head", "a\nb"), "has a control character", 2)
    one_line(gxp.run("use", "ssh", "a\tb", "c"), "has a control character", 2)
    gxp.ok("use", "ssh", "head", "tb[[01-02]]")
    assert gxp.ok("use").stdout == "use ssh head tb[[01-02]]\n"


# -- 9. many clients ---------------------------------------------------------------------
HALF_FRAMES = """
import os, socket, sys
from gxpstyle.head import session
path = session.socket_path(os.environ["GXP_SESSION"])
conns, closed = [], 0
for i in range(60):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    try:    # a frame that says 4 MiB and stops 100 bytes short
        s.sendall((4 << 20).to_bytes(4, "big") + b"x" * ((4 << 20) - 100))
    except OSError:
        closed += 1
        s.close()
        continue
    conns.append(s)
for s in conns:
    s.settimeout(0.2)
    try:
        if s.recv(1) == b"":
            closed += 1
    except socket.timeout:
        pass
    except OSError:
        closed += 1
print("closed", closed, flush=True)
sys.stdin.read()    # hold the connections until the test has measured
"""


def _rss_kb(pid: int) -> int:
    with open("/proc/%d/status" % pid) as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def test_many_half_sent_frames_do_not_grow_the_daemon_without_bound(gxp):
    gxp.ok("explore", "--local", "1")
    [daemon] = gxp.daemon_pids()
    before = _rss_kb(daemon)
    p = _python_as_user(gxp, HALF_FRAMES, popen=True, stdin=subprocess.PIPE)
    try:
        line = p.stdout.readline()
        grown = _rss_kb(daemon) - before      # while the client holds its connections
    finally:
        p.stdin.close()
        p.wait(timeout=60)
    assert line.startswith("closed "), p.stderr.read()
    assert int(line.split()[1]) >= 40, line     # 64 MiB holds 16 of them: the rest were closed
    assert grown < 120 << 10, "daemon grew %d KiB" % grown
    with open(os.path.join(gxp.session_dir, "gxpd.log")) as f:
        assert "the most the session daemon holds" in f.read()
    assert len(gxp.ok("e", "true").stdout.split()) == 0
    assert gxp.ok("stat").stdout.startswith("2 nodes up")


def test_the_client_budget_refuses_connections_past_its_cap():
    from gxpstyle.head.client_links import ClientBudget
    b = ClientBudget(max_clients=2)
    assert b.admit_problem(1) is None
    assert "2 clients are connected" in (b.admit_problem(2) or "")
    assert b.log_line("x") == "x" and b.log_line("y") is None


def test_mount_hands_its_timeout_to_every_node():
    """The head passes -o timeout=N to each node's mount service, whose
    config already takes it (sshfsmux/gmount/node.py start)."""
    from types import SimpleNamespace

    from sshfsmux.gmount import service as gmount_control

    configs = []
    nodes = [SimpleNamespace(id="0", up=True, role="", hostname="h0", name="head"),
             SimpleNamespace(id="0.1", up=True, role="", hostname="h1", name="n1")]
    replicas = SimpleNamespace(add_keeper=lambda keeper: None)
    head = SimpleNamespace(
        service=lambda iface: replicas, nodes=lambda: nodes,
        name_of=lambda nid: {n.id: n.name for n in nodes}[nid],
        push_modules=lambda modules, nodes: None,
        spawn_role=lambda nid, name, role, module, config, timeout, up: configs.append(config))
    svc = gmount_control.GMountService(head)
    args = {"export": "/e", "mountpoint": "/m", "timeout": 7}
    gmount_control.MOUNT_ARGS.check(args, "mount")
    svc.request_mount("c1", 1, args)
    assert [c["timeout"] for c in configs] == [7, 7]
    with pytest.raises(Exception, match="from 1 to 3600"):
        gmount_control.MOUNT_ARGS.check(dict(args, timeout=3601), "mount")
