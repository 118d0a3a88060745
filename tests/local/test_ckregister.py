"""The checkpoint register (agent/home/ckregister.py): what each run of a job wrote, when a
checkpoint is finished, where a checkpoint glob may point (agent/base/ckpaths.py), what
submit finds, and a register that stays whole when its writer is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from gpujob.agent.home import ckregister
from gpujob.agent.base import ckpaths
from helpers import REPO, cli, cli_json, events, job_id_of, local_env, wait_for, write_spec


def test_where_a_checkpoint_glob_may_point():
    home = "/root/.gpujob"
    assert ckpaths.refusal("/*").startswith("it names the container's root")
    assert ckpaths.refusal("../../../root/other/*").startswith("a component is '..'")
    assert ckpaths.refusal("/usr/lib/x/*.pt") == "it is under /usr, a system directory"
    # a glob in the first component: its fixed part is '/'
    assert ckpaths.refusal("/lib64*/x").startswith("it names the container's root")
    assert ckpaths.refusal("/root/*") == "it names /root itself; name a directory under it"
    assert ckpaths.refusal("/root/.gpujob/*", home=home) == "it names gpujob's home /root/.gpujob"
    assert ckpaths.refusal("/root/.g*/x", home=home) == "it names /root itself; name a directory under it"
    assert ckpaths.refusal("/root/.gpujob/jobs/*/state.json", home=home) == \
        "it is inside /root/.gpujob/jobs, gpujob's own directory"
    assert ckpaths.refusal("*", workdir="/").startswith("it names the container's root")
    assert ckpaths.refusal("c\n/*") == "holds a control character"
    # checkpoints may live outside the workdir: a data volume, another directory of root's
    assert ckpaths.refusal("/root/other/*", home=home) is None
    assert ckpaths.refusal("/mnt/data/run1/checkpoint-*", home=home) is None
    assert ckpaths.refusal("out/ckpt.pt", workdir="/root/.gpujob/work/x", home=home) is None
    assert ckpaths.refusal("{workdir}/out/*.pt", workdir="/srv/job", home=home) is None
    assert ckpaths.refusal("ck/{profile}/*", workdir="/srv/job") is None


def watch(tmp_path, pattern="w/ck-*", settle=0.3, done_file=None):
    home = str(tmp_path / "home")
    w = ckregister.CkWatch.begin(home, "j-1", "j", "fast", str(tmp_path / pattern), str(tmp_path), True,
                                 settle, done_file, time.time())
    return home, w


def test_a_file_already_there_is_not_this_runs_until_it_changes(tmp_path):
    (tmp_path / "w").mkdir()
    old = tmp_path / "w" / "ck-1"
    old.write_text("an earlier job's")
    home, w = watch(tmp_path)
    assert w.poll(time.time() + 1) == [] and w.newest_own(time.time())["file"] is None
    assert ckregister.foreign(w.reg, w.reg["runs"][0]["before"]) == [(str(old),
                                                                      ckregister.signature(str(old)))]
    (tmp_path / "w" / "ck-2").write_text("ours")
    ev = w.poll(time.time() + 2)
    assert [(e["ckpt"], e["op"]) for e in ev] == [("w/ck-2", "new")]
    assert w.saving() and w.newest_own(time.time())["file"] is None  # not finished yet
    w.poll(time.time() + 3)
    assert w.just_finished and w.newest_own(time.time())["file"] == str(tmp_path / "w" / "ck-2")
    old.write_text("rewritten by this run (nanoGPT's single ckpt.pt)")
    assert [e["op"] for e in w.poll(time.time() + 4)] == ["changed"]
    reg = ckregister.load(home, "j-1")  # what the register on disk says
    assert sorted(reg["files"]) == [str(old), str(tmp_path / "w" / "ck-2")]
    os.unlink(old)
    assert [(e["ckpt"], e["op"]) for e in w.poll(time.time() + 5)] == [("w/ck-1", "gone")]
    assert ckregister.load(home, "j-1")["files"][str(old)]["gone"]
    # a second run of the job: the first run's checkpoint is the job's, not that run's
    w2 = ckregister.CkWatch.begin(home, "j-1", "j", "slow", str(tmp_path / "w/ck-*"), str(tmp_path), True,
                                  0.3, None, time.time())
    assert w2.run == 2 and w2.newest_own(time.time())["file"] is None
    assert ckregister.newest(w2.reg)["path"] == str(tmp_path / "w" / "ck-2")


def test_a_directory_checkpoint_is_finished_by_its_done_file_and_a_torn_one_is_never_a_resume_point(tmp_path):
    (tmp_path / "w").mkdir()
    home, w = watch(tmp_path, settle=0.2, done_file="trainer_state.json")
    d = tmp_path / "w" / "ck-10"
    d.mkdir()
    (d / "model.bin").write_bytes(b"x" * 10)
    t = time.time()
    assert [e["op"] for e in w.poll(t + 1)] == ["new"]
    w.poll(t + 5)  # quiet far longer than settle: with done_file set, only that file finishes it
    assert w.saving() and not w.just_finished
    (d / "trainer_state.json").write_text("{}")
    w.poll(t + 6)  # the done file is there, but the directory changed in this very look
    assert w.saving() and not w.just_finished
    w.poll(t + 6.1)  # quiet for less than settle
    assert not w.just_finished
    w.poll(t + 6.5)
    assert [e["path"] for e in w.just_finished] == [str(d)]
    e2 = tmp_path / "w" / "ck-20"
    e2.mkdir()
    (e2 / "model.bin").write_bytes(b"y")
    w.poll(t + 7)
    assert [e["path"] for e in w.close(t + 8, clean=False)] == [str(e2)]  # killed mid-save
    assert ckregister.newest(ckregister.load(home, "j-1"))["path"] == str(d)


def test_a_rank_file_landing_after_the_done_file_holds_the_checkpoint_unfinished(tmp_path):
    # SpecForge with 2 ranks: rank 0 renames in training_state_rank0.pt, then the done file
    # training_state.pt; rank 1's training_state_rank1.pt lands after it (no barrier between)
    (tmp_path / "w").mkdir()
    home, w = watch(tmp_path, settle=2.0, done_file="training_state.pt")
    d = tmp_path / "w" / "ck-10"
    d.mkdir()
    (d / "training_state_rank0.pt").write_bytes(b"0" * 10)
    (d / "training_state.pt").write_bytes(b"s" * 10)
    t = time.time()
    w.poll(t + 0.5)
    w.poll(t + 1.0)
    (d / "training_state_rank1.pt").write_bytes(b"1" * 10)  # the other rank, 1 s after the done file
    w.poll(t + 1.5)
    w.poll(t + 2.5)  # 2.5 s after the done file, but only ~1 s after the last rank's file
    assert w.saving() and not w.just_finished and w.newest_own(t + 2.5)["file"] is None
    w.poll(t + 3.5)  # 2 s quiet since the poll that saw rank 1's file
    assert [e["path"] for e in w.just_finished] == [str(d)]
    assert ckregister.newest(ckregister.load(home, "j-1"))["path"] == str(d)


def test_a_watch_taken_over_by_a_new_supervisor_goes_on_with_the_same_run(tmp_path):
    (tmp_path / "w").mkdir()
    home, w = watch(tmp_path)
    (tmp_path / "w" / "ck-1").write_text("a")
    w.poll(time.time() + 1)
    (tmp_path / "w" / "ck-1").write_text("ab")  # changed after the last write of the register
    again = ckregister.CkWatch.resume(home, "j-1", "j", 1, str(tmp_path / "w/ck-*"), str(tmp_path), True, 0.3,
                                      None)
    assert again.run == 1 and [e["op"] for e in again.poll(time.time() + 2)] == ["changed"]
    again.poll(time.time() + 3)
    assert again.newest_own(time.time())["file"] == str(tmp_path / "w" / "ck-1")
    assert len(ckregister.load(home, "j-1")["runs"]) == 1


def test_submit_finds_what_earlier_jobs_left_and_resolves_resume_from(tmp_path):
    home = str(tmp_path / "home")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "ck-1").write_text("nobody's")
    home, w = watch(tmp_path)
    (tmp_path / "w" / "ck-2").write_text("j-1's")
    w.poll(time.time() + 1)
    w.poll(time.time() + 2)
    job = {"resume_from_ask": "j-1"}
    found = ckregister.at_submit(home, job, str(tmp_path), [str(tmp_path / "w/ck-*")])
    assert found["left"] == [{"path": str(tmp_path / "w" / "ck-1"), "job": None},
                             {"path": str(tmp_path / "w" / "ck-2"), "job": "j-1"}]
    assert job["resume_from"] == {"path": str(tmp_path / "w" / "ck-2"), "job": "j-1", "step": 2}
    job = {"resume_from_ask": "w/ck-1"}
    ckregister.at_submit(home, job, str(tmp_path), [str(tmp_path / "w/ck-*")])
    assert job["resume_from"]["path"] == str(tmp_path / "w" / "ck-1") and job["resume_from"]["job"] is None
    with pytest.raises(ValueError, match="--resume-from nope: no such checkpoint"):
        ckregister.at_submit(home, {"resume_from_ask": "nope"}, str(tmp_path), [str(tmp_path / "w/ck-*")])


def test_what_submit_finds_is_bounded_and_counted(tmp_path):
    """A glob over many files left by others: the answer lists LEFT_SHOWN of them and counts all
    (the 2026-12-04 CI run: 100k files made the submit answer pass the controller's 8 MiB cap),
    and submit's note says the whole count."""
    from gpujob.ops.submit import earlier_checkpoint_lines
    w = tmp_path / "w"
    w.mkdir()
    for i in range(ckregister.LEFT_SHOWN + 7):
        (w / f"ck-{i:03d}").write_text("x")
    found = ckregister.at_submit(str(tmp_path / "home"), {}, str(tmp_path), [str(w / "ck-*")])
    assert len(found["left"]) == ckregister.LEFT_SHOWN
    assert found["left_count"] == ckregister.LEFT_SHOWN + 7
    assert found["left"][0]["path"] == str(w / "ck-000")
    [line] = earlier_checkpoint_lines({"checkpoints": found})
    assert line.startswith(f"note: {ckregister.LEFT_SHOWN + 7} checkpoint(s)")
    assert f"and {ckregister.LEFT_SHOWN + 2} more" in line


WRITER = """
import os, sys, time
from gpujob.agent.home import ckregister
home, work = sys.argv[1], sys.argv[2]
w = ckregister.CkWatch.begin(home, "j-1", "j", "fast", work + "/ck-*", work, True, 0.0, None, time.time())
print("ready", flush=True)
i = 0
while True:
    i += 1
    with open(os.path.join(work, "ck-%d" % i), "w") as f:
        f.write("x" * (i % 7))
    w.poll(time.time(), force=True)  # a new one and a finished one: the register is written each time
"""


def test_a_register_writer_killed_at_any_moment_leaves_a_whole_register(tmp_path):
    home, work = tmp_path / "home", tmp_path / "w"
    work.mkdir()
    counts = []
    for delay in (0.0, 0.01, 0.03, 0.07, 0.1, 0.2, 0.35):
        before = len(ckregister.load(str(home), "j-1")["files"])
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(home), str(work)], cwd=REPO,
                             stdout=subprocess.PIPE)
        p.stdout.readline()
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        raw = (home / "checkpoints" / "j-1.json").read_bytes()
        reg = json.loads(raw)  # never half a file
        assert reg["format"] == 1 and len(reg["files"]) >= before
        for path, e in reg["files"].items():
            # the run that last wrote it: each writer starts again at ck-1, so a later run that
            # was killed sooner leaves the higher-numbered files to the run that wrote them
            assert os.path.exists(path) and 1 <= e["run"] <= len(reg["runs"])
        counts.append(len(reg["files"]))
    assert counts == sorted(counts) and counts[-1] > counts[0]
    # a killed writer's temp file is no register
    assert ckregister.all_registers(str(home))[0]["job_id"] == "j-1"


