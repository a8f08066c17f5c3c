"""gxpc checks every number and name where it enters: one line in the user's
words, exit 2, and no session started or needed (issue 12). Verbs come from
one registry, plugins included (issue 13). Run as an ordinary user, from the
installed venv."""
import os
import re
import subprocess

import pytest
from conftest import venv_dir

# (arguments, what the one line must say)
BAD = [
    (["explore", "--local", "-3"], "explore: --local must be from 0 to 10000 (local agents), got -3"),
    (["explore", "--local", "10001"], "explore: --local must be from 0 to 10000"),
    (["explore", "--local", "x"], "explore: argument --local: invalid int value: 'x'"),
    (["explore", "--fanout", "0", "--local", "2"], "explore: --fanout must be from 1 to 1000"),
    (["explore", "--fanout", "-2", "--local", "2"], "explore: --fanout must be from 1 to 1000"),
    (["explore", "--fanout", "1001", "--local", "2"], "explore: --fanout must be from 1 to 1000"),
    (["explore", "--timeout", "-1", "h1"], "explore: --timeout must be from 0.1 to 604800 (seconds), got -1"),
    (["explore", "--timeout", "0", "h1"], "explore: --timeout must be from 0.1"),
    (["explore", "--timeout", "inf", "h1"], "explore: --timeout must be from 0.1 to 604800"),
    (["explore", "--timeout", "nan", "h1"], "explore: --timeout must be a number"),
    (["explore"], "explore: name target hosts, --local N, or --config FILE"),
    (["explore", "tb[[05-01]]"], "runs backwards"),
    (["explore", "--config", "/nonexistent.yaml"], "/nonexistent.yaml: no such file"),
    (["use", "ssh", "head", "tb01", "--port", "99999"],
     "use: --port must be from 1 to 65535 (a TCP port), got 99999"),
    (["use", "ssh", "head", "tb01", "--port", "0"], "use: --port must be from 1 to 65535"),
    (["use", "ssh", "head", "tb01", "--fanout", "0"], "use: --fanout must be from 1 to 1000"),
    (["use", "ssh", "head", "tb01", "--timeout", "-1"], "use: --timeout must be from 0.1"),
    (["use", "ssh", "head"], "give both a source and a destination"),
    (["use", "bogus", "a", "b"], "use: unknown channel 'bogus'"),
    (["use", "--port", "22"], "use: options need a rule"),
    # elastic pools of batch agents (issue 27)
    (["use", "slurm", "head", "j[[1-8]]", "--elastic", "4-2"], "use: elastic 4-2: MIN is more than MAX"),
    (["use", "slurm", "head", "j[[1-8]]", "--elastic", "0-5000"],
     "use: elastic MAX must be from 0 to 4096 (agents), got 5000"),
    (["use", "slurm", "head", "j[[1-8]]", "--elastic=-1-2"], "use: elastic must be MIN-MAX agents"),
    (["use", "slurm", "head", "j[[1-8]]", "--elastic", "eight"],
     "use: elastic must be MIN-MAX agents, e.g. 0-16, got 'eight'"),
    (["use", "slurm", "head", "j[[1-4]]", "--elastic", "0-8"], "use: elastic 0-8: 'j[[1-4]]' names only 4"),
    (["use", "torque", "head", "j*", "--elastic", "0-2"], "use: elastic: 'j*' cannot name the pool's agents"),
    (["use", "ssh", "head", "j1", "--elastic", "0-1"], "use: option 'elastic' does not apply to channel ssh"),
    (["use", "slurm", "head", "j1", "--elastic-wait", "3"],
     "use: --elastic-wait and --elastic-idle need --elastic"),
    (["use", "slurm", "head", "j1", "--elastic", "0-1", "--elastic-wait", "-1"],
     "use: --elastic-wait must be from 0 to 86400 (seconds), got -1"),
    (["use", "slurm", "head", "j1", "--elastic", "0-1", "--elastic-idle", "1e9"],
     "use: --elastic-idle must be from 0 to 604800 (seconds)"),
    (["use", "slurm", "head", "j1", "--elastic", "0-1", "--elastic-idle", "nan"],
     "use: --elastic-idle must be a number"),
    (["export", "=x"], "export: a variable needs a name"),
    (["export", "1A=b"], "export: '1A' is not a variable name"),
    (["export", "A-B=b"], "export: 'A-B' is not a variable name"),
    (["export", "A"], "export: expected VAR=VALUE, got 'A'"),
    (["savemask", ""], "savemask: a mask needs a name"),
    (["savemask", "a b"], "savemask: 'a b' is not a mask name"),
    (["cd", "relative/dir"], "cd: give an absolute directory"),
    (["cd", ""], "cd: give a directory"),
    (["cd", "/nonexistent-gxp-dir"], "cd: /nonexistent-gxp-dir: no such directory on this host"),
    (["cd", "/etc/passwd"], "cd: /etc/passwd: not a directory"),
    (["e"], "e: give a command to run"),
    (["e", "-H"], "e: give a command to run"),
    (["gexec", "m1"], "gexec: give a command to run"),
    (["e", "--hosts", "tb[[05-01]]", "true"], "runs backwards"),
    (["e", "--bogus"], "e: unrecognized arguments: --bogus"),
    (["nosuchverb"], "unknown command 'nosuchverb'"),
    (["--bogus", "stat"], "unknown option --bogus"),
    (["mount", "-o", "fast", "/a", "/b"], "mount: unknown option 'fast'"),
    (["mount", "-o", "site_cache=on", "/a", "/b"], "mount: site_cache takes only 'off'"),
    (["mw", "gmnt", "/a"], "mw gmnt EXPORT MOUNTPOINT"),
    (["mw", "other", "a", "b"], "mw: only the gmnt program"),
    # GNU make 4.3 itself hangs from -j 65538 on (its jobserver pipe is full)
    (["make", "-j", "99999999999"], "make: -j must be from 1 to 65536 (jobs at once), got 99999999999"),
    (["make", "--jobs=65537"], "make: -j must be from 1 to 65536"),
    (["make", "-kj0"], "make: -j must be from 1 to 65536 (jobs at once), got 0"),
]


