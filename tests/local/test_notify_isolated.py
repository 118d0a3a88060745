"""Webhooks isolated from each other and bounded in time (issue 35 rows 6 and 7;
agent/supervisor/notify.py, agent/supervisor/webhook.py), against real HTTP(S) endpoints on
loopback threads: one that answers a byte at a time (a per-read timeout never fires), one
whose answer has 150 headers (http.client.HTTPException), a healthy one. The healthy one
gets every message while the slow one is stalled; every failure counts against
``retries``, an attempt cut by the sender's death too; a full queue drops its oldest and
says so; a TLS attempt is verified and cut like a plain one. Real jobs and the spec's
deadline: tests/local/test_notify_deadline.py. No duration is asserted: messages and attempts
are counted, waits are bounded generously."""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.supervisor import notify
from helpers import wait_for
from test_notify import HookServer

REPO = Path(__file__).resolve().parents[2]


class RawHook:
    """A webhook on a loopback socket that answers as ``mode`` says: ``drip`` (a status
    line, then one header byte every ``every`` seconds, never done), ``headers150`` (a 200
    with 150 headers), ``hold`` (reads the request, answers nothing until released), ``ok``
    (a 200), ``tlsdrip`` (a TLS record header announcing 16000 bytes, then one byte every
    ``every`` seconds: a handshake that never ends). ``tls``: a server context, the
    connection wrapped first. Counts connections (each an attempt) and those still open."""

    def __init__(self, mode: str, every: float = 0.5, tls=None):
        self.mode, self.every, self.tls = mode, every, tls
        self.attempts = 0
        self.open = 0
        self.held = threading.Event()  # hold: a request is being held
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.conns: list = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.attempts += 1
                self.open += 1
                self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            c.settimeout(30)
            if self.tls is not None:
                c = self.tls.wrap_socket(c, server_side=True)
            if self.mode != "tlsdrip":
                read_request(c)
            else:
                c.recv(65536)  # the ClientHello
            if self.mode == "ok":
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            elif self.mode == "tlsdrip":
                c.sendall(b"\x16\x03\x03\x3e\x80")
                while not self.stop.wait(self.every):
                    c.sendall(b"\x00")
            elif self.mode == "headers150":
                c.sendall(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(150))
                          + b"Content-Length: 0\r\n\r\n")
            elif self.mode == "hold":
                self.held.set()
                while not self.stop.wait(0.1):
                    if select.select([c], [], [], 0)[0] and c.recv(1, socket.MSG_PEEK) == b"":
                        break  # the client is gone
            else:
                c.sendall(b"HTTP/1.1 200 OK\r\nX-Drip: ")
                while not self.stop.wait(self.every):
                    c.sendall(b"a")
        except OSError:  # the client went away: its attempt was cut (or the sender died)
            pass
        finally:
            with self.lock:
                self.open -= 1
            c.close()

    def counts(self) -> tuple:  # (connections, of which still open)
        with self.lock:
            return self.attempts, self.open

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def read_request(c: socket.socket) -> None:
    """Read a whole request (headers, then Content-Length bytes): unread bytes at close
    would answer the client with a reset that can discard the answer."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = c.recv(65536)
        if not chunk:
            return
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next((int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n")[1:])
                   if k.strip().lower() == b"content-length"), 0)
    while len(body) < length:
        chunk = c.recv(65536)
        if not chunk:
            return
        body += chunk


@pytest.fixture
def servers():
    made: list = []

    def make(kind: str, **kw):
        s = HookServer() if kind == "healthy" else RawHook(kind, **kw)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


def journal(root: Path, job_id: str = "ni-1") -> Journal:
    (root / "jobs" / job_id).mkdir(parents=True, exist_ok=True)
    (root / "jobs" / job_id / "state.json").write_text('{"state": "failed"}')
    return Journal(Home(str(root)), job_id)


def outbox(j: Journal) -> dict:
    """{message id: its record} of the job's outbox, waiting or done."""
    d = Path(j.path("notify"))
    return {json.loads(p.read_text())["message"]["id"]: json.loads(p.read_text())
            for p in d.iterdir() if p.suffix in (".json", ".done")}


