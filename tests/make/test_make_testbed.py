"""`gxpc make` on 8 test-bed hosts, in the session's GMount, as an ordinary
user: plain make (here, in a local directory) and `gxpc make` (recipes on the
hosts) give the same files, exit status, stdout and stderr for the makefiles of
test_make_faithful.py and test_make_names.py, and the recipes really spread.
"""
from __future__ import annotations

import io
import os
import pwd
import shutil
import tarfile
import tempfile
import uuid

import pytest
from conftest import gmount_session, module_bed
from test_make_faithful import FLAGS, NO_SHELL, POSIX, SHELLS, STDIN, VARIABLES
from test_make_names import MAKEFILE as NAMES_MAKEFILE
from test_make_names import NAMES

pytestmark = pytest.mark.testbed

HOSTS = ["tm%02d" % i for i in range(1, 9)]


@pytest.fixture(scope="module")
def bed():
    with module_bed(HOSTS, "gxpmk", fuse=True) as b:
        yield b


@pytest.fixture(scope="module")
def mounted(bed):
    """(session, the user's work directory in the GMount): 8 hosts explored."""
    with gmount_session(bed, HOSTS, "tm*", "gxp") as gm:
        yield gm


def _as_user(g, argv, cwd=None, **kw):
    return g.bed.run_as(g.user, g._in_dir(cwd, argv) if cwd else argv, env=g.env(kw.pop("env", None)),
                        capture_output=True, timeout=120, **kw)


