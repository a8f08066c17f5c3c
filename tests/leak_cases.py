"""Tests that leave something behind on purpose, run by test_leaks.py in a child
pytest (not collected by the suite: the name does not start with test_)."""
import os
import subprocess


def test_leaves_nothing():
    pass


def test_leaves_a_directory():
    os.mkdir("/tmp/gxpleak-" + os.environ["GXP_LEAK_TAG"])


def test_leaves_a_process():
    # exec -a gives the process a gxpstyle agent's mark; start_new_session keeps
    # it out of pytest's process group, as a real leaked agent would be.
    subprocess.Popen(["bash", "-c", 'exec -a "gxp-agent:%s" sleep 60' % os.environ["GXP_LEAK_TAG"]],
                     start_new_session=True)
