"""Multi-host test bed for gxpstyle: many "hosts" on one Linux machine.

Every host is a network namespace (its own IP on a private bridge) plus its
own mount and UTS namespace (own hostname, private /tmp, private scratch
directory, optionally hidden paths and a broken python3), running a real
OpenSSH server.  Ordinary users created by the bed can ``ssh tb01`` etc. with
public-key authentication, exactly like on a cluster with a shared /home.

Standard library only (this must run before any venv exists); needs root,
iproute2, util-linux (unshare, nsenter, setpriv) and openssh-server.

Typical use::

    with TestBed() as bed:
        bed.up(["tb01", "tb02", "tb03"], no_python={"tb03"})
        bed.add_user("alice")
        r = bed.run_as("alice", ["ssh", "tb01", "hostname"],
                       capture_output=True, text=True)
        assert r.stdout.strip() == "tb01"
        assert bed.host("tb01").pids() == []

Layout of the bed directory ``/var/tmp/gxptb-<tag>`` (0755)::

    state.json            everything needed by teardown()/sweep()/attach()
    ssh_config            Host entries for every host (IdentityFile %d/...)
    known_hosts           host keys of every host, by name and by IP
    etc_hosts             bind-mounted over /etc/hosts on every host
    resolv.conf           bind-mounted over /etc/resolv.conf: the hosts have
                          no DNS (lookups fail at once instead of timing out)
    scratch/              same path on every host; each host bind-mounts
                          hosts/<name>/scratch over it
    hosts/<name>/tmp      backing directory of the host's private /tmp
    hosts/<name>/scratch  backing directory of the host's scratch dir
    hosts/<name>/keys/    host keys (0700)
    hosts/<name>/sshd_config, boot.sh, sshd.log, sshd.pid

Sites (``up_sites(...)`` instead of ``up``, sites.py): groups of hosts on
bridges of their own, each reached only through its gateway, the gateways
and the head joined by a WAN with its own latency (a delaying relay in a
router namespace, wan_relay.py: there is no netem here) and bandwidth (tbf).

CPU share (optional, ``up(..., cpu_share=0.25)``): a cgroup v1 cpu controller
group ``/sys/fs/cgroup/cpu/gxptb<tag>-<host>`` per host whose CFS quota is that
fraction of one CPU; the host's sshd starts in it, so every process of the
host (ssh sessions, agents, recipes; ``Host.exec`` too) shares that CPU time,
as on a machine of its own.  teardown() and sweep() remove the groups.

Clean-up: ``teardown()`` (idempotent; also run by the context manager, by
atexit and on SIGTERM/SIGHUP) and ``sweep()`` for leftovers of crashed runs.
Everything the bed creates carries a recognisable name: network namespaces
``gxptb<tag>-<host>``, bridge ``gxb<tag>``, veths ``gxv<tag><n>``, directory
``/var/tmp/gxptb-<tag>``, users with GECOS ``gxptb <tag>``.
"""

from .bed import TestBed
from .fuse_access import close_fuse_to_users, fuse_open_to_users, open_fuse_to_users
from .hosts import Host, User
from .removal import _remove_dir
from .sites import sites_requirements_missing
from .sweep import list_beds, sweep
from .system import BASE_DIR, CGROUP_CPU, DIR_PREFIX, TestBedError, requirements_missing, sha256_of

# The modules, by concern: system (constants, commands, processes, the global
# lock), registry (teardown at exit), hosts (Host, User), sshd_hosts and
# bed_users (TestBed's host start-up and users), sites and wan_relay (a
# wide-area bed: sites behind gateways, a WAN), bed (TestBed), removal (what
# teardown and sweep remove), sweep (leftovers of crashed runs), fuse_access.
__all__ = ["TestBed", "Host", "User", "TestBedError", "sweep", "list_beds", "requirements_missing",
           "BASE_DIR", "CGROUP_CPU", "DIR_PREFIX", "sha256_of", "sites_requirements_missing",
           "open_fuse_to_users", "close_fuse_to_users", "fuse_open_to_users", "_remove_dir"]
