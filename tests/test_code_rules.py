"""Rules the code keeps, checked by reading it:

- no waiting on a timer: no sleep, and no select, poll, wait or call_later
  with a fixed number of seconds, except the few places below, each with
  the reason no event exists there. A wait bounded by a deadline (a variable)
  is not a timer: it ends at once when its event comes;
- small modules and functions: none over MAX_MODULE_LINES lines, no function
  over MAX_FUNCTION_LINES.

Each failure names the file and the function, so the message says what to fix.
"""
from __future__ import annotations

import ast
import os
import re
from typing import Dict, Iterator, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("gxpstyle", "sshfsmux", "make_backend")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

# file:scope -> why a fixed-interval wait is the right tool there. The scope
# is the innermost function (Class.method), or the constant holding the
# source of a program shipped elsewhere (a Python or C string).
TIMED_WAITS_ALLOWED: Dict[str, str] = {
    "gxpstyle/node/job_runner.py:WATCHDOG_SOURCE":
        "the watchdog runs after its agent died, SIGTERMs process groups it is not the "
        "parent of and checks them until KILL_GRACE runs out: no event says a group is "
        "empty, and nobody waits on it",
    "gxpstyle/transport/link_auth.py:Listener._accept_loop":
        "accept failing for lack of descriptors or memory: no event says one is free "
        "again; a short pause instead of a spinning thread (other errors retry at once)",
    "gxpstyle/transport/event_loop.py:EventLoop.watch_child":
        "the last resort for child exits when there is no pidfd and the loop is not on "
        "the main thread (so no SIGCHLD wake-up): nothing else reports the exit",
    "gxpstyle/transport/event_loop.py:EventLoop._poll_children":
        "the same last resort, re-armed while such a child is watched",
    "gxpstyle/bcast/service.py:BcastService._watch_later":
        "the stall watchdog of a transfer: the absence of progress has no event; it "
        "runs only while a transfer does and never delays one",
    "gxpstyle/launch/child_bootstrap.py:ChildStart.kill":
        "reaping a channel just sent SIGKILL: the bound only guards a process stuck in "
        "the kernel",
    "gxpstyle/launch/child_bootstrap.py:ChildStart.reap":
        "at quit, the grace after SIGKILL for a channel that had its chance to exit",
    "gxpstyle/launch/paramiko_channel.py:_pump":
        "paramiko's fileno() is a pipe it sets and clears for stdout and stderr from two "
        "threads without one lock (its OR-pipe can lose a wake-up): a recheck each second",
    "make_backend/hook/c_source.py:CLIENT":
        "sendmsg refused with ETOOMANYREFS (the user's descriptors in flight): nothing "
        "reports the relay taking them; a doubling pause up to 20 ms",
}

# sleep() in any spelling, in Python or in the C and Python sources the
# modules carry as strings; and the shell's `sleep N` where a command starts
# (the job watchdog is a shell script)
_SLEEP = re.compile(r"(?<![\w.])(?:time\.|_time\.)?(?:u|nano)?sleep\s*\("
                    r"|(?:^|;|\bdo|\bthen)\s*sleep\s+[0-9.]")


