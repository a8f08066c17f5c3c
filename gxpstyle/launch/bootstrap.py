"""Bootstrap with nothing preinstalled: the first stage and the agent payload.

The channel runs `python3 -S -c '<first stage>' gxp-agent` on the target. The first
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

import struct
import zlib

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every agent ~9 ms at start; annotations are strings
    from typing import Any, Dict, List, Optional, Tuple

# The first stage announces itself and its interpreter's cache tag
# ("cpython-311"): a parent with the same tag ships precompiled code, so the
# child skips compiling ~80 KB of source (about 15 ms of CPU per agent).
MARKER = b"GXP1READY "
MAX_PAYLOAD = 1 << 24
PROCESS_TAG = "gxp-agent"

# The modules an agent needs. Everything else (planning, CLI, paramiko, YAML)
# stays on the head.
AGENT_MODULES: List[str] = [
    "gxpstyle.protocol.serializer", "gxpstyle.protocol.schema", "gxpstyle.protocol.wire",
    "gxpstyle.transport.event_loop", "gxpstyle.transport.links",
    "gxpstyle.node.job_spawn", "gxpstyle.node.job_runner", "gxpstyle.node.node_dirs",
    "gxpstyle.node.tree_exec", "gxpstyle.node.role_calls", "gxpstyle.node.local_fork",
    "gxpstyle.launch.channels",
    "gxpstyle.transport.link_auth",
    "gxpstyle.launch.bootstrap", "gxpstyle.launch.child_bootstrap", "gxpstyle.launch.batch_start",
    "gxpstyle.api.node_side",
    "gxpstyle.node.agent",
]
# The module whose main(fds) a shipped agent runs.
AGENT_ENTRY = "gxpstyle.node.agent"
# Core modules an agent gets only when the head pushes them: the node side of
# a core service (bcast's), which most agents never host, the byte streams
# along the tree and a job's calls to a role node below its node, pushed by
# the services whose nodes use them (GMount's).
SIDE_MODULES: List[str] = ["gxpstyle.bcast.direct_links", "gxpstyle.bcast.node",
                           "gxpstyle.node.tree_streams", "gxpstyle.node.node_calls"]

# The one receiver of the agent program, shared by every first stage (a
# channel's `python3 -c`, a batch job's connect-back script): read exactly a
# length-prefixed payload from fd F (never to EOF), check its SHA-256, and run it
# with the link's fds FDS. `_gxp_data`, `_gxp_fds` and `_gxp_payload` are what
# the loader below expects (`_gxp_payload`, the digest and payload as received,
# lets an agent ship the very same bytes to its children instead of building
# them again: ~90 ms of CPU per parent). Exit codes 97-99 tell the parent which
# check failed (it reads the channel's exit status). Kept terse: the -c argument
# carries it, compressed. `sha256` comes from the stage around it.
_RECEIVER = r"""
def r(n):
 b=b''
 while len(b)<n:
  c=os.read(F,n-len(b))
  if not c:os._exit(97)
  b+=c
 return b