def test_a_supervisor_killed_while_a_save_is_in_progress_is_followed_by_one_that_finishes_the_record(
        tmp_path, index_urls):
    """Re-adoption: the new supervisor takes run 1's watch over from the register (no
    second run, the half-saved directory still this run's) and sees it finished."""
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", warmup=False, throughput=False,
                      trainer_args="--steps 100000 --interval 0.05 --checkpoint-every 10 "
                                   "--checkpoint-dir ck --save-seconds 2")
    data = yaml.safe_load(spec.read_text())
    data["train"]["checkpoint"] = {"path": "ck/checkpoint-*", "every": "1m",
                                   "done_file": "trainer_state.json"}
    spec.write_text(yaml.safe_dump(data))
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    j = tmp_path / "root" / "jobs" / job_id
    ck = tmp_path / "root" / "work" / "tjob" / "ck" / "checkpoint-10"
    regfile = tmp_path / "root" / "checkpoints" / f"{job_id}.json"
    wait_for(lambda: regfile.exists() and str(ck) in json.loads(regfile.read_text())["files"], 60, 0.05,
             "the save in the register")
    assert not (ck / "trainer_state.json").exists()
    st = json.loads((j / "state.json").read_text())
    assert st["child"]["ck_run"] == 1
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    cli(["status", job_id], env, check=True)  # a new supervisor, which re-adopts the trainer
    wait_for(lambda: any(e["type"] == "readopted" for e in events(j)), 30, what="re-adoption")
    wait_for(lambda: json.loads(regfile.read_text())["files"][str(ck)]["finished"], 30, 0.1, "finished")
    reg = json.loads(regfile.read_text())
    assert len(reg["runs"]) == 1 and reg["files"][str(ck)]["run"] == 1
    assert any(e["type"] == "checkpoint_finished" and e["ckpt"] == "ck/checkpoint-10" for e in events(j))
    cli(["stop", job_id], env, check=True)
    assert cli_json(["status", job_id, "--json"], env)["state"] == "stopped"


