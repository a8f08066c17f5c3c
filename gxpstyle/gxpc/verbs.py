"""gxpc's verbs: how they are declared, found, parsed and helped.

A verb is a Verb value: its options and arguments as data, what it needs of a
session, and the function that runs it. The core's verbs are in gxpstyle/gxpc/cli.py;
other packages add theirs through the `gxpstyle.verbs` entry point group (one
entry per verb, naming a Verb), so the core never imports them:

    entry_points={"gxpstyle.verbs": ["mount = sshfsmux.gmount.verbs:MOUNT", ...]}

Entry points are scanned only for a verb the core does not have, and for
`gxpc --help`. The common case is parsed here without argparse (whose import
is most of a short command's start-up); anything unusual (help, `--`, bundled
short options, abbreviations, a bad value) goes to an argparse parser built
from the same declaration, which prints the help texts and reports every usage
error as one line.
No imports beyond sys at load time, for the same reason.
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

ENTRY_POINT_GROUP = "gxpstyle.verbs"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SESSION, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

#: Verb.session: start a daemon if none runs / a session must run / run without one
#: too (the verb gets client None).
START, NEED, OPTIONAL = "start", "need", "optional"

REMAINDER = "..."


class UsageError(Exception):
    """Bad usage, in the user's words; gxpc prints it as one line and exits 2."""


def err(text: str) -> None:
    sys.stderr.write("gxpc: %s\n" % text)


def write_stream(stream: int, data: bytes) -> None:
    """Bytes from the session to our stdout (1) or stderr (2), in order."""
    out = sys.stdout if stream == 1 else sys.stderr
    out.flush()
    out.buffer.write(data)
    out.buffer.flush()


class Opt:
    """An option: kind "flag" (True when given), "str", "int", "float" or "append"."""

    __slots__ = ("flags", "dest", "kind", "help", "metavar", "choices")

    def __init__(self, flags: Sequence[str], kind: str = "str", help: Optional[str] = None,
                 dest: Optional[str] = None, metavar: Optional[str] = None,
                 choices: Optional[Sequence[str]] = None) -> None:
        self.flags = tuple(flags)
        self.kind = kind
        self.help = help
        self.dest = dest or next(f for f in self.flags if f.startswith("--"))[2:].replace("-", "_")
        self.metavar = metavar
        self.choices = choices

    def default(self) -> Any:
        return False if self.kind == "flag" else [] if self.kind == "append" else None


class Arg:
    """A positional argument; nargs None (one), "?", "*", "+" or REMAINDER."""

    __slots__ = ("dest", "nargs", "help", "metavar", "choices")

    def __init__(self, dest: str, nargs: Optional[str] = None, help: Optional[str] = None,
                 metavar: Optional[str] = None, choices: Optional[Sequence[str]] = None) -> None:
        self.dest, self.nargs, self.help, self.metavar, self.choices = dest, nargs, help, metavar, choices

    def default(self) -> Any:
        return [] if self.nargs in ("*", REMAINDER) else None


class Verb:
    """One gxpc verb.

    run(client, args) -> exit status; client is None only for OPTIONAL verbs
    without a session. check(args), if given, runs before any connection: it
    raises UsageError for what can be judged without the session. A `raw` verb
    gets every word after its name untouched, as args.words (gxpc make: those
    are make's), and prints its own help.
    """

    __slots__ = ("name", "help", "description", "run", "options", "args", "session", "check", "raw")

    def __init__(self, name: str, help: str, run: Callable[[Any, Any], int],
                 options: Sequence[Opt] = (), args: Sequence[Arg] = (), session: str = NEED,
                 check: Optional[Callable[[Any], None]] = None, raw: bool = False,
                 description: Union[None, str, Callable[[], str]] = None) -> None:
        self.name, self.help, self.run, self.session = name, help, run, session
        self.options, self.args, self.check, self.raw = tuple(options), tuple(args), check, raw
        self.description = description


