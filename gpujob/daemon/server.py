"""The connection daemon: holds one ``Targets`` (SSH connections, and the exec
channel into each container) per inventory for a few minutes of idle time, and
serves ``exec`` and ``status`` requests from the thin client over a Unix socket.

Host keys and authentication are those of :class:`gpujob.transport.ssh.SshTransport`
unchanged (strict; ``--accept-new`` never comes this way). A connection is reused
only while the inventory file's bytes, ~/.ssh/config and every known_hosts file it
names are unchanged; otherwise a fresh ``Targets`` is opened (the old one closes
when its last command ends). The client's stdio arrive as descriptors, so output
is written straight to its terminal or pipe, through the same code
(:mod:`gpujob.cli.bodies`) and with a console shaped like its own.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import threading
import time
from pathlib import Path

from gpujob.cli import bodies
from gpujob.conn import paths, proto
from gpujob.daemon import logs
from gpujob.daemon.pool import Entry, Fallback, Pool, prewarm
from gpujob.errors import ConnectionLost, GpujobError


log = logs.log


# ---- the client's console, shaped like its own -------------------------------------

class FdSink:
    """A binary sink onto the client's descriptor (what sys.stdout.buffer is there)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.failed = False  # a write to the client's descriptor failed (its reader is gone)

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except BlockingIOError:
                select.select([], [self.fd], [])
                continue
            except OSError:
                self.failed = True
                raise
            view = view[n:]
        return len(data)

    def flush(self) -> None:
        pass


class PolledStdin:
    """The client's stdin, read only while its request lasts: a feeder thread still
    waiting when the command is over takes nothing more from it."""

    def __init__(self, fd: int, done: threading.Event):
        self.fd, self.done = fd, done

    def read(self, n: int = 65536) -> bytes:
        while not self.done.is_set():
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                if ready:
                    return os.read(self.fd, n if n and n > 0 else 65536)
            except OSError:
                return b""
        return b""


def _dims(env: dict, fds: list[int], terminal: bool) -> tuple[int, int]:
    """rich's Console.size as the client's own process would compute it."""
    columns, lines = env.get("COLUMNS"), env.get("LINES")
    w_env = int(columns) if columns and columns.isdigit() else None
    h_env = int(lines) if lines and lines.isdigit() else None
    if w_env is not None and h_env is not None:
        return w_env, h_env
    if terminal and env.get("TERM", "").lower() in ("dumb", "unknown"):
        return 80, 25
    width = height = None
    for fd in fds:  # rich probes stdin, stdout, stderr in that order
        try:
            width, height = os.get_terminal_size(fd)
            break
        except OSError:
            pass
    return (w_env or width or 80), (h_env or height or 25)


def client_console(fd: int, encoding: str, env: dict, fds: list[int]):
    """render.console() as the client's own process would build it: on its descriptor,
    under its environment (piped: soft-wrapped at gpujob's piped width, unless $COLUMNS)."""
    from rich.console import Console

    from gpujob.cli import render
    text = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=encoding, write_through=True)
    settings = render.console_settings(os.isatty(fd), env)
    c = Console(file=text, _environ=env, **settings)
    width, c.height = _dims(env, fds, c.is_terminal)
    c.width = settings.get("width", width)
    return c


class LazyConsole:
    """client_console(...) made on first use: an ``exec`` that has nothing of gpujob's own
    to say (the usual case) never imports rich, which a cold one (oneshot.py) then saves."""

    def __init__(self, *args):
        self._args = args
        self._console = None

    def __getattr__(self, name):
        if self._console is None:
            self._console = client_console(*self._args)
        return getattr(self._console, name)


# ---- one request ---------------------------------------------------------------------

class Ctx:
    """What the shared command bodies need: the laptop's job index and targets."""

    def __init__(self, entry: Entry, going):
        self.entry = entry
        self.going = going
        self._state = None

    def state(self):
        if self._state is None:
            from gpujob.state import State
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
            from gpujob.cli import render
            if self.cutting:  # the drain's time was up (its connection closed under it)
                code = self.say_cut(err, req)
            else:
                err.print(render.lit(f"gpujob: {e.message}"), soft_wrap=True)
                if e.hint:
                    err.print(render.lit(f"  hint: {e.hint}"), soft_wrap=True)
                code = e.exit_code
        except KeyboardInterrupt:
            err.print("\ninterrupted")
            code = 130
        except OSError as e:
            if any(sink.failed for sink in sinks):
                code = 120  # what Python reports when flushing stdout to a closed pipe
            elif self.cutting:
                code = self.say_cut(err, req)
            else:  # from below the daemon (a pipe or socket to the host): said, never dropped
                from gpujob.cli import render
                err.print(render.lit(f"gpujob: lost the connection to {req.get('target')} while running "
                                     f"{(req.get('argv') or ['?'])[0]}: {e}"), soft_wrap=True)
                code = ConnectionLost.exit_code
        except Exception as e:  # a bug: its traceback in conn.log, one line to the client
            logs.exception()
            from gpujob.cli import render
            err.print(render.lit(f"gpujob: the connection daemon failed: {type(e).__name__}: {e}"),
                      soft_wrap=True)
            code = 1
        finally:
            if ctx is not None:
                ctx.close()
            if entry is not None:
                self.pool.release(entry)
        conn.sendall(proto.pack_json(b"x", {"code": code}))

    def say_cut(self, err, req: dict) -> int:
        from gpujob.cli import render
        err.print(render.lit(f"gpujob: the kept connection was closed (gpujob disconnect, or its daemon was told "
                             f"to stop) while {(req.get('argv') or [req.get('op')])[0]} still ran after "
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
        raise Fallback()


def serve(warm: tuple[str | None, str] | None = None) -> int:
    try:
        path = Path(paths.socket_path(create=True))
    except paths.NoDaemon as e:
        log(str(e))
        return 1
    Server(path, paths.idle_seconds()).serve(warm)
    return 0
