"""gxpc: the command line, a thin client of the session daemon (GXP's verbs).

The core's verbs are here; other packages add theirs (mount, umount, mw, make)
through the `gxpstyle.verbs` entry points, so this module imports none of them
(gxpstyle/gxpc/verbs.py). Every verb's arguments are parsed and checked before any
connection: a usage error never starts or needs a session. Modules are imported
when a verb needs them, so that a short command (`gxpc e true`) costs little
more than the interpreter's own start.

Exit status: 0 success; 1 some host or node failed (each is named on stderr),
a file could not be read or written (disk full, I/O error), or an internal
error; 2 bad usage, pattern, configuration or input file (a path that is not a
regular file, a file over its size cap); 3 no session, or the session refused
us; 130 interrupted.
"""
from __future__ import annotations

import _signal as signal  # the signal module's enums cost more than gxpc e itself
import os
import sys

from gxpstyle.config import limits, user_names
from gxpstyle.gxpc import verbs
from gxpstyle.gxpc.client import Client, ClientError
from gxpstyle.gxpc.verbs import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SESSION,
    EXIT_USAGE,
    OPTIONAL,
    REMAINDER,
    START,
    Arg,
    Opt,
    UsageError,
    Verb,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, Dict, List, Optional

    from gxpstyle.config import hostpattern
else:
    hostpattern = verbs.LazyModule("gxpstyle.config.hostpattern")

DESCRIPTION = "Explore hosts without preinstalling anything, and run commands on all of them."
EPILOG = ("Exit status: 0 ok, 1 some host/node failed or a file could not be read or written, "
          "2 usage (a bad argument, pattern, configuration or input file), 3 session problem, "
          "130 interrupted.")

# use_rules.ELASTIC_WAIT, ELASTIC_IDLE (not imported: gxpc e must not pay for use_rules)
_ELASTIC_WAIT, _ELASTIC_IDLE = 5.0, 60.0
QUIT_WAIT = 5.0     # seconds `gxpc quit` waits for the daemon to exit after its answer

# The names plugins and older code use.
_err = verbs.err
_write = verbs.write_stream


def _rule_options(a: argparse.Namespace) -> Dict[str, Any]:
    opts: Dict[str, Any] = {}
    for name in ("user", "port", "python", "template", "queue", "connect_host", "job_time",
                 "identity_file", "fanout", "timeout", "elastic", "elastic_wait", "elastic_idle"):
        v = getattr(a, name, None)
        if v is not None:
            opts[name] = v
    if a.ssh_option:
        opts["ssh_options"] = list(a.ssh_option)
    if a.batch_option:
        opts["batch_options"] = list(a.batch_option)
    return opts


def _check_range(verb: str, option: str, value: Any) -> None:
    """limits.RANGES[--option] (limits.RangeError is a usage error)."""
    if value is not None:
        limits.check(option.lstrip("-").replace("-", "_"), value, "%s: %s" % (verb, option))


# -- use ---------------------------------------------------------------------------
def check_use(a: argparse.Namespace) -> None:
    from gxpstyle.config import use_rules
    _check_range("use", "--port", a.port)
    _check_range("use", "--fanout", a.fanout)
    _check_range("use", "--timeout", a.timeout)
    _check_range("use", "--elastic-wait", a.elastic_wait)
    _check_range("use", "--elastic-idle", a.elastic_idle)
    if a.elastic is None and (a.elastic_wait is not None or a.elastic_idle is not None):
        raise UsageError("use: --elastic-wait and --elastic-idle need --elastic MIN-MAX")
    a.rules = []
    if a.channel:
        if not (a.src and a.dst):
            raise UsageError("use CHANNEL SRC DST: give both a source and a destination pattern")
        try:
            a.rules.append(use_rules.make_rule(a.channel, a.src, a.dst, _rule_options(a)).to_dict())
        except use_rules.RuleError as e:
            raise UsageError("use: %s" % e) from None
    elif any(v not in (None, []) for k, v in vars(a).items() if k not in ("channel", "src", "dst", "rules")):
        raise UsageError("use: options need a rule: gxpc use CHANNEL SRC DST [OPTIONS]")


