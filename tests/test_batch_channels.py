"""The slurm and torque channels: agents as batch jobs on a real local Slurm
(Debian's Torque wrappers give `qsub`), connecting back to their parent over an
authenticated TLS link."""
import os
import time

import pytest

import batch_queue

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
