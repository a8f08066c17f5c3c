"""When what one node does shows on the others, on 8 test-bed hosts (issue 26):
- a change through one node's mount (create, write, chmod, rename, unlink,
  mkdir) shows on another node that had looked at those names (its kernel
  holding them, missing ones too) within the bound the README states;
- random DAGs of recipes that read what other recipes wrote, renamed,
  chmodded and made, run by `gxpc make -j8` on the nodes, give plain make's
  files, read on the head (a property test over seeds);
- 24 recipes on 4 or more nodes appending to one log keep every line.
"""
import json
import os
import random
import shutil
import subprocess
import tempfile
import time

import pytest
from conftest import explore_and_mount, module_bed

pytestmark = pytest.mark.testbed

HOSTS = ["tv%02d" % i for i in range(1, 9)]
# the README's bound for a change to show on the other nodes is "well under
# 100 ms on a LAN"; the check allows a loaded 2-core test machine 1 s
BOUND = 1.0


@pytest.fixture(scope="module")
def bed():
    with module_bed(HOSTS, "gxpv", fuse=True) as b:
        yield b


@pytest.fixture
def g(bed, make_gxp):
    return make_gxp(bed=bed, user=next(iter(bed.users)))


def mounted(g, env=None):
    """Every host explored (the daemon started with `env`) and a GMount of theirs."""
    return explore_and_mount(g, HOSTS, "tv*", env)


@pytest.fixture
def mnt(g):
    try:
        yield mounted(g)
    finally:
        g.ok("umount")


def on(g, host, cmd):
    return g.ok("e", "--hosts", host, cmd)


# Polls (every 2 ms) for each step's condition in turn and prints when it held.
WATCH = r"""
import json, os, stat, sys, time
w = sys.argv[1]
def p(n): return os.path.join(w, n)
def read(n):
    try:
        with open(p(n)) as f: return f.read()
    except OSError: return None
def mode(n):
    try: return stat.S_IMODE(os.stat(p(n)).st_mode)
    except OSError: return None
steps = [lambda: os.path.exists(p("new")), lambda: read("old") == "changed, longer",
         lambda: mode("old") == 0o600, lambda: os.path.exists(p("moved")) and not os.path.exists(p("old")),
         lambda: not os.path.exists(p("new")), lambda: os.path.isdir(p("sub"))]
print("ready", flush=True)
for i, held in enumerate(steps):
    end = time.time() + 10
    while not held() and time.time() < end:
        time.sleep(0.002)
    print(json.dumps([i, time.time() if held() else None]), flush=True)
"""

CHANGES = ["touch new", "printf 'changed, longer' > old", "chmod 600 old", "mv old moved",
           "rm new", "mkdir sub"]


def test_a_change_through_one_mount_shows_on_another_node_within_the_bound(bed, g, mnt):
    w = mnt + "/w"
    on(g, "tv01", "mkdir %s && printf orig > %s/old" % (w, w))
    # tv05 looks first: its copy holds w, its kernel the names (missing ones too)
    on(g, "tv05", "cat %s/old; ls %s; stat %s/new %s/moved %s/sub 2>/dev/null; true" % (w, w, w, w, w))
    watcher = g.popen("e", "--hosts", "tv05", "python3 -c '%s' %s" % (WATCH.replace("'", "'\\''"), w))
    try:
        assert watcher.stdout.readline().split() == ["ready"]
        took = []
        for i, change in enumerate(CHANGES):
            # the time as the change returns, in the process that made it
            r = on(g, "tv01", "cd %s && python3 -c 'import subprocess, sys, time\n"
                   "subprocess.run(sys.argv[1], shell=True, check=True)\n"
                   "print(time.time())' \"%s\"" % (w, change))
            done = float(r.stdout.split()[-1])
            step, seen = json.loads(watcher.stdout.readline())
            assert step == i and seen is not None, "%r never showed on tv05" % change
            took.append(max(0.0, seen - done))
        print("shown on tv05 after (s): " + ", ".join(
            "%s %.3f" % (c.split()[0], t) for c, t in zip(CHANGES, took)))
        assert max(took) <= BOUND, dict(zip(CHANGES, took))
    finally:
        watcher.kill()
        watcher.communicate()


def random_dag(seed, n=24):
    """A makefile of n targets, each reading some earlier ones (contents and
    modes); recipes write in place, through a renamed temporary, into a new
    directory, chmod their output, and remove a scratch file."""
    rnd = random.Random(seed)
    lines = ["all: " + " ".join("t%d" % i for i in range(n)), ""]
    for i in range(n):
        deps = sorted(rnd.sample(range(i), min(i, rnd.randint(0, 3))))
        names = ["t%d" % d for d in deps]
        read = "".join("; cat %s; stat -c %%a %s" % (d, d) for d in names)
        body = "(echo $@%s)" % read
        kind = rnd.choice(["plain", "rename", "dir", "chmod", "scratch"])
        if kind == "plain":
            recipe = ["%s > $@" % body]
        elif kind == "rename":
            recipe = ["%s > $@.tmp" % body, "mv $@.tmp $@"]
        elif kind == "dir":
            recipe = ["mkdir -p $@.d", "%s > $@.d/out" % body, "cp $@.d/out $@"]
        elif kind == "chmod":
            recipe = ["%s > $@" % body, "chmod 640 $@"]
        else:
            recipe = ["%s > $@.scratch" % body, "cat $@.scratch > $@", "rm $@.scratch"]
        lines.append("t%d: %s" % (i, " ".join(names)))
        lines.extend("\t" + r for r in recipe)
    return "\n".join(lines) + "\n"


