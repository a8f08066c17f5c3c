"""Bootstrap with nothing preinstalled: the first stage and the agent payload.

The channel runs `python3 -c '<first stage>' gxp-agent` on the target. The first
stage (a few hundred bytes, base64 of zlib) announces itself with a fixed marker
on stdout, reads an exact length-prefixed payload from stdin (never to EOF),
checks its SHA-256, and executes it. The payload is the agent's modules, shipped
from the head's own installation and kept in memory: nothing is written to the
target's disk. Agents keep the compressed payload to bootstrap their own children,
so the agent code crosses each link once. (Idea from mitogen's first stage; the
marker lets us skip whatever a login script prints before python starts.)

Shipped to agents (the agent re-ships itself): standard library only, Python 3.8.
"""
from __future__ import annotations

import hashlib
import struct
import zlib

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Dict, List, Tuple

MARKER = b"GXP1READY\n"
MAX_PAYLOAD = 1 << 24
PROCESS_TAG = "gxp-agent"

# The modules an agent needs. Everything else (planning, CLI, paramiko, YAML)
# stays on the head.
AGENT_MODULES: List[str] = [
    "gxpstyle.serializer", "gxpstyle.wire", "gxpstyle.event_loop", "gxpstyle.links",
    "gxpstyle.job_runner", "gxpstyle.channels", "gxpstyle.link_auth",
    "gxpstyle.bootstrap", "gxpstyle.child_bootstrap", "gxpstyle.agent",
]

# Runs from `python3 -c`; reads fd 0, writes fd 1. Exit codes 97-99 tell the
# parent which check failed (it reads the channel's exit status).
_STAGE1 = r"""
import os,sys,zlib,hashlib,struct
def r(n):
 b=b''
 while len(b)<n:
  c=os.read(0,n-len(b))
  if not c:os._exit(97)
  b+=c
 return b
os.write(1,b'\nGXP1READY\n')
n=struct.unpack('!I',r(4))[0]
if n>16777216:os._exit(98)
h=r(32);z=r(n)
if hashlib.sha256(z).digest()!=h:os._exit(99)
exec(compile(zlib.decompress(z),'<gxp-agent>','exec'),{'__name__':'__gxp__','_gxp_payload':(h,z),'_gxp_fds':(0,1)})
"""


def stage1_argument() -> str:
    """The -c argument: only base64 characters inside, safe in any shell quoting."""
    import base64
    packed = base64.b64encode(zlib.compress(_STAGE1.strip().encode(), 9)).decode()
    return "import base64,zlib;exec(zlib.decompress(base64.b64decode('%s')))" % packed


def stage1_argv(python: str = "python3", tag: str = PROCESS_TAG) -> List[str]:
    """argv of the first stage. `tag` (not secret: a hash of the session path)
    makes the agent's process findable with `ps` and `pgrep -f`."""
    return [python, "-c", stage1_argument(), tag]


# The payload program. `_gxp_payload` and `_gxp_fds` come from the first stage
# (or from a batch job's connect-back stage).
_LOADER = r'''
import sys
from importlib.machinery import ModuleSpec   # not importlib.abc/util: 15 ms lighter

class _GxpImporter(object):
    def __init__(self, sources):
        self.sources = sources
    def find_spec(self, name, path=None, target=None):
        if name in self.sources or name == "gxpstyle":
            return ModuleSpec(name, self, is_package=(name == "gxpstyle"))
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        src = self.sources.get(module.__name__, "")
        module.__gxp_source__ = src
        exec(compile(src, "<gxp>/" + module.__name__.replace(".", "/") + ".py", "exec"), module.__dict__)

def _gxp_boot(sources):
    for name in list(sys.modules):
        if name == "gxpstyle" or name.startswith("gxpstyle."):
            del sys.modules[name]
    sys.meta_path.insert(0, _GxpImporter(sources))
    from gxpstyle import agent
    agent.main(_gxp_fds, _gxp_payload)
'''


def build_payload(sources: Dict[str, str]) -> Tuple[bytes, bytes]:
    """(sha256 digest, zlib payload) of the agent program for the given sources."""
    program = _LOADER + "\n_gxp_boot(%r)\n" % (sources,)
    z = zlib.compress(program.encode("utf-8"), 9)
    if len(z) > MAX_PAYLOAD:
        raise ValueError("agent payload too large")
    return hashlib.sha256(z).digest(), z


def head_payload() -> Tuple[bytes, bytes]:
    """Build the payload from the head's installed modules."""
    import importlib
    import inspect
    sources = {}
    for name in AGENT_MODULES:
        sources[name] = inspect.getsource(importlib.import_module(name))
    return build_payload(sources)


def payload_wire(payload: Tuple[bytes, bytes]) -> bytes:
    """What the first stage reads after its marker: length, digest, payload."""
    digest, z = payload
    return struct.pack("!I", len(z)) + digest + z
