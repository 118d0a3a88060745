"""The daemon's ``run`` request: one command in a container (or on its host) over the
kept connection, for the full CLI's :class:`gpujob.conn.remote.KeptTransport`.

Unlike ``exec``, output comes back as frames (``o``, ``e``) because the caller handles
it (``Target.ask`` reads it; ``logs`` writes it); stdin arrives as ``I`` frames, ``E``
at its end. The end is ``x`` (code, timed_out, duration) or ``!`` (a GpujobError by
class name, message and hint); the client going away ends the command as Ctrl-C does.

Only the client's own socket failing (a send to it, or its end read by ``watch``) means
that nobody is left to tell. Any other OSError comes from below the daemon (paramiko's
socket, the pipe to the host) and is the client's ConnectionLost, as the direct
transport says it; anything else is a bug, logged with its traceback and said to the
client in one line. Neither ends with no end frame.
"""

from __future__ import annotations

import queue
import threading

from gpujob.conn import proto
from gpujob.daemon import logs
from gpujob.daemon.pool import Fallback
from gpujob.errors import ConnectionLost, GpujobError


class QueueStdin:
    """Stdin frames as a file to read; b"" at its end (or when the client went away)."""

    def __init__(self):
        self.q: queue.Queue = queue.Queue()
        self.ended = False

    def read(self, n: int = 65536) -> bytes:
        if self.ended:
            return b""
        chunk = self.q.get()
        if not chunk:
            self.ended = True
        return chunk


def _said(e: GpujobError) -> bytes:
    return proto.json_bytes({"cls": type(e).__name__, "message": e.message, "hint": e.hint})


def serve_run(pool, conn, reader, req: dict) -> None:
    send_lock = threading.Lock()
    gone = threading.Event()  # the client went away: its socket failed, or it sent its end

    def send(kind: bytes, payload: bytes = b"") -> None:
        with send_lock:
            try:
                conn.sendall(proto.pack(kind, payload))
            except OSError:
                gone.set()
                raise

    try:
        entry = pool.acquire(req.get("inventory"))
    except Fallback:
        send(b"F")
        return
    try:
        try:
            t = entry.target(req["target"])
        except Fallback:
            send(b"F")
            return
        except GpujobError as e:
            send(b"!", _said(e))
            return
        stdin = QueueStdin() if req.get("stdin") else None
        done = threading.Event()
        armed = [True]
        ilock = threading.Lock()
        worker = threading.get_ident()

        def watch() -> None:  # stdin frames; K or the client gone: Ctrl-C in the worker
            while True:
                try:
                    got = reader.frame()
                except (OSError, ValueError):
                    got = None
                if got is not None and got[0] in (b"I", b"E"):
                    if stdin is not None:
                        stdin.q.put(got[1] if got[0] == b"I" else b"")
                    continue
                if stdin is not None:
                    stdin.q.put(b"")
                gone.set()
                if done.is_set():
                    return
                with ilock:
                    if armed[0]:
                        proto.interrupt_thread(worker)
                return

        send(b"G")
        threading.Thread(target=watch, daemon=True).start()
        transport = entry.targets.host_transport(t.host_name) if req.get("where") == "host" else t.transport
        try:
            try:
                r = transport.run(list(req["argv"]), stdin=stdin, timeout=req.get("timeout"),
                                  on_stdout=lambda b: send(b"o", b), on_stderr=lambda b: send(b"e", b))
            finally:
                with ilock:
                    armed[0] = False
                done.set()
        except GpujobError as e:
            send(b"!", _said(e))
            return
        except (KeyboardInterrupt, OSError) as e:
            if gone.is_set() or isinstance(e, KeyboardInterrupt):
                return  # the client went away (or its socket broke): the command was ended
            send(b"!", _said(ConnectionLost(f"lost the connection to {transport.describe()} while running "
                                            f"{req['argv'][0]} in {req['target']}: {e}")))
            return
        except Exception as e:  # a bug: its traceback in conn.log, one line to the client
            logs.exception()
            send(b"!", _said(GpujobError(f"the connection daemon failed: {type(e).__name__}: {e}")))
            return
        send(b"x", proto.json_bytes({"code": r.exit_code, "timed_out": r.timed_out, "duration": r.duration}))
    finally:
        pool.release(entry)