n=struct.unpack('!I',r(4))[0]
if n>%(max)d:os._exit(98)
h=r(32);z=r(n)
if sha256(z).digest()!=h:os._exit(99)
d=zlib.decompress(z);i=d.find(b'\0');i=len(d) if i<0 else i
exec(compile(d[:i],'<gxp-agent>','exec'),{'__name__':'__gxp__','_gxp_data':d[i+1:],'_gxp_fds':FDS,'_gxp_payload':(h,z)})
"""


def payload_receiver(read_fd: str, fds: str) -> str:
    """Top-level code that receives and runs the agent program: `read_fd` and
    `fds` are expressions for the fd to read and the (read, write) fds of the link.
    The code needs os, struct and zlib imported, and a `sha256` constructor."""
    return "F,FDS=%s,%s\n%s" % (read_fd, fds, _RECEIVER.strip() % {"max": MAX_PAYLOAD})


# Runs from `python3 -S -c`; reads fd 0, writes fd 1. The marker comes first so
# the parent can skip whatever a login script prints before python starts.
# What it imports is paid by every agent: binascii, not base64 (which loads `re`
# and `enum`: 7 ms); the interpreter's own SHA-256 (_sha256, _sha2 from 3.12),
# not hashlib (which loads OpenSSL: 3 ms), hashlib only where neither exists.
# `-S` (no site module: 3 ms) is safe because an agent needs only the standard
# library.
_STAGE1 = ("import os,sys,zlib,struct\n"
           "try:from _sha256 import sha256\n"
           "except ImportError:\n"
           " try:from _sha2 import sha256\n"
           " except ImportError:from hashlib import sha256\n"
           "os.write(1,b'\\n%s'+(sys.implementation.cache_tag or 'none').encode()+b'\\n')\n"
           % MARKER.decode()
           + payload_receiver("0", "(0,1)"))


def stage1_argument() -> str:
    """The -c argument: only base64 characters inside, safe in any shell quoting."""
    import base64
    packed = base64.b64encode(zlib.compress(_STAGE1.strip().encode(), 9)).decode()
    return "import binascii,zlib;exec(zlib.decompress(binascii.a2b_base64('%s')))" % packed


def stage1_argv(python: str = "python3", tag: str = PROCESS_TAG) -> List[str]:
    """argv of the first stage. `tag` (not secret: a hash of the session path)
    makes the agent's process findable with `ps` and `pgrep -f`."""
    return [python, "-S", "-c", stage1_argument(), tag]


# The payload program. `_gxp_data` (what follows the program) and `_gxp_fds`
# come from the first stage (or from a batch job's connect-back stage).
_LOADER = r'''
import sys
from _frozen_importlib import ModuleSpec   # loaded: importlib.machinery costs 0.6 ms, .abc/.util 15

class _GxpImporter(object):
    def __init__(self, sources, codes, payload):
        self.sources = sources
        self.codes = codes
        self.payload = payload
    def find_spec(self, name, path=None, target=None):
        # A name with shipped modules under it is a package, whether or not
        # its own __init__ was shipped (an absent one runs as empty).
        prefix = name + "."
        package = any(k.startswith(prefix) for k in self.sources) \
            or any(k.startswith(prefix) for k in self.codes)
        if package or name in self.sources or name in self.codes or name == "gxpstyle":
            return ModuleSpec(name, self, is_package=package or name == "gxpstyle")
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        name = module.__name__
        if name == "gxpstyle":
            module.__gxp_sources__ = self.sources   # agents rebuild payloads from these
            module.__gxp_payload__ = self.payload   # or ship the one they got
        code = self.codes.get(name)
        if code is None:
            code = compile(self.sources.get(name, ""), "<gxp>/" + name.replace(".", "/") + ".py", "exec")
        exec(code, module.__dict__)

def _gxp_boot(entry):
    import marshal
    sources, codes = marshal.loads(_gxp_data)
    for name in list(sys.modules):
        if name == "gxpstyle" or name.startswith("gxpstyle."):
            del sys.modules[name]
    # the payload as received, when it is one a child of our interpreter can
    # take as it is (precompiled, with the sources, for the plain agent)
    payload = _gxp_payload if codes and sources else None
    sys.meta_path.insert(0, _GxpImporter(sources, marshal.loads(codes) if codes else {}, payload))
    __import__(entry)
    sys.modules[entry].main(_gxp_fds)
'''


