"""Tests of the local Slurm/Torque test infrastructure (tests/batch_queue.py)."""

import os
import shutil
import sys
import time
from typing import Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import batch_queue  # noqa: E402
from batch_queue import LocalSlurm, TemporaryUser, temporary_user  # noqa: E402

if os.geteuid() != 0:
    pytest.skip("LocalSlurm needs root", allow_module_level=True)
_missing = batch_queue.missing_binaries(batch_queue.REQUIRED_BINARIES + ("useradd", "userdel"))
if _missing:
    pytest.skip("missing programs: %s (apt-get install -y slurm-wlm munge "
                "slurm-wlm-torque)" % ", ".join(_missing), allow_module_level=True)
needs_qsub = pytest.mark.skipif(shutil.which("qsub") is None or shutil.which("qdel") is None,
                                reason="qsub/qdel missing (apt-get install -y slurm-wlm-torque)")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalSlurm]:
    c = LocalSlurm()
    c.start()
    print("cluster up in %.2fs: %s" % (c.startup_seconds or 0, c.state_dir))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def user() -> Iterator[TemporaryUser]:
    with temporary_user() as u:
        yield u


def _wait_file(path: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                data = f.read()
            if data.endswith("\n"):
                return data
        time.sleep(0.05)
    raise AssertionError("%s not written within %ss" % (path, timeout))


def _whoami_script(user: TemporaryUser, name: str) -> str:
    out = os.path.join(user.home, name + ".out")
    return user.write_file(name + ".sh", "#!/bin/sh\n"
                           "echo \"$(id -un) $(hostname) $SLURM_JOB_ID\" > %s.tmp\n"
                           "mv %s.tmp %s\n" % (out, out, out), mode=0o600)


def test_sbatch_runs_as_user(cluster: LocalSlurm, user: TemporaryUser) -> None:
    script = _whoami_script(user, "sbatch_whoami")
    assert os.stat(script).st_mode & 0o777 == 0o600   # token-bearing scripts are 0600
    t0 = time.monotonic()
    job = cluster.submit_sbatch(script, user=user.name)
    data = _wait_file(os.path.join(user.home, "sbatch_whoami.out"))
    print("sbatch submit->output %.2fs" % (time.monotonic() - t0))
    name, host, job_id = data.split()
    assert name == user.name
    assert host == cluster.hostname
    assert job_id == job
    assert cluster.wait_state(job, ["COMPLETED"]) == "COMPLETED"
    assert cluster.job_info(job)["UserId"].startswith(user.name + "(")
    assert batch_queue.job_state(job) == "COMPLETED"      # module-level helper
    assert cluster.job_state("999999") == "UNKNOWN"


@needs_qsub
def test_qsub_runs_as_user(cluster: LocalSlurm, user: TemporaryUser) -> None:
    script = _whoami_script(user, "qsub_whoami")
    job = cluster.submit_qsub(script, user=user.name,
                              extra_args=["-N", "gxpq", "-l", "walltime=00:05:00",
                                          "-o", os.path.join(user.home, "q.o"),
                                          "-e", os.path.join(user.home, "q.e")])
    data = _wait_file(os.path.join(user.home, "qsub_whoami.out"))
    name, host, job_id = data.split()
    assert (name, host, job_id) == (user.name, cluster.hostname, job)
    info = cluster.job_info(job)
    assert info["JobName"] == "gxpq"
    assert info["TimeLimit"] == "00:05:00"
    assert cluster.wait_state(job, ["COMPLETED"]) == "COMPLETED"
    assert os.stat(os.path.join(user.home, "q.o")).st_uid == user.uid


def test_owner_only_script_env_and_cwd(cluster: LocalSlurm, user: TemporaryUser) -> None:
    out = os.path.join(user.home, "env.out")
    script = user.write_file("env.sh", "#!/bin/sh\n"
                             "{ echo \"cwd=$(pwd)\"; env; } > %s.tmp; mv %s.tmp %s\n"
                             % (out, out, out), mode=0o600)
    os.chmod(user.home, 0o700)   # even a private home works
    try:
        job = cluster.submit_sbatch(script, user=user.name, extra_args=["-J", "envjob"])
        lines = _wait_file(out).splitlines()
    finally:
        os.chmod(user.home, 0o755)
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    assert env["cwd"] == user.home
    assert env["SLURM_JOB_ID"] == job
    assert env["SLURM_CONF"] == cluster.conf_path
    assert env["HOME"] == user.home and env["USER"] == user.name
    assert "/root" not in env["PATH"]
    assert cluster.wait_state(job, ["COMPLETED"]) == "COMPLETED"


@pytest.mark.parametrize("via", ["scancel", pytest.param("qdel", marks=needs_qsub)])
def test_cancel_sleeping_job(cluster: LocalSlurm, user: TemporaryUser, via: str) -> None:
    marker = "gxp-sleep-%s-%d" % (via, os.getpid())
    started = os.path.join(user.home, marker + ".started")
    script = user.write_file(marker + ".sh", "#!/bin/sh\n"
                             "touch %s\nexec sleep 300\n" % started)
    submit = cluster.submit_qsub if via == "qdel" else cluster.submit_sbatch
    job = submit(script, user=user.name)
    assert cluster.wait_state(job, ["RUNNING"]) == "RUNNING"
    _wait_until(lambda: os.path.exists(started))
    _wait_until(lambda: _user_procs(user.uid, b"sleep 300"))
    cluster.cancel(job, user=user.name, via=via)
    assert cluster.wait_state(job, ["CANCELLED"]) == "CANCELLED"
    # the job's processes are really gone (SIGTERM, SIGKILL after KillWait)
    _wait_until(lambda: not _user_procs(user.uid, b"sleep 300"), timeout=15)


def test_jobs_run_concurrently(cluster: LocalSlurm, user: TemporaryUser) -> None:
    n = 8
    script = user.write_file("conc.sh", "#!/bin/sh\n"
                             "s=$(date +%s.%N); sleep 3; e=$(date +%s.%N)\n"
                             "echo \"$s $e\" > $HOME/conc.$SLURM_JOB_ID.tmp\n"
                             "mv $HOME/conc.$SLURM_JOB_ID.tmp $HOME/conc.$SLURM_JOB_ID\n")
    t_submit = time.time()
    jobs = [cluster.submit_sbatch(script, user=user.name) for _ in range(n)]
    t_submitted = time.time()
    times = [tuple(map(float, _wait_file(os.path.join(user.home, "conc." + j)).split()))
             for j in jobs]
    starts = [s for s, _ in times]
    ends = [e for _, e in times]
    print("%d submits took %.2fs; first start %.2fs, last start %.2fs after first submit"
          % (n, t_submitted - t_submit, min(starts) - t_submit, max(starts) - t_submit))
    assert max(starts) - min(starts) < 3.0, times
    assert max(starts) < min(ends), "not all %d jobs were running at once: %s" % (n, times)
    for j in jobs:
        assert cluster.wait_state(j, ["COMPLETED"]) == "COMPLETED"


def test_stop_cleans_up() -> None:
    # a second, independent cluster (also proves two can coexist)
    with temporary_user() as u:
        c = LocalSlurm()
        c.start()
        state_dir = c.state_dir
        assert state_dir and os.path.isdir(state_dir)
        pids = c.pids
        assert set(pids) == {"munged", "slurmctld", "slurmd"}, pids
        script = u.write_file("hang.sh", "#!/bin/sh\n"
                              "touch $HOME/hang.started\n"
                              "setsid sleep 321 < /dev/null > /dev/null 2>&1 &\n"
                              "exec sleep 322\n")
        job = c.submit_sbatch(script, user=u.name)
        c.wait_state(job, ["RUNNING"])
        _wait_until(lambda: _find_live(b"sleep 321") and _find_live(b"sleep 322"))
        t0 = time.monotonic()
        c.stop()
        print("stop took %.2fs" % (time.monotonic() - t0))
        c.stop()  # idempotent
        assert not os.path.exists(state_dir)
        for name, pid in pids.items():
            assert not _live(pid), "%s (pid %d) survived stop()" % (name, pid)
        assert not _find_live(state_dir.encode())
        assert not _find_live(b"sleep 321") and not _find_live(b"sleep 322")
        assert not any(p for p in batch_queue._leftover_pids(state_dir.encode()))


def test_sweep_leaves_live_clusters_alone(cluster: LocalSlurm) -> None:
    assert cluster.state_dir not in batch_queue.sweep()
    assert os.path.isdir(cluster.state_dir or "")
    assert cluster.job_state("999999") == "UNKNOWN"   # still answering


def _live(pid: int) -> bool:
    return batch_queue._is_live(pid)


def _find_live(needle: bytes) -> list:
    me = os.getpid()
    return [p for p in batch_queue._all_pids()
            if p != me and needle in batch_queue._read_proc(p, "cmdline").replace(b"\0", b" ")
            and _live(p)]


def _user_procs(uid: int, needle: bytes) -> list:
    return [p for p in _find_live(needle)
            if any(line.startswith(b"Uid:") and int(line.split()[1]) == uid
                   for line in batch_queue._read_proc(p, "status").splitlines())]


def _wait_until(cond, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within %ss" % timeout)
        time.sleep(0.05)
