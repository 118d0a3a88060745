"""The connection daemon: holds one ``Targets`` (SSH connections, and the exec
channel into each container) per inventory for a few minutes of idle time, and
serves ``exec``, ``status`` and ``ps`` requests from the thin client over a Unix socket.

Host keys and authentication are those of :class:`gpujob.transport.ssh.SshTransport`
unchanged (strict; ``--accept-new`` never comes this way). A connection is reused
only while the inventory file's bytes, ~/.ssh/config and every known_hosts file it
names are unchanged; otherwise a fresh ``Targets`` is opened (the old one closes
when its last command ends). The client's stdio arrive as descriptors, so output
is written straight to its terminal or pipe, through the same code
(:mod:`gpujob.ops.bodies`) and with a console shaped like its own.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

from gpujob.ops import bodies
from gpujob.conn import paths, proto
from gpujob.daemon import logs
from gpujob.daemon.console import FdSink, LazyConsole, PolledStdin, ReaderGone, client_console
from gpujob.daemon.pool import Entry, Fallback, Pool, prewarm
from gpujob.errors import ConnectionLost, GpujobError, InputError


log = logs.log


# ---- one request ---------------------------------------------------------------------

class Ctx:
    """What the shared command bodies need: the laptop's job index and targets."""

    def __init__(self, entry: Entry, going):
        self.entry = entry
        self.going = going
        self._state = None

    def state(self):
        if self._state is None:
            from gpujob.ops.state import State
            self._state = State()
        return self._state

    def target(self, name: str):
        return self.entry.target(name)

    def close(self) -> None:
        if self._state is not None:
            self._state.close()


