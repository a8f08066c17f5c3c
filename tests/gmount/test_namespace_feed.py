"""The namespace copies of a GMount (issue 26), without a test bed: the head's
feed (sshfsmux/gmount/namespace_feed.py) lists directories from the catalog
once every export is in, sends each change only to the nodes holding its
directory (one call at a time per node, later changes held for the next),
and says a change is taken only once every earlier one is; a node's copy
(sshfsmux/fs/namespace_copy.py) waits for a listing only where it may."""
from __future__ import annotations

import stat
import time

from gxpstyle.replicas.catalog import ReplicaCatalog
from sshfsmux.fs.namespace_copy import NamespaceCopy
from sshfsmux.gmount import replica_trust
from sshfsmux.gmount.change_feed import UNSETTLED_MAX_AGE, ChangeFeed, ChangesWaiting
from sshfsmux.gmount.namespace_feed import NamespaceFeed

MP = "/mnt/gx"
REG, DIR = stat.S_IFREG | 0o644, stat.S_IFDIR | 0o755


class FakeHead:
    def __init__(self):
        self.calls = []         # (sid, call, args, done)
        self.ends = []

    def call_role(self, sid, call, args, done):
        self.calls.append((sid, call, args, done))

    def at_end(self, fn):
        self.ends.append(fn)

    def end_round(self):
        ends, self.ends = self.ends, []
        for fn in ends:
            fn()

    def log(self, text):
        pass


def feed_with_files():
    catalog = ReplicaCatalog()
    catalog.add(MP + "/src", "0.1", 4096, 1.0, None, DIR)
    catalog.add(MP + "/src", "0.2", 4096, 1.0, None, DIR)
    catalog.add(MP + "/src/a.c", "0.2", 10, 2.0, None, REG)
    catalog.add(MP + "/src/a.o", "0.3", 99, 3.0, None, REG)       # only in 0.3's replica store
    head = FakeHead()
    names = {"0.1": "n1", "0.2": "n2", "0.3": "n3"}
    feed = NamespaceFeed(head, catalog, lambda mp: (names, {("0.3", "src/a.o")}))
    feed.add_mount(MP)
    return head, catalog, feed


def test_listings_wait_for_the_scans_and_name_export_holders_only():
    head, catalog, feed = feed_with_files()
    feed.asked(MP, "s1", ["src"])
    assert head.calls == []
    feed.scanned(MP)
    (sid, call, args, _), = head.calls
    assert (sid, call) == ("s1", "listing")
    assert args["dirs"] == {"src": {"a.c": [["n2", 10, 2.0, REG]]}}
    feed.asked(MP, "s1", [""])
    assert head.calls[-1][2]["dirs"][""] == {"src": [["n1", 4096, 1.0, DIR], ["n2", 4096, 1.0, DIR]]}


def test_changes_go_to_the_holders_of_the_directory_and_done_waits_for_every_earlier_one():
    head, catalog, feed = feed_with_files()
    feed.scanned(MP)
    feed.asked(MP, "s1", ["src"])
    feed.asked(MP, "s2", [""])
    head.calls.clear()
    catalog.add(MP + "/src/b.c", "0.1", 5, 4.0, None, REG)
    feed.touched(MP, ["src/b.c"])
    head.end_round()
    (sid, call, args, answer_first), = head.calls
    assert (sid, call, args) == ("s1", "ns", {"dirs": {"src": {"b.c": [["n1", 5, 4.0, REG]]}}, "seq": 1,
                                      "taken": 0})
    # a recipe's output, changed while the first call is unanswered: held
    # for the node's next call, which goes when the first is answered; make
    # hears only once both are taken (and a recipe starts only then)
    catalog.remove(MP + "/src/a.c")
    catalog.add(MP + "/src/c.c", "0.2", 7, 5.0, None, REG)
    taken, started = [], []
    feed.touched(MP, ["src/a.c"], lambda: taken.append(1))
    head.end_round()
    feed.touched(MP, ["src/c.c"])
    head.end_round()
    feed.node_barrier(["s1"], lambda: started.append(1))
    assert len(head.calls) == 1
    answer_first(True, "", {})
    assert taken == [] and started == []
    # numbered per node: a node that sees a number skipped starts its copy over
    (sid, call, args, answer_second) = head.calls[-1]
    assert (sid, args) == ("s1", {"dirs": {"src": {"a.c": [], "c.c": [["n2", 7, 5.0, REG]]}},
                                  "seq": 2, "taken": 0})
    answer_second(True, "", {})
    assert taken == [1] and started == [1]
    feed.node_barrier(["s1"], lambda: started.append(2))
    assert started == [1, 2]           # nothing on its way: at once
    # nothing on its way: the next change goes at the end of its round
    catalog.add(MP + "/src/d.c", "0.2", 1, 6.0, None, REG)
    feed.touched(MP, ["src/d.c"])
    head.end_round()
    assert head.calls[-1][2] == {"dirs": {"src": {"d.c": [["n2", 1, 6.0, REG]]}}, "seq": 3,
                                  "taken": 0}


