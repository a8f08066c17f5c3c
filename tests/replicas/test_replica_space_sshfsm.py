"""sshfsm -o cache_size= on a real mount (the 3-host bed of test_sshfsm.py): three
1 MiB files read through a 2 MiB store leave the two read last; a replica
held open for reading is not the one evicted for the next, even when it is
the least recently used."""
from __future__ import annotations

import os
import subprocess
import time

from test_sshfsm import env, wait_for  # noqa: F401  (env: the module's bed)

MIB = 1 << 20


def _held(cache: str, data: dict) -> list:
    """Which files the store holds complete replicas of."""
    out = []
    for name in sorted(os.listdir(cache)):
        if name.startswith("."):
            continue
        with open(os.path.join(cache, name), "rb") as f:
            got = f.read()
        out += [k for k, v in data.items() if v == got]
    return sorted(out)


def test_cache_size_evicts_the_least_recently_used_but_not_an_open_one(env):  # noqa: F811
    data = {k: os.urandom(MIB) for k in ("x", "y", "z")}
    _, a = env.remote("tb01", data)
    parent = env.mkdir()
    with env.mount("-o", "cache_dir=%s,cache_size=2M" % parent, a) as mp:
        (cache,) = os.listdir(parent)
        cache = os.path.join(parent, cache)
        for k in ("x", "y", "z"):
            env.sh("cat %s/%s > /dev/null" % (mp, k))
        assert wait_for(lambda: _held(cache, data) == ["y", "z"]), _held(cache, data)
        # a reader keeps y open (served from its replica), then z is read again:
        # y is the least recently used, yet reading x again evicts z
        reader = env.bed.popen_as(env.user, ["python3", "-c",
                                             "import sys; f = open(sys.argv[1], 'rb'); f.read(1); "
                                             "print('open', flush=True); sys.stdin.read()",
                                             "%s/y" % mp],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert reader.stdout.readline().strip() == "open"
            env.sh("cat %s/z > /dev/null" % mp)        # from its replica: z is used last
            time.sleep(0.2)
            env.sh("cat %s/x > /dev/null" % mp)
            assert wait_for(lambda: _held(cache, data) == ["x", "y"]), _held(cache, data)
        finally:
            reader.stdin.close()
            reader.wait(timeout=30)
        # closed: y goes first now
        env.sh("cat %s/z > /dev/null" % mp)
        assert wait_for(lambda: _held(cache, data) == ["x", "z"]), _held(cache, data)
