"""gxpc: the command line, a thin client of the session daemon (GXP's verbs).

Exit status: 0 success; 1 some host or node failed (each is named on stderr);
2 bad usage, pattern or configuration; 3 no session, or the session refused us;
130 interrupted.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any, Dict, List, Optional

from gxpstyle import cluster_config, hostpattern, session, use_rules
from gxpstyle.client import Client, ClientError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SESSION, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class UsageError(Exception):
    pass


def _err(text: str) -> None:
    sys.stderr.write("gxpc: %s\n" % text)


def _write(stream: int, data: bytes) -> None:
    out = sys.stdout if stream == 1 else sys.stderr
    out.flush()
    out.buffer.write(data)
    out.buffer.flush()


def _rule_options(a: argparse.Namespace) -> Dict[str, Any]:
    opts: Dict[str, Any] = {}
    for name in ("user", "port", "python", "template", "queue", "connect_host", "job_time",
                 "identity_file", "fanout", "timeout"):
        v = getattr(a, name, None)
        if v is not None:
            opts[name] = v
    if a.ssh_option:
        opts["ssh_options"] = list(a.ssh_option)
    if a.batch_option:
        opts["batch_options"] = list(a.batch_option)
    return opts


# -- commands ------------------------------------------------------------------
def cmd_use(c: Client, a: argparse.Namespace) -> int:
    rules = []
    if a.channel:
        if not (a.src and a.dst):
            raise UsageError("use CHANNEL SRC DST: give both a source and a destination pattern")
        rule = use_rules.make_rule(a.channel, a.src, a.dst, _rule_options(a))
        rules.append(rule.to_dict())
    status, result = c.call("use", {"rules": rules})
    if status:
        _err(result.get("error", "use failed"))
        return EXIT_USAGE
    if not a.channel:
        for r in result["rules"]:
            extra = " ".join("%s=%s" % (k, v) for k, v in r.items() if k not in ("channel", "from", "to"))
            print("use %s %s %s%s" % (r["channel"], r["from"], r["to"], (" " + extra) if extra else ""))
    return EXIT_OK


def cmd_explore(c: Client, a: argparse.Namespace) -> int:
    args: Dict[str, Any] = {"targets": list(a.targets), "local": a.local or 0}
    cfg_path = a.config
    if cfg_path is None and not a.targets and not a.local:
        default = cluster_config.default_path()
        if os.path.exists(default):
            cfg_path = default
    fanout, timeout = a.fanout, a.timeout
    if cfg_path:
        cfg = cluster_config.load(cfg_path)
        args["rules"] = [r.to_dict() for r in cfg.use]
        if not a.targets and not a.local:
            args["targets"] = list(cfg.explore)
        fanout = fanout or cfg.fanout
        timeout = timeout or cfg.timeout
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
    args["fanout"] = fanout or 8
    args["timeout"] = timeout or 20.0
    status, result = c.call("explore", args, on_print=_write)
    if status == 2:
        _err(result.get("error", "explore failed"))
        return EXIT_USAGE
    if sys.stderr.isatty() or a.verbose:
        _err("explore: %d up, %d failed (%.1f s)" % (len(result["up"]), len(result["failed"]),
                                                     result["seconds"]))
    return EXIT_FAILED if result["failed"] else EXIT_OK


def cmd_stat(c: Client, a: argparse.Namespace) -> int:
    status, result = c.call("stat")
    nodes = result["nodes"]
    up = sum(1 for n in nodes if n["state"] == "up")
    lost = [n for n in nodes if n["state"] == "lost"]
    print("%d nodes up, %d lost" % (up, len(lost)))
    mask = set(result["mask"]) if result["mask"] is not None else None
    for n in nodes:
        depth = n["id"].count(".")
        mark = "" if mask is None or n["id"] in mask else " (masked out)"
        state = n["state"] if n["state"] == "up" else "%s: %s" % (n["state"].upper(), n["reason"])
        where = n["hostname"] if n["hostname"] == n["name"] else "%s (%s)" % (n["name"], n["hostname"])
        print("%s%s %s [%s] %s pid=%s%s" % ("  " * depth, n["id"], where, n["channel"], state,
                                              n["pid"], mark))
    return EXIT_OK


def cmd_e(c: Client, a: argparse.Namespace, command: Optional[List[str]] = None,
          mask: Optional[str] = None) -> int:
    words = command if command is not None else a.command
    if not words:
        raise UsageError("e: give a command to run")
    from gxpstyle import parallel_shell
    return parallel_shell.run(c, " ".join(words), mask=mask or a.mask, hosts=a.hosts,
                              stdin=a.stdin, host_prefix=a.host_prefix, fold=a.fold)


def cmd_gexec(c: Client, a: argparse.Namespace) -> int:
    return cmd_e(c, a, command=a.command, mask=a.name)


def cmd_simple(name: str, **fixed: Any) -> Any:
    def run(c: Client, a: argparse.Namespace) -> int:
        args = dict(fixed)
        if name == "savemask":
            args["name"] = a.name
        elif name == "cd":
            args["dir"] = a.dir
        elif name == "export":
            env = {}
            for item in a.assignments:
                if "=" not in item:
                    raise UsageError("export: expected VAR=VALUE, got %r" % item)
                k, v = item.split("=", 1)
                env[k] = v
            args["env"] = env
        status, result = c.call(name, args)
        if status:
            _err(result.get("error", "%s failed" % name))
            return EXIT_USAGE
        return EXIT_OK
    return run


def cmd_mount(c: Client, a: argparse.Namespace) -> int:
    opts = _mount_options(a.options)
    args = {"export": os.path.abspath(a.export), "mountpoint": os.path.abspath(a.mountpoint),
            "ro": "ro" in opts, "cipher": opts.get("cipher") != "none"}
    status, result = c.call("mount", args, on_print=_write)
    if status == 2:
        _err(result.get("error", "mount failed"))
        return EXIT_USAGE
    return EXIT_FAILED if status else EXIT_OK


def _mount_options(values: List[str]) -> Dict[str, str]:
    opts: Dict[str, str] = {}
    for v in values:
        for item in v.split(","):
            k, _, val = item.partition("=")
            if k not in ("ro", "rw", "cipher"):
                raise UsageError("mount: unknown option %r (known: ro, rw, cipher=none)" % k)
            if k == "cipher" and val != "none":
                raise UsageError("mount: cipher takes only 'none' (authentication stays on)")
            opts[k] = val
    return opts


def cmd_umount(c: Client, a: argparse.Namespace) -> int:
    args = {"mountpoint": os.path.abspath(a.mountpoint) if a.mountpoint else None}
    status, result = c.call("umount", args, on_print=_write)
    if status == 2:
        _err(result.get("error", "umount failed"))
        return EXIT_USAGE
    return EXIT_FAILED if status else EXIT_OK


def cmd_mw(c: Client, a: argparse.Namespace) -> int:
    """GXP compatibility: `gxpc mw gmnt EXPORT MOUNT` and `gxpc mw gmnt -u`."""
    if a.program != "gmnt":
        raise UsageError("mw: only the gmnt program is built in (got %r)" % a.program)
    if a.unmount:
        a.mountpoint = a.args[0] if a.args else None
        return cmd_umount(c, a)
    if len(a.args) != 2:
        raise UsageError("mw gmnt EXPORT MOUNTPOINT, or mw gmnt -u")
    a.export, a.mountpoint = a.args
    a.options = []
    return cmd_mount(c, a)


def cmd_quit(c: Client, a: argparse.Namespace) -> int:
    try:
        status, result = c.call("quit")
    except ClientError:
        return EXIT_OK   # the daemon closed on us after quitting: that is success
    if result.get("unclean"):
        _err("quit: no clean exit from: %s" % ", ".join(result["unclean"]))
        return EXIT_FAILED
    # Wait until the daemon has removed its socket.
    deadline = time.monotonic() + 5
    while os.path.exists(session.socket_path(c.session_dir)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return EXIT_OK


# -- parser ----------------------------------------------------------------------
def cmd_make(c: Optional[Client], a: argparse.Namespace) -> int:
    from make_backend import make_command
    try:
        return make_command.main(c, c.session_dir if c else "", a.make_args)
    except make_command.MakeUsage as e:
        _err("make: %s" % e)
        return EXIT_USAGE


def _split_make(argv: List[str]) -> "tuple[List[str], Optional[List[str]]]":
    """`gxpc [--session DIR] make ARGS...`: make's arguments are never ours to parse."""
    i = 0
    while i < len(argv):
        if argv[i] == "--session":
            i += 2
        elif argv[i].startswith("--session="):
            i += 1
        else:
            break
    if i < len(argv) and argv[i] == "make":
        return argv[:i + 1], argv[i + 1:]
    return argv, None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gxpc", description="Explore hosts without preinstalling anything, and run commands on all of them.",
        epilog="Exit status: 0 ok, 1 some host/node failed, 2 usage, 3 session problem, 130 interrupted.")
    p.add_argument("--session", metavar="DIR", help="session directory (default: $GXP_SESSION or per-user default)")
    sub = p.add_subparsers(dest="verb", metavar="COMMAND")

    u = sub.add_parser("use", help="say which hosts reach which, by which channel",
                       description="gxpc use CHANNEL SRC DST: hosts matching SRC can start agents on hosts "
                                   "matching DST with CHANNEL (%s). Without arguments, list the rules."
                                   % ", ".join(use_rules.CHANNELS))
    u.add_argument("channel", nargs="?", choices=use_rules.CHANNELS, metavar="CHANNEL")
    u.add_argument("src", nargs="?", metavar="SRC")
    u.add_argument("dst", nargs="?", metavar="DST")
    u.add_argument("--user", "-l")
    u.add_argument("--port", "-p", type=int)
    u.add_argument("--identity-file", "-i", dest="identity_file")
    u.add_argument("--ssh-option", "-o", action="append", default=[], metavar="OPT",
                   help="an option passed to ssh (repeat), e.g. -o ProxyJump=gw")
    u.add_argument("--python", help="interpreter on the targets (default python3)")
    u.add_argument("--template", help="sh channel: command template, e.g. 'docker exec -i {host} {cmd}'")
    u.add_argument("--queue", "-q", help="batch queue or partition")
    u.add_argument("--batch-option", action="append", default=[], metavar="OPT")
    u.add_argument("--connect-host", dest="connect_host", help="batch: address jobs use to reach the parent")
    u.add_argument("--job-time", dest="job_time", help="batch: wall time limit")
    u.add_argument("--fanout", type=int)
    u.add_argument("--timeout", type=float)
    u.set_defaults(func=cmd_use, start=True)

    ex = sub.add_parser("explore", help="bring up agents on hosts, as a tree")
    ex.add_argument("targets", nargs="*", metavar="TARGET", help="host patterns, e.g. 'tb[[01-16]]'")
    ex.add_argument("--local", type=int, metavar="N", help="start N agents on this machine (no ssh needed)")
    ex.add_argument("--config", "-c", metavar="FILE", help="cluster description (YAML)")
    ex.add_argument("--fanout", type=int, help="max children per agent (default 8)")
    ex.add_argument("--timeout", type=float, help="seconds allowed for one host's bootstrap (default 20)")
    ex.add_argument("--verbose", "-v", action="store_true", help="print a summary line")
    ex.set_defaults(func=cmd_explore, start=True)

    st = sub.add_parser("stat", help="show the tree: who bootstrapped whom, by which channel")
    st.set_defaults(func=cmd_stat, start=False)

    for verb, helptext in (("e", "run a shell command on the selected nodes"),
                           ("gexec", "run a command on the nodes of a saved mask")):
        e = sub.add_parser(verb, help=helptext)
        if verb == "gexec":
            e.add_argument("name", metavar="MASK")
        e.add_argument("--host-prefix", "-H", action="store_true", help="prefix each line with its host")
        e.add_argument("--fold", "-b", action="store_true", help="gather output and fold identical ones")
        e.add_argument("--stdin", action="store_true", help="forward our stdin to every node")
        e.add_argument("--mask", "-m", metavar="NAME", help="run on a saved mask")
        e.add_argument("--hosts", metavar="PATTERN", help="only nodes whose name matches")
        e.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND")
        e.set_defaults(func=cmd_e if verb == "e" else cmd_gexec, start=False)

    sm = sub.add_parser("smask", help="select the nodes where the last command succeeded")
    sm.set_defaults(func=cmd_simple("smask"), start=False)
    rm = sub.add_parser("rmask", help="select all nodes again")
    rm.set_defaults(func=cmd_simple("rmask"), start=False)
    sv = sub.add_parser("savemask", help="save the nodes where the last command succeeded as NAME")
    sv.add_argument("name")
    sv.set_defaults(func=cmd_simple("savemask"), start=False)
    cd = sub.add_parser("cd", help="working directory for later commands on every node")
    cd.add_argument("dir")
    cd.set_defaults(func=cmd_simple("cd"), start=False)
    xp = sub.add_parser("export", help="environment for later commands on every node")
    xp.add_argument("assignments", nargs="+", metavar="VAR=VALUE")
    xp.set_defaults(func=cmd_simple("export"), start=False)
    mo = sub.add_parser("mount", help="GMount: every node exports EXPORT and mounts the merged view",
                        description="Every explored node (the head included) exports EXPORT and mounts, "
                                    "at MOUNTPOINT, its own EXPORT merged with every other node's.")
    mo.add_argument("export", metavar="EXPORT")
    mo.add_argument("mountpoint", metavar="MOUNTPOINT")
    mo.add_argument("-o", dest="options", action="append", default=[], metavar="OPT",
                    help="ro (read-only, enforced by every export), cipher=none (no TLS on the "
                         "data channel; authentication stays on)")
    mo.set_defaults(func=cmd_mount, start=False)
    um = sub.add_parser("umount", help="unmount the session's GMount everywhere")
    um.add_argument("mountpoint", nargs="?", metavar="MOUNTPOINT")
    um.set_defaults(func=cmd_umount, start=False)
    mw = sub.add_parser("mw", help="GXP compatibility: mw gmnt EXPORT MOUNT / mw gmnt -u")
    mw.add_argument("program")
    mw.add_argument("-u", dest="unmount", action="store_true")
    mw.add_argument("args", nargs="*")
    mw.set_defaults(func=cmd_mw, start=False)
    mk = sub.add_parser("make", help="GNU make with every recipe on a node the head picks",
                        description="gxpc make [--local] [MAKE-ARGUMENTS...]: see gxpc make --help",
                        add_help=False)
    mk.set_defaults(func=cmd_make, start=False)
    q = sub.add_parser("quit", help="stop every agent and remove what was shipped")
    q.set_defaults(func=cmd_quit, start=False)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    # `gxpc stat | head` must end quietly, like any Unix filter.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    parser = build_parser()
    argv, make_args = _split_make(list(sys.argv[1:] if argv is None else argv))
    a = parser.parse_args(argv)
    a.make_args = make_args or []
    if not a.verb:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    c = Client(a.session)
    try:
        if not c.connect(start=a.start):
            if a.verb == "make":
                c.close()
                return cmd_make(None, a)
            if a.verb == "quit":
                return EXIT_OK
            _err("no session running in %s (start one with gxpc explore)" % c.session_dir)
            return EXIT_SESSION
        return a.func(c, a)
    except UsageError as e:
        _err(str(e))
        return EXIT_USAGE
    except (use_rules.RuleError, hostpattern.PatternError, cluster_config.ConfigError) as e:
        _err(str(e))
        return EXIT_USAGE
    except session.SessionError as e:
        _err(str(e))
        return EXIT_SESSION
    except ClientError as e:
        _err(str(e))
        return EXIT_SESSION
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        c.close()


if __name__ == "__main__":
    sys.exit(main())
