"""Declared shapes of messages and requests, checked before any handler runs.

A schema is built from a few constructors and checked with `check(value, spec,
where)`, which returns the value (numbers normalized) or raises SchemaError with
a one-line reason in the user's words ("explore: local must be from 0 to 10000").
Nested fields are checked too: a request whose `env` is a list, or whose `mask`
is a number, never reaches the code that would trip over it.

Specs:
    Int(lo, hi) / Num(lo, hi)   a whole number / any number, in [lo, hi]
    Str(max_len, empty=True)    text (no NUL unless nul=True)
    Bytes(max_len), Bool(), Any()
    Opt(spec)                   None or spec
    ListOf(spec, max_items)     a list (tuples decode as lists)
    MapOf(spec, max_items)      a dict with str keys
    Rec(required, optional)     a dict with these fields; others are kept but unchecked
                                 only when open=True (messages from newer peers)
    Choice(*values)             one of the given values

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any as _Any
    from typing import Dict, Optional, Tuple


class SchemaError(ValueError):
    """A value does not have its declared shape; the text is for the user."""


class Spec:
    def check(self, value: _Any, where: str) -> _Any:
        raise NotImplementedError


def _kind(value: _Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    return {int: "a number", float: "a number", str: "text", bytes: "bytes", list: "a list",
            dict: "a mapping"}.get(type(value), type(value).__name__)


def _fmt(x: _Any) -> str:
    if isinstance(x, float) and x == int(x):
        return str(int(x))
    return str(x)


class Int(Spec):
    # Bounds may be floats (limits.RANGES types every range as a Number).
    def __init__(self, lo: Optional[float] = None, hi: Optional[float] = None) -> None:
        self.lo, self.hi = lo, hi

    def check(self, value: _Any, where: str) -> _Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError("%s must be a whole number, not %s" % (where, _kind(value)))
        _in_range(value, self.lo, self.hi, where)
        return value


class Num(Spec):
    def __init__(self, lo: Optional[float] = None, hi: Optional[float] = None) -> None:
        self.lo, self.hi = lo, hi

    def check(self, value: _Any, where: str) -> _Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise SchemaError("%s must be a number, not %s" % (where, _kind(value)))
        _in_range(value, self.lo, self.hi, where)
        return value


def _in_range(value: _Any, lo: _Any, hi: _Any, where: str) -> None:
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        if lo is not None and hi is not None:
            raise SchemaError("%s must be from %s to %s, got %s" % (where, _fmt(lo), _fmt(hi),
                                                                    _fmt(value)))
        if lo is not None:
            raise SchemaError("%s must be at least %s, got %s" % (where, _fmt(lo), _fmt(value)))
        raise SchemaError("%s must be at most %s, got %s" % (where, _fmt(hi), _fmt(value)))


class Str(Spec):
    def __init__(self, max_len: int = 1 << 20, empty: bool = True, nul: bool = False) -> None:
        self.max_len, self.empty, self.nul = max_len, empty, nul

    def check(self, value: _Any, where: str) -> _Any:
        if not isinstance(value, str):
            raise SchemaError("%s must be text, not %s" % (where, _kind(value)))
        if not value and not self.empty:
            raise SchemaError("%s must not be empty" % where)
        if len(value) > self.max_len:
            raise SchemaError("%s is too long (%d characters, at most %d)"
                              % (where, len(value), self.max_len))
        if not self.nul and "\0" in value:
            raise SchemaError("%s must not contain a NUL character" % where)
        return value


class Bytes(Spec):
    def __init__(self, max_len: int = 1 << 24) -> None:
        self.max_len = max_len

    def check(self, value: _Any, where: str) -> _Any:
        if not isinstance(value, bytes):
            raise SchemaError("%s must be bytes, not %s" % (where, _kind(value)))
        if len(value) > self.max_len:
            raise SchemaError("%s is too long (%d bytes, at most %d)" % (where, len(value), self.max_len))
        return value


class Bool(Spec):
    def check(self, value: _Any, where: str) -> _Any:
        if not isinstance(value, bool):
            raise SchemaError("%s must be true or false, not %s" % (where, _kind(value)))
        return value


class Any(Spec):
    def check(self, value: _Any, where: str) -> _Any:
        return value


class Opt(Spec):
    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def check(self, value: _Any, where: str) -> _Any:
        return None if value is None else self.spec.check(value, where)


class Choice(Spec):
    def __init__(self, *values: _Any) -> None:
        self.values = values

    def check(self, value: _Any, where: str) -> _Any:
        if isinstance(value, bool) or value not in self.values:
            raise SchemaError("%s must be one of %s, got %r" % (
                where, ", ".join(str(v) for v in self.values), value))
        return value


class ListOf(Spec):
    def __init__(self, spec: Spec, max_items: int = 1 << 16) -> None:
        self.spec, self.max_items = spec, max_items

    def check(self, value: _Any, where: str) -> _Any:
        if not isinstance(value, list):
            raise SchemaError("%s must be a list, not %s" % (where, _kind(value)))
        if len(value) > self.max_items:
            raise SchemaError("%s has too many items (%d, at most %d)" % (where, len(value), self.max_items))
        check = self.spec.check
        try:
            # Where an item sits goes into the message only when one fails:
            # formatting it for every item costs more than the check.
            return [check(v, where) for v in value]
        except SchemaError:
            return [check(v, "%s[%d]" % (where, i)) for i, v in enumerate(value)]


class MapOf(Spec):
    def __init__(self, spec: Spec, max_items: int = 1 << 16, key: Optional[Spec] = None) -> None:
        self.spec, self.max_items = spec, max_items
        self.key = key or Str(4096)

    def check(self, value: _Any, where: str) -> _Any:
        if not isinstance(value, dict):
            raise SchemaError("%s must be a mapping, not %s" % (where, _kind(value)))
        if len(value) > self.max_items:
            raise SchemaError("%s has too many entries (%d, at most %d)"
                              % (where, len(value), self.max_items))
        out = {}
        key, spec = self.key.check, self.spec.check
        try:
            for k, v in value.items():
                out[key(k, where)] = spec(v, where)
        except SchemaError:
            for k, v in value.items():     # again, to name the entry that fails
                k = key(k, "%s key" % where)
                out[k] = spec(v, "%s[%s]" % (where, k))
        return out


class Rec(Spec):
    """A dict with required and optional fields. Closed by default: an unknown
    field is an error (a typo in a request should not be silently ignored);
    open=True keeps unknown fields for messages from newer peers."""

    def __init__(self, required: Optional[Dict[str, Spec]] = None,
                 optional: Optional[Dict[str, Spec]] = None, open: bool = False) -> None:
        self.required = required or {}
        self.optional = optional or {}
        self.open = open

    def check(self, value: _Any, where: str) -> _Any:
        if not isinstance(value, dict):
            raise SchemaError("%s must be a mapping, not %s" % (where, _kind(value)))
        try:
            return self._check(value, where, False)
        except SchemaError:
            return self._check(value, where, True)   # again, to name the field that fails

    def _check(self, value: Dict[str, _Any], where: str, named: bool) -> _Any:
        out = {}
        for k, spec in self.required.items():
            if k not in value:
                raise SchemaError("%s: %s is missing" % (where, k))
            out[k] = spec.check(value[k], "%s: %s" % (where, k) if named else where)
        for k, v in value.items():
            if k in self.required:
                continue
            opt = self.optional.get(k)
            if opt is not None:
                out[k] = opt.check(v, "%s: %s" % (where, k) if named else where)
            elif self.open:
                out[k] = v
            else:
                raise SchemaError("%s: unknown field %r" % (where, k))
        return out

    def fields(self) -> Tuple[str, ...]:
        return tuple(self.required) + tuple(self.optional)


def check(value: _Any, spec: Spec, where: str) -> _Any:
    return spec.check(value, where)
