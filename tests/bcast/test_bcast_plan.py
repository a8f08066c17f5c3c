"""The broadcast's plan and its repairs, on the head alone (no nodes): who feeds
whom along the explored tree, and who feeds a receiver whose feeder was lost,
failed, or sent a bad chunk."""
from __future__ import annotations

from gxpstyle.bcast.service import BcastService
from gxpstyle.head.daemon import NodeInfo

TREE = ["0", "0.1", "0.2", "0.3", "0.1.1", "0.1.2", "0.2.1"]


class FakeHead:
    """The HeadAPI calls the engine makes, recorded: a node side's messages
    as ("bc_" + type) for the tests' take()."""

    def __init__(self):
        self.tree = {nid: NodeInfo(nid, "n" + nid.replace(".", "_"), None, "ssh") for nid in TREE}
        self.sent = []
        self.replies = []
        self.logs = []
        self.sites = {}             # node -> its site's gateway (none: a flat network)

    def send_node(self, dst, mtype, body):
        self.sent.append((dst, dict(body, op="bc_" + mtype)))

    def node(self, nid):
        return self.tree.get(nid)

    def is_up(self, nid):
        return nid in self.tree and self.tree[nid].up

    def name_of(self, nid):
        return self.tree[nid].name if nid in self.tree else nid

    def site_of(self, nid):
        return self.sites.get(nid)

    def call_later(self, delay, fn):
        return 0

    def log(self, text):
        self.logs.append(text)

    def take(self, op):
        out = [(d, m) for d, m in self.sent if m["op"] == op]
        self.sent = [(d, m) for d, m in self.sent if m["op"] != op]
        return out


def started(sources, targets, chain_len=0):
    """A transfer planned; chain_len 0 plans without chains inside sites (the
    tree alone), as the tests of the tree's repairs want."""
    head = FakeHead()
    svc = BcastService(head)
    svc.chain_len = chain_len
    done = []
    t = svc.start(sources, "/data/f", targets, "/scratch/f", done.append)
    assert sorted(d for d, _ in head.take("bc_open")) == sorted(sources)
    for s in sources:
        svc.on_opened(s, {"op": "bc_opened", "bc": t.id, "ok": True, "error": "", "size": 10 << 20,
                          "mode": 0o644, "sha256": "ab" * 32})
    return head, svc, t, done


def feeds(head):
    return {m["child"]: (d, m["start"]) for d, m in head.take("bc_feed")}


def test_the_plan_follows_the_tree_from_the_source_and_relays_through_the_head():
    head, svc, t, done = started(["0.1.1"], ["0.1.2", "0.2", "0.3"])
    assert feeds(head) == {"0.1": ("0.1.1", 0), "0.1.2": ("0.1", 0), "0": ("0.1", 0),
                           "0.2": ("0", 0), "0.3": ("0", 0)}
    plans = {d: m["dest"] for d, m in head.take("bc_plan")}
    assert plans == {"0.1": "", "0": "", "0.1.2": "/scratch/f", "0.2": "/scratch/f",
                     "0.3": "/scratch/f"}
    for nid in ("0.1.2", "0.2", "0.3"):
        svc.on_state(nid, {"op": "bc_state", "bc": t.id, "have": 40, "done": True, "error": "",
                           "bad": ""})
    assert done == [t] and t.failed() == {}
    assert {d for d, m in head.take("bc_stop")} == {"0", "0.1", "0.1.1", "0.1.2", "0.2", "0.3"}


def test_a_lost_source_is_replaced_by_its_replica_from_where_each_receiver_stands():
    head, svc, t, done = started(["0.1", "0.2"], ["0.2", "0.3"])
    assert feeds(head) == {"0": ("0.1", 0), "0.2": ("0.2", 0), "0.3": ("0", 0)}
    svc.on_state("0", {"op": "bc_state", "bc": t.id, "have": 17, "done": False, "error": "",
                       "bad": ""})
    head.tree["0.1"].state = "lost"
    svc.node_lost("0.1", "link closed")
    assert feeds(head) == {"0": ("0.2", 17)}          # the relay, from the replica
    assert done == []


def test_a_bad_chunk_is_fetched_from_another_holder():
    head, svc, t, done = started(["0"], ["0.1", "0.2", "0.3"])
    feeds(head)
    svc.on_state("0.2", {"op": "bc_state", "bc": t.id, "have": 9, "done": False, "error": "",
                         "bad": ""})
    svc.on_state("0.1", {"op": "bc_state", "bc": t.id, "have": 5, "done": False, "error": "",
                         "bad": "0"})
    assert feeds(head) == {"0.1": ("0.2", 5)}          # not the head, which sent it
    assert [(d, m["child"]) for d, m in head.take("bc_drop")] == [("0", "0.1")]


