"""The far end of a multiplexed exec channel (stdlib only, Python >= 3.6).

``pct exec`` costs a process chain on the host per command (pct is a Perl
program on Proxmox; ~30-300 ms). gpujob instead starts this server once per
container and connection — ``pct exec VMID -- python3 -c <this file>`` — and
runs every later command as a child of it, framed over that one channel.

Each side first writes the preamble ``GJMX`` + a version byte (``MAGIC``,
``VERSION``); the client skips stray bytes before it (docs/wire.md). Then
frames are ``type (1 byte) | id (4) | length (4) | payload``. From the client:
``O`` open (JSON: argv, timeout, stdin), ``I`` stdin data, ``E`` stdin EOF,
``K`` kill. From the server: ``H`` hello, ``o`` stdout, ``e`` stderr, ``x`` exit
(JSON: code, timed_out). When the client goes away (EOF on our stdin) every
child's process group is killed and the server exits.
"""

import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import time

HEADER = struct.Struct("!cII")
MAGIC = b"GJMX"
VERSION = 1
PREAMBLE = MAGIC + bytes([VERSION])
CLIENT_KINDS = (b"O", b"I", b"E", b"K")
MAX_FRAME = 64 << 20
KILL_AFTER = 3.0
CHUNK = 1 << 20
F_SETPIPE_SZ = 1031  # Linux: a child's output pipe of 1 MiB means fewer, larger frames


class Zygote:
    """gpujob's agent, preloaded: ``[python3, …/agent-HASH.pyz, --home, H, CMD, …]`` (or the
    same behind ``-c LAUNCHER``, gpujob/agent/base/protocol.py) that this very interpreter would
    run is forked from this server with the agent's modules already imported (from the
    zip's bytecode), which saves a Python start and the agent's imports on every agent
    call. Only the short commands in COMMANDS are forked (a forked child shows the server's
    command line in ps, which nobody needs to read for them); one agent zip per server;
    anything else is exec'd as usual. A ``status`` that only reads (the agent's ``answer``
    says when) is not even forked: this process answers it with the loaded modules."""

    COMMANDS = ("status",)
    path = None  # the zip whose modules are loaded; "" after a failure: never again

    @staticmethod
    def zip_at(argv):
        """Where the zip is in argv: 1 (``python3 ZIP …``) or 3 (``python3 -c SRC ZIP …``)."""
        return 3 if len(argv) > 1 and argv[1] == "-c" else 1

    @classmethod
    def accepts(cls, argv):
        z = cls.zip_at(argv)
        if cls.path == "" or len(argv) < z + 4 or argv[z + 1] != "--home" or argv[z + 3] not in cls.COMMANDS \
                or not argv[z].endswith(".pyz") or not os.path.basename(argv[z]).startswith("agent-") or \
                not os.path.isfile(argv[z]):
            return False
        if cls.path is not None:
            return cls.path == argv[z]
        import shutil
        exe = argv[0] if os.sep in argv[0] else shutil.which(argv[0])
        if not exe or os.path.realpath(exe) != os.path.realpath(sys.executable):
            return False
        before = list(sys.path)
        try:
            import runpy  # noqa: F401  (what the child runs the zip with)
            sys.path[:] = [argv[z]] + [p for p in sys.path if p not in ("", argv[z])]
            import gpujob.agent.main as agent_main  # from the zip just put first on sys.path
            warm = getattr(agent_main, "warm", None)
            if warm is not None:  # built once here (the agent's argument parser), not in every child
                warm()
            cls.path = argv[z]
            return True
        except Exception:
            sys.path[:] = before
            for name in [m for m in sys.modules if m == "gpujob" or m.startswith("gpujob.")]:
                del sys.modules[name]
            cls.path = ""
            return False


    @classmethod
    def answer(cls, argv):
        """The agent's own answer, computed in this process without a fork (its ``answer``:
        a ``status`` that changes nothing): (code, stdout bytes, stderr bytes) as the forked
        child would have written them, or None: fork."""
        fn = getattr(sys.modules.get("gpujob.agent.main"), "answer", None)
        if fn is None:
            return None
        try:
            said = fn(list(argv[cls.zip_at(argv) + 1:]))
        except BaseException:  # it only reads: the forked way answers (and says what went wrong);
            return None        # a SystemExit in there must not end this server
        if said is None:
            return None
        code, out, err = said
        enc, errs = sys.stdout.encoding, sys.stdout.errors
        return code & 0xFF, out.encode(enc, errs), err.encode(enc, "backslashreplace")