def build_payload(sources: Dict[str, str], codes: Optional[bytes] = None,
                  entry: str = AGENT_ENTRY) -> Tuple[bytes, bytes]:
    """(sha256 digest, zlib payload) of the agent program for the given sources,
    with marshalled code objects for one interpreter version when `codes` is
    given; the program runs `main(fds)` of the module named `entry`."""
    # The sources and the code objects follow the program after a NUL (which
    # Python source never holds), marshalled: as a literal in the program the
    # sources cost every agent 2.8 ms of compiling, and a repr of the code 25%
    # more bytes. Version 4 is read by every Python 3 the agent runs on (a dict
    # of strings, and the code, as bytes, only for our own interpreter).
    import marshal
    program = (_LOADER + "\n_gxp_boot(%r)\n" % entry).encode("utf-8")
    program += b"\0" + marshal.dumps((sources, codes or b""), 4)
    # Level 6, not 9: as small within 1% and 4x cheaper (120 vs 31 ms for the
    # payload with the mount code, paid by every agent that starts a service).
    z = zlib.compress(program, 6)
    if len(z) > MAX_PAYLOAD:
        raise ValueError("agent payload too large")
    import hashlib  # here: hashlib loads OpenSSL, 3 ms of every agent's start
    return hashlib.sha256(z).digest(), z


def head_sources() -> Dict[str, str]:
    """The agent modules' sources from the head's installation, with the
    packages holding them whose __init__ has code: the loader makes any name
    with shipped modules under it a package, so an empty one (or a docstring)
    would only cost payload bytes."""
    sources = module_sources(AGENT_MODULES)
    return {name: src for name, src in sources.items() if name in AGENT_MODULES or _has_code(src)}


def _has_code(src: str) -> bool:
    import ast
    body = ast.parse(src).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return bool(body)


# Modules the head may push into live agents: any but the core's own (a push
# must never replace the agent's code), by a plain dotted name.
MAX_MODULES_BLOB = 16 << 20


def pushable(name: str) -> bool:
    """A module the head may push: never one of the agent's own core."""
    parts = name.split(".")
    return name in SIDE_MODULES or name in _side_packages() or (
        bool(name) and parts[0] != "gxpstyle" and all(p.isidentifier() for p in parts))


def _side_packages() -> List[str]:
    """The packages of the side modules that hold no module of the agent's own
    (a push brings a module's package with it; one the agent runs from must
    never be replaced)."""
    def parents(name: str) -> List[str]:
        parts = name.split(".")
        return [".".join(parts[:i]) for i in range(2, len(parts))]
    core = {p for m in AGENT_MODULES for p in parents(m)}
    return [p for m in SIDE_MODULES for p in parents(m) if p not in core]


def module_sources(names: List[str]) -> Dict[str, str]:
    """Sources of installed modules (and their packages) by name, on the head."""
    import importlib.util
    out: Dict[str, str] = {}
    # every agent has these packages (a side module may live in one: tree_streams)
    core = {".".join(m.split(".")[:i]) for m in AGENT_MODULES for i in range(1, m.count(".") + 1)}
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            sub = ".".join(parts[:i])
            if sub in out or sub in core:
                continue
            # Read, not import: the mount code (libfuse through ctypes) need
            # not be loaded into the head to be pushed.
            spec = importlib.util.find_spec(sub)
            if spec is None or not spec.origin or not spec.origin.endswith(".py"):
                raise ImportError("no Python source for module %s" % sub)
            with open(spec.origin, encoding="utf-8") as f:
                out[sub] = f.read()
    return out


def pack_modules(sources: Dict[str, str]) -> bytes:
    from gxpstyle.protocol import serializer
    return zlib.compress(serializer.dumps(sources), 6)


def unpack_modules(blob: bytes) -> Dict[str, str]:
    """Decode a pushed module set, refusing anything but pushable names and text."""
    from gxpstyle.protocol import serializer
    d = zlib.decompressobj()
    raw = d.decompress(blob, MAX_MODULES_BLOB)
    if d.unconsumed_tail:
        raise ValueError("module blob too large")
    sources = serializer.loads(raw)
    if not isinstance(sources, dict):
        raise ValueError("module blob is not a dict")
    for k, v in sources.items():
        if not isinstance(k, str) or not isinstance(v, str) or not pushable(k):
            raise ValueError("module %r may not be pushed" % (k,))
    return sources


def install_sources(sources: Dict[str, str]) -> None:
    """On a shipped agent: make pushed modules importable (the loader's importer
    and the payload sources share one dict)."""
    import sys
    shared = sys.modules["gxpstyle"].__gxp_sources__
    shared.update(sources)


