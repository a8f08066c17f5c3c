"""Host patterns as GXP writes them: ``tb[[01-04,07]]``, ``n[[000-015]]``, ``tc*``.

Used by the CLI, the cluster YAML loader and ``use`` rules. Standard library only,
Python 3.8 syntax.

Grammar::

    pattern  := sep* term (sep+ term)* sep*
    sep      := whitespace | ","                      (only outside [[ ]])
    term     := (text | group | glob)+
    text     := one or more of  A-Z a-z 0-9 - . _     (ASCII; a term may not
                                                       start with "-")
    group    := "[[" item ("," item)* "]]"
    item     := number | number "-" number            (lo <= hi)
    number   := 1 to 63 ASCII digits
    glob     := "*" | "?"                             (compile_pattern only)

A group stands for every integer in its items, in the order written. Numbers are
zero padded to the width of the item's low bound: ``[[01-03]]`` is 01 02 03,
``[[000-015]]`` is 000 ... 015, ``[[8-10]]`` is 8 9 10 and ``[[098-100]]`` is
098 099 100. Several groups in one term give the cartesian product, leftmost
group varying slowest: ``a[[1-2]]b[[1-2]]`` is a1b1 a1b2 a2b1 a2b2.

* ``expand`` lists the names of a pattern (globs are refused, duplicates are
  dropped keeping the first, at most ``MAX_EXPANSION`` names counted before
  dropping duplicates, checked before anything is allocated).
* ``compile_pattern`` / ``matches`` test a name without expanding: every group
  becomes an exact regular expression for its digit strings, so a name matches
  iff it is in the expansion; ``*`` matches any run of characters and ``?`` any
  one character, as in shell globs. Matching is case sensitive. Groups are not
  limited in size for matching (``n[[0-999999999]]`` compiles fine).
* ``fold`` is the inverse of ``expand``: it groups names on their last run of
  digits, like ClusterShell's NodeSet folding.
"""
from __future__ import annotations

import functools
import re
from typing import Dict, Iterable, List, Optional, Set, Tuple, Union

__all__ = [
    "PatternError",
    "HostPattern",
    "expand",
    "compile_pattern",
    "matches",
    "fold",
    "is_pattern",
    "MAX_EXPANSION",
]

#: Largest number of names ``expand`` will produce.
MAX_EXPANSION = 100000
#: Longest number allowed inside a ``[[...]]`` group (a DNS label is <= 63).
MAX_DIGITS = 63

_HOST_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._")
_NUMBER_RE = re.compile(r"[0-9]+\Z")
_LAST_DIGITS_RE = re.compile(r"[0-9]+(?=[^0-9]*\Z)")
_MSG_PATTERN_MAX = 200


class PatternError(ValueError):
    """A host pattern (or a name given to ``fold``) is malformed.

    The message is one line naming the pattern and the reason, e.g.
    ``bad host pattern 'tb[[05-01]]': range 05-01 runs backwards``.
    """


def _quote(pattern: object) -> str:
    r = repr(pattern)
    if len(r) > _MSG_PATTERN_MAX:
        r = r[: _MSG_PATTERN_MAX - 3] + "..."
    return r


def _error(pattern: object, reason: str) -> PatternError:
    return PatternError("bad host pattern %s: %s" % (_quote(pattern), reason))


# --------------------------------------------------------------------------- parsing

# An item of a group: (lo, hi, width, lo text, hi text).
_Item = Tuple[int, int, int, str, str]
# A part of a term: ("text", str) | ("group", [items]) | ("star", "*") | ("any", "?")
_Part = Tuple[str, Union[str, List[_Item]]]
_Term = List[_Part]


