"""The thin side of the kept connection (stdlib only): reach the daemon, hand it a
request with our stdin/stdout/stderr, and wait for its exit code. When none answers,
the full CLI runs the command, and its first command on an SSH host starts one in the
background (remote.py): a local target never starts a daemon."""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import sys
import time

from gpujob.conn import paths, proto

STARTING_FOR = 30.0


def _connect(path) -> socket.socket | None:
    """A connection to a live daemon at path; None when none is there (a stale socket
    file, one that refuses, is left for the caller to clean under the lock)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
    except OSError as e:
        s.close()
        if e.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return None
        raise paths.NoDaemon(f"cannot reach {path}: {e.strerror}") from None
    uid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
    if uid != os.getuid():  # the directory check makes this impossible; check anyway
        s.close()
        raise paths.NoDaemon(f"{path} is served by uid {uid}")
    return s


#: what the daemon keeps of the environment of the command that starts it: it lives for
#: minutes and serves other commands, so it carries none of this one's other variables
#: (tokens a job spec takes from the environment, say)
DAEMON_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH",
              "SSH_AUTH_SOCK", "GPUJOB_CONN_IDLE", "GPUJOB_CONN_DRAIN", "GPUJOB_HOSTS")


def daemon_env() -> dict:
    return {k: v for k, v in os.environ.items()
            if k in DAEMON_ENV or k.startswith(("LC_", "XDG_"))}


def _spawn(path: str, warm: tuple[str | None, str] | None = None):
    """Start the daemon detached: its own session, no terminal, nothing inherited.
    ``warm``: (inventory path or None, target) the command that starts it used, which
    the daemon connects to at once, so that the next command finds it open."""
    import subprocess
    log = open(os.path.join(os.path.dirname(path), "conn.log"), "ab")
    os.chmod(log.name, 0o600)
    argv = [sys.executable, "-m", "gpujob.daemon", "serve"]
    if warm is not None:
        argv += ["--warm", warm[0] or "", warm[1]]  # an argv list: no shell reads it
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True, close_fds=True,
                                cwd="/", env=daemon_env())
    finally:
        log.close()


#: a command still running this many seconds after it found no daemon starts one then
START_AFTER = 2.0
_soon: list = []


def connect(start: bool = True) -> socket.socket | None:
    """A connection to this user's live daemon, or None. With ``start``, when none
    answers, one is started in the background for the commands that follow; this one
    runs directly (waiting for a daemon to start costs more than the command itself)."""
    path = paths.socket_path(create=start)
    s = _connect(path)
    if s is None and start:
        start_soon(path)
    return s


def start_soon(path: str, warm: tuple[str | None, str] | None = None) -> None:
    """Start the daemon once this command has done its own connecting: when it exits, or
    START_AFTER seconds from now if it still runs (``logs -f``). A daemon starting at
    once (its imports, its own SSH handshake) would take the CPU that this command's
    connection needs: on two cores the cold command took ~0.3 s longer."""
    if _soon:
        return
    import atexit
    import threading
    once = threading.Lock()

    def go() -> None:
        if once.acquire(blocking=False):
            try:
                _start(path, warm)
            except (OSError, paths.NoDaemon):
                pass  # no daemon this time: the next command starts one

    timer = threading.Timer(START_AFTER, go)
    timer.daemon = True
    timer.start()
    atexit.register(go)
    _soon.append(timer)


def _start(path: str, warm: tuple[str | None, str] | None = None) -> None:
    """Start this environment's daemon unless one answers or is on its way (its
    ``conn-KEY.starting`` holds the pid of one spawned less than STARTING_FOR seconds
    ago). Spawners take one lock, so commands at once start one daemon; a socket nobody
    answers (a killed daemon) goes. The daemon binds the path that its environment's
    key names, which is ours: it is started with the variables the key is made of."""
    import fcntl
    where = os.path.dirname(path)
    marker = paths.starting_marker(path)
    with open(os.path.join(where, "conn.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        s = _connect(path)
        if s is not None:
            s.close()
            return
        try:
            with open(marker) as f:
                pid = int(f.read().strip() or 0)
            if pid and time.time() - os.stat(marker).st_mtime < STARTING_FOR and _starting(pid):
                return  # it is starting
        except (OSError, ValueError):
            pass
        try:
            os.unlink(path)  # stale: its daemon is gone
        except FileNotFoundError:
            pass
        proc = _spawn(path, warm)
        with open(marker, "w") as f:
            f.write(str(proc.pid))


def _starting(pid: int) -> bool:
    """Whether ``pid`` is a daemon on its way: alive, not a zombie (a daemon killed just now
    stays one until init reaps it, ~1 s here, and ``kill(pid, 0)`` still succeeds on it),
    and a gpujob daemon (not a process that took the pid over). The marker it was read
    from may outlive a fast daemon: the spawner writes it after the spawn, and the daemon
    removes it once bound."""
    if not os.path.isdir("/proc"):  # (a laptop without procfs: alive is all it can tell)
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b") ", 1)[1][:1]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except (OSError, IndexError):
        return False
    return state != b"Z" and b"gpujob.daemon\0serve" in cmd


class Fallback(Exception):
    """The daemon declined (or died before starting the work): run the full CLI."""


def request(req: dict, sock: socket.socket | None = None, on_going=None) -> int:
    """Send ``req`` to the daemon with our stdio; its exit code. Raises Fallback when
    the full CLI should run instead (nothing was done or printed). ``sock``: a handler
    of our own instead (gpujob/daemon/oneshot.py), ``on_going`` called once it goes ahead."""
    s: socket.socket | None = sock
    if s is None:
        try:
            s = connect(start=False)
        except (paths.NoDaemon, OSError):
            s = None
    if s is None:  # no daemon yet: this command runs itself (oneshot.py, else the full CLI)
        raise Fallback()
    req = dict(req, stamp=paths.code_stamp(), env=paths.env_view(), cwd=os.getcwd(),
               term={k: os.environ[k] for k in paths.TERM_KEYS if k in os.environ},
               encoding=[getattr(sys.stdout, "encoding", None) or "utf-8",
                         getattr(sys.stderr, "encoding", None) or "utf-8"])
    going = False
    interrupted = False
    old = signal.getsignal(signal.SIGINT)

    def on_sigint(signum, frame):
        nonlocal interrupted
        interrupted = True
        try:
            s.sendall(proto.pack(b"K"))
        except OSError:
            pass

    signal.signal(signal.SIGINT, on_sigint)
    try:
        try:
            socket.send_fds(s, [proto.pack_json(b"R", req)], [0, 1, 2])
        except OSError:
            raise Fallback() from None
        reader = proto.Reader(s)
        while True:
            try:
                got = reader.frame()
            except InterruptedError:
                continue
            except (OSError, ValueError):
                got = None
            if got is None:
                break
            kind, payload = got
            if kind == b"G":
                going = True
                if on_going is not None:
                    on_going()
            elif kind == b"F":
                raise Fallback()
            elif kind == b"x":
                import json
                return int(json.loads(payload)["code"])
    finally:
        signal.signal(signal.SIGINT, old)
        s.close()
    if interrupted:
        sys.stderr.write("\ninterrupted\n")
        return 130
    if not going:
        raise Fallback()  # it died before doing anything: do it ourselves
    sys.stderr.write("gpujob: the connection daemon ended while the command ran; it may or may not "
                     "have finished (exit code unknown)\n")
    return 3


def stop(path: str) -> bool:
    """Ask the daemon at ``path`` to end; True when one answered there. A socket that
    nobody answers is removed, under the spawners' lock."""
    try:
        s = _connect(path)
    except (paths.NoDaemon, OSError):
        return False
    if s is None:
        try:
            import fcntl
            with open(os.path.join(os.path.dirname(path), "conn.lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if _connect(path) is None:
                    os.unlink(path)
        except (OSError, paths.NoDaemon):
            pass
        return False
    with s:
        try:
            socket.send_fds(s, [proto.pack_json(b"R", {"op": "stop"})], [])
            proto.Reader(s).frame()
        except OSError:
            pass
    return True


def disconnect() -> bool:
    """Ask this environment's daemon to end; True when one was running. The daemons of
    other environments (another install, terminal, state dir) carry on."""
    try:
        path = paths.socket_path(create=False)
    except paths.NoDaemon:
        return False
    return stop(path)


def disconnect_all() -> int:
    """Ask every daemon of this user's runtime dir to end (each ``conn-*.sock``, and the
    ``conn.sock`` of a gpujob before per-environment keys); how many were running."""
    try:
        where = paths.runtime_dir(create=False)
        names = sorted(os.listdir(where))
    except (paths.NoDaemon, OSError):
        return 0
    return sum(stop(os.path.join(where, name)) for name in names
               if name == "conn.sock" or (name.startswith("conn-") and name.endswith(".sock")))


def disconnect_line(every: bool) -> str:
    """End this environment's daemon (``every``: all of this user's); what to say."""
    if not every:
        return ("gpujob: closed the kept connection (its SSH connections are closed)" if disconnect()
                else "gpujob: no kept connection was open")
    n = disconnect_all()
    if n == 0:
        return "gpujob: no kept connection was open"
    return (f"gpujob: closed {n} kept connection{'s' if n > 1 else ''} "
            f"({'their' if n > 1 else 'its'} SSH connections are closed)")
