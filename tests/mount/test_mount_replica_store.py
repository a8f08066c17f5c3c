"""The one replica store (sshfsmux/branches/replica_cache.py) that SFTP and direct branches
share: a replica is complete or invisible (temporary name, length verified
against its version, renamed), one replica per file, and a persistent store
finds its complete replicas again and drops damaged ones and stale leftovers.
"""
import os
import stat
import time

from sshfsmux.branches.replica_cache import PART_SUFFIX, TMP_PREFIX, ReplicaCache


def write(d, data):
    os.write(d.fd, data)
    os.close(d.fd)


def test_a_replica_is_complete_or_invisible(tmp_path):
    c = ReplicaCache(str(tmp_path))
    d = c.begin("k", 5, 1, 2, 3)                 # a direct branch's version: 4 numbers
    assert os.path.basename(d.temp).startswith(TMP_PREFIX) and d.temp.endswith(PART_SUFFIX)
    write(d, b"1234")                           # one byte short
    assert d.commit() is None and c.current("k") is None
    assert os.listdir(c.dir) == []              # the short file is gone too
    d = c.begin("k", 5, 1, 2, 3)
    write(d, b"12345")
    path = d.commit()
    assert open(path, "rb").read() == b"12345"
    assert c.current("k") == ((5, 1, 2, 3), path) and c.has("k", 5, 1, 2, 3)
    assert c.get("k", 5, 100) is None            # another version: dropped
    assert os.listdir(c.dir) == []
    c.close()
    assert not os.path.exists(c.dir)


def test_a_change_while_streaming_and_a_new_version(tmp_path):
    c = ReplicaCache(str(tmp_path))
    d = c.begin("b|/dir/f", 2, 7)
    c.invalidate_prefix("b|/dir")                 # the directory was renamed meanwhile
    write(d, b"ab")
    assert d.commit() is None and not c.has("b|/dir/f", 2, 7)
    d = c.begin("b|/dir/f", 2, 7)
    write(d, b"ab")
    assert d.commit()
    d = c.begin("b|/dir/f", 3, 8)                # a newer version replaces it
    write(d, b"abc")
    assert d.commit()
    assert [n for n in os.listdir(c.dir)] == [os.path.basename(c.current("b|/dir/f")[1])]
    c.close()


def test_a_persistent_store_keeps_complete_replicas_only(tmp_path):
    where = str(tmp_path / "replicas")
    c = ReplicaCache.persistent(where)
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
    for key, data in (("node\0a", b"aaaa"), ("node\0b", b"bb")):
        d = c.begin(key, len(data), 11, 22, 33)
        write(d, data)
        assert d.commit()
    left = c.begin("node\0c", 10, 1, 1, 1)        # a crash mid-stream leaves this
    os.write(left.fd, b"x")
    os.close(left.fd)
    old = os.path.join(where, TMP_PREFIX + "old" + PART_SUFFIX)
    open(old, "wb").close()
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    damaged = c.current("node\0b")[1]
    with open(damaged, "ab") as f:                # the length no longer matches its name
        f.write(b"!")
    c.close()
    assert os.path.isdir(where)                   # kept

    c = ReplicaCache.persistent(where)
    version, path = c.current("node\0a")
    assert version == (4, 11, 22, 33) and open(path, "rb").read() == b"aaaa"
    assert c.current("node\0b") is None and not os.path.exists(damaged)
    assert not os.path.exists(old)                # stale leftover removed
    assert os.path.exists(left.temp)              # a recent one may belong to a live mount
    c.close()


def test_both_kinds_of_branch_use_the_store():
    import sshfsmux.direct.files
    import sshfsmux.sftp.streaming
    from sshfsmux.branches import replica_cache
    from sshfsmux.direct import branch as direct_branch
    assert direct_branch.ReplicaCache is replica_cache.ReplicaCache
    assert direct_branch.TMP_PREFIX == replica_cache.TMP_PREFIX
    # neither keeps replicas of its own any more
    for mod in (direct_branch, sshfsmux.direct.files, sshfsmux.sftp.streaming):
        src = open(mod.__file__).read()
        assert "mkstemp" not in src and "os.rename" not in src, mod.__name__