def test_a_failed_receiver_is_named_and_the_others_go_on():
    head, svc, t, done = started(["0"], ["0.1", "0.2"])
    feeds(head)
    svc.on_state("0.1", {"op": "bc_state", "bc": t.id, "have": 0, "done": False,
                         "error": "/scratch: No space left on device (ENOSPC)", "bad": ""})
    svc.on_state("0.2", {"op": "bc_state", "bc": t.id, "have": 40, "done": True, "error": "",
                         "bad": ""})
    assert done == [t] and t.failed() == {"0.1": "/scratch: No space left on device (ENOSPC)"}


def test_a_content_addressed_destination_is_named_by_the_files_hash():
    head = FakeHead()
    svc = BcastService(head)
    t = svc.start(["0"], "/data/f", ["0.1"], "/cache/{sha256}", lambda t: None)
    svc.on_opened("0", {"op": "bc_opened", "bc": t.id, "ok": True, "error": "", "size": 5,
                        "mode": 0o644, "sha256": "cd" * 32})
    assert [m["dest"] for _, m in head.take("bc_plan")] == ["/cache/" + "cd" * 32]


def test_no_source_at_all_fails_the_transfer_with_the_reason():
    head = FakeHead()
    svc = BcastService(head)
    done = []
    t = svc.start(["0.1"], "/nope", ["0.2"], "/scratch/f", done.append)
    svc.on_opened("0.1", {"op": "bc_opened", "bc": t.id, "ok": False,
                          "error": "/nope: No such file or directory (ENOENT)", "size": 0, "mode": 0,
                          "sha256": ""})
    assert done == [t] and t.error == "/nope: No such file or directory (ENOENT)"


def listening(svc, t, nid, port=4000, error=""):
    svc.on_listening(nid, {"op": "bc_listening", "bc": t.id, "port": 0 if error else port,
                           "addrs": [] if error else ["10.0.0.%s" % nid.split(".")[-1]],
                           "error": error})


def test_a_site_is_fed_as_a_chain_each_member_feeding_the_next_over_a_direct_link():
    head, svc, t, done = started(["0"], ["0.1", "0.2", "0.3"], chain_len=8)
    assert feeds(head) == {"0.1": ("0", 0)}           # the others wait until they listen
    listens = {d: m["listen"] for d, m in head.take("bc_plan")}
    assert listens == {"0.1": False, "0.2": True, "0.3": True}
    listening(svc, t, "0.3")
    listening(svc, t, "0.2")
    sent = {m["child"]: (d, m.get("port"), m.get("addrs")) for d, m in head.take("bc_feed")}
    assert sent == {"0.2": ("0.1", 4000, ["10.0.0.2"]), "0.3": ("0.2", 4000, ["10.0.0.3"])}


def test_a_large_site_gets_interleaved_chains():
    head, svc, t, done = started(["0"], ["0.1", "0.2", "0.3"], chain_len=2)
    for nid in ("0.2", "0.3"):
        listening(svc, t, nid)
    assert feeds(head) == {"0.1": ("0", 0), "0.2": ("0", 0), "0.3": ("0.1", 0)}


def test_a_member_that_cannot_listen_or_be_reached_is_fed_by_its_tree_parent():
    head, svc, t, done = started(["0"], ["0.1", "0.2", "0.3"], chain_len=8)
    feeds(head)
    listening(svc, t, "0.2", error="listener: Too many open files (EMFILE)")
    assert feeds(head) == {"0.2": ("0", 0)}
    listening(svc, t, "0.3")
    assert feeds(head) == {"0.3": ("0.2", 0)}
    svc.on_state("0.3", {"op": "bc_state", "bc": t.id, "have": 3, "done": False, "error": "",
                         "bad": ""})
    svc.on_nolink("0.2", {"op": "bc_nolink", "bc": t.id, "child": "0.3",
                          "error": "direct link to 10.0.0.3:4000: Connection refused"})
    sent = [(d, m["child"], m["start"], m.get("port")) for d, m in head.take("bc_feed")]
    assert sent == [("0", "0.3", 3, None)]            # along the tree, from where it stands
    assert any("Connection refused" in line for line in head.logs)


def test_a_middle_chain_member_lost_its_successor_is_fed_again_from_a_holder():
    head, svc, t, done = started(["0"], ["0.1", "0.2", "0.3"], chain_len=8)
    for nid in ("0.2", "0.3"):
        listening(svc, t, nid)
    feeds(head)
    svc.on_state("0.3", {"op": "bc_state", "bc": t.id, "have": 7, "done": False, "error": "",
                         "bad": ""})
    head.tree["0.2"].state = "lost"
    svc.node_lost("0.2", "link closed")
    assert feeds(head) == {"0.3": ("0", 7)}
    assert t.members["0.2"].error.startswith("node lost")


