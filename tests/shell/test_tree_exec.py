"""`gxpc e` along a real tree of local agents (fan-out 2, depth 2): the head
sends one message per child, agents pass it down and fold the exit statuses
(and -b's output) back up (issue 27). Failing nodes in a subtree, a node lost
in the middle of a folded command, output that still streams while the
command runs. Run as the tests' ordinary user."""
from __future__ import annotations

import os
import signal
import threading

from test_flow_lifetimes import mark, marked_sleeps, stat_pids, wait_for  # noqa: F401  (fixture)

from gxpstyle.config import hostpattern


def _tree(gxp) -> dict:
    """{node id: name} of a fresh 7-node tree of depth 2."""
    gxp.ok("explore", "--local", "6", "--fanout", "2")
    r = gxp.ok("e", "echo $GXP_NODE_ID $GXP_HOSTNAME")
    names = dict(line.split() for line in r.stdout.splitlines())
    assert sorted(names) == ["0", "0.1", "0.1.1", "0.1.2", "0.2", "0.2.1", "0.2.2"]
    return names


def _id_key(nid: str) -> list:
    return [int(x) for x in nid.split(".")]


def _failed_line(names: dict, failed: dict) -> str:
    parts = ["%s (%s)" % (names[n], failed[n]) for n in sorted(failed, key=_id_key)]
    return "gxpc: e: failed on %d of %d: %s" % (len(failed), len(names), ", ".join(parts))


def test_exit_statuses_of_a_subtree_with_failing_nodes(gxp):
    names = _tree(gxp)
    r = gxp.run("e", "case $GXP_NODE_ID in 0.1.2) exit 3;; 0.2|0.2.*) exit 4;; esac")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == _failed_line(
        names, {"0.1.2": "exit 3", "0.2": "exit 4", "0.2.1": "exit 4", "0.2.2": "exit 4"})
    # The head booked every node's status from the folded reports.
    gxp.ok("smask")
    r = gxp.ok("e", "echo $GXP_NODE_ID")
    assert sorted(r.stdout.split()) == ["0", "0.1", "0.1.1"]
    gxp.ok("rmask")
    # A selection inside a subtree: its gateway only passes the command on.
    r = gxp.ok("e", "--hosts", names["0.2.2"], "echo $GXP_NODE_ID $GXP_EXEC_IDX $GXP_NUM_EXECS")
    assert r.stdout == "0.2.2 0 1\n"


def test_a_leaf_lost_mid_command_does_not_hold_its_gateways_fold(gxp, mark):  # noqa: F811
    names = _tree(gxp)
    gxp.ok("export", "FLOWMARK=" + mark)
    p = gxp.popen("e", "case $GXP_NODE_ID in 0.1|0.1.*) sleep 1000;; esac")
    try:
        wait_for("the sleeps of 0.1's subtree",
                 lambda: sorted(marked_sleeps(mark)) == ["0.1", "0.1.1", "0.1.2"], 15)
        os.kill(stat_pids(gxp)["0.1.2"], signal.SIGKILL)
        wait_for("the lost leaf's job gone", lambda: "0.1.2" not in marked_sleeps(mark), 5)
        for pids in marked_sleeps(mark).values():
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1
    # The shells report their sleep's SIGKILL as 137; the head answers for the lost leaf.
    assert err.strip().splitlines()[-1] == _failed_line(
        names, {"0.1": "exit 137", "0.1.1": "exit 137", "0.1.2": "node lost: link closed"})


def test_a_gateway_lost_mid_command_fails_its_subtree_only(gxp, mark):  # noqa: F811
    names = _tree(gxp)
    gxp.ok("export", "FLOWMARK=" + mark)
    p = gxp.popen("e", "case $GXP_NODE_ID in 0.1|0.1.*) sleep 1000;; *) echo done;; esac")
    try:
        wait_for("the sleeps of 0.1's subtree",
                 lambda: sorted(marked_sleeps(mark)) == ["0.1", "0.1.1", "0.1.2"], 15)
        os.kill(stat_pids(gxp)["0.1"], signal.SIGKILL)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1
    assert out.split() == ["done"] * 4
    last = err.strip().splitlines()[-1]
    assert last.startswith("gxpc: e: failed on 3 of 7: %s (node lost: " % names["0.1"])
    for nid in ("0.1.1", "0.1.2"):
        assert "%s (node lost: parent 0.1 lost)" % names[nid] in last
    wait_for("the lost subtree's jobs gone", lambda: marked_sleeps(mark) == {}, 5)
    r = gxp.ok("e", "echo $GXP_NODE_ID")
    assert sorted(r.stdout.split()) == ["0", "0.2", "0.2.1", "0.2.2"]


def test_output_streams_while_the_command_runs(gxp, mark):  # noqa: F811
    names = _tree(gxp)
    gxp.ok("export", "FLOWMARK=" + mark)
    p = gxp.popen("e", "-H", "echo started; sleep 1000")
    lines: list = []

    def read() -> None:
        for line in p.stdout:
            lines.append(line.rstrip("\n"))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # Every node's line arrives, the deepest ones' included, while every
        # command still runs: output is never held for the fold.
        wait_for("a line from every node", lambda: len(lines) == 7, 15)
        assert sorted(lines) == sorted("%s: started" % n for n in names.values())
        assert p.poll() is None and len(marked_sleeps(mark)) == 7
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=20) == 130
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        reader.join(5)
    wait_for("the commands gone after Ctrl-C", lambda: marked_sleeps(mark) == {}, 5)


def test_b_folds_output_along_the_tree(gxp):
    names = _tree(gxp)
    r = gxp.ok("e", "-b", "echo same")
    assert r.stdout.splitlines() == ["-" * 15, "head local[[1-6]] (7)", "-" * 15, "same"]
    r = gxp.ok("e", "-b", "echo $((GXP_EXEC_IDX % 2)); echo err >&2")
    groups = r.stdout.split("-" * 15 + "\n")[1:]
    assert len(groups) == 4
    assert sorted(groups[1::2]) == ["0\nerr\n", "1\nerr\n"]
    # Output past what a node holds for the fold streams to the client, which
    # still folds it with the rest.
    big = "head -c 100000 /dev/zero | tr '\\0' x; echo"
    r = gxp.ok("e", "-b", "if [ $GXP_NODE_ID = 0.1.1 ]; then %s; else echo small; fi" % big)
    out = r.stdout.split("-" * 15 + "\n")[1:]
    others = [names[n] for n in sorted(names, key=_id_key) if n != "0.1.1"]
    assert out[0] == "%s (6)\n" % hostpattern.fold(others)
    assert out[1] == "small\n" and out[2] == names["0.1.1"] + " (1)\n"
    assert out[3] == "x" * 100000 + "\n"


def test_e_on_a_tree_without_the_head(gxp):
    names = _tree(gxp)
    r = gxp.run("e", "--hosts", "local*", "test $GXP_NODE_ID != 0.2.1")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == _failed_line(
        {n: v for n, v in names.items() if n != "0"}, {"0.2.1": "exit 1"})
