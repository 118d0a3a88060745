"""One POST to a webhook within a wall-clock deadline (stdlib only; the sender of
agent/supervisor/notify.py makes one call per attempt).

A socket timeout bounds each read, not the answer: a receiver that sends one byte every
2 s keeps a 5 s timeout waiting for ever. So each attempt has a watchdog (a timer) that
shuts the attempt's sockets down at its deadline: a read in progress ends at once, and
the attempt is a failure like any other. The connections are urllib's (its proxies from
the environment included), with their sockets recorded as they connect; a TLS handshake is
bounded as a whole by its socket's timeout, set to what is left of the attempt. A name lookup
(getaddrinfo) cannot be interrupted: that one stays bounded by the supervisor, which never
waits for its sender past the notify deadline (Notifier.close).

A redirect is never followed: urllib would resend the headers (the Bearer token) to
wherever the Location points, as a GET whose 2xx is not an answer to the POST. A 3xx is
a failed attempt."""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.error
import urllib.request


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Every 3xx comes back as an HTTPError: a failed attempt, retried."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class Attempt:
    """The sockets of one attempt; ``expire`` (the watchdog) shuts them down, and any
    connected after it."""

    def __init__(self, timeout: float):
        self.end = time.monotonic() + timeout
        self._lock = threading.Lock()
        self._socks: list = []
        self.expired = False

    def add(self, sock) -> None:
        with self._lock:
            self._socks.append(sock)
            if self.expired:
                _shut(sock)

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._socks:
                _shut(sock)


def _shut(sock) -> None:
    """Shut down the descriptor (not close: the reader thread owns the object); a read
    blocked on it returns at once. The plain socket's method, also for a TLS one: the
    TLS layer sees its transport end, from whichever thread."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except (OSError, ValueError):
        pass


def _classes(attempt: Attempt) -> tuple:
    """(HTTPConnection, HTTPSConnection) whose sockets ``attempt`` holds."""

    def create(*args, **kw):
        sock = socket.create_connection(*args, **kw)
        sock.settimeout(max(0.01, attempt.end - time.monotonic()))  # a TLS handshake: within what is left
        attempt.add(sock)
        return sock

    class Plain(http.client.HTTPConnection):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self._create_connection = create

    class Tls(http.client.HTTPSConnection):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self._create_connection = create

        def connect(self):  # the TLS socket (the plain one is detached by the wrap); the handshake
            super().connect()  # is bounded as a whole by the socket's timeout (CPython's _ssl)
            attempt.add(self.sock)

    return Plain, Tls


def _opener(attempt: Attempt):
    plain, tls = _classes(attempt)

    class HttpHandler(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(plain, req)

    class HttpsHandler(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(tls, req)  # the default context: certificates and host names verified

    return urllib.request.build_opener(_NoRedirect, HttpHandler, HttpsHandler)


def post(url: str, body: bytes, headers: dict, timeout: float) -> str | None:
    """One attempt, over within ``timeout`` seconds all told (connect, send, the answer's
    status line and headers); None when acknowledged (a 2xx to this POST itself, whatever
    then happens to its body), else why not (without the URL)."""
    attempt = Attempt(timeout)
    watchdog = threading.Timer(max(0.0, timeout), attempt.expire)
    watchdog.daemon = True
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        watchdog.start()
        with _opener(attempt).open(req, timeout=timeout) as resp:
            if attempt.expired:  # headers cut by the watchdog end early (an EOF ends them): no answer
                raise TimeoutError
            if 200 <= resp.status < 300:
                try:
                    resp.read(65536)  # the body is not needed: cut by the watchdog like the rest
                except Exception:  # noqa: BLE001 - acknowledged already
                    pass
                return None
            return f"HTTP {resp.status}"
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:
            return f"HTTP {e.code}: a redirect, not followed (a webhook URL must answer the POST itself)"
        return f"HTTP {e.code}"
    except Exception as e:  # noqa: BLE001 - any failure is one failed attempt, counted against retries
        timed_out = (socket.timeout, TimeoutError)  # one class from 3.10, two before
        if attempt.expired or isinstance(e, timed_out) or isinstance(getattr(e, "reason", None), timed_out):
            return (f"no complete answer within the attempt's {round(timeout, 1):g}s (the connection was "
                    f"closed)")
        if isinstance(e, urllib.error.URLError):
            r = e.reason
            return f"cannot reach the webhook: {type(r).__name__}: {getattr(r, 'strerror', None) or r}"
        if isinstance(e, (OSError, ValueError)):  # resets, a malformed URL
            return f"{type(e).__name__}: {getattr(e, 'strerror', None) or e}"
        # http.client.HTTPException (150 headers, a bad status line) and whatever else an answer causes
        return f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        watchdog.cancel()
