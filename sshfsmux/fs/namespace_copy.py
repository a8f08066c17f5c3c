"""A mount's copy of the namespace: the directories it has looked into, as the
head's catalog lists them, kept current by the changes the head sends.

A GMount node answers lookups of names its own export lacks from here, not by
asking every peer (issue 26): the first look into a directory fetches its
listing from the head in one round trip (every name in it, each with its
holders: node, size, mtime, mode), and from then on the head sends the
directory's changes as they happen. Memory grows with the directories looked
into, not with the namespace.

Directories are keyed by their path below the mount's root without slashes at
either end ("" is the root); a holder is a tuple (node, size, mtime, mode).
FUSE threads read (`holders`, `listing`); the node's loop fills and updates
(`fill`, `update`). A FUSE call that looks into a directory the copy lacks
waits for the head's listing (one round trip), when `may_wait` says the
caller may: the node's own agent may not (its loop carries the head's
answer, so its chdir into the mount must not wait for it), nor a thread that
is not FUSE's. Those, and any caller once `wait_seconds` (the mount's peer
timeout) pass without an answer, find the name by asking every branch.

Node side: standard library, Python 3.8 syntax.
"""
from __future__ import annotations

import os
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

    Holder = Tuple[str, int, float, int]
    Listing = Dict[str, Tuple[Holder, ...]]


def split(path: str) -> Tuple[str, str]:
    """A mount path ("/a/b/c") as (directory key "a/b", name "c")."""
    d, name = os.path.split(path.strip("/"))
    return d, name


def holder_tuples(items: Any) -> Tuple[Holder, ...]:
    """Holders from the wire ([node, size, mtime, mode] each), malformed ones left out."""
    out = []
    for h in items if isinstance(items, list) else []:
        if isinstance(h, list) and len(h) == 4:
            try:
                out.append((str(h[0]), int(h[1]), float(h[2]), int(h[3])))
            except (TypeError, ValueError):
                continue
    return tuple(out)


