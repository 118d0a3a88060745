"""Frames between the thin client and the daemon over the Unix socket (stdlib only).

``kind (1 byte) | length (4) | payload``. Client: ``R`` request (JSON; the client's
stdin, stdout and stderr travel with it as SCM_RIGHTS descriptors, so the daemon
writes the command's output straight to them), ``K`` interrupt (Ctrl-C). Daemon:
``G`` going (remote work starts now), ``F`` fall back (run the full CLI directly;
nothing was done or printed), ``x`` exit (JSON ``{"code": N}``). The ``run`` request
(relay.py) adds ``I``/``E`` (stdin, its end) from the client and ``o``/``e`` (output)
and ``!`` (an error) from the daemon.
"""

from __future__ import annotations

import json
import socket
import struct

HEADER = struct.Struct("!cI")
MAX_FRAME = 1 << 24


def pack(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def json_bytes(obj) -> bytes:
    return json.dumps(obj).encode()


def pack_json(kind: bytes, obj) -> bytes:
    return pack(kind, json_bytes(obj))


class Reader:
    """Whole frames from a stream socket; ``fds`` collects descriptors that came along."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()
        self.fds: list[int] = []

    def frame(self):
        """(kind, payload), or None at EOF."""
        while True:
            if len(self.buf) >= HEADER.size:
                kind, n = HEADER.unpack_from(self.buf)
                if n > MAX_FRAME:
                    raise ValueError("frame too large")
                if len(self.buf) >= HEADER.size + n:
                    payload = bytes(self.buf[HEADER.size:HEADER.size + n])
                    del self.buf[:HEADER.size + n]
                    return kind, payload
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 65536, 8)
            self.fds.extend(fds)
            if not data:
                return None
            self.buf += data


def interrupt_thread(ident: int) -> None:
    """Raise KeyboardInterrupt in the thread ``ident``: the client's Ctrl-C reaching the
    worker thread that runs its command (in the daemon, or the CLI's relay)."""
    import ctypes
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))
