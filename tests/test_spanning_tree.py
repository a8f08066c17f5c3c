from gxpstyle import hostpattern, spanning_tree
from gxpstyle.use_rules import make_rule


def head():
    return spanning_tree.PlanNode("id:0", ["head", "vm"], 0, 0, 8)


def test_two_level_tree_through_gateways():
    rules = [make_rule("ssh", "head", "tb[[01-02]]"),
             make_rule("ssh", "tb01", "tb[[03-09]]"),
             make_rule("ssh", "tb02", "tb[[10-16]]")]
    targets = hostpattern.expand("tb[[01-16]]")
    plan = spanning_tree.plan([head()], targets, rules, lambda t, r: 8)
    assert not plan.unreachable
    parent = {a.target: a.parent for a in plan.assignments}
    assert parent["tb01"] == parent["tb02"] == "id:0"
    assert all(parent["tb%02d" % i] == "t:tb01" for i in range(3, 10))
    assert all(parent["tb%02d" % i] == "t:tb02" for i in range(10, 17))
    # Parents are planned before their children.
    order = [a.target for a in plan.assignments]
    assert order.index("tb01") < order.index("tb03")


def test_fanout_spills_to_the_next_level_when_rules_allow():
    rules = [make_rule("ssh", "head", "n[[01-20]]"), make_rule("ssh", "n*", "n[[01-20]]")]
    plan = spanning_tree.plan([head()], hostpattern.expand("n[[01-20]]"), rules, lambda t, r: 4)
    children = {}
    for a in plan.assignments:
        children.setdefault(a.parent, []).append(a.target)
    assert len(children["id:0"]) == 8
    assert max(len(v) for v in children.values()) <= 8
    assert max(a.depth for a in plan.assignments) == 2


def test_fanout_is_exceeded_only_when_no_one_else_can_reach():
    rules = [make_rule("ssh", "head", "n[[01-12]]")]
    plan = spanning_tree.plan([head()], hostpattern.expand("n[[01-12]]"), rules, lambda t, r: 8)
    assert all(a.parent == "id:0" for a in plan.assignments)
    assert len(plan.assignments) == 12


def test_unreachable_targets_are_named():
    rules = [make_rule("ssh", "head", "a[[1-2]]")]
    plan = spanning_tree.plan([head()], ["a1", "b1"], rules, lambda t, r: 8)
    assert [a.target for a in plan.assignments] == ["a1"]
    assert "b1" in plan.unreachable and "no use rule" in plan.unreachable["b1"]


def test_target_reachable_only_from_a_later_target():
    rules = [make_rule("ssh", "gw", "leaf"), make_rule("ssh", "head", "gw")]
    plan = spanning_tree.plan([head()], ["leaf", "gw"], rules, lambda t, r: 8)
    parent = {a.target: a.parent for a in plan.assignments}
    assert parent == {"gw": "id:0", "leaf": "t:gw"}


def test_last_matching_rule_wins():
    rules = [make_rule("ssh", "head", "x*"), make_rule("rsh", "head", "x1")]
    plan = spanning_tree.plan([head()], ["x1", "x2"], rules, lambda t, r: 8)
    by = {a.target: a.rule.channel for a in plan.assignments}
    assert by == {"x1": "rsh", "x2": "ssh"}
