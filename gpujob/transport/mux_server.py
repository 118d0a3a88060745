"""The far end of a multiplexed exec channel (stdlib only, Python >= 3.6).

``pct exec`` costs a process chain on the host per command (pct is a Perl
program on Proxmox; ~30-300 ms). gpujob instead starts this server once per
container and connection — ``pct exec VMID -- python3 -c <this file>`` — and
runs every later command as a child of it, framed over that one channel.

Frames are ``type (1 byte) | id (4) | length (4) | payload``. From the client:
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
KILL_AFTER = 3.0
CHUNK = 1 << 20
F_SETPIPE_SZ = 1031  # Linux: a child's output pipe of 1 MiB means fewer, larger frames


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
    send(b"H", 0, json.dumps({"pid": os.getpid()}).encode())

    def start(cid, req):
        try:
            proc = subprocess.Popen(req["argv"], stdin=subprocess.PIPE if req.get("stdin") else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
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
                while len(buf) >= HEADER.size:
                    t, cid, n = HEADER.unpack_from(buf)
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
