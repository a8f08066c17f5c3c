"""The ranges of every number a user gives, defined once.

The command line, the YAML loader and the session daemon's request schemas all
check against these, so `--fanout 0`, `fanout: 0` in a cluster file and a
library call with fanout 0 get the same answer.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Dict, Tuple, Union
    Number = Union[int, float]

# name -> (lowest, highest, what it is, in the user's words)
RANGES: Dict[str, Tuple[Number, Number, str]] = {
    # Agents one `explore --local` starts on this machine. Each is a Python
    # process of ~10 MB; 10,000 is far past what one machine holds usefully.
    "local": (0, 10000, "local agents"),
    # Children one agent bootstraps at once.
    "fanout": (1, 1000, "children per agent"),
    # Seconds one host's bootstrap may take (a batch queue may need hours).
    "timeout": (0.1, 7 * 24 * 3600.0, "seconds"),
    "port": (1, 65535, "a TCP port"),
    # Slots (CPUs) a node offers or a recipe takes.
    "slots": (1, 4096, "slots"),
    # Bytes from which `gxpc make` pushes an input instead of the node pulling
    # it (2^62 stands for inf: pull everything).
    "pull_threshold": (0, 1 << 62, "bytes, or inf"),
    # Transfers one node receives at once (gxpc make).
    "transfer_slots": (1, 64, "transfers at once"),
    # Bytes of replicas one mount's store keeps on a node (-o cache_size=):
    # under 1 MiB no transfer fits; 1 EiB stands for "no bound".
    "cache_size": (1 << 20, 1 << 60, "bytes"),
    # Seconds a mount's branch host may leave a request unanswered before its
    # files give EIO (sshfsm and gxpc mount -o timeout=N).
    "mount_timeout": (1, 3600, "seconds"),
    # `gxpc make -j N`: GNU make puts N-1 tokens in its jobserver pipe before
    # reading a makefile, and a Linux pipe holds 65,536 bytes, so from 65,538
    # on make blocks forever on its own pipe (GNU Make 4.3, measured).
    "jobs": (1, 65536, "jobs at once"),
    # Agents an elastic pool (`use ... --elastic MIN-MAX`) holds at most: each
    # is a batch job of its own, and a queue refuses more long before this.
    "elastic": (0, 4096, "agents"),
    # Seconds a ready task waits for a slot before the pool submits an agent
    # for it, and an agent stays idle before the pool releases it.
    "elastic_wait": (0, 24 * 3600.0, "seconds"),
    "elastic_idle": (0, 7 * 24 * 3600.0, "seconds"),
}

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


class RangeError(ValueError):
    """A number out of its documented range; the message is for the user."""


def check(name: str, value: Number, what: str = "") -> Number:
    """`value` if it is inside RANGES[name], else RangeError naming the range."""
    lo, hi, unit = RANGES[name]
    label = what or name
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise RangeError("%s must be a number, got %r" % (label, value))
    if isinstance(lo, int) and isinstance(hi, int) and not isinstance(value, int):
        if value != int(value):
            raise RangeError("%s must be a whole number, got %r" % (label, value))
        value = int(value)
    if not lo <= value <= hi:
        raise RangeError("%s must be from %s to %s (%s), got %s" % (label, _fmt(lo), _fmt(hi),
                                                                    unit, _fmt(value)))
    return value


def _fmt(x: Number) -> str:
    if isinstance(x, float) and x.is_integer():   # False for inf and nan
        return str(int(x))
    return str(x)


def size_value(text: str) -> float:
    """The bytes a size a user wrote stands for (4096, 512K, 512M, 4G, 1.5G,
    4GiB, 4GB: binary units), unchecked; nan if it is not a size."""
    t = text.strip().upper()
    for suffix in ("IB", "B"):
        if t.endswith(suffix) and t[:-len(suffix)][-1:].isalpha():
            t = t[:-len(suffix)]
            break
    unit = t[-1:] if t[-1:] and t[-1:] in _UNITS else ""
    try:
        return float(t[:-1] if unit else t) * _UNITS[unit]
    except ValueError:
        return float("nan")


def parse_size(text: str, name: str, what: str = "") -> int:
    """A size a user wrote (size_value) checked against RANGES[name];
    RangeError in the user's words otherwise."""
    label = what or name
    n = size_value(text)
    if n != n or n in (float("inf"), float("-inf")):
        raise RangeError("%s must be a size such as 512M or 4G, got %r" % (label, text))
    lo, hi, _ = RANGES[name]
    if not lo <= n <= hi:
        raise RangeError("%s must be from %s to %s, got %r" % (label, _size(lo), _size(hi), text))
    return int(n)


def _size(n: Number) -> str:
    """1M, 1024P: the largest binary unit that divides n."""
    for unit in ("P", "T", "G", "M", "K"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return "%d%s" % (n // _UNITS[unit], unit)
    return str(n)
