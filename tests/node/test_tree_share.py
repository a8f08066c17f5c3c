"""A node's part in a command sent along the tree (node/tree_exec.py), with a
stand-in for the node: what it passes down (one message a child, naming the
targets of that child's subtree), and how it folds the exit statuses of its
subtree into one report to its parent (issue 27). Every message is checked
against the wire schema. The real tree is tested in tests/shell/test_tree_exec.py."""
from __future__ import annotations

from gxpstyle.node import tree_exec
from gxpstyle.node.tree_exec import TreeJobs
from gxpstyle.protocol import wire


class _Link:
    def __init__(self, peer: str, sent: list, events: list) -> None:
        self.peer, self.sent, self.events = peer, sent, events

    def send(self, dst: str, src: str, msg: dict) -> None:
        _, _, body = wire.split_frame(wire.encode_frame(dst, src, msg)[4:])
        self.sent.append((dst, src, wire.decode_message(body)))

    def push(self) -> None:
        self.events.append("push " + self.peer)


class _Jobs:
    def __init__(self, events: list) -> None:
        self.started = []
        self.events = events

    def start(self, requester: str, msg: dict) -> None:
        wire.validate(msg)
        self.started.append((requester, msg))
        self.events.append("start")


class _Node:
    """What TreeJobs uses of agent.Node: its id, name, children, jobs, send."""

    def __init__(self, nid: str, children) -> None:
        self.id, self.name = nid, "n" + nid
        self.sent: list = []
        self.events: list = []      # pushes of links and starts of our own job, in order
        self.children = {c: _Link(c, self.sent, self.events) for c in children}
        self.jobs = _Jobs(self.events)

    def send(self, dst: str, msg: dict) -> None:
        _Link(dst, self.sent, []).send(dst, self.id, msg)


def _exec_tree(targets: dict, fold: bool = False) -> dict:
    msg = {"op": "exec_tree", "job": 5, "cmd": "true", "cwd": None, "env": {"A": "1"},
           "stdin": False, "fold": fold, "targets": targets}
    return wire.validate(msg)


def _report(groups, final=True) -> dict:
    return wire.validate({"op": "exec_report", "job": 5, "client": "c1", "groups": groups,
                          "final": final})


def _exit(status: int, error: str = "") -> dict:
    return {"op": "exit", "job": 5, "status": status, "error": error}


def test_one_message_a_child_with_the_targets_of_its_subtree():
    node = _Node("0.1", ["0.1.1", "0.1.2"])
    trees = TreeJobs(node)
    targets = {"0.1": {"I": "0"}, "0.1.1": {"I": "1"}, "0.1.1.4": {"I": "2"},
               "0.1.2.7": {"I": "3"}, "0.1.3": {"I": "4"}}
    trees.start("c1", _exec_tree(targets))
    down = {dst: (src, msg) for dst, src, msg in node.sent if msg["op"] == "exec_tree"}
    assert sorted(down) == ["0.1.1", "0.1.2"]
    assert all(src == "c1" for src, _ in down.values())     # the client's job, as a lone exec
    assert down["0.1.1"][1]["targets"] == {"0.1.1": {"I": "1"}, "0.1.1.4": {"I": "2"}}
    assert down["0.1.2"][1]["targets"] == {"0.1.2.7": {"I": "3"}}
    # Our own share: the common environment and what the head added for us.
    (requester, own), = node.jobs.started
    assert requester == "c1" and own["env"] == {"A": "1", "I": "0"}
    # 0.1.3 has no link here: it is answered for, but only with the rest.
    assert not [m for _, _, m in node.sent if m["op"] == "exec_report"]
    assert trees.intercept("c1", _exit(0))
    trees.report("0.1.1", _report([{"status": 0, "error": "", "nodes": ["0.1.1", "0.1.1.4"]}]))
    assert not [m for _, _, m in node.sent if m["op"] == "exec_report"]
    # A child speaks only for its own subtree: 0.1.1 is dropped from 0.1.2's report.
    trees.report("0.1.2", _report([{"status": 2, "error": "", "nodes": ["0.1.2.7", "0.1.1"]}]))
    (dst, src, rep), = [x for x in node.sent if x[2]["op"] == "exec_report"]
    assert (dst, src, rep["final"], rep["client"]) == ("0", "0.1", True, "c1")
    groups = {(g["status"], g["error"]): sorted(g["nodes"]) for g in rep["groups"]}
    assert groups == {(0, ""): ["0.1", "0.1.1", "0.1.1.4"], (2, ""): ["0.1.2.7"],
                      (255, "not reachable from n0.1"): ["0.1.3"]}
    assert trees.shares == {}


