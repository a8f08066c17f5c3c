"""gxpc's verbs come from one registry: the core's, and the plugins' through the
`gxpstyle.verbs` entry points; the core CLI imports neither sshfsmux nor
make_backend, and a short command imports only what it needs (issue 13)."""
import os
import subprocess

import pytest
from conftest import venv_dir

CORE = ["use", "explore", "stat", "e", "gexec", "smask", "rmask", "savemask", "cd", "export", "bcast",
        "where", "quit"]
PLUGINS = ["mount", "umount", "mw", "make", "plot"]


def _gxpc():
    path = os.path.join(venv_dir(), "bin", "gxpc")
    if not os.path.exists(path):
        pytest.skip("gxpc is not installed in %s" % venv_dir())
    return path


def _env(tmp):
    return {"PATH": os.path.join(venv_dir(), "bin") + ":/usr/bin:/bin",
            "GXP_SESSION": os.path.join(str(tmp), "session")}


def test_help_lists_every_verb_plugins_included(tmp_path):
    r = subprocess.run([_gxpc(), "--help"], capture_output=True, text=True, env=_env(tmp_path), timeout=30)
    assert r.returncode == 0 and r.stderr == ""
    listed = [line.split()[0] for line in r.stdout.splitlines() if line.startswith("    ")]
    assert sorted(listed) == sorted(CORE + PLUGINS)
    r = subprocess.run([_gxpc()], capture_output=True, text=True, env=_env(tmp_path), timeout=30)
    assert r.returncode == 2 and "mount" in r.stderr


@pytest.mark.parametrize("verb", CORE + PLUGINS)
def test_every_verb_has_help(tmp_path, verb):
    r = subprocess.run([_gxpc(), verb, "--help"], capture_output=True, text=True,
                       env=_env(tmp_path), timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: gxpc %s" % verb), r.stdout
    assert not os.path.exists(os.path.join(str(tmp_path), "session"))   # help starts nothing


def test_make_arguments_reach_make_untouched(tmp_path):
    mk = tmp_path / "rules.mk"
    mk.write_text("all:\n\t@echo V=$(V) FLAGS=$(MAKEFLAGS)\n")
    # Options gxpc has too (--help is make's after `--`, --session after the verb).
    argv = [_gxpc(), "make", "--local", "-f", str(mk), "-s", "V=--session", "--no-print-directory"]
    r = subprocess.run(argv, capture_output=True, text=True, env=_env(tmp_path), cwd=str(tmp_path),
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("V=--session FLAGS=s") and "no-print-directory" in r.stdout
    r = subprocess.run([_gxpc(), "make", "--local", "-f", str(mk), "--", "--version"],
                       capture_output=True, text=True, env=_env(tmp_path), cwd=str(tmp_path), timeout=60)
    assert r.returncode == 0 and "GNU Make" in r.stdout


def _modules_loaded(code_or_argv, tmp_path):
    """Top-level modules a command imports (python -X importtime)."""
    python = os.path.join(venv_dir(), "bin", "python")
    r = subprocess.run([python, "-X", "importtime"] + code_or_argv, capture_output=True, text=True,
                       env=_env(tmp_path), timeout=30)
    mods = set()
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            mods.add(line.rsplit("|", 1)[1].strip())
    assert mods, r.stderr
    return r, mods


def test_the_core_cli_imports_no_plugin_and_e_stays_lean(tmp_path):
    _gxpc()
    _, mods = _modules_loaded(["-c", "import gxpstyle.gxpc.cli, gxpstyle.gxpc.verbs"], tmp_path)
    assert not {m for m in mods if m.split(".")[0] in ("sshfsmux", "make_backend")}
    # `gxpc e true` (here without a session: it gets as far as connecting).
    r, mods = _modules_loaded([_gxpc(), "e", "true"], tmp_path)
    assert r.returncode == 3, r.stderr
    heavy = {"yaml", "argparse", "typing", "dataclasses", "socket", "subprocess", "importlib.metadata",
             "gxpstyle.config.cluster_config", "gxpstyle.config.use_rules",
             "gxpstyle.config.hostpattern", "hashlib"}
    assert not heavy & mods, heavy & mods
    # ... and what it loads once connected: the parallel shell's client side.
    _, mods = _modules_loaded(["-c", "import gxpstyle.gxpc.cli, gxpstyle.shell.parallel_shell"], tmp_path)
    assert not (heavy | {"enum", "signal"}) & mods, (heavy | {"enum", "signal"}) & mods
