"""A small, versioned binary serializer for builtin values only.

Why not pickle or JSON: pickle lets a hostile peer run code, and JSON cannot carry
bytes (command output, file chunks) without base64 bloat. Both ends may run
different Python versions (any python3 >= 3.8), so the format is defined here byte
by byte and never depends on the interpreter.

Shipped to agents: standard library only, Python 3.8 syntax.

Format: one version byte, then one value. A value is a one-byte tag and a body:
  N  None            T/F  True/False
  i  int   (8-byte signed big-endian)   I  big int (u32 length + signed bytes)
  d  float (8-byte IEEE big-endian)
  s  str   (u32 length + UTF-8)         b  bytes (u32 length + raw)
  l  list  (u32 count + values)         m  dict (u32 count + key, value pairs)
Tuples encode as lists. Decoding enforces a depth and an item-count limit so that
a small frame cannot make the receiver allocate without bound.
"""
from __future__ import annotations

import struct

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any

VERSION = 1
MAX_DEPTH = 32
MAX_ITEMS = 1 << 20

_U32 = struct.Struct("!I")
_I64 = struct.Struct("!q")
_F64 = struct.Struct("!d")
_pack_u32 = _U32.pack
_pack_i64 = _I64.pack


class DecodeError(ValueError):
    """The bytes are not a valid encoding (truncated, unknown tag, over a limit)."""


def dumps(value: Any) -> bytes:
    out = [bytes((VERSION,))]
    _encode(value, out, 0)
    return b"".join(out)


def _encode(v: Any, out: list, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(v)
    if t is str:
        raw = v.encode("utf-8", "surrogateescape")
        out.append(b"s" + _pack_u32(len(raw)))
        out.append(raw)
    elif t is dict:
        out.append(b"m" + _pack_u32(len(v)))
        if depth >= MAX_DEPTH:
            for key, item in v.items():
                _encode(key, out, depth + 1)
                _encode(item, out, depth + 1)
            return
        # The common case inline (every message is a dict; environments are
        # str to str): one call per message instead of one per value.
        append = out.append
        for key, item in v.items():
            if type(key) is str:
                raw = key.encode("utf-8", "surrogateescape")
                append(b"s" + _pack_u32(len(raw)))
                append(raw)
            else:
                _encode(key, out, depth + 1)
            ti = type(item)
            if ti is str:
                raw = item.encode("utf-8", "surrogateescape")
                append(b"s" + _pack_u32(len(raw)))
                append(raw)
            elif item is None:
                append(b"N")
            elif ti is int and -(1 << 63) <= item < (1 << 63):
                append(b"i" + _pack_i64(item))
            else:
                _encode(item, out, depth + 1)
    elif v is None:
        out.append(b"N")
    elif v is True:
        out.append(b"T")
    elif v is False:
        out.append(b"F")
    elif isinstance(v, int):
        if -(1 << 63) <= v < (1 << 63):
            out.append(b"i" + _pack_i64(v))
        else:
            raw = v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True)
            out.append(b"I" + _pack_u32(len(raw)) + raw)
    elif isinstance(v, float):
        out.append(b"d" + _F64.pack(v))
    elif isinstance(v, str):
        raw = v.encode("utf-8", "surrogateescape")
        out.append(b"s" + _pack_u32(len(raw)))
        out.append(raw)
    elif isinstance(v, (bytes, bytearray, memoryview)):
        raw = bytes(v)
        out.append(b"b" + _pack_u32(len(raw)))
        out.append(raw)
    elif isinstance(v, (list, tuple)):
        out.append(b"l" + _pack_u32(len(v)))
        for item in v:
            _encode(item, out, depth + 1)
    elif isinstance(v, dict):
        out.append(b"m" + _pack_u32(len(v)))
        for key, item in v.items():
            _encode(key, out, depth + 1)
            _encode(item, out, depth + 1)
    else:
        raise TypeError("cannot serialize %s" % type(v).__name__)


def loads(data: bytes) -> Any:
    if not data:
        raise DecodeError("empty message")
    if data[0] != VERSION:
        raise DecodeError("unsupported serializer version %d" % data[0])
    if not isinstance(data, bytes):
        data = bytes(data)
    decoder = _Decoder(data)
    value = decoder.value(1, 0)
    if decoder.pos != len(data):
        raise DecodeError("trailing bytes after value")
    return value


_unpack_u32 = _U32.unpack_from
_unpack_i64 = _I64.unpack_from
_unpack_f64 = _F64.unpack_from


