"""Every gxpc verb with hostile arguments (issue 25): empty, huge, binary,
special files, paths over PATH_MAX, patterns that expand to millions of names.
Each gxpc runs under a memory limit (RLIMIT_AS) and a deadline and must end
with exit 0, 1 or 2 as the README's table says, in lines of words (never a
traceback, an internal error or an exception's name); afterwards the daemon
is still small, `gxpc e true` works, and once the session is quit nothing of
the user's is left in /tmp (local agents: the nodes' files are there too).
Run as an ordinary user where the test bed can make one, from the installed venv."""
from __future__ import annotations

import os
import pwd
import re
import resource
import socket
import subprocess
import time

MEMORY_LIMIT = 1 << 30          # address space of each gxpc process
DEADLINE = 60.0                 # seconds for one gxpc
DAEMON_RSS_LIMIT_KB = 300 << 10
EXCEPTION_NAME = re.compile(rb"\b[A-Z][A-Za-z]*(Error|Exception)\b|Traceback|internal error")
V = object()                    # where a template takes the hostile value

TEMPLATES = [
    ["use", "ssh", V, V], ["use", "ssh", "head", V], ["use", "sh", "head", "h1", "--template", V],
    ["use", "ssh", "head", "h1", "--port", V], ["explore", V], ["explore", "--config", V],
    ["explore", "--local", V], ["explore", "--fanout", V, "h1"], ["stat", V],
    ["e", V], ["e", "--hosts", V, "true"], ["e", "-m", V, "true"], ["gexec", V, "true"],
    ["smask", V], ["rmask", V], ["savemask", V], ["cd", V], ["export", V], ["export", b"A=", V],
    ["bcast", V, "@/dest"], ["bcast", "@/src", V], ["bcast", "--hosts", V, "@/src", "@/dest"],
    ["where", V], ["mount", V, V], ["mount", "-o", V, "@/export", "@/mnt"], ["umount", V],
    ["mw", "gmnt", V, V], ["mw", V, V, V], ["make", "--joblog", V, "-n"], [b"make", b"--trace=", V, b"-n"],
    ["make", "-j", V, "-n"], ["plot", V, "-o", "@/out.png"], ["plot", "/etc/hostname", "-o", V],
    [V], ["--session", V, "stat"], [V, V],
]


def hostile_values(fifo: str) -> dict:
    return {"empty": "", "huge": "x" * 100_000, "binary": b"\xff\xfe\x80\x01bin",
            "dev_zero": "/dev/zero", "dev_full": "/dev/full", "dev_null": "/dev/null",
            "fifo": fifo, "over_path_max": "/" + "d/" * 2100,
            "millions": "h[[1-1000]][[1-1000]]", "glob": "*", "option": "--x", "number": "1" * 400}


def argv_for(template: list, value, scratch: str) -> list:
    """The template with the value in place and @ as the scratch directory, as
    bytes; parts written as one, like b"A=" V, are joined."""
    parts = [value if p is V else (scratch + p[1:] if p[:1] == "@" else p) for p in template]
    parts = [os.fsencode(p) for p in parts]
    out: list = []
    for i, p in enumerate(parts):
        joined = i > 0 and isinstance(template[i - 1], bytes) and template[i - 1].endswith(b"=")
        if joined:
            out[-1] += p
        else:
            out.append(p)
    return out


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_limited(gxp, args: list) -> subprocess.CompletedProcess:
    argv = [os.fsencode(a) for a in gxp.argv([])] + list(args)
    kw = dict(capture_output=True, timeout=DEADLINE, preexec_fn=_limit)
    if gxp.user:
        return gxp.bed.run_as(gxp.user, argv, env=gxp.env(), **kw)
    return subprocess.run(argv, env=dict(os.environ, **gxp.env()), **kw)