# ---- row 6: one slow webhook delays no other ---------------------------------------

def test_a_healthy_webhook_gets_every_message_while_a_slow_drip_one_is_stalled(tmp_path, servers):
    drip, ok = servers("drip"), servers("healthy")
    j = journal(tmp_path)
    # first: the old sender's order
    hooks = [{"url": drip.url, "timeout": 1.0, "retries": 1, "deadline": 120.0},
             {"url": f"{ok.url}/ok"}]
    n = notify.Notifier(j, {"spec": {"name": "ni", "notify": hooks}}, j.path("secrets.json"))
    n.start()
    ids = [n.emit(kind, "k") for kind in ("rollback", "known_good", "success")]
    try:
        wait_for(lambda: len(ok.ids("/ok")) == 3, 60, what="the healthy webhook to take all three")
        assert drip.counts()[0] >= 1  # the slow one was being tried meanwhile
        assert sorted(ok.ids("/ok")) == sorted(ids)
        # the slow one: each attempt cut at its timeout, each message given up after retries + 1 attempts
        wait_for(lambda: not notify.waiting(j.dir), 120, what="the slow webhook's messages to be given up")
        recs = outbox(j)
        assert {i: (r["acked"], r["failed"], r["attempts"]) for i, r in recs.items()} == \
            {i: ([1], [0], {"0": 2, "1": 1}) for i in ids}
        assert drip.counts()[0] == 6
        errors = [e for e in j.events()[0] if e["type"] == "notify_error"]
        assert {i: [(e["webhook"], e["attempt"], e["gave_up"]) for e in errors if e["id"] == i]
                for i in ids} == {i: [(0, 1, False), (0, 2, True)] for i in ids}
        assert all("no complete answer within the attempt's 1s" in e["error"] for e in errors)
    finally:
        n.close(limit=0)


def test_a_full_queue_drops_its_oldest_message_and_counts_what_it_dropped(tmp_path, servers, monkeypatch):
    monkeypatch.setattr(notify, "QUEUE_CAP", 3, raising=False)
    drip, ok = servers("drip"), servers("healthy")
    j = journal(tmp_path)
    hooks = [{"url": drip.url, "retries": 0, "timeout": 60.0, "deadline": 120.0}, {"url": f"{ok.url}/ok"}]
    n = notify.Notifier(j, {"spec": {"name": "ni", "notify": hooks}}, j.path("secrets.json"))
    n.start()
    ids = [n.emit("internal_error", "0", reason="boom 0")]
    try:
        wait_for(lambda: drip.counts()[1] == 1, 30, what="the first message in flight on the slow webhook")
        for k in range(1, 7):  # one at a time: the healthy webhook's queue never fills
            ids.append(n.emit("internal_error", str(k), reason=f"boom {k}"))
            wait_for(lambda: len(ok.ids("/ok")) == k + 1, 30, what=f"the healthy webhook to take message {k}")
        assert sorted(ok.ids("/ok")) == sorted(ids)
        # the slow one's queue holds 3, the one in flight among them: the oldest waiting ones dropped
        dropped = [e for e in j.events()[0] if e["type"] == "notify_dropped"]
        assert [(e["id"], e["webhook"], e["dropped"]) for e in dropped] == \
            [(ids[1], 0, 1), (ids[2], 0, 2), (ids[3], 0, 3), (ids[4], 0, 4)]
        recs = outbox(j)
        assert [recs[i]["pending"] for i in ids] == [[0], [], [], [], [], [0], [0]]
        assert [recs[i].get("dropped") for i in ids] == [None, [0], [0], [0], [0], None, None]
        summary = notify.outbox_summary(j.dir)
        assert summary["dropped"] == 4 and summary["waiting"] == 3
        assert drip.counts()[0] == 1
    finally:
        n.close(limit=0)


# ---- row 7: every failure counts against retries ------------------------------------

