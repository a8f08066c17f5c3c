"""The explorer on the embedded default (local agents), run as an ordinary user."""
import os
import signal
import subprocess
import time

import pytest

import testbed


def test_explore_e_stat_quit(gxp):
    r = gxp.ok("explore", "--local", "4")
    assert r.stdout == "" and r.stderr == ""          # quiet on success
    nodes = gxp.stat_nodes()
    assert sorted(nodes) == ["head", "local1", "local2", "local3", "local4"]
    assert set(nodes.values()) == {"up"}
    r = gxp.ok("e", "echo $GXP_NODE_ID")
    assert sorted(r.stdout.split()) == ["0", "0.1", "0.2", "0.3", "0.4"]
    assert len(gxp.agent_pids()) == 4
    gxp.ok("quit")
    assert gxp.agent_pids() == []
    assert not os.path.exists(gxp.session_dir)


def test_e_reports_failures_prefixes_and_folds(gxp):
    gxp.ok("explore", "--local", "3")
    r = gxp.run("e", "-H", 'echo out; echo err >&2; exit $GXP_EXEC_IDX')
    assert r.returncode == 1
    assert sorted(r.stdout.splitlines()) == ["head: out", "local1: out", "local2: out", "local3: out"]
    last = r.stderr.strip().splitlines()[-1]
    assert last == "gxpc: e: failed on 3 of 4: local1 (exit 1), local2 (exit 2), local3 (exit 3)"
    r = gxp.ok("e", "-b", "echo same")
    assert r.stdout.splitlines() == ["-" * 15, "head local[[1-3]] (4)", "-" * 15, "same"]


def test_masks(gxp):
    gxp.ok("explore", "--local", "3")
    gxp.run("e", "test $GXP_EXEC_IDX -ge 2")
    gxp.ok("savemask", "big")
    gxp.ok("smask")
    r = gxp.ok("e", "echo $GXP_HOSTNAME")
    assert sorted(r.stdout.split()) == ["local2", "local3"]
    gxp.ok("rmask")
    assert len(gxp.ok("e", "true").stdout.split()) == 0
    r = gxp.ok("e", "echo x")
    assert len(r.stdout.split()) == 4
    r = gxp.ok("gexec", "big", "echo $GXP_HOSTNAME")
    assert sorted(r.stdout.split()) == ["local2", "local3"]
    r = gxp.ok("e", "--hosts", "local[[1-2]]", "echo $GXP_HOSTNAME")
    assert sorted(r.stdout.split()) == ["local1", "local2"]
    r = gxp.run("gexec", "nosuch", "true")
    assert r.returncode == 2 and "no saved mask" in r.stderr


def test_incremental_explore_and_tree_fanout(gxp):
    gxp.ok("explore", "--local", "3", "--fanout", "2")
    gxp.ok("explore", "--local", "3", "--fanout", "2")
    out = gxp.ok("stat").stdout
    assert out.splitlines()[0] == "7 nodes up, 0 lost"
    depths = [len(l) - len(l.lstrip()) for l in out.splitlines()[1:]]
    assert max(depths) >= 4      # the fan-out pushed nodes to a second level
    ids = [l.split()[0] for l in out.splitlines()[1:]]
    assert len(ids) == len(set(ids)) == 7


def test_lost_subtree_is_reported_and_rest_works(gxp):
    gxp.ok("explore", "--local", "6", "--fanout", "2")
    out = gxp.ok("stat").stdout
    # Find a level-1 agent that has children, and kill it hard.
    lines = out.splitlines()[1:]
    gateway = next(l for i, l in enumerate(lines)
                   if l.startswith("  0.") and i + 1 < len(lines) and lines[i + 1].startswith("    "))
    gid, pid = gateway.split()[0], int(gateway.split("pid=")[1].split()[0])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        out = gxp.ok("stat").stdout
        if "LOST" in out:
            break
        time.sleep(0.1)
    lost = [l.split()[0] for l in out.splitlines()[1:] if "LOST" in l]
    assert gid in lost and any(x.startswith(gid + ".") for x in lost)
    r = gxp.ok("e", "echo ok")
    assert r.stdout.split().count("ok") == 7 - len(lost)
    # The children of the killed agent noticed and exited (no orphans).
    deadline = time.monotonic() + 5
    while len(gxp.agent_pids()) != 6 - len(lost) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(gxp.agent_pids()) == 6 - len(lost)


