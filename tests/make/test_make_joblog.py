"""`gxpc make --joblog FILE`: one line per recipe run on a node (recipe, node,
start, end, exit status, bytes of output); a progress line on stderr only when
stderr is a terminal."""
from __future__ import annotations

import os
import pwd
import shlex

from test_make import workdir  # noqa: F401  (a fixture)

MAKEFILE = """all: a b c d fail
a b c d:
\t@printf '%s' 12345 > $@; printf '%s' 1234567
fail:
\t@echo to-stderr >&2; exit 3
"""


def _write(gxp, d: str) -> None:
    with open(os.path.join(d, "Makefile"), "w") as f:
        f.write(MAKEFILE)
    if gxp.user:
        pw = pwd.getpwnam(gxp.user)
        os.chown(os.path.join(d, "Makefile"), pw.pw_uid, pw.pw_gid)


def test_joblog_has_a_line_per_recipe_and_no_progress_off_a_terminal(gxp, workdir):  # noqa: F811
    gxp.ok("explore", "--local", "3")
    names = {line.split()[0]: line.split()[1] for line in gxp.ok("stat").stdout.splitlines()[1:]}
    _write(gxp, workdir)
    r = gxp.run("make", "--joblog", "jobs.log", "-k", "-j5", cwd=workdir)
    assert r.returncode == 2, r.stderr
    assert "running" not in r.stderr and "\r" not in r.stderr, r.stderr
    with open(os.path.join(workdir, "jobs.log")) as f:
        lines = f.read().splitlines()
    assert lines[0] == "#recipe\tnode\tstart\tend\tstatus\tbytes"
    rows = [line.split("\t") for line in lines[1:]]
    assert len(rows) == 5, lines
    for recipe, node, start, end, status, size in rows:
        assert node in names.values(), (node, names)
        assert 0 < float(start) <= float(end)
        if "exit 3" in recipe:
            assert (status, size) == ("3", str(len("to-stderr\n")))
        else:
            assert (status, size) == ("0", "7"), rows
    assert len({row[1] for row in rows}) >= 2, rows
    # a bad log name is one line, and make does not run
    r = gxp.run("make", "--joblog", "/no/such/dir/log", cwd=workdir)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "/no/such/dir/log" in r.stderr


def test_progress_line_on_a_terminal(gxp, workdir):  # noqa: F811
    gxp.ok("explore", "--local", "2")
    with open(os.path.join(workdir, "Makefile"), "w") as f:
        f.write("all: a b c\na b c:\n\t@sleep 0.7; echo made $@\n")
    if gxp.user:
        pw = pwd.getpwnam(gxp.user)
        os.chown(os.path.join(workdir, "Makefile"), pw.pw_uid, pw.pw_gid)
    cmd = " ".join(shlex.quote(w) for w in gxp.argv(["make", "-j3"]))
    r = gxp.bed.run_as(gxp.user, ["script", "-qec", cmd, "/dev/null"], env=gxp.env(),
                       cwd=workdir, capture_output=True, text=True, timeout=60) if gxp.user else None
    if r is None:
        import subprocess
        r = subprocess.run(["script", "-qec", cmd, "/dev/null"], cwd=workdir, capture_output=True,
                           text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gxpc make: 0 done, 3 running" in r.stdout, r.stdout
    lines = r.stdout.replace("\x1b[K", "").replace("\r", "\n").splitlines()
    assert sorted(x for x in lines if x.startswith("made")) == ["made a", "made b", "made c"]


def test_more_recipes_at_once_than_descriptors(gxp, workdir):  # noqa: F811
    """The relay holds 4 descriptors a running recipe: with a low hard limit the
    surplus recipes wait for a free one instead of failing."""
    gxp.ok("explore", "--local", "3")
    with open(os.path.join(workdir, "Makefile"), "w") as f:
        f.write("T := $(addprefix t,$(shell seq 1 40))\nall: $(T)\nt%:\n\t@sleep 0.3; echo $@ > $@\n")
    if gxp.user:
        pw = pwd.getpwnam(gxp.user)
        os.chown(os.path.join(workdir, "Makefile"), pw.pw_uid, pw.pw_gid)
    cmd = "ulimit -n 48 && exec " + " ".join(shlex.quote(w) for w in gxp.argv(["make", "-j40"]))
    if gxp.user:
        r = gxp.bed.run_as(gxp.user, ["sh", "-c", cmd], env=gxp.env(), cwd=workdir,
                           capture_output=True, text=True, timeout=60)
    else:
        import subprocess
        r = subprocess.run(["sh", "-c", cmd], cwd=workdir, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert all(open(os.path.join(workdir, "t%d" % i)).read() == "t%d\n" % i for i in range(1, 41))
