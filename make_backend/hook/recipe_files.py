"""What the relay tells the head about a recipe's files and placement hints.

make never tells its shell which names are the target and the prerequisites,
and we do not read the makefile; but by the time a recipe reaches us, `$@`,
`$<` and `$^` are expanded into its command. So the relay sends, as the job's
`inputs`, every word of the command that names a path (relative words taken
from the recipe's cwd): the head keeps those the replica catalog knows as the
recipe's inputs (placement) and, once the recipe succeeds, asks the node that
ran it which of them its export now holds (its outputs, for the catalog and
the other nodes' caches). A word that names no file costs nothing.

Hints come from make's environment for the recipe. A target-specific
variable reaches a recipe's environment only when exported, so a makefile
writes `big.bam: export GXP_ON = tb03` (or `export GXP_ON` once, globally);
`gxpc make` also puts GXP_ON, GXP_PLACE and GXP_SLOTS, empty, into make's
environment when the user's lacks them: make exports a variable that came
from its environment, so plain `big.bam: GXP_ON = tb03` works too. They are
taken out of the environment the recipe runs with.

The WOSS hint `user.sshfsmux.dp` is read (getxattr through the mount, once per
directory per make) on the directories of the recipe's paths.

Head side (the `gxpc make` process); standard library.
"""
from __future__ import annotations

import os
import re
import shlex
from typing import Dict, List, Optional, Tuple

HINT_VARS = ("GXP_ON", "GXP_PLACE", "GXP_SLOTS")
MAX_WORDS = 4096
XA_DP = "user.sshfsmux.dp"
_STRIP = "<>|&;()'\"`"
_C_FLAG = re.compile(r"-[A-Za-z]*c[A-Za-z]*$")   # sh -c, bash -ec, .SHELLFLAGS' -c
_QUOTING = "'\"\\"   # what shlex.split treats otherwise than str.split


def split_hints(env: Dict[str, Optional[str]]) -> Dict[str, str]:
    """Take the placement hints out of a recipe's environment (in place)."""
    out: Dict[str, str] = {}
    for k in HINT_VARS:
        v = env.pop(k, None)
        if v and v.strip():
            out[k] = v.strip()
    return out


def hint_args(hints: Dict[str, str]) -> Dict[str, object]:
    """The job request's fields for the hints; ValueError in the user's words."""
    args: Dict[str, object] = {}
    if "GXP_ON" in hints:
        args["on"] = hints["GXP_ON"]
    place = hints.get("GXP_PLACE", "").lower()
    if place:
        if place not in ("hard", "soft", "load"):
            raise ValueError("GXP_PLACE=%s: give hard, soft or load" % hints["GXP_PLACE"])
        args["place"] = place
    if "GXP_SLOTS" in hints:
        from gxpstyle.config import limits
        try:
            n = int(hints["GXP_SLOTS"])
        except ValueError:
            raise ValueError("GXP_SLOTS=%s: give a whole number of slots" % hints["GXP_SLOTS"])
        args["slots"] = limits.check("slots", n, "GXP_SLOTS")
    return args


def command_paths(cmd: str, cwd: str) -> List[str]:
    """Absolute, normalized paths named by the words of a recipe's command."""
    if any(c in cmd for c in _QUOTING):
        try:
            words = shlex.split(cmd, posix=True)
        except ValueError:
            words = cmd.split()
    else:   # what shlex.split gives, without its cost (most recipes)
        words = cmd.split()
    return word_paths(words, cwd)


def recipe_paths(argv: List[str], cwd: str) -> List[str]:
    """Paths named by the command make would run: a shell's recipe (the
    word after its -c flag), or the words of a program make execs without a
    shell (never the relay's wrapper around it: relay.node_command)."""
    if any(_C_FLAG.match(w) for w in argv[1:-1]):
        return command_paths(argv[-1], cwd)
    return word_paths(argv, cwd)


def word_paths(words: List[str], cwd: str) -> List[str]:
    """Absolute, normalized paths named by a command's words."""
    out: List[str] = []
    seen = set()
    if words and "/" not in words[0] and "=" not in words[0]:
        # the program: the shell looks a word without "/" up in PATH, never
        # in the cwd (and no settle for cwd/echo in every recipe)
        words = words[1:]
    for w in words[:MAX_WORDS]:
        for part in w.split("="):
            part = part.strip(_STRIP)
            if not part or part.startswith("-") or "$" in part or "\0" in part:
                continue
            p = os.path.normpath(os.path.join(cwd, part))
            if p not in seen and len(p) < 4096:
                seen.add(p)
                out.append(p)
    return out


class DirHints:
    """user.sshfsmux.dp of directories, read once each through the mount."""

    def __init__(self) -> None:
        self.cache: Dict[str, str] = {}

    def of(self, paths: List[str], cwd: str) -> Tuple[str, str]:
        """(hint, directory) of the first directory among `paths`' (and cwd) that has one."""
        dirs = [cwd] + [os.path.dirname(p) for p in paths]
        seen = set()
        for d in dirs:
            if d in seen:
                continue
            seen.add(d)
            v = self.cache.get(d)
            if v is None:
                try:
                    v = os.getxattr(d, XA_DP).decode("ascii", "replace").strip() \
                        if hasattr(os, "getxattr") else ""
                except OSError:
                    v = ""
                if len(self.cache) > 4096:
                    self.cache.clear()
                self.cache[d] = v
            if v:
                return v, d
        return "", ""
