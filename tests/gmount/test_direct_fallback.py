"""The data channel's way when no direct connection can be made (issue 28:
sites whose hosts cannot reach each other): found by trying, a branch whose
direct connection is refused, or answered by something that is not the
export, connects through `via_tree` (in a session: a stream along the tree,
NodeHost.open_stream) and keeps to it; without one it fails as before."""
from __future__ import annotations

import errno
import socket
import threading
import time

from test_export_server import errno_of, make_branch, make_server, read_all  # noqa: F401  (fixtures)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Impostor:
    """A listener that is not the export (another host behind the same
    private address): it answers every connection with junk and counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.sendall(b"SSH-2.0-not-the-export\r\n" * 8)
            conn.close()

    def close(self) -> None:
        self.sock.close()


def tree_way(server, ways: list):
    def via(timeout: float) -> socket.socket:
        ways.append(timeout)
        return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    return via


def write_file(root, name: str, data: bytes) -> None:
    (root / name).write_bytes(data)


def test_a_refused_direct_connection_goes_through_the_tree(tmp_path, make_server, make_branch):  # noqa: F811
    root = tmp_path / "export"
    root.mkdir()
    write_file(root, "f", b"held over there\n")
    server = make_server(root)
    ways: list = []
    b = make_branch(server, port=free_port(), via_tree=tree_way(server, ways))
    assert read_all(b, "/f") == b"held over there\n"
    assert len(ways) == 1 and b.tree_only and b.stats["tree"] == 1


def test_an_impostor_is_passed_over_and_never_asked_again(tmp_path, make_server, make_branch):  # noqa: F811
    root = tmp_path / "export"
    root.mkdir()
    write_file(root, "f", b"the real one\n")
    server = make_server(root)
    impostor = Impostor()
    try:
        ways: list = []
        b = make_branch(server, port=impostor.port, via_tree=tree_way(server, ways))
        assert read_all(b, "/f") == b"the real one\n"
        assert impostor.accepted == 1 and len(ways) == 1
        b._chan.close("dropped by the test")
        deadline = time.monotonic() + 10
        while b._chan.dead is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b.getattr("/f")["st_size"] == len(b"the real one\n")
        assert impostor.accepted == 1 and len(ways) == 2     # straight along the tree
    finally:
        impostor.close()


def test_without_a_tree_way_refused_fails_as_before(tmp_path, make_server, make_branch):  # noqa: F811
    root = tmp_path / "export"
    root.mkdir()
    server = make_server(root)
    b = make_branch(server, port=free_port())
    assert errno_of(b.getattr, "/") == errno.EIO and not b.tree_only


def test_an_address_that_does_not_answer_within_the_bound_is_passed_over(tmp_path, make_server,  # noqa: F811
                                                                          make_branch):  # noqa: F811
    """A listener that never answers (a half-open path, a host that is gone):
    the direct attempt ends at the connect bound, then the tree is taken."""
    root = tmp_path / "export"
    root.mkdir()
    write_file(root, "f", b"late but there\n")
    server = make_server(root)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)          # never accepted: connect() succeeds, nothing answers
    try:
        ways: list = []
        b = make_branch(server, port=silent.getsockname()[1], connect_timeout=1.0,
                        via_tree=tree_way(server, ways))
        t = time.monotonic()
        assert read_all(b, "/f") == b"late but there\n"
        assert len(ways) == 1 and 1.0 <= time.monotonic() - t < 10
    finally:
        silent.close()