def cmd_use(c: Client, a: argparse.Namespace) -> int:
    status, result = c.call("use", {"rules": a.rules})
    if status:
        _err(result.get("error", "use failed"))
        return EXIT_USAGE
    if not a.channel:
        for r in result["rules"]:
            extra = " ".join("%s=%s" % (k, v) for k, v in r.items() if k not in ("channel", "from", "to"))
            print("use %s %s %s%s" % (r["channel"], r["from"], r["to"], (" " + extra) if extra else ""))
    return EXIT_OK


# -- explore -------------------------------------------------------------------------
def check_explore(a: argparse.Namespace) -> None:
    """Everything explore sends, checked and built before a session is touched:
    the cluster file is read here (the only verb that needs YAML)."""
    _check_range("explore", "--local", a.local)
    _check_range("explore", "--fanout", a.fanout)
    _check_range("explore", "--timeout", a.timeout)
    args: Dict[str, Any] = {"targets": list(a.targets), "local": a.local or 0}
    cfg_path = a.config
    fanout, timeout = a.fanout, a.timeout
    if cfg_path is None and not a.targets and not a.local:
        from gxpstyle.config import cluster_config
        default = cluster_config.default_path()
        if os.path.exists(default):
            cfg_path = default
    if cfg_path:
        from gxpstyle.config import cluster_config
        cfg = cluster_config.load(cfg_path)
        args["rules"] = [r.to_dict() for r in cfg.use]
        if not a.targets and not a.local:
            args["targets"] = list(cfg.explore)
        fanout = cfg.fanout if fanout is None else fanout
        timeout = cfg.timeout if timeout is None else timeout
        # Per-cluster settings travel per host; the head applies them when it
        # plans (fan-out) and spawns (timeout, python), under any rule option.
        settings = {}
        for pat in args["targets"]:
            for host in hostpattern.expand(pat):
                if cfg.cluster_for(host) is not None:
                    settings[host] = cfg.settings_for(host)
        args["host_settings"] = settings
    if not args["targets"] and not args["local"]:
        raise UsageError("explore: name target hosts, --local N, or --config FILE with an explore list")
    for t in args["targets"]:
        hostpattern.expand(t)   # a bad pattern is a usage error before anything starts
    args["fanout"] = 8 if fanout is None else fanout
    args["timeout"] = 20.0 if timeout is None else float(timeout)
    a.request = args


def cmd_explore(c: Client, a: argparse.Namespace) -> int:
    status, result = c.call("explore", a.request, on_print=_write)
    if status == 2:
        _err(result.get("error", "explore failed"))
        return EXIT_USAGE
    if sys.stderr.isatty() or a.verbose:
        _err("explore: %d up, %d failed (%.1f s)" % (len(result["up"]), len(result["failed"]),
                                                     result["seconds"]))
    return EXIT_FAILED if result["failed"] else EXIT_OK


