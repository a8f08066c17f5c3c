"""`use` rules: which hosts reach which, by which channel, with which options.

`gxpc use CHANNEL SRC DST` and the `use:` list of a cluster YAML file both produce
UseRule values; the spanning-tree planner consumes them. Options are checked here,
once, so the CLI and the YAML loader report the same errors.

A batch rule may be elastic (`elastic: MIN-MAX`, `--elastic 0-16`): its DST
pattern then names the agents of a pool the head grows and shrinks with the
demand of `gxpc make` (gxpstyle/head/elastic.py). The pattern must expand to
names (no `*`), at least MAX of them: each agent takes a free one, so `gxpc
stat` and GXP_ON can name it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from gxpstyle.config import hostpattern, limits

CHANNELS = ("local", "ssh", "paramiko", "rsh", "sh", "torque", "slurm")

# option name -> (type, channels it applies to). "*" means every channel.
OPTIONS: Dict[str, Any] = {
    "user": (str, ("ssh", "paramiko", "rsh")),
    "port": (int, ("ssh", "paramiko")),
    "identity_file": (str, ("ssh", "paramiko")),
    "ssh_options": (list, ("ssh",)),
    "template": (str, ("sh",)),
    "python": (str, "*"),
    "timeout": ((int, float), "*"),
    "fanout": (int, "*"),
    "queue": (str, ("torque", "slurm")),
    "batch_options": (list, ("torque", "slurm")),
    "connect_host": (str, ("torque", "slurm")),
    "job_time": (str, ("torque", "slurm")),
    "elastic": (str, ("torque", "slurm")),
    "elastic_wait": ((int, float), ("torque", "slurm")),
    "elastic_idle": ((int, float), ("torque", "slurm")),
}
# A batch queue starts a job in seconds to minutes: a recipe that waited 5 s
# for a slot is worth a job; an agent idle for a minute is worth giving back
# (holding it costs the allocation, starting another costs the queue's wait).
ELASTIC_WAIT = 5.0
ELASTIC_IDLE = 60.0


class RuleError(ValueError):
    """A use rule names an unknown channel or option, or a bad pattern or value."""


@dataclass(frozen=True)
class UseRule:
    channel: str
    src: str
    dst: str
    options: Dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def reaches(self, src_names: List[str], dst: str) -> bool:
        """True when a node known by any of src_names may reach dst by this rule."""
        if not hostpattern.matches(self.dst, dst):
            return False
        return any(hostpattern.matches(self.src, n) for n in src_names)

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"channel": self.channel, "from": self.src, "to": self.dst}
        d.update(self.options)
        return d


def make_rule(channel: str, src: str, dst: str, options: Dict[str, Any] | None = None) -> UseRule:
    options = dict(options or {})
    if channel not in CHANNELS:
        raise RuleError("unknown channel %r (one of: %s)" % (channel, ", ".join(CHANNELS)))
    for pat in (src, dst):
        if isinstance(pat, str) and any(ord(ch) < 32 or ord(ch) == 127 for ch in pat):
            # a rule is stored and listed one per line: a newline would split it
            raise RuleError("pattern %r has a control character (a newline, tab, ...)" % pat)
        try:
            hostpattern.compile_pattern(pat)
        except hostpattern.PatternError as e:
            raise RuleError(str(e))
    for name, value in options.items():
        if name not in OPTIONS:
            raise RuleError("unknown option %r for channel %s" % (name, channel))
        typ, applies = OPTIONS[name]
        if applies != "*" and channel not in applies:
            raise RuleError("option %r does not apply to channel %s" % (name, channel))
        if isinstance(value, bool) or not isinstance(value, typ):
            raise RuleError("option %r has a bad value %r" % (name, value))
        if name in ("ssh_options", "batch_options") and not all(isinstance(x, str) for x in value):
            raise RuleError("option %r must be a list of strings" % name)
        if name in ("port", "fanout", "timeout", "elastic_wait", "elastic_idle"):
            try:
                limits.check(name, value, "option %r" % name)
            except limits.RangeError as e:
                raise RuleError(str(e)) from None
    if "elastic" in options:
        check_elastic(dst, options["elastic"])
    for name in ("elastic_wait", "elastic_idle"):
        if name in options and "elastic" not in options:
            raise RuleError("option %r needs 'elastic' (MIN-MAX agents, e.g. 0-16)" % name)
    if channel == "sh" and "template" not in options:
        raise RuleError("channel sh needs a template, e.g. 'docker exec -i {host} {cmd}'")
    return UseRule(channel, src, dst, options)


def parse_elastic(text: str) -> Tuple[int, int]:
    """(MIN, MAX) of an `elastic` option, "0-16"; RuleError in the user's words."""
    lo_text, sep, hi_text = (part.strip() for part in str(text).partition("-"))
    digits = set("0123456789")
    if not (sep and lo_text and hi_text and set(lo_text + hi_text) <= digits):
        raise RuleError("elastic must be MIN-MAX agents, e.g. 0-16, got %r" % text)
    lo, hi = int(lo_text), int(hi_text)
    for what, n in (("MIN", lo), ("MAX", hi)):
        try:
            limits.check("elastic", n, "elastic %s" % what)
        except limits.RangeError as e:
            raise RuleError(str(e)) from None
    if lo > hi:
        raise RuleError("elastic %s: MIN is more than MAX" % text)
    return lo, hi


def check_elastic(dst: str, text: str) -> None:
    """An elastic rule's range, and a DST that names at least MAX agents."""
    _, hi = parse_elastic(text)
    if hi == 0:
        return                      # a pool that never grows names no agent
    try:
        names = len(hostpattern.expand(dst))
    except hostpattern.PatternError:
        raise RuleError("elastic: %r cannot name the pool's agents; give a pattern such as "
                        "'job[[1-16]]'" % dst) from None
    if names < hi:
        raise RuleError("elastic %s: %r names only %d agent%s" % (text, dst, names,
                                                                "s" * (names != 1)))


def elastic_of(rule: UseRule) -> Optional[Tuple[int, int, float, float]]:
    """(MIN, MAX, wait, idle) of an elastic rule, None for any other."""
    text = rule.options.get("elastic")
    if text is None:
        return None
    lo, hi = parse_elastic(text)
    return (lo, hi, float(rule.options.get("elastic_wait", ELASTIC_WAIT)),
            float(rule.options.get("elastic_idle", ELASTIC_IDLE)))


def rule_from_dict(d: Dict[str, Any]) -> UseRule:
    d = dict(d)
    try:
        channel = d.pop("channel")
        src = d.pop("from")
        dst = d.pop("to")
    except KeyError as e:
        raise RuleError("use rule needs %s" % e)
    return make_rule(channel, src, dst, d)
