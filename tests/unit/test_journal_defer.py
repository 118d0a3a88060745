"""Journal.set_state's three kinds of write (issue 25): durable (fsync of the file and
its directory), renamed only (``durable=False``: a process death keeps it), and
deferred (``durable=None``: only this writer sees it until its next write); ``sync``
makes whatever was not durable durable. Real files; fsync counted by wrapping os.fsync."""

from __future__ import annotations

import json
import os

import pytest

from gpujob.agent.home import journal as jn
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.home.lock import Fenced


@pytest.fixture
def fsyncs(monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(jn.os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    return calls


def on_disk(j: Journal) -> dict:
    return json.loads(open(j.path("state.json")).read())


def journal(tmp_path, generation=None) -> Journal:
    j = Journal(Home(str(tmp_path)), "j1", generation=generation)
    os.makedirs(j.dir)
    return j


def test_renamed_without_fsync_then_sync_makes_it_durable(tmp_path, fsyncs):
    j = journal(tmp_path)
    j.set_state(step="env")
    assert len(fsyncs) == 2 and not j.unsynced  # file and directory
    j.set_state(child=None, durable=False)
    assert len(fsyncs) == 2 and j.unsynced and on_disk(j)["child"] is None
    j.sync()
    assert len(fsyncs) == 4 and not j.unsynced
    j.sync()
    assert len(fsyncs) == 4  # nothing left to make durable


def test_deferred_changes_are_seen_by_their_writer_and_reach_the_disk_with_the_next_write(tmp_path, fsyncs):
    j = journal(tmp_path)
    j.set_state(step="env", profile="slow")
    j.set_state(step="rollback", durable=False)
    j.set_state(step="restore", profile="fast", durable=None)  # each step checked in order
    j.set_state(step="warmup", durable=None)
    assert j.state()["step"] == "warmup" and j.state()["profile"] == "fast"
    assert on_disk(j)["step"] == "rollback" and on_disk(j)["profile"] == "slow"  # a death here redoes them
    assert Journal(Home(str(tmp_path)), "j1").state()["step"] == "rollback"  # other readers: the file
    n = len(fsyncs)
    j.set_state(child_starting={"phase": "train"}, step="train")  # the spawn's durable write
    st = on_disk(j)
    assert (st["step"], st["profile"], st["child_starting"]) == ("train", "fast", {"phase": "train"})
    assert len(fsyncs) == n + 2 and not j.unsynced


def test_sync_writes_deferred_changes_durably(tmp_path, fsyncs):
    j = journal(tmp_path)
    j.set_state(step="env")
    j.set_state(cache_start={"kind": "warm"}, durable=None)
    n = len(fsyncs)
    j.sync()  # before an act (a cache restore, a standby's hand-over)
    assert on_disk(j)["cache_start"] == {"kind": "warm"} and len(fsyncs) == n + 2
    j.sync()
    assert len(fsyncs) == n + 2


def test_a_deferred_write_is_fenced_like_any_other(tmp_path):
    j = journal(tmp_path, generation=1)
    j.set_state(step="env")
    Journal(Home(str(tmp_path)), "j1", generation=2).set_state(step="env")
    with pytest.raises(Fenced):
        j.set_state(step="restore", durable=None)


def test_json_objects_passes_over_what_is_not_a_whole_object():
    from gpujob.agent.base.fsio import json_objects
    data = b'\0\0\0{"a": 1}\n\n{"b": 2}\n[1, 2]\n"text"\n{"torn": \n{"c": 3}'
    assert json_objects(data) == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert json_objects(b"") == []
