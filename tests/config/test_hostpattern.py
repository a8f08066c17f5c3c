"""Tests for gxpstyle.config.hostpattern: expansion, matching, folding, errors."""
from __future__ import annotations

import fnmatch
import itertools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gxpstyle.config import hostpattern
from gxpstyle.config.hostpattern import (
           MAX_EXPANSION,
           HostPattern,
           PatternError,
           compile_pattern,
           expand,
           fold,
           is_pattern,
           matches,
       )

FAST = settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


# ----------------------------------------------------------------------------- expand

@pytest.mark.parametrize(
    "pattern, names",
    [
        ("tb[[01-04,07]]", ["tb01", "tb02", "tb03", "tb04", "tb07"]),
        ("a[[1-2]]b[[1-2]]", ["a1b1", "a1b2", "a2b1", "a2b2"]),
        ("login1", ["login1"]),
        ("login1 tb[[1-2]]", ["login1", "tb1", "tb2"]),
        ("a,b , c\td\n", ["a", "b", "c", "d"]),
        (",a,,", ["a"]),
        ("x[[8-10]]", ["x8", "x9", "x10"]),
        ("x[[098-100]]", ["x098", "x099", "x100"]),
        ("x[[1-010]]", ["x%d" % i for i in range(1, 11)]),
        ("x[[007]]", ["x007"]),
        ("x[[3-3]]", ["x3"]),
        ("[[1-2]].example.org", ["1.example.org", "2.example.org"]),
        ("n[[1-3]]-ib[[0-1]]", ["n1-ib0", "n1-ib1", "n2-ib0", "n2-ib1", "n3-ib0", "n3-ib1"]),
        ("node_[[ 1-2, 4 ]]", ["node_1", "node_2", "node_4"]),
        ("Host.A-b_c", ["Host.A-b_c"]),
    ],
)
def test_expand_examples(pattern: str, names: list) -> None:
    assert expand(pattern) == names


def test_expand_zero_padding_from_low_bound() -> None:
    names = expand("n[[000-015]]")
    assert names == ["n%03d" % i for i in range(16)]


def test_expand_removes_duplicates_keeping_first() -> None:
    assert expand("b a b") == ["b", "a"]
    assert expand("n[[3-5,1-4]]") == ["n3", "n4", "n5", "n1", "n2"]
    assert expand("n[[1-2]] n1 n[[01-02]]") == ["n1", "n2", "n01", "n02"]


def test_expand_limit_is_inclusive() -> None:
    names = expand("n[[1-%d]]" % MAX_EXPANSION)
    assert len(names) == MAX_EXPANSION
    assert names[-1] == "n%d" % MAX_EXPANSION


@pytest.mark.parametrize(
    "pattern, member",
    [
        ("n[[1-%d]]" % (MAX_EXPANSION + 1), "n100001"),
        ("n[[0-99999]] m[[0-1]]", "m1"),
        ("a[[0-999]]b[[0-999]]", "a999b0"),
        ("a[[0-999999999]]b[[0-999999999]]c[[0-999999999]]", "a1b22c333"),
        ("a[[0-" + "9" * 60 + "]]", "a" + "9" * 60),
    ],
)
def test_expand_too_large_is_refused_without_allocating(pattern: str, member: str) -> None:
    with pytest.raises(PatternError) as ei:
        expand(pattern)
    assert "more than %d names" % MAX_EXPANSION in str(ei.value)
    # Matching never expands, so the same pattern compiles and matches.
    assert compile_pattern(pattern).match(member)


# ----------------------------------------------------------------------------- errors

