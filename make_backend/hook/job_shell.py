"""The fallback hook: the SHELL that `gxpc make` gives GNU make when its
compiled hook (hook/c_source.py, relay.py) cannot be used. One Python process per
recipe (about 40 ms of CPU), and visible to the makefile as $(SHELL).

make runs it as

    python -m make_backend.hook.job_shell --recipe -c 'RECIPE'

(.SHELLFLAGS is expanded per recipe: `$(if $@,--recipe)` says whether make runs
a recipe or a `$(shell ...)` at parse time, and is the same word whatever the
target is called: no target or prerequisite name ever reaches a command line,
so none can become code). It asks the session's head for
a node, streams the recipe's stdout and stderr back to make's own, and exits
with the recipe's status, so make's messages, -k, -i, .DELETE_ON_ERROR and exit
codes are make's own.

Runs here instead (plain /bin/sh, as make would): `$(shell ...)` at parse time
(no target), and recipe lines that run make recursively (the sub-make must run
where the session is; its own recipes come back through this shell).
"""
from __future__ import annotations

import os
import re
import signal
import sys
from typing import Any, Dict, List, NoReturn, Optional, Tuple

# Variables that describe this login, not the job: never copied to another node.
HOST_BOUND = frozenset((
    "GXP_SESSION", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "DISPLAY", "XAUTHORITY",
    "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", "SSH_AGENT_PID",
    "XDG_RUNTIME_DIR", "XDG_SESSION_ID", "TMUX", "TMUX_PANE", "STY", "WINDOWID",
))

EXIT_SHELL_FAILED = 127   # what a shell says when it cannot run the command at all
_RECURSIVE = re.compile(r"(^|[\s;&|(`])(\S*/)?g?make(\s|$)")


class Usage(Exception):
    pass


def parse_args(argv: List[str]) -> Tuple[bool, str]:
    """(is a recipe, recipe) from `[--recipe] -c RECIPE`."""
    if argv[:1] == ["--recipe"]:
        is_recipe, argv = True, argv[1:]
    else:
        is_recipe = False
    if len(argv) != 2 or argv[0] != "-c":
        raise Usage("usage: job_shell [--recipe] -c RECIPE")
    return is_recipe, argv[1]


def label(recipe: str) -> str:
    """How messages name a recipe: its first line, shortened."""
    first = recipe.strip().split("\n", 1)[0]
    return first if len(first) <= 60 else first[:57] + "..."


def is_recursive(recipe: str, makeflags: str) -> bool:
    """Does this recipe line run make? make keeps its jobserver pipe open only
    for such lines ($(MAKE) or +); without a pipe jobserver (-j1, or make 4.4's
    --jobserver-auth=fifo:PATH, which leaves no descriptor to look at), look at
    the words."""
    m = re.search(r"--jobserver-(?:auth|fds)=(\d+),(\d+)", makeflags)
    if m:
        try:
            os.fstat(int(m.group(1)))
            return True
        except OSError:
            pass
    return bool(_RECURSIVE.search(recipe))


def strip_inner_prefixes(recipe: str) -> str:
    """What make does to a .ONESHELL recipe when SHELL is a POSIX shell (it does
    not for ours): drop blanks and @-+ at the start of every logical line; an
    escaped newline continues the line."""
    out = []
    i, n = 0, len(recipe)
    while i < n:
        while i < n and recipe[i] in " \t@-+":
            i += 1
        esc = False
        while i < n:
            ch = recipe[i]
            out.append(ch)
            i += 1
            if ch == "\\":
                esc = not esc
            else:
                if ch == "\n" and not esc:
                    break
                esc = False
    return "".join(out)


def job_env(environ: Dict[str, str]) -> Dict[str, str]:
    """What the recipe sees: make's environment (what it exported), like
    Slurm's --export=ALL, less what belongs to this login only."""
    return {k: v for k, v in environ.items() if k not in HOST_BOUND}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BrokenPipeError:
            return
        except InterruptedError:
            continue
        view = view[n:]


def _err(text: str) -> None:
    _write_all(2, ("gxpc make: %s\n" % text).encode(errors="replace"))


def run_here(recipe: str) -> NoReturn:
    os.execv("/bin/sh", ["/bin/sh", "-c", recipe])


def run_remote(session_dir: str, recipe: str) -> int:
    from gxpstyle.gxpc.client import Client, ClientError

    target = label(recipe)

    c = Client(session_dir)
    interrupts = []   # signals received, in order
    current: Dict[str, Any] = {}

    def on_signal(signum: int, frame: object) -> None:
        interrupts.append(signum)
        node, job = current.get("node"), current.get("job")
        if node is None or job is None:     # set together: no recipe is running
            return
        sig = signum if len(interrupts) == 1 else signal.SIGKILL
        try:
            c.send(str(node), {"op": "kill", "job": int(job), "sig": int(sig)})
        except OSError:
            pass

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    try:
        if not c.connect(start=False):
            _err("no session in %s (it ended while make was running)" % session_dir)
            return EXIT_SHELL_FAILED
        avoid: List[str] = []
        for attempt in (1, 2):
            args = {"cmd": recipe, "cwd": os.getcwd(), "env": job_env(dict(os.environ)),
                    "avoid": avoid}
            status, result = c.call("job", args)
            if status:
                _err("%s: %s" % (target, result.get("error", "no node for the recipe")))
                return EXIT_SHELL_FAILED
            node, job, name = result["node"], result["job"], result["name"]
            current.update(node=node, job=job)
            if interrupts:
                on_signal(interrupts[-1], None)
            code, error = _follow(c, node, job)
            current.clear()
            if error.startswith("node lost") and attempt == 1 and not interrupts:
                # make must see only the final result: run it once more elsewhere.
                _err("%s: %s on %s; running it again on another node" % (target, error, name))
                avoid.append(node)
                continue
            if error and not error.startswith("killed by signal"):
                _err("%s: %s (on %s)" % (target, error, name))
            return code
        return EXIT_SHELL_FAILED
    except ClientError as e:
        _err(str(e))
        return EXIT_SHELL_FAILED
    finally:
        c.close()
        if interrupts:
            # Die of the signal, as a shell would: make then reports "Interrupt".
            signal.signal(interrupts[0], signal.SIG_DFL)
            os.kill(os.getpid(), interrupts[0])


def _follow(c: object, node: str, job: int) -> Tuple[int, str]:
    """Stream the job's output to ours until its exit: (status, error)."""
    while True:
        try:
            item = c.next_message()  # type: ignore[attr-defined]
        except InterruptedError:
            continue
        if item is None:
            continue
        src, msg = item
        if src != node or msg.get("job") != job:
            continue
        if msg["op"] == "out":
            _write_all(msg["fd"], msg["data"])
        elif msg["op"] == "exit":
            return msg["status"], msg["error"]


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        is_recipe, recipe = parse_args(argv)
    except Usage as e:
        _err(str(e))
        return 2
    recipe = strip_inner_prefixes(recipe)
    session_dir = os.environ.get("GXP_SESSION")
    if not is_recipe or not session_dir or is_recursive(recipe, os.environ.get("MAKEFLAGS", "")):
        run_here(recipe)
    return run_remote(session_dir, recipe)


if __name__ == "__main__":
    sys.exit(main())