def tree(root):
    """name -> (mode, contents) of every file and directory below root."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(d, name)
            st = os.lstat(full)
            data = None
            if os.path.isfile(full):
                with open(full, "rb") as f:
                    data = f.read()
            out[os.path.relpath(full, root)] = (oct(st.st_mode), data)
    return out


def user_tree(bed, user, root):
    """tree() of a directory of the user's mount, read by the user."""
    script = ("import json, os, sys\n" + "".join(
        l + "\n" for l in ["def tree(root):"] + [
            "    " + l for l in """out = {}
for d, dirs, files in os.walk(root):
    for name in dirs + files:
        full = os.path.join(d, name)
        data = open(full, "rb").read().decode("latin-1") if os.path.isfile(full) else None
        out[os.path.relpath(full, root)] = (oct(os.lstat(full).st_mode), data)
return out""".splitlines()]) + "print(json.dumps(tree(sys.argv[1])))\n")
    r = bed.run_as(user, ["python3", "-c", script, root], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return {k: (m, None if d is None else d.encode("latin-1")) for k, (m, d) in json.loads(r.stdout).items()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_dags_of_recipes_on_the_nodes_give_plain_makes_files(bed, g, mnt, seed):
    makefile = random_dag(seed)
    plain = tempfile.mkdtemp(prefix="gxpdag-", dir="/var/tmp")
    try:
        os.chmod(plain, 0o755)
        with open(os.path.join(plain, "Makefile"), "w") as f:
            f.write(makefile)
        subprocess.run(["make", "-s", "-j8"], cwd=plain, check=True, capture_output=True)
        work = mnt + "/dag"
        bed.run_as(g.user, ["sh", "-c", "mkdir %s && cat > %s/Makefile" % (work, work)],
                   input=makefile, capture_output=True, text=True, check=True)
        r = g.run("make", "-s", "-j8", cwd=work)
        assert r.returncode == 0, r.stderr
        assert tree(plain) == user_tree(bed, g.user, work)
    finally:
        shutil.rmtree(plain, ignore_errors=True)


# a peer renames a file into tv02's export (the rename happens where the
# file is) while tv02's kernel holds a miss of the new name (step1 looked):
# step3, which make starts on tv02 after step2, must see it
PEER_RENAME = """\
all: step3
step1:
\ttouch out.tmp; test -e out || echo missing > $@
step2: step1
\tmv out.tmp out; touch $@
step3: step2
\tcat out > $@
step1 step3: GXP_ON = tv02
step2: GXP_ON = tv03
"""


def make_in(bed, g, work, makefile, *args):
    """`gxpc make ARGS` in a new directory `work` of the mount holding `makefile`."""
    bed.run_as(g.user, ["sh", "-c", "mkdir %s && cat > %s/Makefile" % (work, work)],
               input=makefile, capture_output=True, text=True, check=True)
    r = g.run("make", *args, cwd=work)
    assert r.returncode == 0, r.stderr


def test_a_name_a_peer_made_in_this_export_replaces_this_kernels_miss(bed, g, mnt):
    work = mnt + "/peer"
    make_in(bed, g, work, PEER_RENAME, "-s")
    got = bed.run_as(g.user, ["cat", work + "/step1", work + "/step3"], capture_output=True,
                     text=True, check=True).stdout
    assert got == "missing\n", got      # step1 missed it; step3 read it (empty)


# the log is made first (two nodes creating one name at once would each make
# their own: the documented conflict, docs/merge-semantics.md)
APPENDS = """\
all: $(addprefix line,$(shell seq 1 24))
build.log:
\ttouch $@
line%: | build.log
\techo "$@ $$GXP_HOSTNAME" >> build.log
\tsleep 0.2
\ttouch $@
"""


def test_24_appends_from_recipes_on_four_or_more_nodes_keep_every_line(bed, g, mnt):
    work = mnt + "/app"
    make_in(bed, g, work, APPENDS, "-j24")
    lines = on(g, "tv03", "cat %s/build.log" % work).stdout.splitlines()
    assert sorted(l.split()[0] for l in lines) == sorted("line%d" % i for i in range(1, 25)), \
        "\n".join(lines)
    assert len({l.split()[1] for l in lines}) >= 4, "\n".join(lines)


def test_a_copy_that_missed_changes_catches_up(bed, make_gxp):
    """The head's second `ns` call to tv05's mount is never sent (a fault the
    daemon takes from GXP_TEST_NS_DROP): the next one shows tv05 the gap, its
    copy starts over, and every name shows there within the bound."""
    g = make_gxp(bed=bed, user=next(iter(bed.users)))
    try:
        mnt = mounted(g, env={"GXP_TEST_NS_DROP": "tv05:2"})
        w = mnt + "/w"
        on(g, "tv01", "mkdir %s" % w)
        on(g, "tv05", "ls %s" % w)

        def shows(*names):
            want = set(names)
            deadline = time.monotonic() + BOUND
            while True:
                seen = set(on(g, "tv05", "ls %s" % w).stdout.split())
                if want <= seen or time.monotonic() > deadline:
                    return want - seen
        for name in ("a", "b", "c"):
            on(g, "tv01", "touch %s/%s" % (w, name))
        assert shows("a", "b", "c") == set()
        with open(os.path.join(g.session_dir, "gxpd.log")) as f:
            assert "never came" in f.read()
    finally:
        g.ok("umount")
