"""The slurm and torque channels: agents as batch jobs on a real local Slurm
(Debian's Torque wrappers give `qsub`), connecting back to their parent over an
authenticated TLS link."""
import os
import random
import re
import socket
import subprocess
import threading
import time

import batch_queue
import pytest

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def slurm():
    if os.getuid() != 0:
        pytest.skip("starting Slurm needs root")
    missing = batch_queue.missing_binaries()
    if missing:
        pytest.skip("missing: %s" % missing)
    s = batch_queue.LocalSlurm()
    s.start()
    try:
        yield s
    finally:
        s.stop()


def user_jobs(slurm, user):
    r = slurm.run(["squeue", "-h", "-u", user, "-o", "%i %T"], check=False)
    return [l for l in r.stdout.splitlines() if l.strip()]


@pytest.mark.parametrize("channel", ["slurm", "torque"])
def test_batch_channel_brings_up_agents_as_jobs(slurm, gxp, channel):
    env = {"SLURM_CONF": slurm.conf_path}
    gxp.ok("use", channel, "head", "job[[1-3]]", "--python", "/usr/bin/python3",
           "--connect-host", "127.0.0.1", "--queue", "debug", env=env)
    gxp.ok("explore", "job[[1-3]]", "--timeout", "40", env=env)
    out = gxp.ok("stat").stdout
    assert out.count("[%s] up" % channel) == 3
    r = gxp.ok("e", "--hosts", "job*", "echo $SLURM_JOB_ID")
    job_ids = r.stdout.split()
    assert len(job_ids) == 3 and len(set(job_ids)) == 3      # each agent is its own job
    assert len(user_jobs(slurm, gxp.user)) == 3
    # The session directory on the parent (the head) held the 0600 job scripts;
    # once the jobs connected back the scripts (one-time tokens) are gone.
    gxp.ok("quit")
    deadline = time.monotonic() + 15
    while user_jobs(slurm, gxp.user) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert user_jobs(slurm, gxp.user) == []
    for jid in job_ids:
        assert slurm.job_state(jid) in ("COMPLETED", "CANCELLED")


def test_batch_job_that_never_starts_is_reported_and_cancelled(slurm, gxp):
    env = {"SLURM_CONF": slurm.conf_path}
    # A job held by the scheduler never runs: the explore must give up within
    # its timeout, say why, and cancel the job.
    gxp.ok("use", "slurm", "head", "held1", "--python", "/usr/bin/python3",
           "--connect-host", "127.0.0.1", "--batch-option=--hold", env=env)
    t0 = time.monotonic()
    r = gxp.run("explore", "held1", "--timeout", "4", env=env)
    assert r.returncode == 1
    assert time.monotonic() - t0 < 15
    assert r.stderr.startswith("gxpc: explore: held1: batch job ") and "did not connect back" in r.stderr
    deadline = time.monotonic() + 10
    while user_jobs(slurm, gxp.user) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert user_jobs(slurm, gxp.user) == []


def _listen_ports(pid):
    r = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True)
    ports = []
    for line in r.stdout.splitlines():
        if "pid=%d," % pid in line:
            ports.append(int(line.split()[3].rsplit(":", 1)[1]))
    return ports


def _rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_connect_back_listener_survives_hostile_peers(slurm, gxp):
    """The session's real TCP listener: no key, a wrong key and 10,000 random
    handshakes are all refused while `gxpc e true` keeps working."""
    env = {"SLURM_CONF": slurm.conf_path}
    gxp.ok("use", "slurm", "head", "job1", "--python", "/usr/bin/python3",
           "--connect-host", "127.0.0.1", env=env)
    gxp.ok("explore", "job1", "--timeout", "40", env=env)
    daemon = gxp.daemon_pids()[0]
    ports = _listen_ports(daemon)
    assert len(ports) == 1
    port = ports[0]
    rss0 = _rss_kib(daemon)
    from test_link_auth import send_and_drain

    from gxpstyle.transport import link_auth
    # A wrong key for the label of the child that already connected.
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    with pytest.raises((link_auth.AuthError, OSError)):
        link_auth.client_handshake(s, "0.1", os.urandom(32), "0" * 64)
    assert send_and_drain(port, b"") == b""

    def attack(seed, n):
        r = random.Random(seed)
        for _ in range(n):
            data = bytes(r.getrandbits(8) for _ in range(r.randrange(1, 120)))
            if r.random() < 0.5:
                data = b"GXA1\x030.1" + data
            assert len(send_and_drain(port, data)) in (0, 32)

    threads = [threading.Thread(target=attack, args=(i, 2500)) for i in range(4)]
    for t in threads:
        t.start()
    runs = 0
    while any(t.is_alive() for t in threads):
        assert gxp.ok("e", "echo ok").stdout.split() == ["ok", "ok"]
        runs += 1
    for t in threads:
        t.join()
    assert runs >= 2
    assert _rss_kib(daemon) - rss0 < 32 * 1024
    assert gxp.ok("e", "echo ok").stdout.split() == ["ok", "ok"]
    gxp.ok("e", "echo ok")
    time.sleep(10.5)   # the next refusal window: the held-back count is logged
    assert len(send_and_drain(port, b"x")) == 0
    deadline = time.monotonic() + 10
    while True:   # the log is written from the daemon's loop, a moment later
        with open(os.path.join(gxp.session_dir, "gxpd.log")) as f:
            lines = [line for line in f if "refused" in line]
        if "more connections" in lines[-1] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    one_by_one = sum(1 for line in lines if "refused a connection" in line)
    held = sum(int(m.group(1)) for m in
               (re.search(r"refused (\d+) more connections", line) for line in lines) if m)
    assert one_by_one + held >= 9000      # every refusal is counted ...
    assert len(lines) < 200               # ... in a log that a flood cannot fill
