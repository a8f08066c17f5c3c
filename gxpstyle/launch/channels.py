"""How a parent starts the first stage on a target, per channel.

Process channels (local, ssh, rsh, sh) give an argv whose stdin/stdout become the
link. Batch channels (torque, slurm) give a job script and a submit command; the
job connects back to the parent over an authenticated TLS link (link_auth).
The paramiko channel lives on the head only (paramiko_channel.py).

Nothing secret ever goes on a command line: /proc/*/cmdline is world-readable.

Shipped to agents: standard library only, Python 3.8 syntax.
"""
from __future__ import annotations

from gxpstyle.launch import bootstrap

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any, Dict, List

PROCESS_CHANNELS = ("local", "ssh", "rsh", "sh")
BATCH_CHANNELS = ("torque", "slurm")


class ChannelError(ValueError):
    pass


def remote_command(spec: Dict[str, Any]) -> str:
    """The shell command line that starts the first stage on the target."""
    import shlex  # imported here: agents that start no children never pay for it
    python = spec.get("python") or "python3"
    argv = bootstrap.stage1_argv(python, spec.get("tag") or bootstrap.PROCESS_TAG)
    return " ".join(shlex.quote(a) for a in argv)


def process_argv(channel: str, target: str, spec: Dict[str, Any]) -> List[str]:
    if channel == "local":
        return bootstrap.stage1_argv(spec.get("python") or "python3",
                                     spec.get("tag") or bootstrap.PROCESS_TAG)
    cmd = remote_command(spec)
    if channel == "ssh":
        timeout = int(max(1, min(float(spec.get("timeout") or 20), 300)))
        argv = ["ssh", "-T", "-x", "-a",
                "-o", "BatchMode=yes",
                "-o", "ConnectTimeout=%d" % timeout,
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                "-o", "LogLevel=ERROR"]
        if spec.get("user"):
            argv += ["-l", spec["user"]]
        if spec.get("port"):
            argv += ["-p", str(spec["port"])]
        if spec.get("identity_file"):
            argv += ["-i", spec["identity_file"]]
        for o in spec.get("ssh_options") or []:
            # `-o ProxyJump=gw` gives "ProxyJump=gw": ssh's -o goes with it
            # (alone, ssh took it as the host); "-oX" or "-v" pass as given
            argv += [o] if o.startswith("-") else ["-o", o]
        # "--" so that a host name can never be read as an ssh option.
        return argv + ["--", target, cmd]
    if channel == "rsh":
        argv = ["rsh"]
        if spec.get("user"):
            argv += ["-l", spec["user"]]
        return argv + [target, cmd]
    if channel == "sh":
        import shlex
        template = spec.get("template") or ""
        if not template.strip():
            raise ChannelError("sh channel needs a template")
        quoted_cmd = shlex.quote(cmd)
        line = template.replace("{host}", shlex.quote(target))
        line = line.replace("{cmd}", quoted_cmd) if "{cmd}" in template else line + " " + quoted_cmd
        return ["/bin/sh", "-c", line]
    raise ChannelError("not a process channel: %s" % channel)


# The connect-back stage a batch job runs: authenticate to the parent over TLS,
# then the same receiver as every first stage (bootstrap.payload_receiver) on the
# relay's fds. It carries a one-time token for this one child (not the session
# secret), so the script file is written 0600 and the token is never on a command
# line. Placeholders are filled by job_script().
_JOB_STAGE = r'''
import os, sys, socket, struct, zlib
from hashlib import sha256
HOST, PORT, CHILD, TOKEN, PIN = %(host)r, %(port)d, %(child)r, bytes.fromhex(%(token)r), %(pin)r
%(link_auth)s
sock = socket.create_connection((HOST, PORT), timeout=30)
tls = client_handshake(sock, CHILD, TOKEN, PIN)
tls.settimeout(None)
RELAY = start_relay(tls)
%(receiver)s
'''


def job_script(channel: str, spec: Dict[str, Any], child: str, host: str, port: int,
               token: bytes, pin: str, link_auth_source: str, err_path: str) -> str:
    python = spec.get("python") or "python3"
    shebang = "#!%s" % python if python.startswith("/") else "#!/usr/bin/env %s" % python
    lines = [shebang]
    name = "gxp-" + child.replace(".", "-")
    if channel == "slurm":
        lines.append("#SBATCH --job-name=%s" % name)
        lines.append("#SBATCH --output=/dev/null")
        lines.append("#SBATCH --error=%s" % err_path)
    body = _JOB_STAGE % {"host": host, "port": port, "child": child, "token": token.hex(),
                         "pin": pin, "link_auth": link_auth_source,
                         "receiver": bootstrap.payload_receiver("RELAY[0]", "RELAY")}
    return "\n".join(lines) + "\n" + body


def submit_argv(channel: str, spec: Dict[str, Any], child: str, script: str, err_path: str) -> List[str]:
    name = "gxp-" + child.replace(".", "-")
    if channel == "slurm":
        argv = ["sbatch", "--parsable"]
        if spec.get("queue"):
            argv += ["--partition", spec["queue"]]
        if spec.get("job_time"):
            argv += ["--time", spec["job_time"]]
        return argv + list(spec.get("batch_options") or []) + [script]
    if channel == "torque":
        argv = ["qsub", "-N", name, "-o", "/dev/null", "-e", err_path]
        if spec.get("queue"):
            argv += ["-q", spec["queue"]]
        if spec.get("job_time"):
            argv += ["-l", "walltime=%s" % spec["job_time"]]
        return argv + list(spec.get("batch_options") or []) + [script]
    raise ChannelError("not a batch channel: %s" % channel)


def cancel_argv(channel: str, job_id: str) -> List[str]:
    return ["scancel", job_id] if channel == "slurm" else ["qdel", job_id]


def parse_job_id(channel: str, out: str) -> str:
    text = out.strip().splitlines()[-1].strip() if out.strip() else ""
    if channel == "slurm":
        text = text.split(";")[0]
    if not text:
        raise ChannelError("no job id in submit output")
    return text
