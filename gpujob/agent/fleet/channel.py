"""The fleet channel between a multi-node job's supervisors (stdlib only).

JSON lines over TCP on the cluster network. The leader's first line is its hello
(``{"wire": "gpujob-fleet", "version": 1, "hello": NONCE}``) and the follower's
signed join carries its ``version`` too: another wire or version is refused in one
line (docs/wire.md). Every message is signed with the
job's secret key (HMAC-SHA256, ``secrets.json``: never argv, never a log) over
``nonce|seq|body``: the nonce is the *receiver's* for this connection (sent in
its hello), and ``seq`` counts 1, 2, 3... per direction, so a message recorded on
one connection is refused on any other, and a replay or a reorder within one is
refused too (the receiver drops the connection).

The leader (node 0's supervisor) listens (``Server``); each follower keeps one
connection to it (``Client``) and reconnects with backoff whenever it drops.
Both sides hand received bodies to their owner through a queue; the owner (the
supervisor's main thread) alone touches the journal.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import socket
import threading
import time

WIRE = "gpujob-fleet"  # the hello's magic (docs/wire.md)
VERSION = 1
MAX_LINE = 1 << 16
HEARTBEAT = 1.0
SILENCE = 10.0  # no line for this long on a connection (heartbeats included): it is dead (a half-open
                # TCP connection after a host lost power never closes by itself)


class Refused(Exception):
    """A message that fails its signature or sequence check."""


def canonical(body: dict) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def mac(key: bytes, nonce: str, seq: int, body: dict) -> str:
    return hmac.new(key, f"{nonce}|{seq}|{canonical(body)}".encode(), hashlib.sha256).hexdigest()


def seal(key: bytes, nonce: str, seq: int, body: dict) -> bytes:
    return (json.dumps({"seq": seq, "body": body, "mac": mac(key, nonce, seq, body)}) + "\n").encode()


def open_line(key: bytes, nonce: str, expect_seq: int, line: bytes) -> dict:
    """The body of one received line, or Refused (bad signature, replayed or out of order)."""
    try:
        msg = json.loads(line)
        seq, body, got = int(msg["seq"]), msg["body"], str(msg["mac"])
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nesting past the stack
        raise Refused("not a channel message") from None
    if not isinstance(body, dict) or not hmac.compare_digest(got, mac(key, nonce, seq, body)):
        raise Refused("bad signature")
    if seq != expect_seq:
        raise Refused(f"sequence {seq}, expected {expect_seq} (a replay or a lost message)")
    return body


class Conn:
    """One authenticated connection, after its hellos: ``send`` signs with the
    peer's nonce, ``recv`` checks with ours."""

    def __init__(self, sock: socket.socket, key: bytes, mine: str, theirs: str, rfile):
        self.sock, self.key, self.mine, self.theirs, self.rfile = sock, key, mine, theirs, rfile
        self.out_seq = self.in_seq = 0
        self.lock = threading.Lock()
        self.alive = True

    def send(self, body: dict) -> bool:
        with self.lock:
            if not self.alive:
                return False
            self.out_seq += 1
            try:
                self.sock.sendall(seal(self.key, self.theirs, self.out_seq, body))
                return True
            except OSError:
                self.close()
                return False

    def recv(self) -> dict | None:
        """The next body; None when the connection ended (or was refused: then it is closed)."""
        try:
            line = self.rfile.readline(MAX_LINE)
        except (OSError, ValueError):
            line = b""
        if not line:
            self.close()
            return None
        self.in_seq += 1
        return open_line(self.key, self.mine, self.in_seq, line)

    def close(self) -> None:
        self.alive = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def _hello(sock: socket.socket, nonce: str) -> None:
    sock.sendall((json.dumps({"wire": WIRE, "version": VERSION, "hello": nonce}) + "\n").encode())


def read_hello(line: bytes) -> str:
    """The leader's nonce from its hello line, or Refused naming what came instead."""
    try:
        msg = json.loads(line or b"{}")
    except (ValueError, RecursionError):
        raise Refused(f"expected a {WIRE} hello, got {line[:60]!r}") from None
    if not isinstance(msg, dict) or msg.get("wire") != WIRE:
        raise Refused(f"expected a {WIRE} hello, got {line[:60]!r}")
    if msg.get("version") != VERSION:
        raise Refused(f"the leader speaks {WIRE} version {msg.get('version')!r}, this node speaks {VERSION}")
    nonce = msg.get("hello")
    if not isinstance(nonce, str) or len(nonce) < 16:
        raise Refused("a hello without its nonce")
    return nonce


def _read_hello(rfile) -> str:
    return read_hello(rfile.readline(MAX_LINE))


