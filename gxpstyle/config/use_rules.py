"""`use` rules: which hosts reach which, by which channel, with which options.

`gxpc use CHANNEL SRC DST` and the `use:` list of a cluster YAML file both produce
UseRule values; the spanning-tree planner consumes them. Options are checked here,
once, so the CLI and the YAML loader report the same errors.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

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
}


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
        if name in ("port", "fanout", "timeout"):
            try:
                limits.check(name, value, "option %r" % name)
            except limits.RangeError as e:
                raise RuleError(str(e)) from None
    if channel == "sh" and "template" not in options:
        raise RuleError("channel sh needs a template, e.g. 'docker exec -i {host} {cmd}'")
    return UseRule(channel, src, dst, options)


def rule_from_dict(d: Dict[str, Any]) -> UseRule:
    d = dict(d)
    try:
        channel = d.pop("channel")
        src = d.pop("from")
        dst = d.pop("to")
    except KeyError as e:
        raise RuleError("use rule needs %s" % e)
    return make_rule(channel, src, dst, d)
