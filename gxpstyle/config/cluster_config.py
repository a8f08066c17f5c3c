"""Cluster description files: everything `gxpc use` and `gxpc explore` can say, in YAML.

    # every key optional
    fanout: 8            # default max children per agent
    timeout: 20          # default seconds for one host's bootstrap
    python: python3      # default remote interpreter
    use:                 # rules: channel, from, to, and any option of use_rules.OPTIONS
      - {channel: ssh, from: head, to: "tb[[01-04]]", user: alice}
      - {channel: slurm, from: tb01, to: "tc[[01-16]]", queue: debug}
    clusters:            # named groups whose settings override the defaults
      tc: {hosts: "tc[[01-16]]", fanout: 4, timeout: 60, python: /usr/bin/python3}
    explore: ["tb[[01-04]]", "tc[[01-16]]"]   # `gxpc explore --config F` with no targets

The file is parsed with yaml.compose on a SafeLoader, never constructed: only the
plain YAML types (map, seq, str, int, float, bool, null) are accepted, every other
tag and every alias is an error, so a file cannot build an arbitrary object or
blow up by alias expansion. Each node keeps its line, and every error is one line,
`<file>:<line>: <what is wrong>`, at the node that is wrong. Rule checks are
use_rules.make_rule's own and numbers have limits.RANGES's ranges, so a file and
the command line reject the same things in the same words.

Where a plain scalar resolved to a number but a string is wanted, its source text
is used: `job_time: 1:00:00` is "1:00:00" (not YAML 1.1's sexagesimal 3600) and
`user: 007` is "007".
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gxpstyle.config import hostpattern, limits, safe_paths
from gxpstyle.config.use_rules import CHANNELS, OPTIONS, RuleError, UseRule, make_rule

DEFAULT_FANOUT = 8
DEFAULT_TIMEOUT = 20.0
DEFAULT_PYTHON = "python3"

TOP_KEYS = ("fanout", "timeout", "python", "use", "clusters", "explore")
CLUSTER_KEYS = ("hosts", "fanout", "timeout", "python")
RULE_KEYS = ("channel", "from", "to")

_TAG = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL = (_TAG + t for t in ("str", "int", "float", "bool", "null"))
_TIMESTAMP, _SEQ, _MAP = _TAG + "timestamp", _TAG + "seq", _TAG + "map"


class ConfigError(ValueError):
    """A cluster file is unreadable or wrong; str() is `<file>:<line>: <what>`."""

    def __init__(self, filename: str, line: Optional[int], message: str) -> None:
        self.filename = filename
        self.line = line
        self.message = " ".join(str(message).splitlines()) or "error"   # always one line
        where = filename if line is None else "%s:%d" % (filename, line)
        super().__init__("%s: %s" % (where, self.message))


@dataclass
class ClusterSettings:
    name: str
    hosts: str
    fanout: Optional[int] = None
    timeout: Optional[float] = None
    python: Optional[str] = None


@dataclass(eq=False)
class ClusterConfig:
    use: List[UseRule] = field(default_factory=list)
    explore: List[str] = field(default_factory=list)
    fanout: int = DEFAULT_FANOUT
    timeout: float = DEFAULT_TIMEOUT
    python: str = DEFAULT_PYTHON
    clusters: List[ClusterSettings] = field(default_factory=list)

    def __eq__(self, other: object) -> bool:
        # UseRule leaves options out of its own equality; a config compares them.
        if not isinstance(other, ClusterConfig):
            return NotImplemented
        return (self._key() == other._key())

    def _key(self) -> Tuple[Any, ...]:
        return ([r.to_dict() for r in self.use], self.explore, self.fanout,
                self.timeout, self.python, self.clusters)

    def cluster_for(self, host: str) -> Optional[ClusterSettings]:
        """The first cluster, in file order, whose hosts pattern matches host."""
        for c in self.clusters:
            if hostpattern.matches(c.hosts, host):
                return c
        return None

    def settings_for(self, host: str, rule: Optional[UseRule] = None) -> Dict[str, Any]:
        """{"fanout", "timeout", "python"} for host.

        A matching cluster's settings override the file defaults; when the rule that
        reaches host is given, its own fanout/timeout/python options override both.
        """
        s: Dict[str, Any] = {"fanout": self.fanout, "timeout": self.timeout, "python": self.python}
        c = self.cluster_for(host)
        if c is not None:
            for k in ("fanout", "timeout", "python"):
                v = getattr(c, k)
                if v is not None:
                    s[k] = v
        if rule is not None:
            for k in ("fanout", "timeout", "python"):
                if k in rule.options:
                    s[k] = rule.options[k]
        return s

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"fanout": self.fanout, "timeout": float(self.timeout),
                             "python": self.python}
        d["use"] = [r.to_dict() for r in self.use]
        clusters: Dict[str, Any] = {}
        for c in self.clusters:
            cd: Dict[str, Any] = {"hosts": c.hosts}
            for k in ("fanout", "timeout", "python"):
                if getattr(c, k) is not None:
                    cd[k] = getattr(c, k)
            clusters[c.name] = cd
        d["clusters"] = clusters
        d["explore"] = list(self.explore)
        return d

    def to_yaml(self) -> str:
        """YAML that load()s back to a config equal to this one."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False,
                              allow_unicode=True, width=1 << 16)