def _parse_group(pattern: str, inner: str, col: int) -> List[_Item]:
    items: List[_Item] = []
    for raw in inner.split(","):
        item = raw.strip()
        if not item:
            raise _error(pattern, "empty item in range group %r at column %d" % ("[[%s]]" % inner, col))
        bounds = item.split("-")
        if len(bounds) > 2:
            raise _error(pattern, "range %r has more than one '-'" % item)
        for b in bounds:
            if not b:
                raise _error(pattern, "range %r is missing a bound" % item)
            if not _NUMBER_RE.match(b):
                raise _error(pattern, "range part %r is not a number" % b)
            if len(b) > MAX_DIGITS:
                raise _error(pattern, "number %s... is longer than %d digits" % (b[:10], MAX_DIGITS))
        lo_s = bounds[0]
        hi_s = bounds[-1]
        lo, hi = int(lo_s), int(hi_s)
        if lo > hi:
            raise _error(pattern, "range %s-%s runs backwards" % (lo_s, hi_s))
        items.append((lo, hi, len(lo_s), lo_s, hi_s))
    return items


def _parse(pattern: object, allow_globs: bool) -> List[_Term]:
    """Split a pattern into terms of parts, validating everything."""
    if not isinstance(pattern, str):
        raise _error(pattern, "not a string but %s" % type(pattern).__name__)
    terms: List[_Term] = []
    term: _Term = []
    text: List[str] = []

    def flush_text() -> None:
        if text:
            term.append(("text", "".join(text)))
            del text[:]

    def end_term() -> None:
        flush_text()
        if term:
            first_kind, first_val = term[0]
            if first_kind == "text" and str(first_val).startswith("-"):
                raise _error(pattern, "a host name may not start with '-'")
            terms.append(list(term))
            del term[:]

    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        col = i + 1
        if pattern.startswith("[[", i):
            j = pattern.find("]]", i + 2)
            if j < 0:
                raise _error(pattern, "unbalanced brackets: '[[' at column %d is never closed" % col)
            inner = pattern[i + 2 : j]
            if "[" in inner or "]" in inner:
                raise _error(pattern, "unbalanced brackets: '[' or ']' inside the group at column %d" % col)
            flush_text()
            term.append(("group", _parse_group(pattern, inner, col)))
            i = j + 2
            continue
        if c == "]":
            if pattern.startswith("]]", i):
                raise _error(pattern, "unbalanced brackets: ']]' at column %d has no matching '[['" % col)
            raise _error(pattern, "unbalanced brackets: stray ']' at column %d" % col)
        if c == "[":
            raise _error(pattern, "unbalanced brackets: stray '[' at column %d (groups are '[[...]]')" % col)
        if c == "," or c.isspace():
            end_term()
        elif c == "*" or c == "?":
            if not allow_globs:
                raise _error(pattern, "glob %r at column %d cannot be expanded" % (c, col))
            flush_text()
            term.append(("star" if c == "*" else "any", c))
        elif c in _HOST_CHARS:
            text.append(c)
        else:
            raise _error(pattern, "character %r at column %d is not allowed in host names" % (c, col))
        i += 1
    end_term()
    if not terms:
        raise _error(pattern, "empty pattern")
    return terms


# --------------------------------------------------------------------------- expand

def _group_size(items: List[_Item]) -> int:
    return sum(hi - lo + 1 for lo, hi, _w, _l, _h in items)


def _group_strings(items: List[_Item]) -> List[str]:
    out: List[str] = []
    for lo, hi, width, _l, _h in items:
        out.extend("%0*d" % (width, v) for v in range(lo, hi + 1))
    return out