BAD_PATTERNS = [
    ("", "empty pattern"),
    ("   ", "empty pattern"),
    (" , ,", "empty pattern"),
    ("tb[[05-01]]", "range 05-01 runs backwards"),
    ("tb[[1-3,9-2]]", "range 9-2 runs backwards"),
    ("tb[[01-04", "unbalanced"),
    ("tb01-04]]", "unbalanced"),
    ("tb[01-04]", "unbalanced"),
    ("tb]", "unbalanced"),
    ("tb[[[1-2]]]", "unbalanced"),
    ("tb[[1-[[2]]]]", "unbalanced"),
    ("tb[[a-4]]", "not a number"),
    ("tb[[1-x]]", "not a number"),
    ("tb[[1.5]]", "not a number"),
    ("tb[[+1]]", "not a number"),
    ("tb[[\u0661-\u0662]]", "not a number"),  # Arabic-Indic digits are not ASCII digits
    ("tb[[]]", "empty item"),
    ("tb[[1,,2]]", "empty item"),
    ("tb[[1,]]", "empty item"),
    ("tb[[-4]]", "missing a bound"),
    ("tb[[1-]]", "missing a bound"),
    ("tb[[1-2-3]]", "more than one '-'"),
    ("tb[[1" + "0" * 70 + "]]", "longer than"),
    ("user@host", "'@'"),
    ("host;rm", "';'"),
    ("a/b", "'/'"),
    ("h\u00e9te", "not allowed in host names"),
    ("a\x00b", "not allowed in host names"),
    ("ok bad!name", "'!'"),
    ("-oProxyCommand", "may not start with '-'"),
    ("ok, -x", "may not start with '-'"),
]


@pytest.mark.parametrize("pattern, reason", BAD_PATTERNS)
@pytest.mark.parametrize("func", [expand, compile_pattern, lambda p: matches(p, "x")])
def test_bad_patterns_raise_pattern_error(func, pattern: str, reason: str) -> None:
    with pytest.raises(PatternError) as ei:
        func(pattern)
    msg = str(ei.value)
    assert msg.startswith("bad host pattern %r: " % pattern)
    assert reason in msg
    assert "\n" not in msg


def test_pattern_error_is_value_error_and_example_message() -> None:
    assert issubclass(PatternError, ValueError)
    with pytest.raises(ValueError) as ei:
        expand("tb[[05-01]]")
    assert str(ei.value) == "bad host pattern 'tb[[05-01]]': range 05-01 runs backwards"


@pytest.mark.parametrize("pattern", ["tc*", "tb?", "*", "a b*"])
def test_globs_match_but_do_not_expand(pattern: str) -> None:
    compile_pattern(pattern)
    with pytest.raises(PatternError) as ei:
        expand(pattern)
    assert repr(pattern) in str(ei.value)
    assert "cannot be expanded" in str(ei.value)


@pytest.mark.parametrize("bad", [None, 5, ["a"], b"host"])
def test_non_string_patterns(bad) -> None:
    for func in (expand, compile_pattern, lambda p: matches(p, "a")):
        with pytest.raises(PatternError) as ei:
            func(bad)
        assert "not a string" in str(ei.value)


def test_long_pattern_is_shortened_in_message() -> None:
    pattern = "a" * 1000 + "@"
    with pytest.raises(PatternError) as ei:
        expand(pattern)
    assert len(str(ei.value)) < 400


# ----------------------------------------------------------------------------- match

def test_compile_and_match_examples() -> None:
    hp = compile_pattern("tb[[01-12,100]] tc* x?y login")
    assert isinstance(hp, HostPattern)
    assert hp.pattern == "tb[[01-12,100]] tc* x?y login"
    yes = ["tb01", "tb09", "tb12", "tb100", "tc", "tc01", "tcx.y", "xay", "x-y", "login"]
    no = ["tb1", "tb00", "tb13", "tb012", "tb0100", "tb99", "t", "xy", "xaay", "login1", "LOGIN", "tb01 "]
    for n in yes:
        assert hp.match(n), n
        assert n in hp
    for n in no:
        assert not hp.match(n), n


def test_match_star_matches_everything() -> None:
    hp = compile_pattern("*")
    for n in ["", "a", "tb01.example.org", "weird name\n"]:
        assert hp.match(n)


def test_match_is_exact_not_prefix_or_search() -> None:
    assert not matches("tb", "tb1")
    assert not matches("tb", "xtb")
    assert not matches("a.b", "axb")  # '.' is literal, not a regex wildcard
    assert matches("a.b", "a.b")


def test_match_ambiguous_digit_splits() -> None:
    # Digits next to groups and groups next to groups need real backtracking.
    pattern = "a[[1-20]][[0-5]]"
    names = set(expand(pattern))
    hp = compile_pattern(pattern)
    for n in ["a" + str(i) for i in range(0, 300)]:
        assert hp.match(n) == (n in names), n
    assert matches("n[[1-3]]0", "n10") and matches("n[[1-3]]0", "n30")
    assert not matches("n[[1-3]]0", "n40")
    assert matches("tb[[1-3]]*", "tb2-ib") and not matches("tb[[1-3]]*", "tb4")
    assert matches("*[[08-10]]", "n-09") and not matches("*[[08-10]]", "n-9")


