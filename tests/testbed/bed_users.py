"""Ordinary users of a bed: created with a key every host accepts, and
commands run as them."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import time

from .hosts import User
from .removal import _remove_user
from .system import USER_MARK, TestBedError, _argv, _clean_env, _mkdir, _run, _setpriv, _write


class BedUsers:
    """TestBed's part that manages users (a mixin: the state is TestBed's)."""

    def add_user(self, name: str) -> User:
        """Create an ordinary user (useradd -m -s /bin/bash, GECOS
        'gxptb <tag>') with an ed25519 key authorized on every host, and
        ~/.ssh/known_hosts and ~/.ssh/config for all hosts of the bed."""
        if not re.match(r"^[a-z_][a-z0-9_-]{0,30}$", name):
            raise TestBedError(f"bad user name {name!r}")
        with self._lock:
            self._ensure_dir()
            try:
                pwd.getpwnam(name)
            except KeyError:
                pass
            else:
                raise TestBedError(f"user {name} exists already")
            if os.path.lexists(os.path.join("/home", name)):
                raise TestBedError(f"/home/{name} exists already")
            self._users_made.append(name)
            self._save()
            argv = ["useradd", "-m", "-s", "/bin/bash", "-c",
                    f"{USER_MARK} {self.tag}", "-p", "*", name]
            for attempt in range(50):   # /etc/passwd may be locked briefly
                r = _run(argv, check=False)
                if r.returncode == 0:
                    break
                if r.returncode not in (1, 10) or attempt == 49:
                    raise TestBedError(f"useradd {name} failed: {r.stderr}")
                time.sleep(0.1)
            u = User(name)
            ssh = os.path.join(u.home, ".ssh")
            _mkdir(ssh, 0o700)
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "",
                  "-C", f"{name}@gxptb", "-f", u.key])
            with open(u.key + ".pub") as f:
                pub = f.read()
            _write(os.path.join(ssh, "authorized_keys"), pub, 0o600)
            for fn in ("", "id_ed25519", "id_ed25519.pub", "authorized_keys"):
                p = os.path.join(ssh, fn)
                os.chown(p, u.uid, u.gid)
                os.chmod(p, 0o700 if fn == "" else 0o600)
            self.users[name] = u
            self._write_user_files(u)
            return u

    def _write_user_files(self, u: User) -> None:
        ssh = os.path.join(u.home, ".ssh")
        for fn, text in (("known_hosts", self._known_hosts_text()),
                         ("config", self._ssh_config_text(u.name))):
            p = os.path.join(ssh, fn)
            _write(p, text, 0o600)
            os.chown(p, u.uid, u.gid)

    def remove_user(self, name: str) -> None:
        """Kill all processes of the user and userdel -r it."""
        with self._lock:
            _remove_user(name)
            self.users.pop(name, None)
            if name in self._users_made:
                self._users_made.remove(name)
            self._save()

    def run_as(self, user: str, argv, env: dict | None = None,
               **kw) -> subprocess.CompletedProcess:
        """Run argv (list, or str for /bin/sh -c) as `user` in the root
        namespaces (the "local" machine) with a clean login-like
        environment (HOME USER LOGNAME SHELL PATH=/usr/local/bin:/usr/bin:/bin
        plus `env`), cwd = home unless given, stdin = /dev/null unless
        given.  Other keyword arguments go to subprocess.run."""
        pw = pwd.getpwnam(user)
        kw.setdefault("cwd", pw.pw_dir)
        if "input" not in kw:
            kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(_setpriv(pw) + _argv(argv),
                              env=_clean_env(pw, env), **kw)

    def popen_as(self, user: str, argv, env: dict | None = None,
                 **kw) -> subprocess.Popen:
        """Like run_as but returns a Popen."""
        pw = pwd.getpwnam(user)
        kw.setdefault("cwd", pw.pw_dir)
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(_setpriv(pw) + _argv(argv),
                                env=_clean_env(pw, env), **kw)
