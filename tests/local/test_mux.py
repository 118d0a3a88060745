"""The multiplexed exec channel, driven over a local pipe (the same server and
client that run over ssh → pct exec on the test bed)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from gpujob.errors import ConnectionLost
from gpujob.transport.local import LocalTransport
from gpujob.transport.mux import SERVER_SOURCE, MuxClient
from helpers import HANG, returns, wait_for


@pytest.fixture
def mux():
    client = MuxClient(LocalTransport().open_stream([sys.executable, "-c", SERVER_SOURCE]), "test")
    assert client.wait_ready(HANG)
    yield client
    client.close()


def test_argv_exit_codes_and_both_streams(mux):
    args = ["a b", "", "$(x)", "ü", "x" * 100_000]
    r = mux.run([sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:])); "
                                       "print('e', file=sys.stderr); sys.exit(7)", *args])
    import json
    assert (r.exit_code, json.loads(r.stdout), r.stderr) == (7, args, b"e\n")
    assert mux.run(["sh", "-c", "kill -TERM $$"]).exit_code == 128 + 15
    r = mux.run(["no-such-command"])
    assert r.exit_code == 127 and b"command not found" in r.stderr


def test_big_stdin_to_a_child_that_writes_as_it_reads_does_not_deadlock(mux):
    data = os.urandom(16 * 2**20)
    got = bytearray()  # streamed to a sink: a captured answer stops at MAX_ANSWER (8 MiB)
    r = mux.run(["cat"], stdin=data, timeout=60, on_stdout=got.extend)
    assert r.ok and got == data
    r = mux.run(["head", "-c", "5"], stdin=data, timeout=60)  # stops reading early
    assert r.ok and r.stdout == data[:5]


def test_output_streams_while_the_command_runs(mux, tmp_path):
    seen = []
    heard = tmp_path / "heard"

    def got(b: bytes) -> None:
        seen.append(b)
        if b"one" in b:
            heard.touch()
    # "two" is printed only once "one" has reached us: collected at exit instead, the
    # command would wait for the mark in vain (HANG) and print "late"
    mux.run(["sh", "-c", f"echo one; n=0; while [ ! -e {heard} ] && [ $n -lt {int(HANG * 20)} ]; "
                         f"do sleep 0.05; n=$((n+1)); done; [ -e {heard} ] && echo two || echo late"],
            timeout=3 * HANG, on_stdout=got)
    assert b"".join(seen) == b"one\ntwo\n" and len(seen) >= 2


def test_timeout_kills_the_group_and_output_closed_early_still_waits_for_exit(mux, tmp_path):
    marker = f"sleep {int(10 * HANG) + os.getpid() % 1000}"  # the background one holds the output open

    def running() -> bool:
        return marker in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout

    r = returns(lambda: mux.run(["sh", "-c", f"{marker} & {marker}"], timeout=0.5), "a timed-out command")
    assert r.timed_out and r.exit_code == 124
    assert wait_for(lambda: not running(), HANG, what="the timed-out group to be gone")
    exited = tmp_path / "exited"
    r = mux.run(["sh", "-c", f"exec >/dev/null 2>&1; sleep 0.5; touch {exited}; exit 4"])
    assert r.exit_code == 4 and exited.exists()  # its exit, not its output's end


def test_concurrent_commands_share_the_channel(mux):
    results = {}
    meet = tempfile.mkdtemp()

    def one(i):
        # each waits until all 8 have started: only commands that run at the same time finish
        script = (f"touch {meet}/{i}; n=0; while [ $(ls {meet} | wc -l) -lt 8 ] && [ $n -lt 300 ]; "
                  f"do sleep 0.05; n=$((n+1)); done; [ $(ls {meet} | wc -l) -eq 8 ] && echo {i}")
        results[i] = mux.run(["sh", "-c", script], timeout=60).stdout

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"{i}\n".encode() for i in range(8)}


def test_commands_sent_before_any_is_awaited_run_together_and_a_deadline_ends_one_there(mux):
    """``start`` sends and returns (``gpujob ps`` asks many channels from one thread this
    way): 8 commands that each wait for all 8 to have started finish; a ``result`` past its
    deadline is TimeoutError and the command is ended in the place; ``cancel`` ends one
    never awaited; the channel serves on."""
    meet = tempfile.mkdtemp()
    script = (f"touch {meet}/$0; n=0; while [ $(ls {meet} | wc -l) -lt 8 ] && [ $n -lt 300 ]; "
              f"do sleep 0.05; n=$((n+1)); done; [ $(ls {meet} | wc -l) -eq 8 ] && echo $0")
    sent = [mux.start(["sh", "-c", script, str(i)], timeout=60) for i in range(8)]
    assert [mux.result(p).stdout for p in sent] == [f"{i}\n".encode() for i in range(8)]
    marker = f"sleep {5000 + os.getpid() % 1000}"

    def running() -> bool:
        return marker in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout

    for how in ("deadline", "cancel"):
        p = mux.start(["sh", "-c", marker], timeout=60)
        wait_for(running, HANG, 0.02, "the command to run")
        if how == "deadline":
            with pytest.raises(TimeoutError):  # its deadline, not the command's 60 s timeout
                mux.result(p, until=time.monotonic() + 0.3)
        else:
            mux.cancel(p)
        wait_for(lambda: not running(), HANG, 0.05, f"the command ended by its {how} to be gone")
        assert p.cid not in mux._calls
    assert mux.run(["echo", "on"]).stdout == b"on\n"


def test_a_dead_channel_is_a_lost_connection_and_takes_its_children(mux):
    marker = f"sleep {4000 + os.getpid() % 1000}"
    started = threading.Event()

    def long_call():
        started.set()
        with pytest.raises(ConnectionLost):
            mux.run(["sh", "-c", marker])

    def running() -> bool:
        return marker in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout

    t = threading.Thread(target=long_call)
    t.start()
    started.wait()
    wait_for(running, HANG, 0.02, "the child to run")  # the child really runs before the link goes
    mux.stream.proc.stdin.close()  # the link goes, like a dropped connection
    t.join(HANG)
    assert not t.is_alive(), "hung: the call on the lost channel"
    with pytest.raises(ConnectionLost):
        mux.run(["true"])
    wait_for(lambda: not running(), HANG, 0.05, "the lost channel's child to be gone")


# ---- the versioned wire (docs/wire.md) ---------------------------------------------

def _client(script: str) -> MuxClient:
    return MuxClient(LocalTransport().open_stream([sys.executable, "-c", script]), "ct-test")


def test_stray_bytes_before_the_preamble_are_skipped():
    """A motd or an lxc-attach warning on pct exec's stdout comes before the server's preamble."""
    noisy = ("import sys; sys.stdout.buffer.write(b'Welcome to CT 200\\nlxc-attach: warning: "
             "H\\x00\\x00\\x00\\x01 '); "
             "sys.stdout.flush(); exec(compile(sys.argv[1], 'mux_server', 'exec'))")
    client = MuxClient(LocalTransport().open_stream([sys.executable, "-c", noisy, SERVER_SOURCE]), "ct-test")
    try:
        assert client.wait_ready(HANG)
        r = client.run(["sh", "-c", "echo ok"])
        assert r.ok and r.stdout == b"ok\n"
        assert client.stray.startswith(b"Welcome to CT 200\n")
    finally:
        client.close()


@pytest.mark.parametrize("after, expected", [
    (b"GJMX\x02", "speaks version 2, this gpujob speaks 1"),
    (b"x" * (70 << 10),
     "no gpujob exec-channel preamble in the first 65536 bytes from ct-test (it began b'xxx"),
    (b"GJMX\x01" + b"Z\x00\x00\x00\x01\x00\x00\x00\x00",
     "bad frame header on the exec channel from ct-test: expected a kind in H, o, e, x and a length <= "
     "2097152, got kind b'Z', length 0"),
    (b"GJMX\x01" + b"o\x00\x00\x00\x01\xff\xff\xff\xff", "got kind b'o', length 4294967295"),
])
def test_a_bad_preamble_or_header_is_one_clear_error_never_a_misread_frame(after, expected):
    script = (f"import sys, time; sys.stdout.buffer.write({after!r}); sys.stdout.flush(); "
              f"sys.stdin.buffer.read()")
    client = _client(script)
    try:
        assert not client.wait_ready(HANG)
        assert client.error and expected in client.error, client.error
        with pytest.raises(ConnectionLost, match="exec channel|speaks version"):
            client.run(["true"])
    finally:
        client.close()


def test_the_server_refuses_a_client_that_does_not_speak_its_wire():
    from gpujob.transport.mux import PREAMBLE
    p = subprocess.run([sys.executable, "-c", SERVER_SOURCE], input=b"O\x00\x00\x00\x01\x00\x00\x00\x02{}",
                       capture_output=True, timeout=HANG)
    assert p.stdout.startswith(PREAMBLE + b"H")  # the server's preamble, then its hello
    assert b"gpujob mux: expected the preamble b'GJMX\\x01' from the client, " \
        b"got b'O\\x00\\x00\\x00\\x01'" in p.stderr
    p = subprocess.run([sys.executable, "-c", SERVER_SOURCE],
                       input=PREAMBLE + b"Q\x00\x00\x00\x01\x00\x00\x00\x00", capture_output=True,
                       timeout=HANG)
    assert b"bad frame header from the client: expected a kind in O, I, E, K" in p.stderr