SENDER = """
import json, sys
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.supervisor.notify import Notifier
root, hooks = sys.argv[1], json.loads(sys.argv[2])
j = Journal(Home(root), "ni-1")
n = Notifier(j, {"spec": {"name": "ni", "notify": hooks}}, j.path("secrets.json"))
n.emit("failure", "end", reason="boom")  # the same message when run again: kept once
n.start()
n.close(limit=60)
"""


def test_a_150_header_answer_gives_up_after_retries_and_an_attempt_cut_by_a_death_counts(tmp_path, servers):
    bad, ok = servers("hold"), servers("healthy")
    j = journal(tmp_path)
    hooks = json.dumps([{"url": f"{ok.url}/ok"},
                        {"url": bad.url, "retries": 1, "timeout": 30.0, "deadline": 120.0}])
    argv = [sys.executable, "-c", SENDER, str(tmp_path), hooks]
    first = subprocess.Popen(argv, cwd=str(REPO))
    try:
        assert bad.held.wait(60), "the first attempt never came"
        wait_for(lambda: outbox(j).get("ni-1.failure.end", {}).get("acked") == [0], 30,
                 what="the healthy webhook's acknowledgement, written down")
        first.send_signal(signal.SIGKILL)  # the sender dies while its first attempt waits for an answer
        assert first.wait(30) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert notify.waiting(j.dir)
    bad.mode = "headers150"  # the next answers: 150 headers (http.client.HTTPException)
    second = subprocess.run(argv, cwd=str(REPO), timeout=120)
    assert second.returncode == 0
    # attempt 1 cut by the death, attempt 2 the 150 headers: retries 1 means given up, never a 3rd
    assert bad.counts()[0] == 2
    rec = outbox(j)["ni-1.failure.end"]
    assert (rec["acked"], rec["failed"], rec["pending"], rec["attempts"]) == ([0], [1], [], {"0": 1, "1": 2})
    errors = [e for e in j.events()[0] if e["type"] == "notify_error"]
    assert [(e["webhook"], e["attempt"], e["gave_up"]) for e in errors] == [(1, 2, True)]
    assert "HTTPException" in errors[0]["error"] or "headers" in errors[0]["error"]
    assert ok.ids("/ok") == ["ni-1.failure.end"]  # acknowledged once, never again
    assert not notify.waiting(j.dir)


# ---- one attempt over TLS: verified, acknowledged, cut at its timeout ----------------

def bounded_post(url: str, timeout: float) -> str | None:
    """notify.post in a thread, waited for generously: a post that never returns fails the
    test instead of hanging it."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(notify.post(url, b"{}", {"X-Gpujob-Event-Id": "x"},
                                                               timeout)),
                         daemon=True)
    t.start()
    t.join(120)
    assert out, "the attempt never ended"
    return out[0]


def test_a_tls_webhook_is_verified_acknowledged_and_cut_at_its_timeout_even_mid_handshake(tmp_path, servers,
                                                                                          monkeypatch):
    import ssl
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))

    def https(hook: RawHook) -> str:
        return hook.url.replace("http://", "https://")
    ok, drip = servers("ok", tls=ctx), servers("drip", tls=ctx)
    # a certificate nobody vouches for: refused, the request never sent
    why = bounded_post(https(ok), 5)
    assert why is not None and "CERTIFICATE_VERIFY_FAILED" in why, why
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # now it is trusted (OpenSSL reads this at each context)
    assert bounded_post(https(ok), 5) is None
    assert (bounded_post(https(drip), 1) == "no complete answer within the attempt's 1s (the connection was "
                                            "closed)")
    # a handshake that drips (each byte within the socket timeout): cut by the watchdog too
    handshake = servers("tlsdrip")
    assert bounded_post(https(handshake), 1) == \
        "no complete answer within the attempt's 1s (the connection was closed)"
    assert (ok.counts()[0], drip.counts()[0], handshake.counts()[0]) == (2, 1, 1)
    wait_for(lambda: drip.counts()[1] == handshake.counts()[1] == 0, 30, what="the cut connections to close")
