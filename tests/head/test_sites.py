"""Sites derived from the tree and the `use` rules (gxpstyle/head/sites.py),
and which site proxy caches a file (sshfsmux/gmount/site_cache.py): a
gateway is a node whose child its own parent may not reach; a flat network
placed under other hosts for the fan-out has no sites; every reader of a site
picks the same proxy, and a proxy removed moves only its own files."""
from __future__ import annotations

from gxpstyle.config.use_rules import make_rule
from gxpstyle.head import sites
from gxpstyle.head.daemon import NodeInfo
from sshfsmux.gmount.site_cache import SiteProxies, direct_way, pick_proxy


def _tree(edges):
    """{id: NodeInfo} from (id, name, parent, role) tuples; the head is "0"."""
    tree = {"0": NodeInfo("0", "vm", None, "-", "vm")}
    for nid, name, parent, role in edges:
        tree[nid] = NodeInfo(nid, name, parent, "ssh", name, role=role)
    return tree


def _site_of(tree, rules):
    gates = sites.gateways(list(tree.values()), tree.get, rules)
    return {nid: sites.site_of(nid, tree.get, gates) for nid in tree}


def test_hosts_behind_a_gateway_are_its_site_and_a_flat_tree_has_none():
    tree = _tree([("0.1", "ga", "0", ""), ("0.1.1", "sa01", "0.1", ""),
                  ("0.1.1.1", "sa09", "0.1.1", ""), ("0.1.1.2", "gmount@sa01", "0.1.1", "gmount"),
                  ("0.2", "gb", "0", ""), ("0.2.1", "sb01", "0.2", ""), ("0.3", "tb01", "0", ""),
                  ("0.3.1", "tb02", "0.3", "")])
    rules = [make_rule("ssh", "head", "ga gb tb*"), make_rule("ssh", "ga", "sa*"),
             make_rule("ssh", "gb", "sb*"), make_rule("ssh", "tb*", "tb*")]
    got = _site_of(tree, rules)
    assert got == {"0": None, "0.1": "0.1", "0.1.1": "0.1", "0.1.1.1": "0.1", "0.1.1.2": "0.1",
                   "0.2": "0.2", "0.2.1": "0.2", "0.3": None, "0.3.1": None}
    # the head may reach every host: children of hosts are there for the fan-out
    flat = [make_rule("ssh", "head", "*"), make_rule("ssh", "*", "*")]
    assert set(_site_of(tree, flat).values()) == {None}


def test_every_reader_of_a_site_picks_the_same_proxy_and_a_removal_moves_only_its_files():
    names = ["gb", "sb01", "sb02", "sb03", "sb04"]
    files = ["f%d" % i for i in range(400)]
    before = {f: pick_proxy(names, "sa01", f) for f in files}
    assert set(before.values()) == set(names)              # spread over the proxies
    after = {f: pick_proxy([n for n in names if n != "sb02"], "sa01", f) for f in files}
    moved = {f for f in files if before[f] != after[f]}
    assert moved == {f for f in files if before[f] == "sb02"}
    # a mount reads another site's files through its site's proxies, its own
    # site's files itself; a mount in no site (the head) never proxies
    peers = [{"node": n, "site": "0.2"} for n in names if n != "sb01"]
    peers += [{"node": "sa01", "site": "0.1"}, {"node": "vm", "site": ""}]
    branches = {p["node"]: "branch:" + p["node"] for p in peers}
    proxies = SiteProxies("sb01", "0.2", peers, branches)
    for holder in ("sa01", "vm"):
        choose = proxies.chooser(holder)
        assert choose is not None
        for f in files[:50]:
            want = pick_proxy(names, holder, f)
            assert choose(f) == (None if want == "sb01" else "branch:" + want)
    assert proxies.chooser("sb02") is None
    assert SiteProxies("vm", "", peers, branches).chooser("sa01") is None


def test_a_mount_tries_a_direct_connection_only_where_one_can_exist():
    # issue 28: a site's hosts answer their gateway only; a try from outside
    # costs its failure (a timeout on a private address) before the tree
    assert direct_way("0.1.1", "0.1", "0.1.2", "0.1")            # inside one site
    assert direct_way("0.1", "0.1", "0.2", "0.2")                # gateway to gateway
    assert direct_way("0", "", "0.1", "0.1")                     # home to a gateway
    assert direct_way("0.3", "", "0.4", "")                      # a flat network
    assert not direct_way("0", "", "0.1.1", "0.1")               # home into a site
    assert not direct_way("0.1.1", "0.1", "0", "")               # a site's host out
    assert not direct_way("0.1.1", "0.1", "0.2", "0.2")          # to another gateway
    assert not direct_way("0.1", "0.1", "0.2.1", "0.2")          # into another site