def problem_of(r: subprocess.CompletedProcess, nodes: int, session_arg: bool) -> str | None:
    # 3: no session, or not yours (only when the test names another session)
    if r.returncode not in ((0, 1, 2, 3) if session_arg else (0, 1, 2)):
        return "exit %d" % r.returncode
    if EXCEPTION_NAME.search(r.stderr):
        return "an exception or internal error"
    own = [line for line in r.stderr.splitlines() if line.startswith(b"gxpc: ")]
    if len(own) > nodes + 1:
        return "%d lines of gxpc's own" % len(own)
    if r.returncode and not (r.stderr.strip() or r.stdout.strip()):
        return "failed without a word"      # (where's exit 1 says "-" on stdout)
    return None


def _user_tmp(uid: int | None) -> set:
    out = set()
    for name in os.listdir("/tmp"):
        try:
            st = os.lstat(os.path.join("/tmp", name))
        except OSError:     # gone, or another user's FUSE mount (EACCES even for root)
            continue
        if uid is None or st.st_uid == uid:
            out.add(name)
    return out


def _rss_kb(pid: int) -> int:
    with open("/proc/%d/status" % pid) as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def test_every_verb_with_hostile_arguments(gxp):
    uid = pwd.getpwnam(gxp.user).pw_uid if gxp.user else None
    before = _user_tmp(uid)
    gxp.ok("explore", "--local", "2")
    top = os.path.dirname(gxp.session_dir)
    scratch = "/tmp/gxpfz-%s" % gxp.new_tag()
    os.mkdir(scratch)
    src = os.path.join(scratch, "src")
    with open(src, "w") as f:
        f.write("source\n")
    fifo = os.path.join(scratch, "fifo")
    os.mkfifo(fifo)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(os.path.join(scratch, "sock"))
    sock.close()
    if uid is not None:
        for p in (scratch, src, fifo, os.path.join(scratch, "sock")):
            os.lchown(p, uid, -1)
    values = hostile_values(fifo)
    values["socket"] = os.path.join(scratch, "sock")
    failures = []
    slowest = (0.0, "")
    for template in TEMPLATES:
        for name, value in values.items():
            args = argv_for(template, value, scratch)
            shown = "gxpc %s (%s)" % (" ".join(a.decode("utf-8", "replace")[:40] for a in args), name)
            t0 = time.monotonic()
            try:
                r = run_limited(gxp, args)
            except subprocess.TimeoutExpired:
                failures.append("%s: still running after %gs" % (shown, DEADLINE))
                continue
            slowest = max(slowest, (time.monotonic() - t0, shown))
            why = problem_of(r, nodes=3, session_arg="--session" in template)
            if why:
                failures.append("%s: %s: %s" % (shown, why, r.stderr[-300:].decode("utf-8", "replace")))
    assert not failures, "\n".join(failures)
    assert slowest[0] < 30, slowest
    [daemon] = gxp.daemon_pids()
    assert _rss_kb(daemon) < DAEMON_RSS_LIMIT_KB, _rss_kb(daemon)
    gxp.ok("rmask")
    gxp.ok("cd", "/")
    assert len(gxp.ok("e", "true").stdout.split()) == 0
    assert gxp.stat_nodes() == {"head": "up", "local1": "up", "local2": "up"}
    gxp.ok("quit")
    left = _user_tmp(uid) - before - {os.path.basename(top), os.path.basename(scratch)}
    assert not left, left
    assert not os.path.exists("/dev/full.png")
    assert stat_is_char("/dev/null") and stat_is_char("/dev/full") and stat_is_char("/dev/zero")


def stat_is_char(path: str) -> bool:
    import stat
    return stat.S_ISCHR(os.stat(path).st_mode)


def test_argv_for_joins_and_encodes():
    assert argv_for(["export", b"A=", V], b"\xff", "s") == [b"export", b"A=\xff"]
    assert argv_for(["bcast", "@/src", V], "d", "/s") == [b"bcast", b"/s/src", b"d"]
