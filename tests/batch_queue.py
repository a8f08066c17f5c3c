"""A throw-away, single-node Slurm cluster (plus Debian's Torque wrappers) for tests.

Standard library only.  Needs root, slurm-wlm (slurmctld, slurmd, client
tools), munge and, for the ``qsub`` path, slurm-wlm-torque::

    apt-get install -y slurm-wlm munge slurm-wlm-torque

Usage::

    from batch_queue import LocalSlurm, temporary_user

    with LocalSlurm() as cluster, temporary_user() as user:
        job = cluster.submit_sbatch(script, user=user.name)   # script: 0600, owned by user
        cluster.wait_state(job, {"COMPLETED"})
        subprocess.run(argv, env=cluster.env())                # any other client

What ``LocalSlurm.start()`` builds
----------------------------------
* A private state dir ``/var/tmp/gxpslurm-XXXXXXXX`` (mode 0755 so ordinary
  users can read ``slurm.conf`` and reach the munge socket), holding
  ``slurm.conf``, an empty ``plugstack.conf`` (isolates us from
  /etc/slurm/plugstack.conf), ``munge/`` (key 0400 root, socket, pid, seed),
  ``state/`` (StateSaveLocation), ``spool/`` (SlurmdSpoolDir; job scripts are
  copied here by slurmd), ``log/`` and an ``owner`` file (pid + start time of
  the creating process; ``sweep()`` leaves dirs of live owners alone).
* A private munged (``munged -F --key-file --socket --pid-file --log-file
  --seed-file`` all inside the state dir, fresh random key) -- /etc/munge and
  /run/munge are neither used nor touched.  Slurm is pointed at it with
  ``AuthInfo=socket=...`` (used by both auth/munge and cred/munge).
* slurmctld and slurmd in the foreground (``-D -f conf``), ports picked free,
  ``SlurmUser=root``, one node = short hostname (``NodeAddr=127.0.0.1``) with
  ``CPUs=32`` (fake; accepted thanks to ``SlurmdParameters=config_overrides``),
  ``select/cons_tres`` + ``CR_CPU`` so 32 one-CPU jobs run at once, partition
  ``debug`` (Default, MaxTime=INFINITE), ``proctrack/linuxproc``, ``task/none``,
  no accounting, ``MinJobAge=3600`` (finished jobs stay visible to
  ``scontrol show job``), ``KillWait=2`` (scancel: SIGTERM, SIGKILL 2 s later),
  ``SchedulerParameters=batch_sched_delay=0`` (default 3: jobs started 2-3 s
  after submission; now ~1 s -- slurmctld's background scheduler pass runs
  once per second, the very first job after start-up takes ~2 s).
* Every daemon runs under a tiny supervisor (``supervise.py`` in the state dir)
  that is a *child subreaper* (prctl PR_SET_CHILD_SUBREAPER).  slurmd's
  slurmstepd double-forks and would otherwise be re-parented to PID 1 (on
  this VM PID 1 is ``process_api``, which reaps orphans only lazily: zombie
  slurmstepd/job processes linger for seconds), and a job survives slurmd's
  death.  With the subreaper, every job process (even ones that setsid /
  daemonize) stays a descendant of the slurmd supervisor, gets reaped at once,
  and is SIGKILLed when the supervisor stops.  A supervisor also shuts its daemon and
  the daemon's whole tree down if its parent (the test process) dies, so even
  a SIGKILLed pytest leaves no daemons or jobs running; only the state dir
  remains, which the next ``start()``/``sweep()`` removes.
* ``start()`` returns once ``sinfo`` shows the node ``idle`` (1.1-1.3 s here;
  bounded by ``start_timeout``, error message includes the log tails).

``stop()`` (idempotent, also registered with atexit) SIGTERMs the
supervisors (SIGKILL after a grace period), SIGKILLs anything still carrying
the state dir in its command line (or a job environment pointing at it), and
removes the state dir.  NOTE: killing slurmd alone does *not* end running jobs
(slurmstepd survives slurmd) -- the supervisor is what makes stop() complete.

Clients
-------
``env()`` returns ``os.environ`` minus inherited SLURM_*/SBATCH_*/SALLOC_*/
SRUN_*/SQUEUE_*/SINFO_*/PBS_* variables, plus ``SLURM_CONF=<state>/slurm.conf``.
Without SLURM_CONF the clients try DNS SRV "configless" lookup and die
("Could not establish a configuration source").  The helpers below run the
client as an ordinary user with ``runuser -u USER --`` and a *minimal*
environment (``PATH=/usr/local/bin:/usr/bin:/bin``, ``LANG=C.UTF-8``,
``SLURM_CONF``; runuser itself sets HOME/USER/LOGNAME/SHELL).  Do not pass
root's environment through: runuser keeps PATH, and root's PATH here starts
with ``/root/.pyenv/shims`` (``/root`` is 0700), so ``python3`` in a job of an
ordinary user would fail; ``/usr/bin/python3`` is usable by everyone.
sbatch exports the submitter's *whole* environment into the job (default
``--export=ALL``), so whatever env the submitter has, the job gets.

Job scripts may be mode 0600: sbatch reads the file as the submitting user and
ships its contents to slurmctld; slurmd writes its own copy
(``<state>/spool/jobNNNNN/slurm_script``) owned by the job user.  So the
script must be readable by the *submitting* user (0600 owned by that user is
fine, 0600 owned by root is not).

The default working directory of the helpers is the user's home (or, for
root, the script's directory): default output files (``slurm-%j.out``,
``NAME.oJOBID``) land in the submission cwd, which must be writable by the user.

Debian's Torque wrapper (slurm-wlm-torque 22.05, a Perl script)
--------------------------------------------------------------
``qsub`` just builds an ``sbatch`` command line *as a shell string* and runs it
with backticks; it prints only the bare numeric job id (``42``, no
``.server`` suffix); on failure it prints "There was an error running the
Slurm sbatch command..." on stdout with sbatch's exit code.  ``qsub
-sbatchline ...`` prints the sbatch command instead of running it (handy to
check translations).  All of qsub/qstat/qdel load the Slurm Perl module at
compile time, so even ``-sbatchline``/``--help`` need SLURM_CONF.  Tried here:

* The script must be a FILE argument.  No stdin: ``echo cmd | qsub`` prints
  the usage and exits 2.  Words after the script become script arguments.
* ``-N name`` -> ``-J name`` (job name; NOT sbatch's -N).  ``-o path`` /
  ``-e path`` -> sbatch ``-o``/``-e``; defaults are ``-o SCRIPT.o%A -e
  SCRIPT.e%A`` (``NAME.o%A``/``NAME.e%A`` with -N; SCRIPT = basename) relative
  to the submission cwd.  ``-j oe`` (any -j value) drops ``-e`` so stderr goes
  to the -o file.  Paths with spaces BREAK (the shell string is unquoted:
  "Unable to open file space.txt").
* ``-l walltime=HH:MM:SS`` (or plain seconds) -> ``-t<minutes>`` rounded UP
  (``walltime=00:00:30`` -> ``-t1``, ``walltime=90`` -> ``-t2``).
  ``-l nodes=2:ppn=3`` -> ``-N2 -n6``; ``-l ncpus=2`` -> ``--mincpus=2``;
  ``-l mem=100mb`` -> ``--mem=100M``.
* ``-q debug`` -> ``-p debug`` (partition).  ``-p N`` -> ``--nice=N``.
* ``-V`` -> ``--export=all``; that is sbatch's default anyway, so unlike real
  Torque the *whole* submission environment reaches the job with or without
  ``-V``.  ``-v A=1,B`` -> ``--export=none,A=1,B=<value of $B>`` (only those
  plus SLURM_*, unless -V is also given; an unset B is silently dropped).
* ``-S shell`` is ignored with a warning (use a ``#!`` line).  ``-wd dir`` ->
  ``-Ddir``, ``-W depend=X`` -> ``--dependency=X``, ``-h`` -> ``-H`` (hold),
  ``-r n`` -> ``--no-requeue``, ``-A acct`` -> ``--account``; ``-I`` runs
  ``salloc -N1``.
* Inside the job there are NO ``PBS_*`` variables (no ``PBS_JOBID``,
  ``PBS_O_WORKDIR``, ``PBS_NODEFILE``); use ``SLURM_JOB_ID``,
  ``SLURM_SUBMIT_DIR``.  The job's cwd is the submission cwd.
* ``qstat`` / ``qstat ID`` print a table ``Job id  Name  Username  Time Use S
  Queue`` with states ``Q``/``R``/``C``; ``qstat -f ID`` prints PBS-style
  ``job_state = R`` blocks; an unknown id gives exit 153 and no output.
  ``qdel ID`` cancels like scancel (unknown id: exit 1, no message).

Slurm quirks seen here
----------------------
* slurmctld/slurmd log ``mpi/pmix_v4 ... can not load PMIx library`` errors at
  start; harmless with ``MpiDefault=none``.  Without ``MailProg`` slurmctld logs
  "Configured MailProg is invalid"; we set ``MailProg=/bin/true``.
* "Node configuration differs from hardware" is logged for the fake CPU count;
  harmless with ``config_overrides``.
* ``scancel``/``qdel`` of a running job: state goes CANCELLED at once, the
  processes get SIGTERM, then SIGKILL after KillWait.
"""

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Set

