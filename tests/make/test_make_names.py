"""Targets and prerequisites named with shell metacharacters reach the head as
data: `gxpc make` builds them as plain make does, and no name ever runs as a
command (a prerequisite named `q&id>PWNED&.in` would create PWNED if it did).
"""
from __future__ import annotations

import os
import pwd
import subprocess

import pytest
from test_make import _tree, workdir  # noqa: F401  (workdir: a fixture)

# Names make itself can hold in a rule (no blank, `|`, `;`, `:` or newline: make
# splits words on those before any shell sees them), each a would-be command.
NAMES = [b"q&id>PWNED&.in", b"paren(x).in", b'dq"x.in', b"dollar$x.in", b"star*.in",
         b"caf\xe9.in", b"back`touch${IFS}PWNED`tick.in", b"it's$(touch${IFS}PWNED).in",
         b"amp&&touch${IFS}PWNED.in"]
MAKEFILE = b"""IN := $(wildcard *.in)
all: $(IN:.in=.out)
%.out: %.in
\tcat -- '$(subst ','\\'',$<)' > '$(subst ','\\'',$@)'
"""


def _case(gxp, d: str) -> None:
    os.mkdir(d)
    with open(os.path.join(d, "Makefile"), "wb") as f:
        f.write(MAKEFILE)
    for n in NAMES:
        with open(os.path.join(os.fsencode(d), n), "wb") as f:
            f.write(n + b"\n")
    if gxp.user:
        pw = pwd.getpwnam(gxp.user)
        for n in [b""] + [os.fsencode(x) for x in os.listdir(d)]:
            os.chown(os.path.join(os.fsencode(d), n), pw.pw_uid, pw.pw_gid)


def _run(gxp, argv, cwd, env=None):
    """make's output as bytes: the names are not all UTF-8."""
    if gxp.user:
        return gxp.bed.run_as(gxp.user, gxp._in_dir(cwd, argv), env=gxp.env(env),
                              capture_output=True, timeout=120)
    return subprocess.run(argv, cwd=cwd, capture_output=True, timeout=120,
                          env=dict(os.environ, **gxp.env(env)))


def _lines(out: bytes, d: str) -> list:
    return sorted(out.replace(os.fsencode(d), b"DIR").splitlines())


# The compiled hook, and the Python job shell that replaces it where no C
# compiler exists (GXP_MAKE_HOOK=shell chooses it).
@pytest.mark.parametrize("hook", ["compiled", "shell"])
def test_names_with_shell_metacharacters_are_data(gxp, workdir, hook):  # noqa: F811
    gxp.ok("explore", "--local", "2")
    plain, ours = os.path.join(workdir, "plain"), os.path.join(workdir, "ours")
    _case(gxp, plain)
    _case(gxp, ours)
    want = _run(gxp, ["make", "-j4"], plain)
    got = _run(gxp, gxp.argv(["make", "-j4"]), ours, {"GXP_MAKE_HOOK": hook})
    assert want.returncode == 0, want.stderr
    assert got.returncode == 0, got.stderr
    assert _tree(ours) == _tree(plain)
    assert len([n for n in _tree(ours) if n.endswith(".out")]) == len(NAMES)
    assert _lines(got.stdout, ours) == _lines(want.stdout, plain)
    assert _lines(got.stderr, ours) == _lines(want.stderr, plain)
    for d in (workdir, plain, ours, os.path.expanduser("~" + (gxp.user or ""))):
        assert not os.path.exists(os.path.join(d, "PWNED")), d
