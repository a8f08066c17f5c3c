"""The shape of the names a user gives gxpc: variables (`export`) and masks.

Numbers have their ranges in limits.py; this is the same for names. Each check
returns the reason in the user's words, or None when the name is fine. No
imports: the client loads this on every start.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

_NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME_REST = _NAME_START | frozenset("0123456789")


def env_name_problem(name: str) -> Optional[str]:
    """A variable name a POSIX shell accepts: [A-Za-z_][A-Za-z0-9_]*."""
    if not name:
        return "a variable needs a name (VAR=VALUE)"
    if name[0] not in _NAME_START or any(c not in _NAME_REST for c in name):
        return "%r is not a variable name (letters, digits and _, not starting with a digit)" % name
    return None


def mask_name_problem(name: str) -> Optional[str]:
    """A saved mask's name: non-empty and printable, without blanks."""
    if not name:
        return "a mask needs a name"
    if not name.isprintable() or any(c.isspace() for c in name):
        return "%r is not a mask name (no blanks or control characters)" % name
    return None
