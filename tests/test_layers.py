"""Which package may import which: gxpstyle is the core and imports neither
sshfsmux nor make_backend; the two services import the core and never each
other (docs/how-it-works.md says why)."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _is_module(dotted):
    base = os.path.join(REPO, *dotted.split("."))
    return os.path.isfile(base + ".py") or os.path.isdir(base)


def _imports(path):
    """The modules a file imports; `from P import m` counts as P.m when m is a
    module of ours (else `from gxpstyle import daemon` would read as gxpstyle)."""
    import ast
    tree = ast.parse(open(path).read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods = [node.module + "." + a.name for a in node.names
                    if _is_module(node.module + "." + a.name)]
            found.update(mods)
            if len(mods) < len(node.names):     # names defined in node.module itself
                found.add(node.module)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(str(node.args[0].value))
    return found


def test_packages_import_only_downward():
    """gxpstyle is the core: it imports neither sshfsmux nor make_backend; the
    two services import the core and never each other."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    allowed = {"gxpstyle": {"gxpstyle"}, "sshfsmux": {"gxpstyle", "sshfsmux"},
               "make_backend": {"gxpstyle", "make_backend"}}
    ours = set(allowed)
    wrong = []
    for pkg, may in allowed.items():
        for folder, _, files in sorted(os.walk(os.path.join(repo, pkg))):
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                name = os.path.relpath(path, os.path.join(repo, pkg))
                for mod in _imports(path):
                    top = mod.split(".")[0]
                    if top in ours and top not in may:
                        wrong.append("%s/%s imports %s" % (pkg, name, mod))
    assert wrong == []


# The core's public interface for services: what a service package (sshfsmux,
# make_backend, a plugin such as tests/example_service) may import of
# gxpstyle. The head's private side (daemon, service_host, job_table), the
# agent's, and the core services' own modules are not in it: a service reaches
# those only through HeadAPI and the interfaces they declare.
# safe_paths checks the files a user names (joblogs, traces, images). The event
# loop is the one I/O model: node sides get it (NodeHost.loop) and a
# service's client side (make's relay) runs on it.
PUBLIC = {"gxpstyle.api.services", "gxpstyle.api.head_api", "gxpstyle.api.interfaces",
          "gxpstyle.api.node_side",
          "gxpstyle.protocol.schema", "gxpstyle.protocol.wire", "gxpstyle.config.limits",
          "gxpstyle.config.hostpattern",
          "gxpstyle.transport.link_auth", "gxpstyle.gxpc.client", "gxpstyle.gxpc.verbs",
          "gxpstyle.transport.event_loop",
          "gxpstyle.config.safe_paths"}
HEAD_PRIVATE = {"gxpstyle.head.daemon", "gxpstyle.head.service_host", "gxpstyle.head.job_table",
                "gxpstyle.node.agent"}
# Each core service's own modules.
CORE_SERVICES = {
    "explore": {"gxpstyle.head.explorer", "gxpstyle.head.spanning_tree", "gxpstyle.config.use_rules"},
    "exec": {"gxpstyle.shell.service"},
    "bcast": {"gxpstyle.bcast.service", "gxpstyle.bcast.plan", "gxpstyle.bcast.node",
              "gxpstyle.bcast.direct_links"},
    "replicas": {"gxpstyle.replicas.service", "gxpstyle.replicas.catalog"},
}
# The explorer builds the tree: its HeadAPI is the head's TreeHost.
ALLOWED = {("gxpstyle.head.explorer", "gxpstyle.head.service_host")}


def _modules(repo, folder, dotted):
    for d, _, files in os.walk(os.path.join(repo, folder)):
        for name in sorted(files):
            if name.endswith(".py") and "__pycache__" not in d:
                rel = os.path.relpath(os.path.join(d, name), os.path.join(repo, folder))
                yield dotted + "." + rel[:-3].replace(os.sep, ".").replace(".__init__", ""), \
                    os.path.join(d, name)


def test_services_use_only_the_public_interface_of_the_core():
    """sshfsmux, make_backend and the example service import of gxpstyle only
    the public service interface: never the head's internals, the agent, or
    a core service's own modules."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    wrong = []
    for folder, dotted in (("sshfsmux", "sshfsmux"), ("make_backend", "make_backend"),
                           ("tests/example_service", "example")):
        for mod, path in _modules(repo, folder, dotted):
            for imp in _imports(path):
                if imp.split(".")[0] == "gxpstyle" and imp != "gxpstyle" and imp not in PUBLIC:
                    wrong.append("%s imports %s" % (mod, imp))
    assert wrong == []


def test_core_services_import_neither_each_other_nor_the_heads_internals():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    owner = {m: svc for svc, mods in CORE_SERVICES.items() for m in mods}
    wrong = []
    for mod, path in _modules(repo, "gxpstyle", "gxpstyle"):
        if mod not in owner:
            continue
        for imp in _imports(path):
            other = owner.get(imp)
            if (imp in HEAD_PRIVATE or (other is not None and other != owner[mod])) \
                    and (mod, imp) not in ALLOWED:
                wrong.append("%s imports %s" % (mod, imp))
    assert wrong == []