def cmd_stat(c: Client, a: argparse.Namespace) -> int:
    result = c.stat()
    nodes = result["nodes"]
    up = sum(1 for n in nodes if n["state"] == "up")
    lost = [n for n in nodes if n["state"] == "lost"]
    catalog = ""
    if result.get("catalog_entries") or result.get("bytes_moved"):
        # the replica catalog (files of the shared mount whose holders the head
        # knows) and the input bytes recipes were placed away from
        catalog = "; catalog: %d files, %d bytes moved to recipes" % (
            result.get("catalog_entries", 0), result.get("bytes_moved", 0))
    wan = result.get("wan") or {}
    if wan:
        # what crossed the WAN along the tree: each site's gateway link, in and
        # out (on the first line: the lines after it are the nodes)
        catalog += "; WAN: %d bytes between sites (%s)" % (
            sum(i + o for i, o in wan.values()),
            ", ".join("site %s: %d in, %d out" % (s, i, o) for s, (i, o) in sorted(wan.items())))
    print("%d nodes up, %d lost%s" % (up, len(lost), catalog))
    for pool in result.get("elastic") or []:
        # an elastic rule's pool: its range, and its agents by state
        print("elastic %s %d-%d: %d up, %d pending, %d leaving%s" % (
            pool["rule"], pool["min"], pool["max"], pool["up"], pool["pending"], pool["leaving"],
            "; last failure: %s" % pool["error"] if pool.get("error") else ""))
    mask = set(result["mask"]) if result["mask"] is not None else None
    for n in nodes:
        depth = n["id"].count(".")
        mark = "" if mask is None or n["id"] in mask else " (masked out)"
        state = n["state"] if n["state"] == "up" else "%s: %s" % (n["state"].upper(), n["reason"])
        where = n["hostname"] if n["hostname"] == n["name"] else "%s (%s)" % (n["name"], n["hostname"])
        print("%s%s %s [%s] %s pid=%s%s" % ("  " * depth, n["id"], where, n["channel"], state,
                                              n["pid"], mark))
    return EXIT_OK


# -- e, gexec ------------------------------------------------------------------------
def check_e(a: argparse.Namespace, verb: str = "e") -> None:
    if not a.command:
        raise UsageError("%s: give a command to run" % verb)
    if a.hosts is not None:
        hostpattern.compile_pattern(a.hosts)
    for what, mask in (("--mask", a.mask), ("MASK", getattr(a, "name", None))):
        if mask is not None:
            problem = user_names.mask_name_problem(mask)
            if problem:
                raise UsageError("%s: %s: %s" % (verb, what, problem))


def check_gexec(a: argparse.Namespace) -> None:
    check_e(a, "gexec")


def cmd_e(c: Client, a: argparse.Namespace, command: Optional[List[str]] = None,
          mask: Optional[str] = None) -> int:
    words = command if command is not None else a.command
    if not words:
        raise UsageError("e: give a command to run")
    from gxpstyle.shell import parallel_shell
    return parallel_shell.run(c, " ".join(words), mask=mask or a.mask, hosts=a.hosts,
                              stdin=a.stdin, host_prefix=a.host_prefix, fold=a.fold)



def cmd_gexec(c: Client, a: argparse.Namespace) -> int:
    return cmd_e(c, a, command=a.command, mask=a.name)


# -- masks, cd, export -----------------------------------------------------------------
def check_savemask(a: argparse.Namespace) -> None:
    problem = user_names.mask_name_problem(a.name)
    if problem:
        raise UsageError("savemask: %s" % problem)


def check_cd(a: argparse.Namespace) -> None:
    """An absolute directory that exists on the head. The nodes are not asked
    here (that would be a round over the tree for every cd): a node without the
    directory fails each later command with its own one-line reason."""
    if not a.dir:
        raise UsageError("cd: give a directory, e.g. gxpc cd %s" % os.getcwd())
    if not os.path.isabs(a.dir):
        raise UsageError("cd: give an absolute directory (nodes do not share your working "
                         "directory), e.g. gxpc cd %s" % os.path.join(os.getcwd(), a.dir))
    if not os.path.isdir(a.dir):
        why = "not a directory" if os.path.exists(a.dir) else "no such directory"
        raise UsageError("cd: %s: %s on this host (the head runs commands too)" % (a.dir, why))
    a.dir = os.path.normpath(a.dir)


def check_export(a: argparse.Namespace) -> None:
    env: Dict[str, str] = {}
    for item in a.assignments:
        if "=" not in item:
            raise UsageError("export: expected VAR=VALUE, got %r" % item)
        k, v = item.split("=", 1)
        problem = user_names.env_name_problem(k)
        if problem:
            raise UsageError("export: %s" % problem)
        env[k] = v
    a.env = env


