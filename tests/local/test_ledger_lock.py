"""The ledger's store against a real lock holder: a writer that cannot get the lock in time
says so and writes nothing (the store's in-process checks: tests/unit/test_ledger_store.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpujob.agent.home.journal import Home
from gpujob.agent.home.ledger import Ledger
from gpujob.agent.home.ledgerfile import Busy
from test_ledger_store import ledger_at


def test_a_writer_that_cannot_get_the_lock_in_time_says_so_and_writes_nothing(tmp_path, monkeypatch):
    led = ledger_at(tmp_path)
    led.mark("fast", "good")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               "fd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
                               "print('held', flush=True)\ntime.sleep(60)",
                               str(tmp_path / "ledger" / "tjob.lock")],
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        monkeypatch.setenv("GPUJOB_LEDGER_WAIT", "0.3")
        with pytest.raises(Busy, match="another writer held its lock"):
            Ledger(Home(str(tmp_path)), "tjob").mark("slow", "bad")
    finally:
        holder.kill()
        holder.wait()
    assert [h["profile"] for h in led.history()] == ["fast"]