def test_a_caller_that_may_wait_gets_the_listing_others_do_not_wait():
    import threading
    asked, may, came = [], {"wait": True}, threading.Event()

    def fetch(keys):
        asked.append(keys)
        came.set()
    ns = NamespaceCopy(fetch, lambda: may["wait"], 30.0)
    got = []
    t = threading.Thread(target=lambda: got.append(ns.holders("/src/a.c")))
    t.start()
    assert came.wait(10)
    may["wait"] = False
    assert ns.holders("/src/b.c") is None        # the agent's own call: never waits
    ns.fill({"src": {"a.c": [["n2", 10, 2.0, REG]]}})
    t.join(10)
    assert not t.is_alive() and got == [(("n2", 10, 2.0, REG),)] and asked == [["src"]]
    # a fetch that fails ends the wait: the caller asks the branches
    def broken(keys):
        raise OSError("no head")
    assert NamespaceCopy(broken, lambda: True, 30.0).holders("/x/y") is None


class FeedOfOneMount(ChangeFeed):
    def __init__(self):
        self.changes_waiting = ChangesWaiting()


def test_a_mounts_own_change_outlives_an_older_word_of_the_head():
    """The head's word on a name this mount changed, written before the
    catalog took this mount's report of the change (other nodes' reports of
    their exports came first), leaves the copy as this mount made it: an
    `rm -rf` saw a directory it had just removed come back, not empty."""
    head, catalog, feed = feed_with_files()
    feed.scanned(MP)
    feed.asked(MP, "s1", ["src"])
    head.calls.clear()
    mount, copy = FeedOfOneMount(), NamespaceCopy(lambda keys: None)
    copy.fill({"src": {"a.c": [["n2", 10, 2.0, REG]], "b.c": [["n2", 1, 1.0, REG]]}})
    copy.set_holders("/src/a.c", "n2", None)           # removed through this mount
    mount.changes_waiting.paths.add("/src/a.c")
    older = {"src": {"a.c": [["n2", 10, 2.0, REG]], "b.c": [["n3", 1, 1.0, REG]]}}
    # not yet reported: kept; the rest of the word is taken
    assert copy.update(older, mount._unsettled(0)) == ["/src/b.c"]
    assert copy.holders("/src/a.c") == ()
    rels, seq = mount._take_pending()
    assert (rels, seq) == (["src/a.c"], 1)
    # reported, the head's word written before it took the report: kept
    assert copy.update(older, mount._unsettled(0)) == [] and copy.holders("/src/a.c") == ()
    # the head took it: each call says the last report taken
    feed.report_taken("s1", seq)
    for junk in (True, "2", None, 0):
        feed.report_taken("s1", junk)
    catalog.add(MP + "/src/c.c", "0.1", 5, 4.0, None, REG)
    feed.touched(MP, ["src/c.c"])
    head.end_round()
    assert head.calls[-1][2]["taken"] == 1
    # from then on the head's word stands (here: another node wrote it since)
    assert copy.update(older, mount._unsettled(1)) == ["/src/a.c"]
    assert mount.changes_waiting.unsettled == {}
    # a report never taken (lost with a link) stops counting after a bound
    mount.changes_waiting.unsettled["/src/b.c"] = (7, time.monotonic() - UNSETTLED_MAX_AGE - 1)
    assert mount._unsettled(0) == set()


class ToldBranch:
    def __init__(self, node, known=True):
        self.node, self.dropped = node, []
        self.known = (lambda rel: None) if known else None

    def drop_replicas(self, rels):
        self.dropped.extend(rels)


def test_a_change_the_head_announces_drops_the_replicas_of_every_holder_named():
    copy = NamespaceCopy(lambda keys: None)
    copy.fill({"src": {"a.c": [["n2", 10, 2.0, REG]], "b.c": [["n3", 1, 1.0, REG]]}})
    n2, n3, n4, untold = ToldBranch("n2"), ToldBranch("n3"), ToldBranch("n4"), ToldBranch("n5", False)
    branches = [n2, n3, n4, untold]
    # a.c now at n4 (was n2's), b.c's holders the same (a rewrite in one tick)
    replica_trust.drop_announced(branches, copy, {"src": {"a.c": [["n4", 11, 3.0, REG]],
                                                          "b.c": [["n3", 1, 1.0, REG]],
                                                          "bad": "x"}, "d": {"x": []}})
    assert (n2.dropped, n3.dropped, n4.dropped, untold.dropped) == (
        ["src/a.c"], ["src/b.c"], ["src/a.c"], [])
    assert replica_trust.known_file(lambda: copy, "n3")("src/b.c") == (1, 1.0)
    assert replica_trust.known_file(lambda: copy, "n2")("src/b.c") is None
    assert replica_trust.known_file(lambda: None, "n3")("src/b.c") is None


