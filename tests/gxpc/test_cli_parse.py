"""gxpc parses the plain cases itself (argparse costs most of a short command's
start-up) and leaves the rest to argparse built from the same declaration: the
two must never disagree. Whenever the fast parser answers, argparse must give
the same values for the same words."""
from hypothesis import given, settings
from hypothesis import strategies as st

from gxpstyle.gxpc import cli, verbs
from gxpstyle.gxpc.verbs import UsageError

WORDS = ["-H", "-b", "--stdin", "--fold", "-m", "--mask", "--mask=m1", "--hosts", "--hosts=a*", "-v",
         "--local", "--local=3", "--fanout", "--timeout", "-c", "--config", "--port", "-p", "-o",
         "-u", "-l", "--", "-", "--bogus", "-Hb", "-mx", "3", "-3", "2.5", "-0.5", "-5.", "-.5", "-1e3",
         "--local=x", "--mask=", "-\u00b2", "x", "ls", "a b",
         "ssh", "head", "tb[[01-02]]", "echo", "hi", "=", "A=1", "--help"]


# The core's verbs and the plugins' (make is raw: its words are make's).
VERBS = dict(cli.CORE)
VERBS.update((n, v) for n, v in verbs.plugin_verbs().items() if not v.raw)


def argparse_values(verb, words):
    try:
        ns = verbs.argparse_parser(verb).parse_args(words)
    except (UsageError, SystemExit):
        return None
    return vars(ns)


@settings(max_examples=3000, deadline=None)
@given(name=st.sampled_from(sorted(VERBS)), words=st.lists(st.sampled_from(WORDS), max_size=7))
def test_the_fast_parser_agrees_with_argparse(name, words):
    verb = VERBS[name]
    fast = verbs.fast_parse(verb, list(words))
    if fast is None:
        return
    assert vars(fast) == argparse_values(verb, list(words)), (name, words)


def test_plugin_verbs_are_found():
    assert {"mount", "umount", "mw"} <= set(VERBS)


def test_the_fast_parser_takes_the_plain_cases():
    e = cli.CORE["e"]
    a = verbs.fast_parse(e, ["-H", "--hosts", "local*", "echo", "-H", "--x"])
    assert a is not None and a.host_prefix and a.hosts == "local*" and a.command == ["echo", "-H", "--x"]
    a = verbs.fast_parse(cli.CORE["explore"], ["h1", "--timeout", "-1", "--local=3"])
    assert a is not None and a.targets == ["h1"] and a.timeout == -1.0 and a.local == 3
    a = verbs.fast_parse(cli.CORE["gexec"], ["m1", "-H", "ls"])
    assert a is not None and a.name == "m1" and a.command == ["-H", "ls"] and not a.host_prefix
    # Left to argparse: help, `--`, bundled short options, a bad number.
    for words in (["--help"], ["--", "ls"], ["-Hb", "ls"]):
        assert verbs.fast_parse(e, words) is None
    assert verbs.fast_parse(cli.CORE["explore"], ["--local", "x"]) is None
