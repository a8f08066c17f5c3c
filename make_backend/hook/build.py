"""Where `gxpc make`'s compiled hook lives, and how it is built.

`scripts/install` builds it into the venv (`python -m make_backend.hook.build`);
a machine where that did not happen builds it on first use into the user's
cache when a C compiler exists. With neither, `gxpc make` falls back to the
Python job shell (job_shell.py): correct, but slower (about 40 ms of CPU a
recipe) and visible to the makefile as $(SHELL).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Optional, Tuple

from make_backend.hook import c_source as hook_c

SHIM, CLIENT = "libgxpmake.so", "gxpmake-job"


HOW = "cc -O2; client -static when it links"   # part of the tag: a new way, a new build


def _tag() -> str:
    return hashlib.sha256((HOW + hook_c.SHIM + hook_c.CLIENT).encode()).hexdigest()[:12]


def install_dir() -> str:
    return os.path.join(sys.prefix, "lib", "gxpstyle-make-hook-" + _tag())


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gxpstyle", "make-hook-" + _tag())


def _complete(d: str) -> Optional[Tuple[str, str]]:
    shim, client = os.path.join(d, SHIM), os.path.join(d, CLIENT)
    if os.path.isfile(shim) and os.access(client, os.X_OK):
        return shim, client
    return None


def compiler() -> Optional[str]:
    for cc in (os.environ.get("CC") or "", "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


def build(dest: str) -> Tuple[str, str]:
    """Compile both into dest (atomically: a half-built directory is never used)."""
    cc = compiler()
    if cc is None:
        raise OSError("no C compiler (cc, gcc or clang)")
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=parent)
    try:
        for name, src, extra in ((SHIM, hook_c.SHIM, ["-shared", "-fPIC"]), (CLIENT, hook_c.CLIENT, [])):
            c_file = os.path.join(tmp, name + ".c")
            with open(c_file, "w") as f:
                f.write(src)
            argv = [cc, "-O2", "-o", os.path.join(tmp, name), c_file] + extra
            if name == SHIM:
                argv.append("-ldl")
            else:   # static when libc allows: it starts in 0.3 ms of CPU, not 0.5
                r = subprocess.run(argv + ["-static"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                if r.returncode == 0:
                    os.unlink(c_file)
                    continue
            r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                raise OSError("%s failed: %s" % (cc, r.stdout.decode(errors="replace").strip()[:300]))
            os.unlink(c_file)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, dest)
        except OSError:
            if _complete(dest) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    found = _complete(dest)
    assert found is not None
    prefix = os.path.basename(dest).rsplit("-", 1)[0] + "-"
    for old in os.listdir(parent):   # builds of older sources
        if old.startswith(prefix) and os.path.join(parent, old) != dest:
            shutil.rmtree(os.path.join(parent, old), ignore_errors=True)
    return found


def find_or_build() -> Optional[Tuple[str, str]]:
    """(shim, client) paths, or None when there is no hook and no compiler."""
    for d in (install_dir(), cache_dir()):
        found = _complete(d)
        if found:
            return found
    try:
        return build(cache_dir())
    except OSError:
        return None


if __name__ == "__main__":
    try:
        print(build(install_dir())[0])
    except OSError as e:
        sys.stderr.write("make hook not built (%s); gxpc make will use its Python job shell\n" % e)
