"""`gxpc make`: the real GNU make, with every recipe run on a node the head picks.

We never read the makefile and make gets every argument unchanged. A library
preloaded into make alone (hook/c_source.py) turns each command make spawns for a
recipe into a small client of this process's relay (relay.py), which runs it on
a node: make's variables, environment, messages and exit status stay its own.
Where the hook cannot be built or loaded (no C compiler, a make before 4.3),
make gets SHELL and .SHELLFLAGS on its command line instead (job_shell.py):
slower, and visible to the makefile.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from gxpstyle.config import limits, safe_paths

USAGE = """\
usage: gxpc make [--local | --shared] [--joblog FILE] [--explain-placement]
                 [--home[=DIR] | --no-home] [--pull-threshold SIZE] [--transfer-slots N]
                 [--trace=FILE] [MAKE-ARGUMENTS...]

Run GNU make here, with each recipe on one of the session's nodes (chosen by the
head). Every other argument goes to make unchanged: -j N, -k, -n, -f FILE,
targets, VAR=value (see make --help). Recipe output and the exit status are
make's own. On a terminal, stderr shows a progress line (recipes done, running,
waiting for a node; nodes busy).

  --local         run every recipe on this machine (plain make)
  --shared        the working directory is on a file system every node mounts
                  at the same path (NFS, a cluster file system): recipes run on
                  the nodes without a GMount
  --joblog FILE   one line per recipe run on a node, tab-separated: recipe (its
                  command's first line), node, start and end (seconds since the
                  epoch), exit status, bytes of output
  --explain-placement
                  a line per recipe on stderr: the node it runs on, why (input
                  bytes already there, load, a hint), input bytes it fetches
  --home[=DIR]    results home: before gxpc make returns, every file its
                  recipes made that only other hosts hold is copied to this
                  host's own export of the GMount (same size and mtime: a
                  replica), or with DIR into DIR (paths below make's directory
                  kept); losing those hosts afterwards loses no result.
                  The default when the session has sites (hosts that only a
                  gateway may reach, by the `use` rules); off on a flat network
  --no-home       leave the results on the hosts that made them (with sites too)
  --pull-threshold SIZE
                  before a recipe runs, the inputs its node lacks are copied
                  there: from SIZE up the head pushes them (one transfer along
                  the session's tree for every node needing the file), below
                  it the node pulls them from the holders in random order.
                  SIZE in bytes, with K, M, G (powers of 1024); 0 pushes
                  everything, inf pulls everything. Default 1M: measured
                  (benchmarks/transfers.py --workflows), a push was never
                  slower than a pull from 512K up
  --transfer-slots N
                  transfers a node receives at once (1 to 64, default 1)
  --trace=FILE    one JSON line per recipe and per transfer: node, file, bytes,
                  start, end, push or pull, source (gxpc plot FILE draws it);
                  with "=" only: a bare --trace is make's own option
  -h, --help      show this help

Placement: a recipe goes to the node whose host already holds the most of the
files its command names (the session's replica catalog), waiting for a slot
there up to half the median run time of the recipes so far (0.5 to 60 s; 3 s
before any has ended), or less when fetching the data to a free node is quicker,
before it runs elsewhere; with nothing known, to the
least busy node. Target-specific variables say more: `out: GXP_ON = tb03` (a
node, a host pattern or a saved mask), `GXP_PLACE = hard` (wait for the node
holding the data; `soft` makes GXP_ON a preference; `load` ignores the data),
`GXP_SLOTS = 4` (slots the recipe takes). A recipe succeeds, for make, once
every node sees its outputs.

Recipes run under the same directory on their node, so the working directory
must be on the session's GMount (gxpc mount) unless every node is a local agent
(gxpc explore --local) or you say it is shared (--shared). With no session, or
no node explored, make runs here and says so once.
"""

# No name in here: a target is data, never a word of a command line.
HINT_VARS = ("GXP_ON", "GXP_PLACE", "GXP_SLOTS")   # recipe_files.HINT_VARS
JOB_SHELL_FLAGS = "-m make_backend.hook.job_shell $(if $@,--recipe) -c"


class MakeUsage(Exception):
    pass


class Options:
    def __init__(self) -> None:
        self.help = False
        self.local = False
        self.shared = False
        self.joblog: Optional[str] = None
        self.explain = False
        self.transfer: Dict[str, Any] = {}     # transfer_plan.py's options, as the env verb takes them
        self.home: Optional[str] = None        # --home: "" for the export, else a directory
        self.no_home = False                   # --no-home (else home with sites, by default)
        self.make_args: List[str] = []


def split_own_options(args: List[str]) -> Options:
    """Ours, and make's arguments: ours are taken only before a `--`."""
    o = Options()
    own = True
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if own and a == "--":
            own = False
        elif own and a in ("-h", "--help"):
            o.help = True
        elif own and a == "--local":
            o.local = True
        elif own and a == "--shared":
            o.shared = True
        elif own and a == "--explain-placement":
            o.explain = True
        elif own and (a == "--home" or a.startswith("--home=")):
            o.home = _home_dir(a[len("--home="):]) if a.startswith("--home=") else ""
        elif own and a == "--no-home":
            o.no_home = True
        elif own and (a == "--joblog" or a.startswith("--joblog=")):
            a, i = _value(args, i, a, "--joblog", "a file name")
            o.joblog = a
        elif own and a.startswith("--trace="):
            # only with "=": a bare --trace is GNU make's own (it goes to make)
            a, i = _value(args, i, a, "--trace", "a file name")
            o.transfer["trace"] = os.path.abspath(a)
        elif own and (a == "--pull-threshold" or a.startswith("--pull-threshold=")):
            a, i = _value(args, i, a, "--pull-threshold", "a size (bytes, K, M, G, or inf)")
            o.transfer["pull_threshold"] = parse_size(a)
        elif own and (a == "--transfer-slots" or a.startswith("--transfer-slots=")):
            a, i = _value(args, i, a, "--transfer-slots", "a number")
            try:
                o.transfer["transfer_slots"] = limits.check("transfer_slots", int(a), "--transfer-slots")
            except ValueError as e:
                raise MakeUsage(str(e) if isinstance(e, limits.RangeError)
                                else "--transfer-slots must be a whole number, got %r" % a)
        elif own and (a == "--pull-order" or a.startswith("--pull-order=")):
            # random (the default) or fixed: for benchmarks/transfers.py
            a, i = _value(args, i, a, "--pull-order", "random or fixed")
            if a not in ("random", "fixed"):
                raise MakeUsage("--pull-order must be random or fixed, got %r" % a)
            o.transfer["pull_order"] = a
        else:
            o.make_args.append(a)
    if o.local and o.shared:
        raise MakeUsage("--local and --shared exclude each other (--local runs every recipe here)")
    if o.no_home and o.home is not None:
        raise MakeUsage("--home and --no-home exclude each other")
    check_jobs(o.make_args)
    return o


# make's short options that take an argument: in a cluster such as `-Cj`, the
# rest of the word is that argument, not more options.
_SHORT_WITH_ARG = "CfIoWlOE"


def check_jobs(make_args: List[str]) -> None:
    """MakeUsage for a job count make would hang on or refuse (-j N, -jN, -kj N,
    --jobs=N, --jobs N), in our words before make starts; anything else about
    -j (no number: unlimited; not a number: make's own error) is make's."""
    i = 0
    while i < len(make_args):
        a = make_args[i]
        i += 1
        if a == "--":
            return
        value = None
        if a == "--jobs" or a.startswith("--jobs="):
            value = a[len("--jobs="):] if "=" in a else None
            if value is None and i < len(make_args) and make_args[i].isdigit():
                value = make_args[i]
        elif a.startswith("-") and not a.startswith("--"):
            for k, ch in enumerate(a[1:], 1):
                if ch == "j":
                    value = a[k + 1:] or None
                    if value is None and i < len(make_args) and make_args[i].isdigit():
                        value = make_args[i]
                    break
                if ch in _SHORT_WITH_ARG:
                    break
        if value is not None and value.isdigit():
            try:
                limits.check("jobs", int(value), "-j")
            except limits.RangeError as e:
                raise MakeUsage(str(e))


def _home_dir(d: str) -> str:
    if not d:
        raise MakeUsage("--home= needs a directory (--home alone: this host's export)")
    d = os.path.abspath(d)
    if not os.path.isdir(d):
        raise MakeUsage("--home=%s: no such directory" % d)
    return d


def _value(args: List[str], i: int, a: str, name: str, what: str) -> Tuple[str, int]:
    """The value of option `name` (`--name V` or `--name=V`) and the next index."""
    if a == name:
        if i >= len(args):
            raise MakeUsage("%s needs %s" % (name, what))
        a, i = args[i], i + 1
    else:
        a = a.split("=", 1)[1]
    if not a:
        raise MakeUsage("%s needs %s" % (name, what))
    return a, i


def parse_size(text: str) -> int:
    """`--pull-threshold` SIZE: 0, 64K, 128M, 1.5G, 128MiB, inf (2^62)."""
    if text.strip().upper() in ("INF", "INFINITY"):
        return 1 << 62
    n = limits.size_value(text)
    if n != n or n in (float("inf"), float("-inf")):
        raise MakeUsage("--pull-threshold must be a size such as 64K, 128M or inf, got %r" % text)
    if n < 0:
        raise MakeUsage("--pull-threshold must be 0 or more (bytes, K, M, G) or inf, got %r" % text)
    if n >= 1 << 62:
        raise MakeUsage("--pull-threshold %s is past 4 EiB: say inf to pull everything" % text)
    return int(limits.check("pull_threshold", int(n), "--pull-threshold"))


def open_trace(path: str) -> None:
    """The head writes the trace; a path it cannot write is said here, first."""
    try:
        safe_paths.open_output(path).close()
    except safe_paths.PathRefused as e:
        raise MakeUsage("--trace %s" % e) from None
    except OSError as e:
        raise MakeUsage("cannot write the trace %s: %s" % (path, e.strerror)) from None


def open_joblog(path: str) -> Any:
    """A regular file only (a device, FIFO or directory is refused, exit 2); a
    disk that cannot take the header line is an I/O error (exit 1)."""
    try:
        f = safe_paths.open_output(path)
    except safe_paths.PathRefused as e:
        raise MakeUsage("--joblog %s" % e) from None
    except OSError as e:
        raise MakeUsage("cannot write the job log %s: %s" % (path, e.strerror)) from None
    try:
        f.write("#recipe\tnode\tstart\tend\tstatus\tbytes\n")
        f.flush()
    except OSError as e:
        try:
            f.close()
        except OSError:
            pass
        raise OSError(e.errno, "cannot write the job log: %s" % e.strerror, path) from None
    return f


RELAY_PREFIX = "gxpmake-"


def relay_dir() -> str:
    """A private directory for the relay's socket, named after this process so
    that one left by a `gxpc make` killed with SIGKILL is known to be dead:
    the next make (and `gxpc quit`) removes those."""
    parent = tempfile.gettempdir()
    prefix = "%s%d-" % (RELAY_PREFIX, os.getpid())
    if len(os.fsencode(os.path.join(parent, prefix + "x" * 8, "relay"))) > 107:
        parent = "/tmp"     # $TMPDIR too long for a Unix socket's path
    for d in {parent, tempfile.gettempdir()}:
        safe_paths.remove_dead_owner_dirs(d, RELAY_PREFIX)
    return tempfile.mkdtemp(prefix=prefix, dir=parent)


def make_program() -> str:
    """make's name as the user would type it: $(MAKE) in recipes shows it."""
    for name in (os.environ.get("GXP_MAKE") or "", "make", "gmake"):
        if name and shutil.which(name):
            return name
    raise MakeUsage("GNU make is not installed (no make or gmake on PATH)")


def on_shared_mount(cwd: str, mounts: List[str]) -> bool:
    cwd = os.path.realpath(cwd)
    return any(cwd == m or cwd.startswith(m.rstrip("/") + "/") for m in mounts)


def plan(stat: Dict[str, Any], cwd: str, shared: bool = False) -> str:
    """"remote", or "here" (no node but the head); raises MakeUsage when the
    working directory is not where the nodes can see it (unless the user says
    it is: `shared`)."""
    nodes = [n for n in stat.get("nodes", []) if n["state"] == "up" and n["id"] != "0"
             and not n.get("role")]
    # An elastic pool (use --elastic) adds agents while recipes wait, on
    # whichever hosts its queue gives: recipes go through the head even
    # before one is up, and they may run on other hosts.
    pools = [p for p in stat.get("elastic") or [] if p.get("max")]
    if not nodes and not pools:
        return "here"
    # Nodes on this very machine (local agents, or any channel that came back
    # to this host) see our files as we do.
    here = [n["hostname"] for n in stat.get("nodes", []) if n["id"] == "0"]
    if shared or (not pools and all(n["hostname"] in here for n in nodes)):
        return "remote"
    if not on_shared_mount(cwd, stat.get("mounts", [])):
        mounts = ", ".join(stat.get("mounts", [])) or "none yet: gxpc mount EXPORT MOUNTPOINT"
        raise MakeUsage("%s is not on the session's shared mount (%s); recipes on other hosts%s "
                        "would not see it. cd there, say it is on a file system they share (gxpc make "
                        "--shared), or use gxpc make --local"
                        % (cwd, mounts, " (an elastic pool's agents, wherever its queue starts them)"
                           if pools else ""))
    return "remote"


def hook_for(make: str) -> Optional[Tuple[str, str]]:
    """(shim, client) when this make can be hooked: it spawns recipes with
    posix_spawn (GNU make 4.3 and later) and the hook is built or buildable."""
    if os.environ.get("GXP_MAKE_HOOK") == "shell":   # the Python job shell, on purpose
        return None
    if not os.path.exists("/proc/self/exe"):   # the shim finds make by it
        return None
    try:
        with open(make, "rb") as f:
            if b"posix_spawn" not in f.read():
                return None
    except OSError:
        return None
    from make_backend.hook import build as hook_build
    return hook_build.find_or_build()


def fd_limit_for_relay() -> Optional[Callable[[], None]]:
    """The relay holds 4 descriptors a running recipe: raise our limit to the
    hard one, and give make (the function returned runs in its child) the
    limit the user had."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if want <= soft:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        return None
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def hook_env(env: Dict[str, str], make: str, shim: str, client: str, relay: str) -> None:
    """What the shim reads (and hides from make) in make's environment."""
    old = env.get("LD_PRELOAD")
    if old is not None:
        env["GXP_MAKE_OLD_PRELOAD"] = old
    env["LD_PRELOAD"] = shim + (" " + old if old else "")
    env.update(GXP_MAKE_EXE=make, GXP_MAKE_RELAY=relay, GXP_MAKE_CLIENT=client)


def run_make(argv: List[str], env: Dict[str, str],
             serve: Optional[Callable[[int], None]] = None) -> int:
    """Run make in our process group (Ctrl-C reaches it and every recipe shell
    directly); pass on SIGTERM/SIGHUP; return its exit status as a shell would.
    With `serve`, it runs here until make exits (given a fd that then reads)."""
    proc = subprocess.Popen(argv, env=env, preexec_fn=fd_limit_for_relay() if serve else None)
    seen: List[int] = []

    def forward(signum: int, frame: Any) -> None:
        seen.append(signum)
        if signum != signal.SIGINT:   # SIGINT came from the terminal to make as well
            try:
                proc.send_signal(signum)
            except OSError:
                pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        if serve is not None:
            r, w = os.pipe()
            waiter = threading.Thread(target=lambda: (proc.wait(), os.write(w, b"x")), daemon=True)
            waiter.start()
            try:
                serve(r)
            finally:
                waiter.join()
                os.close(r)
                os.close(w)
        while True:
            try:
                rc = proc.wait()
                break
            except InterruptedError:
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if rc < 0:
        return 128 - rc
    if seen and rc != 0:
        return 128 + seen[0]
    return rc


def main(client: Optional[Any], session_dir: str, args: List[str]) -> int:
    opts = split_own_options(args)
    local, make_args = opts.local, opts.make_args
    if opts.help:
        sys.stdout.write(USAGE)
        return 0
    joblog = open_joblog(opts.joblog) if opts.joblog else None
    try:
        if opts.transfer.get("trace"):
            open_trace(opts.transfer["trace"])
        rc = _run(client, session_dir, local, make_args, joblog, opts.shared, opts.explain,
                  opts.transfer)
        if not opts.no_home and client is not None and not local and not opts.shared:
            rc = results_home(client, opts.home, rc)
        return rc
    finally:
        if joblog is not None:
            joblog.close()


def _run(client: Optional[Any], session_dir: str, local: bool, make_args: List[str],
         joblog: Any, shared: bool = False, explain: bool = False,
         transfer: Optional[Dict[str, Any]] = None) -> int:
    argv = [make_program()]
    env = dict(os.environ)
    where = "here"
    if not local:
        if client is None:
            sys.stderr.write("gxpc make: no session (gxpc explore starts one); recipes run on this machine\n")
        else:
            stat = client.stat()
            where = plan(stat, os.getcwd(), shared)
            if where == "here":
                sys.stderr.write("gxpc make: no node explored; recipes run on this machine\n")
    if where != "remote":
        if joblog is not None:
            sys.stderr.write("gxpc make: no recipe runs on a node, so the job log stays empty\n")
        return run_make(argv + make_args, env)
    make = os.path.realpath(shutil.which(argv[0]) or argv[0])
    hook = hook_for(make)
    if hook is None:
        if joblog is not None:
            sys.stderr.write("gxpc make: the job log needs the compiled hook (no C compiler here); "
                             "it stays empty\n")
        if transfer:
            sys.stderr.write("gxpc make: --pull-threshold, --transfer-slots and --trace need the "
                             "compiled hook (no C compiler here); the defaults apply, no trace\n")
        env["GXP_SESSION"] = session_dir
        argv += ["SHELL=" + sys.executable, ".SHELLFLAGS=" + JOB_SHELL_FLAGS]
        return run_make(argv + make_args, env)
    from make_backend.hook.relay import Relay
    tmp = relay_dir()
    try:
        path = os.path.join(tmp, "relay")
        progress = sys.stderr.fileno() if os.isatty(sys.stderr.fileno()) else None
        relay = Relay(client, path, joblog, progress, sys.stderr.fileno() if explain else None,
                      transfer)
        for var in HINT_VARS:
            # make exports a variable that came from its environment, so
            # `out: GXP_ON = tb03` reaches the recipe without `export`
            env.setdefault(var, "")
        hook_env(env, make, hook[0], hook[1], path)
        return run_make(argv + make_args, env, relay.serve)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def results_home(client: Any, home: Optional[str], rc: int) -> int:
    """--home: the head names the files this make's recipes made that only
    other hosts hold, with where this host keeps them; each is copied
    there through the mount. Without --home (`home` None) the head names
    them only when the session has sites. Returns make's status, or 1 if
    make succeeded but a file could not come home (each said in one line)."""
    from make_backend.command.results_home import bring_home
    status, res = client.call("home", {"phase": "plan", "sites": home is None})
    if status != 0:
        sys.stderr.write("gxpc make: results stay on the nodes: %s\n" % res.get("error", "no answer"))
        return rc or 1
    if home is None and not res.get("files"):
        return rc
    failed = bring_home([(str(a), str(b), str(c)) for a, b, c in res.get("files") or []],
                        home or None, os.getcwd())
    client.call("home", {"phase": "done"})
    for line in failed:
        sys.stderr.write("gxpc make: %s\n" % line)
    return rc or (1 if failed else 0)