def default_path() -> str:
    """$GXP_CLUSTERS, else $XDG_CONFIG_HOME/gxpstyle/clusters.yaml (XDG default ~/.config)."""
    p = os.environ.get("GXP_CLUSTERS")
    if p:
        return p
    base = os.environ.get("XDG_CONFIG_HOME")
    if not base or not os.path.isabs(base):     # the XDG spec ignores relative paths
        base = os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "gxpstyle", "clusters.yaml")


# A cluster file is read whole: at most 1 MiB (a few thousand clusters), and
# nested at most 64 levels deep (the format itself needs 4).
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 64


def load(path: str) -> ClusterConfig:
    try:
        data = safe_paths.read_capped(path, MAX_FILE_BYTES)
    except FileNotFoundError:
        raise ConfigError(path, None, "no such file") from None
    except safe_paths.PathRefused as e:
        raise ConfigError(path, None, e.why) from None
    except OSError as e:
        raise ConfigError(path, None, e.strerror or str(e)) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(path, data.count(b"\n", 0, e.start) + 1, "not UTF-8 text") from None
    return loads(text, path)


def loads(text: str, filename: str = "<string>") -> ClusterConfig:
    return _Reader(filename).config(_compose(text, filename))


# -- parsing ---------------------------------------------------------------------

class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader composition that refuses aliases (no shared nodes, no alias bombs)."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            ev = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*%s) are not supported; write the value out"
                % ev.anchor, ev.start_mark)
        if self.depth >= MAX_DEPTH:     # composing recurses: a deep file must not exhaust the stack
            raise yaml.composer.ComposerError(
                None, None, "nested more than %d levels deep" % MAX_DEPTH, self.peek_event().start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _compose(text: str, filename: str) -> Optional[Node]:
    loader = None
    try:
        loader = _NoAliasLoader(text)
        return loader.get_single_node()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise ConfigError(filename, mark.line + 1 if mark else 1, _yaml_message(e)) from None
    except yaml.reader.ReaderError as e:
        raise ConfigError(filename, text.count("\n", 0, e.position) + 1,
                          "character U+%04X is not allowed in YAML" % e.character) from None
    except yaml.YAMLError as e:
        raise ConfigError(filename, 1, str(e)) from None
    finally:
        if loader is not None:
            loader.dispose()


def _yaml_message(e: yaml.MarkedYAMLError) -> str:
    problem, context = e.problem or "", e.context or ""
    if problem and context:
        if context.startswith("while "):
            return "%s (%s)" % (problem, context)
        return "%s %s" % (context, problem)
    return problem or context or "YAML syntax error"


def _kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == _NULL:
        return "null"
    if node.tag == _BOOL:
        return "a boolean"
    if node.tag in (_INT, _FLOAT):
        return "a number"
    return "a string %r" % node.value


def _suggest(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return " (did you mean %r?)" % close[0] if close else ""


class _Reader:
    def __init__(self, filename: str) -> None:
        self.filename = filename
        self._constructor = yaml.constructor.SafeConstructor()

    def error(self, node: Node, message: str) -> ConfigError:
        return ConfigError(self.filename, node.start_mark.line + 1, message)

    # generic node -> value

    def check_tag(self, node: Node) -> None:
        ok = {MappingNode: (_MAP,), SequenceNode: (_SEQ,),
              ScalarNode: (_STR, _INT, _FLOAT, _BOOL, _NULL, _TIMESTAMP)}[type(node)]
        if node.tag not in ok:
            raise self.error(node, "YAML tag %s is not allowed here" % node.tag)

    def value(self, node: Node) -> Any:
        """Plain Python data for node: dict, list, str, int, float, bool or None."""
        self.check_tag(node)
        if isinstance(node, MappingNode):
            return {k: self.value(v) for k, (_, v) in self.mapping(node).items()}
        if isinstance(node, SequenceNode):
            return [self.value(n) for n in node.value]
        if node.tag in (_STR, _TIMESTAMP):
            return node.value
        try:
            return self._constructor.construct_object(node)
        except yaml.YAMLError as e:
            raise self.error(node, getattr(e, "problem", None) or str(e)) from None

    def mapping(self, node: Node, what: str = "this") -> Dict[str, Tuple[Node, Node]]:
        """key -> (key node, value node); keys must be strings and unique."""
        self.check_tag(node)
        if not isinstance(node, MappingNode):
            raise self.error(node, "%s must be a mapping, not %s" % (what, _kind(node)))
        out: Dict[str, Tuple[Node, Node]] = {}
        for k, v in node.value:
            self.check_tag(k)
            if not isinstance(k, ScalarNode):
                raise self.error(k, "a key must be a plain name, not %s" % _kind(k))
            if k.value in out:
                raise self.error(k, "duplicate key %r (first on line %d)"
                                 % (k.value, out[k.value][0].start_mark.line + 1))
            out[k.value] = (k, v)
        return out

    def check_keys(self, m: Dict[str, Tuple[Node, Node]], valid: Any, what: str) -> None:
        for name, (k, _) in m.items():
            if name not in valid:
                raise self.error(k, "unknown %s %r%s" % (what, name, _suggest(name, valid)))

    # typed values

    def string(self, node: Node, what: str) -> str:
        v = self.value(node)
        if isinstance(v, (int, float)) and not isinstance(v, bool) \
                and isinstance(node, ScalarNode) and node.style is None:
            v = node.value          # job_time: 1:00:00, user: 007 -> their text
        if not isinstance(v, str):
            raise self.error(node, "%s must be a string, not %s" % (what, _kind(node)))
        if not v:
            raise self.error(node, "%s must not be empty" % what)
        return v

    def strings(self, node: Node, what: str) -> List[str]:
        """A list of strings; a single string is a list of one."""
        self.check_tag(node)
        if isinstance(node, SequenceNode):
            return [self.string(n, what + " item") for n in node.value]
        if isinstance(node, ScalarNode) and node.tag != _NULL:
            return [self.string(node, what)]
        raise self.error(node, "%s must be a list of strings, not %s" % (what, _kind(node)))

    def pattern(self, node: Node, what: str) -> str:
        p = self.string(node, what)
        try:
            hostpattern.compile_pattern(p)
        except hostpattern.PatternError as e:
            raise self.error(node, "%s: %s" % (what, e)) from None
        return p

    def whole_number(self, node: Node, what: str) -> int:
        """An integer in limits.RANGES[what] (fanout)."""
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(node, "%s must be an integer, not %s" % (what, _kind(node)))
        return int(self.in_range(node, what, v))

    def seconds(self, node: Node, what: str) -> float:
        """A number of seconds in limits.RANGES[what] (timeout)."""
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.error(node, "%s must be a number of seconds, not %s" % (what, _kind(node)))
        return float(self.in_range(node, what, v))

    def in_range(self, node: Node, what: str, value: Any) -> Any:
        try:
            return limits.check(what, value)
        except limits.RangeError as e:
            raise self.error(node, str(e)) from None

    # the file

    def config(self, root: Optional[Node]) -> ClusterConfig:
        cfg = ClusterConfig()
        if root is None or self.is_null(root):     # empty file, only comments, or `---`
            return cfg
        m = self.mapping(root, "the top level")
        self.check_keys(m, TOP_KEYS, "top-level key")
        if "fanout" in m:
            cfg.fanout = self.whole_number(m["fanout"][1], "fanout")
        if "timeout" in m:
            cfg.timeout = self.seconds(m["timeout"][1], "timeout")
        if "python" in m:
            cfg.python = self.string(m["python"][1], "python")
        if "use" in m:
            cfg.use = self.rules(m["use"][1])
        if "clusters" in m:
            cfg.clusters = self.clusters(m["clusters"][1])
        if "explore" in m:
            node = m["explore"][1]
            if not (isinstance(node, ScalarNode) and node.tag == _NULL):
                items = node.value if isinstance(node, SequenceNode) else [node]
                self.strings(node, "explore")          # type errors first
                cfg.explore = [self.pattern(n, "explore target") for n in items]
        return cfg

    def rules(self, node: Node) -> List[UseRule]:
        self.check_tag(node)
        if isinstance(node, ScalarNode) and node.tag == _NULL:
            return []
        if not isinstance(node, SequenceNode):
            raise self.error(node, "use must be a list of rules, not %s" % _kind(node))
        return [self.rule(n) for n in node.value]

    def rule(self, node: Node) -> UseRule:
        m = self.mapping(node, "a use rule")
        self.check_keys(m, RULE_KEYS + tuple(OPTIONS), "use rule key")
        for k in RULE_KEYS:
            if k not in m:
                raise self.error(node, "use rule needs %r" % k)
        chan_node = m["channel"][1]
        channel = self.string(chan_node, "channel")
        if channel not in CHANNELS:
            raise self.error(chan_node, "unknown channel %r (one of: %s)%s"
                             % (channel, ", ".join(CHANNELS), _suggest(channel, CHANNELS)))
        src = self.pattern(m["from"][1], "from")
        dst = self.pattern(m["to"][1], "to")
        options: Dict[str, Any] = {}
        for name, (_, vnode) in m.items():
            if name in RULE_KEYS:
                continue
            typ = OPTIONS[name][0]
            if typ is str:
                options[name] = self.string(vnode, name)
            elif typ is list:
                options[name] = self.strings(vnode, name)
            else:
                options[name] = self.value(vnode)
        try:
            return make_rule(channel, src, dst, options)
        except RuleError as e:
            raise self.error(self.locate(e, channel, src, dst, options, node, m), str(e)) from None

    def locate(self, err: RuleError, channel: str, src: str, dst: str, options: Dict[str, Any],
               node: Node, m: Dict[str, Tuple[Node, Node]]) -> Node:
        """The node make_rule objected to: the first option that fails on its own
        (its key when the option does not apply, its value when the value is bad),
        else the whole rule."""
        for name, value in options.items():
            probe = {name: value}
            if channel == "sh" and name != "template":
                probe["template"] = "{cmd}"
            if name in ("elastic_wait", "elastic_idle") and "elastic" in options:
                probe["elastic"] = "0-0"     # judged on their own, not on a bad range
            try:
                make_rule(channel, src, dst, probe)
            except RuleError:
                applies = OPTIONS[name][1]
                key, val = m[name]
                return key if applies != "*" and channel not in applies else val
        return node

    def clusters(self, node: Node) -> List[ClusterSettings]:
        self.check_tag(node)
        if isinstance(node, ScalarNode) and node.tag == _NULL:
            return []
        out = []
        for name, (knode, vnode) in self.mapping(node, "clusters").items():
            self.check_tag(vnode)
            if not isinstance(vnode, MappingNode):
                raise self.error(knode if isinstance(vnode, ScalarNode) and vnode.tag == _NULL
                                 else vnode, "cluster %r must be a mapping with hosts, not %s"
                                 % (name, _kind(vnode)))
            cm = self.mapping(vnode)
            self.check_keys(cm, CLUSTER_KEYS, "cluster key")
            if "hosts" not in cm:
                raise self.error(knode, "cluster %r has no hosts" % name)
            c = ClusterSettings(name, self.pattern(cm["hosts"][1], "hosts"))
            if "fanout" in cm and not self.is_null(cm["fanout"][1]):
                c.fanout = self.whole_number(cm["fanout"][1], "fanout")
            if "timeout" in cm and not self.is_null(cm["timeout"][1]):
                c.timeout = self.seconds(cm["timeout"][1], "timeout")
            if "python" in cm and not self.is_null(cm["python"][1]):
                c.python = self.string(cm["python"][1], "python")
            out.append(c)
        return out

    def is_null(self, node: Node) -> bool:
        self.check_tag(node)
        return isinstance(node, ScalarNode) and node.tag == _NULL
