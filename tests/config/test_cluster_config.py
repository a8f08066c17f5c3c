from __future__ import annotations

import os
import textwrap

import pytest

from gxpstyle.config import cluster_config as cc
from gxpstyle.config.cluster_config import ClusterConfig, ClusterSettings, ConfigError
from gxpstyle.config.use_rules import make_rule

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(HERE, "..", "examples", "clusters.yaml")

BRIEF = """\
# every key optional
fanout: 8            # default max children per agent
timeout: 20          # default seconds for one host's bootstrap
python: python3      # default remote interpreter
use:                 # list of rules
  - {channel: ssh, from: head, to: "tb[[01-04]]", user: alice}
  - {channel: slurm, from: tb01, to: "tc[[01-16]]", queue: debug}
clusters:
  tc:
    hosts: "tc[[01-16]]"
    fanout: 4
    timeout: 60
    python: /usr/bin/python3
explore: ["tb[[01-04]]", "tc[[01-16]]"]
"""


def d(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# ---------------------------------------------------------------- loading

def test_brief_example():
    cfg = cc.loads(BRIEF)
    assert cfg.fanout == 8 and cfg.timeout == 20.0 and cfg.python == "python3"
    assert isinstance(cfg.timeout, float)
    assert [r.to_dict() for r in cfg.use] == [
        {"channel": "ssh", "from": "head", "to": "tb[[01-04]]", "user": "alice"},
        {"channel": "slurm", "from": "tb01", "to": "tc[[01-16]]", "queue": "debug"},
    ]
    assert cfg.clusters == [ClusterSettings("tc", "tc[[01-16]]", 4, 60.0, "/usr/bin/python3")]
    assert cfg.explore == ["tb[[01-04]]", "tc[[01-16]]"]


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n", "use:\nclusters:\nexplore:\n"])
def test_empty_means_defaults(text):
    assert cc.loads(text) == ClusterConfig()
    assert ClusterConfig() == ClusterConfig([], [], 8, 20.0, "python3", [])


def test_example_file_loads():
    cfg = cc.load(EXAMPLE)
    assert {r.channel for r in cfg.use} == {"ssh", "slurm"}
    gw = [r for r in cfg.use if r.src == "gw.example.org"]
    assert gw and gw[0].channel == "ssh"
    slurm = [r for r in cfg.use if r.channel == "slurm"][0]
    assert slurm.options["queue"] and slurm.options["job_time"] == "1:00:00"
    burst = [r for r in cfg.use if "elastic" in r.options]
    assert [r.options["elastic"] for r in burst] == ["0-32"]
    assert cfg.explore and cfg.clusters
    assert cc.loads(cfg.to_yaml()) == cfg


def test_every_cli_option_is_accepted():
    text = d("""
        use:
          - channel: ssh
            from: head
            to: "n[[1-4]]"
            user: u
            port: 2222
            python: /opt/py/bin/python3
            ssh_options: ["-oBatchMode=yes"]
            identity_file: ~/.ssh/id
            fanout: 3
            timeout: 7.5
          - channel: sh
            from: head
            to: "c[[1-2]]"
            template: "docker exec -i {host} {cmd}"
          - channel: torque
            from: head
            to: "q[[1-9]]"
            queue: batch
            batch_options: ["-l", "nodes=1"]
            connect_host: head.example.org
            job_time: "0:30:00"
            elastic: 0-9
            elastic_wait: 2
            elastic_idle: 30.5
          - {channel: local, from: head, to: loc1}
          - {channel: rsh, from: head, to: r1, user: u}
          - {channel: paramiko, from: head, to: p1, port: 22}
        """)
    cfg = cc.loads(text)
    assert [r.channel for r in cfg.use] == ["ssh", "sh", "torque", "local", "rsh", "paramiko"]
    assert cfg.use[0].options == {
        "user": "u", "port": 2222, "python": "/opt/py/bin/python3",
        "ssh_options": ["-oBatchMode=yes"], "identity_file": "~/.ssh/id",
        "fanout": 3, "timeout": 7.5}
    assert cfg.use[2].options["batch_options"] == ["-l", "nodes=1"]
    assert (cfg.use[2].options["elastic"], cfg.use[2].options["elastic_wait"],
            cfg.use[2].options["elastic_idle"]) == ("0-9", 2, 30.5)


def test_plain_scalars_read_as_text_where_text_is_wanted():
    cfg = cc.loads(d("""
        python: 3.10
        use:
          - {channel: slurm, from: head, to: n1, job_time: 1:00:00, queue: 42}
          - {channel: ssh, from: head, to: n2, user: 007, ssh_options: -oBatchMode=yes}
        """))
    assert cfg.python == "3.10"
    assert cfg.use[0].options == {"job_time": "1:00:00", "queue": "42"}
    assert cfg.use[1].options == {"user": "007", "ssh_options": ["-oBatchMode=yes"]}
    assert cc.loads(cfg.to_yaml()) == cfg


def test_explore_single_string_and_patterns():
    cfg = cc.loads("explore: tb01 tb[[02-03]]\n")
    assert cfg.explore == ["tb01 tb[[02-03]]"]


def test_head_kept_as_given():
    cfg = cc.loads("use: [{channel: ssh, from: myhost.example.org, to: n1}, "
                   "{channel: ssh, from: head, to: n2}]\n")
    assert [r.src for r in cfg.use] == ["myhost.example.org", "head"]


def test_null_cluster_settings_inherit():
    cfg = cc.loads("clusters:\n  a:\n    hosts: a1\n    fanout:\n    python: ~\n")
    assert cfg.clusters == [ClusterSettings("a", "a1", None, None, None)]


# ---------------------------------------------------------------- settings_for

def test_settings_for():
    cfg = cc.loads(BRIEF)
    assert cfg.settings_for("tc07") == {"fanout": 4, "timeout": 60.0, "python": "/usr/bin/python3"}
    assert cfg.settings_for("tb01") == {"fanout": 8, "timeout": 20.0, "python": "python3"}
    assert cfg.settings_for("tc17") == {"fanout": 8, "timeout": 20.0, "python": "python3"}
    assert cfg.settings_for("head") == {"fanout": 8, "timeout": 20.0, "python": "python3"}


def test_settings_for_partial_cluster_and_rule_override():
    cfg = cc.loads(d("""
        fanout: 10
        timeout: 5
        python: py
        clusters:
          a: {hosts: "a[[1-9]]", timeout: 30}
          b: {hosts: "a1 b*", fanout: 2}
        """))
    assert cfg.settings_for("a1") == {"fanout": 10, "timeout": 30.0, "python": "py"}  # first match
    assert cfg.settings_for("bxyz") == {"fanout": 2, "timeout": 5.0, "python": "py"}
    assert cfg.cluster_for("zzz") is None
    rule = make_rule("ssh", "head", "a[[1-9]]", {"python": "/x/python", "fanout": 3})
    assert cfg.settings_for("a2", rule) == {"fanout": 3, "timeout": 30.0, "python": "/x/python"}


# ---------------------------------------------------------------- round trip

def test_round_trip_tricky_values():
    cfg = ClusterConfig(
        use=[
            make_rule("ssh", "head", "tb[[01-04]]", {"user": "yes", "port": 22,
                                                    "ssh_options": ["-o", "null", "#x", "a: b"]}),
            make_rule("slurm", "tb01", "n[[000-015]],m1", {"job_time": "1:00:00", "queue": "007",
                                                           "timeout": 2.5}),
            make_rule("sh", "head", "c*", {"template": "docker exec -i {host} {cmd}"}),
        ],
        explore=["tb[[01-04]]", "n[[000-015]]", "10.0.0.1"],
        fanout=3, timeout=1.5, python="/usr/bin/python3 -u",
        clusters=[ClusterSettings("true", "n[[000-015]]", 2, None, "py"),
                  ClusterSettings("123", "m1", None, 9.0, None)],
    )
    text = cfg.to_yaml()
    back = cc.loads(text)
    assert back == cfg
    assert [r.options for r in back.use] == [r.options for r in cfg.use]
    assert back.to_yaml() == text


def test_equality_compares_rule_options():
    a = cc.loads("use: [{channel: ssh, from: head, to: n1, user: a}]\n")
    b = cc.loads("use: [{channel: ssh, from: head, to: n1, user: b}]\n")
    assert a != b


def test_round_trip_through_file(tmp_path):
    cfg = cc.loads(BRIEF)
    p = tmp_path / "c.yaml"
    p.write_text(cfg.to_yaml())
    assert cc.load(str(p)) == cfg


# ---------------------------------------------------------------- errors

ERRORS = [
    # (text, line, part of the message)
    ("fanout: 8\nuse: [\n  {channel: ssh\n", 4, "expected"),                   # YAML syntax
    ("fanout: 8\n  timeout: 3\n", 2, "mapping values are not allowed"),
    ("- a\n- b\n", 1, "the top level must be a mapping, not a list"),
    ("# c\n\nhello\n", 3, "the top level must be a mapping"),
    ("fanout: 8\nfanuot: 3\n", 2, "unknown top-level key 'fanuot' (did you mean 'fanout'?)"),
    ("fanout: 8\n\nexplor: [a]\n", 3, "did you mean 'explore'?"),
    ("fanout: 1\nfanout: 2\n", 2, "duplicate key 'fanout' (first on line 1)"),
    ('fanout: "8"\n', 1, "fanout must be an integer"),
    ("\nfanout: 2.5\n", 2, "fanout must be an integer"),
    ("fanout: true\n", 1, "fanout must be an integer, not a boolean"),
    ("x: 1\n", 1, "unknown top-level key 'x'"),
    ("python: py\nfanout: -1\n", 2, "fanout must be from 1 to 1000 (children per agent), got -1"),
    ("fanout: 0\n", 1, "fanout must be from 1 to 1000"),
    ("fanout: 1001\n", 1, "fanout must be from 1 to 1000"),
    ("timeout: -5\n", 1, "timeout must be from 0.1 to 604800 (seconds), got -5"),
    ("timeout: .inf\n", 1, "timeout must be from 0.1 to 604800"),
    ("timeout: .nan\n", 1, "timeout must be a number, got nan"),
    ("timeout: soon\n", 1, "timeout must be a number"),
    ("python: [a]\n", 1, "python must be a string"),
    ("python: ''\n", 1, "python must not be empty"),
    ("use:\n  channel: ssh\n", 2, "use must be a list"),
    ("use:\n  - ssh head tb01\n", 2, "a use rule must be a mapping"),
    ("use:\n  - channel: ssh\n    from: head\n", 2, "use rule needs 'to'"),
    ("use:\n  - {channel: ssh, from: head, to: a}\n  - {from: head, to: b}\n", 3,
     "use rule needs 'channel'"),
    ("use:\n  - channel: sssh\n    from: head\n    to: a\n", 2, "unknown channel 'sssh'"),
    ("use:\n  - from: head\n    to: a\n    channel: slrum\n", 4, "did you mean 'slurm'?"),
    ("use:\n  - channel: [ssh]\n    from: head\n    to: a\n", 2, "channel must be a string"),
    ("use:\n  - channel: ssh\n    from: head\n    to: a\n    ssh-options: [x]\n", 5,
     "unknown use rule key 'ssh-options' (did you mean 'ssh_options'?)"),
    ("use:\n  - channel: ssh\n    from: head\n    to: a\n    queue: q\n", 5,
     "option 'queue' does not apply to channel ssh"),
    ("use:\n  - channel: slurm\n    from: head\n    to: a\n    user: u\n", 5,
     "option 'user' does not apply to channel slurm"),
    ("use:\n  - channel: ssh\n    from: head\n    to: a\n    user: u\n    port:\n      x\n", 7,
     "option 'port' has a bad value 'x'"),
    ("use:\n  - channel: ssh\n    from: head\n    to: a\n    port: 0\n", 5,
     "option 'port' must be from 1 to 65535"),
    ("use:\n  - channel: ssh\n    from: head\n    to: a\n    port: 99999\n", 5,
     "option 'port' must be from 1 to 65535 (a TCP port), got 99999"),
    ("use:\n  - channel: ssh\n    from: head\n    to: a\n    fanout: -2\n", 5,
     "option 'fanout' must be from 1 to 1000"),
    ("use:\n  - channel: ssh\n    from: head\n    to: a\n    timeout: -1\n", 5,
     "option 'timeout' must be from 0.1 to 604800"),
    ("use:\n  - channel: ssh\n    from: head\n    to: a\n    ssh_options:\n      - -v\n      - {a: 1}\n",
     7, "ssh_options item must be a string"),
    ("use:\n  - channel: ssh\n    from: head\n    to: a\n    user: true\n", 5,
     "user must be a string"),
    ("use:\n  - channel: sh\n    from: head\n    to: a\n", 2, "channel sh needs a template"),
    # elastic pools (issue 27): the line of the option at fault
    ("use:\n  - channel: slurm\n    from: head\n    to: 'j[[1-4]]'\n    elastic_wait: 2\n"
     "    elastic: 9-1\n", 6, "elastic 9-1: MIN is more than MAX"),
    ("use:\n  - channel: slurm\n    from: head\n    to: a\n    elastic_idle: 5\n", 5,
     "option 'elastic_idle' needs 'elastic' (MIN-MAX agents"),
    ("use:\n  - channel: slurm\n    from: head\n    to: 'j[[1-4]]'\n    elastic: 0-4\n"
     "    elastic_wait: -3\n", 6, "option 'elastic_wait' must be from 0 to 86400 (seconds), got -3"),
    ("use:\n  - channel: torque\n    from: head\n    to: 'j[[1-2]]'\n    elastic: 0-3\n", 5,
     "elastic 0-3: 'j[[1-2]]' names only 2 agents"),
    ("use:\n  - channel: ssh\n    from: head\n    to: tb[[04-01]]\n", 4,
     "to: bad host pattern 'tb[[04-01]]': range 04-01 runs backwards"),
    ("use:\n  - channel: ssh\n    from: 'he ad['\n    to: a\n", 3, "from: bad host pattern"),
    ("clusters:\n  tc:\n    fanout: 4\n", 2, "cluster 'tc' has no hosts"),
    ("clusters:\n  tc: {fanout: 4}\n  td: {}\n", 2, "cluster 'tc' has no hosts"),
    ("clusters:\n  tc:\n", 2, "cluster 'tc' must be a mapping with hosts, not null"),
    ("clusters:\n  tc: tc01\n", 2, "cluster 'tc' must be a mapping"),
    ("clusters:\n  - tc\n", 2, "clusters must be a mapping, not a list"),
    ("clusters:\n  tc:\n    hosts: tc01\n    fanot: 3\n", 4,
     "unknown cluster key 'fanot' (did you mean 'fanout'?)"),
    ("clusters:\n  tc:\n    hosts: tc01\n    timeout: -3\n", 4, "timeout must be from 0.1"),
    ("clusters:\n  tc:\n    hosts: tc01\n    fanout: 1.5\n", 4, "fanout must be an integer"),
    ("clusters:\n  tc:\n    hosts: 'tc[[01-'\n", 3, "hosts: bad host pattern"),
    ("clusters:\n  tc:\n    hosts: [tc01]\n", 3, "hosts must be a string"),
    ("explore:\n  - tb01\n  - {a: 1}\n", 3, "explore item must be a string"),
    ("explore:\n  - tb01\n  - 'x[[1-'\n", 3, "explore target: bad host pattern"),
    ("explore: {a: 1}\n", 1, "explore must be a list of strings"),
    # only plain YAML: no object construction, no aliases
    ("fanout: 1\nuse: !!python/object/apply:os.system ['echo hi']\n", 2,
     "YAML tag tag:yaml.org,2002:python/object/apply:os.system is not allowed"),
    ("python: !shell x\n", 1, "YAML tag !shell is not allowed"),
    ("explore: !!set {a, b}\n", 1, "is not allowed"),
    ("explore:\n  - !!binary aGk=\n", 2, "is not allowed"),
    ("fanout: &n 4\ntimeout: *n\n", 2, "YAML aliases (*n) are not supported"),
    ("use: []\n<<: {fanout: 3}\n", 2, "is not allowed"),
    ("fanout: 1\n---\nfanout: 2\n", 2, "expected a single document in the stream but found another document"),
    ("fanout: 1\npython: \"a\x07\"\n", 2, "character U+0007 is not allowed in YAML"),
]


@pytest.mark.parametrize("text,line,part", ERRORS)
def test_errors_name_the_line(text, line, part):
    with pytest.raises(ConfigError) as ei:
        cc.loads(text, "f.yaml")
    e = ei.value
    msg = str(e)
    assert "\n" not in msg
    assert msg.startswith("f.yaml:%d: " % line), msg
    assert e.line == line and e.filename == "f.yaml"
    assert part in msg, msg


def test_config_error_is_value_error_and_default_filename():
    with pytest.raises(ValueError) as ei:
        cc.loads("fanout: x\n")
    assert str(ei.value).startswith("<string>:1: ")


def test_missing_file(tmp_path):
    p = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError) as ei:
        cc.load(p)
    assert str(ei.value) == "%s: no such file" % p
    assert ei.value.line is None


