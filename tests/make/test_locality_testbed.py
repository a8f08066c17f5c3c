"""Data-aware `gxpc make` on test-bed hosts, in the session's GMount, as an
ordinary user: a chain of stages each reading the previous stage's large output
runs where that output is (SOFT, no annotation); GXP_ON (plain and exported)
and GXP_PLACE=hard are obeyed, and a SOFT recipe gives up waiting after the
delay bound; the location xattr names the holders the catalog names; the
catalog records each output's holder, size and hash; --explain-placement says
why.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import time
import uuid

import pytest
from conftest import gmount_session, module_bed

pytestmark = pytest.mark.testbed

HOSTS = ["tl%02d" % i for i in range(1, 9)]
MB = 1 << 20


@pytest.fixture(scope="module")
def bed():
    with module_bed(HOSTS, "gxplc", fuse=True) as b:
        yield b


@pytest.fixture(scope="module")
def mounted(bed):
    """(session, the mountpoint): every host explored and mounted."""
    with gmount_session(bed, HOSTS, "tl*", "gxl") as gm:
        yield gm


def _as_user(g, argv, cwd=None, timeout=180, **kw):
    return g.bed.run_as(g.user, g._in_dir(cwd, argv) if cwd else argv, env=g.env(kw.pop("env", None)),
                        capture_output=True, timeout=timeout, **kw)


def _workdir(g, mnt, makefile: str) -> str:
    work = os.path.join(mnt, "loc-" + uuid.uuid4().hex[:6])
    r = _as_user(g, ["sh", "-c", 'mkdir "$1" && cat > "$1/Makefile"', "sh", work],
                 input=makefile.encode())
    assert r.returncode == 0, r.stderr
    return work


def _read(g, path) -> bytes:
    r = _as_user(g, ["cat", path])
    assert r.returncode == 0, r.stderr
    return r.stdout


def _location(g, path) -> set:
    r = _as_user(g, ["python3", "-c", "import os,sys; print(os.getxattr(sys.argv[1], "
                     "'user.sshfsmux.location').decode())", path])
    assert r.returncode == 0, r.stderr
    return set(r.stdout.decode().strip().split(","))


def _where(g, paths) -> dict:
    """path -> {node name: (size, sha256)}, from `gxpc where`."""
    r = g.run("where", *paths)
    out = {}
    for line in r.stdout.splitlines():
        p, _, reps = line.partition("\t")
        out[p] = {} if reps == "-" else {x.split(":")[0]: tuple(x.split(":")[1:]) for x in reps.split(",")}
    return out


def _wait_where(g, path: str, want: dict, seconds: float = 20.0) -> None:
    """Until `gxpc where` says `want` for `path`; fails with what it says
    when `seconds` pass first."""
    deadline = time.monotonic() + seconds
    while _where(g, [path])[path] != want:
        assert time.monotonic() < deadline, _where(g, [path])
        time.sleep(0.2)


# Stage 0 is made on tl03 (GXP_ON, not exported); every later stage reads the
# previous one (8 MiB) and must run where it is, with no annotation at all.
CHAIN = ("all: s4\ns0: GXP_ON = tl03\ns0:\n\thead -c %d /dev/urandom > $@ && hostname > $@.host\n"
         % (8 * MB) + "".join("s%d: s%d\n\tcat $< > $@ && hostname > $@.host\n" % (i, i - 1)
                              for i in range(1, 5)))


def test_a_chain_runs_where_its_input_is(mounted):
    g, mnt = mounted
    work = _workdir(g, mnt, CHAIN)
    try:
        r = _as_user(g, g.argv(["make", "-j4", "--explain-placement"]), cwd=work)
        assert r.returncode == 0, r.stderr
        explain = r.stderr.decode()
        hosts = {i: _read(g, os.path.join(work, "s%d.host" % i)).decode().strip() for i in range(5)}
        assert hosts == {i: "tl03" for i in range(5)}, (hosts, explain)
        assert "cat s3 > s4 && hostname > s4.host -> tl03: %d of %d input bytes local; " \
               "%d bytes local, 0 fetched" % (8 * MB, 8 * MB, 8 * MB) in explain, explain
        # the catalog: holder and size of each output, and the location xattr agrees
        paths = [os.path.join(work, "s%d" % i) for i in range(5)]
        where = _where(g, paths)
        for p in paths:
            digest = hashlib.sha256(_read(g, p)).hexdigest()
            assert where[p] == {"tl03": (str(8 * MB), digest)}, where
            assert _location(g, p) == set(where[p]), (p, _location(g, p), where[p])
        assert "catalog:" in g.ok("stat").stdout
    finally:
        _as_user(g, ["rm", "-rf", work])


HINTS = """\
NPROC := $(shell nproc)
all: on2 on4 h1 h2
on2: GXP_ON = tl02
on2:
\thostname > $@
on4: export GXP_ON = tl0[[4-4]]
on4:
\thostname > $@
h0: GXP_ON = tl01
h0:
\thead -c %d /dev/urandom > $@
blocker: GXP_ON = tl01
blocker: GXP_SLOTS = $(NPROC)
blocker: h0
\tsleep 10; date +%%s.%%N > $@
tick: GXP_ON = tl02
tick: h0
\tsleep 1
h0b: GXP_ON = tl01
h0b:
\thead -c %d /dev/urandom > $@
h1: GXP_PLACE = hard
h1: h0b tick
\tdate +%%s.%%N > $@; hostname >> $@; cat h0b > /dev/null
h2: h0 tick
\tdate +%%s.%%N > $@; hostname >> $@; cat h0 > /dev/null
""" % (4 * MB, 4 * MB)


def test_gxp_on_and_hard_are_obeyed_and_soft_gives_way(mounted):
    g, mnt = mounted
    work = _workdir(g, mnt, HINTS)
    try:
        # h0 first, so that tl01 holds it before the blocker takes every slot
        # there; h1 reads h0b, which only tl01 holds (h2, giving way, gets h0
        # copied to its node, which would then hold it for h1 too)
        r = _as_user(g, g.argv(["make", "h0", "h0b"]), cwd=work)
        assert r.returncode == 0, r.stderr
        r = _as_user(g, g.argv(["make", "-j8", "--explain-placement", "all", "blocker"]), cwd=work)
        assert r.returncode == 0, r.stderr
        explain = r.stderr.decode()
        assert _read(g, os.path.join(work, "on2")).decode().strip() == "tl02"
        assert _read(g, os.path.join(work, "on4")).decode().strip() == "tl04"
        blocker_end = float(_read(g, os.path.join(work, "blocker")).decode())
        h1_start, h1_host = _read(g, os.path.join(work, "h1")).decode().split()
        h2_start, h2_host = _read(g, os.path.join(work, "h2")).decode().split()
        # HARD: waited for a slot on tl01 however long; SOFT: gave up after the delay
        assert h1_host == "tl01" and float(h1_start) >= blocker_end - 0.05, explain
        assert h2_host != "tl01" and float(h2_start) < blocker_end, explain
        assert "busy past" in explain, explain
    finally:
        _as_user(g, ["rm", "-rf", work])


def test_a_bad_hint_fails_the_recipe_in_one_line(mounted):
    g, mnt = mounted
    work = _workdir(g, mnt, "x: GXP_ON = nosuch\nx:\n\ttrue\ny: GXP_PLACE = maybe\ny:\n\ttrue\n")
    try:
        r = _as_user(g, g.argv(["make", "-k", "x", "y"]), cwd=work)
        err = r.stderr.decode()
        assert r.returncode == 2, err
        assert "GXP_ON=nosuch names no node that is up" in err, err
        assert "GXP_PLACE=maybe: give hard, soft or load" in err, err
        assert "Traceback" not in err
    finally:
        _as_user(g, ["rm", "-rf", work])


# Write-on-exit: tl02 looks at `data` (its kernel now caches the size for the
# mount's attribute timeout, 1 s by libfuse's default), tl01 appends to it, and
# tl02 looks again right after make heard the append succeed (0.1-0.3 s later
# here): it must see the new size. Checked that it can fail: with
# KernelCache.invalidate_paths returning at once, check0 read 5, not 1005.
WRITE_ON_EXIT = """\
.DELETE_ON_ERROR:
data: GXP_ON = tl01
data:
\tprintf 12345 > $@
""" + "".join("""\
look{i}: GXP_ON = tl02
look{i}: {prev}
\tstat -c %s data > look{i}
grow{i}: GXP_ON = tl01
grow{i}: look{i}
\thead -c 1000 /dev/zero >> data && echo > grow{i}
check{i}: GXP_ON = tl02
check{i}: grow{i}
\tstat -c %s data > check{i}
""".format(i=i, prev="data" if i == 0 else "check%d" % (i - 1)) for i in range(5)) + """\
broken: GXP_ON = tl01
broken:
\thead -c 100000 /dev/zero > $@; exit 3
"""


def test_every_node_sees_an_output_once_make_hears_success(mounted):
    g, mnt = mounted
    work = _workdir(g, mnt, WRITE_ON_EXIT)
    try:
        r = _as_user(g, g.argv(["make", "check4"]), cwd=work)
        assert r.returncode == 0, r.stderr
        for i in range(5):
            look = int(_read(g, os.path.join(work, "look%d" % i)))
            check = int(_read(g, os.path.join(work, "check%d" % i)))
            assert (look, check) == (5 + 1000 * i, 5 + 1000 * (i + 1)), i
        where = _where(g, [os.path.join(work, "data")])
        assert list(where.values())[0]["tl01"][0] == str(5 + 5000), where
        # a failed recipe's partial output never enters the catalog, and make
        # still deletes it (.DELETE_ON_ERROR)
        r = _as_user(g, g.argv(["make", "broken"]), cwd=work)
        assert r.returncode == 2 and b"Deleting file 'broken'" in r.stderr, r.stderr
        assert _where(g, [os.path.join(work, "broken")]) == {os.path.join(work, "broken"): {}}
        r = _as_user(g, ["test", "-e", os.path.join(work, "broken")])
        assert r.returncode == 1
    finally:
        _as_user(g, ["rm", "-rf", work])


EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "examples", "pipeline")


def test_the_pipeline_example_aligns_each_part_where_it_is(mounted):
    """examples/pipeline on the hosts: the same files as plain make's, and
    the splits ran where the reads are (HARD in the makefile) and every align
    recipe on the host holding its part (fetching at most the shared
    reference and the script) unless that host was busy past the SOFT delay."""
    import re
    import tempfile
    g, mnt = mounted
    work = os.path.join(mnt, "pipe-" + uuid.uuid4().hex[:6])
    plain = tempfile.mkdtemp(prefix="gxplc-", dir="/var/tmp")
    shutil.rmtree(plain)
    args = ["READS=40000", "REFLEN=20000", "PARTS=8"]
    try:
        for d in (work, plain):
            r = _as_user(g, ["sh", "-c", 'mkdir "$1" && cp "$2"/Makefile "$2"/*.py "$1"/', "sh", d, EXAMPLE])
            assert r.returncode == 0, r.stderr
        r = _as_user(g, g.argv(["make", "-j16", "--explain-placement"] + args), cwd=work)
        assert r.returncode == 0, r.stderr
        explain = r.stderr.decode()
        want = _as_user(g, ["make", "-j4"] + args, cwd=plain)
        assert want.returncode == 0, want.stderr
        assert sorted(r.stdout.splitlines()) == sorted(
            want.stdout.replace(plain.encode(), work.encode()).splitlines())
        for name in ("aligned.sam", "summary.txt", "ref.fa", "reads.fq"):
            assert _read(g, os.path.join(work, name)) == _read(g, os.path.join(plain, name)), name
        ref_size = len(_read(g, os.path.join(plain, "ref.fa")))
        aligns = re.findall(r"align\.py ref\.fa (part\d+)\.fq > \S+ -> (\S+): (.*?); (\d+) bytes local, "
                            r"(\d+) fetched", explain)
        assert len(aligns) == 8, explain
        for part, host, why, local, fetched in aligns:
            # SOFT: on its part's host (fetching at most the shared reference
            # and the script), unless that host stayed busy past the delay
            if not (int(local) > 100000 and int(fetched) <= ref_size + 4096):
                assert "busy past" in why, (part, host, explain)
        # the splits (GXP_PLACE=hard in the makefile) all ran where the reads
        # are, fetching at most their script (split.py)
        splits = re.findall(r"> part\d+\.fq -> (\S+): .*; (\d+) bytes local, (\d+) fetched", explain)
        assert len(splits) == 8 and len({s[0] for s in splits}) == 1, explain
        assert all(int(s[2]) <= 4096 for s in splits), explain
    finally:
        _as_user(g, ["rm", "-rf", work])
        shutil.rmtree(plain, ignore_errors=True)


def test_files_written_through_the_mount_reach_the_catalog(mounted):
    """Not only recipes: what `gxpc e` writes on tl05, and then removes, is in
    the catalog (with the writer as holder) and then gone, as the location
    xattr says; the scan at mount time is tested by the example run."""
    g, mnt = mounted
    work = _workdir(g, mnt, "")
    path = os.path.join(work, "written-on-tl05")
    try:
        g.ok("e", "--hosts", "tl05", "head -c 300000 /dev/zero > %s" % path)
        _wait_where(g, path, {"tl05": ("300000",)})
        assert _location(g, path) == {"tl05"}
        g.ok("e", "--hosts", "tl06", "rm %s" % path)
        _wait_where(g, path, {})
    finally:
        _as_user(g, ["rm", "-rf", work])


def test_a_file_written_through_another_nodes_mount_keeps_its_holder(mounted):
    """A file only tl05 holds, appended to through tl06's mount: the write
    goes to tl05's export, and the catalog says so (tl05, the new size), not
    that the file is gone because tl06's export lacks it. Before the change
    feed looked at the merged view, the entry vanished for every node."""
    g, mnt = mounted
    work = _workdir(g, mnt, "")
    path = os.path.join(work, "lives-on-tl05")
    try:
        g.ok("e", "--hosts", "tl05", "head -c 300000 /dev/zero > %s" % path)
        _wait_where(g, path, {"tl05": ("300000",)})
        g.ok("e", "--hosts", "tl06", "head -c 1000 /dev/zero >> %s" % path)
        r = g.ok("e", "--hosts", "tl06", "stat -c %%s %s" % path)
        assert r.stdout.split()[-1] == "301000", r.stdout
        _wait_where(g, path, {"tl05": ("301000",)})
        # and it stays so once tl06's change feed has answered (0.3 s coalescing)
        time.sleep(1.5)
        assert _where(g, [path])[path] == {"tl05": ("301000",)}
        assert _location(g, path) == {"tl05"}
    finally:
        _as_user(g, ["rm", "-rf", work])


DELETED_ON_ERROR = """\
.DELETE_ON_ERROR:
victim: GXP_ON = tl01
victim:
\thead -c 5000 /dev/zero > $@; test -z "$(FAIL)"
prime: GXP_ON = tl02
prime:
\tstat -c %s victim
"""


def test_a_target_make_deletes_on_error_leaves_every_mount(mounted):
    """A failed recipe rewrote a target that existed: make (on the head)
    sees its new mtime, so .DELETE_ON_ERROR deletes it. Checked that it
    can fail: when mounts dropped their caches only after a success, the
    head's kernel still had the old mtime and make kept the partial file.
    Once the catalog says the file is gone, tl02, which looked at it just
    before, does not see it either (the mounts drop their caches of a
    deleted name before the catalog forgets it; here the caches dropped
    after the failure already suffice, so this part does not fail
    without that)."""
    g, mnt = mounted
    work = _workdir(g, mnt, DELETED_ON_ERROR)
    victim, marker = os.path.join(work, "victim"), os.path.join(work, "marker")
    watcher = None
    try:
        r = _as_user(g, g.argv(["make", "victim"]), cwd=work)
        assert r.returncode == 0, r.stderr
        watcher = g.popen("e", "--hosts", "tl02", "while [ ! -e %s ]; do sleep 0.02; done; "
                          "if [ -e %s ]; then echo stale; else echo gone; fi" % (marker, victim))
        # tl02 looks at the victim (its kernel caches the name), then tl01
        # remakes it, fails, and make deletes it
        r = _as_user(g, g.argv(["make", "-B", "FAIL=1", "prime", "victim"]), cwd=work)
        assert r.returncode == 2 and b"Deleting file 'victim'" in r.stderr, r.stderr
        assert b"\n5000\n" in r.stdout, r.stdout         # prime saw it
        deadline = time.monotonic() + 20
        while _where(g, [victim])[victim] != {}:
            assert time.monotonic() < deadline, _where(g, [victim])
            time.sleep(0.05)
        r = _as_user(g, ["touch", marker])
        assert r.returncode == 0, r.stderr
        out, err = watcher.communicate(timeout=60)
        assert out.split() == ["gone"], (out, err)
    finally:
        if watcher is not None and watcher.poll() is None:
            _as_user(g, ["touch", marker])       # its loop on tl02 ends too
            try:
                watcher.communicate(timeout=30)
            except Exception:
                watcher.kill()
                watcher.communicate()
        _as_user(g, ["rm", "-rf", work])


COLLOCATED = "".join("g%d:\n\thostname > grp/$@\n" % i for i in range(6)) + "".join(
    "f%d:\n\thostname > free/$@\n" % i for i in range(6)) + \
    "all: %s\n" % " ".join(["g%d" % i for i in range(6)] + ["f%d" % i for i in range(6)])


def test_a_collocation_hint_on_a_directory_is_honoured(mounted):
    """WOSS: `setfattr -n user.sshfsmux.dp -v collocation:g1 grp` sends every
    recipe writing into grp to the node the first one took; recipes writing
    elsewhere still spread by load."""
    g, mnt = mounted
    work = _workdir(g, mnt, COLLOCATED)
    try:
        r = _as_user(g, ["sh", "-c", 'mkdir grp free && python3 -c "import os; '
                         "os.setxattr('grp', 'user.sshfsmux.dp', b'collocation:g1')\""], cwd=work)
        assert r.returncode == 0, r.stderr
        r = _as_user(g, g.argv(["make", "-j12", "--explain-placement", "all"]), cwd=work)
        assert r.returncode == 0, r.stderr
        grouped = {_read(g, os.path.join(work, "grp", "g%d" % i)).strip() for i in range(6)}
        free = {_read(g, os.path.join(work, "free", "f%d" % i)).strip() for i in range(6)}
        assert len(grouped) == 1, (grouped, r.stderr.decode())
        assert len(free) >= 3, (free, r.stderr.decode())
    finally:
        _as_user(g, ["rm", "-rf", work])


HOME_MAKEFILE = ("all: a.out sub/b.out\n"
                 "a.out: GXP_ON = tl03\na.out:\n\thead -c 70000 /dev/urandom > $@\n"
                 "sub/b.out: GXP_ON = tl04\nsub/b.out:\n\tmkdir -p sub && hostname > $@\n")


def test_results_home_outlive_the_hosts_that_made_them(mounted, bed):
    """MFS's property (issue 28): `gxpc make --home` returns once every file
    its recipes made on other hosts is also in the head's own export (same
    bytes, mode and mtime: a replica, not a conflict); removed from the
    hosts that made them, they still show through the mount. `--home=DIR`
    puts them into DIR instead. Without --home, on a flat network (no
    sites), they stay where they were made."""
    g, mnt = mounted
    export = mnt.replace("gxlmnt-", "gxlexp-")
    work = _workdir(g, mnt, HOME_MAKEFILE)
    rel = os.path.relpath(work, mnt)
    home_dir = pathlib.Path("/tmp/gxphome-" + uuid.uuid4().hex[:8])
    try:
        r = _as_user(g, g.argv(["make", "-j4"]), cwd=work)
        assert r.returncode == 0, r.stderr
        assert _location(g, os.path.join(work, "a.out")) == {"tl03"}
        r = _as_user(g, ["sh", "-c", "rm -f a.out sub/b.out"], cwd=work)
        assert r.returncode == 0, r.stderr
        r = _as_user(g, g.argv(["make", "--home", "-j4"]), cwd=work)
        assert r.returncode == 0, r.stderr
        for name, host in (("a.out", "tl03"), ("sub/b.out", "tl04")):
            made = os.path.join(bed.host(host).tmp_dir, os.path.relpath(export, "/tmp"), rel, name)
            home = os.path.join(export, rel, name)
            with open(made, "rb") as f1, open(home, "rb") as f2:
                assert f1.read() == f2.read()
            s1, s2 = os.stat(made), os.stat(home)
            # the mtime as the mount shows it: to the microsecond (a float)
            assert s1.st_mode == s2.st_mode and abs(s1.st_mtime_ns - s2.st_mtime_ns) < 1000, (s1, s2)
            assert _location(g, os.path.join(work, name)) == {host, "head"}
            os.unlink(made)             # the host that made it loses it
        assert len(_read(g, os.path.join(work, "a.out"))) == 70000
        assert _read(g, os.path.join(work, "sub/b.out")).strip() == b"tl04"
        # into a directory of the user's: paths below make's directory
        home_dir.mkdir()
        shutil.chown(home_dir, g.user)
        r = _as_user(g, ["sh", "-c", "rm -f a.out sub/b.out"], cwd=work)
        assert r.returncode == 0, r.stderr
        r = _as_user(g, g.argv(["make", "--home=%s" % home_dir, "-j4"]), cwd=work)
        assert r.returncode == 0, r.stderr
        assert (home_dir / "a.out").stat().st_size == 70000
        assert (home_dir / "sub" / "b.out").read_text().strip() == "tl04"
    finally:
        _as_user(g, ["rm", "-rf", work])
        shutil.rmtree(home_dir, ignore_errors=True)
