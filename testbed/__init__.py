"""A loopback Proxmox test bed: real OpenSSH sshd(s) on 127.0.0.1, a fake `pct`
with Proxmox's grammar on their sessions' PATH, and real LXC containers.

    bed = TestBed.start()          # or TestBed.start(n_sshd=4)
    subprocess.run(bed.ssh_argv("pct", "list"))
    bed.stop()

By hand:  python -m testbed up     (Ctrl-C tears it down; scripts/testbed up)
          python -m testbed clean  (removes leftovers of crashed runs)

Layout of one bed (all under ``root``, e.g. /tmp/gpujob-tb-XXXXXX):

    bed.json                    who owns the bed (pid + start time), ports, pids
    bin/pct                     the fake pct (stdlib Python, paths baked in)
    ssh/user_key[.pub]          root's login key (ed25519)
    ssh/authorized_keys
    ssh/known_hosts             "[127.0.0.1]:PORT ssh-ed25519 AAAA..." for every sshd
    ssh/sshd<i>/{host_key,sshd_config,sshd.pid,sshd.log}
    lxc/200/{config,rootfs/,upper/,work/}  running container
    lxc/201/{config,rootfs/}               defined, never started (skeleton rootfs)

The Debian rootfs is built once with debootstrap and cached under
/var/cache/gpujob-testbed/ (override with $GPUJOB_TESTBED_CACHE); a build goes
into a temporary dir and is renamed into place only when complete. Each bed
gets its own writable rootfs: an overlayfs mount (cache = read-only lower
layer, the bed's writes land in lxc/200/upper) or, if overlayfs is unavailable
or GPUJOB_TESTBED_ROOTFS=copy, a `cp -a` of the cache.

Every process of a bed carries GPUJOB_TESTBED=<root> in its environment (the
sshd's, and through sshd_config SetEnv every ssh session, pct, lxc-attach and
what runs in the container with --keep-env); teardown and `clean` use it, the
bed's path in command lines and the process tree to find what to kill.

Only the standard library is used. The tests (tests/conftest.py's fixtures), the bench
and scripts/testbed import it from here; it is no part of the gpujob wheel (it needs root,
LXC and debootstrap, and only this repository's suite and bench use it).

    host.py      the machine: tools, paths, TestBedError, rm -rf that minds mounts
    rootfs.py    the cached Debian rootfs and each bed's writable copy of it
    procs.py     the bed's processes, read from /proc
    lxc.py       its containers: config, lxc-* calls, start
    sshd.py      its sshd's: keys, config, start, banner
    pct.py       the fake pct
    bed.py       TestBed: up, what tests reach it with, cuts and restarts
    teardown.py  down: one bed, or every stale one (clean)
"""
from testbed.bed import TestBed
from testbed.host import TestBedError
from testbed.procs import bed_processes
from testbed.rootfs import ensure_rootfs
from testbed.teardown import clean_stale

__all__ = ["TestBed", "TestBedError", "bed_processes", "ensure_rootfs", "clean_stale"]