def test_a_lost_child_ends_its_part_and_the_others_still_report():
    node = _Node("0.2", ["0.2.1", "0.2.2"])
    trees = TreeJobs(node)
    trees.start("c1", _exec_tree({"0.2.1": {}, "0.2.2": {}, "0.2.2.1": {}}))
    assert node.jobs.started == []          # not a target itself: it only passes the job on
    trees.report("0.2.2", _report([{"status": 0, "error": "", "nodes": ["0.2.2", "0.2.2.1"]}]))
    trees.child_lost("0.2.1")               # the head answers for 0.2.1 (it heard `lost` first)
    (_, _, rep), = [x for x in node.sent if x[2]["op"] == "exec_report"]
    assert rep["groups"] == [{"status": 0, "error": "", "nodes": ["0.2.2", "0.2.2.1"]}]


def test_a_job_that_cannot_start_reports_once():
    node = _Node("0.3", [])
    trees = TreeJobs(node)

    def fails(requester: str, msg: dict) -> None:
        assert trees.intercept(requester, _exit(127, "start: no such file"))
    node.jobs.start = fails
    trees.start("c1", _exec_tree({"0.3": {}}))
    reports = [m for _, _, m in node.sent if m["op"] == "exec_report"]
    assert len(reports) == 1 and reports[0]["groups"][0]["status"] == 127


def test_folded_output_is_held_and_too_much_of_it_streams():
    node = _Node("0.4", ["0.4.1"])
    trees = TreeJobs(node)
    trees.start("c1", _exec_tree({"0.4": {}, "0.4.1": {}}, fold=True))
    out = {"op": "out", "job": 5, "fd": 1, "data": b"x" * 1000}
    assert trees.intercept("c1", out)         # held, not sent
    assert not [m for _, _, m in node.sent if m["op"] == "out"]
    assert trees.intercept("c1", _exit(0))
    trees.report("0.4.1", _report([{"status": 0, "error": "", "nodes": ["0.4.1"], "out": b"x" * 1000}]))
    (_, _, rep), = [x for x in node.sent if x[2]["op"] == "exec_report"]
    assert rep["groups"] == [{"status": 0, "error": "", "nodes": ["0.4", "0.4.1"], "out": b"x" * 1000}]

    node = _Node("0.5", [])
    trees = TreeJobs(node)
    trees.start("c1", _exec_tree({"0.5": {}}, fold=True))
    big = dict(out, data=b"y" * (tree_exec.FOLD_MAX + 1))
    assert trees.intercept("c1", big)         # past FOLD_MAX: what was held goes now
    assert trees.intercept("c1", dict(out, data=b"z")) is False     # and the rest streams
    assert trees.intercept("c1", _exit(0))
    streamed = [(dst, m) for dst, _, m in node.sent if m["op"] == "out"]
    assert streamed == [("c1", dict(big, fd=1))]
    (_, _, rep), = [x for x in node.sent if x[2]["op"] == "exec_report"]
    assert "out" not in rep["groups"][0]     # the client has it already


def test_a_report_goes_up_early_when_it_folds_too_much():
    node = _Node("0.6", ["0.6.1", "0.6.2"])
    trees = TreeJobs(node)
    trees.start("c1", _exec_tree({"0.6.1": {}, "0.6.2": {}}, fold=True))
    blob = b"a" * (tree_exec.REPORT_MAX + 1)
    trees.report("0.6.1", _report([{"status": 0, "error": "", "nodes": ["0.6.1"], "out": blob}]))
    (_, _, early), = [x for x in node.sent if x[2]["op"] == "exec_report"]
    assert early["final"] is False and early["groups"][0]["nodes"] == ["0.6.1"]
    trees.report("0.6.2", _report([{"status": 1, "error": "", "nodes": ["0.6.2"], "out": b"b"}]))
    last = [x[2] for x in node.sent if x[2]["op"] == "exec_report"][-1]
    assert last["final"] is True and last["groups"][0]["nodes"] == ["0.6.2"]


def test_the_children_have_their_share_before_our_own_command_starts():
    # A spawn holds the node until the shell has exec'd: under many spawns at
    # once every level below would wait for it if the frames went at the end
    # of the round (issue 27).
    node = _Node("0.1", ["0.1.1", "0.1.2"])
    TreeJobs(node).start("c1", _exec_tree({"0.1": {}, "0.1.1": {}, "0.1.2.3": {}}))
    assert node.events == ["push 0.1.1", "push 0.1.2", "start"]
