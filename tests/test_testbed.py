"""Tests of the multi-host test bed itself (tests/testbed/, scripts/testbed).

Needs root, iproute2, util-linux and openssh-server; skipped otherwise.
"""

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testbed  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(REPO, "scripts", "testbed")

_why = (testbed.requirements_missing() if sys.platform.startswith("linux")
        else "the multi-host test bed needs Linux")
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


def _uname():
    return f"tbu{secrets.token_hex(3)}"


def _netns():
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _user_exists(name):
    return subprocess.run(["getent", "passwd", name],
                          capture_output=True).returncode == 0


def _alive(pid):
    """True if pid exists and is not a zombie (PID 1 here reaps lazily)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def _wait_no_pids(host, timeout=5.0):
    deadline = time.monotonic() + timeout
    while host.pids() and time.monotonic() < deadline:
        time.sleep(0.02)
    return host.pids()


@pytest.fixture(scope="module")
def hidden():
    d = tempfile.mkdtemp(prefix="tbhide-", dir="/var/tmp")
    os.chmod(d, 0o755)
    with open(os.path.join(d, "secret.txt"), "w") as f:
        f.write("visible only on the local machine\n")
    os.chmod(os.path.join(d, "secret.txt"), 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def bed(hidden):
    with testbed.TestBed() as b:
        b.up(["tb01", "tb02", "tb03"], bw="100mbit", no_python={"tb02"},
             down={"tb03"}, hide_paths=[hidden])
        b.user = b.add_user(_uname()).name
        yield b


def ssh(bed, host, cmd, **kw):
    return bed.run_as(bed.user, ["ssh", host, cmd], capture_output=True,
                      text=True, timeout=30, **kw)


# -- layout ------------------------------------------------------------------

def test_layout(bed):
    assert os.path.basename(bed.dir).startswith("gxptb-")
    assert os.path.dirname(bed.dir) == "/var/tmp"
    assert os.stat(bed.dir).st_mode & 0o777 == 0o755
    assert bed.subnet.startswith("10.200.")
    assert bed.gateway_ip == bed.subnet + ".1"
    assert [h.ip for h in bed.hosts.values()] == \
        [f"{bed.subnet}.{i}" for i in (2, 3, 4)]
    for h in bed.hosts.values():
        assert h.ns.startswith("gxptb" + bed.tag) and h.ns in _netns()
        assert os.stat(os.path.join(h.dir, "keys")).st_mode & 0o777 == 0o700
        assert os.stat(h.tmp_dir).st_mode & 0o7777 == 0o1777
        assert os.stat(h.scratch_dir).st_mode & 0o7777 == 0o1777
    assert len(bed.bridge) <= 15 and os.path.isdir(f"/sys/class/net/{bed.bridge}")
    u = testbed.User(bed.user)
    assert os.stat(u.key).st_uid == u.uid
    assert os.stat(u.key).st_mode & 0o777 == 0o600
    with open(os.path.join(u.home, ".ssh", "config")) as f:
        cfg = f.read()
    assert "Host tb01\n" in cfg and f"User {bed.user}" in cfg
    assert "StrictHostKeyChecking yes" in cfg and "BatchMode yes" in cfg
    with open(os.path.join(u.home, ".ssh", "known_hosts")) as f:
        kh = f.read()
    for h in bed.hosts.values():
        assert f"{h.name},{h.ip} ssh-ed25519 " in kh
    with open(bed.ssh_config) as f:
        assert "IdentityFile %d/.ssh/id_ed25519" in f.read()
    assert os.stat(bed.ssh_config).st_mode & 0o004


# -- ssh and per-host namespaces ------------------------------------------------

def test_ssh_hostname(bed):
    r = ssh(bed, "tb01", "hostname")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "tb01"
    r = ssh(bed, "tb02", "hostname; id -un")
    assert r.stdout.split() == ["tb02", bed.user], r.stderr


def test_bed_ssh_config(bed):
    r = bed.run_as(bed.user, ["ssh", "-F", bed.ssh_config, "tb01", "hostname"],
                   capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "tb01"


def test_host_to_host(bed):
    r = ssh(bed, "tb01", "ssh tb02 hostname; getent hosts tb02")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == "tb02"
    assert lines[1].split() == [bed.host("tb02").ip, "tb02"]


def test_scratch_is_per_host(bed):
    name = f"mark-{secrets.token_hex(4)}"
    path = os.path.join(bed.host("tb01").scratch_dir, name)
    with open(path, "w") as f:
        f.write("x")
    r1 = ssh(bed, "tb01", f"ls {bed.scratch}")
    r2 = ssh(bed, "tb02", f"ls {bed.scratch}")
    assert r1.returncode == 0 and r2.returncode == 0, (r1.stderr, r2.stderr)
    assert name in r1.stdout.split()
    assert name not in r2.stdout.split()
    # writable by the user, lands in the backing dir
    r = ssh(bed, "tb02", f"echo hi > {bed.scratch}/from-tb02")
    assert r.returncode == 0, r.stderr
    assert os.path.exists(os.path.join(bed.host("tb02").scratch_dir, "from-tb02"))
    assert not os.path.exists(os.path.join(bed.scratch, "from-tb02"))


def test_tmp_is_private(bed):
    name = f"tbtmp-{secrets.token_hex(4)}"
    r = ssh(bed, "tb01", f"echo hi > /tmp/{name}; ls /tmp")
    assert r.returncode == 0, r.stderr
    assert name in r.stdout.split()
    assert os.path.exists(os.path.join(bed.host("tb01").tmp_dir, name))
    assert not os.path.exists(os.path.join(bed.host("tb02").tmp_dir, name))
    assert not os.path.exists(os.path.join("/tmp", name))
    r = ssh(bed, "tb02", "ls -a /tmp")
    assert name not in r.stdout.split()


def test_hidden_path(bed, hidden):
    local = bed.run_as(bed.user, ["ls", hidden], capture_output=True, text=True)
    assert local.stdout.split() == ["secret.txt"]
    r = ssh(bed, "tb01", f"ls -A {hidden}; stat -c %a {hidden}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["755"]
    mounts = bed.host("tb01").mounts()
    assert any(m.split()[1] == hidden and m.split()[2] == "tmpfs" for m in mounts)


def test_no_python(bed):
    r = ssh(bed, "tb02", "python3 -c 'print(42)'")
    assert r.returncode == 127
    assert "python3: command not found" in r.stderr
    r = ssh(bed, "tb02", "/usr/bin/python3.11 -c 'print(42)'")
    assert r.returncode == 127
    r = ssh(bed, "tb01", "python3 -c 'print(42)'")
    assert r.returncode == 0 and r.stdout.strip() == "42", r.stderr
    local = bed.run_as(bed.user, ["python3", "-c", "print(42)"],
                       capture_output=True, text=True)
    assert local.stdout.strip() == "42"


def test_down_host_fails_fast(bed):
    t0 = time.monotonic()
    r = ssh(bed, "tb03", "true")
    assert time.monotonic() - t0 < 5
    assert r.returncode == 255
    assert "refused" in r.stderr or "No route" in r.stderr, r.stderr
    with pytest.raises(testbed.TestBedError):
        bed.host("tb03").exec(["true"])


def test_bandwidth_qdisc(bed):
    h = bed.host("tb01")
    out = subprocess.run(["tc", "qdisc", "show", "dev", h.veth],
                         capture_output=True, text=True).stdout
    assert "tbf" in out and "100Mbit" in out, out
    out = h.exec(["tc", "qdisc", "show", "dev", "eth0"],
                 capture_output=True, text=True).stdout
    assert "tbf" in out and "100Mbit" in out, out


def test_run_as_environment(bed):
    r = bed.run_as(bed.user, ["env"], env={"EXTRA": "1"},
                   capture_output=True, text=True)
    env = dict(line.split("=", 1) for line in r.stdout.splitlines())
    u = testbed.User(bed.user)
    assert env["HOME"] == u.home and env["USER"] == bed.user
    assert env["LOGNAME"] == bed.user
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert env["EXTRA"] == "1"
    assert "PYENV_ROOT" not in env and "VIRTUAL_ENV" not in env
    r = bed.run_as(bed.user, "id -u; pwd", capture_output=True, text=True)
    assert r.stdout.split() == [str(u.uid), u.home]


def test_exec_and_pids(bed):
    h = bed.host("tb01")
    r = h.exec(["hostname"], capture_output=True, text=True)
    assert r.stdout.strip() == "tb01"
    r = h.exec("id -un; pwd; ls /tmp >/dev/null", user=bed.user,
               capture_output=True, text=True)
    assert r.stdout.split() == [bed.user, testbed.User(bed.user).home]
    assert _wait_no_pids(h) == []
    # a process left behind by an ssh session shows up in pids()
    r = ssh(bed, "tb01", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.strip())
    assert pid in h.pids()
    assert pid not in bed.host("tb02").pids()
    os.kill(pid, 9)
    assert _wait_no_pids(h) == []


# -- life cycle ----------------------------------------------------------------

def _assert_gone(tag, d, users):
    assert not [n for n in _netns() if n.startswith("gxptb" + tag)]
    assert not [x for x in os.listdir("/sys/class/net") if tag in x]
    assert not os.path.exists(d)
    for u in users:
        assert not _user_exists(u)
        assert not os.path.exists(f"/home/{u}")


def test_kill_and_teardown():
    b = testbed.TestBed()
    user = _uname()
    try:
        b.add_user(user)            # users may come before up()
        t0 = time.monotonic()
        b.up(["ka", "kb"])
        assert time.monotonic() - t0 < 10
        r = b.run_as(user, ["ssh", "ka", "setsid sleep 300 </dev/null "
                            ">/dev/null 2>&1 & echo $!"],
                     capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        left = int(r.stdout)
        assert left in b.host("ka").pids()
        b.host("kb").kill()
        assert not b.host("kb").alive
        assert b.host("kb").pids() == []
        t0 = time.monotonic()
        r = b.run_as(user, ["ssh", "kb", "true"], capture_output=True,
                     text=True, timeout=30)
        assert r.returncode == 255 and time.monotonic() - t0 < 5
        tag, d = b.tag, b.dir
    finally:
        b.teardown()
    _assert_gone(tag, d, [user])
    assert not _alive(left)
    b.teardown()                    # idempotent
    with testbed.TestBed():          # empty bed: nothing to do
        pass


BUSY_LOOP = ("python3 -c 'import time\n"
             "t = time.monotonic(); c = time.process_time()\n"
             "while time.monotonic() - t < 2.0: pass\n"
             "print((time.process_time() - c) / (time.monotonic() - t))'")


def test_cpu_share_caps_a_host():
    """A CPU-bound loop on a host with cpu_share=0.2 gets about a fifth of a
    CPU (uncapped it gets one CPU, or half of one on a busy 2-core machine),
    and the leak check sees the host's cgroup until teardown removes it."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import leaks
    b = testbed.TestBed()
    user = _uname()
    try:
        b.add_user(user)
        b.up(["ca"], cpu_share=0.2)
        cg = b.host("ca").cgroup
        assert cg in leaks.snapshot()["cpu cgroup"]
        with open(os.path.join(cg, "cpu.cfs_quota_us")) as f:
            assert int(f.read()) == 20000
        r = b.run_as(user, ["ssh", "ca", BUSY_LOOP], capture_output=True,
                     text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert 0.1 < float(r.stdout) < 0.3, r.stdout
        r = b.host("ca").exec(BUSY_LOOP, capture_output=True, text=True, timeout=60)
        assert 0.1 < float(r.stdout) < 0.3, r.stdout
        tag, d = b.tag, b.dir
    finally:
        b.teardown()
    _assert_gone(tag, d, [user])
    assert not os.path.exists(cg)
    assert cg not in leaks.snapshot()["cpu cgroup"]
    with pytest.raises(testbed.TestBedError):
        testbed.TestBed().up(["cz"], cpu_share=0)


def test_teardown_after_failed_up():
    b = testbed.TestBed()
    with pytest.raises(testbed.TestBedError):
        b.up(["fa", "fb"], bw="not-a-rate")    # tc fails after netns exist
    tag, d = b.tag, b.dir
    assert [n for n in _netns() if n.startswith("gxptb" + tag)]
    b.teardown()
    _assert_gone(tag, d, [])


def test_sweep_removes_crashed_bed(bed):
    user = _uname()
    code = f"""
import os, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import testbed
b = testbed.TestBed()
b.up(["sa", "sb"], cpu_share=0.5)
b.add_user({user!r})
print(b.dir, flush=True)
os._exit(0)     # crash: no teardown
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    d = r.stdout.strip()
    tag = testbed.TestBed.attach(d).tag
    assert _user_exists(user) and os.path.isdir(d)
    cgroups = [os.path.join(testbed.CGROUP_CPU, "gxptb%s-%s" % (tag, h)) for h in ("sa", "sb")]
    assert all(os.path.isdir(c) for c in cgroups)
    removed = testbed.sweep()
    assert f"bed {d}" in removed
    _assert_gone(tag, d, [user])
    assert not any(os.path.exists(c) for c in cgroups)
    # the live bed of this process is left alone
    assert os.path.isdir(bed.dir) and bed.host("tb01").alive
    assert _user_exists(bed.user)


def test_cli_up_down():
    user = _uname()
    r = subprocess.run([CLI, "up", "3", "--prefix", "cl", "--no-python", "cl02",
                        "--user", user], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    d = r.stdout.strip().splitlines()[-1]
    try:
        b = testbed.TestBed.attach(d)
        assert list(b.hosts) == ["cl01", "cl02", "cl03"]
        assert b.persistent and b.host("cl02").no_python
        out = b.run_as(user, ["ssh", "cl03", "hostname"], capture_output=True,
                       text=True, timeout=30)
        assert out.stdout.strip() == "cl03", out.stderr
        # a persistent bed survives a plain sweep
        testbed.sweep()
        assert os.path.isdir(d)
    finally:
        r = subprocess.run([CLI, "down", d], capture_output=True, text=True,
                           timeout=60)
    assert r.returncode == 0, r.stderr
    _assert_gone(b.tag, d, [user])


def test_fuse_device_mode_is_restored_by_the_last_of_overlapping_runs(tmp_path, monkeypatch):
    """Two runs open /dev/fuse to users and overlap: the first to finish
    must not put 0600 back under the second, and the last one restores the
    mode the first found (each restoring its own saved mode left 0666)."""
    dev, holders = tmp_path / "fuse", tmp_path / "holders"
    dev.write_text("")
    os.chmod(dev, 0o600)
    monkeypatch.setattr(testbed.fuse_access, "FUSE_DEVICE", str(dev))
    monkeypatch.setattr(testbed.fuse_access, "FUSE_HOLDERS", str(holders))
    mode = lambda: os.stat(dev).st_mode & 0o7777  # noqa: E731
    a = testbed.open_fuse_to_users()
    b = testbed.open_fuse_to_users()
    assert mode() == 0o666
    assert not testbed.close_fuse_to_users(a)
    assert mode() == 0o666                      # b still runs
    assert testbed.close_fuse_to_users(b)
    assert mode() == 0o600 and not holders.exists()
    # a run that died holding it: the next clean-up (sweep) restores the mode
    testbed.open_fuse_to_users()
    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in os.listdir(holders):
        if name != "mode":
            os.rename(holders / name, holders / ("%d-dead" % dead.pid))
    assert mode() == 0o666
    assert testbed.close_fuse_to_users(None)
    assert mode() == 0o600 and not holders.exists()
