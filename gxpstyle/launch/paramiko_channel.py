"""The `paramiko` channel: SSH from inside the head process, no ssh binary.

It reads ~/.ssh/config (HostName, User, Port, IdentityFile) and the user's
known_hosts, and refuses unknown host keys, like `ssh -o BatchMode=yes`. The
connection runs in a thread; its stdout/stdin and stderr reach the event loop
through socketpairs, so the bootstrap is the same as for a child process.
Head only: paramiko is not shipped to agents.
"""
from __future__ import annotations

import os
import socket
import threading
from typing import Any

from gxpstyle.launch import channels


def _connect(target: str, spec: dict, timeout: float) -> Any:
    import paramiko
    cfg = paramiko.SSHConfig()
    path = os.path.expanduser("~/.ssh/config")
    if os.path.exists(path):
        with open(path) as f:
            cfg.parse(f)
    host = cfg.lookup(target)
    client = paramiko.SSHClient()
    client.load_system_host_keys()
    known = host.get("userknownhostsfile")
    for kh in (known.split() if known else []):
        kh = os.path.expanduser(kh)
        if os.path.exists(kh):
            client.load_host_keys(kh)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    key_files = [spec["identity_file"]] if spec.get("identity_file") else \
        [os.path.expanduser(p) for p in host.get("identityfile", [])] or None
    client.connect(host.get("hostname", target),
                   port=int(spec.get("port") or host.get("port", 22)),
                   username=spec.get("user") or host.get("user"),
                   key_filename=key_files, timeout=timeout, banner_timeout=timeout,
                   auth_timeout=timeout, allow_agent=True, look_for_keys=key_files is None)
    return client


def _pump(chan: Any, data_sock: socket.socket, err_sock: socket.socket) -> None:
    """Copy between the paramiko channel and our socketpairs until either side ends."""
    import select
    data_sock.setblocking(True)
    try:
        while True:
            r, _, _ = select.select([chan, data_sock], [], [], 1.0)
            if chan in r or chan.recv_ready() or chan.recv_stderr_ready():
                while chan.recv_stderr_ready():
                    err_sock.sendall(chan.recv_stderr(65536))
                if chan.recv_ready():
                    data = chan.recv(65536)
                    if not data:
                        break
                    data_sock.sendall(data)
                elif chan.exit_status_ready() and not chan.recv_ready():
                    break
            if data_sock in r:
                data = data_sock.recv(65536)
                if not data:
                    chan.shutdown_write()
                    break
                chan.sendall(data)
    except (OSError, EOFError):
        pass
    finally:
        for s in (data_sock, err_sock):
            try:
                s.close()
            except OSError:
                pass
        chan.close()


def start(node: Any, cs: Any) -> None:
    """Start a child over paramiko (an agent `extra_channels` hook)."""
    state = {"client": None}

    def kill() -> None:
        client = state["client"]
        if client is not None:
            client.close()

    cs.kill_hook = kill

    def work() -> None:
        try:
            client = _connect(cs.target, cs.spec, cs.timeout)
        except Exception as e:   # paramiko raises many types; all mean "no login"
            # In the user's words: paramiko's own text, or what the failure means.
            reason = (getattr(e, "strerror", None) or str(e).strip().splitlines()[0]
                      if str(e).strip() else "could not log in")
            node.loop.call_soon_threadsafe(lambda: cs._finish(False, "paramiko: " + reason))
            return
        state["client"] = client
        chan = client.get_transport().open_session()
        chan.exec_command(channels.remote_command(cs.spec))
        ours, theirs = socket.socketpair()
        err_ours, err_theirs = socket.socketpair()
        threading.Thread(target=_pump, args=(chan, theirs, err_theirs), daemon=True).start()
        fd = ours.detach()
        efd = err_ours.detach()

        def attach() -> None:
            if cs.finished:
                os.close(fd)
                os.close(efd)
                return
            cs.attach(fd, fd, efd, need_marker=True)
        node.loop.call_soon_threadsafe(attach)

    threading.Thread(target=work, daemon=True).start()