def test_match_huge_ranges_without_expanding() -> None:
    hp = compile_pattern("n[[0-999999999999]] m[[0000000-12345678901234567890]]")
    assert hp.match("n123456789012")
    assert not hp.match("n1234567890123")
    assert hp.match("m0000042")
    assert hp.match("m12345678901234567890")
    assert not hp.match("m12345678901234567891")
    assert not hp.match("m42")


def test_matches_caches_compiled_patterns() -> None:
    hostpattern._compile_cached.cache_clear()
    assert matches("tb[[1-3]]", "tb2")
    assert not matches("tb[[1-3]]", "tb4")
    assert hostpattern._compile_cached.cache_info().hits >= 1


def test_host_pattern_equality_and_repr() -> None:
    assert compile_pattern("a b") == compile_pattern("a b")
    assert hash(compile_pattern("a")) == hash(compile_pattern("a"))
    assert "tb[[1-2]]" in repr(compile_pattern("tb[[1-2]]"))


# ----------------------------------------------------------------------------- is_pattern

@pytest.mark.parametrize(
    "s, expected",
    [("tb[[1-2]]", True), ("tc*", True), ("tb?", True), ("login1", False), ("a,b", False), ("", False)],
)
def test_is_pattern(s: str, expected: bool) -> None:
    assert is_pattern(s) is expected


# ----------------------------------------------------------------------------- fold

@pytest.mark.parametrize(
    "names, folded",
    [
        (["tb01", "tb02", "tb03", "tb05", "login"], "login tb[[01-03,05]]"),
        (["tb%02d" % i for i in range(1, 13)], "tb[[01-12]]"),
        (["n1", "n2", "n10"], "n[[1-2,10]]"),
        (["n1", "n01"], "n1 n01"),
        (["n05"], "n05"),
        (["n098", "n099", "n100", "n101"], "n[[098-101]]"),
        (["a1b1", "a1b2", "a2b1"], "a1b[[1-2]] a2b1"),
        (["n1.ib", "n2.ib", "n3", "n4"], "n[[1-2]].ib n[[3-4]]"),
        (["b", "a", "a", "c"], "a b c"),
        (["h" + "9" * 70], "h" + "9" * 70),
        ([], ""),
    ],
)
def test_fold_examples(names: list, folded: str) -> None:
    assert fold(names) == folded
    if names:
        assert set(expand(folded)) == set(names)


def test_fold_accepts_any_iterable() -> None:
    assert fold(iter(["x2", "x1"])) == "x[[1-2]]"
    assert fold({"x2", "x1"}) == "x[[1-2]]"


@pytest.mark.parametrize("bad", ["", "a@b", "a b", "-x", "tb[[1]]", "t*", 5, None])
def test_fold_rejects_bad_names(bad) -> None:
    with pytest.raises(PatternError) as ei:
        fold(["ok", bad])
    assert repr(bad) in str(ei.value)


# ----------------------------------------------------------------------------- properties

_PREFIXES = st.sampled_from(["", "tb", "n", "a1b", "node-", "x.y", "c_", "9"])
_SUFFIXES = st.sampled_from(["", ".local", "-ib", "x", "-2a", "0"])
_numbered = st.builds(
    lambda p, n, w, s: p + str(n).zfill(w) + s,
    _PREFIXES,
    st.integers(0, 1200),
    st.integers(0, 5),
    _SUFFIXES,
)
_plain = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from("aZ_."),
    st.text(alphabet="abzAZ09._-", max_size=8),
)
_names = st.lists(st.one_of(_numbered, _numbered, _plain), max_size=60)


@FAST
@given(_names)
def test_fold_expand_round_trip(names: list) -> None:
    folded = fold(names)
    if not names:
        assert folded == ""
        return
    expanded = expand(folded)
    assert set(expanded) == set(names)
    assert len(expanded) == len(set(names))
    # Deterministic and a fixed point.
    assert fold(reversed(names)) == folded
    assert fold(expanded) == folded
    # Every name is matched by the folded pattern.
    hp = compile_pattern(folded)
    assert all(hp.match(n) for n in names)