def test_a_nodes_copy_never_waits_and_drops_what_it_found_meanwhile():
    asked = []
    ns = NamespaceCopy(asked.append)
    assert ns.holders("/src/a.c") is None and asked == [["src"]]
    assert ns.holders("/src/b.c") is None and asked == [["src"]]    # asked once
    ns.looked_up("/src/b.c")
    found = ns.fill({"src": {"a.c": [["n2", 10, 2.0, REG]], "bad": [["n2"]]}})
    assert found == ["/src/b.c"]
    assert ns.holders("/src/a.c") == (("n2", 10, 2.0, REG),) and ns.holders("/src/bad") == ()
    assert ns.update({"src": {"a.c": [], "new": [["n1", 1, 5.0, REG]]}, "other": {"x": []}}) == [
        "/src/a.c", "/src/new"]
    assert ns.holders("/src/a.c") == () and ns.holders("/src/new")[0][0] == "n1"
    ns.set_holders("/src/new", "n3", ("n3", 1, 5.0, REG))
    assert [h[0] for h in ns.holders("/src/new")] == ["n1", "n3"]
    ns.forget_under(["/src"])
    assert ns.count() == 0 and ns.holders("/src/new") is None


def test_a_directory_made_here_is_answered_at_once_and_a_gap_starts_the_copy_over():
    asked = []
    copy = NamespaceCopy(asked.append)
    copy.made_dir("/d")
    assert asked == [["d"]]
    assert copy.holders("/d/x") == ()          # known empty: no wait, no peer asked
    # the head's listing: x appeared on n2 meanwhile; this lookup of it comes back
    # (the kernel may keep the miss: its entry is dropped)
    assert copy.fill({"d": {"x": [["n2", 1, 1.0, REG]]}}) == ["/d/x"]
    assert copy.holders("/d/x") == (("n2", 1, 1.0, REG),)
    # the same holders again (this mount's own change coming back): nothing to drop
    assert copy.update({"d": {"x": [["n2", 1, 1.0, REG]]}}) == []
    assert copy.update({"d": {"x": []}}) == ["/d/x"]
    # a gap in the head's calls: every listing goes, with the names to drop
    copy.update({"d": {"y": [["n3", 2, 2.0, REG]]}})
    assert sorted(copy.forget_all()) == ["/d", "/d/y"]
    assert copy.holders("/d/y") is None and asked[-1] == ["d"]


def test_below_a_directory_only_this_node_holds_nobody_else_holds_anything():
    # issue 26: the change feed reports the files of a tree this mount removed
    # after the removal dropped the tree's listings; it asked every peer
    asked = []
    copy = NamespaceCopy(asked.append)
    copy.fill({"": {"mine": [["n1", 0, 1.0, DIR]], "theirs": [["n2", 0, 1.0, DIR]],
                    "both": [["n1", 0, 1.0, DIR], ["n2", 0, 1.0, DIR]]}})
    assert copy.holders("/mine/a/f", own=["n1"]) == () and asked == []
    assert copy.holders("/gone/f", own=["n1"]) == () and asked == []
    assert copy.holders("/theirs/f", own=["n1"]) is None and asked == [["theirs"]]
    assert copy.holders("/both/f", own=["n1"]) is None and asked[-1] == ["both"]
    # without own nodes, or with no ancestor in the copy, the head is asked
    assert copy.holders("/mine/f") is None and asked[-1] == ["mine"]
    assert NamespaceCopy(asked.append).holders("/x/y", own=["n1"]) is None and asked[-1] == ["x"]


def test_a_recipe_start_sends_the_listings_of_its_directory_once():
    head, catalog, feed = feed_with_files()
    feed.scanned(MP)
    done = []
    feed.prefetch(MP, "s1", ["", "src"], lambda: done.append(1))
    (sid, call, args, answer), = head.calls
    assert (sid, call, sorted(args["dirs"])) == ("s1", "listing", ["", "src"])
    feed.prefetch(MP, "s1", ["", "src"], lambda: done.append(2))    # on its way: waits for it
    assert len(head.calls) == 1 and done == []
    answer(True, "", {})
    assert done == [1, 2]
    feed.prefetch(MP, "s1", ["", "src"], lambda: done.append(3))    # held: at once
    assert done == [1, 2, 3] and len(head.calls) == 1
    # the node subscribed: a change under src reaches it
    catalog.add(MP + "/src/e.c", "0.2", 1, 7.0, None, REG)
    feed.touched(MP, ["src/e.c"])
    head.end_round()
    assert head.calls[-1][:2] == ("s1", "ns")