class NamespaceCopy:
    """The directories one mount has looked into. `fetch(keys)` asks the head
    for listings (it must not wait: the answer comes back through fill; an
    exception: not asked, the next look tries again)."""

    def __init__(self, fetch: Callable[[List[str]], None],
                 may_wait: Optional[Callable[[], bool]] = None, wait_seconds: float = 0.0) -> None:
        self.fetch = fetch
        self.may_wait = may_wait
        self.wait_seconds = wait_seconds
        self.lock = threading.Lock()
        self.came = threading.Condition(self.lock)     # a listing came, or an ask ended
        self.dirs: Dict[str, Listing] = {}
        self.asked: Dict[str, bool] = {}         # listings asked for, not yet come
        # names found by asking every branch while their directory's listing
        # was on its way: the kernel may hold them, unseen by the head's changes
        self.looked: Dict[str, Set[str]] = {}
        # changes taken so far: a reader that saw it move asks again
        self.version = 0

    # -- reads (FUSE threads) ----------------------------------------------------
    def listing(self, key: str) -> Optional[Listing]:
        """Directory `key`'s names and holders; while the copy lacks it, the
        head is asked for it (once) and the caller waits for it if it may
        (module docstring), else gets None and finds the name the way a
        mount without a copy does."""
        with self.lock:
            got = self.dirs.get(key)
            if got is not None:
                return got
            ask = key not in self.asked
            self.asked[key] = True
        if ask:
            try:
                self.fetch([key])
            except Exception:
                with self.lock:
                    self.asked.pop(key, None)
                    self.came.notify_all()
                return None
        if self.wait_seconds <= 0 or self.may_wait is None or not self.may_wait():
            return None
        with self.lock:
            # bounded: a head that never answers costs the caller the peer
            # timeout once, then the branches are asked as without a copy
            self.came.wait_for(lambda: key in self.dirs or key not in self.asked,
                               self.wait_seconds)
            return self.dirs.get(key)

    def holders(self, path: str, own: Iterable[str] = ()) -> Optional[Tuple[Holder, ...]]:
        """Who holds `path` ("/a/b"), () if nobody does, None if the copy
        lacks its directory. A name looked up in a directory this mount
        made itself, before the head's listing of it came, is noted: the
        kernel may keep its answer (fill). When the copy lacks the directory
        but lists an ancestor in which no node but `own` ones holds the next
        step down, nobody else holds anything below it: () without asking
        the head (a file of a tree this mount removed, reported by the
        change feed after the removal, asked every peer)."""
        d, name = split(path)
        with self.lock:
            got = self.dirs.get(d)
            if got is not None:
                if d in self.asked:
                    self.looked.setdefault(d, set()).add(name)
                return got.get(name, ())
            if own and self._held_only_by(d, set(own)):
                return ()
        listing = self.listing(d)
        return None if listing is None else listing.get(name, ())

    def _held_only_by(self, key: str, own: Set[str]) -> bool:
        """The nearest ancestor of directory `key` that the copy lists says
        no node outside `own` holds its step towards `key` (lock held)."""
        while key:
            parent, step = os.path.split(key)
            listing = self.dirs.get(parent)
            if listing is not None:
                return all(h[0] in own for h in listing.get(step, ()))
            key = parent
        return False

    def made_dir(self, path: str) -> None:
        """This mount made directory `path` (nobody held the name): it is
        empty but for what this mount puts in it, so its names are answered
        at once, while the head's listing (and with it the subscription to
        the directory's changes) is on its way."""
        key = path.strip("/")
        with self.lock:
            if key in self.dirs or key in self.asked:
                return
            self.dirs[key] = {}
            self.asked[key] = True
        try:
            self.fetch([key])
        except Exception:
            with self.lock:
                self.dirs.pop(key, None)
                self.asked.pop(key, None)

    def looked_up(self, path: str) -> None:
        """`path` was looked up without the copy (its listing is on its way)."""
        d, name = split(path)
        with self.lock:
            if d in self.asked:
                self.looked.setdefault(d, set()).add(name)

    def known_gone(self, path: str) -> bool:
        """Whether the copy holds `path`'s directory and no holder of it
        (never asks the head)."""
        d, name = split(path)
        with self.lock:
            got = self.dirs.get(d)
            return got is not None and not got.get(name)

    def held(self, key: str) -> bool:
        with self.lock:
            return key in self.dirs

    def count(self) -> int:
        """Directories held (what memory grows with)."""
        with self.lock:
            return len(self.dirs)

    # -- changes (the node's loop, and this mount's own changes) -------------------
    def fill(self, listings: Dict[str, Any]) -> List[str]:
        """Listings the head sent: held from now on (replacing any older one).
        Returns the paths looked up without them meanwhile, found or not
        (the kernel's entries of those, negative ones too, are to be
        dropped: a change before the head listed them reached no one)."""
        found: List[str] = []
        with self.lock:
            self.version += 1
            for key, names in listings.items():
                self.dirs[key] = {str(n): holder_tuples(hs) for n, hs in
                                  (names.items() if isinstance(names, dict) else [])}
                self.asked.pop(key, None)
                found.extend("/" + (key + "/" if key else "") + n for n in self.looked.pop(key, ()))
            self.came.notify_all()
        return found

    def update(self, changes: Dict[str, Any], keep: Any = ()) -> List[str]:
        """Changes the head sent (key -> name -> holders, [] for gone) to
        directories held; returns the mount paths ("/a/b") whose holders
        differ from what the copy held: a change this mount made itself
        comes back as the copy has it already (set_holders), and the
        kernel's entry for it, made by that very change, stays. Mount paths
        in `keep` keep the copy's entry (this mount changed them after what
        the head sent)."""
        touched = []
        with self.lock:
            self.version += 1
            for key, names in changes.items():
                listing = self.dirs.get(key)
                if listing is None or not isinstance(names, dict):
                    continue
                for name, hs in names.items():
                    got, name = holder_tuples(hs), str(name)
                    if sorted(got) == sorted(listing.get(name, ())):
                        continue
                    if keep and "/" + (key + "/" if key else "") + name in keep:
                        continue
                    if got:
                        listing[name] = got
                    else:
                        listing.pop(name, None)
                    touched.append("/" + (key + "/" if key else "") + name)
        return touched

    def set_holders(self, path: str, node: str, holder: Optional[Holder]) -> None:
        """This mount changed `path` on `node`'s export (holder None: removed
        there): its copy says so at once, before the head's word comes back."""
        d, name = split(path)
        with self.lock:
            self.version += 1
            listing = self.dirs.get(d)
            if listing is None:
                return
            others = tuple(h for h in listing.get(name, ()) if h[0] != node)
            now = others + ((holder,) if holder is not None else ())
            if now:
                listing[name] = now
            else:
                listing.pop(name, None)

    def forget_all(self) -> List[str]:
        """The copy missed changes: every listing is fetched again at the next
        look. Returns the paths it held (names and directories), whose
        kernel entries are to be dropped."""
        with self.lock:
            self.version += 1
            paths = ["/" + key for key in self.dirs if key]
            for key, listing in self.dirs.items():
                paths.extend("/" + (key + "/" if key else "") + n for n in listing)
            self.dirs.clear()
            self.asked.clear()
            self.looked.clear()
            self.came.notify_all()
        return paths

    def forget_under(self, paths: Iterable[str]) -> None:
        """Directories renamed or removed: their listings (and those below) are
        fetched again at the next look."""
        with self.lock:
            self.version += 1
            for p in paths:
                key = p.strip("/")
                for k in [k for k in self.dirs if k == key or k.startswith(key + "/")]:
                    del self.dirs[k]
