"""GMount over the explored tree, on the test bed, as an ordinary user.

Exports and mount points live in /tmp, which is private to every test-bed host
(and the head's own /tmp), so each node's export really is its own disk.
"""
import os
import socket
import stat
import time
import uuid

import pytest
from conftest import module_bed, venv_dir

pytestmark = pytest.mark.testbed

HOSTS = ["tg%02d" % i for i in range(1, 17)]


@pytest.fixture(scope="module")
def bed():
    with module_bed(HOSTS, "gxpm", fuse=True) as b:
        yield b
    leftover = [l for l in open("/proc/mounts") if "sshfsmux" in l or "gxpmnt" in l]
    assert leftover == [], leftover


@pytest.fixture
def g(bed, make_gxp):
    return make_gxp(bed=bed, user=next(iter(bed.users)))


def fuse_mounts(bed, names):
    out = {}
    for n in names:
        out[n] = [l for l in bed.host(n).mounts() if " fuse" in l]
    return out


def head_fuse_mounts(mountpoint):
    with open("/proc/mounts") as f:
        return [l for l in f if l.split()[1] == mountpoint]


def explore(g, hosts):
    g.ok("use", "ssh", "head", "tg*")
    g.ok("explore", *hosts)


def test_gmount_every_node_sees_every_file_and_umount_is_clean(bed, g):
    hosts = HOSTS
    explore(g, hosts)
    tag = g.new_tag()
    export, mnt = "/tmp/gxpexp-" + tag, "/tmp/gxpmnt-" + tag
    g.ok("e", "mkdir -p %s %s" % (export, mnt))
    t0 = time.monotonic()
    g.ok("mount", export, mnt)
    mount_seconds = time.monotonic() - t0
    # Every node writes one file through the mount ...
    g.ok("e", "echo from $GXP_HOSTNAME > %s/from-$GXP_HOSTNAME" % mnt)
    # ... which lands in that node's own export ...
    for n in hosts:
        assert os.listdir(os.path.join(bed.host(n).tmp_dir, "gxpexp-" + tag)) == ["from-" + n]
    # ... and every node sees all of them.
    r = g.ok("e", "-b", "ls %s | sort | tr '\\n' ' '" % mnt)
    expected = " ".join(sorted(["from-" + n for n in hosts] + ["from-head"]))
    assert r.stdout.count(expected) == 1 and "(%d)" % (len(hosts) + 1) in r.stdout
    r = g.ok("e", "--hosts", "tg01",
             "cat %s/from-tg16; getfattr --only-values -n user.sshfsmux.location %s/from-tg16" % (mnt, mnt))
    assert r.stdout.splitlines()[0] == "from tg16"
    assert "tg16" in r.stdout.splitlines()[1]
    g.ok("umount")
    assert head_fuse_mounts(mnt) == []
    assert all(v == [] for v in fuse_mounts(bed, hosts).values())
    assert mount_seconds < 30


def test_umount_after_a_node_died_leaves_no_stale_mount(bed, g):
    hosts = HOSTS[:4]
    explore(g, hosts)
    tag = g.new_tag()
    export, mnt = "/tmp/gxpexp-" + tag, "/tmp/gxpmnt-" + tag
    g.ok("e", "mkdir -p %s %s" % (export, mnt))
    g.ok("mount", export, mnt)
    g.ok("e", "echo x > %s/f-$GXP_HOSTNAME" % mnt)
    bed.host("tg03").kill()
    time.sleep(1)
    # The survivors still work: the dead node's branch is skipped, not hung on.
    r = g.run("e", "ls %s" % mnt, timeout=60)
    assert "f-tg01" in r.stdout
    r = g.run("umount", timeout=60)
    assert r.returncode == 0, r.stderr
    assert head_fuse_mounts(mnt) == []
    assert all(v == [] for v in fuse_mounts(bed, ["tg01", "tg02", "tg04"]).values())
    bed.host("tg03").plug()


def test_data_port_refuses_a_wrong_key(bed, g):
    from gxpstyle.transport import link_auth
    explore(g, HOSTS[:1])
    tag = g.new_tag()
    export, mnt = "/tmp/gxpexp-" + tag, "/tmp/gxpmnt-" + tag
    g.ok("e", "mkdir -p %s %s" % (export, mnt))
    g.ok("mount", export, mnt)
    try:
        # The head's own GMount service is the only agent of this session in the
        # head's network namespace: its listening port is the data port.
        import subprocess
        pids = set(g.agent_pids())
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
        ports = [int(l.split()[3].rsplit(":", 1)[1]) for l in out.splitlines()
                 if any("pid=%d," % p in l for p in pids)]
        assert len(ports) == 1, out
        for key in (os.urandom(32), b""):
            s = socket.create_connection(("127.0.0.1", ports[0]), timeout=5)
            with pytest.raises((link_auth.AuthError, OSError)):
                link_auth.client_handshake(s, "fs", key or os.urandom(32), "0" * 64, timeout=5)
        # The mount still serves its owner.
        assert g.ok("e", "--hosts", "tg01", "ls %s" % mnt).returncode == 0
    finally:
        g.ok("umount")


