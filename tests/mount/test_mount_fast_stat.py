"""The cold-stat fast path of a one-branch mount (LocalBranch.stat_into, used
by fuse_glue's getattr): it must agree with the general path, stay confined
to the branch root, and hand everything unusual back to the general path.
No mount: the branch is called as libfuse's getattr would call it.
"""
import ctypes
import errno
import os
import stat

import pytest

mfusepy = pytest.importorskip("mfusepy")

from sshfsmux.branches import local_branch, local_syscalls  # noqa: E402
from sshfsmux.branches.local_branch import LocalBranch  # noqa: E402

pytestmark = pytest.mark.skipif(local_syscalls.libc_stat is None,
                                reason="no libc fstatat on this machine")


def _stat(b, path):
    st = mfusepy.c_stat()
    rc = b.stat_into(path.encode(), ctypes.pointer(st))
    return rc, st


def test_fast_stat_agrees_with_getattr(tmp_path):
    root = tmp_path / "root"
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "e" / "f").write_bytes(b"x" * 5000)
    (root / "top").write_text("t")
    os.mkfifo(str(root / "d" / "fifo"))
    os.symlink("nowhere", str(root / "d" / "link"))
    b = LocalBranch(str(root))
    for path in ("/top", "/d", "/d/e", "/d/e/f", "/d/fifo", "/d/link"):
        rc, st = _stat(b, path)
        assert rc == 0, path
        a = b.getattr(path)
        assert (st.st_mode, st.st_size, st.st_nlink, st.st_uid) == (
            a["st_mode"], a["st_size"], a["st_nlink"], a["st_uid"]), path
        assert st.st_mtimespec.tv_sec * 10 ** 9 + st.st_mtimespec.tv_nsec == a["st_mtime_ns"]
    assert stat.S_ISLNK(_stat(b, "/d/link")[1].st_mode)      # the last name is never followed


def test_fast_stat_missing_names_are_enoent(tmp_path):
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "file").write_text("f")
    b = LocalBranch(str(root))
    for path in ("/nope", "/d/nope", "/nope/x", "/nope/x/y", "/d/nope/x/y"):
        assert _stat(b, path)[0] == -errno.ENOENT, path
    # a file where a directory should be (ENOTDIR, or a symlink to expand):
    # the general path tells them apart
    assert _stat(b, "/file/x")[0] == local_branch._GENERAL


def test_fast_stat_stays_confined(tmp_path):
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("in")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("out")
    os.symlink(str(tmp_path / "outside"), str(root / "esc"))
    os.symlink(str(tmp_path / "outside"), str(root / "d" / "esc"))
    b = LocalBranch(str(root))
    # a symlink among the directories: never stat'ed through, the general
    # path decides (it refuses the escape)
    for path in ("/esc/secret", "/d/esc/secret"):
        assert _stat(b, path)[0] == local_branch._GENERAL, path
        with pytest.raises(OSError) as ei:
            b.getattr(path)
        assert ei.value.errno == errno.EACCES
    # odd components and the root go the general way too
    for path in ("/", "/d/../d/f", "/d//f", "/./d", "/d/.", "/.hidden"):
        assert _stat(b, path)[0] == local_branch._GENERAL, path


def test_fast_stat_leaves_excluded_names_to_the_general_path(tmp_path):
    root = tmp_path / "root"
    (root / "hidden").mkdir(parents=True)
    b = LocalBranch(str(root), exclude=[str(root / "hidden")])
    assert _stat(b, "/hidden")[0] == local_branch._GENERAL
    with pytest.raises(OSError) as ei:
        b.getattr("/hidden")
    assert ei.value.errno == errno.ENOENT


def test_new_names_get_their_mode_whatever_the_process_umask(tmp_path):
    # a GMount runs inside the agent, whose umask is not 0: the kernel has
    # already applied the caller's umask, the branch must not apply its own
    old = os.umask(0o027)
    try:
        b = LocalBranch(str(tmp_path))
    finally:
        os.umask(old)
    assert b._umask == 0o027
    b.mkdir("/d", 0o777)
    b.mknod("/p", stat.S_IFIFO | 0o666, 0)
    b.open_write("/f", os.O_WRONLY, 0o4777, True).close()
    (tmp_path / "old").write_text("x")
    os.chmod(str(tmp_path / "old"), 0o600)
    b.open_write("/old", os.O_WRONLY, 0o777, True).close()     # there already: kept
    modes = {n: stat.S_IMODE(os.lstat(str(tmp_path / n)).st_mode) for n in ("d", "p", "f", "old")}
    assert modes == {"d": 0o777, "p": 0o666, "f": 0o4777, "old": 0o600}


def test_kept_parent_follows_renames_through_the_branch(tmp_path):
    # stat_into keeps a name's directory open for the next names in it: a
    # rename or rmdir through the branch must make it look again at once
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("old")
    b = LocalBranch(str(root))
    assert _stat(b, "/d/f")[0] == 0
    b.rename("/d", "/moved")
    b.mkdir("/d", 0o755)
    assert _stat(b, "/d/f")[0] == -errno.ENOENT
    (root / "d" / "g").write_text("new")
    assert _stat(b, "/d/g")[0] == 0
    b.unlink("/d/g")
    b.rmdir("/d")
    assert _stat(b, "/d/g")[0] == -errno.ENOENT
    b.close()


def test_kept_parent_expires_for_changes_behind_the_branch(tmp_path, monkeypatch):
    # a directory replaced directly in the export (here by a symlink that
    # leads out) is looked up again once PARENT_SECONDS have passed, and the
    # symlink then goes to the general path, which refuses it
    monkeypatch.setattr(local_branch, "PARENT_SECONDS", 0.2)
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("in")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("out")
    b = LocalBranch(str(root))
    assert _stat(b, "/d/f")[0] == 0
    os.rename(str(root / "d"), str(root / "old"))
    os.symlink(str(tmp_path / "outside"), str(root / "d"))
    import time
    time.sleep(0.3)
    assert _stat(b, "/d/secret")[0] == local_branch._GENERAL
    with pytest.raises(OSError) as ei:
        b.getattr("/d/secret")
    assert ei.value.errno == errno.EACCES
    b.close()


def test_kept_parents_are_per_thread_and_closed_with_the_branch(tmp_path):
    import threading
    root = tmp_path / "root"
    for d in ("a", "b"):
        (root / d).mkdir(parents=True)
        (root / d / "f").write_text(d)
    before = len(os.listdir("/proc/self/fd"))
    b = LocalBranch(str(root))
    results = []
    both = threading.Barrier(2, timeout=30)    # both alive while each keeps one

    def storm(d):
        both.wait()
        for _ in range(50):
            results.append(_stat(b, "/%s/f" % d)[1].st_size)
        both.wait()
    threads = [threading.Thread(target=storm, args=(d,)) for d in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(set(results)) == [1]
    assert len(results) == 100
    assert len(b._parents) == 2           # one kept directory per thread
    b.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_kept_parents_of_ended_threads_are_closed(tmp_path):
    # libfuse ends idle workers and starts new ones: a thread per stat, one
    # after another, must not leave one open directory each
    import threading
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "f").write_text("x")
    before = len(os.listdir("/proc/self/fd"))
    b = LocalBranch(str(root))
    try:
        for _ in range(30):
            t = threading.Thread(target=_stat, args=(b, "/a/f"))
            t.start()
            t.join()
        assert len(b._parents) <= 2
        assert len(os.listdir("/proc/self/fd")) <= before + 3     # root fds, one kept parent
    finally:
        b.close()
    assert len(os.listdir("/proc/self/fd")) == before
