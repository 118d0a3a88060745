"""The bed itself: :class:`TestBed` brings one up (keys, the fake pct, containers, sshd's),
hands tests what they reach it with (ports, keys, a hosts.yaml, lxc-attach), cuts its
links and restarts its pieces on request, and tears it all down."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from testbed import lxc, sshd
from testbed.host import BED_PARENT, BED_PREFIX, CONTAINER_PATH, MARKER, TestBedError, ensure_host_tools
from testbed.pct import render_pct
from testbed.procs import bed_processes, descendants, proc_stat
from testbed.rootfs import ensure_rootfs, per_bed_rootfs, prepare_rootfs
from testbed.teardown import teardown_dir


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _exit_cleanly_on_signals() -> None:
    """Turn SIGTERM/SIGHUP (when still at their default) into KeyboardInterrupt, so a
    terminated pytest session stops like on Ctrl-C, running its finalizers (and
    atexit handlers run in a plain script): bed.stop() is not skipped."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _raise_interrupt)


class TestBed:
    """A running loopback Proxmox imitation. Use :meth:`start` to create one."""

    __test__ = False  # not a pytest test class

    vmid: int = 200
    stopped_vmid: int = 201
    second_vmid: int = 202  # a second running container behind a second sshd (start_second_host)

    def __init__(self, root: Path):
        self.root = Path(root)
        self.bin_dir = self.root / "bin"
        self.ssh_dir = self.root / "ssh"
        self.lxcpath = self.root / "lxc"
        self.user_key = self.ssh_dir / "user_key"
        self.known_hosts = self.ssh_dir / "known_hosts"
        self.ports: list[int] = []
        self.host_key_fingerprints: list[str] = []
        self.sshd_procs: list[subprocess.Popen] = []
        self.node = socket.gethostname().split(".")[0] or "pve"
        self.timings: dict[str, float] = {}
        self.rootfs_mode = ""   # "overlay" or "copy"
        self._owner = os.getpid()
        self._stopped = False

    # -- convenience ---------------------------------------------------------------

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def host_key_fingerprint(self) -> str:
        return self.host_key_fingerprints[0]

    @property
    def sshd_pids(self) -> list[int]:
        return [p.pid for p in self.sshd_procs]

    @property
    def host_names(self) -> list[str]:
        """Inventory names written by write_hosts_yaml, one per sshd: tb, tb2, tb3..."""
        return ["tb" if i == 0 else f"tb{i + 1}" for i in range(len(self.ports))]

    @property
    def env_marker(self) -> tuple[str, str]:
        """(NAME, VALUE) set in every ssh session of this bed."""
        return MARKER, str(self.root)

    def __repr__(self) -> str:
        return f"<TestBed {self.root} ports={self.ports}>"

    def __enter__(self) -> "TestBed":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- lifecycle -----------------------------------------------------------------

    @classmethod
    def start(cls, n_sshd: int = 1) -> "TestBed":
        """Bring up a bed: n_sshd sshd's (each its own port and host key, same
        user key, same pct and containers), container 200 running, 201 stopped.
        Raises TestBedError with the reason if anything fails (and cleans up)."""
        if os.geteuid() != 0:
            raise TestBedError("the test bed needs root (sshd for root, lxc-start)")
        if n_sshd < 1:
            raise ValueError("n_sshd must be >= 1")
        t0 = time.monotonic()
        ensure_host_tools()
        rootfs, build_s = ensure_rootfs()
        root = Path(tempfile.mkdtemp(prefix=BED_PREFIX, dir=BED_PARENT))
        os.chmod(root, 0o755)
        bed = cls(root)
        bed.timings["rootfs_build"] = build_s
        try:
            bed._write_meta()
            atexit.register(bed.stop)
            _exit_cleanly_on_signals()
            bed._make_keys_and_pct()
            t1 = time.monotonic()
            bed._make_containers(rootfs)
            bed.timings["containers"] = time.monotonic() - t1
            t1 = time.monotonic()
            for i in range(n_sshd):
                bed._start_sshd(i)
            bed._write_meta()
            bed.timings["sshd"] = time.monotonic() - t1
        except BaseException:
            bed.stop()
            raise
        bed.timings["start_total"] = time.monotonic() - t0
        bed.timings["start_warm"] = bed.timings["start_total"] - build_s
        return bed

    def stop(self) -> None:
        """Stop containers and sshd's (and every session), remove the dir. Idempotent;
        does nothing in a forked child of the owner process."""
        if self._stopped or os.getpid() != self._owner:
            return
        self._stopped = True
        t0 = time.monotonic()
        for p in self.sshd_procs:
            if p.poll() is None:
                p.terminate()
        try:
            teardown_dir(self.root)
        finally:
            for p in self.sshd_procs:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            try:
                atexit.unregister(self.stop)
            except Exception:
                pass
        self.timings["stop"] = time.monotonic() - t0

    def start_extra_sshd(self) -> int:
        """Bring up one more independent sshd (own port and host key) reaching the same
        pct/containers; returns its port (also appended to ``ports``)."""
        self._start_sshd(len(self.ports))
        self._write_meta()
        return self.ports[-1]

    def start_second_host(self) -> int:
        """A second "host", started only when a test asks: container 202 running (its
        own writable rootfs, sharing the host network like 200, so 127.0.0.1 and the
        host's IP reach both) behind one more sshd. Returns that sshd's port. Idempotent."""
        if getattr(self, "_second_port", None):
            return self._second_port
        cached, _ = ensure_rootfs()
        ct = self.lxcpath / str(self.second_vmid)
        ct.mkdir()
        rootfs = ct / "rootfs"
        per_bed_rootfs(cached, ct, rootfs)
        prepare_rootfs(rootfs, f"ct{self.second_vmid}")
        lxc.write_config(ct, f"ct{self.second_vmid}", rootfs)
        self._lxc_start(self.second_vmid)
        self._second_port = self.start_extra_sshd()
        return self._second_port

    # -- setup pieces --------------------------------------------------------------

    def _write_meta(self) -> None:
        st = proc_stat(os.getpid())
        meta = {"owner_pid": os.getpid(), "owner_start": st[2] if st else None,
                "ports": self.ports, "sshd_pids": self.sshd_pids,
                "created": time.time()}
        tmp = self.root / "bed.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, self.root / "bed.json")

    def _make_keys_and_pct(self) -> None:
        self.ssh_dir.mkdir(mode=0o700)
        sshd.keygen(self.user_key, "gpujob-testbed-user")
        pub = (self.ssh_dir / "user_key.pub").read_text()
        (self.ssh_dir / "authorized_keys").write_text(pub)
        self.known_hosts.write_text("")
        self.bin_dir.mkdir()
        pct = self.bin_dir / "pct"
        pct.write_text(render_pct(self.lxcpath, self.node))
        pct.chmod(0o755)

    def _make_containers(self, cached_rootfs: Path) -> None:
        self.lxcpath.mkdir()
        # 200: a copy of the cached rootfs, running
        ct = self.lxcpath / str(self.vmid)
        ct.mkdir()
        rootfs = ct / "rootfs"
        self.rootfs_mode = per_bed_rootfs(cached_rootfs, ct, rootfs)
        prepare_rootfs(rootfs, f"ct{self.vmid}")
        lxc.write_config(ct, f"ct{self.vmid}", rootfs)
        # 201: defined, never started; a skeleton rootfs is enough
        ct2 = self.lxcpath / str(self.stopped_vmid)
        ct2.mkdir()
        (ct2 / "rootfs").mkdir()
        for d in ("root", "tmp", "etc"):
            (ct2 / "rootfs" / d).mkdir()
        lxc.write_config(ct2, f"ct{self.stopped_vmid}", ct2 / "rootfs")
        self._lxc_start(self.vmid)

    def _lxc_start(self, vmid: int) -> None:
        lxc.start(self.lxcpath, vmid, self.root)
        # python3 must run, /root must be root's home
        chk = self.container_exec("/bin/sh", "-c",
                                  'cd ~root && [ "$(pwd)" = /root ] && python3 -c "print(42)"')
        if chk.returncode != 0 or chk.stdout.strip() != b"42":
            raise TestBedError(f"container {vmid} is up but python3 does not run: "
                               f"{chk.stdout!r} {chk.stderr!r}")

    def _start_sshd(self, index: int) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        d = self.ssh_dir / f"sshd{index}"
        d.mkdir(exist_ok=True)
        host_key = d / "host_key"
        if not host_key.exists():
            sshd.keygen(host_key, f"gpujob-testbed-host{index}")
        pub = (d / "host_key.pub").read_text().split()
        last_err = ""
        for _attempt in range(5):
            port = sshd.free_port()
            cfg = sshd.write_config(d, port, host_key, self.ssh_dir, self.bin_dir, self.root)
            log = d / "sshd.log"
            proc = sshd.spawn(cfg, log, self.root)
            if sshd.up(proc, port, within=10):
                self.sshd_procs.append(proc)
                self.ports.append(port)
                self.host_key_fingerprints.append(sshd.fingerprint(" ".join(pub)))
                with open(self.known_hosts, "a") as f:
                    f.write(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
                return
            sshd.end(proc)
            last_err = log.read_text(errors="replace") if log.exists() else ""
            if "Address already in use" not in last_err:
                break
        raise TestBedError(f"sshd did not come up: {last_err.strip()[-2000:]}")

    # -- helpers for tests -----------------------------------------------------------

    def restart_sshd(self, index: int = 0) -> None:
        """Restart sshd ``index`` the way a host's sshd restarts: the listener goes,
        every open connection is cut, and a new sshd comes up on the same port and key."""
        old = self.sshd_procs[index]
        self.kill_ssh_sessions()
        old.terminate()
        old.wait(10)
        d = self.ssh_dir / f"sshd{index}"
        port = self.ports[index]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            proc = sshd.spawn(d / "sshd_config", d / "sshd.log", self.root)
            if sshd.up(proc, port, within=5):
                self.sshd_procs[index] = proc
                self._write_meta()
                return
            sshd.end(proc)
            time.sleep(0.2)  # the old listener's port may linger a moment
        raise TestBedError(f"sshd {index} did not come back on port {port}")

    def restart_container(self, vmid: int | None = None) -> None:
        """Stop the container hard (every process in it dies, as at a host reboot or
        `pct stop`) and start it again; its filesystem stays."""
        vmid = vmid or self.vmid
        lxc.lxc("lxc-stop", "-P", str(self.lxcpath), "-n", str(vmid), "-k", timeout=30)
        self._lxc_start(vmid)

    def ssh_argv(self, *remote_argv: str, port: int | None = None) -> list[str]:
        """OpenSSH client argv to run ``remote_argv`` (joined by ssh with spaces and
        parsed by the remote shell: quoting is the caller's business)."""
        return ["ssh", "-F", "/dev/null", "-p", str(port or self.port),
                "-i", str(self.user_key), "-o", "IdentitiesOnly=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                "-o", "ConnectTimeout=10",
                "root@127.0.0.1", *remote_argv]

    def write_hosts_yaml(self, path: Path, *, known_hosts: Path | None = None,
                         extra_hosts: str = "") -> Path:
        """Write a gpujob inventory with one host per sshd (tb, tb2, ...), each with
        containers ct200 (vmid 200, running) and ct201 (vmid 201, stopped).
        ``extra_hosts`` is appended verbatim under ``hosts:`` (indent it by 2)."""
        path = Path(path)
        kh = Path(known_hosts) if known_hosts is not None else self.known_hosts
        lines = ["hosts:"]
        for name, port in zip(self.host_names, self.ports):
            lines += [f"  {name}:",
                      "    address: 127.0.0.1",
                      f"    port: {port}",
                      "    user: root",
                      f"    identity_file: {json.dumps(str(self.user_key))}",
                      f"    known_hosts: {json.dumps(str(kh))}",
                      "    containers:",
                      f"      ct{self.vmid}: {{vmid: {self.vmid}}}",
                      f"      ct{self.stopped_vmid}: {{vmid: {self.stopped_vmid}}}"]
        text = "\n".join(lines) + "\n"
        if extra_hosts:
            text += extra_hosts if extra_hosts.endswith("\n") else extra_hosts + "\n"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def container_exec(self, *argv: str, input: bytes | None = None,
                       timeout: float | None = 120, vmid: int | None = None,
                       env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run argv in the container directly with lxc-attach (no ssh, no pct);
        stdout/stderr captured as bytes."""
        cenv = {"PATH": CONTAINER_PATH, "HOME": "/root", "LANG": "C.UTF-8",
                "USER": "root", "LOGNAME": "root", MARKER: str(self.root)}
        if env:
            cenv.update(env)
        return subprocess.run(
            ["lxc-attach", "-P", str(self.lxcpath), "-n", str(vmid or self.vmid),
             "--keep-env", "--", *argv],
            input=input if input is not None else b"", capture_output=True, timeout=timeout,
            env=cenv,
        )

    def container_path(self, path: str, vmid: int | None = None) -> Path:
        """Host path of ``path`` inside the container's rootfs."""
        return self.lxcpath / str(vmid or self.vmid) / "rootfs" / str(path).lstrip("/")

    def container_state(self, vmid: int | None = None) -> str:
        """'RUNNING' / 'STOPPED' (lxc-info)."""
        return lxc.lxc_state(self.lxcpath, str(vmid or self.vmid))

    def session_pids(self) -> list[int]:
        """Per-connection sshd processes (all descendants of the listeners named sshd)."""
        listeners = set(self.sshd_pids)
        return sorted(p for p in descendants(listeners)
                      if (proc_stat(p) or (0, "", 0))[1].startswith("sshd"))

    def kill_ssh_sessions(self) -> int:
        """SIGKILL every per-connection sshd process (cutting every open connection the
        way a network drop would: the commands they ran are NOT signalled) but leave
        the listeners running. Returns how many connections were cut."""
        listeners = set(self.sshd_pids)
        victims = self.session_pids()
        conns = 0
        for p in victims:
            st = proc_stat(p)
            if st and st[0] in listeners:
                conns += 1
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(proc_stat(p) for p in victims):
            time.sleep(0.02)
        return conns

    def processes(self) -> set[int]:
        """Live processes belonging to this bed (for leak checks)."""
        return bed_processes(self.root)