def _stage(g, files: dict) -> str:
    """A local directory of the user's: `files` (name -> bytes or str) in TOP/files."""
    top = tempfile.mkdtemp(prefix="gxpmk-", dir="/var/tmp")
    d = os.path.join(top, "files")
    for rel, data in files.items():
        path = os.path.join(os.fsencode(d), os.fsencode(rel) if isinstance(rel, str) else rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
    pw = pwd.getpwnam(g.user)
    for root, _dirs, names in os.walk(os.fsencode(top)):
        for n in [root] + [os.path.join(root, x) for x in names]:
            os.chown(n, pw.pw_uid, pw.pw_gid)
    return top


def _tree_as_user(g, d: str) -> dict:
    r = _as_user(g, ["tar", "-C", d, "-cf", "-", "."])
    assert r.returncode == 0, r.stderr
    out = {}
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as t:
        for m in t.getmembers():
            if m.isfile():
                out[m.name] = t.extractfile(m).read()
    return out


def _lines(out: bytes, d: str) -> list:
    return sorted(out.replace(os.fsencode(d), b"DIR").splitlines())


NAME_FILES = dict({n: n + b"\n" for n in NAMES}, Makefile=NAMES_MAKEFILE)
CASES = [
    ("shells", SHELLS, ["-k", "-j8"], None),
    ("posix", POSIX, [], None),
    ("variables", VARIABLES, ["-j8", "V=from command line"], None),
    ("no-shell", NO_SHELL, ["-k"], None),
    ("stdin", STDIN, [], b"b\na\nc\n"),
    ("names", NAME_FILES, ["-j8"], None),
    ("s", FLAGS, ["-s", "-j8"], None),
    ("n", FLAGS, ["-n"], None),
    ("q", FLAGS, ["-q"], None),
    ("t", FLAGS, ["-t"], None),
    ("O", FLAGS, ["-O", "-j8"], None),
    ("trace", FLAGS, ["--trace"], None),
]


@pytest.mark.parametrize("files,args,stdin", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_same_as_plain_make_on_eight_hosts(mounted, files, args, stdin):
    g, mnt = mounted
    src = _stage(g, files)
    ours = os.path.join(mnt, "w-" + uuid.uuid4().hex[:8])
    try:
        plain = os.path.join(src, "plain")
        r = _as_user(g, ["sh", "-c", 'mkdir "$1" && cp -a "$2"/. "$1"/ && mkdir "$3" && cp -a "$2"/. "$3"/',
                         "sh", plain, os.path.join(src, "files"), ours])
        assert r.returncode == 0, r.stderr
        env = {"GNUMAKEFLAGS": "--no-print-directory", "BAR": "from the environment"}
        want = _as_user(g, ["make"] + args, cwd=plain, input=stdin, env=env)
        got = _as_user(g, g.argv(["make"] + args), cwd=ours, input=stdin, env=env)
        assert (got.returncode, _lines(got.stderr, ours)) == (want.returncode, _lines(want.stderr, plain))
        assert _lines(got.stdout, ours) == _lines(want.stdout, plain)
        assert _tree_as_user(g, ours) == _tree_as_user(g, plain)
    finally:
        _as_user(g, ["rm", "-rf", ours])
        shutil.rmtree(src, ignore_errors=True)


def test_recipes_spread_over_the_hosts(mounted):
    g, mnt = mounted
    work = os.path.join(mnt, "spread-" + uuid.uuid4().hex[:6])
    mk = "T := $(addprefix t,$(shell seq 1 24))\nall: $(T)\nt%:\n\t@sleep 0.5; hostname > $@\n"
    r = _as_user(g, ["sh", "-c", 'mkdir "$1" && cat > "$1/Makefile"', "sh", work], input=mk.encode())
    assert r.returncode == 0, r.stderr
    try:
        r = _as_user(g, g.argv(["make", "-j24", "--joblog", "log"]), cwd=work)
        assert r.returncode == 0, r.stderr
        tree = _tree_as_user(g, work)
        hosts = {tree["./t%d" % i].strip().decode() for i in range(1, 25)}
        assert len(hosts & set(HOSTS)) >= 4, hosts
        log = tree["./log"].decode().splitlines()[1:]
        assert len(log) == 24 and {line.split("\t")[1] for line in log} >= hosts & set(HOSTS)
    finally:
        _as_user(g, ["rm", "-rf", work])


def test_a_directory_the_hosts_share_without_the_gmount(mounted):
    """The hosts share the head's root file system (only /tmp and scratch are
    their own): refused unless the user says it is shared, then the recipes
    run there on the hosts and their files are where make sees them."""
    g, _mnt = mounted
    mk = "T := $(addprefix t,$(shell seq 1 16))\nall: $(T)\nt%:\n\t@sleep 0.3; hostname > $@\n"
    top = _stage(g, {"Makefile": mk})
    work = os.path.join(top, "files")
    try:
        r = _as_user(g, g.argv(["make", "-j16"]), cwd=work)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert b"--shared" in r.stderr and not os.path.exists(os.path.join(work, "t1"))
        r = _as_user(g, g.argv(["make", "--local", "--shared"]), cwd=work)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        r = _as_user(g, g.argv(["make", "--shared", "-j16"]), cwd=work)
        assert r.returncode == 0, r.stderr
        hosts = set()
        for i in range(1, 17):
            with open(os.path.join(work, "t%d" % i)) as f:
                hosts.add(f.read().strip())
        assert len(hosts & set(HOSTS)) >= 4, hosts
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _autotools_project() -> dict:
    """A small automake package: 13 C files, and a test suite (automake's
    parallel harness) with a script generated by substituting $(SHELL)."""
    files = {
        "configure.ac": "AC_INIT([gxphello], [1.0])\nAM_INIT_AUTOMAKE([foreign -Wall -Werror])\n"
                        "AC_PROG_CC\nAC_CONFIG_FILES([Makefile])\nAC_OUTPUT\n",
        "Makefile.am": "bin_PROGRAMS = hello\n"
                       "hello_SOURCES = main.c " + " ".join("p%d.c" % i for i in range(1, 13)) + "\n"
                       "check_SCRIPTS = greet.sh\nTESTS = greet.sh t-hello.sh\n"
                       "EXTRA_DIST = greet.sh.in t-hello.sh\nCLEANFILES = greet.sh\n"
                       "greet.sh: greet.sh.in\n"
                       "\tsed -e 's|@SHELL[@]|$(SHELL)|g' $(srcdir)/greet.sh.in > $@ && chmod +x $@\n",
        "greet.sh.in": "#! @SHELL@\ntest -n \"$BASH_VERSION$0\" && echo greet from \"$(basename \"$0\")\"\n",
        "t-hello.sh": "#!/bin/sh\n./hello | grep -qx 'hello 78'\n",
        "main.c": "#include <stdio.h>\n" + "".join("int p%d(void);\n" % i for i in range(1, 13))
                  + "int main(void) { int s = 0;\n" + "".join("s += p%d();\n" % i for i in range(1, 13))
                  + "printf(\"hello %d\\n\", s); return 0; }\n",
    }
    files.update(("p%d.c" % i, "int p%d(void) { return %d; }\n" % (i, i)) for i in range(1, 13))
    return files


def test_an_autotools_package_builds_and_checks_on_the_hosts(mounted):
    if not shutil.which("autoreconf") or not shutil.which("cc"):
        pytest.skip("needs autoconf, automake and a C compiler (apt-get install autoconf automake gcc)")
    g, mnt = mounted
    src = _stage(g, _autotools_project())
    ours = os.path.join(mnt, "pkg-" + uuid.uuid4().hex[:6])
    plain = os.path.join(src, "plain")
    try:
        r = _as_user(g, ["sh", "-c", 'cd "$2" && chmod +x t-hello.sh && autoreconf -i >/dev/null 2>&1 && '
                         'mkdir "$1" "$3" && cp -a . "$1"/ && cp -a . "$3"/', "sh", plain,
                         os.path.join(src, "files"), ours])
        assert r.returncode == 0, r.stderr
        for d in (plain, ours):   # configure runs here, in the GMount for ours
            r = _as_user(g, ["./configure", "-q"], cwd=d)
            assert r.returncode == 0, r.stdout + r.stderr
        want = _as_user(g, ["make", "-j8"], cwd=plain)
        got = _as_user(g, g.argv(["make", "-j8", "--joblog", "build.log"]), cwd=ours)
        assert (got.returncode, want.returncode) == (0, 0), got.stderr
        assert _lines(got.stdout, ours) == _lines(want.stdout, plain)
        log = [line.split("\t") for line in _as_user(g, ["cat", "build.log"], cwd=ours)
               .stdout.decode().splitlines()[1:]]
        compiled_on = {row[1] for row in log if " -c -o " in row[0]}
        assert len(compiled_on & set(HOSTS)) >= 4, log
        want = _as_user(g, ["make", "check", "-j8"], cwd=plain)
        got = _as_user(g, g.argv(["make", "check", "-j8"]), cwd=ours)
        assert want.returncode == 0, want.stdout + want.stderr
        assert got.returncode == 0, got.stdout + got.stderr
        assert b"# PASS:  2" in got.stdout and b"# FAIL:  0" in got.stdout
        r = _as_user(g, ["cat", "greet.sh.log", "greet.sh"], cwd=ours)
        assert b"greet from greet.sh" in r.stdout and b"python" not in r.stdout.split(b"\n", 2)[1]
    finally:
        _as_user(g, ["rm", "-rf", ours])
        shutil.rmtree(src, ignore_errors=True)
