"""Space in a replica store (sshfsmux/branches/replica_cache.py) and `-o cache_size=`:
the least recently used replica is evicted first, never one a running recipe
pinned nor one open for reading; a planned copy that cannot fit fails with
ENOSPC naming the store and is removed; the option takes sizes in the user's
words (512M, 4G) in a checked range, for sshfsm and gxpc mount alike."""
from __future__ import annotations

import errno
import os

import pytest

from gxpstyle.config import limits
from sshfsmux.branches.replica_cache import ReplicaCache
from sshfsmux.gmount import verbs as mount_cli
from sshfsmux.standalone import mount_options

MIB = 1 << 20


def _copy(c: ReplicaCache, name: str, size: int = MIB) -> str:
    """A complete copy made beside the store, as a planned transfer leaves it."""
    p = os.path.join(c.dir, ".tmp-xfer-" + name)
    with open(p, "wb") as f:
        f.write(b"x" * size)
    return p


def _adopt(c: ReplicaCache, key: str, size: int = MIB) -> str:
    got = c.adopt(key, (size, 1, 1, 1), _copy(c, key, size))
    assert got is not None
    return got


def _kept(c: ReplicaCache, *keys: str) -> list:
    return [k for k in keys if c.current(k) is not None]


def test_the_least_recently_used_replica_goes_first(tmp_path):
    c = ReplicaCache(str(tmp_path), limit=3 * MIB)
    for k in ("a", "b", "c"):
        _adopt(c, k)
    assert c.get("a", MIB, 1, 1, 1)              # read: now the most recently used
    _adopt(c, "d")
    assert [k for k in "abcd" if c.has(k, MIB, 1, 1, 1)] == ["a", "c", "d"]
    _adopt(c, "e")
    assert [k for k in "abcde" if c.has(k, MIB, 1, 1, 1)] == ["a", "d", "e"]
    assert c.used() == 3 * MIB and len(os.listdir(c.dir)) == 3
    c.close()


def test_a_pinned_replica_is_never_evicted_and_a_copy_that_cannot_fit_fails_enospc(tmp_path):
    c = ReplicaCache(str(tmp_path), limit=2 * MIB)
    _adopt(c, "a")
    _adopt(c, "b")
    c.pin(["a", "b"])
    c.pin(["a"])                                  # two recipes need a
    extra = _copy(c, "c")
    with pytest.raises(OSError) as e:
        c.adopt("c", (MIB, 1, 1, 1), extra)
    assert e.value.errno == errno.ENOSPC
    assert "ENOSPC" in e.value.strerror and c.dir in e.value.strerror
    assert "cache_size 2.0 MiB" in e.value.strerror
    assert not os.path.exists(extra)              # the copy is removed, nothing partial left
    assert sorted(os.listdir(c.dir)) == sorted(os.path.basename(c.current(k)[1]) for k in "ab")
    c.unpin(["a", "b"])                           # b is free, a still pinned once
    _adopt(c, "c")
    assert [k for k in "abc" if c.has(k, MIB, 1, 1, 1)] == ["a", "c"]
    c.close()


def test_a_replica_open_for_reading_is_not_evicted(tmp_path):
    c = ReplicaCache(str(tmp_path), limit=2 * MIB)
    a = _adopt(c, "a")
    _adopt(c, "b")
    fd = os.open(a, os.O_RDONLY)                  # a reader through the mount holds it
    try:
        _adopt(c, "c")
        assert [k for k in "abc" if c.has(k, MIB, 1, 1, 1)] == ["a", "c"]
    finally:
        os.close(fd)
    _adopt(c, "d")                                # closed: a is the oldest now
    assert [k for k in "acd" if c.has(k, MIB, 1, 1, 1)] == ["c", "d"]
    c.close()


def test_a_copy_larger_than_the_whole_store_fails_enospc(tmp_path):
    c = ReplicaCache(str(tmp_path), limit=MIB)
    big = _copy(c, "big", 2 * MIB)
    with pytest.raises(OSError) as e:
        c.adopt("big", (2 * MIB, 1, 1, 1), big)
    assert e.value.errno == errno.ENOSPC and not os.path.exists(big)
    assert os.listdir(c.dir) == []
    c.close()


def test_the_default_size_is_half_the_free_space_of_the_store(tmp_path):
    c = ReplicaCache(str(tmp_path))
    st = os.statvfs(c.dir)
    assert abs(c.limit - st.f_bavail * st.f_frsize // 2) < 64 * MIB
    c.close()


@pytest.mark.parametrize("text,size", [("512M", 512 * MIB), ("4G", 4 << 30), ("4GiB", 4 << 30),
                                       ("1.5G", 3 << 29), ("1048576", MIB)])
def test_cache_size_takes_sizes_in_the_users_words(text, size):
    assert limits.parse_size(text, "cache_size") == size
    o = mount_options.parse(["-o", "cache_size=" + text, "host:/x", "/mnt"])
    assert o.cache_size == size
    assert mount_cli.mount_options(["ro,cache_size=" + text]) == {"ro": "", "cache_size": str(size)}


@pytest.mark.parametrize("text,words", [("100K", "from 1M to 1024P, got '100K'"),
                                        ("lots", "a size such as 512M or 4G, got 'lots'"),
                                        ("", "a size such as 512M or 4G, got ''"),
                                        ("-1G", "from 1M to 1024P, got '-1G'")])
def test_a_bad_cache_size_is_one_line_in_the_users_words(text, words):
    with pytest.raises(mount_options.UsageError) as e:
        mount_options.parse(["-o", "cache_size=" + text, "host:/x", "/mnt"])
    assert str(e.value) == "cache_size must be " + words
    with pytest.raises(mount_cli.UsageError) as e2:
        mount_cli.mount_options(["cache_size=" + text])
    assert str(e2.value) == "mount: cache_size must be " + words


def test_a_change_while_a_copy_streams_in_drops_it_and_others_cost_no_memory(tmp_path):
    """A file announced changed while its replica streams in is not kept
    (the bytes may be of either version); the announcements of names with
    no download under way leave nothing behind in the store (every name a
    mount heard changed was counted, growing with the namespace)."""
    c = ReplicaCache(str(tmp_path), limit=3 * MIB)
    d = c.begin("a", 3, 1, 1, 1)
    os.write(d.fd, b"abc")
    os.close(d.fd)
    c.invalidate("a")
    assert d.commit() is None and c.current("a") is None
    e = c.begin("a", 3, 2, 2, 2)        # fetched again after the change: kept
    os.write(e.fd, b"xyz")
    os.close(e.fd)
    assert e.commit() is not None and c.current("a") is not None
    for i in range(1000):
        c.invalidate("name-%d" % i)
    assert len(c._generation) <= 1
    c.invalidate("a")
    assert c.current("a") is None and os.listdir(c.dir) == []
    c.close()
