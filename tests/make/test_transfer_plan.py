"""The planner of `gxpc make`'s transfers (make_backend/head/transfer_plan.py) against a
head that records what it is asked: pushes of one file go together, pulls take
the holders in random (or fixed) order, a node receives one transfer at a time,
a recipe starts only once its copies are adopted, and --pull-threshold parses
sizes in the user's words."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from gxpstyle.api.interfaces import STAGE_MIN_BYTES
from gxpstyle.head.daemon import NodeInfo
from gxpstyle.replicas.catalog import ReplicaCatalog
from make_backend.command.make_command import MakeUsage, parse_size
from make_backend.head.transfer_plan import BATCH_DELAY, INF, SMALL_AT_ONCE, TransferPlanner

MIB = 1 << 20
SMALL = 100 << 10     # pulled (under the pull threshold, above STAGE_MIN_BYTES)


class FakeHead:
    def __init__(self, n: int = 6) -> None:
        self.catalog = ReplicaCatalog()
        self.tree = {"0.%d" % i: NodeInfo("0.%d" % i, "h%d" % i, "0", "ssh", "host%d" % i)
                     for i in range(1, n + 1)}
        self.timers: list = []
        self.delays: list = []       # each timer's delay
        self.started: list = []      # (sources, path, targets, on_done, dests)
        self.bcast = SimpleNamespace(start=self._start, join=self._join)
        self.adopted: list = []
        self.logs: list = []
        self.transfers: list = []
        self.pins: list = []
        self.hold_pins = False
        self.held: list = []
        self.sites: dict = {}        # node id -> its site's gateway (none: no sites)

    def _start(self, sources, path, targets, dest, on_done, dests=None):
        self.started.append((list(sources), path, list(targets), on_done, dict(dests or {})))
        self.transfers.append(SimpleNamespace(path=path, finished=False, index=len(self.started) - 1))
        return self.transfers[-1]

    def _join(self, t, node, dest):
        self.started[t.index][2].append(node)
        self.started[t.index][4][node] = dest
        return True

    # HeadAPI
    def node(self, nid):
        return self.tree.get(nid)

    def is_up(self, nid):
        return nid in self.tree and self.tree[nid].up

    def name_of(self, nid):
        return self.tree[nid].name if nid in self.tree else nid

    def site_of(self, nid):
        return self.sites.get(nid)

    def call_later(self, delay, fn):
        self.timers.append(fn)
        self.delays.append(delay)
        return len(self.timers)

    def log(self, text):
        self.logs.append(text)

    # ReplicaAPI
    def replicas(self, path):
        return self.catalog.replicas(path)

    def holders(self, path):
        return self.catalog.holders(path)

    def add(self, path, node, size, mtime, digest=None):
        return self.catalog.add(path, node, size, mtime, digest)

    def replica_dir(self, node, path):
        return "/store/" + node if path.startswith("/mnt/") else None

    def adopt(self, node, path, file, source, done):
        self.adopted.append((node, path, file))
        done(True, "", node)

    def pin(self, node, paths, pin, done):
        self.pins.append((node, tuple(paths), pin))
        if self.hold_pins and pin:
            self.held.append(done)
            return
        done()

    def fire(self) -> None:
        timers, self.timers = self.timers, []
        for fn in timers:
            fn()

    def finish(self, i: int, failed=None) -> None:
        sources, path, targets, on_done, dests = self.started[i]
        t = self.transfers[i]
        t.finished, t.error, t.primary = True, "", sources[0]
        t.failed = lambda: dict(failed or {})
        t.dests = {n: d.replace("{sha256}", "ab") for n, d in dests.items()}
        on_done(t)


def _planner(head, client="c", **opts):
    p = TransferPlanner(head, head, head.bcast, random.Random(7))
    p.configure(client, opts)
    return p


def test_one_push_for_every_node_needing_a_big_file_then_the_recipes_start():
    head = FakeHead()
    head.catalog.add("/mnt/ref", "0.1", 10 * MIB, 1.0)
    p = _planner(head, pull_threshold=MIB)
    ran = []
    for i, node in enumerate(["0.2", "0.3", "0.4"]):
        p.stage(("c", i), node, ["/mnt/ref", "/mnt/out%d" % i], lambda i=i: ran.append(i))
    assert ran == [] and head.started == []       # held for the batch delay
    head.fire()
    assert len(head.started) == 1
    sources, path, targets, _, dests = head.started[0]
    assert (sources, path, sorted(targets)) == (["0.1"], "/mnt/ref", ["0.2", "0.3", "0.4"])
    assert all(dests[t].startswith("/store/%s/.tmp-xfer-" % t) for t in targets)
    assert ran == []                               # not before the copy is in place
    head.finish(0)
    assert sorted(ran) == [0, 1, 2]
    assert sorted(head.catalog.holders("/mnt/ref")) == ["0.1", "0.2", "0.3", "0.4"]
    assert p.stat()["bytes_pushed"] == 30 * MIB


def test_a_pull_goes_at_once_a_push_waits_for_the_nodes_needing_its_file():
    """Only a push gathers nodes (BATCH_DELAY); a pull waited for nothing."""
    head = FakeHead()
    head.catalog.add("/mnt/small", "0.1", SMALL, 1.0)
    head.catalog.add("/mnt/ref", "0.1", 10 * MIB, 1.0)
    p = _planner(head, pull_threshold=MIB)
    p.stage(("c", 0), "0.2", ["/mnt/small"], lambda: None)
    assert head.delays == [0.0]
    head.fire()
    assert [s[1] for s in head.started] == ["/mnt/small"]
    p.stage(("c", 1), "0.3", ["/mnt/ref"], lambda: None)
    assert head.delays == [0.0, BATCH_DELAY]


def test_a_holder_in_the_targets_site_feeds_it_rather_than_one_across_the_wan():
    # issue 28: 0.1 is at home, 0.2..0.4 are one site; once 0.2 holds the
    # file, the site's next transfers come from it, pushes and pulls alike
    head = FakeHead()
    head.sites = {"0.2": "0.2", "0.3": "0.2", "0.4": "0.2"}
    head.catalog.add("/mnt/ref", "0.1", 10 * MIB, 1.0)
    head.catalog.add("/mnt/ref", "0.2", 10 * MIB, 1.0)
    head.catalog.add("/mnt/small", "0.1", SMALL, 1.0)
    head.catalog.add("/mnt/small", "0.2", SMALL, 1.0)
    p = _planner(head, pull_threshold=MIB, pull_order="fixed")
    p.stage(("c", 1), "0.3", ["/mnt/ref", "/mnt/small"], lambda: None)
    head.fire()
    head.finish(0)          # a node receives one transfer at a time
    head.fire()
    assert [s[0][0] for s in head.started] == ["0.2", "0.2"]
    # at home, no site is preferred: the fewest transfers, then the id
    p.stage(("c", 2), "0.5", ["/mnt/ref"], lambda: None)
    head.fire()
    assert head.started[-1][0][0] == "0.1"


def test_a_node_needing_a_file_being_pushed_joins_that_push():
    head = FakeHead()
    head.catalog.add("/mnt/ref", "0.1", 10 * MIB, 1.0)
    p = _planner(head)
    ran = []
    p.stage(("c", 1), "0.2", ["/mnt/ref"], lambda: ran.append(1))
    head.fire()
    p.stage(("c", 2), "0.3", ["/mnt/ref"], lambda: ran.append(2))
    head.fire()
    assert len(head.started) == 1 and head.started[0][2] == ["0.2", "0.3"]
    head.finish(0)
    assert ran == [1, 2] and sorted(head.catalog.holders("/mnt/ref")) == ["0.1", "0.2", "0.3"]
    p.stage(("c", 3), "0.4", ["/mnt/ref"], lambda: ran.append(3))
    head.fire()
    assert len(head.started) == 2            # that push is over: a new one


def test_small_files_are_pulled_from_holders_in_random_or_fixed_order():
    head = FakeHead()
    for n in ("0.1", "0.2", "0.3", "0.4"):
        head.catalog.add("/mnt/s", n, SMALL, 1.0)
    p = _planner(head)
    for i in range(8):
        p.stage(("c", i), "0.5" if i % 2 else "0.6", ["/mnt/s"], lambda: None)
    head.fire()
    # one pull per node (the second recipe on a node waits for the same copy)
    assert sorted(t for s in head.started for t in s[2]) == ["0.5", "0.6"]
    orders = [s[0] for s in head.started]
    assert all(len(o) == 2 and set(o) <= {"0.1", "0.2", "0.3", "0.4"} for o in orders)
    for client in ("c", "f"):
        head = FakeHead(n=24)
        p = _planner(head, client=client, pull_order="fixed" if client == "f" else "random")
        for i in range(20):
            for n in ("0.1", "0.2", "0.3"):
                head.catalog.add("/mnt/r%d" % i, n, SMALL, 1.0)
            p.stage((client, i), "0.%d" % (4 + i), ["/mnt/r%d" % i], lambda: None)
        head.fire()
        firsts = {s[0][0] for s in head.started}
        assert len(head.started) == 20
        # random: the first holder differs between pulls; fixed: always the lowest id
        assert firsts == {"0.1"} if client == "f" else len(firsts) > 1, firsts


def test_a_node_receives_one_transfer_at_a_time_by_default():
    head = FakeHead()
    head.catalog.add("/mnt/a", "0.1", 512 << 10, 1.0)
    head.catalog.add("/mnt/b", "0.2", 512 << 10, 1.0)
    p = _planner(head)
    ran = []
    p.stage(("c", 1), "0.3", ["/mnt/a", "/mnt/b"], lambda: ran.append(1))
    head.fire()
    assert [s[1] for s in head.started] == ["/mnt/a"]
    head.finish(0)
    head.fire()
    assert [s[1] for s in head.started] == ["/mnt/a", "/mnt/b"] and ran == []
    head.finish(1)
    assert ran == [1]
    p2 = _planner(FakeHead(), transfer_slots=2)
    p2.head.catalog.add("/mnt/a", "0.1", 512 << 10, 1.0)
    p2.head.catalog.add("/mnt/b", "0.2", 512 << 10, 1.0)
    p2.stage(("c", 1), "0.3", ["/mnt/a", "/mnt/b"], lambda: None)
    p2.head.fire()
    assert len(p2.head.started) == 2


def test_small_files_take_no_slot_and_come_together():
    # issue 28: a merge's 15 small inputs, pulled one at a time across the WAN
    head = FakeHead(n=24)
    head.catalog.add("/mnt/big", "0.1", 512 << 10, 1.0)
    paths = ["/mnt/big"]
    for i in range(20):
        head.catalog.add("/mnt/out%d" % i, "0.%d" % (2 + i), SMALL, 1.0)
        paths.append("/mnt/out%d" % i)
    p = _planner(head)
    ran = []
    p.stage(("c", 1), "0.23", paths, lambda: ran.append(1))
    head.fire()
    # the big one takes the slot; 16 small ones run beside it, the rest wait
    assert len(head.started) == 1 + SMALL_AT_ONCE
    for i in range(len(head.started)):
        head.finish(i)
    head.fire()
    assert len(head.started) == len(paths) and ran == []
    for i in range(1 + SMALL_AT_ONCE, len(paths)):
        head.finish(i)
    assert ran == [1]


def test_nothing_to_copy_starts_at_once_and_a_failure_still_starts_the_recipe():
    head = FakeHead()
    head.catalog.add("/mnt/here", "0.1", 10 * MIB, 1.0)
    head.tree["0.7"] = NodeInfo("0.7", "h7", "0", "ssh", "host1")   # another agent on host1
    head.catalog.add("/other/x", "0.2", 10 * MIB, 1.0)               # not in a mount
    p = _planner(head)
    ran = []
    p.stage(("c", 1), "0.7", ["/mnt/here", "/other/x", "/mnt/unknown"], lambda: ran.append(1))
    assert ran == [1] and head.timers == []
    head.catalog.add("/mnt/f", "0.1", 10 * MIB, 1.0)
    p.stage(("c", 2), "0.3", ["/mnt/f"], lambda: ran.append(2))
    head.fire()
    head.finish(0, failed={"0.3": "No space left on device (ENOSPC)"})
    assert ran == [1, 2] and "ENOSPC" in head.logs[-1]
    assert head.catalog.holders("/mnt/f") == ["0.1"]


def test_an_input_under_stage_min_is_left_to_the_mount():
    # issue 26: a 31 KB header copied before each recipe cost it 30-200 ms
    # (a batching delay, a verified write, an adoption); read through the
    # mount it costs one request to one holder
    head = FakeHead()
    head.catalog.add("/mnt/h", "0.1", STAGE_MIN_BYTES - 1, 1.0)
    head.catalog.add("/mnt/big", "0.1", STAGE_MIN_BYTES, 1.0)
    p = _planner(head)
    ran = []
    p.stage(("c", 1), "0.3", ["/mnt/h"], lambda: ran.append(1))
    assert ran == [1] and head.timers == []
    p.stage(("c", 2), "0.3", ["/mnt/h", "/mnt/big"], lambda: ran.append(2))
    head.fire()
    assert [s[1] for s in head.started] == ["/mnt/big"]


def test_a_closed_client_never_starts_its_held_recipes():
    head = FakeHead()
    head.catalog.add("/mnt/f", "0.1", 10 * MIB, 1.0)
    p = _planner(head)
    ran = []
    p.stage(("c", 1), "0.3", ["/mnt/f"], lambda: ran.append(1))
    assert p.client_closed("c") == [("c", 1)]
    head.fire()
    assert head.started == [] and ran == []


@pytest.mark.parametrize("text,want", [("0", 0), ("inf", INF), ("INF", INF), ("64K", 64 << 10),
                                       ("1.5M", 3 << 19), ("128MiB", 128 * MIB), ("2G", 2 << 30),
                                       ("100", 100), ("1mb", MIB)])
def test_sizes_in_the_users_words(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text,words", [("abc", "a size such as"), ("-1", "0 or more"),
                                        ("nan", "a size such as"),
                                        ("1e30", "say inf")])
def test_bad_sizes_get_one_line(text, words):
    with pytest.raises(MakeUsage) as e:
        parse_size(text)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_recipes_inputs_are_pinned_before_it_starts_and_unpinned_when_it_ends():
    head = FakeHead()
    head.catalog.add("/mnt/ref", "0.1", 10 * MIB, 1.0)
    head.hold_pins = True
    p = _planner(head)
    ran = []
    p.stage(("c", 1), "0.2", ["/mnt/ref", "/mnt/out"], lambda: ran.append(1))
    assert head.pins == [("0.2", ("/mnt/ref", "/mnt/out"), True)]
    head.fire()
    head.finish(0)
    assert ran == []                      # the copy is in, the pin not yet answered
    head.held.pop()()
    assert ran == [1]
    p.release(("c", 1))
    p.release(("c", 1))                   # once only
    assert head.pins[1:] == [("0.2", ("/mnt/ref", "/mnt/out"), False)]
    # a recipe that never starts (its make went away) is unpinned too
    p.stage(("c", 2), "0.3", ["/mnt/x"], lambda: ran.append(2))
    assert p.client_closed("c") == [("c", 2)]
    assert head.pins[-1] == ("0.3", ("/mnt/x",), False)
    head.held.pop()()
    assert ran == [1]


def test_home_options_in_the_users_words(tmp_path):
    from make_backend.command.make_command import split_own_options
    assert split_own_options(["--home", "-j4"]).home == ""
    assert split_own_options(["--home=%s" % tmp_path]).home == str(tmp_path)
    assert split_own_options(["--", "--home"]).home is None     # make's, after --
    assert split_own_options(["--no-home"]).no_home and not split_own_options([]).no_home
    for args, words in ((["--home="], "--home= needs a directory"),
                        (["--home=/nonexistent-gxp-home"], "--home=/nonexistent-gxp-home: no such directory"),
                        (["--home", "--no-home"], "--home and --no-home exclude each other")):
        with pytest.raises(MakeUsage) as e:
            split_own_options(args)
        assert str(e.value).startswith(words), str(e.value)