def _modules() -> Iterator[Tuple[str, str]]:
    for pkg in PACKAGES:
        for root, dirs, files in os.walk(os.path.join(REPO, pkg)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    yield os.path.relpath(path, REPO).replace(os.sep, "/"), path


def _scopes(tree: ast.Module) -> List[Tuple[int, int, str, bool]]:
    """(first line, last line, name, is a function) of every function
    (Class.method) and of every module-level assignment."""
    out: List[Tuple[int, int, str, bool]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out.append((child.lineno, child.end_lineno or child.lineno, name, True))
                visit(child, name + ".")
            elif isinstance(child, ast.Assign) and node is tree:
                targets = [t.id for t in child.targets if isinstance(t, ast.Name)]
                if targets:
                    out.append((child.lineno, child.end_lineno or child.lineno, targets[0], False))
    visit(tree, "")
    return out


def _scope_of(scopes: List[Tuple[int, int, str, bool]], line: int) -> str:
    """The innermost scope holding `line`."""
    best = "<module>"
    size = None
    for first, last, name, _ in scopes:
        if first <= line <= last and (size is None or last - first < size):
            best, size = name, last - first
    return best


def _fixed_number(node: ast.AST) -> bool:
    """A literal number of seconds (or milliseconds) above zero: zero is a
    probe that does not wait, a variable is a deadline or a setting."""
    return (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool) and node.value > 0)


def _timed_call(call: ast.Call) -> str:
    """What makes `call` a wait on a timer, or ''."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else \
        call.func.id if isinstance(call.func, ast.Name) else ""
    timeout = [k.value for k in call.keywords if k.arg == "timeout"]
    if name == "select" and len(call.args) >= 4:
        timeout.append(call.args[3])
    elif name in ("poll", "wait") and call.args:
        timeout.append(call.args[0])
    elif name == "call_later" and call.args:
        timeout.append(call.args[0])
    elif name not in ("select", "poll", "wait", "call_later"):
        return ""
    if any(_fixed_number(t) for t in timeout):
        return "%s() with a fixed timeout" % name
    return ""


def _timed_waits() -> List[str]:
    found = []
    for rel, path in _modules():
        text = open(path, encoding="utf-8").read()
        tree = ast.parse(text, path)
        scopes = _scopes(tree)
        for n, line in enumerate(text.splitlines(), 1):
            if _SLEEP.search(line):
                found.append("%s:%s: sleep (line %d)" % (rel, _scope_of(scopes, n), n))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                what = _timed_call(node)
                if what:
                    found.append("%s:%s: %s (line %d)" % (rel, _scope_of(scopes, node.lineno),
                                                          what, node.lineno))
    return found


def test_no_wait_on_a_timer_but_the_reasoned_ones():
    found = _timed_waits()
    unexplained = [f for f in found if f.split(": ", 1)[0] not in TIMED_WAITS_ALLOWED]
    assert unexplained == [], (
        "a sleep or fixed timeout where an event should wake the code (or add it, with "
        "its reason, to TIMED_WAITS_ALLOWED):\n" + "\n".join(unexplained))


def test_every_reasoned_exception_is_still_there():
    """An entry whose wait is gone must go too: the list stays the truth."""
    seen = {f.split(": ", 1)[0] for f in _timed_waits()}
    stale = sorted(set(TIMED_WAITS_ALLOWED) - seen)
    assert stale == [], "TIMED_WAITS_ALLOWED names waits that no longer exist: %s" % stale


def test_the_check_finds_a_new_sleep(tmp_path):
    """The check must be able to fail: each kind of timed wait is caught."""
    src = ("import time, select\n"
           "def waits(sock, loop, ev, p):\n"
           "    time.sleep(0.01)\n"
           "    select.select([sock], [], [], 0.5)\n"
           "    p.poll(1000)\n"
           "    ev.wait(0.1)\n"
           "    loop.call_later(1.0, waits)\n"
           "def fine(sock, deadline, p):\n"
           "    select.select([sock], [], [], deadline)\n"
           "    p.poll(0)\n")
    tree = ast.parse(src)
    calls = [_timed_call(n) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert sorted(c.split("(")[0] for c in calls if c) == ["call_later", "poll", "select", "wait"]
    assert len([line for line in src.splitlines() if _SLEEP.search(line)]) == 1
    assert _SLEEP.search("usleep(pause);") and not _SLEEP.search("echo sleep 1000 &")
    assert _SLEEP.search("while true; do sleep 0.05; done") and _SLEEP.search("  sleep 1")


def _sizes() -> Tuple[List[str], List[str]]:
    big_modules, long_functions = [], []
    for rel, path in _modules():
        text = open(path, encoding="utf-8").read()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            big_modules.append("%s: %d lines" % (rel, lines))
        tree = ast.parse(text, path)
        for first, last, name, is_function in _scopes(tree):
            node_lines = last - first + 1
            if is_function and node_lines > MAX_FUNCTION_LINES:
                long_functions.append("%s:%s: %d lines" % (rel, name, node_lines))
    return big_modules, long_functions


def test_no_module_over_the_limit():
    big, _ = _sizes()
    assert big == [], "modules over %d lines (split them by concern):\n%s" % (
        MAX_MODULE_LINES, "\n".join(big))


def test_no_function_over_the_limit():
    _, long = _sizes()
    assert long == [], "functions over %d lines:\n%s" % (MAX_FUNCTION_LINES, "\n".join(long))