def test_ctrl_c_cancels_jobs_everywhere(gxp):
    gxp.ok("explore", "--local", "2")
    marker = "gxp-sleep-%d" % os.getpid()
    # The shell stays (it runs two commands), holding the marker in its argv;
    # gxpc's own argv holds it too: 1 + 3 processes.
    p = gxp.popen("e", "sleep 300; : %s" % marker)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if subprocess.run(["pgrep", "-fc", marker], capture_output=True, text=True).stdout.strip() == "4":
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    p.wait(timeout=10)
    assert p.returncode == 130
    time.sleep(0.3)
    assert subprocess.run(["pgrep", "-f", marker]).returncode == 1


def test_stdin_cwd_and_env(gxp):
    gxp.ok("explore", "--local", "2")
    r = gxp.ok("e", "--stdin", "wc -c", input="hello")
    assert r.stdout.split() == ["5", "5", "5"]
    gxp.ok("cd", "/")
    gxp.ok("export", "GREETING=hi there")
    r = gxp.ok("e", 'echo "$(pwd) $GREETING"')
    assert set(r.stdout.splitlines()) == {"/ hi there"}
    r = gxp.run("e", "--hosts", "local1", "cd /nonexistent-dir-xyz")
    assert r.returncode == 1 and "local1" in r.stderr


def test_bad_input_gives_one_line_and_meaningful_exit(gxp):
    r = gxp.run("stat")
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "no session" in r.stderr
    r = gxp.run("explore", "tb[[05-01]]")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "runs backwards" in r.stderr
    r = gxp.run("explore", "nohost-xyz")
    assert r.returncode == 1
    assert r.stderr == "gxpc: explore: nohost-xyz: no use rule reaches nohost-xyz from any explored host\n"
    r = gxp.run("use", "ssh", "head")
    assert r.returncode == 2
    r = gxp.run("use", "sh", "head", "x*")
    assert r.returncode == 2 and "template" in r.stderr
    r = gxp.run("e")
    assert r.returncode == 2
    r = gxp.run("nosuchverb")
    assert r.returncode == 2
    r = gxp.run("explore", "--config", "/nonexistent.yaml")
    assert r.returncode == 2 and "no such file" in r.stderr


def test_missing_python_and_noisy_login(gxp):
    gxp.ok("use", "local", "head", "nopy*", "--python", "/nonexistent/python3")
    # A "login" that prints to stdout and stderr before python starts.
    gxp.ok("use", "sh", "head", "noisy*", "--template",
           "echo Welcome to {host}; echo motd >&2; sh -c {cmd}")
    r = gxp.run("explore", "nopy1", "noisy1", "noisy2")
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gxpc: explore: nopy1: ")
    assert "No such file" in lines[0]
    assert gxp.stat_nodes() == {"head": "up", "noisy1": "up", "noisy2": "up"}
    r = gxp.ok("e", "--hosts", "noisy*", "echo clean")
    assert r.stdout.split() == ["clean", "clean"]


def test_sessions_are_isolated(make_gxp):
    a, b = make_gxp(), make_gxp()
    a.ok("explore", "--local", "1")
    b.ok("explore", "--local", "2")
    assert len(a.ok("e", "true").stdout) == 0
    assert len(a.ok("e", "echo x").stdout.split()) == 2
    assert len(b.ok("e", "echo x").stdout.split()) == 3
    a.ok("quit")
    assert len(b.ok("e", "echo x").stdout.split()) == 3


def test_session_dir_open_to_others_is_refused(gxp, user_bed):
    gxp.ok("explore", "--local", "1")
    if user_bed is not None:
        user_bed.run_as(gxp.user, ["chmod", "0755", gxp.session_dir], check=True)
    else:
        os.chmod(gxp.session_dir, 0o755)
    r = gxp.run("stat")
    assert r.returncode == 3 and "must be 0700" in r.stderr
    if user_bed is not None:
        user_bed.run_as(gxp.user, ["chmod", "0700", gxp.session_dir], check=True)
    else:
        os.chmod(gxp.session_dir, 0o700)


def test_hung_login_times_out_with_reason(gxp):
    gxp.ok("use", "sh", "head", "hang1", "--template", "sleep 60; sh -c {cmd}")
    t0 = time.monotonic()
    r = gxp.run("explore", "hang1", "--timeout", "2")
    assert r.returncode == 1 and time.monotonic() - t0 < 10
    assert r.stderr == "gxpc: explore: hang1: no answer within 2s\n"
    assert gxp.stat_nodes() == {"head": "up"}