def cmd_simple(name: str) -> Any:
    """A request whose arguments its check prepared, answered with a status only."""
    def run(c: Client, a: argparse.Namespace) -> int:
        args: Dict[str, Any] = {}
        if name == "savemask":
            args["name"] = a.name
        elif name == "cd":
            args["dir"] = a.dir
        elif name == "export":
            args["env"] = a.env
        status, result = c.call(name, args)
        if status:
            _err(result.get("error", "%s failed" % name))
            return EXIT_USAGE
        return EXIT_OK
    return run


# -- bcast -----------------------------------------------------------------------------
def check_bcast(a: argparse.Namespace) -> None:
    """SRC is a file here (made absolute) or NODE:PATH; DEST is absolute."""
    node, sep, path = a.src.partition(":")
    if sep and node and "/" not in node:
        if not path:
            raise UsageError("bcast: give a path after %s:" % node)
        a.src_nodes, a.src_path = node, path
    else:
        a.src_nodes, a.src_path = None, os.path.abspath(a.src)
        if not os.path.isfile(a.src_path):
            why = "not a regular file" if os.path.exists(a.src_path) else "no such file"
            raise UsageError("bcast: %s: %s on this host (NODE:PATH names a file on a node)"
                             % (a.src, why))
    if not os.path.isabs(a.dest):
        raise UsageError("bcast: give DEST as an absolute path (got %r): it is the same path "
                         "on every node" % a.dest)


def cmd_bcast(c: Client, a: argparse.Namespace) -> int:
    progress = sys.stderr.isatty()

    def on_print(stream: int, data: bytes) -> None:
        if progress:
            _write(stream, data)

    args = {"src": a.src_path, "src_nodes": a.src_nodes, "dest": a.dest, "mask": a.mask,
            "hosts": a.hosts, "progress": progress}
    status, result = c.call("bcast", args, on_print=on_print)
    if progress:
        sys.stderr.write("\r\033[K")
    if status == 2 or "nodes" not in result:
        _err(result.get("error", "bcast failed"))
        return EXIT_USAGE if status == 2 else EXIT_FAILED
    names = result["nodes"]
    if a.verbose:
        plan = result.get("plan", {})
        for nid in sorted(plan, key=lambda n: [int(x) for x in n.split(".")]):
            sys.stderr.write("bcast: %s (%s) <- %s\n" % (names.get(nid, nid), nid, plan[nid] or "-"))
        secs = max(result.get("seconds", 0.0), 1e-6)
        sys.stderr.write("bcast: %d bytes to %d nodes in %.2f s (%.1f MB/s per node)\n"
                         % (result["bytes"], len(names), secs, result["bytes"] / secs / 1e6))
    if result.get("error"):
        _err("bcast: %s" % result["error"])
        return EXIT_FAILED
    for nid, why in sorted(result.get("failed", {}).items()):
        sys.stderr.write("%s: %s\n" % (names.get(nid, nid), why))
    return EXIT_FAILED if result.get("failed") else EXIT_OK


PATH_MAX = 4096     # bytes of a path, its NUL included (Linux)
MAX_WHERE_PATHS = 4096


def check_where(a: argparse.Namespace) -> None:
    if len(a.paths) > MAX_WHERE_PATHS:
        raise UsageError("where: at most %d paths at once" % MAX_WHERE_PATHS)
    if "" in a.paths:
        raise UsageError("where: an empty path names nothing")
    a.paths = [os.path.abspath(p) for p in a.paths]
    for p in a.paths:
        if len(os.fsencode(p)) >= PATH_MAX:
            raise UsageError("where: %s...: longer than a path can be (%d bytes)" % (p[:40], PATH_MAX))