BASE_DIR = "/var/tmp"
PREFIX = "gxpslurm-"
MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"
REQUIRED_BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "scancel",
                     "scontrol", "sinfo", "squeue", "runuser")
_CLIENT_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_",
                        "SINFO_", "SCONTROL_", "SCANCEL_", "PBS_")

_current: Optional["LocalSlurm"] = None


class BatchQueueError(RuntimeError):
    pass


def missing_binaries(names: Sequence[str] = REQUIRED_BINARIES) -> List[str]:
    """Names of required programs not found (PATH plus the sbin dirs)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin:/bin"
    return [n for n in names if shutil.which(n, path=path) is None]


def _which(name: str) -> str:
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin:/bin"
    found = shutil.which(name, path=path)
    if found is None:
        raise BatchQueueError("%s not found (apt-get install -y slurm-wlm munge "
                              "slurm-wlm-torque)" % name)
    return found


# --------------------------------------------------------------------------
# /proc helpers

def _stat_fields(pid: int) -> Optional[list]:
    """Fields of /proc/PID/stat after comm (field 3 on): comm may contain
    spaces and parentheses, so split after the last ')'."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def _proc_start_time(pid: int) -> Optional[str]:
    rest = _stat_fields(pid)
    return rest[19] if rest and len(rest) > 19 else None  # field 22 = starttime


