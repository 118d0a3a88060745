"""A trial's start point (gpujob/agent/home/ckcopy.py): a copy of the job's checkpoint in the
trial's own workdir, at the place it had in the job's; an earlier copy is replaced, and a link
planted where the copy goes is removed as a link, never written through."""

from __future__ import annotations

import json
import os

from gpujob.agent.home.ckcopy import copy_start, place


def job(home, job_id="bis-abcd", workdir=None):
    d = home / "jobs" / job_id
    d.mkdir(parents=True)
    spec = {"name": "bis", **({"workdir": str(workdir)} if workdir else {})}
    (d / "job.json").write_text(json.dumps({"spec": spec}))
    wd = workdir or home / "work" / "bis"
    (wd / "ckpt" / "checkpoint-30").mkdir(parents=True)
    (wd / "ckpt" / "checkpoint-30" / "model.bin").write_bytes(b"w" * 100)
    (wd / "ckpt" / "state.json").write_text('{"step": 30}')
    return wd


def test_a_file_and_a_directory_land_at_their_place_in_the_trials_workdir(tmp_path):
    wd = job(tmp_path)
    trial = tmp_path / "work" / "bis-bisect"
    got = copy_start({"path": str(wd / "ckpt" / "state.json"), "job": "bis-abcd", "step": 30}, str(tmp_path),
                     str(trial))
    assert got == {"path": str(trial / "ckpt" / "state.json"), "job": "bis-abcd", "step": 30,
                   "copied_from": str(wd / "ckpt" / "state.json")}
    assert (trial / "ckpt" / "state.json").read_text() == '{"step": 30}'
    got = copy_start({"path": str(wd / "ckpt" / "checkpoint-30"), "job": "bis-abcd"}, str(tmp_path),
                     str(trial))
    assert (trial / "ckpt" / "checkpoint-30" / "model.bin").read_bytes() == b"w" * 100
    assert not [n for n in os.listdir(trial / "ckpt") if "gpujob-copy" in n]  # no temp left


def test_an_earlier_trials_copy_is_replaced_and_a_planted_link_is_not_followed(tmp_path):
    wd = job(tmp_path)
    trial = tmp_path / "work" / "bis-bisect"
    (trial / "ckpt").mkdir(parents=True)
    (trial / "ckpt" / "state.json").symlink_to(wd / "ckpt" / "state.json")  # planted: the job's own file
    copy_start({"path": str(wd / "ckpt" / "state.json"), "job": "bis-abcd"}, str(tmp_path), str(trial))
    assert not (trial / "ckpt" / "state.json").is_symlink()
    (trial / "ckpt" / "state.json").write_text('{"step": 99}')  # the trial trains on
    assert (wd / "ckpt" / "state.json").read_text() == '{"step": 30}'  # the job's: untouched
    copy_start({"path": str(wd / "ckpt" / "state.json"), "job": "bis-abcd"}, str(tmp_path), str(trial))
    assert (trial / "ckpt" / "state.json").read_text() == '{"step": 30}'  # the next trial: the same start


def test_a_checkpoint_outside_the_jobs_workdir_goes_under_gpujob_start(tmp_path):
    elsewhere = tmp_path / "data" / "ck.pt"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"x")
    assert place(str(elsewhere), str(tmp_path / "work" / "bis"), "/w/t") == "/w/t/.gpujob-start/ck.pt"
    assert place(str(elsewhere), None, "/w/t") == "/w/t/.gpujob-start/ck.pt"
    assert place(str(tmp_path / "work" / "bis" / "a" / "b"), str(tmp_path / "work" / "bis"),
                 "/w/t") == "/w/t/a/b"


def test_a_linked_folder_on_the_way_is_refused(tmp_path):
    import pytest
    wd = job(tmp_path)
    trial = tmp_path / "work" / "bis-bisect"
    trial.mkdir(parents=True)
    (trial / "ckpt").symlink_to(wd / "ckpt")  # the trial's ckpt/ would be the job's
    with pytest.raises(ValueError, match="is a link"):
        copy_start({"path": str(wd / "ckpt" / "state.json"), "job": "bis-abcd"}, str(tmp_path), str(trial))
    assert (wd / "ckpt" / "state.json").read_text() == '{"step": 30}'


def test_a_trial_of_a_fixed_place_trainer_gets_one_copy_straight_into_its_own_place(tmp_path):
    # nanoGPT's recipe: out/{job_id}/ckpt.pt, loaded by --init_from=resume: the trial's start is
    # copied once, into the trial's own out/<trial id>/ckpt.pt (before: into out/<job id>/ckpt.pt of
    # the trial's workdir at submit, then again by the supervisor into its place)
    from gpujob.agent.home.ckregister import at_submit
    home = tmp_path / "home"
    src_wd = home / "work" / "nano"
    (src_wd / "out" / "nano-aaaa").mkdir(parents=True)
    src = src_wd / "out" / "nano-aaaa" / "ckpt.pt"
    src.write_bytes(b"w" * 64)
    trial_wd = home / "work" / "nano-trial"
    trial_wd.mkdir(parents=True)
    place_of = str(trial_wd / "out" / "nano-tttt" / "ckpt.pt")
    job = {"job_id": "nano-tttt", "resume_from_ask": str(src), "resume_from_copy": True,
           "spec": {"train": {"resume_args": ["--init_from=resume"],
                              "checkpoint": {"path": "out/{job_id}/ckpt.pt"}}}}
    out = at_submit(str(home), job, str(trial_wd), [place_of, place_of])
    assert out["resume_from"]["path"] == place_of and out["resume_from"]["copied_from"] == str(src)
    assert open(place_of, "rb").read() == b"w" * 64
    assert sorted(p.name for p in (trial_wd / "out").iterdir()) == ["nano-tttt"]  # one copy
    assert src.read_bytes() == b"w" * 64


def test_a_trial_whose_place_is_a_glob_or_outside_its_workdir_keeps_the_copy_at_the_jobs_place(tmp_path):
    from gpujob.agent.home.ckregister import own_fixed_place
    wd = str(tmp_path / "trial")
    glob_job = {"spec": {"train": {"resume_args": ["--resume_from_checkpoint", "{resume_from}"],
                                   "checkpoint": {"path": "out/checkpoint-*"}}}}
    assert own_fixed_place(glob_job, wd, [wd + "/out/checkpoint-*"]) is None
    fixed = {"spec": {"train": {"resume_args": ["--resume"], "checkpoint": {"path": "/data/ckpt.pt"}}}}
    assert own_fixed_place(fixed, wd, ["/data/ckpt.pt"]) is None  # never a file outside the trial's workdir
    per_profile = {"spec": {"train": {"resume_args": ["--resume"],
                                      "checkpoint": {"path": "out/{profile}.pt"}}}}
    assert own_fixed_place(per_profile, wd, [wd + "/out/a.pt", wd + "/out/b.pt"]) is None
    assert own_fixed_place(fixed, wd, [wd + "/ckpt.pt"]) == wd + "/ckpt.pt"
