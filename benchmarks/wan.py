#!/usr/bin/env python3
"""A sequential read of another site's file across the WAN: GMount (whose data
channel goes along the tree where no direct connection exists) against sshfs
from home over the same WAN, and the bytes that crossed the WAN (issue 28).

Run as root (the test bed needs it), from the checkout, after scripts/install:

    /opt/gxpstyle/venv/bin/python benchmarks/wan.py [--size MiB] [--reps N] [--quick]
        [--workflow-only | --bcast-only] [--wf-ref MiB] [--wf-split MiB] [--wf-trace DIR]

The bed (tests/testbed/sites.py): two sites of 8 hosts (sa01..sa08 behind
gateway ga, sb01..sb08 behind gb) and the head; the WAN joins the head and the
gateways through a router namespace, 20 Mbit/s each way on each of its links
(tbf) and 100 ms round trip (the relay's delay, half each way); inside a site
the links are unshaped. The checkout and the venv are hidden on the hosts; one
ordinary user runs everything. A session explores the 18 hosts through the
gateways and mounts an export on every node (head included).

Cases (each reads a file of its own, so no replica of an earlier case serves it;
the page cache is dropped before each read; `dd bs=1M` reads it sequentially):
  home <- site b   ours: the head reads a file of sb01's export through its
                   GMount (along the tree: head -> gb -> sb01);
                   anchor: sshfs from the head to sb01 through gb (ssh -J gb),
                   its defaults: the path a user would take;
  site a <- site b ours only: sa01 reads a file of sb01's through its GMount
                   (along the tree, so through the head: the WAN twice), for
                   scale against the same WAN;
  site a x8 <- home  the 8 hosts of site a read one file of the head's export at
                   once (wall time until the last is done): ours through site
                   a's caches (sshfsmux/gmount/site_cache.py), anchor the same
                   read on a second mount with -o site_cache=off (each host
                   fetches it itself);
  bcast 16 hosts   `gxpc bcast` of a file of the head's, and of one of sb01's,
                   to the 16 site hosts, against the time one copy takes over
                   the WAN link (S/B); from home the head's link carries one
                   copy (to ga, which feeds gb over a link between the
                   gateways, gxpstyle/bcast/plan.py), so 1 S/B is the bound;
                   the WAN bytes of home's own link are shown apart.
  workflow         BWA-shaped: a reference and 16 splits at home; a recipe per
                   split reads the reference and its split (`cat ref split |
                   md5sum`), 8 of them pinned to each site (GXP_ON), and a merge
                   of the 16 outputs; `gxpc make -j 16` from home, until it
                   returns (the outputs home). Ours: on the GMount (site caches
                   on); anchors: the same on the site_cache=off mount, and
                   `gxpc make --shared` where every site host reads through sshfs
                   from home (an sshd of the benchmark's on the head's WAN
                   address, mounted at the same path on every site host with
                   ssh -J through its gateway, the working directory at home).
                   WAN bytes against the unique bytes the sites need (each: the
                   reference and its 8 splits).
WAN bytes: the router's transmitted bytes (every interface, `ip -s link` in its
namespace) over each case, against the file size: what the WAN carried for it,
headers, TLS and the protocol included.

Prints per case: seconds (median of --reps), MB/s (of one copy), the ratio
ours/anchor (higher is better), the WAN's share of its rate, and WAN bytes /
file size. Defaults: 64 MiB, --reps 1 (a pass is several minutes at 20 Mbit/s,
the anchor of the site case alone 8 copies over the WAN); --quick: 16 MiB.
The workflow: --wf-ref MiB (default 16) and --wf-split MiB (default 1; --quick
4 and 1); --workflow-only runs only it, --bcast-only only the two bcast cases.
Everything is cleaned up whatever happens (the sshfs mount, the session, the
bed, /dev/fuse's mode). Standard library only, plus tests/testbed/
and benchmarks/bench_harness.py.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid

from bench_harness import GXPC, REPO, VENV, Bench, BenchError, log, main_driver, ratio_text, testbed

SITES = {"sa": ["sa%02d" % i for i in range(1, 9)], "sb": ["sb%02d" % i for i in range(1, 9)]}
GATEWAYS = {"sa": "ga", "sb": "gb"}
WAN_MBIT, WAN_RTT_MS = 20, 100
MIB = 1 << 20
SPLITS = 16                  # 8 per site, 1 per host
HOME_SSHD_PORT = 2222        # the workflow's sshfs anchor: an sshd at home, on the WAN address


class WanBench(Bench):
    name = "wan.py"
    call_timeout = 1800
    leftover_fuse_only = True

    def __init__(self, logger, size_mib: int, reps: int, wf: tuple = (16, 1, False, None),
                 bcast_only: bool = False) -> None:
        super().__init__(logger)
        self.size = size_mib * MIB
        self.reps = reps
        self.wf_ref, self.wf_split, self.workflow_only = wf[0] * MIB, wf[1] * MIB, wf[2]
        self.wf_trace: str | None = wf[3]         # a directory for gxpc make's traces
        self.bcast_only = bcast_only
        self.home_sshd: subprocess.Popen | None = None
        self.wf_sshfs_on: list = []        # site hosts with the workflow's sshfs mounted
        tag = uuid.uuid4().hex[:6]
        self.top = "/var/tmp/gxpwan-%s" % tag
        self.export, self.mnt = "/tmp/wanexp-%s" % tag, "/tmp/wanmnt-%s" % tag
        # the anchor of the site case: a second mount, without site caches
        self.export2, self.mnt2 = "/tmp/wanexq-%s" % tag, "/tmp/wanmnu-%s" % tag
        self.bcast_dest = "/tmp/wanbc-%s" % tag
        self.wf_dir = "/tmp/wanwf-%s" % tag      # at home, and sshfs on every site host
        self.sshfs_mnt = os.path.join(self.top, "sshfs")
        self.mount_tag = tag
        self.mounted = self.sshfs_mounted = False
        self.files = 0

    # -- setup -------------------------------------------------------------------
    def setup(self) -> None:
        self.check_installed()
        missing = testbed.sites_requirements_missing()
        if missing:
            raise BenchError(missing)
        for tool in ("sshfs", "dd"):
            if subprocess.run(["which", tool], capture_output=True).returncode != 0:
                raise BenchError("%s is not installed (scripts/install)" % tool)
        self.open_fuse()
        self.bed = testbed.TestBed()
        t0 = time.monotonic()
        self.bed.up_sites(SITES, gateways=GATEWAYS, wan_rate="%dmbit" % WAN_MBIT,
                          wan_rtt_ms=WAN_RTT_MS, hide_paths=[REPO, VENV])
        self.user = self.bed.add_user("gxpwan" + uuid.uuid4().hex[:6])
        self.make_dir(self.top)
        self.make_dir(self.sshfs_mnt)
        self.session = os.path.join(self.top, "session")
        for src, dst in (("head", "ga gb"), ("ga", "sa*"), ("gb", "sb*")):
            self.gxpc("use", "ssh", src, dst)
        dt, _ = self.gxpc("explore", "ga", "gb", "sa[[01-08]]", "sb[[01-08]]")
        self.gxpc("e", "mkdir -p %s %s %s %s" % (self.export, self.mnt, self.export2, self.mnt2))
        self.mounted = True
        self.gxpc("mount", self.export, self.mnt)
        self.gxpc("mount", self.export2, self.mnt2, "-o", "site_cache=off")
        log("sites bed up (2 x 8 hosts, WAN %d Mbit/s, %d ms RTT) in %.1fs, explored in %.1fs"
            % (WAN_MBIT, WAN_RTT_MS, time.monotonic() - t0, dt))

    def release(self) -> None:
        if self.sshfs_mounted:
            self.guarded("unmounting sshfs", self.as_user, ["fusermount3", "-u", self.sshfs_mnt])
        for host in self.wf_sshfs_on:
            self.guarded("unmounting sshfs on " + host, self.as_user,
                         ["fusermount3", "-u", self.wf_dir], host)
        if self.home_sshd is not None:
            self.home_sshd.terminate()
            self.guarded("stopping the home sshd", self.home_sshd.wait, 10)
        if self.session is None:
            return
        if self.mounted:
            self.guarded("unmounting", self.gxpc, "umount")
        self.guarded("quitting", self.quit_session)
        for d in (self.export, self.mnt, self.export2, self.mnt2, self.bcast_dest, self.wf_dir):
            self.guarded("removing " + d, subprocess.run, ["rm", "-rf", "--one-file-system", d])

    # -- helpers -------------------------------------------------------------------
    def as_user(self, argv, host: str | None = None) -> subprocess.CompletedProcess:
        if host is None:
            r = self.bed.run_as(self.user.name, argv, capture_output=True, text=True,
                                timeout=self.call_timeout)
        else:
            r = self.bed.host(host).exec(argv, user=self.user.name, capture_output=True,
                                         text=True, timeout=self.call_timeout)
        if r.returncode != 0:
            raise BenchError("%s failed (%d): %s" % (" ".join(argv), r.returncode, r.stderr.strip()))
        return r

    def new_file(self, host: str | None = "sb01", export: str | None = None) -> str:
        """A random file of --size in `host`'s export (the head's: None; only
        that host holds it); its name."""
        self.files += 1
        name = "big-%d" % self.files
        export = export or self.export
        top = self.bed.host(host).tmp_dir if host is not None else "/"
        path = os.path.join(top, export.lstrip("/") if host is None else os.path.basename(export),
                            name)
        with open(path, "wb") as f:
            for _ in range(self.size // MIB):
                f.write(os.urandom(MIB))
        os.chown(path, self.user.uid, self.user.gid)
        return name

    def wan_bytes(self) -> int:
        r = subprocess.run(["ip", "-n", self.bed.router_ns, "-s", "-j", "link"],
                           capture_output=True, text=True, check=True)
        return sum(link.get("stats64", {}).get("tx", {}).get("bytes", 0) for link in json.loads(r.stdout))

    def home_sent(self) -> int:
        """Bytes home sent into the WAN: what the router received on home's link."""
        r = subprocess.run(["ip", "-n", self.bed.router_ns, "-s", "-j", "link", "show", "head0"],
                           capture_output=True, text=True, check=True)
        return json.loads(r.stdout)[0]["stats64"]["rx"]["bytes"]

    def timed_read(self, key: str, path: str, host: str | None = None) -> None:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        before = self.wan_bytes()
        r = self.as_user(["dd", "if=" + path, "of=/dev/null", "bs=1M"], host)
        m = re.search(r"copied, ([0-9.]+) s", r.stderr)
        if not m or "%d bytes" % self.size not in r.stderr:
            raise BenchError("dd of %s: %s" % (path, r.stderr.strip()))
        self.add(key + " s", float(m.group(1)))
        self.add(key + " wan", (self.wan_bytes() - before) / self.size)

    def wait_visible(self, path: str, host: str | None = None) -> None:
        deadline = time.monotonic() + 30
        while True:
            argv = ["test", "-s", path]
            r = (self.bed.run_as(self.user.name, argv) if host is None else
                 self.bed.host(host).exec(argv, user=self.user.name))
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise BenchError("%s did not show on %s within 30 s" % (path, host or "the head"))
            time.sleep(0.2)

    def site_read(self, key: str, path: str) -> None:
        """The 8 hosts of site a read `path` at once: wall time until the last
        is done, and WAN bytes."""
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        before, errors = self.wan_bytes(), []

        def read(host: str) -> None:
            try:
                r = self.as_user(["dd", "if=" + path, "of=/dev/null", "bs=1M"], host)
                if "%d bytes" % self.size not in r.stderr:
                    errors.append("%s: %s" % (host, r.stderr.strip()))
            except BenchError as e:
                errors.append(str(e))
        threads = [threading.Thread(target=read, args=(h,)) for h in SITES["sa"]]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise BenchError("site read: %s" % "; ".join(errors))
        self.add(key + " s", time.monotonic() - t0)
        self.add(key + " wan", (self.wan_bytes() - before) / self.size)

    def bcast(self, key: str, host: str | None) -> None:
        """`gxpc bcast` of a new file on `host` (None: the head) to the 16 site hosts."""
        top = self.bed.host(host).tmp_dir if host is not None else self.top
        src = os.path.join(top, "bcast-src")
        with open(src, "wb") as f:
            for _ in range(self.size // MIB):
                f.write(os.urandom(MIB))
        os.chown(src, self.user.uid, self.user.gid)
        before, home_before = self.wan_bytes(), self.home_sent()
        where = src if host is None else "%s:/tmp/bcast-src" % host
        dt, _ = self.gxpc("bcast", "--hosts", "sa[[01-08]] sb[[01-08]]", where, self.bcast_dest)
        self.add(key + " s", dt)
        self.add(key + " wan", (self.wan_bytes() - before) / self.size)
        self.add(key + " home", (self.home_sent() - home_before) / self.size)
        self.gxpc("e", "--hosts", "sa[[01-08]] sb[[01-08]]", "rm -f %s" % self.bcast_dest)
        os.unlink(src)

    def site_cases(self) -> None:
        for key, export, mnt in (("sites ours", self.export, self.mnt),
                                 ("sites off", self.export2, self.mnt2)):
            name = self.new_file(None, export)
            for host in SITES["sa"]:
                self.wait_visible(os.path.join(mnt, name), host)
            self.site_read(key, os.path.join(mnt, name))

    # -- the workflow -------------------------------------------------------------
    def start_home_sshd(self) -> None:
        """An sshd in the head's namespace on its WAN address only (the sites
        reach it through their gateways), for the sshfs anchor; the sshfs
        mounts of the workflow's directory on every site host."""
        keys = os.path.join(self.top, "home-sshd")
        os.makedirs(keys, 0o700)
        key = os.path.join(keys, "host_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
        config = os.path.join(keys, "sshd_config")
        with open(config, "w") as f:
            f.write("\n".join([
                "ListenAddress %s:%d" % (self.bed.gateway_ip, HOME_SSHD_PORT),
                "HostKey " + key, "PidFile " + os.path.join(keys, "sshd.pid"), "UsePAM no",
                "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                "AuthorizedKeysFile .ssh/authorized_keys", "LogLevel ERROR", "UseDNS no",
                "AllowUsers " + self.user.name, "Subsystem sftp /usr/lib/openssh/sftp-server", ""]))
        self.home_sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", config],
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        self.make_dir(self.wf_dir)
        ssh = ("ssh -J %s -p %d -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
               "-o BatchMode=yes" % ("%s", HOME_SSHD_PORT))
        self.gxpc("e", "--hosts", "sa[[01-08]] sb[[01-08]]", "mkdir -p " + self.wf_dir)
        deadline = time.monotonic() + 30
        for site, hosts in SITES.items():
            for host in hosts:
                argv = ["sshfs", "-o", "ssh_command=" + ssh % GATEWAYS[site],
                        "%s:%s" % (self.bed.gateway_ip, self.wf_dir), self.wf_dir]
                while True:     # the sshd may still be starting
                    try:
                        self.as_user(argv, host)
                        break
                    except BenchError:
                        if time.monotonic() > deadline or self.home_sshd.poll() is not None:
                            raise
                        time.sleep(0.5)
                self.wf_sshfs_on.append(host)

    def workflow_files(self, top: str) -> dict:
        """The reference, the splits and the Makefile under `top` (a directory
        at home, made here); returns the merge's expected content."""
        os.makedirs(top)
        ref = os.urandom(self.wf_ref)
        lines, rules = [], []
        for i in range(1, SPLITS + 1):
            split = os.urandom(self.wf_split)
            with open(os.path.join(top, "split-%d" % i), "wb") as f:
                f.write(split)
            lines.append("%s  -\n" % hashlib.md5(ref + split).hexdigest())
            site = "sa" if i % 2 else "sb"
            rules.append("out-%d: GXP_ON = %s[[01-08]]\nout-%d: split-%d ref\n"
                         "\tcat ref split-%d | md5sum > $@\n" % (i, site, i, i, i))
        with open(os.path.join(top, "ref"), "wb") as f:
            f.write(ref)
        outs = " ".join("out-%d" % i for i in range(1, SPLITS + 1))
        with open(os.path.join(top, "Makefile"), "w") as f:
            # the merge on a site host: the gateways have no sshfs mount for --shared
            f.write("merged: GXP_ON = sa[[01-08]]\nmerged: %s\n\tcat %s > $@\n" % (outs, outs)
                    + "".join(rules))
        for d, _dirs, files in os.walk(top):
            for name in [d] + [os.path.join(d, n) for n in files]:
                os.chown(name, self.user.uid, self.user.gid)
        return {"merged": "".join(lines)}

    def workflow(self, key: str, top: str, in_mount: str | None, shared: bool = False) -> None:
        """`gxpc make -j 16` of a new workflow under `top` (at home), from
        `in_mount` (its path on the mount; None: `top` itself, --shared):
        seconds until it returns, WAN bytes over the unique bytes the sites
        need, and the merge checked."""
        want = self.workflow_files(top)
        work = in_mount or top
        if in_mount is not None:
            for host in (None, "sa01", "sb01"):
                for name in ("ref", "split-%d" % SPLITS, "Makefile"):
                    self.wait_visible(os.path.join(work, name), host)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        before = self.wan_bytes()
        argv = [GXPC, "--session", self.session, "make"] + (["--shared"] if shared else []) + ["-j", "16"]
        if self.wf_trace:
            argv.append("--trace=%s/%s-%s.jsonl" % (self.wf_trace, key.replace(" ", "-"),
                                                    os.path.basename(top)))
        t0 = time.monotonic()
        r = self.bed.run_as(self.user.name, ["sh", "-c", 'cd "$0" && exec "$@"', work] + argv,
                            env=self.env(), capture_output=True, text=True, timeout=self.call_timeout)
        dt = time.monotonic() - t0
        if r.returncode != 0:
            raise BenchError("gxpc make (%s) failed (%d): %s" % (key, r.returncode, r.stderr.strip()))
        self.add(key + " s", dt)
        unique = 2 * self.wf_ref + SPLITS * self.wf_split    # per site: ref + its 8 splits
        self.add(key + " wan", (self.wan_bytes() - before) / unique)
        with open(os.path.join(top, "merged")) as f:
            if f.read() != want["merged"]:
                raise BenchError("the workflow's merge (%s) differs from plain make's" % key)

    def workflow_cases(self, rep: int) -> None:
        if self.home_sshd is None:
            self.start_home_sshd()
        name = "wf-%d" % rep
        self.workflow("wf ours", os.path.join(self.export, name), os.path.join(self.mnt, name))
        self.workflow("wf off", os.path.join(self.export2, name), os.path.join(self.mnt2, name))
        self.workflow("wf sshfs", os.path.join(self.wf_dir, name), None, shared=True)
        log("rep %d: workflow ours %.1fs (WAN %.2fx unique), caches off %.1fs, sshfs %.1fs"
            % (rep + 1, self.samples["wf ours s"][-1], self.samples["wf ours wan"][-1],
               self.samples["wf off s"][-1], self.samples["wf sshfs s"][-1]))

    # -- the cases ---------------------------------------------------------------
    def run(self) -> None:
        if self.workflow_only:
            for rep in range(self.reps):
                self.workflow_cases(rep)
            return
        if self.bcast_only:
            for rep in range(self.reps):
                self.bcast("bcast", None)
                self.bcast("bcast b", "sb01")
                log("rep %d: bcast home %.1fs (home's link %.2f copies), sb01 %.1fs" % (
                    rep + 1, self.samples["bcast s"][-1], self.samples["bcast home"][-1],
                    self.samples["bcast b s"][-1]))
            return
        export_b = self.export
        self.as_user(["sshfs", "-o", "ssh_command=ssh -J gb", "sb01:" + export_b, self.sshfs_mnt])
        self.sshfs_mounted = True
        for rep in range(self.reps):
            name = self.new_file()
            self.wait_visible(os.path.join(self.mnt, name))
            self.timed_read("home ours", os.path.join(self.mnt, name))
            name = self.new_file()
            self.timed_read("home sshfs", os.path.join(self.sshfs_mnt, name))
            name = self.new_file()
            self.wait_visible(os.path.join(self.mnt, name), "sa01")
            self.timed_read("site ours", os.path.join(self.mnt, name), "sa01")
            self.site_cases()
            self.bcast("bcast", None)
            self.bcast("bcast b", "sb01")
            self.workflow_cases(rep)
            log("rep %d: home ours %.1fs, sshfs %.1fs; site a ours %.1fs; site a x8 %.1fs, "
                "caches off %.1fs; bcast %.1fs"
                % (rep + 1, self.samples["home ours s"][-1], self.samples["home sshfs s"][-1],
                   self.samples["site ours s"][-1], self.samples["sites ours s"][-1],
                   self.samples["sites off s"][-1], self.samples["bcast s"][-1]))

    def report(self) -> None:
        if not self.workflow_only:
            self.report_reads()
        if not self.bcast_only:
            self.report_workflow()
        for line in self.noticed_lines():
            print(line)

    def report_workflow(self) -> None:
        unique = 2 * self.wf_ref + SPLITS * self.wf_split
        print("workflow: a %d MiB reference and %d splits of %d MiB at home, 8 recipes per site, "
              "a merge; unique bytes the sites need %.1f MB; medians of %d; load average %s"
              % (self.wf_ref // MIB, SPLITS, self.wf_split // MIB, unique / 1e6, self.reps,
                 load_average()))
        print("%-38s %9s %11s %14s %10s" % ("case", "seconds", "vs anchor", "WAN/unique", "vs WAN"))
        # the head's own link carries the reference once (ga feeds gb) and every split
        ideal = (self.wf_ref + SPLITS * self.wf_split) / (WAN_MBIT / 8.0 * 1e6)
        for key, label in (("wf sshfs", "every site host via sshfs (anchor)"),
                           ("wf off", "GMount, site caches off (anchor)"),
                           ("wf ours", "GMount, site caches")):
            s = self.med(key + " s")
            print("%-38s %9.2f %11s %14.2f %9.2fx" % (
                label, s, "%.2fx/%.2fx" % (self.med("wf sshfs s") / s, self.med("wf off s") / s),
                self.med(key + " wan"), s / ideal))
        print("vs anchor: sshfs seconds / these, caches-off seconds / these (higher is better); "
              "vs WAN: seconds / (what the head's link must carry, the reference and the "
              "splits once, / the WAN link's rate)")

    def report_reads(self) -> None:
        mb = self.size / 1e6
        wan_mbs = WAN_MBIT / 8.0
        print("reads of %d MiB files, WAN %d Mbit/s (%.2f MB/s), %d ms RTT; medians of %d;"
              " load average %s" % (self.size // MIB, WAN_MBIT, wan_mbs, WAN_RTT_MS, self.reps,
                                    load_average()))
        print("%-38s %9s %8s %11s %8s %14s" % ("case", "seconds", "MB/s", "vs anchor", "of WAN",
                                              "WAN bytes/size"))
        rows = [("home sshfs", "home <- b, sshfs (anchor)", "home sshfs"),
                ("home ours", "home <- b, GMount", "home sshfs"),
                ("site ours", "site a <- b, GMount", None),
                ("sites off", "site a x8 <- home, caches off (anchor)", "sites off"),
                ("sites ours", "site a x8 <- home, site caches", "sites off"),
                ("bcast", "bcast home -> the 16 site hosts", None),
                ("bcast b", "bcast sb01 -> the 16 site hosts", None)]
        for key, label, anchor in rows:
            s = self.med(key + " s")
            if s is None:       # not run (--bcast-only)
                continue
            versus = ratio_text(mb / self.med(anchor + " s"), mb / s) if anchor else ""
            print("%-38s %9.2f %8.2f %11s %7.0f%% %14.2f" % (
                label, s, mb / s, versus, 100 * mb / s / wan_mbs, self.med(key + " wan")))
        # one copy over one WAN link (S/B) is the bound from home and from sb01 alike
        print("bcast: %.2fx (from home) and %.2fx (from sb01) the time one copy takes over "
              "the WAN link (S/B); home's own link carried %.2f copies from home"
              % (self.med("bcast s") / (mb / wan_mbs), self.med("bcast b s") / (mb / wan_mbs),
                 self.med("bcast home")))


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=64, help="MiB per file (default 64)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="16 MiB, one rep; workflow 4 + 16 x 1 MiB")
    p.add_argument("--wf-ref", type=int, default=16, help="the workflow's reference, MiB (default 16)")
    p.add_argument("--wf-split", type=int, default=1, help="each of its 16 splits, MiB (default 1)")
    p.add_argument("--workflow-only", action="store_true", help="only the workflow case")
    p.add_argument("--bcast-only", action="store_true", help="only the two bcast cases")
    p.add_argument("--wf-trace", metavar="DIR", help="gxpc make's trace of each workflow run "
                   "into DIR (writable by every user; gxpc plot draws one)")
    a = p.parse_args(argv)
    size = 16 if a.quick else a.size
    if not 1 <= size <= 4096 or not 1 <= a.reps <= 20:
        p.error("--size is 1..4096 MiB and --reps 1..20")
    if not 1 <= a.wf_ref <= 1024 or not 1 <= a.wf_split <= 256:
        p.error("--wf-ref is 1..1024 MiB and --wf-split 1..256 MiB")
    wf = (4 if a.quick else a.wf_ref, a.wf_split, a.workflow_only,
          os.path.abspath(a.wf_trace) if a.wf_trace else None)
    if a.workflow_only and a.bcast_only:
        p.error("give --workflow-only or --bcast-only, not both")
    return main_driver(WanBench, log, size, 1 if a.quick else a.reps, wf, a.bcast_only)


if __name__ == "__main__":
    sys.exit(main())