class Args:
    """Parsed arguments: one attribute per option and argument dest."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __repr__(self) -> str:
        return "Args(%s)" % ", ".join("%s=%r" % kv for kv in sorted(self.__dict__.items()))


class LazyModule:
    """A module imported on first use of one of its names (for modules that only
    some paths of a verb need)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        module = __import__(self._name, fromlist=["_"])
        return getattr(module, attr)


# -- finding verbs -------------------------------------------------------------------
def plugin_verbs(name: Optional[str] = None) -> Dict[str, Verb]:
    """Verbs other installed packages register, by name (only `name` if given).

    A plugin that fails to load is left out with a one-line warning: one broken
    package must not take every other verb's help with it."""
    from importlib import metadata
    if sys.version_info >= (3, 10):
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    else:                                                   # 3.8, 3.9: a dict of lists
        eps = metadata.entry_points().get(ENTRY_POINT_GROUP, [])
    out: Dict[str, Verb] = {}
    for ep in eps:
        if (name is not None and ep.name != name) or ep.name in out:
            continue
        try:
            verb = ep.load()
        except Exception as e:      # a broken plugin: say which, keep the rest
            err("verb %s (%s) does not load: %s" % (ep.name, ep.value, e))
            continue
        if isinstance(verb, Verb) and verb.name == ep.name:
            out[ep.name] = verb
    return out


def find(name: str, core: Dict[str, Verb]) -> Optional[Verb]:
    if name in core:
        return core[name]
    return plugin_verbs(name).get(name)


def all_verbs(core: Dict[str, Verb]) -> List[Verb]:
    verbs = list(core.values())
    for name, verb in sorted(plugin_verbs().items()):
        if name not in core:
            verbs.append(verb)
    return verbs


# -- parsing -------------------------------------------------------------------------
def split_global(argv: List[str]) -> Tuple[Optional[str], bool, Optional[str], List[str]]:
    """(session dir, help asked, verb name, the verb's words) from gxpc's argv.

    Global options come before the verb; the verb's words are never ours."""
    session: Optional[str] = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--session":
            if i + 1 >= len(argv):
                raise UsageError("--session needs a directory")
            session = argv[i + 1]
            i += 2
        elif a.startswith("--session="):
            session = a[len("--session="):]
            i += 1
        elif a in ("-h", "--help"):
            return session, True, None, argv[i + 1:]
        elif a.startswith("-"):
            raise UsageError("unknown option %s (global options: --session DIR, --help)" % a)
        else:
            return session, False, a, argv[i + 1:]
    return session, False, None, []


def _looks_negative(word: str) -> bool:
    """argparse's negative number: -5, -.5 or -0.5 (not -5.), which is a value."""
    if word[:1] != "-":
        return False
    whole, dot, fraction = word[1:].partition(".")
    if not dot:
        return whole.isdecimal()
    return (whole == "" or whole.isdecimal()) and fraction.isdecimal()


def _convert(opt: Opt, text: str) -> Any:
    if opt.kind == "int":
        return int(text)
    if opt.kind == "float":
        return float(text)
    if opt.choices is not None and text not in opt.choices:
        raise ValueError(text)
    return text


