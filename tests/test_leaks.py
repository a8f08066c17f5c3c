"""The session-scoped leftover check (conftest.py, leaks.py) really fails a run."""
import os
import shutil
import subprocess
import sys
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def run_case(name, tag):
    env = dict(os.environ, GXP_LEAK_TAG=tag)
    env.pop("GXP_LEAK_CHECK", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(HERE, "leak_cases.py"), "-k", name],
                          capture_output=True, text=True, env=env, timeout=120, cwd=HERE)


@pytest.fixture
def tag():
    t = uuid.uuid4().hex[:8]
    yield t
    subprocess.run(["pkill", "-KILL", "-f", "gxp-agent:" + t])
    shutil.rmtree("/tmp/gxpleak-" + t, ignore_errors=True)


def test_a_clean_run_passes(tag):
    r = run_case("leaves_nothing", tag)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "left" not in r.stdout


def test_a_left_directory_fails_the_run(tag):
    r = run_case("leaves_a_directory", tag)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 passed" in r.stdout
    assert "file or directory: /tmp/gxpleak-" + tag in r.stdout


def test_a_left_process_fails_the_run(tag):
    r = run_case("leaves_a_process", tag)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "gxp-agent:%s 60" % tag in r.stdout