def test_a_barrier_on_several_nodes_ends_once_each_has_answered():
    head, catalog, feed = feed_with_files()
    feed.scanned(MP)
    feed.asked(MP, "s1", ["src"])
    feed.asked(MP, "s2", ["src"])
    head.calls.clear()
    catalog.add(MP + "/src/f.c", "0.1", 3, 8.0, None, REG)
    feed.touched(MP, ["src/f.c"])
    head.end_round()
    answers = {sid: done for sid, call, _args, done in head.calls if call == "ns"}
    assert sorted(answers) == ["s1", "s2"]
    ended = []
    feed.node_barrier(["s1", "s2"], lambda: ended.append(1))
    answers["s1"](True, "", {})
    assert ended == []
    answers["s2"](True, "", {})
    assert ended == [1]


def test_a_recipes_input_it_did_not_change_is_not_announced():
    """A recipe's files include its inputs: the holder describes them all, but
    only those whose catalog entry changed are announced (what it wrote
    comes in its change feed, every name). An announced input made every
    node drop its replica of it: a pushed reference was read again from its
    holder by each recipe."""
    from types import SimpleNamespace

    from sshfsmux.gmount.recipe_changes import RecipeChanges
    catalog = ReplicaCatalog()
    catalog.add("/mnt/w/ref.fa", "0.1", 100, 5.0, None, 0o100644)
    catalog.add("/mnt/w/ref.fa", "0.2", 100, 5.0, None, 0o100644)      # a pushed copy
    m = SimpleNamespace(mountpoint="/mnt", adopted={("0.2", "w/ref.fa")})
    self = SimpleNamespace(catalog=catalog)
    files = [["w/ref.fa", 100, 5.0, "", 0o100644], ["w/out", 7, 6.0, "", 0o100644]]
    assert RecipeChanges._record(self, m, "0.1", ["w/ref.fa", "w/out"], files) == ["w/out"]
    # the export's own file where its store held a copy: the listings name it now
    files = [["w/ref.fa", 100, 5.0, "", 0o100644]]
    assert RecipeChanges._record(self, m, "0.2", ["w/ref.fa"], files) == ["w/ref.fa"]
    assert m.adopted == set()


class FeedOfOneExport(ChangeFeed):
    """A node's change feed over a real export directory, its work done at once."""
    def __init__(self, export):
        class Cfg:
            pass
        self.cfg = Cfg()
        self.cfg.export = str(export)
        self.fs = None
        self.changes_waiting = ChangesWaiting()
        self.peer_work = self
        self.answers = []

    def put(self, work):
        work()

    def in_loop(self, fn, *args):
        fn(*args)

    def answer(self):
        """One answer of the feed to a waiting `changes` call."""
        self.changes_waiting.reply = lambda ok, err, result: self.answers.append(result)
        self._flush_changes()
        return self.answers.pop() if self.answers else None


def test_the_export_watchs_late_report_of_the_mounts_own_change_is_not_news(tmp_path):
    """A file this mount wrote into its export, reported by the export watch
    only after the mount's own report went, is not told again: told, the
    head announced it and every node dropped its pushed copy of it (the BWA
    workflow's reference streamed again by each recipe). A change made in
    the export behind the mount after it still is."""
    (tmp_path / "ref.fa").write_bytes(b"A" * 100)
    feed = FeedOfOneExport(tmp_path)
    feed._on_change("/ref.fa")                         # written through the mount
    first = feed.answer()
    assert first["gone"] == ["ref.fa"] and first["here"] == []   # fs None: the view has none
    feed._on_export_changes(["/ref.fa"])               # the watch's echo, late
    assert feed.answer()["here"] == []
    with open(tmp_path / "ref.fa", "ab") as f:         # behind the mount's back
        f.write(b"C")
    feed._on_export_changes(["/ref.fa"])
    (rel, size, _mtime, mode), = feed.answer()["here"]
    assert (rel, size, stat.S_ISREG(mode)) == ("ref.fa", 101, True)
    # a chmod behind the back (same size and mtime) is news too
    feed._on_change("/ref.fa")
    feed.answer()
    (tmp_path / "ref.fa").chmod(0o600)
    feed._on_export_changes(["/ref.fa"])
    assert [h[0] for h in feed.answer()["here"]] == ["ref.fa"]
    # kept a bounded time only
    feed.changes_waiting.own["ref.fa"] = ((0,), time.monotonic() - UNSETTLED_MAX_AGE - 1)
    feed._on_change("/other")
    assert "ref.fa" not in feed.changes_waiting.own