def test_cascade_through_a_gateway(bed, g):
    """The head mounts, over plain SFTP, the GMount view of its gateway tg01,
    which merges tg01's export with tg02's (reached from tg01 only)."""
    import subprocess
    user = next(iter(bed.users))
    g.ok("use", "ssh", "head", "tg01")
    g.ok("use", "ssh", "tg01", "tg02")
    g.ok("explore", "tg01", "tg02")
    tag = g.new_tag()
    export, mnt, casc = "/tmp/gxpexp-" + tag, "/tmp/gxpmnt-" + tag, "/tmp/gxpcasc-" + tag
    g.ok("e", "mkdir -p %s %s" % (export, mnt))
    g.ok("e", "--hosts", "tg02", "echo deep > %s/deep.txt" % export)
    g.ok("mount", export, mnt)
    bed.run_as(user, ["mkdir", "-p", casc], check=True)
    sshfsm = os.path.join(venv_dir(), "bin", "sshfsm")
    try:
        r = bed.run_as(user, [sshfsm, "tg01:" + mnt, casc], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        r = bed.run_as(user, ["cat", casc + "/deep.txt"], capture_output=True, text=True)
        assert r.stdout == "deep\n"
        # A file written through the cascade lands in the gateway's own export.
        bed.run_as(user, ["sh", "-c", "echo up > %s/up.txt" % casc], check=True)
        assert os.path.exists(os.path.join(bed.host("tg01").tmp_dir, "gxpexp-" + tag, "up.txt"))
    finally:
        bed.run_as(user, ["fusermount3", "-u", casc])
        subprocess.run(["rm", "-rf", casc])
        g.ok("umount")
    assert head_fuse_mounts(casc) == [] and head_fuse_mounts(mnt) == []


@pytest.mark.parametrize("cipher", ["tls", "none"])
def test_data_channel_on_the_wire(bed, g, cipher):
    """tcpdump on the bed's bridge while tg01 reads tg02's file through GMount:
    with TLS the file's marker never appears; with cipher=none it does (which
    proves the capture sees the transfer)."""
    import signal
    import subprocess
    import tempfile
    g.ok("use", "ssh", "head", "tg*")
    g.ok("explore", "tg01", "tg02")
    tag = g.new_tag()
    export, mnt = "/tmp/gxpexp-" + tag, "/tmp/gxpmnt-" + tag
    marker = "GXPMARKER%s" % uuid.uuid4().hex
    g.ok("e", "mkdir -p %s %s" % (export, mnt))
    g.ok("e", "--hosts", "tg02", "python3 -c 'print(\"%s\" * 20000)' > %s/marker.txt" % (marker, export))
    g.ok("mount", export, mnt, *(["-o", "cipher=none"] if cipher == "none" else []))
    pcap = tempfile.mktemp(prefix="gxpcap-", suffix=".pcap", dir="/var/tmp")
    dump = subprocess.Popen(["tcpdump", "-i", bed.bridge, "-U", "-s", "0", "-w", pcap, "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        r = g.ok("e", "--hosts", "tg01", "grep -c %s %s/marker.txt" % (marker, mnt))
        assert r.stdout.strip() == "1"
        time.sleep(0.5)
    finally:
        dump.send_signal(signal.SIGINT)
        dump.wait(10)
        g.ok("umount")
    with open(pcap, "rb") as f:
        captured = f.read()
    os.unlink(pcap)
    assert len(captured) > 20000 * len(marker) // 2     # the transfer was captured
    if cipher == "tls":
        assert marker.encode() not in captured
    else:
        assert marker.encode() in captured


def _service_port(g):
    import subprocess
    pids = set(g.agent_pids())
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    found = [(int(l.split()[3].rsplit(":", 1)[1]), int(l.split("pid=")[1].split(",")[0]))
             for l in out.splitlines() if any("pid=%d," % p in l for p in pids)]
    assert len(found) == 1, out
    return found[0]


def test_data_listener_survives_fuzz_and_session_dirs_are_private(bed, g):
    import random
    import threading

    from test_link_auth import send_and_drain
    g.ok("use", "ssh", "head", "tg*")
    g.ok("explore", "tg01", "tg02")
    tag = g.new_tag()
    export, mnt = "/tmp/gxpexp-" + tag, "/tmp/gxpmnt-" + tag
    g.ok("e", "mkdir -p %s %s" % (export, mnt))
    g.ok("mount", export, mnt)
    port, pid = _service_port(g)
    rss0 = int([l for l in open("/proc/%d/status" % pid) if l.startswith("VmRSS:")][0].split()[1])

    def attack(seed):
        r = random.Random(seed)
        for _ in range(2500):
            data = bytes(r.getrandbits(8) for _ in range(r.randrange(1, 120)))
            if r.random() < 0.5:
                data = b"GXA1\x02fs" + data
            assert len(send_and_drain(port, data)) in (0, 32)

    threads = [threading.Thread(target=attack, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    runs = 0
    while any(t.is_alive() for t in threads):
        assert g.ok("e", "ls %s > /dev/null && echo ok" % mnt).stdout.split() == ["ok"] * 3
        runs += 1
    for t in threads:
        t.join()
    assert runs >= 2
    rss1 = int([l for l in open("/proc/%d/status" % pid) if l.startswith("VmRSS:")][0].split()[1])
    assert rss1 - rss0 < 32 * 1024
    # The agent's per-session directory on a host (TLS files, replicas) is 0700:
    # another user on that host cannot list it.
    other = "gxpo" + uuid.uuid4().hex[:6]
    bed.add_user(other)
    try:
        h = bed.host("tg01")
        dirs = [d for d in os.listdir(h.tmp_dir) if d.startswith("gxp-")]
        assert len(dirs) == 1
        r = h.exec(["ls", "/tmp/" + dirs[0]], user=other, capture_output=True, text=True)
        assert r.returncode != 0 and "Permission denied" in r.stderr
        assert stat.S_IMODE(os.stat(os.path.join(h.tmp_dir, dirs[0])).st_mode) == 0o700
    finally:
        bed.remove_user(other)
    # quit without umount: every mount goes, and so does every per-session directory.
    g.ok("quit")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (head_fuse_mounts(mnt)
                                           or any(fuse_mounts(bed, ["tg01", "tg02"]).values())):
        time.sleep(0.1)
    assert head_fuse_mounts(mnt) == []
    assert all(v == [] for v in fuse_mounts(bed, ["tg01", "tg02"]).values())
    for n in ("tg01", "tg02"):
        assert [d for d in os.listdir(bed.host(n).tmp_dir) if d.startswith("gxp-")] == []


MAKEFILE = """\
PARTS := $(addprefix part,1 2 3 4 5 6 7 8)
all: total.txt
part%:
\t@sleep 0.3; echo "$@ $$(hostname)" > $@
total.txt: $(PARTS)
\tcat $^ > $@
broken:
\techo "about to fail" >&2; exit 4
"""


def test_small_make_runs_recipes_on_the_nodes_as_an_ordinary_user(bed, g):
    hosts = HOSTS[4:8]   # tg03 was killed by an earlier test
    explore(g, hosts)
    tag = g.new_tag()
    export, mnt = "/tmp/gxpexp-" + tag, "/tmp/gxpmnt-" + tag
    g.ok("e", "mkdir -p %s %s" % (export, mnt))
    g.ok("mount", export, mnt)
    try:
        work = os.path.join(mnt, "work")
        bed.run_as(g.user, ["sh", "-c", "mkdir %s && cat > %s/Makefile" % (work, work)],
                   input=MAKEFILE, capture_output=True, text=True, check=True)
        r = g.run("make", "-j8", cwd=work)
        assert r.returncode == 0, r.stderr
        total = bed.run_as(g.user, ["cat", os.path.join(work, "total.txt")],
                           capture_output=True, text=True, check=True).stdout.splitlines()
        assert [line.split()[0] for line in total] == ["part%d" % i for i in range(1, 9)]
        ran_on = {line.split()[1] for line in total}
        assert len(ran_on & set(hosts)) >= 2, ran_on
        # each part was written where its recipe ran: into that node's own export
        for line in total:
            part, host = line.split()
            if host in hosts:
                assert os.path.exists(os.path.join(bed.host(host).tmp_dir, "gxpexp-" + tag, "work", part))
        # a failing recipe: make's own message and status, the recipe's stderr
        r = g.run("make", "broken", cwd=work)
        assert r.returncode == 2
        assert "about to fail" in r.stderr and "[Makefile:8: broken] Error 4" in r.stderr
        # not on the shared mount: refused in one line, nothing run
        r = g.run("make", cwd="/tmp")
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
        assert "not on the session's shared mount" in r.stderr
    finally:
        g.ok("umount")
