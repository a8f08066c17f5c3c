"""A makefile cannot tell `gxpc make` from make: the same files, exit status,
stdout and stderr as plain GNU make, with every recipe on a local agent, for
makefiles that choose their own SHELL and .SHELLFLAGS (globally, per target,
.POSIX), print $(SHELL), $(MAKEFLAGS), $(MAKE) and make's environment in
recipes and sub-makes, run programs without a shell (one that is missing too),
read make's stdin, and for -s -q -n -t -O --trace.
"""
from __future__ import annotations

import os
import pwd
import subprocess

import pytest
from test_make import _tree, workdir  # noqa: F401  (workdir: a fixture)

SHELLS = {
    "Makefile": """\
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
all: a b c d
a:
\t@[[ -n "$$BASH_VERSION" ]] && echo "a: $(SHELL) [$(.SHELLFLAGS)] $$0" > $@
b:
\t@false | true; echo "b: not reached under pipefail" > $@
c: SHELL := /bin/sh
c: .SHELLFLAGS := -c
c:
\t@echo "c: $(SHELL) [$(.SHELLFLAGS)] $$0" > $@
d: .SHELLFLAGS := -c
d:
\techo d: simple command, no shell, argv as make wrote it
\t@echo "d: $$0 $${BASH_VERSION:+bash}" > $@
""",
}

POSIX = {
    "Makefile": """\
.POSIX:
all:
\t@echo "posix: [$(.SHELLFLAGS)] $$-"; false; echo not reached
""",
}

VARIABLES = {
    "Makefile": """\
export FOO = exported from make
unexport BAR
all: top
\t@echo "recursive line sees $$(env | grep -c -E '^(LD_PRELOAD|GXP_MAKE)=') hook variables"; $(MAKE) -f sub.mk
top:
\t@echo "top: shell=$(SHELL) flags=[$(.SHELLFLAGS)] make=$(MAKE) mf=[$(MAKEFLAGS)] mo=[$(MAKEOVERRIDES)]"
\t@echo "top env: MAKEFLAGS=[$$MAKEFLAGS] MAKELEVEL=$$MAKELEVEL MFLAGS=[$$MFLAGS]"
\t@echo "top env: GNUMAKEFLAGS=[$${GNUMAKEFLAGS-unset}]"
\t@echo "top env: MAKEOVERRIDES=[$${MAKEOVERRIDES-unset}] FOO=[$$FOO] BAR=[$${BAR-unset}] V=[$$V]"
\t@echo "top env: LD_PRELOAD=[$${LD_PRELOAD-unset}] hook=$$(env | grep -c '^GXP_MAKE')"
""",
    "sub.mk": """\
all:
\t@echo "sub: shell=$(SHELL) make=$(MAKE) level=$(MAKELEVEL) mf=[$(MAKEFLAGS)] V=$(V)"
\t@echo "sub env: MAKEFLAGS=[$$MAKEFLAGS] MAKELEVEL=$$MAKELEVEL LD_PRELOAD=[$${LD_PRELOAD-unset}]"
""",
}

NO_SHELL = {
    "Makefile": """\
all: present missing after
present:
\tprintf %s\\n "printf ran without a shell"
missing:
\t-./no-such-program with arguments
\tno-such-command-anywhere
after:
\t@echo after
""",
}

# The first recipe that reads stdin gets it all (what it leaves unread is not
# given to the next one, as with `ssh host cmd < file`).
STDIN = {
    "Makefile": """\
all: first
\t@echo second recipe sees: $$(wc -c)
first:
\t@sort > sorted.txt; echo "the first recipe sorted $$(wc -l < sorted.txt) lines"
""",
}

FLAGS = {
    "Makefile": """\
WHEN := $(shell echo parse-time)
all: x y sub
x:
\techo x > $@
y: x
\tcat x > $@; echo y-done $(WHEN) $(shell echo recipe-time)
sub:
\t$(MAKE) -C d
""",
    "d/Makefile": """\
leaf:
\techo leaf > $@
""",
}

IGNORING = {
    "Makefile": """\
.NOTPARALLEL:
.DELETE_ON_ERROR:
all: one two three
one:
\t-exit 4
\techo one > $@
two:
\techo partial > $@; false
\techo not reached
three:
\t@echo three > $@
""",
}