class Server:
    """The leader's side: accepts followers; ``inbox`` gets (rank, body) and
    (rank, None) when a follower's connection ends."""

    def __init__(self, key: bytes, port: int, job_id: str, bind: str = ""):
        self.key, self.port, self.job_id, self.bind = key, port, job_id, bind
        self.inbox: queue.Queue = queue.Queue()
        self.conns: dict = {}
        self.lock = threading.Lock()
        self.error: str | None = None
        self.sock: socket.socket | None = None
        self.stopped = False

    def start(self) -> None:
        threading.Thread(target=self._listen, daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while not self.stopped:
            time.sleep(HEARTBEAT)
            self.broadcast({"kind": "hb"})

    def _listen(self) -> None:
        while not self.stopped and self.sock is None:  # a revived leader: the old socket may linger
            try:
                s = socket.socket(socket.AF_INET6 if ":" in self.bind else socket.AF_INET)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((self.bind, self.port))
                s.listen(64)
                self.sock, self.error = s, None
            except OSError as e:
                self.error = f"cannot listen on port {self.port}: {e.strerror or e}"
                time.sleep(1.0)
        sock = self.sock  # (None only when stopped before it listened)
        while not self.stopped and sock is not None:
            try:
                c, _addr = sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        c.settimeout(10.0)
        rfile = c.makefile("rb")
        mine = os.urandom(16).hex()
        rank = None
        try:
            _hello(c, mine)
            line = rfile.readline(MAX_LINE)
            join = open_line(self.key, mine, 1, line)
            if (join.get("kind") != "join" or join.get("job") != self.job_id
                    or not isinstance(join.get("rank"), int)):
                raise Refused("not a join of this job")
            rank = join["rank"]
            if join.get("version") != VERSION:
                raise Refused(f"the follower speaks {WIRE} version {join.get('version')!r}, the leader "
                              f"{VERSION}")
            conn = Conn(c, self.key, mine, str(join.get("nonce")), rfile)
            conn.in_seq = 1
            c.settimeout(SILENCE)  # a follower beats every second: silence means a dead link
            with self.lock:
                old = self.conns.get(rank)
                self.conns[rank] = conn
            if old is not None:
                old.close()
            self.inbox.put((rank, join))
            while True:
                body = conn.recv()
                if body is None:
                    break
                self.inbox.put((rank, body))
        except Exception as e:  # noqa: BLE001 - whatever a peer sends ends only its connection
            if rank is not None:
                self.inbox.put((rank, {"kind": "refused", "why": str(e)}))
        finally:
            try:
                c.close()
            except OSError:
                pass
            if rank is not None:
                with self.lock:
                    current = self.conns.get(rank)
                    if current is not None and current.sock is c:
                        del self.conns[rank]
                        self.inbox.put((rank, None))

    def send(self, rank: int, body: dict) -> bool:
        with self.lock:
            conn = self.conns.get(rank)
        return bool(conn and conn.send(body))

    def broadcast(self, body: dict) -> None:
        with self.lock:
            conns = list(self.conns.values())
        for conn in conns:
            conn.send(body)

    def connected(self) -> set:
        with self.lock:
            return {r for r, c in self.conns.items() if c.alive}

    def close(self) -> None:
        self.stopped = True
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        with self.lock:
            for conn in self.conns.values():
                conn.close()


class Client:
    """A follower's side: one connection to the leader, kept (reconnects with
    backoff), heartbeats every second. ``inbox`` gets the leader's bodies and
    ``{"kind": "connected"}`` / ``{"kind": "disconnected"}`` notes."""

    def __init__(self, key: bytes, host: str, port: int, job_id: str, rank: int, hello: dict):
        self.key, self.host, self.port, self.job_id, self.rank = key, host, port, job_id, rank
        self.hello = hello  # extra fields of each join (state, round): updated by the owner
        self.inbox: queue.Queue = queue.Queue()
        self.conn: Conn | None = None
        self.stopped = False
        self.last_error: str | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()

    def _connect(self) -> Conn:
        c = socket.create_connection((self.host, self.port), timeout=5.0)
        try:
            rfile = c.makefile("rb")
            theirs = _read_hello(rfile)
            mine = os.urandom(16).hex()
            conn = Conn(c, self.key, mine, theirs, rfile)
            conn.send(dict(self.hello, kind="join", job=self.job_id, rank=self.rank, nonce=mine,
                           version=VERSION))
            c.settimeout(SILENCE)  # the leader beats every second: silence means a dead link
            return conn
        except BaseException:
            c.close()
            raise

    def _run(self) -> None:
        backoff = 0.2
        while not self.stopped:
            try:
                conn = self._connect()
            except Exception as e:  # noqa: BLE001 - any answer (a glitch, a stranger) is retried
                self.last_error = f"{type(e).__name__}: {e}"[:300]
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            self.conn = conn
            self.inbox.put({"kind": "connected"})
            heard = False
            try:
                while True:
                    body = conn.recv()
                    if body is None:
                        break
                    heard = True
                    self.inbox.put(body)
            except Exception as e:  # noqa: BLE001 - the connection ends, the loop connects again
                self.last_error = f"{type(e).__name__}: {e}"[:300]
                conn.close()
            self.conn = None
            self.inbox.put({"kind": "disconnected"})
            if heard:  # a link that worked: at once again; one that said nothing good: backing off
                backoff = 0.2
            else:
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _beat(self) -> None:
        while not self.stopped:
            time.sleep(HEARTBEAT)
            self.send({"kind": "hb"})

    def send(self, body: dict) -> bool:
        conn = self.conn
        return bool(conn and conn.send(body))

    def close(self) -> None:
        self.stopped = True
        if self.conn is not None:
            self.conn.close()