@FAST
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=200), st.integers(1, 4))
def test_fold_compresses_padded_runs(values: list, width: int) -> None:
    names = ["tb%0*d" % (width, v) for v in values]
    folded = fold(names)
    assert set(expand(folded)) == set(names)
    assert folded.count("tb") == 1  # one group: wider numbers join the padded one


_TEXT = st.sampled_from(["a", "b", "x-", ".", "_", "1", "0", "9"])


_item = st.builds(
    lambda width, lo, span, hi_width: (
        "%0*d" % (width, lo) if span < 0 else "%0*d-%0*d" % (width, lo, hi_width, lo + span)
    ),
    st.integers(1, 3),
    st.integers(0, 130),
    st.integers(-3, 12),
    st.integers(1, 3),
)
_group = st.lists(_item, min_size=1, max_size=2).map(lambda xs: "[[" + ",".join(xs) + "]]")
_opt_text = st.lists(_TEXT, max_size=2).map("".join)
_opt_group = st.one_of(st.just(""), _group)
# At most two groups per term keeps expansions small; texts include digits so that
# groups sit next to literal digits.
_term = st.builds(
    lambda *parts: "".join(parts) or "a", _opt_text, _opt_group, _opt_text, _opt_group, _opt_text
)
_patterns = st.lists(_term, min_size=1, max_size=3).map(" ".join)
_digit_runs = st.builds(lambda v, w: "%0*d" % (w, v), st.integers(0, 1500), st.integers(1, 4))
_candidates = st.lists(st.one_of(_TEXT, _digit_runs), min_size=1, max_size=5).map("".join)


@FAST
@given(_patterns, st.lists(_candidates, max_size=30), st.lists(st.integers(0, 10**6), max_size=10))
def test_match_agrees_with_expand(pattern: str, others: list, picks: list) -> None:
    names = expand(pattern)
    members = set(names)
    hp = compile_pattern(pattern)
    assert all(hp.match(n) for n in names[:: max(1, len(names) // 300)])
    # Near misses: members with digits changed, plus random names from the same alphabet.
    near = []
    for i in picks:
        n = names[i % len(names)]
        near += [n + "0", "0" + n, n[:-1], n.replace("0", "00"), n.replace("1", "01"), n.replace("9", "10")]
    for n in others + near:
        assert hp.match(n) == (n in members), (pattern, n)
        assert matches(pattern, n) == (n in members)


@FAST
@given(
    st.integers(0, 3000),
    st.integers(0, 3000),
    st.integers(1, 4),
    st.lists(st.integers(1, 5), max_size=3),
    st.lists(st.integers(0, 9999), max_size=40),
)
def test_group_regex_is_exact(a: int, b: int, width: int, extra_lengths: list, randoms: list) -> None:
    lo, hi = min(a, b), max(a, b)
    pattern = "x[[%0*d-%d]]" % (width, lo, hi)
    members = set(expand(pattern))
    hp = compile_pattern(pattern)
    # Every digit string of length 1..2, plus some longer ones around the bounds.
    cands = ["x" + "".join(t) for k in (1, 2) for t in itertools.product("0123456789", repeat=k)]
    for v in (lo - 1, lo, lo + 1, hi - 1, hi, hi + 1):
        if v >= 0:
            cands += ["x%0*d" % (w, v) for w in [1, width, width + 1] + extra_lengths]
    cands += ["x%0*d" % (w, v) for v in randoms for w in (1, width)]
    for n in cands:
        assert hp.match(n) == (n in members), (pattern, n)


_glob_terms = st.lists(st.sampled_from(["a", "b", "1", ".", "-", "*", "?"]),
                       min_size=1, max_size=6).map("".join)


@FAST
@given(_glob_terms, st.lists(st.text(alphabet="ab1.-", max_size=6), max_size=20))
def test_globs_agree_with_fnmatch(glob: str, names: list) -> None:
    assume(not glob.startswith("-"))
    hp = compile_pattern(glob)
    for n in names:
        assert hp.match(n) == fnmatch.fnmatchcase(n, glob), (glob, n)