class Server:
    def __init__(self, path: Path, idle: float):
        self.path = path
        self.idle = idle
        self.pool = Pool()
        self.stamp = paths.code_stamp()
        self.env = paths.env_view()
        self.active = 0
        self.last = time.monotonic()
        self.stopping = threading.Event()  # disconnect or SIGTERM: drain, then end
        self.stopped = threading.Event()  # drained and its connections closed
        self.drain = paths.drain_seconds()
        self.cutting = False  # the drain's time is up: what still runs is being cut
        self.cut = 0  # how many commands were cut
        self.stoppers = 0  # stop requests waiting for the drain (in active, never drained)
        self.lock = threading.Lock()

    # the listening socket
    def bind(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(self.path))
            raise SystemExit("a connection daemon is already running")
        except (FileNotFoundError, ConnectionRefusedError):
            if self.path.exists():
                self.path.unlink()  # stale: the daemon that made it is gone
        finally:
            probe.close()
        old = os.umask(0o177)
        try:
            s.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.ino = os.stat(self.path).st_ino
        s.listen(64)
        s.settimeout(0.5)
        return s

    def reachable(self) -> bool:
        """Whether clients can still find this daemon: its socket file is the one it bound
        (removed, say with its runtime dir, nobody new can come)."""
        try:
            return os.stat(self.path).st_ino == self.ino
        except OSError:
            return False

    def prewarm(self, inventory: str | None, target: str) -> None:
        """The target the command that started this daemon used, opened now (pool.prewarm)."""
        said = prewarm(self.pool, inventory, target)
        if said:
            log(said)

    def serve(self, warm: tuple[str | None, str] | None = None) -> None:
        sock = self.bind()
        log(f"listening on {self.path}; idle time {self.idle:g}s")
        if warm is not None:
            threading.Thread(target=self.prewarm, args=warm, daemon=True, name="gpujob-prewarm").start()
        try:
            os.unlink(paths.starting_marker(str(self.path)))  # started: spawners need not wait
        except OSError:
            pass
        signal.signal(signal.SIGTERM, lambda *a: self.stopping.set())
        try:
            while not self.stopping.is_set():
                try:
                    conn, _ = sock.accept()
                except socket.timeout:
                    with self.lock:
                        if self.active == 0 and time.monotonic() - self.last > self.idle:
                            log("idle: ending")
                            break
                    if not self.reachable():
                        log("its socket is gone: ending once what runs here ends")
                        break
                    continue
                with self.lock:
                    self.active += 1
                threading.Thread(target=self.handle, args=(conn,), daemon=True).start()
        finally:
            sock.close()
            try:
                if os.stat(self.path).st_ino == self.ino:
                    self.path.unlink()
            except OSError:
                pass
            self.wait_for_commands()
            self.pool.close()
            self.stopped.set()
            self.settle(2.0)  # the cut commands' lines and the stop requests' answers go out
            log("stopped")

    def busy(self) -> int:
        with self.lock:
            return self.active - self.stoppers

    def wait_for_commands(self) -> None:
        """Nobody new comes: what runs here ends first. Idle or unreachable, however long
        that takes; once told to stop (disconnect, SIGTERM), for at most ``drain``
        seconds, after which what still runs is cut (its connection closed: the exec
        channel's server ends it in the container) and told so in one line, exit 3."""
        deadline = None
        while self.busy() > 0:
            if self.stopping.is_set():
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.drain
                    log(f"stopping: waiting up to {self.drain:g}s for {self.busy()} command(s) still running")
                elif now >= deadline:
                    with self.lock:
                        self.cutting = True
                        self.cut = self.active - self.stoppers
                    log(f"stopping: cutting {self.cut} command(s) still running after {self.drain:g}s")
                    return
            time.sleep(0.05)

    def settle(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if self.active == 0:
                    return
            time.sleep(0.02)

    def handle(self, conn: socket.socket) -> None:
        fds: list[int] = []
        stopper = False
        try:
            reader = proto.Reader(conn)
            got = reader.frame()
            fds = reader.fds
            if got is None or got[0] != b"R":
                return
            req = json.loads(got[1])
            if req.get("op") == "stop":  # answered once drained (and its connections closed)
                with self.lock:
                    self.stoppers += 1
                stopper = True
                self.stopping.set()
                self.stopped.wait(self.drain + 5)
                conn.sendall(proto.pack_json(b"x", {"code": 0, "cut": self.cut}))
                return
            if self.stopping.is_set():  # it came during the drain: it runs directly
                conn.sendall(proto.pack(b"F"))
                return
            if req.get("stamp") != self.stamp or req.get("env") != self.env or \
                    len(fds) != (0 if req.get("op") == "run" else 3):
                # another environment's command (its key names another socket, so only a
                # client that changed under its feet gets here): it runs directly; this
                # daemon serves on for its own
                conn.sendall(proto.pack(b"F"))
                return
            if req.get("op") == "run":
                from gpujob.daemon.relay import serve_run
                serve_run(self.pool, conn, reader, req)
                return
            self.run(conn, reader, req, fds)
        except (OSError, ValueError) as e:
            log(f"request dropped: {type(e).__name__}")
        finally:
            for fd in fds:
                os.close(fd)
            try:  # the client reads its end now: a close alone waits for the thread still
                conn.shutdown(socket.SHUT_RDWR)  # blocked reading this socket (watch)
            except OSError:
                pass
            conn.close()
            with self.lock:
                self.active -= 1
                self.last = time.monotonic()
                self.stoppers -= stopper

    def run(self, conn: socket.socket, reader: proto.Reader, req: dict, fds: list[int]) -> None:
        env = req.get("term") or {}
        enc = req.get("encoding") or ["utf-8", "utf-8"]
        make = LazyConsole if req.get("op") == "exec" else client_console
        out = make(fds[1], enc[0], env, fds)
        err = make(fds[2], enc[1], env, fds)
        done = threading.Event()
        armed = [True]
        ilock = threading.Lock()
        worker = threading.get_ident()

        def watch() -> None:  # K from the client, or the client gone: Ctrl-C in the worker
            try:
                got = reader.frame()
            except (OSError, ValueError):
                got = None
            if done.is_set():
                return
            with ilock:
                if armed[0]:
                    proto.interrupt_thread(worker)
            del got

        going = [False]

        def go() -> None:
            going[0] = True
            conn.sendall(proto.pack(b"G"))

        entry = None
        ctx = None
        code = 1
        sinks = (FdSink(fds[1]), FdSink(fds[2]))
        try:
            try:
                threading.Thread(target=watch, daemon=True).start()
                entry = self.pool.acquire(req.get("inventory"))
                ctx = Ctx(entry, go)
                code = self.dispatch(ctx, req, fds, sinks, out, err, done)
            finally:
                with ilock:
                    armed[0] = False
                done.set()
        except Fallback:
            if not going[0]:
                conn.sendall(proto.pack(b"F"))
                return
            code = 1
        except GpujobError as e:
            from gpujob.show import render
            if self.cutting:  # the drain's time was up (its connection closed under it)
                code = self.say_cut(err, req)
            elif req.get("json"):  # the full CLI's --json error line (cli/main.py), byte for byte
                code = self.say_json(sinks[1], e.message, e.exit_code, e.hint, e.refusal)
            else:
                err.print(render.lit(f"gpujob: {e.message}"), soft_wrap=True)
                if e.hint:
                    err.print(render.lit(f"  hint: {e.hint}"), soft_wrap=True)
                code = e.exit_code
        except KeyboardInterrupt:
            if req.get("json"):
                code = self.say_json(sinks[1], "interrupted", 130)
            else:
                err.print("\ninterrupted")
                code = 130
        except OSError as e:
            if isinstance(e, ReaderGone) or any(sink.failed for sink in sinks):
                code = 0  # the reader went away (`| head -2`): quiet, exit 0, as the full CLI ends
            elif self.cutting:
                code = self.say_cut(err, req)
            else:  # from below the daemon (a pipe or socket to the host): said, never dropped
                from gpujob.show import render
                err.print(render.lit(f"gpujob: lost the connection to {req.get('target')} while running "
                                     f"{(req.get('argv') or ['?'])[0]}: {e}"), soft_wrap=True)
                code = ConnectionLost.exit_code
        except Exception as e:  # a bug: its traceback in conn.log, one line to the client
            logs.exception()
            from gpujob.show import render
            err.print(render.lit(f"gpujob: the connection daemon failed: {type(e).__name__}: {e}"),
                      soft_wrap=True)
            code = 1
        finally:
            if ctx is not None:
                ctx.close()
            if entry is not None:
                self.pool.release(entry)
        conn.sendall(proto.pack_json(b"x", {"code": code}))

    @staticmethod
    def say_json(sink, message: str, code: int, hint: str | None = None, refused: str | None = None) -> int:
        """An error as ``--json`` says it without the daemon: one JSON line on stderr."""
        body: dict = {"error": message, "code": code}
        if hint:
            body["hint"] = hint
        if refused:
            body["refused"] = refused
        sink.write((json.dumps(body) + "\n").encode())
        return code

    def say_cut(self, err, req: dict) -> int:
        from gpujob.show import render
        err.print(render.lit(f"gpujob: the kept connection was closed (gpujob disconnect, or its daemon was "
                             f"told to stop) while {(req.get('argv') or [req.get('op')])[0]} still ran after "
                             f"{self.drain:g}s of waiting for it; it was ended in {req.get('target')}"),
                  soft_wrap=True)
        return ConnectionLost.exit_code

    def dispatch(self, ctx: Ctx, req: dict, fds: list[int], sinks, out, err, done) -> int:
        if req["op"] == "exec":
            t = ctx.target(req["target"])
            ctx.going()
            stdin = PolledStdin(fds[0], done) if req.get("stdin") else None
            so, se = sinks
            return bodies.run_exec(t, list(req["argv"]), stdin, req.get("timeout"), so, se, err)
        if req["op"] == "status":
            if not req.get("target") and bodies.multi_node(ctx, req.get("job")):
                raise Fallback()  # a multi-node job: the full CLI's fleet view
            job_id, t = bodies.job_target(ctx, req.get("job"), req.get("target"))
            ctx.going()
            bodies.show_status(ctx, job_id, t, bool(req.get("json")), out, err)
            return 0
        if req["op"] == "ps":
            try:  # every row's target opened (no I/O yet): one this inventory does not know, or
                rows = bodies.ps_rows(ctx, req.get("target"), int(req.get("limit") or 20))
                for label in {r["target"] for r in rows}:  # a local one, is the full CLI's
                    ctx.target(label)
            except InputError:  # (it also looks among the inventory entries this laptop recorded)
                raise Fallback() from None
            ctx.going()
            bodies.show_ps(ctx, rows, bool(req.get("json")), float(req.get("timeout") or bodies.PS_TIMEOUT),
                           bodies.PS_WORKERS, out, err)
            return 0
        raise Fallback()


def serve(warm: tuple[str | None, str] | None = None) -> int:
    try:
        path = Path(paths.socket_path(create=True))
    except paths.NoDaemon as e:
        log(str(e))
        return 1
    Server(path, paths.idle_seconds()).serve(warm)
    return 0