def expand(pattern: str) -> List[str]:
    """Expand ``pattern`` to its host names, in order, without duplicates.

    >>> expand("tb[[01-03,07]] login1")
    ['tb01', 'tb02', 'tb03', 'tb07', 'login1']

    Raises PatternError for malformed patterns, globs, and patterns that stand
    for more than MAX_EXPANSION names (checked before expanding).
    """
    terms = _parse(pattern, allow_globs=False)
    total = 0
    for term in terms:
        count = 1
        for kind, val in term:
            if kind == "group":
                count *= _group_size(val)  # type: ignore[arg-type]
                if count > MAX_EXPANSION:
                    break
        total += count
        if total > MAX_EXPANSION:
            raise _error(pattern, "expands to more than %d names" % MAX_EXPANSION)

    seen: Set[str] = set()
    out: List[str] = []
    for term in terms:
        partials = [""]
        for kind, val in term:
            if kind == "text":
                partials = [p + val for p in partials]  # type: ignore[operator]
            else:
                strs = _group_strings(val)  # type: ignore[arg-type]
                partials = [p + s for p in partials for s in strs]
        for name in partials:
            if name not in seen:
                seen.add(name)
                out.append(name)
    return out


# --------------------------------------------------------------------------- match

def _digit_class(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else "[%d-%d]" % (lo, hi)


def _any_digits(k: int) -> str:
    if k == 0:
        return ""
    return "[0-9]" if k == 1 else "[0-9]{%d}" % k


def _fixed_range_re(a: str, b: str) -> str:
    """Regex matching exactly the digit strings of len(a) between a and b."""
    if a == b:
        return a
    if a[0] == b[0]:
        return a[0] + _fixed_range_re(a[1:], b[1:])
    rest = len(a) - 1
    low_full = a[1:] == "0" * rest
    high_full = b[1:] == "9" * rest
    alts: List[str] = []
    start, end = int(a[0]), int(b[0])
    if not low_full:
        alts.append(a[0] + _fixed_range_re(a[1:], "9" * rest))
        start += 1
    tail: Optional[str] = None
    if not high_full:
        tail = b[0] + _fixed_range_re("0" * rest, b[1:])
        end -= 1
    if start <= end:
        alts.append(_digit_class(start, end) + _any_digits(rest))
    if tail is not None:
        alts.append(tail)
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _item_res(lo: int, hi: int, width: int) -> List[str]:
    """Regexes for the strings '%0*d' % (width, v), lo <= v <= hi."""
    res: List[str] = []
    # Values that fit in `width` digits are zero padded to exactly `width`.
    top = min(hi, 10 ** width - 1)
    if lo <= top:
        res.append(_fixed_range_re("%0*d" % (width, lo), "%0*d" % (width, top)))
    # Longer values are written without padding, one regex per length.
    for d in range(width + 1, len(str(hi)) + 1):
        a, b = max(lo, 10 ** (d - 1)), min(hi, 10 ** d - 1)
        if a <= b:
            res.append(_fixed_range_re(str(a), str(b)))
    return res


def _group_re(items: List[_Item]) -> str:
    alts: List[str] = []
    seen: Set[str] = set()
    for lo, hi, width, _l, _h in items:
        for r in _item_res(lo, hi, width):
            if r not in seen:
                seen.add(r)
                alts.append(r)
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _term_re(term: _Term) -> str:
    out: List[str] = []
    for kind, val in term:
        if kind == "text":
            out.append(re.escape(val))  # type: ignore[arg-type, type-var]
        elif kind == "group":
            out.append(_group_re(val))  # type: ignore[arg-type]
        elif kind == "star":
            if not out or out[-1] != ".*":  # '**' is '*'; avoids needless backtracking
                out.append(".*")
        else:
            out.append(".")
    return "".join(out)


class HostPattern:
    """A compiled host pattern; ``match(name)`` tells whether name is covered."""

    __slots__ = ("pattern", "_regex")

    def __init__(self, pattern: str) -> None:
        terms = _parse(pattern, allow_globs=True)
        alts: List[str] = []
        seen: Set[str] = set()
        for term in terms:
            r = _term_re(term)
            if r not in seen:
                seen.add(r)
                alts.append(r)
        self.pattern = pattern
        self._regex = re.compile("(?:%s)" % "|".join(alts), re.DOTALL)

    def match(self, name: str) -> bool:
        """True when ``name`` is one of the pattern's hosts (or fits its globs)."""
        return self._regex.fullmatch(name) is not None

    __contains__ = match

    def __repr__(self) -> str:
        return "HostPattern(%r)" % self.pattern

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostPattern) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)


