"""`submit --resume-from JOB` for a trainer that resumes from a fixed place copies JOB's
checkpoint into this job's place (agent/home/ckcopy.py). nanoGPT rewrites its one ckpt.pt
in place: when JOB still runs, a save can land during the copy. Such a copy is thrown away
before it reaches the place, and made again; a source that never holds still is refused
with nothing put in place."""

from __future__ import annotations

import os
import shutil

import pytest

from gpujob.agent.home import ckcopy


def rewriting(monkeypatch, src, times: int):
    """shutil.copy2 as ckcopy calls it, with the job saving into ``src`` during the first
    ``times`` copies."""
    real = shutil.copy2
    calls = {"n": 0}

    def copy2(a, b, **kw):
        out = real(a, b, **kw)
        calls["n"] += 1
        if calls["n"] <= times:
            with open(src, "ab") as f:  # a save lands while the copy is made
                f.write(b"+")
            os.utime(src, ns=(0, os.stat(src).st_mtime_ns + 1_000_000))
        return out
    monkeypatch.setattr(ckcopy.shutil, "copy2", copy2)
    return calls


def test_a_copy_the_source_changed_under_is_made_again(tmp_path, monkeypatch):
    src = tmp_path / "a" / "ckpt.pt"
    src.parent.mkdir()
    src.write_bytes(b"step 20")
    work = tmp_path / "w"
    dest = work / "out" / "c" / "ckpt.pt"
    calls = rewriting(monkeypatch, src, 1)
    assert ckcopy.copy_steady(str(src), str(dest), str(work), wait=0) == 2
    assert calls["n"] == 2
    assert dest.read_bytes() == src.read_bytes() == b"step 20+"
    assert os.listdir(dest.parent) == ["ckpt.pt"]  # no temp copy left beside it


def test_a_source_that_never_holds_still_is_refused_and_nothing_is_put_in_place(tmp_path, monkeypatch):
    src = tmp_path / "ckpt.pt"
    src.write_bytes(b"step 20")
    work = tmp_path / "w"
    dest = work / "out" / "ckpt.pt"
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"what was there")
    rewriting(monkeypatch, src, 99)
    with pytest.raises(ValueError, match="changed while it was copied, 3 times"):
        ckcopy.copy_steady(str(src), str(dest), str(work), wait=0)
    assert dest.read_bytes() == b"what was there"
    assert os.listdir(dest.parent) == ["ckpt.pt"]


def test_a_directorys_signature_sees_a_file_deep_inside_change(tmp_path):
    d = tmp_path / "step-20"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "shard").write_bytes(b"x")
    before = ckcopy.signature(str(d))
    (d / "sub" / "shard").write_bytes(b"xy")
    assert ckcopy.signature(str(d)) != before
    (d / "new").write_bytes(b"")
    assert len(ckcopy.signature(str(d))) == 2
