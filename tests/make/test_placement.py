"""Placement (make_backend/head/placement.py): input bytes against load, delay
scheduling, GXP_ON / GXP_PLACE / GXP_SLOTS, and the WOSS directory hints."""
from __future__ import annotations

from make_backend.head.placement import Hints, NodeView, Placement

K = 1024
MB = 1 << 20


def test_small_inputs_go_by_load():
    p = Placement()
    d = p.decide(nodes({3: 1}), {"tb03": 1000}, 1000, Hints(), 0.0, 0.0, {})
    assert d.why == "load" and d.node != "0.3"


def nodes(used=None, slots=2):
    used = used or {}
    return [NodeView("0.%d" % i, ["tb0%d" % i, "tb0%d" % i], "tb0%d" % i, slots, used.get(i, 0))
            for i in range(1, 5)]


def test_no_bytes_known_is_load_balance():
    p = Placement()
    d = p.decide(nodes({1: 2, 2: 1, 3: 1}), {}, 0, Hints(), 0.0, 0.0, {})
    assert d.node == "0.4" and d.why == "load"


def test_the_holder_of_the_most_bytes_wins_over_load():
    p = Placement()
    d = p.decide(nodes({3: 1}), {"tb03": 900 * K, "tb01": 100 * K}, 1000 * K, Hints(), 0.0, 0.0, {})
    assert (d.node, d.local, d.fetch) == ("0.3", 900 * K, 100 * K)
    assert "%d of %d input bytes local" % (900 * K, 1000 * K) in d.why


def test_soft_waits_for_the_holder_then_runs_elsewhere():
    p = Placement(fixed_delay=3.0)
    busy = nodes({3: 2})
    d = p.decide(busy, {"tb03": 900 * K, "tb01": 100 * K}, 1000 * K, Hints(), 10.0, 11.0, {})
    assert d.node is None and d.retry_at == 13.0
    d = p.decide(busy, {"tb03": 900 * K, "tb01": 100 * K}, 1000 * K, Hints(), 10.0, 13.5, {})
    assert d.node == "0.1" and d.fetch == 900 * K      # the next best holder among free nodes


def test_hard_waits_however_long():
    p = Placement(fixed_delay=3.0)
    d = p.decide(nodes({3: 2}), {"tb03": 900 * K}, 900 * K, Hints(place="hard"), 0.0, 1e6, {})
    assert d.node is None and "GXP_PLACE=hard" in d.why
    d = p.decide(nodes({3: 2}), {"tb03": 900 * K}, 900 * K, Hints(dp="local"), 0.0, 1e6, {})
    assert d.node is None


def test_gxp_on_restricts_and_soft_prefers():
    p = Placement(fixed_delay=1.0)
    d = p.decide(nodes(), {"tb03": 900 * K}, 900 * K, Hints(on="tb02"), 0.0, 0.0, {})
    assert d.node == "0.2" and d.fetch == 900 * K
    d = p.decide(nodes(), {}, 0, Hints(on="tb[[01-02]]"), 0.0, 0.0, {})
    assert d.node in ("0.1", "0.2")
    d = p.decide(nodes(), {}, 0, Hints(on="m1"), 0.0, 0.0, {"m1": {"0.4"}})
    assert d.node == "0.4"
    # soft: preferred, but a busy tb02 gives way after the delay
    d = p.decide(nodes({2: 2}), {}, 0, Hints(on="tb02", place="soft"), 0.0, 2.0, {})
    assert d.node not in (None, "0.2")
    assert p.decide(nodes(), {}, 0, Hints(on="nosuch"), 0.0, 0.0, {}).error
    assert p.decide(nodes(), {}, 0, Hints(on="nosuch", place="soft"), 0.0, 0.0, {}).node
    assert p.decide(nodes(), {}, 0, Hints(on="[a-"), 0.0, 0.0, {}).error


def test_slots_and_collocation():
    p = Placement()
    d = p.decide(nodes({1: 1, 2: 1, 3: 1}), {}, 0, Hints(slots=2), 0.0, 0.0, {})
    assert d.node == "0.4"
    assert p.decide(nodes(), {}, 0, Hints(slots=3), 0.0, 0.0, {}).error
    first = p.decide(nodes({1: 1}), {}, 0, Hints(dp="collocation:g"), 0.0, 0.0, {}).node
    again = [p.decide(nodes(), {}, 0, Hints(dp="collocation:g"), 0.0, 0.0, {}).node for _ in range(3)]
    assert again == [first] * 3


def test_load_ignores_the_data():
    p = Placement()
    d = p.decide(nodes({3: 1}), {"tb03": 900 * K}, 900 * K, Hints(place="load"), 0.0, 0.0, {})
    assert d.why == "load" and d.node != "0.3" and d.fetch == 900 * K


def test_a_spill_goes_by_load_when_nobody_else_holds_much():
    p = Placement(fixed_delay=1.0)
    picks = {p.decide(nodes({3: 2}), {"tb03": 900 * K, "tb01": 10}, 900 * K, Hints(), 0.0, 5.0, {}).node
             for _ in range(6)}
    assert "0.3" not in picks and len(picks) >= 2