def fast_parse(verb: Verb, words: List[str]) -> Optional[Args]:
    """Args for the plain cases, None for anything argparse must judge."""
    if "--" in words:
        return None     # argparse drops a `--` even from the middle of a command
    by_flag = {f: o for o in verb.options for f in o.flags}
    values: Dict[str, Any] = {o.dest: o.default() for o in verb.options}
    values.update((a.dest, a.default()) for a in verb.args)
    positional: List[str] = []
    rest_to_last = bool(verb.args) and verb.args[-1].nargs == REMAINDER
    ended = False      # a run of positionals ended with an option after it
    i = 0
    try:
        while i < len(words):
            w = words[i]
            if positional and rest_to_last:
                positional.extend(words[i:])
                break
            if w[:1] != "-" or w == "-" or _looks_negative(w):
                if ended:
                    return None
                positional.append(w)
                i += 1
                continue
            if w == "--" or w in ("-h", "--help"):
                return None
            name, eq, inline = w.partition("=") if w.startswith("--") else (w, "", "")
            opt = by_flag.get(name)
            if opt is None:
                return None
            ended = bool(positional)
            if opt.kind == "flag":
                if eq:
                    return None
                values[opt.dest] = True
                i += 1
                continue
            if eq:
                text = inline
                i += 1
            else:
                if i + 1 >= len(words):
                    return None
                text = words[i + 1]
                if text[:1] == "-" and not _looks_negative(text):
                    return None
                i += 2
            if opt.kind == "append":
                values[opt.dest].append(text)
            else:
                values[opt.dest] = _convert(opt, text)
    except ValueError:
        return None
    if not _assign_positionals(verb.args, positional, values):
        return None
    return Args(**values)


def _assign_positionals(args: Sequence[Arg], words: List[str], values: Dict[str, Any]) -> bool:
    words = list(words)
    for k, arg in enumerate(args):
        later_needed = sum(1 for a in args[k + 1:] if a.nargs in (None, "+"))
        if arg.nargs is None or arg.nargs == "?":
            if not words or len(words) <= later_needed:
                if arg.nargs is None:
                    return False
                continue
            if arg.choices is not None and words[0] not in arg.choices:
                return False
            values[arg.dest] = words.pop(0)
        else:
            take = len(words) - later_needed
            if take < (1 if arg.nargs == "+" else 0):
                return False
            values[arg.dest], words = words[:take], words[take:]
    return not words


def parse(verb: Verb, words: List[str]) -> Any:
    """The verb's arguments (argparse prints help or an error and exits when asked)."""
    if verb.raw:
        return Args(words=list(words))
    a = fast_parse(verb, words)
    if a is None:
        a = argparse_parser(verb).parse_args(words)
    return a


def _add_verb_arguments(p: Any, verb: Verb) -> None:
    import argparse
    for o in verb.options:
        kw: Dict[str, Any] = {"dest": o.dest, "help": o.help}
        if o.kind == "flag":
            kw["action"] = "store_true"
        elif o.kind == "append":
            kw.update(action="append", default=[], metavar=o.metavar or "OPT")
        else:
            kw.update(type={"int": int, "float": float}.get(o.kind, str), metavar=o.metavar,
                      choices=o.choices)
        p.add_argument(*o.flags, **kw)
    for a in verb.args:
        nargs = argparse.REMAINDER if a.nargs == REMAINDER else a.nargs
        p.add_argument(a.dest, nargs=nargs, help=a.help, metavar=a.metavar or a.dest.upper(),
                       choices=a.choices, default=a.default())


def argparse_parser(verb: Verb) -> Any:
    import argparse

    class OneLineErrors(argparse.ArgumentParser):
        def error(self, message: str) -> Any:
            raise UsageError("%s: %s (see gxpc %s --help)" % (verb.name, message, verb.name))

    text = verb.description() if callable(verb.description) else verb.description
    p = OneLineErrors(prog="gxpc " + verb.name, description=text or verb.help)
    _add_verb_arguments(p, verb)
    return p


def print_help(core: Dict[str, Verb], description: str, epilog: str, out: Any) -> None:
    """gxpc --help: every verb, the plugins' included."""
    import argparse
    p = argparse.ArgumentParser(prog="gxpc", description=description, epilog=epilog)
    p.add_argument("--session", metavar="DIR",
                   help="session directory (default: $GXP_SESSION or per-user default)")
    sub = p.add_subparsers(dest="verb", metavar="COMMAND")
    for verb in all_verbs(core):
        sub.add_parser(verb.name, help=verb.help)
    p.print_help(out)
