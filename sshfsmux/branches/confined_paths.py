"""Resolve branch-relative paths inside an export root, race-free.

Every agent-side file operation goes through here. A path from the wire is
relative to the export root: "" names the root, "a/b" a file below it. Absolute
paths and ".." are refused with EACCES before anything is touched; empty or "."
components, NUL and undecodable names with EINVAL.

The walk never hands a path string with more than one component to the kernel.
It holds a file descriptor for each directory it went through and opens the next
component relative to it with O_NOFOLLOW, so a symlink that appears (or is
swapped in) at any moment is either seen as a symlink or not followed at all;
there is no window between a check and a use. Symlinks met on the way are read
and expanded by the same walk: a relative target continues from the directory
holding the link, ".." pops the stack of directories we actually went through
(never above the root: EACCES), an absolute target must lie under the root's real
path (else EACCES), and more than 40 expansions give ELOOP.

The result of a walk is (dir_fd, name): the directory that holds the object and
its name there ("." for the root itself). Callers use the *at() calls with
follow_symlinks=False / O_NOFOLLOW on that pair. When the final component is to
be followed (open, chmod, truncate), `open` and `open_object` retry the walk if
the final component turned into a symlink after it was looked at.

Standard library only, Python 3.8 syntax (agents load this to serve exports).
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator, List, Tuple

MAX_LINKS = 40          # like the kernel's limit on nested symlinks
PATH_MAX = 4096         # bytes: what one system call takes (symlink targets)
# bytes of a path from the export root. Larger than PATH_MAX: a process deep in
# a mount uses paths relative to its directory, each within PATH_MAX, and the
# walk below opens one component at a time, so depth has no kernel limit
MAX_PATH = 8 * PATH_MAX
MAX_NAME = 255          # bytes, NAME_MAX

O_PATH = getattr(os, "O_PATH", 0)
_DIR_FLAGS = (O_PATH or os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OBJ_FLAGS = (O_PATH or os.O_RDONLY | os.O_NONBLOCK) | os.O_NOFOLLOW | os.O_CLOEXEC
_PROC_FD = "/proc/self/fd"


def error(code: int, detail: str = "") -> OSError:
    text = os.strerror(code)
    return OSError(code, text + ": " + detail if detail else text)


def split_path(rel: object) -> List[str]:
    """The components of a wire path, or OSError (EACCES for an absolute path or
    '..', ENAMETOOLONG, EINVAL for anything else malformed)."""
    if not isinstance(rel, str):
        raise error(errno.EINVAL, "path is not a string")
    if "\x00" in rel:
        raise error(errno.EINVAL, "NUL in path")
    try:
        raw = rel.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise error(errno.EINVAL, "path is not encodable")
    if len(raw) > MAX_PATH:
        raise error(errno.ENAMETOOLONG)
    if rel.startswith("/"):
        raise error(errno.EACCES, "absolute path")
    if rel == "":
        return []
    parts = rel.split("/")
    if ".." in parts:
        raise error(errno.EACCES, "'..' in path")
    for p in parts:
        if p in ("", "."):
            raise error(errno.EINVAL, "empty or '.' component")
        if len(p.encode("utf-8", "surrogateescape")) > MAX_NAME:
            raise error(errno.ENAMETOOLONG)
    return parts


def proc_fd_path(fd: int) -> str | None:
    """A path that reaches exactly the object behind fd (Linux /proc magic link),
    for the calls that have no fd or dir_fd form; None without /proc."""
    path = "%s/%d" % (_PROC_FD, fd)
    return path if os.path.isdir(_PROC_FD) else None


class Confined:
    """An export root. Thread-safe: every walk has its own descriptors."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._prefix = self.root.rstrip("/") + "/"

    def close(self) -> None:
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1

    # -- the walk ------------------------------------------------------------
    def resolve(self, rel: str, follow: bool = False) -> Tuple[int, str]:
        """(dir_fd, name) for wire path `rel`; the caller closes dir_fd. With
        follow, a final symlink is expanded (confined) too; a final component
        that does not exist is returned as is (for create)."""
        return self._walk(split_path(rel), follow)

    def walk(self, parts: List[str]) -> int:
        """A descriptor of directory `parts` (checked components, any total
        length), symlinks on the way expanded and confined; the caller closes it."""
        d, name = self._walk(parts + ["."], False)
        return d

    @contextlib.contextmanager
    def at(self, rel: str, follow: bool = False) -> Iterator[Tuple[int, str]]:
        dir_fd, name = self.resolve(rel, follow)
        try:
            yield dir_fd, name
        finally:
            os.close(dir_fd)

    def _walk(self, parts: List[str], follow: bool) -> Tuple[int, str]:
        stack = [os.dup(self.root_fd)]
        pending = list(reversed(parts))     # next component at the end
        links = 0
        try:
            while pending:
                name = pending.pop()
                if name in ("", "."):
                    if not pending:
                        return self._give(stack, ".")
                    continue
                if name == "..":
                    if len(stack) == 1:
                        raise error(errno.EACCES, "symlink leads out of the export")
                    os.close(stack.pop())
                    if not pending:
                        return self._give(stack, ".")
                    continue
                top = stack[-1]
                if not pending:                               # the final component
                    if not follow:
                        return self._give(stack, name)
                    try:
                        st = os.stat(name, dir_fd=top, follow_symlinks=False)
                    except FileNotFoundError:
                        return self._give(stack, name)
                    if not stat.S_ISLNK(st.st_mode):
                        return self._give(stack, name)
                else:
                    try:
                        fd = os.open(name, _DIR_FLAGS, dir_fd=top)
                    except OSError as e:
                        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                            raise
                        st = os.stat(name, dir_fd=top, follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            # Swapped back to a directory since the open: look again.
                            links += 1
                            if links > MAX_LINKS:
                                raise error(errno.ELOOP)
                            pending.append(name)
                            continue
                        if not stat.S_ISLNK(st.st_mode):
                            raise error(errno.ENOTDIR)
                    else:
                        stack.append(fd)
                        continue
                # `name` is a symlink in `top`: expand it with the same walk.
                links += 1
                if links > MAX_LINKS:
                    raise error(errno.ELOOP)
                try:
                    target = os.readlink(name, dir_fd=top)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    pending.append(name)    # no longer a symlink: look again
                    continue
                if target.startswith("/"):
                    if target != self.root and not target.startswith(self._prefix):
                        raise error(errno.EACCES, "symlink leads out of the export")
                    target = target[len(self.root):].lstrip("/")
                    while len(stack) > 1:
                        os.close(stack.pop())
                pending.extend(reversed(target.split("/")))
            return self._give(stack, ".")
        except BaseException:
            for fd in stack:
                os.close(fd)
            raise

    @staticmethod
    def _give(stack: List[int], name: str) -> Tuple[int, str]:
        top = stack.pop()
        for fd in stack:
            os.close(fd)
        del stack[:]
        return top, name

    # -- helpers for the server ----------------------------------------------
    def lstat(self, rel: str) -> os.stat_result:
        with self.at(rel) as (d, name):
            return os.stat(name, dir_fd=d, follow_symlinks=False)

    def open(self, rel: str, flags: int, mode: int = 0o666, regular: bool = False) -> int:
        """os.open inside the export. A final symlink is followed when its target
        stays inside (not with O_CREAT|O_EXCL, which must fail on any symlink).
        With `regular`, an existing directory (EISDIR) or special file (EINVAL)
        is refused without being opened."""
        parts = split_path(rel)
        follow = not (flags & os.O_CREAT and flags & os.O_EXCL)
        for _ in range(MAX_LINKS):
            d, name = self._walk(parts, follow)
            try:
                if regular:
                    try:
                        st = os.stat(name, dir_fd=d, follow_symlinks=False)
                    except FileNotFoundError:
                        pass
                    else:
                        if stat.S_ISDIR(st.st_mode):
                            raise error(errno.EISDIR)
                        if not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
                            raise error(errno.EINVAL, "not a regular file")
                return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=d)
            except OSError as e:
                # ELOOP: the final component became a symlink after the walk
                # looked at it. Look again (the walk expands it, confined).
                if e.errno != errno.ELOOP or not follow:
                    raise
            finally:
                os.close(d)
        raise error(errno.ELOOP)

    def open_object(self, rel: str, follow: bool) -> int:
        """An O_PATH descriptor of the object itself (a symlink when not
        following), for fstat and the /proc/self/fd calls."""
        parts = split_path(rel)
        for _ in range(MAX_LINKS):
            d, name = self._walk(parts, follow)
            try:
                fd = os.open(name, _OBJ_FLAGS, dir_fd=d)
            except OSError as e:
                if e.errno != errno.ELOOP or not follow:
                    raise
                continue
            finally:
                os.close(d)
            if follow and stat.S_ISLNK(os.fstat(fd).st_mode):
                os.close(fd)
                continue
            return fd
        raise error(errno.ELOOP)