def test_the_soft_delay_follows_the_recipes_run_times():
    """Delay scheduling: DELAY until a recipe has ended, then a share of the
    median run time, within its bounds; a fixed delay stays fixed."""
    from make_backend.head import placement
    p = Placement()
    assert p.delay == placement.DELAY
    for s in (20.0, 21.0, 400.0, 19.0, 22.0):
        p.observe(s)
    assert p.delay == placement.DELAY_SHARE * 21.0
    busy = nodes({3: 2})
    held = {"tb03": 900 * MB}     # 72 s to fetch at 100 Mbit/s: the delay bounds the wait
    # a 10 s wait: too short for 20 s recipes to give up on tb03 ...
    assert p.decide(busy, held, 900 * MB, Hints(), 0.0, 10.0, {}).node is None
    # ... past half of one, it runs elsewhere
    d = p.decide(busy, held, 900 * MB, Hints(), 0.0, 10.6, {})
    assert d.node not in (None, "0.3") and "busy past 10.5s" in d.why
    for _ in range(placement.RUNS_KEPT):
        p.observe(0.01)
    assert p.delay == placement.DELAY_MIN
    # a stated preference (here GXP_ON soft) still waits DELAY for its node
    soft_on = Hints(on="tb03", place="soft")
    assert p.decide(busy, {}, 0, soft_on, 0.0, placement.DELAY - 0.1, {}).node is None
    assert p.decide(busy, {}, 0, soft_on, 0.0, placement.DELAY + 0.1, {}).node not in (None, "0.3")
    for _ in range(placement.RUNS_KEPT):
        p.observe(1e4)
    assert p.delay == placement.DELAY_MAX
    assert Placement(fixed_delay=3.0).delay == 3.0


def test_a_wait_lasts_no_longer_than_fetching_would():
    """Waiting for the data's node is bounded by the time the best free node
    would take to fetch what it lacks (at FETCH_RATE before any copy was
    measured): 3 MB next to a busy node waits 0.25 s at 100 Mbit/s, not half
    of a 20 s stage; 900 MB waits the delay."""
    from make_backend.head import placement
    p = Placement()
    for s in (20.0, 20.0, 20.0):
        p.observe(s)
    busy = nodes({3: 2})
    small = 3 * MB
    bound = small / placement.FETCH_RATE
    d = p.decide(busy, {"tb03": small}, small, Hints(), 0.0, 0.0, {})
    assert d.node is None and abs(d.retry_at - bound) < 1e-9, d
    assert p.decide(busy, {"tb03": small}, small, Hints(), 0.0, bound - 0.01, {}).node is None
    d = p.decide(busy, {"tb03": small}, small, Hints(), 0.0, bound + 0.01, {})
    assert d.node not in (None, "0.3") and d.fetch == small
    assert "fetching %d bytes is quicker" % small in d.why, d.why
    # what the best free node already holds is not fetched: tb01 holds 2 of 3 MB
    held = {"tb03": small, "tb01": 2 * MB}
    d = p.decide(busy, held, 5 * MB, Hints(), 0.0, 0.0, {})
    assert abs(d.retry_at - 3 * MB / placement.FETCH_RATE) < 1e-9, d
    # with every other node busy too there is nothing to fetch to: the delay
    everyone = nodes({1: 2, 2: 2, 3: 2, 4: 2})
    assert p.decide(everyone, {"tb03": small}, small, Hints(), 0.0, 0.0, {}).retry_at == p.delay
    # a fixed delay and a stated preference are not shortened
    fixed = Placement(fixed_delay=3.0)
    assert fixed.decide(busy, {"tb03": small}, small, Hints(), 0.0, 0.0, {}).retry_at == 3.0
    soft_on = Hints(on="tb03", place="soft")
    assert p.decide(busy, {}, 0, soft_on, 0.0, 1.0, {}).node is None


def test_the_fetch_rate_follows_measured_copies():
    from make_backend.head import placement
    p = Placement()
    assert p.fetch_rate == placement.FETCH_RATE
    p.observe_fetch(100, 1.0)                  # round trips, not the link: ignored
    p.observe_fetch(8 * MB, 0.0)
    assert p.fetch_rate == placement.FETCH_RATE
    for seconds in (0.1, 0.2, 0.1, 10.0, 0.1):  # one slow copy does not set the rate
        p.observe_fetch(10 * MB, seconds)
    assert p.fetch_rate == 100 * MB
    for _ in range(placement.RATES_KEPT):       # a link that got slower
        p.observe_fetch(MB, 1.0)
    assert p.fetch_rate == MB
    for s in (20.0, 20.0):
        p.observe(s)
    d = p.decide(nodes({3: 2}), {"tb03": 3 * MB}, 3 * MB, Hints(), 0.0, 0.0, {})
    assert abs(d.retry_at - 3.0) < 1e-9        # 3 MB at 1 MB/s: 3 s of the 10 s delay


def test_given_up_a_recipe_goes_by_load_unless_another_node_holds_most_of_it():
    """After the wait, a shared reference (100 KiB) copied to tb01 must not
    draw every recipe to tb01 (the pipeline's aligns packed onto the two
    nodes holding ref.fa): the least busy node takes it; a node holding
    most of the inputs (a second replica) still does."""
    p = Placement(fixed_delay=1.0)
    busy = nodes({3: 2, 1: 1})
    part, ref = 2800 * K, 100 * K
    picks = {p.decide(busy, {"tb03": part + ref, "tb01": ref}, part + ref, Hints(), 0.0, 2.0, {}).node
             for _ in range(6)}
    assert picks == {"0.2", "0.4"}
    d = p.decide(busy, {"tb03": part + ref, "tb01": part}, part + ref, Hints(), 0.0, 2.0, {})
    assert d.node == "0.1" and d.fetch == ref
    # among equally busy nodes, the one holding the most still wins
    d = p.decide(nodes({3: 2}), {"tb03": part + ref, "tb01": ref}, part + ref, Hints(), 0.0, 2.0, {})
    assert d.node == "0.1"
