"""The direct data channel (sshfsmux export_server / direct_branch): every call
round-trips with the right errno, whole files stream in one request, writes are
pipelined, paths stay inside the export (also against symlinks swapped in while
a client walks), read-only is enforced by the server, only the key gets in, and
hostile frames from an authenticated peer cost that peer its connection and
nobody else anything. Runs as root or as any user; in-process, on 127.0.0.1."""
import errno
import hashlib
import os
import random
import socket
import stat
import threading
import time

import pytest
from test_link_auth import send_and_drain

from gxpstyle.protocol import serializer, wire
from gxpstyle.transport import link_auth
from sshfsmux.branches import confined_paths
from sshfsmux.direct import branch as direct_branch
from sshfsmux.direct import export_server
from sshfsmux.direct import protocol as fs_protocol
from sshfsmux.direct import transport as fs_transport

SECRET = os.urandom(32)
KEY = fs_protocol.data_channel_key(SECRET)
MiB = 1 << 20


@pytest.fixture
def make_server(cert_files):
    made = []

    def make(root, read_only=False, cipher=True, **kw):
        certfile, keyfile, pin = cert_files
        logs = []
        s = export_server.ExportServer(str(root), read_only, KEY, certfile, keyfile, pin,
                                       host="127.0.0.1", cipher=cipher, log=logs.append, **kw)
        s.logs = logs
        s.test_pin = pin
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


@pytest.fixture
def make_branch(tmp_path):
    made = []

    def make(server, port=None, key=KEY, cipher=None, **kw):
        cipher = server.cipher if cipher is None else cipher
        kw.setdefault("cache_dir", str(tmp_path / ("cache%d" % len(made))))
        b = direct_branch.DirectBranch("127.0.0.1", port or server.port, key, server.test_pin,
                                       "node1", cipher=cipher, **kw)
        made.append(b)
        return b
    yield make
    for b in made:
        b.close()


def errno_of(fn, *args):
    try:
        fn(*args)
    except OSError as e:
        return e.errno
    return 0


def read_all(branch, path):
    h = branch.open_read(path)
    try:
        out = []
        off = 0
        while True:
            piece = h.read(128 << 10, off)      # FUSE-sized reads
            if not piece:
                return b"".join(out)
            out.append(piece)
            off += len(piece)
    finally:
        h.close()


def write_all(branch, path, data, flags=os.O_WRONLY, create=True):
    h = branch.open_write(path, flags, 0o644, create)
    for off in range(0, len(data), 128 << 10):
        h.write(data[off:off + (128 << 10)], off)
    h.close()


def settle(path, seconds=0.0):
    """Make a file's times old enough for its replica to be kept: mtime back in
    the past, and (ctime cannot be set) wait `seconds`."""
    t = time.time() - 60
    os.utime(path, (t, t))
    time.sleep(seconds)


@pytest.fixture
def quick_settle(monkeypatch):
    """Files count as settled 0.3 s after their last change (2 s in real use)."""
    monkeypatch.setattr(fs_protocol, "SETTLE_SECONDS", 0.3)
    return 0.4


