"""``python -m testbed up [--n-sshd N] | clean [--all] | rootfs`` (scripts/testbed)."""

from __future__ import annotations

import signal
import sys
import time

from testbed import TestBed, TestBedError, clean_stale, ensure_rootfs


def _cmd_up(args: list[str]) -> int:
    n = 1
    if "--n-sshd" in args:
        n = int(args[args.index("--n-sshd") + 1])
    bed = TestBed.start(n_sshd=n)

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    try:
        hosts = bed.write_hosts_yaml(bed.root / "hosts.yaml")
        print(f"test bed up in {bed.timings['start_total']:.1f}s: {bed.root}")
        print(f"  hosts.yaml : {hosts}")
        for name, port, fp in zip(bed.host_names, bed.ports, bed.host_key_fingerprints):
            print(f"  {name:<10} : 127.0.0.1:{port}  host key {fp}")
        print("  ssh in     : " + " ".join(bed.ssh_argv()))
        print("  try        : " + " ".join(bed.ssh_argv("pct", "list")))
        print("Ctrl-C to tear down.", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        bed.stop()
        print(f"\ntorn down in {bed.timings.get('stop', 0):.1f}s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m testbed up [--n-sshd N] | clean [--all] | rootfs")
        return 0 if argv else 2
    cmd = argv[0]
    try:
        if cmd == "up":
            return _cmd_up(argv[1:])
        if cmd == "clean":
            removed = clean_stale(force="--all" in argv[1:])
            print(f"removed {len(removed)} leftover(s)")
            return 0
        if cmd == "rootfs":
            path, took = ensure_rootfs()
            print(f"{path} ({'built in %.1fs' % took if took else 'cached'})")
            return 0
    except TestBedError as e:
        print(f"testbed: {e}", file=sys.stderr)
        return 1
    print(f"unknown command {cmd!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
