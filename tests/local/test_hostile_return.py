"""Issue 35 rows 8 and 9, faults on the way back: a fleet follower whose leader answers with
anything at all (deeply nested JSON, the wrong types, a signed-looking line that is not) keeps
trying, with backoff, and joins once a real leader answers; and ``--json``'s error line is the
same bytes through the kept connection's daemon as without it."""

from __future__ import annotations

import socket
import threading

import pytest

from gpujob.agent.fleet import channel

NESTED = b"[" * 50_000 + b"]" * 10 + b"\n"  # under MAX_LINE, far past the parser's stack
BAD_HELLOS = [
    NESTED,
    b'{"wire": "gpujob-fleet", "version": 1, "hello": ' + b"[" * 30_000 + b"\n",
    b'{"wire": "gpujob-fleet", "version": 1, "hello": ["not", "a", "nonce"]}\n',
    b'["gpujob-fleet"]\n',
    b"\xff\xfe not even utf-8\n",
    b'{"wire": "gpujob-fleet", "version": {"x": 1}, "hello": "' + b"a" * 32 + b'"}\n',
]


def test_a_follower_survives_any_hello_and_joins_the_real_leader_after():
    key = b"k" * 32
    real = channel.Server(key, 0, "job-1", bind="127.0.0.1")  # its _serve only: our listener in front
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    served = []

    def front() -> None:
        n = 0
        while True:
            try:
                c, _ = listener.accept()
            except OSError:
                return
            if n < len(BAD_HELLOS) * 2:  # every bad hello, and each again after a valid one
                bad = BAD_HELLOS[n % len(BAD_HELLOS)]
                if n >= len(BAD_HELLOS):  # a good hello, then a nested "message"
                    bad = (b'{"wire": "gpujob-fleet", "version": 1, "hello": "' + b"b" * 32 + b'"}\n'
                           + NESTED)
                try:
                    c.sendall(bad)
                except OSError:
                    pass
                c.close()
                n += 1
                continue
            served.append(n)
            threading.Thread(target=real._serve, args=(c,), daemon=True).start()

    threading.Thread(target=front, daemon=True).start()
    follower = channel.Client(key, "127.0.0.1", port, "job-1", 1, {"round": 0})
    try:
        follower.start()
        rank, join = real.inbox.get(timeout=120)
        assert (rank, join["kind"]) == (1, "join") and served
        assert real.send(1, {"kind": "go", "round": 0})
        got = []  # the notes of every connection before (connected, disconnected), then the go
        while {"kind": "go", "round": 0} not in got:
            got.append(follower.inbox.get(timeout=30))
            assert len(got) < 100, got
        assert follower.last_error is not None  # what the strangers said is kept, said in one line
    finally:
        follower.close()
        listener.close()
        real.close()


def test_read_hello_and_open_line_refuse_deep_nesting_as_refused():
    for line in BAD_HELLOS:
        with pytest.raises(channel.Refused):
            channel.read_hello(line)
    with pytest.raises(channel.Refused):
        channel.open_line(b"k" * 32, "n" * 32, 1, NESTED)