def _proc_state_ppid(pid: int) -> Optional[tuple]:
    rest = _stat_fields(pid)
    return (rest[0], int(rest[1])) if rest else None


def _read_proc(pid: int, name: str) -> bytes:
    try:
        with open("/proc/%d/%s" % (pid, name), "rb") as f:
            return f.read()
    except OSError:
        return b""


def _all_pids() -> List[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _self_and_ancestors() -> Set[int]:
    out = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        sp = _proc_state_ppid(pid)
        if sp is None:
            break
        pid = sp[1]
        out.add(pid)
    return out


def _is_live(pid: int) -> bool:
    sp = _proc_state_ppid(pid)
    return sp is not None and sp[0] not in ("Z", "X")


def _leftover_pids(needle: bytes) -> List[int]:
    """Live processes that belong to a cluster whose paths contain needle.

    A process matches if its command line contains needle (munged, slurmctld,
    slurmd, supervisors, job scripts under spool/), or if it is a Slurm job
    process (environment has SLURM_JOB_ID, or it is slurmstepd) whose
    environment contains needle (SLURM_CONF of the submitter / of slurmd).
    Zombies, this process and its ancestors are excluded.
    """
    skip = _self_and_ancestors()
    found = []
    for pid in _all_pids():
        if pid in skip or not _is_live(pid):
            continue
        if needle in _read_proc(pid, "cmdline"):
            found.append(pid)
            continue
        environ = _read_proc(pid, "environ")
        if needle in environ:
            comm = _read_proc(pid, "comm").strip()
            if b"\0SLURM_JOB_ID=" in b"\0" + environ or comm == b"slurmstepd":
                found.append(pid)
    return found


def _kill_pids(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_matching(needle: bytes, timeout: float = 5.0) -> List[int]:
    """SIGKILL matching processes until none is left (bounded)."""
    killed: List[int] = []
    deadline = time.monotonic() + timeout
    while True:
        pids = _leftover_pids(needle)
        if not pids:
            return killed
        _kill_pids(pids)
        killed.extend(p for p in pids if p not in killed)
        if time.monotonic() > deadline:
            return killed
        time.sleep(0.05)


def _owner_alive(state_dir: str) -> bool:
    try:
        with open(os.path.join(state_dir, "owner")) as f:
            pid_s, start = f.read().split()
    except (OSError, ValueError):
        # no owner file yet: a run in its first instants, or garbage
        try:
            return time.time() - os.stat(state_dir).st_mtime < 60
        except OSError:
            return False
    pid = int(pid_s)
    return _is_live(pid) and _proc_start_time(pid) == start


def sweep(base_dir: str = BASE_DIR) -> List[str]:
    """Kill leftovers of crashed runs and remove their state dirs.

    Leftovers are processes referencing a ``<base_dir>/gxpslurm-*`` dir (see
    _leftover_pids) whose dir is gone or whose creating process is dead.
    Dirs of live runs (owner pid alive, same start time) are left alone.
    Returns the removed dirs.
    """
    removed = []
    live_dirs = []
    dead_dirs = []
    for name in sorted(os.listdir(base_dir)):
        path = os.path.join(base_dir, name)
        if not name.startswith(PREFIX) or not os.path.isdir(path) or os.path.islink(path):
            continue
        (live_dirs if _owner_alive(path) else dead_dirs).append(path)
    prefix = os.path.join(base_dir, PREFIX).encode()
    for pid in _leftover_pids(prefix):
        blob = _read_proc(pid, "cmdline") + b"\0" + _read_proc(pid, "environ")
        if any((d + "/").encode() in blob or (d + "\0").encode() in blob
               for d in live_dirs):
            continue
        _kill_pids([pid])
    for path in dead_dirs:
        _kill_matching(path.encode(), timeout=2.0)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed


# --------------------------------------------------------------------------
# supervisor run around every daemon (written into the state dir)

_SUPERVISOR = r'''
import ctypes, os, signal, sys, time
# usage: supervise.py PARENT_PID GRACE_SECONDS CMD...
parent, grace, cmd = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of our tree come to us
stop = []
def on_signal(signum, frame):
    stop.append(signum)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, on_signal)
if os.getppid() != parent:
    sys.exit(1)
child = os.fork()
if child == 0:
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    try:
        os.execvp(cmd[0], cmd)
    finally:
        os._exit(127)

def descendants():
    ppids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d, "rb") as f:
                    data = f.read().decode("ascii", "replace")
                ppids[int(d)] = int(data[data.rfind(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, todo = set(), [os.getpid()]
    while todo:
        p = todo.pop()
        for c, pp in ppids.items():
            if pp == p and c not in out:
                out.add(c)
                todo.append(c)
    return out

def reap():
    global status
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
        if pid == child:
            status = st

status = None
term_at = None
while True:
    reap()
    if term_at is None and (stop or os.getppid() != parent) and status is None:
        try:
            os.kill(child, signal.SIGTERM)
        except ProcessLookupError:
            pass
        term_at = time.monotonic()
    if status is not None or (term_at is not None and time.monotonic() - term_at > grace):
        break
    time.sleep(0.05)
# daemon gone (or too slow): kill the whole remaining tree, reap everything
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    pids = descendants()
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if not reap() and not pids:
        break
    time.sleep(0.02)
if status is None:
    sys.exit(137)
sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
'''


def _free_ports(n: int) -> List[int]:
    socks = []
    try:
        while len(socks) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            port = s.getsockname()[1]
            if 6815 <= port <= 6825:  # stay clear of a system slurm
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no %s)" % path
    return "\n".join(data.splitlines()[-lines:])


def _clean_env(base: Mapping[str, str]) -> Dict[str, str]:
    return {k: v for k, v in base.items() if not k.startswith(_CLIENT_ENV_PREFIXES)}


class LocalSlurm:
    """A single-node Slurm cluster private to this process (see module doc)."""

    def __init__(self, cpus: int = 32, real_memory: int = 1000,
                 base_dir: str = BASE_DIR, start_timeout: float = 30.0,
                 kill_wait: int = 2, stop_grace: float = 5.0) -> None:
        self.cpus = cpus
        self.real_memory = real_memory
        self.base_dir = base_dir
        self.start_timeout = start_timeout
        self.kill_wait = kill_wait
        self.stop_grace = stop_grace
        self.state_dir: Optional[str] = None
        self.conf_path: Optional[str] = None
        self.munge_socket: Optional[str] = None
        self.hostname = socket.gethostname()
        self.node_name = self.hostname.split(".")[0]
        self.ctld_port = 0
        self.slurmd_port = 0
        self.startup_seconds: Optional[float] = None
        self._procs: Dict[str, subprocess.Popen] = {}
        self._started = False

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> "LocalSlurm":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> Dict[str, int]:
        """{'munged': pid, 'slurmctld': pid, 'slurmd': pid} of the daemons
        (children of the supervisors); empty once stopped."""
        out = {}
        for name, proc in self._procs.items():
            for pid in _all_pids():
                sp = _proc_state_ppid(pid)
                if sp and sp[1] == proc.pid and sp[0] != "Z":
                    out[name] = pid
                    break
        return out

    def start(self) -> "LocalSlurm":
        global _current
        if self._started:
            return self
        if os.geteuid() != 0:
            raise BatchQueueError("LocalSlurm needs root")
        for name in REQUIRED_BINARIES:
            _which(name)
        t0 = time.monotonic()
        sweep(self.base_dir)
        self._started = True
        atexit.register(self.stop)
        try:
            self._setup_dir()
            self._start_daemons()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        _current = self
        return self

    def _setup_dir(self) -> None:
        d = tempfile.mkdtemp(prefix=PREFIX, dir=self.base_dir)
        self.state_dir = d
        with open(os.path.join(d, "owner"), "w") as f:
            f.write("%d %s\n" % (os.getpid(), _proc_start_time(os.getpid())))
        os.chmod(d, 0o755)
        for sub, mode in (("munge", 0o755), ("state", 0o700), ("spool", 0o755),
                          ("log", 0o755)):
            os.mkdir(os.path.join(d, sub))
            os.chmod(os.path.join(d, sub), mode)
        # munge key: private, random, root-owned 0400 (munged runs as root)
        key = os.path.join(d, "munge", "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(128))
        os.chmod(key, 0o400)
        self.munge_socket = os.path.join(d, "munge", "munge.socket")
        with open(os.path.join(d, "supervise.py"), "w") as f:
            f.write(_SUPERVISOR)
        plugstack = os.path.join(d, "plugstack.conf")
        open(plugstack, "w").close()
        os.chmod(plugstack, 0o644)
        self.ctld_port, self.slurmd_port = _free_ports(2)
        self.conf_path = os.path.join(d, "slurm.conf")
        with open(self.conf_path, "w") as f:
            f.write(self._slurm_conf())
        os.chmod(self.conf_path, 0o644)

    def _slurm_conf(self) -> str:
        d = self.state_dir
        assert d is not None
        return "\n".join([
            "# generated by tests/batch_queue.py",
            "ClusterName=gxptest",
            "SlurmctldHost=%s(127.0.0.1)" % self.node_name,
            "SlurmctldPort=%d" % self.ctld_port,
            "SlurmdPort=%d" % self.slurmd_port,
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket=%s" % self.munge_socket,
            "StateSaveLocation=%s/state" % d,
            "SlurmdSpoolDir=%s/spool" % d,
            "SlurmctldPidFile=%s/slurmctld.pid" % d,
            "SlurmdPidFile=%s/slurmd.pid" % d,
            "SlurmctldLogFile=%s/log/slurmctld.log" % d,
            "SlurmdLogFile=%s/log/slurmd.log" % d,
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "PlugStackConfig=%s/plugstack.conf" % d,
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=batch_sched_delay=0",
            "ReturnToService=2",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",
            "MinJobAge=3600",
            "KillWait=%d" % self.kill_wait,
            "InactiveLimit=0",
            "NodeName=%s NodeAddr=127.0.0.1 CPUs=%d RealMemory=%d State=UNKNOWN"
            % (self.node_name, self.cpus, self.real_memory),
            "PartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=YES" % self.node_name,
            "",
        ])

    def _spawn(self, name: str, argv: List[str]) -> None:
        assert self.state_dir is not None
        out = open(os.path.join(self.state_dir, "log", name + ".out"), "ab")
        env = _clean_env(os.environ)
        env["SLURM_CONF"] = self.conf_path or ""
        env["PATH"] = env.get("PATH", MINIMAL_PATH) + ":/usr/sbin:/sbin"
        try:
            self._procs[name] = subprocess.Popen(
                [sys.executable, "-S", os.path.join(self.state_dir, "supervise.py"),
                 str(os.getpid()), str(self.stop_grace)] + argv,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.state_dir, env=env, start_new_session=True,
                close_fds=True)
        finally:
            out.close()

    def _start_daemons(self) -> None:
        d = self.state_dir
        assert d is not None and self.munge_socket is not None
        self._spawn("munged", [
            _which("munged"), "-F",
            "--key-file=%s/munge/munge.key" % d,
            "--socket=%s" % self.munge_socket,
            "--pid-file=%s/munge/munged.pid" % d,
            "--log-file=%s/log/munged.log" % d,
            "--seed-file=%s/munge/munged.seed" % d,
        ])
        self._wait(lambda: os.path.exists(self.munge_socket or ""), 10,
                   "munged socket %s" % self.munge_socket)
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-f", self.conf_path or ""])
        self._spawn("slurmd", [_which("slurmd"), "-D", "-f", self.conf_path or "",
                               "-N", self.node_name])

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise BatchQueueError("%s exited with %s during start-up\n%s"
                                      % (name, proc.returncode, self.log_tail()))

    def _wait(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            self._check_alive()
            if time.monotonic() > deadline:
                raise BatchQueueError("timed out after %.0fs waiting for %s\n%s"
                                      % (timeout, what, self.log_tail()))
            time.sleep(0.1)

    def _node_state(self) -> str:
        r = subprocess.run([_which("sinfo"), "-h", "-N", "-n", self.node_name, "-o", "%T"],
                           env=self.env(), stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, timeout=10)
        return r.stdout.decode().strip() if r.returncode == 0 else ""

    def _wait_ready(self) -> None:
        self._wait(lambda: self._node_state() == "idle", self.start_timeout,
                   "node %s to become idle in sinfo" % self.node_name)

    def log_tail(self, lines: int = 30) -> str:
        if not self.state_dir:
            return ""
        parts = []
        for name in ("munged.out", "slurmctld.out", "slurmctld.log", "slurmd.out",
                     "slurmd.log"):
            path = os.path.join(self.state_dir, "log", name)
            if os.path.exists(path):
                parts.append("--- %s ---\n%s" % (path, _tail(path, lines)))
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop daemons and jobs, remove the state dir.  Idempotent."""
        global _current
        if not self._started:
            return
        self._started = False
        try:
            atexit.unregister(self.stop)
        except Exception:
            pass
        # all supervisors at once; each SIGTERMs its daemon, SIGKILLs the
        # daemon's remaining tree (slurmstepd + job processes) afterwards
        for proc in self._procs.values():
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + self.stop_grace + 5
        for proc in self._procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        if self.state_dir:
            _kill_matching(self.state_dir.encode())
            shutil.rmtree(self.state_dir, ignore_errors=True)
        if _current is self:
            _current = None

    # -- clients -------------------------------------------------------------

    def env(self, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """Environment for Slurm/Torque clients: base (default os.environ)
        minus inherited SLURM_*/SBATCH_*/PBS_*/... plus SLURM_CONF."""
        if not self.conf_path:
            raise BatchQueueError("cluster not started")
        env = _clean_env(os.environ if base is None else base)
        env["SLURM_CONF"] = self.conf_path
        return env

    def user_env(self) -> Dict[str, str]:
        """Minimal environment used for commands run as an ordinary user."""
        return self.env({"PATH": MINIMAL_PATH, "LANG": "C.UTF-8"})

    def run(self, argv: Sequence[str], user: Optional[str] = None,
            cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
            check: bool = True, timeout: float = 60,
            input: Optional[bytes] = None) -> subprocess.CompletedProcess:
        """Run a client command (as `user` via runuser, else as root) with
        the cluster environment; stdout/stderr captured as text."""
        if env is None:
            env = self.user_env() if user else self.env()
        cmd = list(argv)
        if user:
            cmd = [_which("runuser"), "-u", user, "--"] + cmd
            if cwd is None:
                cwd = pwd.getpwnam(user).pw_dir
        r = subprocess.run(cmd, cwd=cwd, env=dict(env), input=input,
                           capture_output=True, timeout=timeout)
        r.stdout = r.stdout.decode("utf-8", "replace")
        r.stderr = r.stderr.decode("utf-8", "replace")
        if check and r.returncode != 0:
            raise BatchQueueError("%s failed (rc=%d)\nstdout: %s\nstderr: %s"
                                  % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
        return r

    def _submit_cwd(self, script_path: str, user: Optional[str],
                    cwd: Optional[str]) -> str:
        if cwd is not None:
            return cwd
        if user:
            return pwd.getpwnam(user).pw_dir
        return os.path.dirname(os.path.abspath(script_path))

    def submit_sbatch(self, script_path: str, user: Optional[str] = None,
                      extra_args: Sequence[str] = (), cwd: Optional[str] = None,
                      env: Optional[Mapping[str, str]] = None) -> str:
        """sbatch --parsable [extra_args] script; returns the job id."""
        r = self.run([_which("sbatch"), "--parsable"] + list(extra_args)
                     + [os.path.abspath(script_path)], user=user,
                     cwd=self._submit_cwd(script_path, user, cwd), env=env)
        job_id = r.stdout.strip().splitlines()[-1].split(";")[0].strip()
        if not job_id.isdigit():
            raise BatchQueueError("unexpected sbatch output: %r" % r.stdout)
        return job_id

    def submit_qsub(self, script_path: str, user: Optional[str] = None,
                    extra_args: Sequence[str] = (), cwd: Optional[str] = None,
                    env: Optional[Mapping[str, str]] = None) -> str:
        """qsub [extra_args] script (Debian's Torque wrapper); returns job id."""
        r = self.run([_which("qsub")] + list(extra_args)
                     + [os.path.abspath(script_path)], user=user,
                     cwd=self._submit_cwd(script_path, user, cwd), env=env,
                     check=False)
        lines = r.stdout.strip().splitlines()
        job_id = lines[-1].strip() if lines else ""
        if r.returncode != 0 or not job_id.isdigit():
            raise BatchQueueError("qsub failed (rc=%d)\nstdout: %s\nstderr: %s"
                                  % (r.returncode, r.stdout, r.stderr))
        return job_id

    def job_info(self, job_id: str) -> Dict[str, str]:
        """`scontrol show job -o ID` as a dict ({} if unknown)."""
        r = self.run([_which("scontrol"), "show", "job", "-o", str(job_id)], check=False,
                     timeout=30)
        if r.returncode != 0:
            return {}
        info = {}
        for word in r.stdout.split():
            k, sep, v = word.partition("=")
            if sep and k not in info:
                info[k] = v
        return info

    def job_state(self, job_id: str) -> str:
        """PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, FAILED, ...
        or UNKNOWN if Slurm does not know the id."""
        return self.job_info(job_id).get("JobState", "UNKNOWN")

    def wait_state(self, job_id: str, states: Sequence[str], timeout: float = 30) -> str:
        """Poll until job_state is in states; returns it (error on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job_id)
            if state in states:
                return state
            if time.monotonic() > deadline:
                raise BatchQueueError("job %s still %s after %.0fs (wanted %s)\n%s"
                                      % (job_id, state, timeout, "/".join(states),
                                         self.log_tail(10)))
            time.sleep(0.1)

    def cancel(self, job_id: str, user: Optional[str] = None, via: str = "scancel") -> None:
        """Cancel a job with scancel (default) or qdel, as `user` or root."""
        prog = _which("qdel" if via == "qdel" else "scancel")
        self.run([prog, str(job_id)], user=user, cwd="/")


# --------------------------------------------------------------------------
# module-level helpers operating on the most recently started cluster

def current() -> LocalSlurm:
    if _current is None:
        raise BatchQueueError("no LocalSlurm running")
    return _current


def submit_sbatch(script_path: str, user: Optional[str] = None,
                  extra_args: Sequence[str] = (),
                  cluster: Optional[LocalSlurm] = None) -> str:
    return (cluster or current()).submit_sbatch(script_path, user, extra_args)


def submit_qsub(script_path: str, user: Optional[str] = None,
                extra_args: Sequence[str] = (),
                cluster: Optional[LocalSlurm] = None) -> str:
    return (cluster or current()).submit_qsub(script_path, user, extra_args)


def job_state(job_id: str, cluster: Optional[LocalSlurm] = None) -> str:
    return (cluster or current()).job_state(job_id)


def cancel(job_id: str, user: Optional[str] = None, via: str = "scancel",
           cluster: Optional[LocalSlurm] = None) -> None:
    (cluster or current()).cancel(job_id, user, via)


# --------------------------------------------------------------------------
# temporary ordinary users

class TemporaryUser:
    def __init__(self, name: str) -> None:
        self.name = name
        pw = pwd.getpwnam(name)
        self.uid = pw.pw_uid
        self.gid = pw.pw_gid
        self.home = pw.pw_dir

    def write_file(self, relpath: str, text: str, mode: int = 0o600) -> str:
        """Write a file owned by the user into their home (default 0600)."""
        path = os.path.join(self.home, relpath)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chown(path, self.uid, self.gid)
        os.chmod(path, mode)
        return path


def _kill_user_processes(uid: int) -> None:
    for _ in range(50):
        pids = [p for p in _all_pids() if _is_live(p) and
                any(line.startswith(b"Uid:") and int(line.split()[1]) == uid
                    for line in _read_proc(p, "status").splitlines())]
        if not pids:
            return
        _kill_pids(pids)
        time.sleep(0.05)


@contextlib.contextmanager
def temporary_user(prefix: str = "gxpq") -> Iterator[TemporaryUser]:
    """useradd -m a fresh ordinary user; on exit kill its processes and
    userdel -r it."""
    name = "%s%d%04x" % (prefix, os.getpid() % 100000, int.from_bytes(os.urandom(2), "big"))
    subprocess.run([_which("useradd"), "-m", "-s", "/bin/sh", name], check=True,
                   stdout=subprocess.DEVNULL)
    user = TemporaryUser(name)
    try:
        yield user
    finally:
        _kill_user_processes(user.uid)
        subprocess.run([_which("userdel"), "-r", name], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        shutil.rmtree(user.home, ignore_errors=True)
