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


class DecodeError(ValueError):
    """The bytes are not a valid encoding (truncated, unknown tag, over a limit)."""


def dumps(value: Any) -> bytes:
    out = [bytes((VERSION,))]
    _encode(value, out, 0)
    return b"".join(out)


def _encode(v: Any, out: list, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if v is None:
        out.append(b"N")
    elif v is True:
        out.append(b"T")
    elif v is False:
        out.append(b"F")
    elif isinstance(v, int):
        if -(1 << 63) <= v < (1 << 63):
            out.append(b"i" + _I64.pack(v))
        else:
            raw = v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True)
            out.append(b"I" + _U32.pack(len(raw)) + raw)
    elif isinstance(v, float):
        out.append(b"d" + _F64.pack(v))
    elif isinstance(v, str):
        raw = v.encode("utf-8", "surrogateescape")
        out.append(b"s" + _U32.pack(len(raw)))
        out.append(raw)
    elif isinstance(v, (bytes, bytearray, memoryview)):
        raw = bytes(v)
        out.append(b"b" + _U32.pack(len(raw)))
        out.append(raw)
    elif isinstance(v, (list, tuple)):
        out.append(b"l" + _U32.pack(len(v)))
        for item in v:
            _encode(item, out, depth + 1)
    elif isinstance(v, dict):
        out.append(b"m" + _U32.pack(len(v)))
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
    buf = memoryview(data)
    budget = [MAX_ITEMS]
    value, pos = _decode(buf, 1, 0, budget)
    if pos != len(buf):
        raise DecodeError("trailing bytes after value")
    return value


def _need(buf: memoryview, pos: int, n: int) -> None:
    if n < 0 or pos + n > len(buf):
        raise DecodeError("truncated value")


def _decode(buf: memoryview, pos: int, depth: int, budget: list) -> tuple:
    if depth > MAX_DEPTH:
        raise DecodeError("value nested too deeply")
    budget[0] -= 1
    if budget[0] < 0:
        raise DecodeError("too many items")
    _need(buf, pos, 1)
    tag = buf[pos]
    pos += 1
    if tag == 0x4E:  # N
        return None, pos
    if tag == 0x54:  # T
        return True, pos
    if tag == 0x46:  # F
        return False, pos
    if tag == 0x69:  # i
        _need(buf, pos, 8)
        return _I64.unpack_from(buf, pos)[0], pos + 8
    if tag == 0x64:  # d
        _need(buf, pos, 8)
        return _F64.unpack_from(buf, pos)[0], pos + 8
    if tag in (0x49, 0x73, 0x62):  # I, s, b: length-prefixed
        _need(buf, pos, 4)
        n = _U32.unpack_from(buf, pos)[0]
        pos += 4
        _need(buf, pos, n)
        raw = bytes(buf[pos:pos + n])
        pos += n
        if tag == 0x49:
            return int.from_bytes(raw, "big", signed=True), pos
        if tag == 0x73:
            try:
                return raw.decode("utf-8", "surrogateescape"), pos
            except UnicodeDecodeError:
                raise DecodeError("invalid UTF-8 in string") from None
        return raw, pos
    if tag == 0x6C:  # l
        _need(buf, pos, 4)
        n = _U32.unpack_from(buf, pos)[0]
        pos += 4
        # Every item takes at least one byte: a count larger than what is left is a lie.
        _need(buf, pos, n)
        items = []
        for _ in range(n):
            item, pos = _decode(buf, pos, depth + 1, budget)
            items.append(item)
        return items, pos
    if tag == 0x6D:  # m
        _need(buf, pos, 4)
        n = _U32.unpack_from(buf, pos)[0]
        pos += 4
        _need(buf, pos, 2 * n)
        result = {}
        for _ in range(n):
            key, pos = _decode(buf, pos, depth + 1, budget)
            if isinstance(key, (list, dict)):
                raise DecodeError("unhashable dict key")
            value, pos = _decode(buf, pos, depth + 1, budget)
            result[key] = value
        return result, pos
    raise DecodeError("unknown tag 0x%02x" % tag)
