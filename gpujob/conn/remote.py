"""The full CLI's way into a container over the kept connection: a Transport that sends
each command to the daemon (see relay.py), and runs it directly instead whenever the
daemon cannot be had before the command starts (none will start, another setup, a local
target). Stdlib only besides gpujob's own transport base and errors."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Sequence

from gpujob import errors
from gpujob.conn import client, paths, proto
from gpujob.errors import ConnectionLost, GpujobError
from gpujob.transport.base import OnData, Result, Stdin, Transport, iter_chunks, keep


def _error(info: dict) -> GpujobError:
    cls = getattr(errors, str(info.get("cls")), None)
    if not (isinstance(cls, type) and issubclass(cls, GpujobError)):
        cls = GpujobError
    e = cls.__new__(cls)
    GpujobError.__init__(e, info.get("message") or "failed", info.get("hint"))
    if isinstance(e, errors.RemoteError):
        e.result = None
    return e


class KeptTransport(Transport):
    """``direct`` (the transport this target would use) with its commands sent to the
    daemon, which runs them in the container (``where="container"``: ``direct`` is the
    PctTransport) or on the Proxmox host (``where="host"``: ``direct`` is the host's
    SshTransport). Whenever the daemon cannot be had, ``direct`` runs them itself."""

    def __init__(self, direct: Transport, inventory: str, target: str, where: str = "container"):
        self.direct = direct
        self.inventory = inventory
        self.target = target
        self.where = where
        self.use_direct = False

    def describe(self) -> str:
        return self.direct.describe()

    def close(self) -> None:
        self.direct.close()

    def open_stream(self, argv: Sequence[str]):
        """A raw stream is the direct transport's (nothing in gpujob asks one of a target)."""
        return self.direct.open_stream(argv)

    def __getattr__(self, name):  # vmid, pct, host_argv, … of the direct transport
        return getattr(self.direct, name)

    def status_result(self):
        """``pct status VMID`` as PctTransport.status_result says it, asked over the kept connection."""
        from gpujob.transport.pct import PctStatus
        host = KeptTransport(self.direct.inner, self.inventory, self.target, where="host")
        host.use_direct = self.use_direct
        r = host.run([self.direct.pct, "status", str(self.direct.vmid)], timeout=30)
        return PctStatus(r.exit_code, r.text.strip(), r.tail())

    def status(self) -> str:
        from gpujob.transport.pct import status_text
        return status_text(self.status_result(), self.vmid)  # PctTransport's reading, over ours

    def run(self, argv: Sequence[str], *, stdin: Stdin = None, timeout: float | None = None,
            on_stdout: OnData | None = None, on_stderr: OnData | None = None) -> Result:
        if not self.use_direct:
            opened = self._open(argv, stdin, timeout)
            if opened is not None:
                s, reader = opened
                return self._relay(s, reader, list(argv), stdin, on_stdout, on_stderr)
            self.use_direct = True
        return self.direct.run(argv, stdin=stdin, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr)

    def _open(self, argv, stdin, timeout):
        """(socket, its reader) once the daemon said it is going ahead, or None: run
        directly. The reader is the one that read G: what came with G in the same read
        (the output and exit of a quick command, on a loaded machine) is in its buffer."""
        try:
            s = client.connect()  # none answering: one starts for the next command
        except (paths.NoDaemon, OSError):
            return None
        if s is None:
            return None
        req = {"op": "run", "inventory": self.inventory, "target": self.target, "where": self.where,
               "argv": list(argv), "timeout": timeout, "stdin": stdin is not None,
               "stamp": paths.code_stamp(), "env": paths.env_view()}
        reader = proto.Reader(s)
        try:
            socket.send_fds(s, [proto.pack_json(b"R", req)], [])
            got = reader.frame()
        except (OSError, ValueError):
            got = None
        if got is not None and got[0] == b"G":
            return s, reader
        s.close()
        if got is not None and got[0] == b"!":
            raise _error(json.loads(got[1]))
        return None

    def _relay(self, s, reader: proto.Reader, argv, stdin, on_stdout, on_stderr) -> Result:
        started = time.monotonic()
        out, err = bytearray(), bytearray()
        sinks = {b"o": (on_stdout, out), b"e": (on_stderr, err)}
        if stdin is not None:
            threading.Thread(target=self._feed, args=(s, stdin), daemon=True).start()
        try:
            while True:
                try:
                    got = reader.frame()
                except (OSError, ValueError):
                    got = None
                if got is None:
                    raise ConnectionLost(f"lost the connection daemon while running {argv[0]} in "
                                         f"{self.target}; it may or may not have finished")
                kind, payload = got
                if kind in sinks:
                    cb, buf = sinks[kind]
                    if cb is None:
                        keep(buf, payload, self.describe(), argv)  # past it: closed below
                    else:
                        cb(payload)
                elif kind == b"x":
                    info = json.loads(payload)
                    return Result(argv, info["code"], bytes(out), bytes(err), info["timed_out"],
                                  time.monotonic() - started)
                elif kind == b"!":
                    raise _error(json.loads(payload))
        finally:
            s.close()  # early (Ctrl-C, a sink that failed): the daemon ends the command

    @staticmethod
    def _feed(s, stdin: Stdin) -> None:
        try:
            for chunk in iter_chunks(stdin, 1 << 16):
                s.sendall(proto.pack(b"I", chunk))
            s.sendall(proto.pack(b"E"))
        except OSError:
            pass