class Forked:
    """A forked child that runs the agent zip, shaped like the Popen the rest expects."""

    def __init__(self, argv, want_stdin):
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        r_in, w_in = os.pipe() if want_stdin else (os.open(os.devnull, os.O_RDONLY), None)
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into the server's loop
            code = 1
            try:
                os.setsid()
                os.dup2(r_in, 0)
                os.dup2(w_out, 1)
                os.dup2(w_err, 2)
                os.closerange(3, 1 << 16)
                code = self._run(argv)
            finally:
                os._exit(code)
        for fd in (r_in, w_out, w_err):
            os.close(fd)
        self.stdin = os.fdopen(w_in, "wb", buffering=0) if w_in is not None else None
        self.stdout = os.fdopen(r_out, "rb", buffering=0)
        self.stderr = os.fdopen(r_err, "rb", buffering=0)
        self.returncode = None

    @staticmethod
    def _run(argv):
        import atexit
        import io
        import runpy
        import traceback
        enc, errs = sys.stdout.encoding, sys.stdout.errors
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), enc, errs)
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), enc, errs)
        sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), enc,
                                      "backslashreplace", line_buffering=True)
        code = 0
        try:
            if Zygote.zip_at(argv) == 3:  # python3 -c SRC ZIP …: SRC as -c runs it, with '' first on sys.path
                sys.argv = ["-c"] + list(argv[3:])
                sys.path[:] = [""] + [p for p in sys.path if p not in ("", argv[3])]
                exec(compile(argv[2], "<string>", "exec"),
                     {"__name__": "__main__", "__builtins__": __builtins__})
            else:
                sys.argv = list(argv[1:])
                runpy.run_path(argv[1], run_name="__main__")
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                sys.stderr.write("%s\n" % (e.code,))
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        return code & 0xFF

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self):
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


class Child:
    def __init__(self, cid, proc, timeout):
        self.id = cid
        self.proc = proc
        self.deadline = time.monotonic() + timeout if timeout else None
        self.killed_at = None
        self.timed_out = False
        self.open_pipes = 2  # stdout and stderr; at 0 we wait for the exit itself
        self.pending = bytearray()  # stdin not yet taken by the child
        self.eof = False  # the client has sent all of stdin


def send(kind, cid, payload=b""):
    out = sys.stdout.buffer
    out.write(HEADER.pack(kind, cid, len(payload)))
    if payload:
        out.write(payload)
    out.flush()