class _Decoder:
    """One pass over one message. Written for speed (a `stat` of a thousand
    nodes is 13,000 values): bytes indexing, no helper calls per item; every
    length is still checked against what is left before it is used."""

    __slots__ = ("data", "end", "pos", "budget")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.end = len(data)
        self.pos = 0
        self.budget = MAX_ITEMS

    def value(self, pos: int, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise DecodeError("value nested too deeply")
        self.budget -= 1
        if self.budget < 0:
            raise DecodeError("too many items")
        data, end = self.data, self.end
        if pos >= end:
            raise DecodeError("truncated value")
        tag = data[pos]
        pos += 1
        if tag == 0x73:  # s
            if pos + 4 > end:
                raise DecodeError("truncated value")
            n = _unpack_u32(data, pos)[0]
            pos += 4
            if pos + n > end:
                raise DecodeError("truncated value")
            self.pos = pos + n
            # surrogateescape never fails: bytes that are not UTF-8 come back
            # as the same bytes when encoded again (file names on nodes).
            return data[pos:pos + n].decode("utf-8", "surrogateescape")
        if tag == 0x69:  # i
            if pos + 8 > end:
                raise DecodeError("truncated value")
            self.pos = pos + 8
            return _unpack_i64(data, pos)[0]
        if tag == 0x6D:  # m
            return self._map(pos, depth)
        if tag == 0x6C:  # l
            return self._list(pos, depth)
        if tag == 0x4E:  # N
            self.pos = pos
            return None
        if tag == 0x54:  # T
            self.pos = pos
            return True
        if tag == 0x46:  # F
            self.pos = pos
            return False
        if tag == 0x64:  # d
            if pos + 8 > end:
                raise DecodeError("truncated value")
            self.pos = pos + 8
            return _unpack_f64(data, pos)[0]
        if tag == 0x62 or tag == 0x49:  # b, I: length-prefixed
            if pos + 4 > end:
                raise DecodeError("truncated value")
            n = _unpack_u32(data, pos)[0]
            pos += 4
            if pos + n > end:
                raise DecodeError("truncated value")
            self.pos = pos + n
            raw = data[pos:pos + n]
            return raw if tag == 0x62 else int.from_bytes(raw, "big", signed=True)
        raise DecodeError("unknown tag 0x%02x" % tag)

    def _map(self, pos: int, depth: int) -> Any:
        """A dict's body at `pos` (after its tag)."""
        data, end = self.data, self.end
        if pos + 4 > end:
            raise DecodeError("truncated value")
        n = _unpack_u32(data, pos)[0]
        pos += 4
        if pos + 2 * n > end:
            raise DecodeError("truncated value")
        result = {}
        value = self.value
        if depth + 1 > MAX_DEPTH:
            for _ in range(n):
                key = value(pos, depth + 1)
                if isinstance(key, (list, dict)):
                    raise DecodeError("unhashable dict key")
                result[key] = value(self.pos, depth + 1)
                pos = self.pos
            self.pos = pos
            return result
        # str keys and str values inline (the common case: environments);
        # the same checks and item budget as value() itself.
        for _ in range(n):
            if pos < end and data[pos] == 0x73:
                self.budget -= 1
                if self.budget < 0:
                    raise DecodeError("too many items")
                if pos + 5 > end:
                    raise DecodeError("truncated value")
                k = _unpack_u32(data, pos + 1)[0]
                pos += 5
                if pos + k > end:
                    raise DecodeError("truncated value")
                key = data[pos:pos + k].decode("utf-8", "surrogateescape")
                pos += k
            else:
                key = value(pos, depth + 1)
                if isinstance(key, (list, dict)):
                    raise DecodeError("unhashable dict key")
                pos = self.pos
            if pos < end and data[pos] == 0x73:
                self.budget -= 1
                if self.budget < 0:
                    raise DecodeError("too many items")
                if pos + 5 > end:
                    raise DecodeError("truncated value")
                k = _unpack_u32(data, pos + 1)[0]
                pos += 5
                if pos + k > end:
                    raise DecodeError("truncated value")
                result[key] = data[pos:pos + k].decode("utf-8", "surrogateescape")
                pos += k
            else:
                result[key] = value(pos, depth + 1)
                pos = self.pos
        self.pos = pos
        return result

    def _list(self, pos: int, depth: int) -> Any:
        """A list's body at `pos` (after its tag)."""
        data, end = self.data, self.end
        if pos + 4 > end:
            raise DecodeError("truncated value")
        n = _unpack_u32(data, pos)[0]
        pos += 4
        # Every item takes at least one byte: a count larger than what is left is a lie.
        if pos + n > end:
            raise DecodeError("truncated value")
        items = []
        value = self.value
        for _ in range(n):
            items.append(value(pos, depth + 1))
            pos = self.pos
        self.pos = pos
        return items