@pytest.mark.parametrize("args,says", BAD, ids=[" ".join(a) or "-" for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_before_any_session(gxp, args, says):
    r = gxp.run(*args, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("gxpc: "), r.stderr
    assert says in r.stderr, r.stderr
    # Never a Python exception's class name.
    assert not re.search(r"\b[A-Z][A-Za-z]*(Error|Exception)\b|Traceback", r.stderr), r.stderr
    # Checked before connecting: no daemon was started for a usage error.
    assert not os.path.exists(gxp.session_dir) and gxp.daemon_pids() == []


def test_checks_in_a_session_and_good_values_pass(gxp, tmp_path):
    gxp.ok("explore", "--local", "2", "--fanout", "1", "--timeout", "30")
    r = gxp.run("explore", "--local", "-3")                 # the daemon is never asked
    assert r.returncode == 2 and "--local must be from 0" in r.stderr
    assert r.stderr.count("\n") == 1
    assert gxp.run("e").returncode == 2
    gxp.ok("cd", "/")
    gxp.ok("export", "_A1=x=y")
    r = gxp.ok("e", 'echo "$(pwd) $_A1"')
    assert set(r.stdout.splitlines()) == {"/ x=y"}
    assert gxp.run("cd", "/nonexistent-gxp-dir").returncode == 2
    r = gxp.ok("e", "pwd")                                  # the refused cd changed nothing
    assert set(r.stdout.splitlines()) == {"/"}
    gxp.ok("savemask", "m1")
    assert gxp.ok("gexec", "m1", "echo", "hi").stdout.split() == ["hi"] * 3


def test_no_session_e_stat_and_quit():
    gxpc = os.path.join(venv_dir(), "bin", "gxpc")
    if not os.path.exists(gxpc):
        pytest.skip("gxpc is not installed in %s" % venv_dir())
    env = {"PATH": "/usr/bin:/bin", "GXP_SESSION": "/tmp/gxpt-none-%d/s" % os.getpid()}
    r = subprocess.run([gxpc, "stat"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 3 and "no session running" in r.stderr and r.stderr.count("\n") == 1
    r = subprocess.run([gxpc, "e", "true"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 3
    r = subprocess.run([gxpc, "quit"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and r.stderr == ""
    assert not os.path.exists(os.path.dirname(env["GXP_SESSION"]))


def test_use_help_gives_the_elastic_defaults_the_head_applies():
    """gxpc keeps its own copy of the defaults (it must not import use_rules
    for every command): they must be the head's."""
    from gxpstyle.config import use_rules
    from gxpstyle.gxpc import cli
    assert (cli._ELASTIC_WAIT, cli._ELASTIC_IDLE) == (use_rules.ELASTIC_WAIT, use_rules.ELASTIC_IDLE)
    r = subprocess.run([os.path.join(venv_dir(), "bin", "gxpc"), "use", "--help"],
                       capture_output=True, text=True, timeout=30)
    help_text = " ".join(r.stdout.split())
    assert r.returncode == 0 and "--elastic MIN-MAX batch: a pool of MIN to MAX agents" in help_text
    assert "--elastic-wait SECONDS" in help_text and "(0 to 86400, default 5)" in help_text
    assert "--elastic-idle SECONDS" in help_text and "(0 to 604800, default 60)" in help_text