def agent_sources() -> Dict[str, str]:
    """On a shipped agent: the sources the loader received."""
    import sys
    return dict(sys.modules["gxpstyle"].__gxp_sources__)


def module_source(module: Any) -> str:
    """Source of a shipped module, on the head (from its file) or on an agent (kept
    in memory by the loader, as the gxpstyle package's __gxp_sources__: a gateway
    that submits batch jobs writes link_auth's into their scripts)."""
    import sys
    src = getattr(module, "__gxp_source__", None)
    if src is None:
        shipped = getattr(sys.modules.get("gxpstyle"), "__gxp_sources__", None) or {}
        src = shipped.get(module.__name__)
    if src is None:
        import inspect
        src = inspect.getsource(module)
    return src


def agent_payload() -> Optional[Tuple[bytes, bytes]]:
    """On a shipped agent: the (digest, payload) it was started with, when
    that is the precompiled plain agent for its own interpreter (what it ships
    to a child of the same interpreter), else None."""
    import sys
    return getattr(sys.modules["gxpstyle"], "__gxp_payload__", None)


class PayloadCache:
    """Payloads by the child's cache tag: precompiled for our own interpreter's
    tag, source for any other (marshal is not portable across versions)."""

    def __init__(self, sources: Dict[str, str],
                 received: Optional[Tuple[bytes, bytes]] = None) -> None:
        self.sources = sources
        # Modules the head pushed: only service children get them. An agent
        # explored after a mount still gets the small payload (the mount code
        # is three times the agent's own).
        self.extra: Dict[str, str] = {}
        self.built: Dict[Tuple[Optional[str], bool], Tuple[bytes, bytes]] = {}
        if received is not None:
            # what this agent got is what for_tag would build for its own tag
            import sys
            self.built[(sys.implementation.cache_tag, False)] = received

    def add(self, sources: Dict[str, str]) -> None:
        """More modules (pushed by the head): later service children get them."""
        if any(self.extra.get(k) != v for k, v in sources.items()):
            self.extra.update(sources)
            self.built = {k: v for k, v in self.built.items() if not k[1]}

    def preset(self, tag: str, payload: Any) -> bool:
        """A service payload the head built for `tag` after a module push:
        taken (and not built here again: compile and compress were most of a
        first mount's time, paid by every agent) when it is for our own
        interpreter and well-formed."""
        import sys
        if (tag != sys.implementation.cache_tag or not isinstance(payload, list)
                or len(payload) != 2 or not all(isinstance(p, bytes) for p in payload)):
            return False
        self.built[(tag, True)] = (payload[0], payload[1])
        return True

    def for_tag(self, tag: Optional[str], service: bool = False) -> Tuple[bytes, bytes]:
        """The payload for a child whose first stage reported `tag`. A service
        child (a mount) never starts children of its own, so with matching
        code it gets code only, no sources: a third less to send to every node."""
        import sys
        own = sys.implementation.cache_tag
        key = (tag if (tag and tag == own) else None, bool(service))
        if key not in self.built:
            codes = None
            sources = dict(self.sources)
            if service:
                sources.update(self.extra)
            if key[0] is not None:
                import marshal
                codes = marshal.dumps({name: compile_shipped(name, src)
                                       for name, src in sources.items()})
                if service:
                    sources = {}
            self.built[key] = build_payload(sources, codes)
        return self.built[key]


def compile_shipped(name: str, src: str) -> Any:
    """Code for the payload, without docstrings (a tenth of the payload: the
    sources beside it keep them); asserts and line numbers stay."""
    import ast
    tree = ast.parse(src)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            doc = body.pop(0)
            if not body:
                body.append(ast.copy_location(ast.Pass(), doc))
    return compile(tree, "<gxp>/" + name.replace(".", "/") + ".py", "exec")


def payload_wire(payload: Tuple[bytes, bytes]) -> bytes:
    """What the first stage reads after its marker: length, digest, payload."""
    digest, z = payload
    return struct.pack("!I", len(z)) + digest + z
