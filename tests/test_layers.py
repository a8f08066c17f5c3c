"""Which package may import which: gxpstyle is the core and imports neither
sshfsmux nor make_backend; the two services import the core and never each
other (docs/how-it-works.md says why)."""
import os

def _imports(path):
    import ast
    tree = ast.parse(open(path).read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
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
        for name in sorted(os.listdir(os.path.join(repo, pkg))):
            if not name.endswith(".py"):
                continue
            for mod in _imports(os.path.join(repo, pkg, name)):
                top = mod.split(".")[0]
                if top in ours and top not in may:
                    wrong.append("%s/%s imports %s" % (pkg, name, mod))
    assert wrong == []