# (id, files, make arguments, stdin)
CASES = [
    ("shells-k", SHELLS, ["-k", "-j4"], None),
    ("shells-j1", SHELLS, [], None),
    ("posix", POSIX, [], None),
    ("variables", VARIABLES, ["-j2", "V=from command line"], None),
    ("variables-j1", VARIABLES, ["V=1"], None),
    ("no-shell-k", NO_SHELL, ["-k"], None),
    ("no-shell", NO_SHELL, [], None),
    ("stdin", STDIN, [], "first line\nsecond line\nthird\n"),
    ("s", FLAGS, ["-s", "-j3"], None),
    ("n", FLAGS, ["-n"], None),
    ("q", FLAGS, ["-q"], None),
    ("t", FLAGS, ["-t"], None),
    ("O", FLAGS, ["-O", "-j4"], None),
    ("trace", FLAGS, ["--trace"], None),
    ("i", IGNORING, ["-i", "-j3"], None),
    ("k-notparallel", IGNORING, ["-k", "-j3"], None),
]


def _write(gxp, root: str, files: dict) -> None:
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    if gxp.user:
        pw = pwd.getpwnam(gxp.user)
        for dirpath, _dirs, names in os.walk(root):
            for n in [dirpath] + [os.path.join(dirpath, x) for x in names]:
                os.chown(n, pw.pw_uid, pw.pw_gid)


def _plain(gxp, args, cwd, stdin, env):
    argv = ["make"] + args
    if gxp.user:
        return gxp.bed.run_as(gxp.user, argv, env=gxp.env(env), cwd=cwd, capture_output=True,
                              text=True, timeout=120, input=stdin)
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, input=stdin,
                          env=dict(os.environ, **gxp.env(env)))


def _lines(text: str, d: str) -> list:
    return sorted(text.replace(d, "DIR").splitlines())


@pytest.mark.parametrize("files,args,stdin", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_same_as_plain_make(gxp, workdir, files, args, stdin):  # noqa: F811
    gxp.ok("explore", "--local", "3")
    env = {"GNUMAKEFLAGS": "--no-print-directory", "BAR": "from the environment"}
    plain, ours = os.path.join(workdir, "plain"), os.path.join(workdir, "ours")
    _write(gxp, plain, files)
    _write(gxp, ours, files)
    want = _plain(gxp, args, plain, stdin, env)
    got = gxp.run("make", *args, cwd=ours, input=stdin, env=env)
    assert "Error" in want.stderr or want.returncode == 0 or "-q" in args, want.stderr
    assert (got.returncode, _lines(got.stderr, ours)) == (want.returncode, _lines(want.stderr, plain))
    assert _lines(got.stdout, ours) == _lines(want.stdout, plain)
    assert _tree(ours) == _tree(plain)


def test_a_make_that_remade_its_makefile_still_sends_recipes_to_the_agents(gxp, workdir):  # noqa: F811
    """make re-executes itself after remaking an included makefile: the new make
    is hooked too (printenv fails where GXP_NODE_ID is not set, i.e. here)."""
    gxp.ok("explore", "--local", "2")
    _write(gxp, workdir, {"Makefile": "include gen.mk\nall: a b\ngen.mk:\n\techo 'X := 1' > $@\n"
                                      "a b:\n\t@printenv GXP_NODE_ID\n"})
    r = gxp.ok("make", "-j2", cwd=workdir)
    assert r.stdout.split()[-2:] and all(x.startswith("0") for x in r.stdout.split()[-2:]), r.stdout


def test_recipes_ran_on_the_agents(gxp, workdir):  # noqa: F811
    """The comparisons above would also pass if every recipe ran here: a bash
    recipe and a simple command (exec'd without a shell) each say where they ran."""
    gxp.ok("explore", "--local", "3")
    _write(gxp, workdir, {"Makefile": "SHELL := /bin/bash\nall: a b c d\na b c d:\n"
                                      "\t@echo $$GXP_NODE_ID > $@\n"
                                      "\t@printenv GXP_NODE_ID\n"})
    r = gxp.ok("make", "-j4", cwd=workdir)
    tree = _tree(workdir)
    by_shell = {tree[t].strip() for t in "abcd"}
    by_exec = set(r.stdout.split())
    assert len(by_shell) >= 2 and len(by_exec) >= 2, (by_shell, by_exec)