def test_file_errors_name_the_path(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("fanout: 8\nuse:\n  - {channel: ssh, from: head, to: a, porrt: 2}\n")
    with pytest.raises(ConfigError) as ei:
        cc.load(str(p))
    assert str(ei.value).startswith("%s:3: unknown use rule key 'porrt'" % p)


def test_not_utf8(tmp_path):
    p = tmp_path / "latin.yaml"
    p.write_bytes(b"fanout: 8\npython: caf\xe9\n")
    with pytest.raises(ConfigError) as ei:
        cc.load(str(p))
    assert str(ei.value) == "%s:2: not UTF-8 text" % p


def test_directory_is_an_error(tmp_path):
    with pytest.raises(ConfigError) as ei:
        cc.load(str(tmp_path))
    assert str(ei.value).startswith(str(tmp_path) + ": ")


def test_unsafe_yaml_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    text = "use: !!python/object/apply:os.system ['touch %s']\n" % marker
    with pytest.raises(ConfigError):
        cc.loads(text)
    assert not marker.exists()


def test_alias_bomb_is_refused_quickly():
    lines = ['a0: &a0 ["x"]'] + ["a%d: &a%d [%s]" % (i, i, ",".join(["*a%d" % (i - 1)] * 9))
                                for i in range(1, 12)]
    with pytest.raises(ConfigError) as ei:
        cc.loads("\n".join(lines) + "\n")
    assert ":2: YAML aliases" in str(ei.value)


# ---------------------------------------------------------------- default_path

def test_default_path(monkeypatch, tmp_path):
    monkeypatch.setenv("GXP_CLUSTERS", "/etc/my.yaml")
    assert cc.default_path() == "/etc/my.yaml"
    monkeypatch.delenv("GXP_CLUSTERS")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert cc.default_path() == str(tmp_path / "gxpstyle" / "clusters.yaml")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cc.default_path() == str(tmp_path / "home" / ".config" / "gxpstyle" / "clusters.yaml")
    monkeypatch.setenv("XDG_CONFIG_HOME", "")
    monkeypatch.setenv("GXP_CLUSTERS", "")
    assert cc.default_path() == str(tmp_path / "home" / ".config" / "gxpstyle" / "clusters.yaml")