def compile_pattern(pattern: str) -> HostPattern:
    """Compile ``pattern`` (groups, ``*``/``?`` globs, lists) for matching.

    Raises PatternError for malformed patterns, like ``expand``.
    """
    return HostPattern(pattern)


@functools.lru_cache(maxsize=1024)
def _compile_cached(pattern: str) -> HostPattern:
    return HostPattern(pattern)


def matches(pattern: str, name: str) -> bool:
    """True when ``name`` matches ``pattern``; compiled patterns are cached."""
    if not isinstance(pattern, str):
        return compile_pattern(pattern).match(name)  # raises PatternError
    return _compile_cached(pattern).match(name)


def is_pattern(s: str) -> bool:
    """True when ``s`` contains a range group or a glob (``[[``, ``*``, ``?``)."""
    return "[[" in s or "*" in s or "?" in s


# --------------------------------------------------------------------------- fold

def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise PatternError("cannot fold host name %s: not a string" % _quote(name))
    if not name:
        raise PatternError("cannot fold host name '': empty name")
    for c in name:
        if c not in _HOST_CHARS:
            raise PatternError(
                "cannot fold host name %s: character %r is not allowed in host names" % (_quote(name), c)
            )
    if name.startswith("-"):
        raise PatternError("cannot fold host name %s: a host name may not start with '-'" % _quote(name))
    return name


def _runs(values: List[int]) -> List[Tuple[int, int]]:
    runs: List[Tuple[int, int]] = []
    for v in values:
        if runs and runs[-1][1] + 1 == v:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs


def fold(names: Iterable[str]) -> str:
    """Fold host names into the short pattern form; the inverse of ``expand``.

    >>> fold(["tb01", "tb02", "tb03", "tb05", "login"])
    'login tb[[01-03,05]]'

    Names are grouped by the text around their last run of digits and by the
    digit width; ``set(expand(fold(names))) == set(names)``. Terms are sorted by
    prefix, then by first number. Returns '' for no names. Raises PatternError
    for names that are not valid host names.
    """
    plain: Set[str] = set()
    by_affix: Dict[Tuple[str, str], Set[str]] = {}
    for name in names:
        _check_name(name)
        m = _LAST_DIGITS_RE.search(name)
        if m is None or len(m.group()) > MAX_DIGITS:
            plain.add(name)
            continue
        by_affix.setdefault((name[: m.start()], name[m.end() :]), set()).add(m.group())

    # (sort key, text)
    out: List[Tuple[Tuple[str, int, int, str], str]] = [((p, -1, 0, ""), p) for p in plain]
    for (prefix, suffix), digit_strings in by_affix.items():
        padded = sorted({len(s) for s in digit_strings if len(s) > 1 and s[0] == "0"})
        buckets: Dict[int, List[int]] = {}
        for s in digit_strings:
            if len(s) > 1 and s[0] == "0":
                width = len(s)
            else:
                # '%0*d' % (w, v) == s for any w <= len(s): join the widest
                # padded group that can hold s, so 01..09,10..12 fold together.
                fits = [w for w in padded if w <= len(s)]
                width = fits[-1] if fits else 1
            buckets.setdefault(width, []).append(int(s))
        for width, values in buckets.items():
            values.sort()
            key = (prefix, values[0], width, suffix)
            if len(values) == 1:
                out.append((key, "%s%0*d%s" % (prefix, width, values[0], suffix)))
                continue
            items = []
            for lo, hi in _runs(values):
                if lo == hi:
                    items.append("%0*d" % (width, lo))
                else:
                    items.append("%0*d-%0*d" % (width, lo, width, hi))
            out.append((key, "%s[[%s]]%s" % (prefix, ",".join(items), suffix)))
    out.sort()
    return " ".join(text for _key, text in out)