def test_resume_from_an_earlier_jobs_checkpoint_on_purpose(tmp_path, index_urls):
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", warmup=False, throughput=False,
                      trainer_args="--steps 6 --interval 0.02 --checkpoint-every 3")
    data = yaml.safe_load(spec.read_text())
    data["train"]["checkpoint"] = {"path": "checkpoint.json", "every": "1m", "settle": "0.2s"}
    data["train"]["resume_args"] = ["--resume-from", "{resume_from}"]
    spec.write_text(yaml.safe_dump(data))
    first = job_id_of(cli(["submit", str(spec), "--follow"], env, timeout=120, check=True).stdout)
    plan = cli(["submit", str(spec), "--plan", "--resume-from", first], env, check=True).stdout.decode()
    assert f"resuming on purpose from {first}" in plan and f"--resume-from '\"'\"'<{first}>" in plan
    assert "earlier jobs left under" in plan and "<newest finished checkpoint of this job>" in plan
    p = cli(["submit", str(spec), "--follow"], env, timeout=120, check=True)  # no flag: from scratch
    assert "1 checkpoint(s) that earlier jobs left under" in p.stderr.decode()
    assert f"(job {first})" in p.stderr.decode()
    log = (tmp_path / "root" / "jobs" / job_id_of(p.stdout) / "train.log").read_text()
    assert "resumed from" not in log
    p = cli(["submit", str(spec), "--follow", "--resume-from", first], env, timeout=120, check=True)
    assert "resuming on purpose from" in p.stderr.decode()
    log = (tmp_path / "root" / "jobs" / job_id_of(p.stdout) / "train.log").read_text()
    assert "resumed from checkpoint at step 6" in log
    p = cli(["submit", str(spec), "--resume-from", "nope-xxxx"], env)
    assert p.returncode != 0 and "--resume-from nope-xxxx: no such checkpoint" in p.stderr.decode()
    assert "Traceback" not in p.stderr.decode()


def test_a_checkpoint_glob_into_gpujobs_home_is_refused_at_plan_and_submit(tmp_path, index_urls):
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", warmup=False, throughput=False)
    data = yaml.safe_load(spec.read_text())
    data["train"]["checkpoint"] = {"path": str(tmp_path / "root" / "jobs" / "*"), "every": "1m"}
    spec.write_text(yaml.safe_dump(data))
    line = next(i for i, ln in enumerate(spec.read_text().splitlines(), 1) if "/jobs/*" in ln)
    for extra in (["--plan"], []):
        p = cli(["submit", str(spec), *extra], env)
        err = p.stderr.decode()
        assert p.returncode == 2 and len(err.strip().splitlines()) == 1, err
        assert f"job.yaml:{line}: train.checkpoint.path: " in err and \
            f"refused: it is inside {tmp_path / 'root' / 'jobs'}, gpujob's own directory" in err
    assert not (tmp_path / "root" / "jobs").exists() or not list((tmp_path / "root" / "jobs").iterdir())