def cmd_where(c: Client, a: argparse.Namespace) -> int:
    """Which nodes hold each file, as the replica catalog knows it."""
    paths = a.paths
    status, result = c.call("where", {"paths": paths})
    if status:
        _err(result.get("error", "where failed"))
        return EXIT_USAGE if status == 2 else EXIT_FAILED
    missing = False
    for p in paths:
        reps = result["replicas"].get(os.path.normpath(p)) or []
        if not reps:
            missing = True
        # node:size, and :sha256 where the catalog knows the content's hash
        print("%s\t%s" % (p, ",".join("%s:%d%s" % (r[0], r[1], ":" + r[3] if r[3] else "")
                                       for r in reps) or "-"))
    return EXIT_FAILED if missing else EXIT_OK


def cmd_quit(c: Optional[Client], a: argparse.Namespace) -> int:
    if c is None:
        # Nothing answers. If a daemon died there (killed, out of memory), its
        # agents and jobs died with it: remove what it left, and say so.
        from gxpstyle.head import session
        died = os.path.exists(session.socket_path(a.session_dir))
        if os.path.isdir(a.session_dir):
            session.remove_dead_session(a.session_dir)
        _remove_dead_make_relays()
        if died:
            _err("quit: the session daemon had died; removed what it left in %s" % a.session_dir)
        return EXIT_OK
    try:
        status, result = c.call("quit")
    except ClientError:
        return EXIT_OK   # the daemon closed on us after quitting: that is success
    if result.get("unclean"):
        _err("quit: no clean exit from: %s" % ", ".join(result["unclean"]))
        return EXIT_FAILED
    # Wait until the daemon has gone (its socket removed first): our
    # connection ends when it exits.
    c.wait_closed(QUIT_WAIT)
    _remove_dead_make_relays()
    return EXIT_OK


def _remove_dead_make_relays() -> None:
    """What a `gxpc make` killed with SIGKILL left on this host: its relay's
    directory, named after its pid (make_backend/command/make_command.py relay_dir)."""
    import tempfile

    from gxpstyle.config import safe_paths
    for parent in {tempfile.gettempdir(), "/tmp"}:
        safe_paths.remove_dead_owner_dirs(parent, "gxpmake-")


# -- the core's verbs ------------------------------------------------------------------
def _use_description() -> str:
    from gxpstyle.config import use_rules
    return ("gxpc use CHANNEL SRC DST: hosts matching SRC can start agents on hosts matching DST "
            "with CHANNEL (%s). Without arguments, list the rules." % ", ".join(use_rules.CHANNELS))


def _e_options() -> List[Opt]:
    return [Opt(("--host-prefix", "-H"), "flag", "prefix each line with its host"),
            Opt(("--fold", "-b"), "flag", "gather output and fold identical ones"),
            Opt(("--stdin",), "flag", "forward our stdin to every node"),
            Opt(("--mask", "-m"), metavar="NAME", help="run on a saved mask"),
            Opt(("--hosts",), metavar="PATTERN", help="only nodes whose name matches")]