def test_a_chain_member_that_falls_behind_has_the_nodes_it_feeds_fed_by_another_holder():
    head, svc, t, done = started(["0"], ["0.1", "0.2", "0.3"], chain_len=8)
    for nid in ("0.2", "0.3"):
        listening(svc, t, nid)
    feeds(head)
    for nid, have in (("0.1", 30), ("0.2", 12), ("0.3", 12)):
        svc.on_state(nid, {"op": "bc_state", "bc": t.id, "have": have, "done": False, "error": "",
                           "bad": ""})
    svc._watch()
    assert feeds(head) == {}                            # nobody has been still for long
    t.members["0.2"].moved -= 60                        # 0.2 stopped; 0.1 holds more
    t.members["0.3"].moved -= 60                        # (0.3 waits for 0.2: not behind it)
    svc._watch()
    assert feeds(head) == {"0.3": ("0", 12)}
    assert [(d, m["child"]) for d, m in head.take("bc_drop")] == [("0.2", "0.3")]
    svc._watch()
    assert feeds(head) == {}                            # once, not every second


def test_a_chain_member_that_never_says_it_listens_is_fed_along_the_tree_and_so_is_the_next():
    head, svc, t, done = started(["0"], ["0.1", "0.2", "0.3"], chain_len=8)
    listening(svc, t, "0.3")                            # 0.2 is stopped: it never answers
    assert feeds(head) == {"0.1": ("0", 0), "0.3": ("0.2", 0)}
    svc._watch()
    assert feeds(head) == {}
    for nid in ("0.2", "0.3"):
        t.members[nid].moved -= 60
    svc._watch()
    assert feeds(head) == {"0.2": ("0", 0), "0.3": ("0", 0)}


def test_a_relay_behind_a_busy_wan_link_keeps_its_children():
    # issue 28: a gateway's relay waiting on its WAN link looked stalled, and
    # the node it fed was fed again from the head, through that same gateway:
    # the file crossed the WAN twice.
    head, svc, t, done = started(["0"], ["0.1.1", "0.1.2"], chain_len=8)
    head.sites = {"0.1": "0.1", "0.1.1": "0.1", "0.1.2": "0.1"}
    listening(svc, t, "0.1.2")
    assert feeds(head) == {"0.1": ("0", 0), "0.1.1": ("0.1", 0), "0.1.2": ("0.1.1", 0)}
    for nid, have in (("0.1", 5), ("0.1.1", 5), ("0.1.2", 5)):
        svc.on_state(nid, {"op": "bc_state", "bc": t.id, "have": have, "done": False, "error": "",
                           "bad": ""})
        t.members[nid].moved -= 60                      # the relay waits on the WAN
    svc._watch()
    assert feeds(head) == {} and head.take("bc_drop") == []


SITES = {"0.1": "0.1", "0.1.1": "0.1", "0.1.2": "0.1", "0.2": "0.2", "0.2.1": "0.2"}


def test_the_gateways_of_two_sites_fed_from_home_feed_each_other():
    # issue 28: home's WAN link carries the file once, not once per site
    head = FakeHead()
    head.sites = SITES
    svc = BcastService(head)
    t = svc.start(["0"], "/data/f", ["0.1.1", "0.2.1"], "/scratch/f", lambda t: None)
    svc.on_opened("0", {"op": "bc_opened", "bc": t.id, "ok": True, "error": "", "size": 10 << 20,
                        "mode": 0o644, "sha256": "ab" * 32})
    assert feeds(head) == {"0.1": ("0", 0), "0.1.1": ("0.1", 0), "0.2.1": ("0.2", 0)}
    assert {d: m["listen"] for d, m in head.take("bc_plan")}["0.2"] is True
    listening(svc, t, "0.2")
    sent = {m["child"]: (d, m.get("port")) for d, m in head.take("bc_feed")}
    assert sent == {"0.2": ("0.1", 4000)}                 # over a direct link between gateways
    svc.on_nolink("0.1", {"op": "bc_nolink", "bc": t.id, "child": "0.2",
                          "error": "direct link to 10.0.0.2:4000: timed out"})
    assert feeds(head) == {"0.2": ("0", 0)}               # they cannot: along the tree


def test_no_direct_link_into_a_site_from_outside_it():
    head, svc, t, done = started(["0"], ["0.1.1", "0.1.2"], chain_len=8)
    head.sites = SITES
    listening(svc, t, "0.1.2")
    feeds(head)
    svc.on_state("0.1.2", {"op": "bc_state", "bc": t.id, "have": 3, "done": False, "error": "",
                           "bad": "0.1.1"})
    sent = [(d, m["child"], m.get("port")) for d, m in head.take("bc_feed")]
    assert sent == [("0", "0.1.2", None)]                 # home feeds it, along the tree
