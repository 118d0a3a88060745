"""Run argv on this machine: the ``local`` kind, and the Proxmox host itself when
gpujob runs there (``pct`` wrapping a LocalTransport)."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from typing import IO, Any, Sequence

from gpujob.transport.base import (KILL_AFTER, TIMEOUT_EXIT, OnData, Result, Stdin, Transport,
                                   iter_chunks, keep)

#: the longest a command's read loop waits without looking up (see LocalTransport.run)
WAKE = 0.5


def _feed(pipe, stdin: Stdin) -> None:
    try:
        for chunk in iter_chunks(stdin):
            pipe.write(chunk)
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the command's process group, SIGKILL it after KILL_AFTER seconds."""
    for sig, wait in ((signal.SIGTERM, KILL_AFTER), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            # the leader is gone; make sure nothing of its group survives it
            os.killpg(proc.pid, signal.SIGKILL)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            continue
        return


class LocalTransport(Transport):
    def __init__(self, env: dict[str, str] | None = None, cwd: str | None = None):
        self.env = env
        self.cwd = cwd

    def describe(self) -> str:
        return "this machine"

    def run(self, argv: Sequence[str], *, stdin: Stdin = None, timeout: float | None = None,
            on_stdout: OnData | None = None, on_stderr: OnData | None = None) -> Result:
        argv = list(argv)
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                env=self.env, cwd=self.cwd)
        except (FileNotFoundError, PermissionError) as e:
            code, what = (127, "command not found") if isinstance(e, FileNotFoundError) else \
                (126, "permission denied")
            msg = f"{argv[0]}: {what}\n".encode()
            if on_stderr is not None:
                on_stderr(msg)
                msg = b""
            return Result(argv, code, b"", msg)
        feeder = None
        if stdin is not None:
            feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True)
            feeder.start()
        out, err = bytearray(), bytearray()
        assert proc.stdout is not None and proc.stderr is not None  # both are pipes
        sinks: dict[Any, tuple[OnData | None, bytearray]] = {proc.stdout: (on_stdout, out),
                                                             proc.stderr: (on_stderr, err)}
        sel = selectors.DefaultSelector()
        for f in sinks:
            os.set_blocking(f.fileno(), False)
            sel.register(f, selectors.EVENT_READ)
        deadline = None if timeout is None else started + timeout
        timed_out = False
        try:
            while sel.get_map():
                # never an unbounded wait: in the connection daemon this runs on a worker thread,
                # and the client's Ctrl-C reaches it as an exception raised between bytecodes
                # (proto.interrupt_thread), which a select() blocked until the command's next
                # output (or its end) would hold back: `exec -- sleep 60` ran its 60 s
                wait = WAKE if deadline is None else min(WAKE, max(0.0, deadline - time.monotonic()))
                events = sel.select(wait)
                if not events and deadline is not None and time.monotonic() >= deadline:
                    timed_out = True
                    _kill_group(proc)
                    deadline = None  # drain what is left, then stop
                    continue
                for key, _ in events:
                    chunk = (key.fileobj.read1(65536) if hasattr(key.fileobj, "read1")
                             else os.read(key.fd, 65536))
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    cb, buf = sinks[key.fileobj]
                    if cb is not None:
                        cb(chunk)
                    else:
                        keep(buf, chunk, self.describe(), argv)
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            sel.close()
        code = proc.wait()
        if feeder is not None:
            feeder.join(1)
        if timed_out:
            code = TIMEOUT_EXIT
        elif code < 0:
            code = 128 - code  # killed by a signal: the shell's 128+N convention
        return Result(argv, code, bytes(out), bytes(err), timed_out, time.monotonic() - started)

    def open_stream(self, argv: Sequence[str]) -> "LocalStream":
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, env=self.env, cwd=self.cwd)
        return LocalStream(proc)


class LocalStream:
    """A child process as a byte stream (``pct`` run on the Proxmox host itself)."""

    def __init__(self, proc: subprocess.Popen):
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None  # pipes
        self.proc = proc
        self._in: IO[bytes] = proc.stdin
        self._out: IO[bytes] = proc.stdout
        self._err: IO[bytes] = proc.stderr

    def send(self, data: bytes) -> None:
        try:
            self._in.write(data)
            self._in.flush()
        except ValueError as e:  # written after close()
            raise OSError(str(e)) from None

    def recv(self, n: int) -> bytes:
        return os.read(self._out.fileno(), n)

    def stderr(self) -> bytes:
        os.set_blocking(self._err.fileno(), False)
        try:
            return self._err.read(64 << 10) or b""
        except (BlockingIOError, OSError):
            return b""

    def close(self) -> None:
        for f in (self._in, self._out, self._err):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)
