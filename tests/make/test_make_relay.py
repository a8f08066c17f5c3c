"""The relay's pure parts: a command make would run reaches the node's /bin/sh
as words that mean exactly themselves (no byte of a name is ever code), and the
gxpmake-job request is parsed back to the argv, cwd and environment sent."""
from __future__ import annotations

import os
import struct
import subprocess
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from make_backend.hook.relay import node_command, parse_env, parse_request

WORD = st.binary(max_size=40).filter(lambda b: b"\0" not in b)
SHELL_BYTES = st.lists(st.sampled_from(list(b"$`'\"\\;&|<>(){}*?[]~#! \t\n") + [0xe9, 0xff, ord("x")]),
                       max_size=30).map(bytes)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(WORD, SHELL_BYTES), max_size=6))
def test_every_word_reaches_the_program_unchanged(words):
    with tempfile.TemporaryDirectory() as d:
        cmd = node_command([b"printf", b"%s\\0"] + words)
        r = subprocess.run(["/bin/sh", "-c", os.fsencode(cmd)], cwd=d, capture_output=True,
                           env={"PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, r.stderr
        got = r.stdout.split(b"\0")[:-1] if words else []
        assert got == words
        assert os.listdir(d) == []          # nothing ran that made a file


def test_the_default_shell_recipe_goes_as_it_is_and_a_missing_program_is_one_line():
    assert node_command([b"/bin/sh", b"-c", b"echo $HOME > x"]) == "echo $HOME > x"
    cmd = node_command([b"/no/such/shell", b"-c", b"true"])
    r = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "GXP_HOSTNAME": "tb07"})
    assert r.returncode == 127
    assert r.stderr == "gxpc make: /no/such/shell: no such program on node tb07\n"


def _request(cwd: bytes, argv: list, env: list) -> bytes:
    body = cwd + b"\0" + struct.pack("=I", len(argv)) + b"".join(a + b"\0" for a in argv)
    body += struct.pack("=I", len(env)) + b"".join(e + b"\0" for e in env)
    return b"GXPJ" + struct.pack("=I", 8 + len(body)) + body


def test_a_request_parses_back():
    data = _request(b"/w/caf\xe9", [b"/bin/bash", b"bash", b"-c", b"a\nb"],
                    [b"A=1", b"EMPTY=", b"HOSTNAME=head", b"SHLVL=2", b"B=x=y"])
    cwd, argv, block = parse_request(data)
    assert cwd == "/w/caf\udce9" and argv == [b"bash", b"-c", b"a\nb"]
    assert parse_env(block) == {"A": "1", "EMPTY": "", "SHLVL": "2", "B": "x=y"}


def test_the_hook_builds_where_a_compiler_is_and_falls_back_where_none_is(tmp_path, monkeypatch):
    from make_backend.hook import build as hook_build
    monkeypatch.setattr(hook_build, "install_dir", lambda: str(tmp_path / "venv" / "hook"))
    monkeypatch.setattr(hook_build, "cache_dir", lambda: str(tmp_path / "cache" / "hook-1"))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert hook_build.find_or_build() is None          # gxpc make then uses job_shell.py
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    if hook_build.compiler() is None:
        return
    shim, client = hook_build.find_or_build()
    assert shim.startswith(str(tmp_path / "cache")) and os.path.isfile(shim)
    r = subprocess.run([client], capture_output=True, text=True)
    assert r.returncode == 127 and r.stderr == "gxpc make: gxpmake-job is started by gxpc make only\n"
    assert hook_build.find_or_build() == (shim, client)   # built once


def test_an_environment_the_session_cannot_carry_is_refused_in_one_line():
    from make_backend.hook.relay import MAX_ENV_VALUE, check_env
    check_env({"A": "x" * MAX_ENV_VALUE, "B": None})
    with pytest.raises(ValueError, match="^environment variable BIG is 1048577 characters long"):
        check_env({"BIG": "x" * (MAX_ENV_VALUE + 1)})


def test_the_fallback_job_shell_finds_recursive_lines_with_any_jobserver():
    from make_backend.hook.job_shell import is_recursive
    r, w = os.pipe()
    try:
        assert is_recursive("echo hi", "-j4 --jobserver-auth=%d,%d" % (r, w))   # make left it open
    finally:
        os.close(r)
        os.close(w)
    for flags in ("-j4 --jobserver-auth=fifo:/tmp/GMfifo123", "", " -j1"):
        assert is_recursive("cd sub && make -j4 all", flags)
        assert is_recursive("/usr/bin/gmake -C d", flags)
        assert not is_recursive("echo making; cc -o make.o make.c", flags)


def test_a_recipes_paths_come_from_what_make_runs_never_from_the_relays_wrapper():
    from make_backend.hook.recipe_files import recipe_paths
    assert recipe_paths(["/bin/sh", "-c", "echo t1 >/dev/null"], "/x") == ["/x/t1", "/dev/null"]
    # a program make execs without a shell: its words, not node_command's
    # `command -v ... printf ... exit 127` (each would be settled as a file)
    assert recipe_paths(["true"], "/x") == []
    assert recipe_paths(["./prog", "out.txt"], "/x") == ["/x/prog", "/x/out.txt"]
    assert recipe_paths(["/bin/bash", "-eu", "-o", "pipefail", "-c", "cp a b"], "/x") == ["/x/a", "/x/b"]
    assert recipe_paths(["bash", "-ec", "cc -o 'x y' z.c"], "/x") == ["/x/x y", "/x/z.c"]