class Raw:
    """An authenticated client speaking frames by hand (blocking, one thread)."""

    def __init__(self, port, cipher=True, key=KEY, pin=None):
        self.sock, macs = fs_protocol.connect("127.0.0.1", port, key, pin, cipher)
        self.sock.settimeout(10)
        self.send_key, self.recv_key = macs or (None, None)
        self.send_seq = self.recv_seq = 0
        self.buf = b""
        self.req = 0

    def send_frame(self, frame):
        if self.send_key is not None:        # cipher=none: the tag is the source address
            head, message = fs_transport.tag_frame(self.send_key, self.send_seq, frame)
            frame = head + bytes(message)
            self.send_seq += 1
        self.sock.sendall(frame)

    def send_msg(self, msg):
        self.send_frame(wire.encode_frame("fs", "c", msg))

    def _recv_exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv_msg(self):
        head = self._recv_exact(4)
        n = int.from_bytes(head, "big")
        body = self._recv_exact(n)
        if self.recv_key is not None:
            fs_transport.check_tag(self.recv_key, self.recv_seq, body)
            self.recv_seq += 1
        return fs_protocol.decode(body, ("fs_reply", "fs_data"))

    def call(self, call, args, cancel_streams=False):
        """(errno, result, streamed data) of one call."""
        self.req += 1
        req = self.req
        self.send_msg({"op": "fs_call", "req": req, "call": call, "args": args})
        return self.wait(req, cancel_streams)

    def wait(self, req, cancel_streams=False):
        while True:
            msg = self.recv_msg()
            if msg["op"] == "fs_reply" and msg["req"] == req:
                break
        err, result = msg["errno"], msg["result"]
        data = b""
        streaming = not err and (
            (isinstance(result, dict) and result.get("unchanged") is False)
            or (isinstance(result, dict) and result.get("more") is True))
        if streaming and cancel_streams:
            self.req += 1
            self.send_msg({"op": "fs_call", "req": self.req, "call": "cancel",
                           "args": {"req": req}})
        while streaming:
            msg = self.recv_msg()
            if msg["op"] == "fs_data" and msg["req"] == req:
                data += msg["data"]
                if msg["eof"]:
                    break
        return err, result, data

    def is_dropped(self, timeout=5.0):
        """True once the server has closed this connection."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except (socket.timeout, OSError):
            return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def raw(server, **kw):
    return Raw(server.port, cipher=server.cipher, pin=server.test_pin, **kw)


class Relay:
    """A TCP relay that records both directions; optionally cuts the connection
    after `limit` bytes from the server, or lets `tamper` edit client bytes."""

    def __init__(self, port, limit=None, tamper=None):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(4)
        self.port = self.lsock.getsockname()[1]
        self.upstream = port
        self.limit = limit
        self.tamper = tamper
        self.to_server = bytearray()
        self.to_client = bytearray()
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            self.conns += [c, up]
            threading.Thread(target=self._pump, args=(c, up, self.to_server, None, self.tamper),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(up, c, self.to_client, self.limit, None),
                             daemon=True).start()

    def _pump(self, a, b, record, limit, tamper):
        seen = 0                # bytes of this connection so far
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                if tamper is not None:
                    data = tamper(seen, data)
                seen += len(data)
                record.extend(data)
                if limit is not None and len(record) >= limit:
                    b.sendall(data[:max(0, limit - (len(record) - len(data)))])
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.lsock.close()
        for s in self.conns:
            try:
                s.close()
            except OSError:
                pass


# --- calls ------------------------------------------------------------------

def test_every_call_round_trips_with_the_right_errno(tmp_path, make_server, make_branch):
    root = tmp_path / "export"
    root.mkdir()
    b = make_branch(make_server(root))

    assert stat.S_ISDIR(b.getattr("/")["st_mode"])
    assert errno_of(b.getattr, "/nope") == errno.ENOENT
    b.mkdir("/d", 0o755)
    assert (root / "d").is_dir()
    assert errno_of(b.mkdir, "/d", 0o755) == errno.EEXIST
    assert errno_of(b.mkdir, "/nope/d", 0o755) == errno.ENOENT

    write_all(b, "/d/f", b"hello")
    assert (root / "d" / "f").read_bytes() == b"hello"
    assert b.getattr("/d/f")["st_size"] == 5
    assert errno_of(b.open_write, "/d/f", os.O_WRONLY | os.O_EXCL, 0o644, True) == errno.EEXIST
    assert errno_of(b.open_write, "/d/nope", os.O_WRONLY, 0o644, False) == errno.ENOENT
    assert errno_of(b.open_write, "/d", os.O_WRONLY, 0o644, False) == errno.EISDIR
    assert b.readdir("/d") == ["f"]
    assert errno_of(b.readdir, "/d/f") == errno.ENOTDIR
    assert errno_of(b.readdir, "/nope") == errno.ENOENT
    assert errno_of(b.rmdir, "/d") == errno.ENOTEMPTY
    assert errno_of(b.rmdir, "/d/f") == errno.ENOTDIR
    assert errno_of(b.unlink, "/d") in (errno.EISDIR, errno.EPERM)
    assert errno_of(b.open_read, "/d") == errno.EISDIR
    assert errno_of(b.open_read, "/nope") == errno.ENOENT
    assert read_all(b, "/d/f") == b"hello"

    b.symlink("f", "/d/l")
    assert os.readlink(str(root / "d" / "l")) == "f"
    assert b.readlink("/d/l") == "f"
    assert stat.S_ISLNK(b.getattr("/d/l")["st_mode"])
    assert read_all(b, "/d/l") == b"hello"           # an in-export symlink is followed
    assert errno_of(b.readlink, "/d/f") == errno.EINVAL
    assert errno_of(b.symlink, "x", "/d/l") == errno.EEXIST

    b.rename("/d/f", "/d/g")
    assert errno_of(b.getattr, "/d/f") == errno.ENOENT
    assert errno_of(b.rename, "/d/f", "/d/h") == errno.ENOENT
    assert errno_of(b.rename, "/d", "/d/g/x") in (errno.ENOTDIR, errno.EINVAL)
    b.chmod("/d/g", 0o600)
    assert stat.S_IMODE(os.stat(str(root / "d" / "g")).st_mode) == 0o600
    b.truncate("/d/g", 2)
    assert (root / "d" / "g").read_bytes() == b"he"
    assert errno_of(b.truncate, "/d", 0) == errno.EISDIR
    b.utimens("/d/g", (1000.0, 2000.0))
    assert b.getattr("/d/g")["st_mtime"] == 2000.0
    b.utimens("/d/g", None)
    assert b.getattr("/d/g")["st_mtime"] > 2000.0
    assert b.statfs()["f_bsize"] > 0

    # A handle open for reading and writing reads back what it wrote (buffered
    # writes are flushed first), truncates and fsyncs.
    h = b.open_write("/d/rw", os.O_RDWR, 0o644, True)
    h.write(b"abcdef", 0)
    h.write(b"XY", 2)
    assert h.read(100, 0) == b"abXYef"
    h.truncate(3)
    h.fsync()
    assert h.read(100, 0) == b"abX"
    h.close()
    h.close()                                        # twice is harmless
    assert b.read_range("/d/rw", 2, 1) == b"bX"

    try:
        b.setxattr("/d/g", "user.k", b"v")
    except OSError as e:
        assert e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP)
    else:
        assert b.getxattr("/d/g", "user.k") == b"v"
        assert "user.k" in b.listxattr("/d/g")
        b.removexattr("/d/g", "user.k")
        assert errno_of(b.getxattr, "/d/g", "user.k") == errno.ENODATA
        assert errno_of(b.removexattr, "/d/g", "user.k") == errno.ENODATA
    assert errno_of(b.getxattr, "/d/nope", "user.k") == errno.ENOENT

    b.unlink("/d/l")
    b.unlink("/d/g")
    b.unlink("/d/rw")
    assert errno_of(b.unlink, "/d/g") == errno.ENOENT
    b.rmdir("/d")
    assert errno_of(b.rmdir, "/d") == errno.ENOENT
    assert os.listdir(str(root)) == []

    # FIFOs and devices are refused without being opened (no hang).
    os.mkfifo(str(root / "fifo"))
    assert errno_of(b.open_read, "/fifo") == errno.EINVAL
    assert errno_of(b.open_write, "/fifo", os.O_WRONLY, 0o644, False) == errno.EINVAL
    assert errno_of(b.truncate, "/fifo", 0) == errno.EINVAL
    b.unlink("/fifo")

    # A listing longer than one frame streams.
    big = root / "many"
    big.mkdir()
    names = sorted("%04d-%s" % (i, "n" * 150) for i in range(3000))
    for n in names:
        (big / n).touch()
    assert sorted(b.readdir("/many")) == names


def test_wire_arguments_are_checked(tmp_path, make_server):
    root = tmp_path / "export"
    root.mkdir()
    (root / "f").write_bytes(b"x")
    server = make_server(root)
    r = raw(server)
    try:
        cases = [
            ("getattr", {"path": "a\x00b"}, errno.EINVAL),
            ("getattr", {"path": "a//b"}, errno.EINVAL),
            ("getattr", {"path": "./f"}, errno.EINVAL),
            ("getattr", {"path": "\udcff"}, errno.ENOENT),    # not UTF-8: just a name
            ("getattr", {"path": "x" * 5000}, errno.ENAMETOOLONG),
            ("getattr", {"path": 17}, errno.EINVAL),
            ("getattr", {}, errno.EINVAL),
            ("nosuchcall", {"path": "f"}, errno.ENOSYS),
            ("read", {"path": "f", "offset": 0, "size": 1 << 40}, errno.EINVAL),
            ("read", {"path": "f", "offset": -1, "size": 1}, errno.EINVAL),
            ("read", {"path": "f", "offset": 1 << 70, "size": 1}, errno.EINVAL),
            ("mkdir", {"path": "d", "mode": True}, errno.EINVAL),
            ("write", {"fh": 99, "offset": 0, "data": b"x"}, errno.EBADF),
            ("write", {"fh": 1, "offset": 0, "data": "text"}, errno.EINVAL),
            ("utimens", {"path": "f", "times": [1.0]}, errno.EINVAL),
            ("setxattr", {"path": "f", "name": "user.x", "value": b"v" * (65 << 10)}, errno.EINVAL),
        ]
        for call, args, want in cases:
            err, _result, _data = r.call(call, args)
            assert err == want, (call, args, err)
        assert r.call("getattr", {"path": "f"})[0] == 0
        assert r.call("read", {"path": "f", "offset": 0, "size": 10})[1] == b"x"
    finally:
        r.close()
    assert server.stats["dropped"] == 0


def test_open_files_are_bounded_across_connections(tmp_path, make_server, make_branch):
    root = tmp_path / "export"
    root.mkdir()
    server = make_server(root, max_open=3)
    b1, b2 = make_branch(server), make_branch(server)
    handles = [b1.open_write("/a", os.O_WRONLY, 0o644, True),
               b2.open_write("/b", os.O_WRONLY, 0o644, True),
               b2.open_write("/c", os.O_WRONLY, 0o644, True)]
    assert errno_of(b1.open_write, "/d", os.O_WRONLY, 0o644, True) == errno.EMFILE
    handles.pop().close()
    b1.open_write("/d", os.O_WRONLY, 0o644, True).close()
    b2.close()                                      # its handle is given back too
    deadline = time.monotonic() + 5
    while server.open_count > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.open_count == 1
    handles[0].close()
    assert server.open_count == 0


# --- streaming ----------------------------------------------------------------

@pytest.mark.parametrize("cipher", [True, False], ids=["tls", "cipher-none"])
def test_whole_64mib_file_streams_in_one_request_and_the_replica_is_reused(
        tmp_path, make_server, make_branch, quick_settle, cipher):
    root = tmp_path / "export"
    root.mkdir()
    data = os.urandom(64 * MiB)
    (root / "big").write_bytes(data)
    settle(str(root / "big"), quick_settle)
    server = make_server(root, cipher=cipher)
    b = make_branch(server)
    b.getattr("/")                                    # connect first
    before = sum(server.stats["calls"].values())
    t0 = time.monotonic()
    got = read_all(b, "/big")
    seconds = time.monotonic() - t0
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    assert sum(server.stats["calls"].values()) - before == 1
    assert server.stats["calls"]["read_file"] == 1
    print("64 MiB read (%s): %.0f MiB/s" % ("tls" if cipher else "plain", 64 / seconds))

    # Complete and immutable: one replica under its final name, no temporary file.
    files = os.listdir(b.cache_dir)
    assert len(files) == 1 and not files[0].startswith(direct_branch.TMP_PREFIX)
    assert os.path.getsize(os.path.join(b.cache_dir, files[0])) == len(data)

    # Unchanged remote file: one small request, no data, read locally.
    assert read_all(b, "/big")[:1000] == data[:1000]
    assert b.stats == {"connects": 1, "streams": 1, "reused": 1}

    # Changed (same size, new contents and times): streamed again.
    new = b"N" * 1000 + data[1000:]
    with open(str(root / "big"), "r+b") as f:
        f.write(new[:1000])
    settle(str(root / "big"), quick_settle)
    assert read_all(b, "/big")[:1001] == new[:1001]
    assert b.stats["streams"] == 2
    assert len(os.listdir(b.cache_dir)) == 1


def test_a_copy_made_elsewhere_is_adopted_and_read_without_data(tmp_path, make_server, make_branch):
    """gxpc make's planned transfers: a verified copy put in the replica store's
    directory becomes the replica (at the export's current version), so the
    next read asks "unchanged?" and moves no data; a copy of the wrong length
    is refused and removed."""
    root = tmp_path / "export"
    root.mkdir()
    data = os.urandom(3 * MiB)
    (root / "f").write_bytes(data)
    b = make_branch(make_server(root))
    short = os.path.join(b.cache_dir, ".tmp-xfer-1-short")
    with open(short, "wb") as f:
        f.write(data[:-1])
    assert b.adopt("/f", short) is None and not os.path.exists(short)
    copy = os.path.join(b.cache_dir, ".tmp-xfer-2-ab")
    with open(copy, "wb") as f:
        f.write(data)
    kept = b.adopt("/f", copy)
    assert kept is not None and os.path.dirname(kept) == b.cache_dir and not os.path.exists(copy)
    assert read_all(b, "/f") == data
    assert b.stats["streams"] == 0 and b.stats["reused"] == 1
    assert errno_of(b.adopt, "/nope", copy) == errno.ENOENT


@pytest.mark.parametrize("cipher", [True, False], ids=["tls", "cipher-none"])
def test_64mib_of_writes_arrive_intact(tmp_path, make_server, make_branch, cipher):
    root = tmp_path / "export"
    root.mkdir()
    server = make_server(root, cipher=cipher)
    b = make_branch(server)
    data = os.urandom(64 * MiB)
    b.getattr("/")
    t0 = time.monotonic()
    write_all(b, "/out", data)
    seconds = time.monotonic() - t0
    with open(str(root / "out"), "rb") as f:
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
    # Pipelined in large frames: far fewer calls than the 512 writes FUSE made.
    assert server.stats["calls"]["write"] <= 64 * MiB // fs_protocol.MAX_IO + 1
    print("64 MiB write (%s): %.0f MiB/s" % ("tls" if cipher else "plain", 64 / seconds))


def test_replica_of_an_unsettled_or_interrupted_stream_is_never_visible(
        tmp_path, make_server, make_branch):
    root = tmp_path / "export"
    root.mkdir()
    data = os.urandom(8 * MiB)
    (root / "fresh").write_bytes(data)               # just written: times not settled
    server = make_server(root)
    b = make_branch(server)
    assert read_all(b, "/fresh") == data
    assert os.listdir(b.cache_dir) == []

    # The connection is cut after 2 MiB of the stream: what arrived is readable,
    # beyond that EIO, and no replica (nor temporary file) is left behind.
    settle(str(root / "fresh"))
    relay = Relay(server.port, limit=2 * MiB)
    try:
        cut = make_branch(server, port=relay.port)
        h = cut.open_read("/fresh")
        assert h.read(4096, 0) == data[:4096]
        with pytest.raises(OSError) as e:
            h.read(4096, 6 * MiB)
        assert e.value.errno == errno.EIO
        h.close()
        assert os.listdir(cut.cache_dir) == []
    finally:
        relay.close()


def test_a_replica_the_namespace_names_is_opened_without_asking_until_a_change_drops_it(
        tmp_path, make_server, make_branch):
    """GMount's nodes (gmount/replica_trust.py): `known` names the holder's
    file as the head's catalog has it; a replica read during this mount's
    life whose version it matches is opened with no request, one of a file
    written a moment ago included; drop_replicas (a change the head
    announced) makes the next open ask; a store reopened keeps none of those."""
    from sshfsmux.branches.replica_cache import ReplicaCache
    root = tmp_path / "export"
    root.mkdir()
    f = root / "fresh"
    f.write_bytes(b"one!")                          # just written: times not settled
    server = make_server(root)
    b = make_branch(server)
    st = os.stat(f)
    b.known = lambda rel: (st.st_size, st.st_mtime) if rel == "fresh" else None
    assert read_all(b, "/fresh") == b"one!"
    assert b.stats.get("known", 0) == 0             # the first read asked
    assert read_all(b, "/fresh") == b"one!" and b.stats["known"] == 1
    # rewritten in place, size and times kept (one timestamp tick): only the
    # announcement tells; until it comes the replica is what the copy names
    f.write_bytes(b"two!")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert read_all(b, "/fresh") == b"one!" and b.stats["known"] == 2
    b.drop_replicas(["fresh"])
    assert read_all(b, "/fresh") == b"two!" and b.stats["known"] == 2     # asked
    # a branch not told of every change keeps no replica of unsettled times
    plain = make_branch(server)
    assert read_all(plain, "/fresh") == b"two!" and os.listdir(plain.cache_dir) == []
    # a store reopened (the next mount) drops the replicas of unsettled times
    assert any(n.endswith(".u") for n in os.listdir(b.cache_dir))
    again = ReplicaCache.persistent(b.cache_dir)
    assert again.current(b.replica_key("fresh")) is None
    again.close()


def test_a_dropped_connection_is_reconnected_once(tmp_path, make_server, make_branch):
    root = tmp_path / "export"
    root.mkdir()
    (root / "f").write_bytes(b"abc")
    server = make_server(root)
    b = make_branch(server)
    assert b.getattr("/f")["st_size"] == 3
    for s in list(server.sessions):
        s.conn.close("test")
    deadline = time.monotonic() + 5
    while server.sessions and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.getattr("/f")["st_size"] == 3
    assert read_all(b, "/f") == b"abc"
    assert b.stats["connects"] == 2


# --- confinement ----------------------------------------------------------------

@pytest.fixture
def jail(tmp_path):
    root = tmp_path / "export"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(b"SECRET")
    (root / "in.txt").write_bytes(b"inside")
    (root / "sub").mkdir()
    (root / "sub" / "x").write_bytes(b"x-inside")
    os.symlink("/etc", str(root / "etc_link"))
    os.symlink("/etc/passwd", str(root / "passwd_link"))
    os.symlink(str(outside / "secret"), str(root / "secret_link"))
    os.symlink(str(outside), str(root / "outdir"))
    os.symlink("../outside/secret", str(root / "up_out"))
    os.symlink("sub/../../outside", str(root / "sneaky"))
    os.symlink("sub/x", str(root / "rel_in"))
    os.symlink("sub/../in.txt", str(root / "up_in"))
    os.symlink(str(root / "sub" / "x"), str(root / "abs_in"))
    os.symlink("sub", str(root / "subdir_link"))
    os.symlink("loop", str(root / "loop"))
    return root, outside


def test_paths_and_symlinks_leading_out_are_refused(jail, make_server, make_branch):
    root, outside = jail
    server = make_server(root)
    b = make_branch(server)
    r = raw(server)
    try:
        for path in ("../x", "/etc/passwd", "sub/../../outside/secret", "..", "/"):
            for call in ("getattr", "read_file", "readdir"):
                args = {"path": path, "have": None} if call == "read_file" else {"path": path}
                assert r.call(call, args)[0] == errno.EACCES, (call, path)
        assert r.call("rename", {"old": "in.txt", "new": "../stolen"})[0] == errno.EACCES
        assert r.call("symlink", {"target": "x", "path": "/tmp/evil"})[0] == errno.EACCES
    finally:
        r.close()

    EACCES = errno.EACCES
    assert errno_of(b.open_read, "/etc_link/passwd") == EACCES
    assert errno_of(b.getattr, "/etc_link/passwd") == EACCES
    assert errno_of(b.readdir, "/etc_link") == EACCES
    assert errno_of(b.open_read, "/passwd_link") == EACCES
    assert errno_of(b.open_read, "/up_out") == EACCES
    assert errno_of(b.open_read, "/sneaky/secret") == EACCES
    assert errno_of(b.getattr, "/outdir/secret") == EACCES
    assert errno_of(b.readdir, "/outdir") == EACCES
    assert errno_of(b.read_range, "/outdir/secret", 10, 0) == EACCES
    assert errno_of(b.open_write, "/outdir/new", os.O_WRONLY, 0o644, True) == EACCES
    assert errno_of(b.open_write, "/secret_link", os.O_WRONLY, 0o644, False) == EACCES
    assert errno_of(b.mkdir, "/outdir/d", 0o755) == EACCES
    assert errno_of(b.unlink, "/outdir/secret") == EACCES
    assert errno_of(b.rename, "/outdir/secret", "/stolen") == EACCES
    assert errno_of(b.rename, "/in.txt", "/outdir/in.txt") == EACCES
    assert errno_of(b.symlink, "x", "/outdir/l") == EACCES
    assert errno_of(b.chmod, "/secret_link", 0o777) == EACCES
    assert errno_of(b.chmod, "/outdir/secret", 0o777) == EACCES
    assert errno_of(b.truncate, "/secret_link", 0) == EACCES
    assert errno_of(b.utimens, "/outdir/secret", (1.0, 1.0)) == EACCES
    assert errno_of(b.setxattr, "/outdir/secret", "user.x", b"1") == EACCES
    assert errno_of(b.getxattr, "/outdir/secret", "user.x") == EACCES
    assert errno_of(b.open_read, "/loop") == errno.ELOOP
    # A link created through the channel is just text; following it is refused.
    b.symlink("/etc/passwd", "/made_link")
    assert errno_of(b.open_read, "/made_link") == EACCES

    assert sorted(os.listdir(str(outside))) == ["secret"]
    assert (outside / "secret").read_bytes() == b"SECRET"
    assert stat.S_IMODE(os.stat(str(outside / "secret")).st_mode) != 0o777

    # Links inside the export work, and a link's own attributes are no leak.
    assert read_all(b, "/rel_in") == b"x-inside"
    assert read_all(b, "/up_in") == b"inside"
    assert read_all(b, "/abs_in") == b"x-inside"
    assert read_all(b, "/subdir_link/x") == b"x-inside"
    assert b.readdir("/subdir_link") == ["x"]
    assert stat.S_ISLNK(b.getattr("/etc_link")["st_mode"])
    assert b.readlink("/etc_link") == "/etc"
    write_all(b, "/rel_in", b"through the link")
    assert (root / "sub" / "x").read_bytes() == b"through the link"
    b.unlink("/etc_link")                             # removes the link itself
    assert os.path.isdir("/etc")


def test_confined_walk_is_race_free_against_symlinks_swapped_in(jail, make_server, make_branch):
    """Another thread keeps swapping a directory and a file for symlinks that
    lead out; the client reads through them all the while and never gets out."""
    root, outside = jail
    (root / "race").mkdir()
    (root / "race" / "secret").write_bytes(b"inside")
    (root / "racef").write_bytes(b"inside")
    server = make_server(root)
    b = make_branch(server)
    stop = threading.Event()
    swaps = [0]

    def swapper():
        d, f = str(root / "race"), str(root / "racef")
        while not stop.is_set():
            os.rename(d, d + ".parked")
            os.symlink(str(outside), d)
            os.rename(f, f + ".parked")
            os.symlink(str(outside / "secret"), f)
            time.sleep(0.0005)
            os.unlink(d)
            os.rename(d + ".parked", d)
            os.unlink(f)
            os.rename(f + ".parked", f)
            swaps[0] += 1
    t = threading.Thread(target=swapper, daemon=True)
    t.start()
    outcomes = {"inside": 0, errno.EACCES: 0, errno.ENOENT: 0}
    c = confined_paths.Confined(str(root))
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            for path in ("/race/secret", "/racef"):
                try:
                    got = read_all(b, path)
                except OSError as e:
                    assert e.errno in (errno.EACCES, errno.ENOENT), e
                    outcomes[e.errno] += 1
                else:
                    assert got == b"inside"
                    outcomes["inside"] += 1
            # The resolver itself, directly, many times per swap.
            for _ in range(20):
                try:
                    fd = c.open("race/secret", os.O_RDONLY)
                except OSError as e:
                    assert e.errno in (errno.EACCES, errno.ENOENT), e
                else:
                    try:
                        assert os.read(fd, 100) == b"inside"
                    finally:
                        os.close(fd)
    finally:
        stop.set()
        t.join(5)
        c.close()
    assert swaps[0] > 10
    assert outcomes["inside"] > 0 and outcomes[errno.EACCES] > 0, outcomes


# --- read-only ------------------------------------------------------------------

def test_read_only_export_refuses_every_mutating_call(tmp_path, make_server, make_branch):
    root = tmp_path / "export"
    root.mkdir()
    (root / "f").write_bytes(b"data")
    (root / "d").mkdir()
    before = sorted(os.listdir(str(root)))
    server = make_server(root, read_only=True)
    r = raw(server)
    args = {
        "mkdir": {"path": "n", "mode": 0o755}, "rmdir": {"path": "d"}, "unlink": {"path": "f"},
        "rename": {"old": "f", "new": "g"}, "symlink": {"target": "f", "path": "l"},
        "chmod": {"path": "f", "mode": 0o777}, "truncate": {"path": "f", "length": 0},
        "utimens": {"path": "f", "times": None},
        "setxattr": {"path": "f", "name": "user.a", "value": b"1"},
        "removexattr": {"path": "f", "name": "user.a"},
        "open_write": {"path": "f", "flags": os.O_WRONLY, "mode": 0o644, "create": False},
        "write": {"fh": 1, "offset": 0, "data": b"x"}, "ftruncate": {"fh": 1, "length": 0},
        "fsync": {"fh": 1}, "close_write": {"fh": 1},
    }
    try:
        assert set(args) == set(fs_protocol.MUTATING)
        for call, a in args.items():
            assert r.call(call, a)[0] == errno.EROFS, call
            assert r.call(call, {"junk": 1})[0] == errno.EROFS, call
        assert r.call("read_file", {"path": "f", "have": None})[2] == b"data"
    finally:
        r.close()
    b = make_branch(server)
    assert errno_of(b.open_write, "/new", os.O_WRONLY, 0o644, True) == errno.EROFS
    assert errno_of(b.unlink, "/f") == errno.EROFS
    assert read_all(b, "/f") == b"data"
    assert b.statfs()["f_flag"] & os.ST_RDONLY
    assert sorted(os.listdir(str(root))) == before
    assert (root / "f").read_bytes() == b"data"
    assert stat.S_IMODE(os.stat(str(root / "f")).st_mode) != 0o777


# --- authentication -------------------------------------------------------------

@pytest.mark.parametrize("cipher", [True, False], ids=["tls", "cipher-none"])
def test_only_the_key_gets_in(tmp_path, make_server, make_branch, cipher):
    root = tmp_path / "export"
    root.mkdir()
    (root / "f").write_bytes(b"data")
    server = make_server(root, cipher=cipher)

    # Wrong key: refused at the proof, nothing served.
    wrong = make_branch(server, key=fs_protocol.data_channel_key(os.urandom(32)))
    assert errno_of(wrong.getattr, "/f") == errno.EACCES
    with pytest.raises(link_auth.AuthError):
        Raw(server.port, cipher=cipher, key=os.urandom(32), pin=server.test_pin)
    # The other mode's label is unknown to this server (no downgrade, no upgrade).
    assert errno_of(make_branch(server, cipher=not cipher).getattr, "/f") in (errno.EACCES,
                                                                             errno.EIO)
    # No key at all: a request without handshake, garbage, the other label.
    call = wire.encode_frame("fs", "c", {"op": "fs_call", "req": 1, "call": "read_file",
                                          "args": {"path": "f", "have": None}})
    for payload in (b"", call, os.urandom(300), b"GXA1\x02fs" + bytes(32)[:20]):
        assert send_and_drain(server.port, payload) == b""
    assert server.stats["connections"] == 0
    assert server.stats["refused"] >= 4

    # Replay: a recorded real session's client bytes get at most a fresh nonce.
    relay = Relay(server.port)
    try:
        b = make_branch(server, port=relay.port)
        assert read_all(b, "/f") == b"data"
        b.close()
        time.sleep(0.2)
        recorded = bytes(relay.to_server)
    finally:
        relay.close()
    assert len(send_and_drain(server.port, recorded)) in (0, 32)
    assert server.stats["connections"] == 1
    # And the right key is served.
    assert read_all(make_branch(server), "/f") == b"data"


def test_cipher_none_still_authenticates_every_frame(tmp_path, make_server, make_branch):
    """Without TLS, a man in the middle who flips one bit of a request after the
    handshake gets the connection dropped, not his request served."""
    root = tmp_path / "export"
    root.mkdir()
    (root / "f").write_bytes(b"data")
    server = make_server(root, cipher=False)
    handshake = 4 + 1 + len(fs_protocol.LABEL_PLAIN) + 32 + 32

    def tamper(offset, data):
        if offset >= handshake and len(data) > 20:      # a request: flip a body byte
            data = data[:-20] + bytes([data[-20] ^ 1]) + data[-19:]
        return data
    relay = Relay(server.port, tamper=tamper)
    try:
        b = make_branch(server, port=relay.port)
        assert errno_of(b.getattr, "/f") == errno.EIO
    finally:
        relay.close()
    assert any("bad frame MAC" in line for line in server.logs), server.logs
    assert server.stats["calls"]["getattr"] == 0


@pytest.mark.parametrize("cipher", [True, False], ids=["tls", "cipher-none"])
def test_file_data_is_encrypted_on_the_wire_unless_cipher_none(
        tmp_path, make_server, make_branch, cipher):
    root = tmp_path / "export"
    root.mkdir()
    marker = b"MARKER-" + os.urandom(8).hex().encode() + b"-MARKER"
    (root / "f").write_bytes(b"x" * 1000 + marker + b"y" * 1000)
    server = make_server(root, cipher=cipher)
    relay = Relay(server.port)
    try:
        b = make_branch(server, port=relay.port)
        assert read_all(b, "/f") == b"x" * 1000 + marker + b"y" * 1000
        write_all(b, "/g", b"z" * 500 + marker)
        b.close()
        time.sleep(0.2)
    finally:
        relay.close()
    assert (root / "g").read_bytes() == b"z" * 500 + marker
    captured = bytes(relay.to_client) + bytes(relay.to_server)
    assert len(relay.to_client) > 2000
    assert (marker in captured) == (not cipher)
    assert KEY not in captured and SECRET not in captured


# --- hostile authenticated peers --------------------------------------------------

def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _random_value(r, depth=0):
    kind = r.randrange(12 if depth < 2 else 9)
    if kind == 0:
        return None
    if kind == 1:
        return r.choice([True, False])
    if kind == 2:
        return r.choice([0, 1, -1, 7, 1 << 31, 1 << 62, (1 << 63) - 1, 1 << 64, -(1 << 70),
                         r.randrange(-1000, 1000)])
    if kind == 3:
        return r.choice([0.0, -1.5, 1e300, float("inf"), float("nan")])
    if kind == 4:
        return r.choice(["f", "fz/a", "fz", "fz/b/c", "..", "../x", "/etc/passwd", "a\x00b",
                         "fz//a", "fz/./a", "fz/\udcff", "x" * r.randrange(5000),
                         "user.k", "fz/" + "d/" * 50 + "x"])
    if kind == 5:
        return bytes(r.getrandbits(8) for _ in range(r.randrange(64)))
    if kind == 6:
        return b"\0" * r.choice([0, 1, 70000])
    if kind == 7:
        return r.choice(["fz/a", "fz/b", "fz/link"])
    if kind == 8:
        return r.randrange(0, 1 << 20)
    if kind == 9:
        return [_random_value(r, depth + 1) for _ in range(r.randrange(4))]
    return {r.choice(["path", "size", "x", 1]): _random_value(r, depth + 1)
            for _ in range(r.randrange(4))}


_ARG_NAMES = sorted({name for spec in fs_protocol.CALLS.values() for name, _ in spec})


def _random_call(r, req):
    call = r.choice(sorted(fs_protocol.CALLS) + ["", "nope", "c_getattr", "__init__", "x" * 300])
    if r.random() < 0.5 and call in fs_protocol.CALLS:
        args = {name: _random_value(r) for name, _ in fs_protocol.CALLS[call]}
        if r.random() < 0.5:
            key = r.choice(_ARG_NAMES)
            args[key] = _random_value(r)
    else:
        args = {r.choice(_ARG_NAMES + ["zz"]): _random_value(r) for _ in range(r.randrange(5))}
    return {"op": "fs_call", "req": req, "call": call, "args": args}


def _killer_frame(r, good):
    """Bytes after which a correct server drops the connection."""
    kind = r.randrange(9)
    if kind == 0:       # random bytes whose length prefix is out of bounds
        return b"\xff" + os.urandom(r.randrange(3, 300))
    if kind == 1:       # a valid length, then a body that is not a message
        body = b"\x02fs\x01c" + os.urandom(r.randrange(1, 200))
        return len(body).to_bytes(4, "big") + body
    if kind == 2:       # a huge length prefix
        return (wire.MAX_FRAME + 1 + r.randrange(1 << 30)).to_bytes(4, "big") + b"x" * 100
    if kind == 3:       # a message with the wrong op
        return wire.encode_frame("fs", "c", r.choice([
            {"op": "fs_reply", "req": 1, "errno": 0, "result": None},
            {"op": "hello"}, {"op": "quit"}, {"op": 3}, {"nope": 1}]))
    if kind == 4:       # fs_call with wrongly typed fields
        return wire.encode_frame("fs", "c", r.choice([
            {"op": "fs_call", "req": "1", "call": "getattr", "args": {}},
            {"op": "fs_call", "req": 1, "call": 5, "args": {}},
            {"op": "fs_call", "req": 1, "call": "getattr", "args": []},
            {"op": "fs_call", "req": True, "call": "getattr", "args": {}},
            {"op": "fs_call", "req": -5, "call": "getattr", "args": {}},
            {"op": "fs_call", "req": 1 << 80, "call": "getattr", "args": {}},
            {"op": "fs_call", "call": "getattr", "args": {}}]))
    if kind == 5:       # not a dict, or nested too deep, or lying counts
        body = b"\x02fs\x01c" + r.choice([serializer.dumps([1, 2]),
                                          b"\x01" + b"l\x00\x00\x00\x01" * 40 + b"N",
                                          b"\x01m\x7f\xff\xff\xff", b"\x01s\xff\xff\xff\xff"])
        return len(body).to_bytes(4, "big") + body
    if kind == 6:       # a frame cut short, then the peer closes
        return good[:r.randrange(5, len(good))]
    if kind == 7:       # bad address lengths
        body = bytes([250]) + b"x" * 10
        return len(body).to_bytes(4, "big") + body
    return b"\x00\x00\x00\x01x"        # a length below the minimum


def test_fuzz_10000_frames_from_an_authenticated_peer(tmp_path, make_server, make_branch):
    root = tmp_path / "export"
    root.mkdir()
    (root / "fz").mkdir()
    (root / "fz" / "a").write_bytes(b"a" * 5000)
    os.symlink("/etc/passwd", str(root / "fz" / "link"))
    good_data = os.urandom(300 << 10)
    (root / "observer-file.bin").write_bytes(good_data)
    server = make_server(root)
    rss0 = _rss_kib()
    counts = {"frames": 0, "replies": 0, "drops": 0}
    lock = threading.Lock()
    errors = []

    def fuzz(seed, n):
        r = random.Random(seed)
        client = None
        sent = 0
        try:
            while sent < n:
                if client is None:
                    client = raw(server)
                sent += 1
                if r.random() < 0.08:
                    good = wire.encode_frame("fs", "c", _random_call(r, 1))
                    frame = _killer_frame(r, good)
                    try:
                        client.sock.sendall(frame)
                        if len(frame) < len(good) and frame == good[:len(frame)]:
                            client.sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    assert client.is_dropped(), "server kept a connection after a bad frame"
                    client.close()
                    client = None
                    with lock:
                        counts["drops"] += 1
                        counts["frames"] += 1
                    continue
                client.req += 1
                msg = _random_call(r, client.req)
                try:
                    client.send_msg(msg)
                except ValueError:          # over the frame limit on our side: skip
                    continue
                err, _result, _data = client.wait(client.req, cancel_streams=True)
                assert isinstance(err, int)
                with lock:
                    counts["frames"] += 1
                    counts["replies"] += 1
        except Exception as e:      # reported in the main thread
            errors.append(repr(e))
        finally:
            if client is not None:
                client.close()

    threads = [threading.Thread(target=fuzz, args=(seed, 2500), daemon=True)
               for seed in (1, 2, 3, 4)]
    for t in threads:
        t.start()
    # Another client is served all the while.
    observer = make_branch(server)
    served = 0
    while any(t.is_alive() for t in threads):
        assert read_all(observer, "/observer-file.bin") == good_data
        assert "observer-file.bin" in observer.readdir("/")
        served += 1
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert counts["frames"] >= 10000 - 50
    assert counts["drops"] > 300 and counts["replies"] > 8000
    assert served >= 3
    assert server.listener.thread.is_alive()
    assert _rss_kib() - rss0 < 64 * 1024
    # One line per dropped peer, naming why.
    drops = [line for line in server.logs if "dropped" in line]
    assert len(drops) >= counts["drops"] * 0.9
    assert all("\n" not in line and len(line) < 300 for line in server.logs)
    assert read_all(observer, "/observer-file.bin") == good_data
    assert not [line for line in server.logs if "failed" in line], server.logs[:5]
    # Every handle and stream the fuzzers left open went back with their connection.
    deadline = time.monotonic() + 5
    while server.open_count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.open_count == 0


def test_slow_oversized_and_silent_peers_are_dropped_others_served(tmp_path, make_server,
                                                                   make_branch):
    root = tmp_path / "export"
    root.mkdir()
    (root / "f").write_bytes(b"data")
    server = make_server(root, frame_seconds=1.0, max_clients=4)
    b = make_branch(server)

    slow = raw(server)
    frame = wire.encode_frame("fs", "c", {"op": "fs_call", "req": 1, "call": "getattr",
                                           "args": {"path": "f"}})
    t0 = time.monotonic()
    slow.sock.sendall(frame[:10])
    assert read_all(b, "/f") == b"data"
    assert slow.is_dropped(timeout=5)
    assert time.monotonic() - t0 < 4
    slow.close()

    big = raw(server)
    big.sock.sendall((1 << 31).to_bytes(4, "big"))
    assert big.is_dropped(timeout=5)
    big.close()

    # A peer that sends requests but never reads replies stops being read; it
    # cannot make the server buffer without bound, and others are still served.
    greedy = raw(server)
    greedy.sock.settimeout(0.5)
    (root / "big").write_bytes(os.urandom(1 * MiB))
    sent = 0
    rss0 = _rss_kib()
    try:
        for i in range(400):
            greedy.send_msg({"op": "fs_call", "req": i + 1, "call": "read",
                             "args": {"path": "big", "offset": 0, "size": MiB,
                                      "pad": b"p" * (200 << 10)}})
            sent += 1
    except (socket.timeout, OSError):
        pass
    assert sent < 400                   # the server stopped reading us
    assert _rss_kib() - rss0 < 48 * 1024
    assert read_all(b, "/f") == b"data"
    greedy.close()

    # At most max_clients authenticated connections at once.
    extra = [raw(server) for _ in range(5)]
    try:
        time.sleep(0.3)
        assert any(c.is_dropped(timeout=0.5) for c in extra)
    finally:
        for c in extra:
            c.close()
    assert any("slow peer" in line for line in server.logs), server.logs
    assert any("out of bounds" in line for line in server.logs), server.logs
    assert any("too many clients" in line for line in server.logs), server.logs
