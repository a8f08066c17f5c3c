"""`gxpc plot TRACE -o OUT`: the installed gxpc draws a `gxpc make --trace`
file; a bad trace, a missing -o and a missing matplotlib each get one line
(exit 2 for the user's input, 1 for what is missing here)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import gxpc_path, venv_dir

LINES = [
    {"kind": "transfer", "node": "tb02", "file": "/mnt/gx/ref", "bytes": 50 << 20, "start": 100.0,
     "end": 104.5, "mode": "push", "source": "tb01"},
    {"kind": "transfer", "node": "tb03", "file": "/mnt/gx/ref", "bytes": 50 << 20, "start": 100.0,
     "end": 104.8, "mode": "push", "source": "tb01"},
    {"kind": "transfer", "node": "tb03", "file": "/mnt/gx/p1", "bytes": 1 << 20, "start": 104.8,
     "end": 105.0, "mode": "pull", "source": "tb02"},
    {"kind": "recipe", "node": "tb03", "recipe": "align p1", "start": 105.0, "end": 107.0, "status": 0},
    # an elastic pool's change (issue 27): read, not drawn
    {"kind": "pool", "event": "up", "pool": "slurm head el[[1-8]]", "what": "el1", "up": 1,
     "time": 101.0},
    # what crossed between sites (issue 28): read, not drawn
    {"kind": "wan", "bytes": 3 << 20, "sites": {"ga": [1 << 20, 0], "gb": [0, 2 << 20]},
     "time": 108.0},
]


def _gxpc(tmp_path, *args, python_args=None):
    env = {"PATH": os.path.join(venv_dir(), "bin") + ":/usr/bin:/bin", "HOME": str(tmp_path)}
    argv = [gxpc_path(), "--session", str(tmp_path / "nosession")] + list(args)
    if python_args is not None:
        argv = [os.path.join(venv_dir(), "bin", "python"), "-c", python_args] + argv[1:]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def _trace(tmp_path, lines=LINES) -> str:
    p = tmp_path / "trace.json"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(p)


def test_a_trace_becomes_an_image(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out.png"
    r = _gxpc(tmp_path, "plot", _trace(tmp_path), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_bad_input_gets_one_line(tmp_path):
    r = _gxpc(tmp_path, "plot", _trace(tmp_path))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "-o FILE" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "recipe"}\n')
    r = _gxpc(tmp_path, "plot", str(bad), "-o", str(tmp_path / "x.png"))
    assert r.returncode == 2 and r.stderr.strip() == (
        "gxpc: plot: %s:1: not a line of gxpc make --trace" % bad), r.stderr
    r = _gxpc(tmp_path, "plot", str(tmp_path / "none.json"), "-o", str(tmp_path / "x.png"))
    assert r.returncode == 2 and "No such file" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_without_matplotlib_it_says_how_to_install_it(tmp_path):
    # matplotlib made unimportable in the gxpc process itself
    code = ("import sys; sys.modules['matplotlib'] = None; sys.argv[0] = 'gxpc'; "
            "from gxpstyle.gxpc.cli import main; sys.exit(main())")
    r = _gxpc(tmp_path, "plot", _trace(tmp_path), "-o", str(tmp_path / "x.png"), python_args=code)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == ("gxpc: plot: plotting needs matplotlib: pip install "
                                "'gxpstyle[plot]' (or pip install matplotlib)"), r.stderr
    assert not (tmp_path / "x.png").exists()


def test_pool_and_wan_lines_are_read_not_drawn(tmp_path):
    from make_backend.command.trace_plot import read_trace
    recs = read_trace(_trace(tmp_path))
    assert [r[0] for r in recs] == ["push", "push", "pull", "recipe"]