def kill_group(child, sig):
    try:
        os.killpg(child.proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def close_stdin(child):
    try:
        child.proc.stdin.close()
    except OSError:
        pass


def main():
    sel = selectors.DefaultSelector()
    stdin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
    os.set_blocking(stdin.fileno(), False)
    sel.register(stdin.fileno(), selectors.EVENT_READ, ("client", None))
    children = {}
    buf = bytearray()
    out = sys.stdout.buffer
    out.write(PREAMBLE)
    send(b"H", 0, json.dumps({"pid": os.getpid(), "version": VERSION}).encode())
    synced = False

    def start(cid, req):
        try:
            if hasattr(os, "waitstatus_to_exitcode") and Zygote.accepts(req["argv"]):
                said = None if req.get("stdin") else Zygote.answer(req["argv"])
                if said is not None:  # answered here: no child, no pipes
                    for kind, data in ((b"o", said[1]), (b"e", said[2])):
                        for at in range(0, len(data), CHUNK):
                            send(kind, cid, data[at:at + CHUNK])
                    send(b"x", cid, json.dumps({"code": said[0], "timed_out": False}).encode())
                    return
                proc = Forked(req["argv"], req.get("stdin"))
            else:
                proc = subprocess.Popen(req["argv"],
                                        stdin=subprocess.PIPE if req.get("stdin") else subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
        except OSError as e:
            code = 127 if isinstance(e, FileNotFoundError) else 126
            what = "command not found" if code == 127 else str(e.strerror or e)
            send(b"e", cid, ("%s: %s\n" % (req["argv"][0], what)).encode())
            send(b"x", cid, json.dumps({"code": code, "timed_out": False}).encode())
            return
        child = Child(cid, proc, req.get("timeout"))
        children[cid] = child
        for pipe, kind in ((proc.stdout, b"o"), (proc.stderr, b"e")):
            os.set_blocking(pipe.fileno(), False)
            try:
                import fcntl
                fcntl.fcntl(pipe.fileno(), F_SETPIPE_SZ, CHUNK)
            except (ImportError, OSError):
                pass
            sel.register(pipe.fileno(), selectors.EVENT_READ, (kind, child))
        if proc.stdin:
            os.set_blocking(proc.stdin.fileno(), False)

    def pump_stdin(child):
        """Give the child what stdin it will take now, never blocking: a child busy
        writing its stdout must not deadlock us (and so itself)."""
        stdin = child.proc.stdin
        if stdin is None or stdin.closed:
            child.pending.clear()
            return
        while child.pending:
            try:
                n = os.write(stdin.fileno(), child.pending[:CHUNK])
            except BlockingIOError:
                break
            except OSError:  # the child closed its stdin: drop the rest
                child.pending.clear()
                break
            del child.pending[:n]
        waiting = bool(child.pending)
        registered = stdin.fileno() in sel.get_map()
        if waiting and not registered:
            sel.register(stdin.fileno(), selectors.EVENT_WRITE, ("stdin", child))
        elif not waiting and registered:
            sel.unregister(stdin.fileno())
        if not waiting and child.eof:
            close_stdin(child)

    def finish(child):
        code = child.proc.wait()
        if child.timed_out:
            code = 124
        elif code < 0:
            code = 128 - code
        if child.proc.stdin:
            if not child.proc.stdin.closed and child.proc.stdin.fileno() in sel.get_map():
                sel.unregister(child.proc.stdin.fileno())
            close_stdin(child)
        send(b"x", child.id, json.dumps({"code": code, "timed_out": child.timed_out}).encode())
        children.pop(child.id, None)

    def handle(kind, cid, payload):
        child = children.get(cid)
        if kind == b"O":
            start(cid, json.loads(payload.decode()))
        elif child is None:
            return
        elif kind == b"I":
            child.pending += payload
            pump_stdin(child)
        elif kind == b"E":
            child.eof = True
            pump_stdin(child)
        elif kind == b"K":
            kill_group(child, signal.SIGKILL)

    while True:
        now = time.monotonic()
        waits = [1.0]
        for child in list(children.values()):
            if child.open_pipes == 0 and child.proc.poll() is not None:
                finish(child)
                continue
            if child.open_pipes == 0:
                waits.append(0.02)  # output closed, process still running: look again soon
            if child.deadline and not child.timed_out and now >= child.deadline:
                child.timed_out = True
                child.killed_at = now
                kill_group(child, signal.SIGTERM)
            elif child.timed_out and child.killed_at and now - child.killed_at >= KILL_AFTER:
                kill_group(child, signal.SIGKILL)
                child.killed_at = None
            if child.deadline and not child.timed_out:
                waits.append(child.deadline - now)
            elif child.killed_at:
                waits.append(child.killed_at + KILL_AFTER - now)
        for key, _ in sel.select(max(0.0, min(waits))):
            kind, child = key.data
            if kind == "stdin":
                pump_stdin(child)
                continue
            try:
                data = os.read(key.fd, CHUNK)
            except BlockingIOError:
                continue
            if kind == "client":
                if not data:  # the client is gone: take every child with us
                    for c in children.values():
                        kill_group(c, signal.SIGKILL)
                    return
                buf += data
                if not synced:  # the client's preamble: gpujob's mux, our version
                    if len(buf) < len(PREAMBLE):
                        continue
                    if bytes(buf[:len(PREAMBLE)]) != PREAMBLE:
                        sys.stderr.write("gpujob mux: expected the preamble %r from the client, got %r\n"
                                         % (PREAMBLE, bytes(buf[:len(PREAMBLE)])))
                        return
                    del buf[:len(PREAMBLE)]
                    synced = True
                while len(buf) >= HEADER.size:
                    t, cid, n = HEADER.unpack_from(buf)
                    if t not in CLIENT_KINDS or n > MAX_FRAME:
                        sys.stderr.write("gpujob mux: bad frame header from the client: expected a kind in "
                                         "O, I, E, K and a length <= %d, got kind %r, length %d\n"
                                         % (MAX_FRAME, t, n))
                        for c in children.values():
                            kill_group(c, signal.SIGKILL)
                        return
                    if len(buf) < HEADER.size + n:
                        break
                    payload = bytes(buf[HEADER.size:HEADER.size + n])
                    del buf[:HEADER.size + n]
                    handle(t, cid, payload)
                continue
            if data:
                send(kind, child.id, data)
                continue
            sel.unregister(key.fd)
            child.open_pipes -= 1
            if child.open_pipes == 0 and child.proc.poll() is not None:
                finish(child)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        pass