CORE: Dict[str, Verb] = {v.name: v for v in (
    Verb("use", "say which hosts reach which, by which channel", cmd_use, session=START, check=check_use,
         description=_use_description,
         args=[Arg("channel", "?", metavar="CHANNEL"),
               Arg("src", "?", metavar="SRC"), Arg("dst", "?", metavar="DST")],
         options=[Opt(("--user", "-l")),
                  Opt(("--port", "-p"), "int", "ssh port (1 to 65535)"),
                  Opt(("--identity-file", "-i")),
                  Opt(("--ssh-option", "-o"), "append",
                      "an option passed to ssh (repeat), e.g. -o ProxyJump=gw"),
                  Opt(("--python",), help="interpreter on the targets (default python3)"),
                  Opt(("--template",),
                      help="sh channel: command template, e.g. 'docker exec -i {host} {cmd}'"),
                  Opt(("--queue", "-q"), help="batch queue or partition"),
                  Opt(("--batch-option",), "append"),
                  Opt(("--connect-host",), help="batch: address jobs use to reach the parent"),
                  Opt(("--job-time",), help="batch: wall time limit"),
                  Opt(("--elastic",), metavar="MIN-MAX",
                      help="batch: a pool of MIN to MAX agents (0 <= MIN <= MAX <= %d) that grows "
                      "while gxpc make's recipes wait for a slot and shrinks when agents idle; "
                      "DST names its agents (e.g. 'job[[1-16]]'), explore starts MIN"
                      % limits.RANGES["elastic"][1]),
                  Opt(("--elastic-wait",), "float", metavar="SECONDS",
                      help="elastic: submit an agent once a recipe waited this long for a slot "
                      "(0 to %d, default %g)" % (limits.RANGES["elastic_wait"][1], _ELASTIC_WAIT)),
                  Opt(("--elastic-idle",), "float", metavar="SECONDS",
                      help="elastic: release an agent idle this long, down to MIN (0 to %d, "
                      "default %g)" % (limits.RANGES["elastic_idle"][1], _ELASTIC_IDLE)),
                  Opt(("--fanout",), "int", "max children of each node this rule reaches (1 to %d)"
                      % limits.RANGES["fanout"][1]),
                  Opt(("--timeout",), "float", "seconds for one host's bootstrap (%g to %d)"
                      % limits.RANGES["timeout"][:2])]),
    Verb("explore", "bring up agents on hosts, as a tree", cmd_explore, session=START, check=check_explore,
         args=[Arg("targets", "*", metavar="TARGET", help="host patterns, e.g. 'tb[[01-16]]'")],
         options=[Opt(("--local",), "int", metavar="N",
                      help="start N agents on this machine, no ssh needed (0 to %d)"
                      % limits.RANGES["local"][1]),
                  Opt(("--config", "-c"), metavar="FILE", help="cluster description (YAML)"),
                  Opt(("--fanout",), "int", "max children per agent (1 to %d, default 8)"
                      % limits.RANGES["fanout"][1]),
                  Opt(("--timeout",), "float", "seconds allowed for one host's bootstrap (%g to %d, "
                      "default 20)" % limits.RANGES["timeout"][:2]),
                  Opt(("--verbose", "-v"), "flag", "print a summary line")]),
    Verb("stat", "show the tree: who bootstrapped whom, by which channel", cmd_stat),
    Verb("e", "run a shell command on the selected nodes", cmd_e, check=check_e,
         options=_e_options(), args=[Arg("command", REMAINDER, metavar="COMMAND")]),
    Verb("gexec", "run a command on the nodes of a saved mask", cmd_gexec, check=check_gexec,
         options=_e_options(),
         args=[Arg("name", metavar="MASK"), Arg("command", REMAINDER, metavar="COMMAND")]),
    Verb("smask", "select the nodes where the last command succeeded", cmd_simple("smask")),
    Verb("rmask", "select all nodes again", cmd_simple("rmask")),
    Verb("savemask", "save the nodes where the last command succeeded as NAME", cmd_simple("savemask"),
         args=[Arg("name", metavar="NAME")], check=check_savemask),
    Verb("cd", "working directory for later commands on every node", cmd_simple("cd"),
         args=[Arg("dir", metavar="DIR", help="an absolute directory; it must exist here, on the head")],
         check=check_cd),
    Verb("export", "environment for later commands on every node", cmd_simple("export"),
         args=[Arg("assignments", "+", metavar="VAR=VALUE")], check=check_export),
    Verb("bcast", "copy a file to the same path on every selected node", cmd_bcast,
         check=check_bcast,
         description="gxpc bcast SRC DEST: copy SRC (a file here, or NODE:PATH on a node; a "
         "pattern for NODE names identical copies, used if one fails) to DEST on every selected "
         "node. Chunks are forwarded along the explored tree as they arrive, and the nodes of one "
         "site (the children of one parent) pass them on in a chain over direct TCP/TLS links "
         "between them; each chunk is checked against the source's SHA-256; DEST appears only "
         "complete and verified (written under a hidden "
         "temporary name, then renamed). DEST ending in / or naming a directory gets SRC's name. "
         "Exit 1 names each node that failed, with its reason.",
         args=[Arg("src", metavar="SRC"), Arg("dest", metavar="DEST")],
         options=[Opt(("--mask", "-m"), metavar="NAME", help="copy to a saved mask"),
                  Opt(("--hosts",), metavar="PATTERN", help="only nodes whose name matches"),
                  Opt(("--verbose", "-v"), "flag", "print the plan and the time taken")]),
    Verb("where", "which nodes hold each file of the shared mount (the catalog)",
         cmd_where, args=[Arg("paths", "+", metavar="PATH")], check=check_where),
    Verb("quit", "stop every agent and remove what was shipped", cmd_quit, session=OPTIONAL),
)}


