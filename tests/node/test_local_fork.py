"""Local children by fork (local_fork.py): an agent starts its local children as
copies of itself, each a process of its own that holds nothing of its
parent's but the link between them, and a fork that dies is lost like any
agent, its own children with it."""
import os
import signal
import time


def _tree(gxp):
    """{node id: pid} of the up nodes, from `gxpc stat`."""
    nodes = {}
    for line in gxp.ok("stat").stdout.splitlines()[1:]:
        if " up pid=" in line:
            nodes[line.split()[0]] = int(line.split("pid=")[1].split()[0])
    return nodes


def _stat_fields(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()     # state, ppid, pgrp, ...


def _alive(pid):
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def _shared_dirty_kib(pid):
    """Anonymous memory written before a fork and still shared with the other
    copy: only a fork makes it (an exec'd interpreter shares only files)."""
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            if line.startswith("Shared_Dirty:"):
                return int(line.split()[1])
    return 0


def _pipes(pid):
    out = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("pipe:") or target.startswith("socket:"):
            out.add(target)
    return out


def test_local_children_are_forks_holding_only_their_link(gxp):
    gxp.ok("explore", "--local", "10", "--fanout", "2")
    nodes = _tree(gxp)
    assert len(nodes) == 11, nodes
    forked = [n for n in nodes if n.count(".") >= 2]      # under an agent, not the head
    assert len(forked) == 8
    for node in forked:
        pid, parent = nodes[node], nodes[node.rsplit(".", 1)[0]]
        _, ppid, pgrp = _stat_fields(pid)[:3]
        assert int(ppid) == parent and int(pgrp) == pid, (node, ppid, pgrp)
        assert _shared_dirty_kib(pid) > 512, (node, "not a fork of its parent")
        # Of its parent's pipes and sockets it holds only those it shares with
        # the parent alone: never the parent's link up, nor a sibling's link.
        grand = nodes[node.rsplit(".", 2)[0]]
        parents_up = _pipes(parent) & _pipes(grand)
        assert parents_up and not (_pipes(pid) & parents_up), node
        for sibling in forked:
            if sibling != node and sibling.rsplit(".", 1)[0] == node.rsplit(".", 1)[0]:
                assert not (_pipes(pid) & _pipes(nodes[sibling])), (node, sibling)
    ids = gxp.ok("e", "echo $GXP_NODE_ID").stdout.split()
    assert sorted(ids) == sorted(nodes)


def test_a_killed_fork_is_lost_with_its_children(gxp):
    gxp.ok("explore", "--local", "10", "--fanout", "2")
    nodes = _tree(gxp)
    # A forked agent with forked children of its own.
    victim = next(n for n in nodes if n.count(".") == 2 and n + ".1" in nodes)
    os.kill(nodes[victim], signal.SIGKILL)
    gone = [n for n in nodes if n == victim or n.startswith(victim + ".")]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(n in _tree(gxp) for n in gone):
        time.sleep(0.1)
    out = gxp.ok("stat").stdout
    lost = [l.split()[0] for l in out.splitlines()[1:] if "LOST" in l]
    assert sorted(lost) == sorted(gone), out
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(nodes[n]) for n in gone):
        time.sleep(0.1)
    assert not [n for n in gone if _alive(nodes[n])]
    assert sorted(gxp.ok("e", "echo $GXP_NODE_ID").stdout.split()) == sorted(set(nodes) - set(gone))
