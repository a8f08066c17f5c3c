"""Session control: only the owner reaches a session; secrets never leak into
process lists, logs or `gxpc stat`."""
import base64
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import uuid

import pytest

from gxpstyle.protocol import serializer, wire


@pytest.fixture
def second_user(user_bed):
    if user_bed is None:
        pytest.skip("needs root to create a second user")
    name = "gxpv" + uuid.uuid4().hex[:6]
    user_bed.add_user(name)
    yield name
    user_bed.remove_user(name)


def test_another_user_cannot_use_or_list_the_session(gxp, user_bed, second_user):
    gxp.ok("explore", "--local", "1")
    r = user_bed.run_as(second_user, [gxp.gxpc, "--session", gxp.session_dir, "stat"],
                        capture_output=True, text=True)
    assert r.returncode == 3
    assert "not to you" in r.stderr or "ermission denied" in r.stderr
    r = user_bed.run_as(second_user, ["ls", gxp.session_dir], capture_output=True, text=True)
    assert r.returncode != 0 and "Permission denied" in r.stderr
    r = user_bed.run_as(second_user, ["ls", os.path.dirname(gxp.session_dir)],
                        capture_output=True, text=True)
    assert r.returncode != 0
    # Even someone who can reach the socket (root here) is refused by SO_PEERCRED:
    # the connection is closed without a byte of reply.
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.path.join(gxp.session_dir, "gxpd.sock"))
    s.settimeout(5)
    try:
        s.sendall(wire.encode_frame("0", "c", {"op": "request", "req": 1, "cmd": "stat",
                                               "args": {}}))
        got = s.recv(100)
    except (BrokenPipeError, ConnectionResetError):   # closed on us: nothing said
        got = b""
    assert got == b""
    s.close()
    # The owner still works.
    assert gxp.ok("e", "echo ok").stdout.split() == ["ok", "ok"]


def _hello_from_capture(data: bytes) -> dict:
    """Parse what a child's first stage read: payload, then the hello frame."""
    n = struct.unpack("!I", data[:4])[0]
    rest = data[4 + 32 + n:]
    length = struct.unpack("!I", rest[:4])[0]
    _, _, body = wire.split_frame(rest[4:4 + length])
    return serializer.loads(body)


def test_secrets_never_in_ps_logs_or_stat(gxp, user_bed):
    if user_bed is None:
        pytest.skip("needs root")
    d = tempfile.mkdtemp(prefix="gxpcap-", dir="/var/tmp")
    os.chmod(d, 0o777)
    cap = os.path.join(d, "stdin.bin")
    try:
        # A channel that records the bootstrap stream, so the test learns the
        # session secret and key exactly as an agent receives them.
        gxp.ok("use", "sh", "head", "rec1", "--template", "tee %s | sh -c {cmd}" % cap)
        gxp.ok("explore", "rec1")
        gxp.ok("explore", "--local", "3")
        with open(cap, "rb") as f:
            hello = _hello_from_capture(f.read())
        secret = hello["secret"]
        key_pem = hello["opts"]["key"]
        assert len(secret) == 32 and "PRIVATE KEY" in key_pem
        key_line = key_pem.splitlines()[1]
        needles = [secret.hex(), base64.b64encode(secret).decode(), key_line]
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True).stdout
        stat = gxp.ok("stat").stdout
        gxp.ok("e", "echo $GXP_NODE_ID; env")
        with open(os.path.join(gxp.session_dir, "gxpd.log"), "rb") as f:
            log = f.read()
        for hay, where in ((ps, "ps"), (stat.encode(), "stat"), (log, "log")):
            assert secret not in hay, where
            for needle in needles:
                assert needle.encode() not in hay, "%s leaks %s" % (where, needle[:8])
        # Nothing in the session directory is readable by others.
        for root, dirs, files in os.walk(gxp.session_dir):
            for name in dirs + files:
                mode = os.lstat(os.path.join(root, name)).st_mode & 0o777
                assert mode & 0o077 == 0, "%s is mode %o" % (name, mode)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_gxpstyle_folder_in_the_working_directory_is_not_the_daemons_code(gxp):
    """gxpc started in a directory holding a `gxpstyle` package (a checkout, or
    anything a user unpacked) still runs the installed daemon: `python -m`
    would have put that directory first on the daemon's sys.path."""
    work = "/tmp/gxpcwd-%s" % gxp.new_tag()
    fake = os.path.join(work, "gxpstyle")
    marker = os.path.join(work, "ran")
    os.makedirs(fake)
    for name in ("__init__.py", "daemon.py"):
        with open(os.path.join(fake, name), "w") as f:
            f.write("open(%r, 'w').close()\n" % marker)
    try:
        if gxp.user:
            shutil.chown(work, gxp.user)
        os.chmod(work, 0o755)
        gxp.ok("explore", "--local", "1", cwd=work)
        r = gxp.ok("e", "echo", "hello", cwd=work)
        assert r.stdout.split() == ["hello", "hello"]
        assert not os.path.exists(marker)
    finally:
        shutil.rmtree(work, ignore_errors=True)