# -- main ------------------------------------------------------------------------------
def _user_error_types() -> tuple:
    """Exceptions that are the user's mistake (exit 2), of the modules loaded so far:
    a module not imported cannot have raised its error."""
    types: List[type] = [UsageError, limits.RangeError]
    for module, name in (("gxpstyle.config.use_rules", "RuleError"), ("gxpstyle.config.hostpattern",
                                                                      "PatternError"),
                         ("gxpstyle.config.cluster_config", "ConfigError"),
                         ("gxpstyle.head.session", "SessionPathError")):
        m = sys.modules.get(module)
        if m is not None:
            types.append(getattr(m, name))
    return tuple(types)


def _session_error_types() -> tuple:
    m = sys.modules.get("gxpstyle.head.session")
    return (ClientError,) + ((m.SessionError,) if m is not None else ())


def main(argv: Optional[List[str]] = None) -> int:
    # `gxpc stat | head` must end quietly, like any Unix filter.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    words = list(sys.argv[1:] if argv is None else argv)
    c: Optional[Client] = None
    try:
        session_dir, want_help, name, words = verbs.split_global(words)
        if want_help or name is None:
            verbs.print_help(CORE, DESCRIPTION, EPILOG, sys.stdout if want_help else sys.stderr)
            return EXIT_OK if want_help else EXIT_USAGE
        verb = verbs.find(name, CORE)
        if verb is None:
            raise UsageError("unknown command %r (gxpc --help lists the commands)" % name)
        a = verbs.parse(verb, words)
        if verb.check is not None:
            verb.check(a)
        c = Client(session_dir)
        try:
            connected = c.connect(start=verb.session == START)
        except OSError as e:    # the session's directory or socket: a session problem
            raise ClientError("%s: %s" % (e.filename or c.session_dir, e.strerror or e)) from None
        if not connected:
            where = c.session_dir
            a.session_dir = where
            c.close()
            c = None
            if verb.session != OPTIONAL:
                _err("no session running in %s (start one with gxpc explore)" % where)
                return EXIT_SESSION
        return verb.run(c, a)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as e:
        if isinstance(e, _user_error_types()):
            _err(str(e))
            return EXIT_USAGE
        if isinstance(e, _session_error_types()):
            _err(str(e))
            return EXIT_SESSION
        if isinstance(e, OSError):
            # a file that could not be read or written (disk full, I/O error)
            what = e.strerror or str(e)
            _err("%s: %s" % (e.filename, what) if e.filename else what)
            return EXIT_FAILED
        if os.environ.get("GXP_DEBUG"):
            raise
        # A bug of ours: one line, not a traceback (GXP_DEBUG=1 shows it).
        _err("internal error, please report it (GXP_DEBUG=1 for details): %s" % (e,))
        return EXIT_FAILED
    finally:
        if c is not None:
            c.close()


if __name__ == "__main__":
    sys.exit(main())