@pytest.fixture
def shared_tmp():
    """A directory the test's ordinary user can read (pytest's tmp_path is root's)."""
    import shutil
    import tempfile
    from pathlib import Path
    d = tempfile.mkdtemp(prefix="gxpcfg-", dir="/var/tmp")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def test_explore_from_cluster_yaml(gxp, shared_tmp):
    tmp_path = shared_tmp
    cfg = tmp_path / "clusters.yaml"
    cfg.write_text(
        "fanout: 2\n"
        "use:\n"
        "  - {channel: local, from: head, to: 'n[[1-5]]'}\n"
        "  - {channel: local, from: 'n*', to: 'n[[1-5]]'}\n"
        "  - {channel: sh, from: head, to: slow1, template: 'sleep 30; sh -c {cmd}'}\n"
        "clusters:\n"
        "  slow:\n"
        "    hosts: slow1\n"
        "    timeout: 1\n"
        "explore: ['n[[1-5]]', slow1]\n")
    os.chmod(cfg, 0o644)
    r = gxp.run("explore", "--config", str(cfg))
    # The per-cluster timeout (1 s) applied to slow1, not the default 20 s.
    assert r.returncode == 1 and r.stderr == "gxpc: explore: slow1: no answer within 1s\n"
    out = gxp.ok("stat").stdout
    assert out.splitlines()[0] == "6 nodes up, 0 lost"
    # fanout 2 from the file: nobody has more than two children.
    ids = [l.split()[0] for l in out.splitlines()[1:]]
    for nid in ids:
        assert sum(1 for c in ids if c.rsplit(".", 1)[0] == nid and c != nid) <= 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("use:\n  - {channel: ssh, from: head, to: 'x[[3-1]]'}\n")
    os.chmod(bad, 0o644)
    r = gxp.run("explore", "--config", str(bad))
    assert r.returncode == 2 and r.stderr.startswith("gxpc: %s:2: " % bad)


@pytest.fixture
def fuse_for_users(user_bed):
    """/dev/fuse open to ordinary users, as on real systems (0600 on this machine)."""
    if user_bed is None:
        pytest.skip("needs root to open /dev/fuse to an ordinary user")
    with testbed.fuse_open_to_users():
        yield


def test_gmount_with_local_agents_mounts_once_per_host(gxp, fuse_for_users):
    """Local agents share the head's machine: one mount serves them all."""
    gxp.ok("explore", "--local", "2")
    top = os.path.dirname(gxp.session_dir)
    export, mnt = top + "/export", top + "/mnt"
    gxp.ok("e", "--hosts", "head", "mkdir -p %s %s" % (export, mnt))
    r = gxp.ok("mount", export, mnt)
    assert r.stderr == ""
    r = gxp.ok("e", "echo hi > %s/f-$GXP_NODE_ID; ls %s | wc -l" % (mnt, mnt))
    assert sorted(os.listdir(export)) == ["f-0", "f-0.1", "f-0.2"]
    r = gxp.ok("e", "--hosts", "local1", "getfattr --only-values -n user.sshfsmux.location %s/f-0.2"
               % mnt)
    assert r.stdout == "head"
    # Unmodified programs in the mount: gcc (temporary files, rename, exec), make.
    import shutil
    if shutil.which("gcc") and shutil.which("make"):
        r = gxp.run("e", "--hosts", "local1",
                    "cd %s && printf 'int main(void){return 7;}\\n' > a.c && "
                    "printf 'a: a.c\\n\\tgcc -O0 -o a a.c\\n' > Makefile && make -s && ./a" % mnt)
        assert r.returncode == 1 and "local1 (exit 7)" in r.stderr, r.stderr
    gxp.ok("umount")
    with open("/proc/mounts") as f:
        assert mnt not in f.read()


def test_gmount_refuses_symlinks_that_leave_the_export(gxp, fuse_for_users):
    gxp.ok("explore", "--local", "1")
    top = os.path.dirname(gxp.session_dir)
    export, mnt = top + "/export", top + "/mnt"
    gxp.ok("e", "--hosts", "head", "mkdir -p %s/sub %s && echo in > %s/sub/f && cd %s && "
           "ln -s /etc etc && ln -s ../.. up && ln -s sub inside && ln -s ../sub sub/self"
           % (export, mnt, export, export))
    gxp.ok("mount", export, mnt)
    r = gxp.run("e", "--hosts", "head", "cat %s/etc/passwd" % mnt)
    assert r.returncode == 1 and "Permission denied" in r.stderr
    r = gxp.run("e", "--hosts", "head", "ls %s/up/" % mnt)
    assert r.returncode == 1 and "Permission denied" in r.stderr
    r = gxp.ok("e", "--hosts", "head", "cat %s/inside/f %s/sub/self/f" % (mnt, mnt))
    assert r.stdout == "in\nin\n"
    gxp.ok("umount")
